"""The paper's proxy experiments, defined once.

Every notebook (``notebooks/02_*`` … ``08_*``) and every training figure of
``proxy figures`` calls the functions here, so an experiment is written in one
place: ``lr_sweep_runs(scale)`` trains (or loads from the run store) the runs
of Fig. 2, ``ablation_runs(scale)`` those of Fig. 3, and so on. Each takes a
scale name (``smoke``/``quick``/``paper``, see :mod:`proxy.scales`) and
returns :class:`proxy.Run` objects; :func:`summary` turns runs into the small
table each notebook prints, with the instability measures of
:func:`instability`.

Where runs are kept: ``$PROXY_RUNS`` if set, else the default store
(``$PROXY_STORE`` or ``runs/``). A second call with the same scale loads every
run instead of training it.

Sweeps: configs that differ only in learning rate, seeds or noise share one
compiled program (``proxy.experiments.sweep`` vmaps them), so the smoke scale
compiles few distinct programs.
"""

from __future__ import annotations

import math
import os
from typing import Iterable

import numpy as np
import pandas as pd

from proxy import experiments as ex
from proxy import recipe as _recipes
from proxy import scales as _scales
from proxy.config import Config
from proxy.run import Run

__all__ = ["scale", "store", "LR_SWEEP_RECIPES", "ABLATION_RECIPES", "GRADIENT_RECIPES", "MITIGATION_RECIPES",
           "INTERVENTIONS", "APPENDIX_RECIPES", "ln_affine_exempt", "lr_sweep_runs", "ablation_cells",
           "ablation_runs", "gradient_bias_runs", "mechanism_runs", "mitigation_runs", "intervention_runs",
           "shape_runs", "sgd_runs", "init_runs", "instability", "summary", "clamp_window",
           "zeta_by_clamping", "ZETA_CONTROLS", "zeta_control_runs", "paper_metric_table"]

# --------------------------------------------------------------------------- what each experiment trains

LR_SWEEP_RECIPES = ("fp32", "mxfp8_e4m3", "mxfp6_e2m3")          # Fig. 2
ABLATION_RECIPES = ("fp32", "mxfp8_e4m3")                          # Fig. 3
GRADIENT_RECIPES = ("mxfp8_e4m3", "mxfp6_e2m3", "mxfp4")           # Fig. 4 (same_point; E4M3 also paired_run)
MITIGATION_RECIPES = ("fp32", "mxfp8_e4m3", "forward_only", "bf16_activations")  # Fig. 6
INTERVENTIONS = ("fp32", "ln_exempt", "rceil", "bf16_activations")  # Fig. 7 (names of experiments.INTERVENTIONS)
APPENDIX_RECIPES = ("fp32", "mxfp8_e4m3")                          # Figs. 9-11
# The paper's ζ (squared, against a separately trained FP32 run) and its controls:
# (recipe, reference recipe, reference seed offset, reference data-seed offset)
ZETA_CONTROLS = (("paper_e4m3", "fp32", 0, 0), ("mxfp8_e4m3", "fp32", 0, 0), ("bf16", "fp32", 0, 0),
                 ("fp32", "fp32", 1, 0), ("fp32", "fp32", 0, 1))
SGD_MOMENTUM = 0.9

# (activation, norm) cells of the Fig. 3 ablation. The smoke scale (CI: every
# code path, no phenomenon) keeps fewer cells, recipes and interventions so
# that it compiles few distinct programs; the other scales run the full lists.
_ABLATION_CELLS = {
    "smoke": (("gelu", "layernorm"), ("relu", "none")),
    None: tuple((a, n) for n in ("layernorm", "none") for a in ("gelu", "relu", "swiglu")),
}
_SMOKE_GRADIENT_RECIPES = ("mxfp8_e4m3",)
_SMOKE_INTERVENTIONS = ("fp32", "ln_exempt")


def scale(name: str | None = None) -> _scales.Scale:
    """The named scale (default: ``$PROXY_SCALE`` or ``quick``)."""
    return _scales.get(name or os.environ.get("PROXY_SCALE", "quick"))


def store() -> str | None:
    """The run store to use: ``$PROXY_RUNS`` if set, else ``None`` (the default store)."""
    return os.environ.get("PROXY_RUNS") or None


def _scale(s) -> _scales.Scale:
    return s if isinstance(s, _scales.Scale) else scale(s)


def _sweep(config: Config, progress: bool, **axes) -> list[Run]:
    return list(ex.sweep(config, store=store(), progress=progress, **axes).runs)


def ln_affine_exempt(recipe: str = "mxfp8_e4m3"):
    """``recipe`` with ONLY the LayerNorm gain and bias taken out of MX
    quantization (they stay in the recipe's vector precision); every GEMM
    operand stays quantized and LN math keeps its precision."""
    r = _recipes.get(recipe)
    return r.replace(ln_affine=None, name=f"{r.name}+ln_affine_exempt")


