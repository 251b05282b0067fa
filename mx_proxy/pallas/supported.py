"""What the Pallas kernels take, as their entry points check it: :func:`check_spec` refuses any operand spec
outside the one declaration of what they implement, :mod:`mx_proxy.numerics.kernel_support` (which a recipe's
``backend="pallas"`` check reads too), naming the valid choices (2-D tiles, NVFP4's E4M3 scales, per-element scale
rules and stochastic rounding stay on the XLA path)."""

from __future__ import annotations

from mx_proxy.numerics import kernel_support
from mx_proxy.numerics.quantize import MXSpec

__all__ = ["MX_FORMATS", "ROUNDINGS", "kernel_rules", "check_spec"]

MX_FORMATS = kernel_support.ELEMENTS  # the element formats the kernels take (a live view of the MX formats)
ROUNDINGS = kernel_support.ROUNDINGS  # deterministic roundings the kernels implement
kernel_rules = kernel_support.rules  # the scale rules the kernels implement (one exponent per block)


def check_spec(spec, what: str = "spec") -> MXSpec | None:
    """Validate an operand spec for the kernels; ``None`` (unquantized) passes.

    Raises:
      ValueError: not an MXSpec, or a spec the kernels do not implement
        (:func:`mx_proxy.numerics.kernel_support.refusal`: 2-D tiles, E4M3
        (NVFP4) scales, a per-element scale rule, stochastic rounding, a block
        size that is not a power of two) -- naming the valid choices.
    """
    if spec is None:
        return None
    if not isinstance(spec, MXSpec):
        raise ValueError(f"{what} must be a mxp.MXSpec or None, got {type(spec).__name__}")
    why = kernel_support.refusal(spec, what)
    if why is not None:
        raise ValueError(why.message)
    return spec
