"""The named recipes: the presets (:data:`PRESETS`, grouped in :data:`FAMILIES`),
the paper's mitigations as named changes of a recipe (:data:`MITIGATIONS`,
:func:`mitigate`) and the README's recipe table. The :class:`Recipe` type
itself, with the table of which GEMM operand each field quantizes, is in
:mod:`mx_proxy.numerics.recipe_type`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from mx_proxy.numerics import scale_rules
from mx_proxy.numerics.quantize import NVFP4, MXSpec
from mx_proxy.numerics.recipe_type import DOTS, LN_PRECISIONS, OPERANDS, VECTOR_PRECISIONS, VECTOR_ROUNDINGS, Recipe

__all__ = ["Recipe", "PRESETS", "get", "names", "VECTOR_PRECISIONS", "VECTOR_ROUNDINGS", "LN_PRECISIONS", "table",
           "DOTS", "FAMILIES", "Mitigation", "MITIGATIONS", "mitigate", "mitigation", "with_scale_rule",
           "scale_rule_of", "description"]


@dataclasses.dataclass(frozen=True)
class Mitigation:
    """A named change of a recipe: the paper's mitigations and in-situ
    interventions, defined once. Presets such as ``forward_only`` are a
    mitigation applied to ``mxfp8_e4m3``; ``mxp.intervene(run, t,
    apply=name)`` applies one to the running recipe; notebooks list them."""

    name: str
    description: str
    change: Callable[[Recipe], Recipe] = dataclasses.field(repr=False, compare=False)

    def __call__(self, recipe: Recipe) -> Recipe:
        return self.change(recipe)


def with_scale_rule(r: Recipe, rule: str | scale_rules.ScaleRule) -> Recipe:
    """``r`` with every E8M0 operand (and the LN affine spec, overrides
    included) scaled by ``rule`` (a :mod:`~mx_proxy.numerics.scale_rules` name);
    NVFP4 (E4M3) block scales have their own rule and are left alone.

    Raises:
      ValueError: an unknown rule, or one not defined for some operand's format.
    """
    rule = scale_rules.get(rule)
    if rule.elements is not None:
        others = sorted({s.element.name for s in _specs(r) if s.scale_format == "e8m0"
                         and s.element.name not in rule.elements})
        if others:
            raise ValueError(f"{rule.name} is {rule.scope or 'defined for ' + ', '.join(rule.elements)}; recipe "
                             f"{r.name!r} also has {', '.join(others)} operands (use 'rceil' for a bump that works "
                             f"for every format)")
    return r.map_specs(lambda s: s if s.scale_format != "e8m0" else s.replace(scale_rule=rule))


def _rule_mitigation(rule: scale_rules.ScaleRule) -> Mitigation:
    """A scale rule as a recipe change: every E8M0 operand with it (a recipe name's ``+RULE`` suffix, and what
    ``Config.scale_rule``, the command line's ``--scale-rule``, applies)."""
    return Mitigation(rule.name, f"every E8M0 operand with the {rule.name} scale: {rule.doc}",
                      lambda r: with_scale_rule(r, rule))


def scale_rule_of(recipe: Recipe | str) -> str | None:
    """The scale rule a recipe's name applies last (``"ceil"`` for ``"mxfp8_e4m3+ceil"`` and
    ``"mxfp8_e4m3+ceil+ln_exempt"``), or ``None`` when its name applies none (a preset's own rule is
    not in its name: ``"rceil"`` names the preset, ``"mxfp8_e4m3+rceil"`` the change)."""
    name = recipe.name if isinstance(recipe, Recipe) else recipe
    rules = [c for c in str(name).split("+")[1:] if c in scale_rules.RULES]
    return rules[-1] if rules else None


def _specs(r: Recipe) -> list:
    return [getattr(x, f) for x in (r,) + tuple(o for _, o in r.overrides) for f in OPERANDS + ("ln_affine",)
            if getattr(x, f) is not None]


_BACKWARD = dict(dgrad_g=None, dgrad_w=None, wgrad_x=None, wgrad_g=None)

MITIGATIONS: dict[str, Mitigation] = {m.name: m for m in (
    Mitigation("fp32", "switch to full precision (everything float32)", lambda r: Recipe("fp32")),
    Mitigation("ln_exempt", "stop quantizing LayerNorm: LN math in fp32, LN gain/bias not MX-quantized",
               lambda r: r.replace(ln_precision="fp32", ln_affine=None)),
    Mitigation("ln_affine_exempt", "only the LN gain and bias out of MX (in vector precision); every GEMM "
               "operand and the LN math unchanged", lambda r: r.replace(ln_affine=None)),
    Mitigation("rceil", "bump the shared exponent: round-up (rceil) scales everywhere, nothing clamps",
               lambda r: with_scale_rule(r, "rceil")),
    Mitigation("bf16_activations", "activations, gradients and LN in bf16, forward and backward; weights keep "
               "their MX spec", lambda r: r.replace(fwd_x=None, dgrad_g=None, wgrad_x=None, wgrad_g=None,
                                                     ln_affine=None)),
    Mitigation("forward_only", "quantize only the forward pass: backward GEMMs unquantized (in vector precision)",
               lambda r: r.replace(**_BACKWARD)),
    Mitigation("act_fp32", "activation-function (GELU) math in fp32", lambda r: r.replace(act_precision="fp32")),
    Mitigation("bf16_weights", "weights (and LN gain/bias) in bf16 in every GEMM; activations and gradients keep MX",
               lambda r: r.replace(fwd_w=None, dgrad_w=None, ln_affine=None)),
    # the authors' code's own switches (student_teacher.py), for the paper_* recipes
    Mitigation("paper_no_ln_quant", "the authors' dont_quantize_layernorm: LN input, gain and bias unrounded, mean "
               "and variance in fp32, the rest of the LN forward in bf16, its backward in fp32",
               lambda r: r.replace(ln_precision="stats_fp32")),
    Mitigation("paper_forward_only", "the authors' dont_quantize_backprop: backward GEMMs unquantized and the whole "
               "backward in fp32", lambda r: r.replace(**_BACKWARD, backward_precision="fp32")),
    Mitigation("paper_bump", "the authors' bump_up_overflow_exponent (E4M3 only): each position of a block gets the "
               "floor exponent + 1 where the maximum over the tensor's blocks at that position exceeds 1.75·2^k "
               "(their maximum runs over the wrong axis; compare 'rceil')", lambda r: with_scale_rule(r, "paper_bump")),
    Mitigation("fp32_keep_bias", "switch to full precision but keep the recipe's LN-bias training as it was: on the "
               "paper_* recipes (bias frozen) this separates the precision switch from the bias that 'fp32' starts "
               "training; elsewhere it is 'fp32'", lambda r: Recipe("fp32", train_ln_bias=r.train_ln_bias)),
    Mitigation("train_ln_bias", "train the LN bias, everything else unchanged: on the paper_* recipes (their MX "
               "LayerNorm returns no bias gradient) the bias gets the gradient its backward computes, the sum of the "
               "output gradient rounded as the recipe's LN backward rounds; the converse of 'fp32_keep_bias'",
               lambda r: r.replace(train_ln_bias=True)),
)}
# every other scale rule (mx_proxy.numerics.scale_rules) as a change too: rceil and paper_bump above are the
# paper's "bump the shared exponent" and the authors' bump, under the names and words the paper's tables use
MITIGATIONS.update({rule.name: _rule_mitigation(rule) for rule in scale_rules.RULES.entries()
                    if rule.name not in MITIGATIONS})


def mitigation(name: str) -> Mitigation:
    """The named change: one of :data:`MITIGATIONS`, or a scale rule registered since
    (:func:`_rule_mitigation`). Raises ValueError naming the valid ones."""
    if name in MITIGATIONS:
        return MITIGATIONS[name]
    if name in scale_rules.RULES:
        return _rule_mitigation(scale_rules.get(name))
    valid = list(MITIGATIONS) + [n for n in scale_rules.RULES if n not in MITIGATIONS]
    raise ValueError(f"unknown mitigation {name!r}; valid: {', '.join(valid)}")


def mitigate(recipe: Recipe | str, names: str | Iterable[str]) -> Recipe:
    """``recipe`` changed by the named mitigations (in order); the result's
    name records them (``mxfp8_e4m3+ln_exempt``), except that ``fp32`` gives
    the ``fp32`` preset itself.

    Raises:
      ValueError: an unknown name (listing the valid ones).
    """
    r = get(recipe)
    for n in [names] if isinstance(names, str) else list(names):
        new = mitigation(n)(r)
        r = new if new == PRESETS["fp32"] else new.replace(name=f"{r.name}+{n}")
    return r


def _uniform(name: str, element: str, *, rule: str = "floor", rounding: str = "even",
             ln_affine: bool = True, vector: str = "bf16") -> Recipe:
    s = MXSpec(element, scale_rule=rule, rounding=rounding)
    return Recipe(name, s, s, s, s, s, s, vector=vector, ln_affine=s if ln_affine else None)


def _mixed(name: str, fwd: str, bwd: str, *, rounding: str = "even", ln_affine: bool = True) -> Recipe:
    f = MXSpec(fwd, rounding=rounding)
    b = MXSpec(bwd, rounding=rounding)
    return Recipe(name, f, f, b, b, b, b, vector="bf16", ln_affine=f if ln_affine else None)


def _two_d(name: str, element: str, *, grad_rounding: str = "even", tile: int = 32,
           overrides: tuple = ()) -> Recipe:
    """Truncation-free (rceil) 1-D blocks for activations and gradients, one
    2-D tile spec shared by the forward and dgrad weight (the 2-D block FP4
    recipe); LN affine unquantized, bf16 vector math."""
    act = MXSpec(element, scale_rule="rceil")
    grad = act.replace(rounding=grad_rounding)
    w = MXSpec(element, block_size=tile, scale_rule="rceil", block_dims=2)
    return Recipe(name, act, w, grad, w, act, grad, vector="bf16", overrides=overrides)


def _paper_code(name: str, fwd: str, dgrad_g: str, dgrad_w: str, wgrad_x: str, wgrad_g: str) -> Recipe:
    """What the authors' released code computes (``olmo/synthetic/student_teacher.py``
    with its fork of the MX library, ``round="nearest"``, ``bfloat=16``):
    ties-away MX elements and bf16 vector math; LayerNorm gain and bias
    rounded to bf16 but never MX-quantized (their clamping is only counted);
    the LN bias never trained (their MX LayerNorm returns no bias gradient);
    the student's GELU in exact float32 (bound before the MX ops are injected)."""
    s = {f: MXSpec(f, rounding="away") for f in {fwd, dgrad_g, dgrad_w, wgrad_x, wgrad_g}}
    return Recipe(name, s[fwd], s[fwd], s[dgrad_g], s[dgrad_w], s[wgrad_x], s[wgrad_g], vector="bf16",
                  vector_rounding="away", act_precision="fp32", train_ln_bias=False)


def _paper_family() -> list[Recipe]:
    e4, e5, fp6 = "fp8_e4m3", "fp8_e5m2", "fp6_e2m3"
    e4m3 = _paper_code("paper_e4m3", e4, e4, e4, e4, e4)
    return [
        e4m3,
        # 'mx-mix': the wgrad GEMM's activation operand (a_elem_format_bp, never set)
        # inherits the forward activation format, so it stays E4M3
        _paper_code("paper_mix", e4, e5, e5, e4, e5),
        _paper_code("paper_fp6", fp6, fp6, fp6, fp6, fp6),
        MITIGATIONS["paper_forward_only"](e4m3).replace(name="paper_forward_only"),
    ]


def _systems() -> list[Recipe]:
    mxfp8_2d = _two_d("mxfp8_2d", "fp8_e4m3")
    sensitive = mxfp8_2d.replace(name="mxfp8_2d (sensitive GEMM)")
    mxfp4_2d = _two_d("mxfp4_2d", "fp4_e2m1", grad_rounding="stochastic",
                      overrides=(("first/fc1", sensitive), ("last/fc2", sensitive)))
    nv = NVFP4
    nvfp4 = Recipe("nvfp4", nv, nv, nv, nv, nv, nv, vector="bf16")
    w2d, sr = nv.replace(block_dims=2), nv.replace(rounding="stochastic")
    nvfp4_2d = Recipe("nvfp4_2d", nv, w2d, sr, w2d, nv, sr, vector="bf16")
    return [mxfp8_2d, mxfp4_2d, nvfp4, nvfp4_2d]


def _build_presets() -> dict[str, Recipe]:
    e4m3 = _uniform("mxfp8_e4m3", "fp8_e4m3")
    presets = [
        Recipe("fp32"),
        Recipe("bf16", vector="bf16"),
        e4m3,
        _uniform("mxfp8_e5m2", "fp8_e5m2"),
        _mixed("mxfp8_mixed", "fp8_e4m3", "fp8_e5m2"),
        _uniform("mxfp6_e2m3", "fp6_e2m3"),
        _uniform("mxfp6_e3m2", "fp6_e3m2"),
        _uniform("mxfp4", "fp4_e2m1"),
        _uniform("mxint8", "int8"),
        *(MITIGATIONS[n](e4m3).replace(name=n) for n in ("forward_only", "bf16_activations", "ln_exempt", "rceil")),
        _mixed("reference_mixed", "fp8_e4m3", "fp8_e5m2", rounding="away", ln_affine=False).replace(
            wgrad_x=MXSpec("fp8_e4m3", rounding="away"), vector_rounding="away"),
        *_paper_family(),
        *_systems(),
    ]
    return {r.name: r for r in presets}


PRESETS: dict[str, Recipe] = _build_presets()

# Which question each preset family answers (the README's recipe table groups them).
FAMILIES: dict[str, tuple[str, ...]] = {
    "baselines": ("fp32", "bf16"),
    "principled": ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp8_mixed", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4", "mxint8",
                   "forward_only", "bf16_activations", "ln_exempt", "rceil"),
    "authors_code": ("reference_mixed", "paper_e4m3", "paper_mix", "paper_fp6", "paper_forward_only"),
    "systems": ("mxfp8_2d", "mxfp4_2d", "nvfp4", "nvfp4_2d"),
}