# --------------------------------------------------------------------------- experiments


def lr_sweep_runs(scale=None, *, recipes=LR_SWEEP_RECIPES, progress: bool = True) -> list[Run]:
    """Fig. 2: FP32, MXFP8 E4M3 and MXFP6 E2M3 (or ``recipes``) over the scale's LR grid."""
    s = _scale(scale)
    return _sweep(s.config, progress, recipe=list(recipes), lr=list(s.lr_grid))


def ablation_cells(scale=None) -> tuple[tuple[str, str], ...]:
    """The (activation, norm) cells the Fig. 3 ablation trains at this scale."""
    s = _scale(scale)
    return _ABLATION_CELLS.get(s.name, _ABLATION_CELLS[None])


def ablation_runs(scale=None, *, cells=None, recipes=ABLATION_RECIPES, progress: bool = True) -> list[Run]:
    """Fig. 3: activation function × LayerNorm on/off (``cells``, default
    :func:`ablation_cells`), FP32 and MXFP8 E4M3 (or ``recipes``)."""
    s = _scale(scale)
    runs = []
    for act, norm in cells or ablation_cells(s):
        runs += _sweep(s.config.replace(act=act, norm=norm), progress, recipe=list(recipes))
    return runs


def gradient_bias_runs(scale=None, *, recipes=None, progress: bool = True) -> list[Run]:
    """Fig. 4: the ‖ζ‖ bound and cosine over training of E4M3, FP6 E2M3 and
    FP4 (or ``recipes``) against the FP32 gradient at the same weights; of
    E4M3 against the separate FP32 run (the paper's reference); and of E4M3
    at the top of the scale's LR grid, where the loss blows up (in FP32 too at
    the quick scale), to see what ‖ζ‖ does before a blow-up."""
    s = _scale(scale)
    if recipes is None:
        recipes = _SMOKE_GRADIENT_RECIPES if s.name == "smoke" else GRADIENT_RECIPES
    runs = _sweep(s.config, progress, recipe=list(recipes))
    runs += _sweep(s.config.replace(gradient_reference="paired_run"), progress, recipe=["mxfp8_e4m3"])
    runs += _sweep(s.config.replace(lr=max(s.lr_grid)), progress, recipe=["mxfp8_e4m3"])
    return runs


def mechanism_runs(scale=None, *, recipe: str = "mxfp8_e4m3", progress: bool = True) -> list[Run]:
    """Section 5's mechanism: FP32 (LN clamping counted as a diagnostic),
    ``recipe`` (LN gains really MX-quantized), and ``recipe`` with only the LN
    affine parameters exempted (:func:`ln_affine_exempt`)."""
    s = _scale(scale)
    return _sweep(s.config, progress, recipe=["fp32", recipe, ln_affine_exempt(recipe)])


def mitigation_runs(scale=None, *, recipes=MITIGATION_RECIPES, progress: bool = True) -> list[Run]:
    """Fig. 6: forward-only quantization and bf16 activations against MXFP8 E4M3 and FP32."""
    s = _scale(scale)
    return _sweep(s.config, progress, recipe=list(recipes))


def _aligned(config: Config, steps: Iterable[int]) -> Config:
    """``config`` with ``val_every`` cut to a divisor of the checkpoint steps
    (when that stays a multiple of ``diagnostics_every``), so that the host
    loop's segments keep one length and reuse one compiled program."""
    g = config.val_every
    for t in steps:
        g = math.gcd(g, t)
    if g and config.diagnostics_every and g % config.diagnostics_every == 0:
        return config.replace(val_every=g)
    return config


def intervention_runs(scale=None, *, recipe: str = "mxfp8_e4m3", interventions=None,
                      progress: bool = True) -> tuple[Run, list[Run]]:
    """Fig. 7: a ``recipe`` run checkpointed at the scale's early and late
    intervention steps, and one continuation per (step, intervention), each on
    the parent's very batches (``interventions``: names of
    ``proxy.experiments.INTERVENTIONS``; default :data:`INTERVENTIONS`). Returns ``(parent, children)``; a child's
    ``info["intervention"]`` holds ``at_step`` and ``apply``."""
    s = _scale(scale)
    if interventions is None:
        interventions = _SMOKE_INTERVENTIONS if s.name == "smoke" else INTERVENTIONS
    steps = tuple(s.intervention_steps)
    parent_cfg = _aligned(s.config, steps).replace(recipe=recipe, checkpoint_at=steps)
    (parent,) = _sweep(parent_cfg, progress, recipe=[recipe])
    children = [ex.intervene(parent, t, apply=name, checkpoint_at=(), store=store(), progress=progress)
                for t in steps for name in interventions]
    return parent, children


