"""What one tensor's block quantization is: :class:`MXSpec` (element format, block size, scale rule, rounding,
1-D blocks or 2-D tiles, E8M0 or E4M3 scales), validated once when made, and the NVFP4 presets. What each choice
computes is the business of :mod:`mx_proxy.numerics.quantize` (its module docstring)."""

from __future__ import annotations

import dataclasses

import numpy as np

from mx_proxy.numerics import formats as _formats
from mx_proxy.numerics import scale_rules as _scale_rules
from mx_proxy.numerics.formats import ElementFormat
from mx_proxy.numerics.mx.element import ROUNDINGS
from mx_proxy.numerics.scale_rules import ScaleRule

__all__ = ["MXSpec", "NVFP4", "NVFP4_2D", "AMAX", "E4M3_RULES", "E4M3_SCALE_RULES", "SCALE_FORMATS", "BLOCK_DIMS",
           "E4M3_ELEMENTS", "resolve_rule"]

AMAX = ScaleRule(name="amax", doc="NVFP4's E4M3 block scales: block amax / 6 (mx_proxy.numerics.mx.nvfp4)",
                 elements=("fp4_e2m1",), scope="NVFP4's E4M3 block scale")
"""The rule of E4M3 (NVFP4) block scales: not an E8M0 rule, so not in the registry of those."""
E4M3_RULES = (AMAX,)  # the rules of E4M3 block scales (the first is the default)
E4M3_SCALE_RULES = tuple(r.name for r in E4M3_RULES)
SCALE_FORMATS = ("e8m0", "e4m3")
BLOCK_DIMS = (1, 2)
E4M3_ELEMENTS = ("fp4_e2m1",)  # element formats with E4M3 scales (NVFP4)