_DESCRIPTIONS = {
    "fp32": "everything in float32: the skyline",
    "bf16": "no MX; GEMM operands and all vector math rounded to bfloat16",
    "mxfp8_e4m3": "all six GEMM operands MXFP8 E4M3; LN gain/bias MX E4M3; bf16 vector math",
    "mxfp8_e5m2": "as mxfp8_e4m3 with E5M2 everywhere",
    "mxfp8_mixed": "E4M3 forward (and LN affine), E5M2 backward: the paper's 'mx-mix'",
    "mxfp6_e2m3": "as mxfp8_e4m3 with FP6 E2M3 everywhere",
    "mxfp6_e3m2": "as mxfp8_e4m3 with FP6 E3M2 everywhere",
    "mxfp4": "as mxfp8_e4m3 with FP4 E2M1 everywhere",
    "mxint8": "as mxfp8_e4m3 with MXINT8 everywhere",
    "forward_only": "mxfp8_e4m3 forward; backward GEMMs unquantized (bf16): paper mitigation",
    "bf16_activations": "weights MXFP8 E4M3 in forward and dgrad; activations, gradients and LN in bf16: paper "
                        "mitigation",
    "ln_exempt": "mxfp8_e4m3 but LN math in fp32 and LN affine not quantized: paper mitigation",
    "rceil": "mxfp8_e4m3 with the round-up ('bumped exponent') scale: never clamps",
    "reference_mixed": "the reference library's Linear with its mx-mix specs, bit for bit: E4M3 forward, E5M2 for the "
                       "gradient operands and the dgrad weight, the wgrad activation E4M3 (it inherits the forward "
                       "format), ties away for MX elements and bf16 vector math; LN affine unquantized",
    "paper_e4m3": "the authors' code, E4M3 on all six operands (their Fig. 4/7 run): ties away (MX and bf16), LN "
                  "gain/bias bf16 and never MX-quantized, LN bias never trained, GELU exact fp32",
    "paper_mix": "the authors' 'mx-mix': E4M3 forward, E5M2 for dgrad g, dgrad W and wgrad g, wgrad x E4M3; "
                 "otherwise as paper_e4m3",
    "paper_fp6": "the authors' FP6: E2M3 on all six operands; otherwise as paper_e4m3",
    "paper_forward_only": "the authors' forward-only mitigation: paper_e4m3 forward, the whole backward in fp32 "
                          "(no MX, no bf16)",
    "mxfp8_2d": "E4M3 with rceil scales everywhere; weights in 32×32 tiles, so forward and dgrad see one quantized W; "
                "LN affine unquantized",
    "mxfp4_2d": "2-D block FP4: E2M1, rceil, 32×32 weight tiles, stochastic rounding of gradients; the sensitive GEMMs "
                "(first/fc1, last/fc2) in mxfp8_2d; LN affine unquantized",
    "nvfp4": "NVFP4: E2M1 in 16-element blocks with E4M3 block scales and a per-tensor FP32 scale, all six operands; "
             "LN affine unquantized",
    "nvfp4_2d": "nvfp4 with 16×16 weight tiles and stochastic rounding of gradients (NVIDIA's NVFP4 training recipe, "
                "without the Hadamard transform)",
}