def zeta_control_runs(scale=None, *, controls=ZETA_CONTROLS, progress: bool = True) -> list[Run]:
    """The paper's ζ with its controls: each ``(recipe, reference, seed
    offset, data-seed offset)`` of ``controls`` trains ``recipe`` with the
    ``reference`` run alongside, started from ``seed + offset`` and fed the
    batches of ``data_seed + data offset``. FP32 against FP32 with another
    seed or other batches shows what the paper's metric gives when nothing is
    quantized at all."""
    s = _scale(scale)
    base = s.config.replace(paired_run=True)
    runs = []
    for recipe, ref, seed_off, data_off in controls:
        cfg = base.replace(recipe=recipe, reference_recipe=ref,
                           reference_seed=base.seed + seed_off if seed_off else None,
                           reference_data_seed=base.data_seed + data_off if data_off else None)
        runs += _sweep(cfg, progress)
    return runs


def paper_metric_table(runs) -> pd.DataFrame:
    """One row per paired run: what its reference differs in, the median and
    maximum of the paper's ζ, the fraction of diagnostic steps with ζ above
    1.5, the median cosine against the paired run, and (where it differs from
    the run itself) the median same-point ‖ζ‖ bound."""
    rows = []
    for r in runs:
        c = r.config
        m = r.metrics if r.diverged_at is None else r.metrics[r.metrics["step"] < r.diverged_at]
        d = m.dropna(subset=["zeta_paper"])
        differs = [f"seed {c.reference_seed}" for _ in [0] if c.reference_seed not in (None, c.seed)]
        differs += [f"data seed {c.reference_data_seed}" for _ in [0]
                    if c.reference_data_seed not in (None, c.data_seed)]
        rows.append({
            "run": c.recipe.name, "reference": c.reference_recipe.name,
            "reference differs in": ", ".join(differs) or "precision only",
            "zeta_paper_median": float(d["zeta_paper"].median()), "zeta_paper_max": float(d["zeta_paper"].max()),
            "frac_above_1.5": float((d["zeta_paper"] > 1.5).mean()),
            "cosine_paper_median": float(d["cosine_paper"].median()),
            "same_point_zeta_median": float(d["zeta_bound"].median()),
            "diverged_at": r.diverged_at,
        })
    return pd.DataFrame(rows)


def shape_runs(scale=None, *, recipes=APPENDIX_RECIPES, progress: bool = True) -> list[Run]:
    """Fig. 9: the scale's depths (at its width) and widths (at its depth),
    FP32 and MXFP8 E4M3; the teacher follows the student's shape."""
    s = _scale(scale)
    c = s.config
    shapes = [(d, c.width) for d in s.depths] + [(c.depth, w) for w in s.widths]
    runs = []
    for d, w in dict.fromkeys(shapes):
        runs += _sweep(c.replace(depth=d, width=w), progress, recipe=list(recipes))
    return runs


def sgd_runs(scale=None, *, recipes=APPENDIX_RECIPES, progress: bool = True) -> list[Run]:
    """Fig. 10: SGD without momentum at the scale's ``sgd_lr`` and with
    momentum 0.9 at ``sgd_lr × (1 − 0.9)`` (the same long-run step size),
    FP32 and MXFP8 E4M3."""
    s = _scale(scale)
    runs = []
    for momentum in (0.0, SGD_MOMENTUM):
        cfg = s.config.replace(optimizer="sgd", momentum=momentum, lr=s.sgd_lr * (1.0 - momentum))
        runs += _sweep(cfg, progress, recipe=list(recipes))
    return runs


def init_runs(scale=None, *, recipes=APPENDIX_RECIPES, progress: bool = True) -> list[Run]:
    """Fig. 11: PyTorch-default init against Xavier-normal with gain 0.5, FP32 and MXFP8 E4M3."""
    s = _scale(scale)
    runs = []
    for cfg in (s.config, s.config.replace(init="xavier_normal", init_gain=0.5)):
        runs += _sweep(cfg, progress, recipe=list(recipes))
    return runs


# --------------------------------------------------------------------------- analysis


