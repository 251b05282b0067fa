"""The :class:`Recipe` type: which tensor of a dense layer gets which MX format.

A dense layer ``y = x @ W + b`` (W of shape (in, out)) runs three GEMMs; a
recipe gives each of their six operands a spec, quantized along that GEMM's
contraction axis (the table: :mod:`mx_proxy.numerics.operands`, ``mx-proxy list operands``).

An operand whose spec is ``None`` enters its GEMM in the vector precision.
Non-GEMM ("vector") math -- GEMM inputs and outputs, bias, LayerNorm
internals, activation functions, and their backward -- is rounded
elementwise to ``vector`` precision (``"bf16"`` like the reference library,
or ``"fp32"``).
"""

from __future__ import annotations

import dataclasses
import fnmatch

from mx_proxy.numerics import kernel_support
from mx_proxy.numerics.operands import OPERANDS
from mx_proxy.numerics.quantize import MXSpec

__all__ = ["Recipe", "VECTOR_PRECISIONS", "VECTOR_ROUNDINGS", "LN_PRECISIONS", "DOTS", "OPERANDS"]

VECTOR_PRECISIONS = ("fp32", "bf16")
DOTS = ("f32", "bf16")  # how a GEMM of bf16-exact operands is computed (Recipe.dot, Config.dot)
VECTOR_ROUNDINGS = ("even", "away")
LN_PRECISIONS = ("vector", "fp32", "stats_fp32")


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A precision recipe (frozen, hashable: a static argument of ``jax.jit``).

    Attributes:
      name: label used in tables and plots.
      fwd_x, fwd_w, dgrad_g, dgrad_w, wgrad_x, wgrad_g: the :class:`MXSpec` of
        each GEMM operand (see the module table) or ``None``.
      vector: precision of non-GEMM math, ``"bf16"`` or ``"fp32"``.
      vector_rounding: how vector math rounds to ``vector`` precision:
        ``"even"`` (ties to even, a hardware cast) or ``"away"`` (ties away
        from zero: the reference library's ``round="nearest"``, which it
        uses for its bf16 rounding too). Applies to every elementwise
        rounding: GEMM inputs and outputs, bias, LayerNorm, activations and
        their backward.
      backward_precision: precision of the backward pass's vector math and
        of its unquantized GEMM operands: ``"vector"`` (the same as the
        forward) or ``"fp32"`` (the authors' forward-only mitigation: with
        ``quantize_backprop=False`` the library runs the whole backward in
        float32, on the unrounded saved inputs and weights).
      ln_precision: LayerNorm math in ``"vector"`` precision, ``"fp32"``
        (the principled "don't quantize LayerNorm" mitigation: LN in full
        precision, forward and backward), or ``"stats_fp32"`` (what the
        authors' ``dont_quantize_layernorm`` switch does: input, gain and
        bias unrounded, mean and variance in float32, the rest of the
        forward still rounded to ``vector``, the backward in float32).
      train_ln_bias: ``False`` freezes the LayerNorm bias (zero gradient):
        the authors' MX LayerNorm returns no bias gradient, so in their
        low-precision runs the bias stays 0 while their FP32 run trains it.
      ln_affine: if set, LayerNorm gain and bias are MX-quantized with this
        spec in blocks along the feature axis (the mechanism the paper argues
        for); ``None`` keeps them in vector precision (the reference library).
      act_precision: activation-function math in ``"vector"`` precision or
        ``"fp32"`` (the paper's "stop quantizing GELU" intervention).
      backend: GEMM implementation, ``"xla"`` (quantize, then ``jnp.dot``) or
        ``"pallas"`` (the fused kernels in ``mx_proxy/pallas/``).
      dot: ``"f32"`` or ``"bf16"``: how a GEMM of two bf16-exact operands is
        computed on the CPU (:func:`mx_proxy.nn.dense.quantized_matmul`); set per run by
        :attr:`mxp.Config.dot`.
      overrides: ``((pattern, recipe), ...)``: dense layers whose name matches
        ``pattern`` (an ``fnmatch`` glob over the names
        ``block_{i}/fc{j}``, ``first/fc{j}`` for block 0 and ``last/fc{j}``
        for the last block) run their GEMMs under that recipe instead: how a
        recipe marks a sensitive GEMM (e.g. keeps it in MXFP8 inside an FP4
        recipe). The first match wins; LayerNorm and activations always
        follow the outer recipe.
    """

    name: str = "custom"
    fwd_x: MXSpec | None = None
    fwd_w: MXSpec | None = None
    dgrad_g: MXSpec | None = None
    dgrad_w: MXSpec | None = None
    wgrad_x: MXSpec | None = None
    wgrad_g: MXSpec | None = None
    vector: str = "fp32"
    ln_precision: str = "vector"
    ln_affine: MXSpec | None = None
    act_precision: str = "vector"
    backend: str = "xla"
    dot: str = "f32"
    overrides: tuple[tuple[str, Recipe], ...] = ()
    vector_rounding: str = "even"
    backward_precision: str = "vector"
    train_ln_bias: bool = True

    def __post_init__(self):
        for field in OPERANDS + ("ln_affine",):
            spec = getattr(self, field)
            if spec is not None and not isinstance(spec, MXSpec):
                raise ValueError(f"Recipe.{field} must be an MXSpec or None, got {spec!r}")
        if self.vector not in VECTOR_PRECISIONS:
            raise ValueError(f"unknown vector precision {self.vector!r}; valid: {', '.join(VECTOR_PRECISIONS)}")
        if self.vector_rounding not in VECTOR_ROUNDINGS:
            raise ValueError(f"unknown vector_rounding {self.vector_rounding!r}; valid: {', '.join(VECTOR_ROUNDINGS)}")
        if self.ln_precision not in LN_PRECISIONS:
            raise ValueError(f"unknown ln_precision {self.ln_precision!r}; valid: {', '.join(LN_PRECISIONS)}")
        for field in ("act_precision", "backward_precision"):
            if getattr(self, field) not in ("vector", "fp32"):
                raise ValueError(f"unknown {field} {getattr(self, field)!r}; valid: vector, fp32")
        if not isinstance(self.train_ln_bias, bool):
            raise ValueError(f"Recipe.train_ln_bias must be True or False, got {self.train_ln_bias!r}")
        if self.dot not in DOTS:
            raise ValueError(f"unknown dot {self.dot!r}; valid: {', '.join(DOTS)}")
        if self.backend not in ("xla", "pallas"):
            raise ValueError(f"unknown backend {self.backend!r}; valid: xla, pallas")
        if self.backend == "pallas":
            _check_pallas(self)
        ov = self.overrides
        if isinstance(ov, (str, bytes)) or not hasattr(ov, "__iter__"):
            raise ValueError(f"Recipe.overrides must be a tuple of (pattern, Recipe) pairs, got {ov!r}")
        ov = tuple(tuple(p) if isinstance(p, (list, tuple)) else p for p in ov)
        for pair in ov:
            if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)
                    and isinstance(pair[1], Recipe)):
                raise ValueError(f"Recipe.overrides entries must be (pattern, Recipe) pairs, got {pair!r}")
            if pair[1].overrides:
                raise ValueError(f"an override recipe cannot have overrides itself ({pair[1].name!r})")
        object.__setattr__(self, "overrides", ov)

    def replace(self, **changes) -> Recipe:
        """A variant (``dataclasses.replace``); the name is kept unless given."""
        return dataclasses.replace(self, **changes)

    @property
    def is_full_precision(self) -> bool:
        """True when nothing is quantized or rounded below float32."""
        return (
            all(getattr(self, f) is None for f in OPERANDS + ("ln_affine",))
            and self.vector == "fp32"
        )

    @property
    def backward_vector(self) -> str:
        """The precision of the backward pass's vector math (``"bf16"``/``"fp32"``)."""
        return "fp32" if self.backward_precision == "fp32" else self.vector

    @property
    def stochastic(self) -> bool:
        """True when some GEMM operand (here or in an override) rounds stochastically."""
        return any(getattr(r, f) is not None and getattr(r, f).rounding == "stochastic"
                   for r in (self,) + tuple(o for _, o in self.overrides) for f in OPERANDS)

    def for_layer(self, *names: str) -> Recipe:
        """The recipe of one dense layer known by ``names`` (e.g.
        ``("block_0/fc1", "first/fc1")``): the first override whose pattern
        matches one of them, else this recipe."""
        for pattern, recipe in self.overrides:
            if any(fnmatch.fnmatchcase(n, pattern) for n in names):
                return recipe
        return self

    @property
    def quantizes_backward(self) -> bool:
        return any(getattr(self, f) is not None for f in ("dgrad_g", "dgrad_w", "wgrad_x", "wgrad_g"))

    @property
    def weight_spec(self) -> MXSpec | None:
        """The spec the weights see in the forward GEMM; the paper counts LN
        clamping as if the gains were quantized with it."""
        return self.fwd_w

    def with_dot(self, dot: str) -> Recipe:
        """This recipe (and its overrides) with GEMM dot kind ``dot``."""
        return dataclasses.replace(self, dot=dot, overrides=tuple((p, r.replace(dot=dot)) for p, r in self.overrides))

    def map_specs(self, fn) -> Recipe:
        """Apply ``fn(spec) -> spec`` to every non-None MX spec (overrides' included)."""
        changes = {f: fn(getattr(self, f)) for f in OPERANDS + ("ln_affine",) if getattr(self, f) is not None}
        if self.overrides:
            changes["overrides"] = tuple((p, r.map_specs(fn)) for p, r in self.overrides)
        return dataclasses.replace(self, **changes)


def _check_pallas(r: Recipe) -> None:
    """Refuse operand specs the Pallas kernels do not implement (:mod:`mx_proxy.numerics.kernel_support`, the
    declaration the kernels check too), naming them, why, and what the kernels do implement."""
    why: dict[str, list[str]] = {}
    for f in OPERANDS:
        spec = getattr(r, f)
        for refused in () if spec is None else kernel_support.refusals(spec, f):
            why.setdefault(refused.short, []).append(f)
    if why:
        reasons = "; ".join(f"{', '.join(fields)} use {short}" for short, fields in why.items())
        rules, roundings = "/".join(kernel_support.rules()), " and ".join(kernel_support.ROUNDINGS)
        raise ValueError(f"backend 'pallas' supports 1-D blocks of a power-of-two size with E8M0 {rules} scales "
                         f"and roundings {roundings}; {reasons} (valid with backend 'xla')")