def names() -> tuple[str, ...]:
    return tuple(PRESETS)


def description(name: str) -> str:
    """The one-line description of a preset (the recipe table's last column)."""
    get(name)
    return _DESCRIPTIONS[name]


def get(recipe: str | Recipe) -> Recipe:
    """A preset by name, a preset changed by mitigations by the name
    :func:`mitigate` gives it (``"mxfp8_e4m3+ceil"``, ``"paper_e4m3+ln_exempt"``),
    or a :class:`Recipe` passed through.

    Raises:
      ValueError: naming the unknown value and the valid presets.
    """
    if isinstance(recipe, Recipe):
        return recipe
    if isinstance(recipe, str) and recipe in PRESETS:
        return PRESETS[recipe]
    if isinstance(recipe, str) and "+" in recipe:
        base, *changes = recipe.split("+")
        if base in PRESETS and all(c in MITIGATIONS or c in scale_rules.RULES for c in changes):
            return mitigate(base, changes)
    raise ValueError(f"unknown recipe {recipe!r}; valid: {', '.join(PRESETS)} (or PRESET+CHANGE, a change of "
                     f"mxp.MITIGATIONS, e.g. mxfp8_e4m3+ceil)")


def table() -> str:
    """A markdown table of every preset (the README embeds it)."""

    def fmt(spec):
        if spec is None:
            return "–"
        tile = f"/{spec.block_size}x{spec.block_size}" if spec.block_dims == 2 else ""
        kind = "nvfp4" if spec.scale_format == "e4m3" else spec.element.name
        return f"{kind}{tile}/{spec.scale_rule.name}/{spec.rounding}"

    def vector(r):
        v = r.vector + (f" ({r.vector_rounding})" if r.vector != "fp32" else "")
        extra = [("LN fp32", r.ln_precision == "fp32"), ("LN stats fp32", r.ln_precision == "stats_fp32"),
                 ("act fp32", r.act_precision == "fp32" and r.vector != "fp32"),
                 ("backward fp32", r.backward_precision == "fp32" and r.vector != "fp32"),
                 ("LN bias frozen", not r.train_ln_bias)]
        return v + "".join(f"; {t}" for t, on in extra if on)

    rows = ["| recipe | forward x, W | dgrad g, W | wgrad x, g | LN affine | vector math | what |",
            "|---|---|---|---|---|---|---|"]
    for n, r in PRESETS.items():
        rows.append(
            f"| `{n}` | {fmt(r.fwd_x)}, {fmt(r.fwd_w)} | {fmt(r.dgrad_g)}, {fmt(r.dgrad_w)} | "
            f"{fmt(r.wgrad_x)}, {fmt(r.wgrad_g)} | {fmt(r.ln_affine)} | {vector(r)} | {_DESCRIPTIONS[n]} |"
        )
    return "\n".join(rows)