def _window(run: Run) -> int:
    return max(10, min(100, run.config.steps // 10))


def instability(run: Run, factor: float = 10.0) -> dict:
    """Instability measures of one run.

    ``diverged_at``: the engine's stop (non-finite loss, or one step
    ``spike_factor``× the previous). ``blowup_at``: first step whose loss
    exceeds ``factor`` × the minimum of the previous W steps (W = 100, or a
    tenth of a short run; the first W steps, the initial transient, are
    skipped) -- it also catches multi-step blow-ups that never jump 100× in one
    step. ``spikes``: how many separate such excursions (plus one for a
    divergence). ``max_jump``: the largest loss / running-minimum ratio.
    """
    loss = run.metrics["loss"].to_numpy(dtype=float)
    loss = np.where(np.isfinite(loss), loss, np.inf)
    w = _window(run)
    ratio = np.ones_like(loss)
    for i in range(w, len(loss)):
        ratio[i] = loss[i] / loss[i - w:i].min()
    hot = ratio > factor
    starts = np.flatnonzero(hot & ~np.r_[False, hot[:-1]])
    steps = run.metrics["step"].to_numpy()
    return {
        "diverged_at": run.diverged_at,
        "blowup_at": int(steps[starts[0]]) if len(starts) else None,
        "spikes": int(len(starts)) + (run.diverged_at is not None and not hot[-1:].any()),
        "max_jump": float(ratio.max()) if len(ratio) else float("nan"),
    }


def clamp_window(run: Run, threshold: float = 0.5) -> tuple[int, int] | None:
    """(first, last) diagnostic step at which more than ``threshold`` of the LN
    gains clamp under the recipe's weight spec (the diagnostic format for
    unquantized recipes), or ``None`` if never."""
    m = run.metrics.dropna(subset=["ln_clamp_frac"]) if "ln_clamp_frac" in run.metrics else None
    if m is None or not len(m):
        return None
    hot = m[m["ln_clamp_frac"] > threshold]
    return (int(hot["step"].iloc[0]), int(hot["step"].iloc[-1])) if len(hot) else None


def _label(run: Run) -> str:
    name = run.config.recipe.name
    if run.config.gradient_reference == "paired_run":
        name += " (paired run)"
    return name


def summary(runs, fields: Iterable[str] | None = None) -> pd.DataFrame:
    """One row per run: the recipe, the config fields that vary across
    ``runs`` (or ``fields``), the instability measures of :func:`instability`,
    final and minimum loss, and over the diagnostic steps before any
    divergence the median and maximum ‖ζ‖ bound, the minimum cosine and the
    maximum LN clamp fraction. Interventions add their step and name."""
    runs = list(runs)
    if fields is None:
        skip = {"recipe", "checkpoint_at", "gradient_reference"}
        fields = [f for f in Config.field_names() if f not in skip
                  and len({repr(getattr(r.config, f)) for r in runs}) > 1]
    rows = []
    for r in runs:
        m = r.metrics
        if r.diverged_at is not None:
            m = m[m["step"] < r.diverged_at]
        d = m.dropna(subset=["zeta_bound"]) if "zeta_bound" in m else m.iloc[0:0]
        row = {"recipe": _label(r)}
        iv = r.info.get("intervention") if isinstance(r.info, dict) else None
        if iv:
            row["intervention"] = "+".join(iv.get("apply") or []) or _recipes.to_json(r.config.recipe)
            row["at_step"] = iv.get("at_step")
        row.update({f: getattr(r.config, f) for f in fields})
        row.update(instability(r))
        row["final_loss"] = r.final_loss
        row["min_loss"] = float(m["loss"].min()) if len(m) else float("nan")
        for col, fn, name in (("zeta_bound", np.median, "zeta_median"), ("zeta_bound", np.max, "zeta_max"),
                              ("cosine", np.min, "cosine_min"), ("ln_clamp_frac", np.max, "ln_clamp_max")):
            v = d[col].to_numpy(dtype=float) if col in d else np.array([])
            v = v[np.isfinite(v)]
            row[name] = float(fn(v)) if len(v) else float("nan")
        rows.append(row)
    df = pd.DataFrame(rows)
    for c in ("diverged_at", "blowup_at", "at_step"):
        if c in df:
            df[c] = df[c].astype("Int64")
    return df


def zeta_by_clamping(run: Run, reference: Run | None = None, threshold: float = 0.5) -> dict:
    """Median ‖ζ‖ bound and cosine of ``run`` on the diagnostic steps where
    more than ``threshold`` of the LN gains of ``reference`` (default: the run
    itself) clamp, and on the other steps; with the number of steps of each.
    Comparing a run with its LN-affine-exempt twin on the same steps tells
    how much of the gradient error the clamped gains carry."""
    ref = reference if reference is not None else run
    d = run.metrics.dropna(subset=["zeta_bound"])[["step", "zeta_bound", "cosine"]]
    c = ref.metrics.dropna(subset=["ln_clamp_frac"])[["step", "ln_clamp_frac"]]
    j = d.merge(c, on="step")
    hot = j["ln_clamp_frac"] > threshold
    out = {}
    for name, part in (("clamping", j[hot]), ("other", j[~hot])):
        out[f"steps_{name}"] = int(len(part))
        out[f"zeta_{name}"] = float(part["zeta_bound"].median()) if len(part) else float("nan")
        out[f"cosine_{name}"] = float(part["cosine"].median()) if len(part) else float("nan")
    return out
