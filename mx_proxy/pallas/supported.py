"""What the Pallas kernels take: the element formats, roundings and scale rules they implement, and
:func:`check_spec`, which refuses any other :class:`~mx_proxy.numerics.quantize.MXSpec` naming the valid choices
(2-D tiles, NVFP4's E4M3 scales, per-element scale rules and stochastic rounding stay on the XLA path)."""

from __future__ import annotations

from mx_proxy.numerics import formats as _formats
from mx_proxy.numerics import scale_rules
from mx_proxy.numerics.quantize import MXSpec
from mx_proxy.pallas import backend

__all__ = ["MX_FORMATS", "ROUNDINGS", "kernel_rules", "check_spec"]

MX_FORMATS = tuple(n for n in _formats.names() if not _formats.get(n).is_vector)
ROUNDINGS = ("even", "away")  # deterministic roundings the kernels implement


def kernel_rules() -> tuple[str, ...]:
    """The scale rules the kernels implement: every rule with one exponent per block."""
    return tuple(n for n in scale_rules.RULES if scale_rules.get(n).kernels)


def check_spec(spec, what: str = "spec") -> MXSpec | None:
    """Validate an operand spec for the kernels; ``None`` (unquantized) passes.

    Raises:
      ValueError: not an MXSpec, 2-D tiles (``block_dims=2``), E4M3 (NVFP4)
        scales, a per-element scale rule (``paper_bump``), stochastic
        rounding, or a block size that is not a power of two -- naming the
        valid choices.
    """
    if spec is None:
        return None
    if not isinstance(spec, MXSpec):
        raise ValueError(f"{what} must be a mxp.MXSpec or None, got {type(spec).__name__}")
    if getattr(spec, "block_dims", 1) != 1:
        raise ValueError(
            f"{what}: block_dims={spec.block_dims} (2-D tiles) is not available in the Pallas kernels; valid: 1 "
            "(for 2-D tiles use mxp.quantize, the XLA backend)"
        )
    if getattr(spec, "scale_format", "e8m0") != "e8m0":
        raise ValueError(
            f"{what}: scale_format={spec.scale_format!r} (NVFP4) is not available in the Pallas kernels; valid: "
            "'e8m0' (for E4M3 scales use mxp.quantize, the XLA backend)"
        )
    if not spec.rule.kernels:
        raise ValueError(
            f"{what}: scale_rule {spec.scale_rule!r} gives each element of a block its own exponent, which no E8M0 "
            f"scale byte stores: not available in the Pallas kernels; valid: {', '.join(kernel_rules())} (for "
            f"{spec.scale_rule!r} use mxp.quantize, the XLA backend)"
        )
    if spec.rounding not in ROUNDINGS:
        raise ValueError(
            f"{what}: rounding {spec.rounding!r} is not available in the Pallas kernels; valid: "
            f"{', '.join(ROUNDINGS)} (stochastic rounding: use mxp.quantize on the XLA path)"
        )
    if spec.element.name not in MX_FORMATS:  # MXSpec already refuses vector formats; keep the guard local
        raise ValueError(f"{what}: element {spec.element.name!r} unsupported; valid: {', '.join(MX_FORMATS)}")
    if not backend.is_pow2(spec.block_size):
        raise ValueError(
            f"{what}: block_size {spec.block_size} is not a power of two; the kernels need a power of "
            "two (OCP MX: 32)"
        )
    return spec

