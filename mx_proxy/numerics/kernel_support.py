"""What the Pallas kernels implement, declared once: which :class:`~mx_proxy.numerics.spec.MXSpec` an operand of
theirs may have. Both checks read it: a recipe's (``Recipe(backend="pallas")``,
:mod:`mx_proxy.numerics.recipe_type`) and the kernels' own (:func:`mx_proxy.pallas.supported.check_spec`).

The kernels take 1-D blocks (:data:`BLOCK_DIMS`) of a power-of-two size with E8M0 scales (:data:`SCALE_FORMATS`),
every MX element format (:data:`ELEMENTS`, the live registry view), the scale rules with one exponent per block
(:func:`rules`) and the deterministic roundings (:data:`ROUNDINGS`). 2-D tiles, NVFP4's E4M3 scales, per-element
scale rules (``paper_bump``) and stochastic rounding stay on the XLA path (``mxp.quantize``).
"""

from __future__ import annotations

from typing import NamedTuple

from mx_proxy.numerics import formats as _formats
from mx_proxy.numerics import scale_rules
from mx_proxy.numerics.spec import MXSpec

__all__ = ["ROUNDINGS", "BLOCK_DIMS", "SCALE_FORMATS", "ELEMENTS", "rules", "Refusal", "refusals", "refusal"]

ROUNDINGS = ("even", "away")  # the deterministic roundings
BLOCK_DIMS = (1,)  # 1-D blocks along the contraction axis
SCALE_FORMATS = ("e8m0",)  # OCP MX power-of-two scales
ELEMENTS = _formats.MX_ELEMENTS  # every MX element format (read live: a format registered later counts)


def rules() -> tuple[str, ...]:
    """The scale rules the kernels implement: every registered rule with one exponent per block."""
    return tuple(n for n, r in scale_rules.RULES.items() if r.kernels)


class Refusal(NamedTuple):
    """Why the kernels do not implement a spec: ``short`` (a few words for a recipe's message, e.g.
    ``"2-D tiles"``) and ``message`` (the whole sentence, naming ``what``, the valid choices and the XLA path)."""

    short: str
    message: str


def refusals(spec: MXSpec, what: str = "spec") -> tuple[Refusal, ...]:
    """Every reason the kernels cannot take ``spec`` (an :class:`MXSpec`); empty when they can.
    ``what``: how the messages name the operand (``"a_spec"``, ``"fwd_w"``)."""
    xla = "use mxp.quantize, the XLA backend"
    out = []
    if spec.block_dims not in BLOCK_DIMS:
        out.append(Refusal("2-D tiles", f"{what}: block_dims={spec.block_dims} (2-D tiles) is not available in the "
                           f"Pallas kernels; valid: {', '.join(map(str, BLOCK_DIMS))} (for 2-D tiles {xla})"))
    if spec.scale_format not in SCALE_FORMATS:
        out.append(Refusal("E4M3 (NVFP4) scales", f"{what}: scale_format={spec.scale_format!r} (NVFP4) is not "
                           f"available in the Pallas kernels; valid: {', '.join(map(repr, SCALE_FORMATS))} (for E4M3 "
                           f"scales {xla})"))
    rule = spec.scale_rule.name
    if spec.scale_format in SCALE_FORMATS and rule not in rules():
        out.append(Refusal(f"the {rule} rule (an exponent per element)", f"{what}: scale_rule {rule!r} gives each "
                           "element of a block its own exponent, which no E8M0 scale byte stores: not available in "
                           f"the Pallas kernels; valid: {', '.join(rules())} (for {rule!r} {xla})"))
    if spec.rounding not in ROUNDINGS:
        out.append(Refusal(f"{spec.rounding} rounding", f"{what}: rounding {spec.rounding!r} is not available in the "
                           f"Pallas kernels; valid: {', '.join(ROUNDINGS)} (stochastic rounding: use mxp.quantize "
                           "on the XLA path)"))
    if spec.element.name not in ELEMENTS:
        out.append(Refusal(f"element {spec.element.name}", f"{what}: element {spec.element.name!r} unsupported; "
                           f"valid: {', '.join(ELEMENTS)}"))
    if spec.block_size & (spec.block_size - 1):  # MXSpec holds a positive integer
        out.append(Refusal(f"block size {spec.block_size} (not a power of two)", f"{what}: block_size "
                           f"{spec.block_size} is not a power of two; the kernels need a power of two (OCP MX: 32)"))
    return tuple(out)


def refusal(spec: MXSpec, what: str = "spec") -> Refusal | None:
    """The first of :func:`refusals`, or ``None`` when the kernels take ``spec``."""
    why = refusals(spec, what)
    return why[0] if why else None