@dataclasses.dataclass(frozen=True)
class MXSpec:
    """How one tensor is block-quantized (frozen, hashable, validated).

    Attributes:
      element: element format (an :class:`ElementFormat` or its name).
      block_size: elements per shared scale along the block axis (OCP: 32;
        NVFP4: 16); with ``block_dims=2`` the side of the square tile.
      scale_rule: the :class:`~mx_proxy.numerics.scale_rules.ScaleRule` of the
        block scales, given as the rule or its name. E8M0 scales: a rule of
        :mod:`mx_proxy.numerics.scale_rules` (``mx-proxy list scale-rules``):
        ``"floor"`` (OCP v1.0), ``"rceil"``
        (round the scale up so nothing saturates), torchao's ``"ceil"`` and
        ``"even"``, or ``"paper_bump"`` (the authors' exponent bump, E4M3
        1-D blocks only). E4M3 scales: ``"amax"`` (the NVFP4 recipe; the only
        one, :data:`AMAX`). ``None`` (the default) picks ``"floor"`` for E8M0
        and ``"amax"`` for E4M3; the stored value is always the resolved
        rule object (nothing downstream looks the name up again; its name is
        ``spec.scale_rule.name``).
      rounding: ``"even"``, ``"away"`` or ``"stochastic"`` (needs a PRNG key);
        of the elements only (E4M3 block scales always round to nearest even).
      block_dims: 1 (blocks along the ``axis`` of :func:`~mx_proxy.numerics.quantize.quantize`) or 2
        (``block_size x block_size`` tiles over the last two axes, ``axis``
        ignored).
      scale_format: ``"e8m0"`` (OCP MX: power-of-two block scales) or
        ``"e4m3"`` (NVFP4: FP8 E4M3 block scales times one float32 scale per
        tensor; element ``fp4_e2m1`` only). See :mod:`mx_proxy.numerics.quantize`.
    """

    element: ElementFormat | str
    block_size: int = 32
    scale_rule: ScaleRule | str | None = None
    rounding: str = "even"
    block_dims: int = 1
    scale_format: str = "e8m0"

    def __post_init__(self):
        object.__setattr__(self, "element", _formats.get(self.element))
        if self.element.is_vector:
            raise ValueError(
                f"MXSpec element must be an MX element format, not {self.element.name!r}; "
                f"valid: {', '.join(n for n in _formats.names() if not _formats.get(n).is_vector)}"
            )
        bs = self.block_size
        if isinstance(bs, bool) or not isinstance(bs, (int, np.integer)) or bs <= 0:
            raise ValueError(f"block_size must be a positive integer, got {bs!r}")
        object.__setattr__(self, "block_size", int(bs))
        if self.scale_format not in SCALE_FORMATS:
            raise ValueError(f"unknown scale_format {self.scale_format!r}; valid: {', '.join(SCALE_FORMATS)}")
        bd = self.block_dims
        if isinstance(bd, bool) or not isinstance(bd, (int, np.integer)) or bd not in BLOCK_DIMS:
            raise ValueError(f"block_dims must be one of {', '.join(map(str, BLOCK_DIMS))} (1: blocks along an "
                             f"axis, 2: square tiles over the last two axes), got {bd!r}")
        object.__setattr__(self, "block_dims", int(bd))
        object.__setattr__(self, "scale_rule", resolve_rule(self.scale_rule, self.scale_format))
        if self.scale_format == "e4m3" and self.element.name not in E4M3_ELEMENTS:
            raise ValueError(f"scale_format='e4m3' (NVFP4) needs element {' or '.join(E4M3_ELEMENTS)}, "
                             f"got {self.element.name!r}; for other elements use scale_format='e8m0'")
        if self.scale_format == "e8m0":
            self.rule.check(self.element.name, self.block_dims)
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"unknown rounding {self.rounding!r}; valid: {', '.join(ROUNDINGS)}")

    @property
    def rule(self) -> _scale_rules.ScaleRule | None:
        """The :class:`~mx_proxy.numerics.scale_rules.ScaleRule` of E8M0 scales (``None`` for E4M3 scales)."""
        return self.scale_rule if self.scale_format == "e8m0" else None

    @property
    def name(self) -> str:
        """Short label, e.g. ``mxfp8_e4m3/32/floor/even``, ``mxfp4_e2m1/32x32/rceil/even``
        (2-D tiles) or ``nvfp4_e2m1/16/amax/even`` (E4M3 scales)."""
        prefix = "nv" if self.scale_format == "e4m3" else "mx"
        tile = f"{self.block_size}x{self.block_size}" if self.block_dims == 2 else f"{self.block_size}"
        return f"{prefix}{self.element.name}/{tile}/{self.scale_rule.name}/{self.rounding}"

    def replace(self, **changes) -> MXSpec:
        return dataclasses.replace(self, **changes)


def resolve_rule(rule: ScaleRule | str | None, scale_format: str = "e8m0") -> ScaleRule:
    """The :class:`~mx_proxy.numerics.scale_rules.ScaleRule` of block scales
    ``scale_format`` that ``rule`` names: a name, the rule itself (or one
    equal to it, e.g. unpickled), or ``None`` for the default (``floor`` for
    E8M0, ``amax`` for E4M3).

    Raises:
      ValueError: a rule unknown for ``scale_format``, naming the valid ones.
    """
    rules = dict(_scale_rules.RULES.items()) if scale_format == "e8m0" else {r.name: r for r in E4M3_RULES}
    default = next(iter(rules))
    if rule is None:
        return rules[default]
    name = rule.name if isinstance(rule, ScaleRule) else rule
    if isinstance(name, str) and name in rules and (not isinstance(rule, ScaleRule) or rules[name] == rule):
        return rules[name]
    what = "a ScaleRule that is not registered" if isinstance(rule, ScaleRule) and name in rules else "unknown"
    raise ValueError(f"{what} scale_rule {name!r} for scale_format={scale_format!r}; "
                     f"valid: {', '.join(rules)} (or None for {default!r})")


NVFP4 = MXSpec("fp4_e2m1", block_size=16, scale_format="e4m3")
"""NVIDIA NVFP4: E2M1 elements, 16-element blocks with E4M3 scales, one float32 scale per tensor."""
NVFP4_2D = NVFP4.replace(block_dims=2)
"""NVFP4 with 16x16 tiles (TE's recipe for weights)."""
