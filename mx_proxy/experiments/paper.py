"""The paper's proxy experiments, defined once.

Every notebook (``notebooks/02_*`` … ``08_*``) and every training figure of
``mx-proxy figures`` calls the functions here, so an experiment is written in one
place: ``lr_sweep_runs(scale)`` trains (or loads from a run store) the runs of
Fig. 2, ``ablation_runs(scale)`` those of Fig. 3, and so on. Each takes a
scale (a name or a :class:`mx_proxy.experiments.scales.ExperimentScale`: every list an experiment
iterates over is a field of the scale) and ``store`` (a run-store folder, or
``None`` to keep runs in memory), and returns :class:`mxp.Run` objects. The
analysis of runs (instability measures, summary tables) is
:mod:`mx_proxy.experiments.analysis`.

Sweeps: configs that differ only in learning rate, seeds or noise share one
compiled program (``mxp.sweep`` vmaps them).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from mx_proxy.experiments import scales as _scales
from mx_proxy.numerics.recipe import mitigate
from mx_proxy.runner import interventions as _interventions
from mx_proxy.runner import loop as runner
from mx_proxy.training.config import Config
from mx_proxy.training.result import Run

__all__ = ["scale", "LR_SWEEP_RECIPES", "ABLATION_RECIPES", "MITIGATION_RECIPES", "APPENDIX_RECIPES",
           "ZETA_CONTROLS", "ln_affine_exempt", "lr_sweep_runs", "ablation_runs", "gradient_bias_runs",
           "mechanism_runs", "mitigation_runs", "intervention_runs", "shape_runs", "sgd_runs", "init_runs",
           "zeta_control_runs", "quant_stats_runs", "planned_sweeps"]

# --------------------------------------------------------------------------- what each experiment trains

LR_SWEEP_RECIPES = ("fp32", "mxfp8_e4m3", "mxfp6_e2m3")          # Fig. 2
ABLATION_RECIPES = ("fp32", "mxfp8_e4m3")                          # Fig. 3
MITIGATION_RECIPES = ("fp32", "mxfp8_e4m3", "forward_only", "bf16_activations")  # Fig. 6
APPENDIX_RECIPES = ("fp32", "mxfp8_e4m3")                          # Figs. 9-11
SGD_MOMENTUM = 0.9
# The paper's ζ (squared, against a separately trained FP32 run) and its controls:
# (recipe, reference recipe, reference seed offset, reference data-seed offset)
ZETA_CONTROLS = (("paper_e4m3", "fp32", 0, 0), ("mxfp8_e4m3", "fp32", 0, 0), ("bf16", "fp32", 0, 0),
                 ("fp32", "fp32", 1, 0), ("fp32", "fp32", 0, 1))


def scale(s: str | _scales.ExperimentScale = "quick") -> _scales.ExperimentScale:
    """The :class:`~mx_proxy.experiments.scales.ExperimentScale` named ``s`` (or ``s`` itself)."""
    return _scales.get(s)


_as_scale = scale  # the experiment functions' ``scale`` argument shadows the function


_plan: list | None = None  # set by planned_sweeps: _sweep records instead of training


def _sweep(config: Config, store, progress: bool, **axes) -> list[Run]:
    if _plan is not None:
        _plan.append((config, axes))
        return []
    return list(runner.sweep(config, store=store, progress=progress, **axes).runs)


def planned_sweeps(experiment, scale="quick") -> list[tuple[Config, dict]] | None:
    """The sweeps ``experiment(scale)`` would train, as ``(config, axes)`` of
    each ``mxp.sweep`` call, without training anything; ``None`` for an
    experiment whose later runs start from trained ones (the interventions),
    which cannot be planned ahead. How ``mx-proxy figures`` trains the runs of
    several figures in parallel processes before drawing them."""
    global _plan
    _plan = []
    try:
        experiment(scale, store=None, progress=False)
        return list(_plan)
    except (ValueError, TypeError):  # it needed a trained run (e.g. unpacking the parent of interventions)
        return None
    finally:
        _plan = None


def ln_affine_exempt(recipe: str = "mxfp8_e4m3"):
    """``recipe`` with ONLY the LayerNorm gain and bias taken out of MX
    quantization (the ``ln_affine_exempt`` mitigation)."""
    return mitigate(recipe, "ln_affine_exempt")


# --------------------------------------------------------------------------- experiments


def lr_sweep_runs(scale="quick", *, store=None, recipes=LR_SWEEP_RECIPES, progress: bool = True) -> list[Run]:
    """Fig. 2: FP32, MXFP8 E4M3 and MXFP6 E2M3 (or ``recipes``) over the scale's LR grid."""
    s = _as_scale(scale)
    return _sweep(s.config, store, progress, recipe=list(recipes), lr=list(s.lr_grid))


def ablation_cells(scale="quick") -> tuple[tuple[str, str], ...]:
    """The (activation, norm) cells the Fig. 3 ablation trains at this scale."""
    s = _as_scale(scale)
    return s.ablation_cells


def ablation_runs(scale="quick", *, store=None, cells=None, recipes=ABLATION_RECIPES,
                  progress: bool = True) -> list[Run]:
    """Fig. 3: activation function × LayerNorm on/off (``cells``, default
    :func:`ablation_cells`), FP32 and MXFP8 E4M3 (or ``recipes``)."""
    s = _as_scale(scale)
    runs = []
    for act, norm in cells or ablation_cells(s):
        runs += _sweep(s.config.replace(act=act, norm=norm), store, progress, recipe=list(recipes))
    return runs


def gradient_bias_runs(scale="quick", *, store=None, recipes=None, progress: bool = True) -> list[Run]:
    """Fig. 4: the ‖ζ‖ bound and cosine over training of E4M3, FP6 E2M3 and
    FP4 (or ``recipes``) against the FP32 gradient at the same weights; of
    E4M3 against the separate FP32 run (the paper's reference); and of E4M3
    at the top of the scale's LR grid, where the loss blows up (in FP32 too at
    the quick scale), to see what ‖ζ‖ does before a blow-up."""
    s = _as_scale(scale)
    if recipes is None:
        recipes = s.gradient_recipes
    runs = _sweep(s.config, store, progress, recipe=list(recipes))
    runs += _sweep(s.config.replace(gradient_reference="paired_run"), store, progress, recipe=["mxfp8_e4m3"])
    runs += _sweep(s.config.replace(lr=max(s.lr_grid)), store, progress, recipe=["mxfp8_e4m3"])
    return runs


def mechanism_runs(scale="quick", *, store=None, recipe: str = "mxfp8_e4m3", progress: bool = True) -> list[Run]:
    """Section 5's mechanism: FP32 (LN clamping counted as a diagnostic),
    ``recipe`` (LN gains really MX-quantized), and ``recipe`` with only the LN
    affine parameters exempted (:func:`ln_affine_exempt`)."""
    s = _as_scale(scale)
    return _sweep(s.config, store, progress, recipe=["fp32", recipe, ln_affine_exempt(recipe)])


def quant_stats_runs(scale="quick", *, store=None, recipe: str = "mxfp8_e4m3", progress: bool = True) -> list[Run]:
    """The quantization statistics of every GEMM operand of ``recipe`` over training (one run at the
    scale's base config with ``quant_stats=True``)."""
    s = _as_scale(scale)
    return _sweep(s.config.replace(quant_stats=True), store, progress, recipe=[recipe])


def mitigation_runs(scale="quick", *, store=None, recipes=MITIGATION_RECIPES, progress: bool = True) -> list[Run]:
    """Fig. 6: forward-only quantization and bf16 activations against MXFP8 E4M3 and FP32."""
    s = _as_scale(scale)
    return _sweep(s.config, store, progress, recipe=list(recipes))


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


def intervention_runs(scale="quick", *, store=None, recipe: str = "mxfp8_e4m3", interventions=None,
                      progress: bool = True) -> tuple[Run, list[Run]]:
    """Fig. 7: a ``recipe`` run checkpointed at the scale's early and late
    intervention steps, and one continuation per (step, intervention), each on
    the parent's very batches (``interventions``: names of
    :data:`mx_proxy.numerics.recipe.MITIGATIONS`; default: the scale's ``interventions``).
    Returns ``(parent, children)``; a child's ``info["intervention"]`` holds
    ``at_step`` and ``apply``."""
    s = _as_scale(scale)
    if interventions is None:
        interventions = s.interventions
    steps = tuple(s.intervention_steps)
    parent_cfg = _aligned(s.config, steps).replace(recipe=recipe, checkpoint_at=steps)
    (parent,) = _sweep(parent_cfg, store, progress, recipe=[recipe])
    children = [_interventions.intervene(parent, t, apply=name, checkpoint_at=(), store=store, progress=progress)
                for t in steps for name in interventions]
    return parent, children


def zeta_control_runs(scale="quick", *, store=None, controls=ZETA_CONTROLS, progress: bool = True) -> list[Run]:
    """The paper's ζ with its controls: each ``(recipe, reference, seed
    offset, data-seed offset)`` of ``controls`` trains ``recipe`` with the
    ``reference`` run alongside, started from ``seed + offset`` and fed the
    batches of ``data_seed + data offset``. FP32 against FP32 with another
    seed or other batches shows what the paper's metric gives when nothing is
    quantized at all."""
    s = _as_scale(scale)
    base = s.config.replace(paired_run=True)
    runs = []
    for recipe, ref, seed_off, data_off in controls:
        cfg = base.replace(recipe=recipe, reference_recipe=ref,
                           reference_seed=base.seed + seed_off if seed_off else None,
                           reference_data_seed=base.data_seed + data_off if data_off else None)
        runs += _sweep(cfg, store, progress)
    return runs


def shape_runs(scale="quick", *, store=None, recipes=APPENDIX_RECIPES, progress: bool = True) -> list[Run]:
    """Fig. 9: the scale's depths (at its width) and widths (at its depth),
    FP32 and MXFP8 E4M3; the teacher follows the student's shape."""
    s = _as_scale(scale)
    c = s.config
    shapes = [(d, c.width) for d in s.depths] + [(c.depth, w) for w in s.widths]
    runs = []
    for d, w in dict.fromkeys(shapes):
        runs += _sweep(c.replace(depth=d, width=w), store, progress, recipe=list(recipes))
    return runs


def sgd_runs(scale="quick", *, store=None, recipes=APPENDIX_RECIPES, progress: bool = True) -> list[Run]:
    """Fig. 10: SGD without momentum at the scale's ``sgd_lr`` and with
    momentum 0.9 at ``sgd_lr × (1 − 0.9)`` (the same long-run step size),
    FP32 and MXFP8 E4M3."""
    s = _as_scale(scale)
    runs = []
    for momentum in (0.0, SGD_MOMENTUM):
        cfg = s.config.replace(optimizer="sgd", momentum=momentum, lr=s.sgd_lr * (1.0 - momentum))
        runs += _sweep(cfg, store, progress, recipe=list(recipes))
    return runs


def init_runs(scale="quick", *, store=None, recipes=APPENDIX_RECIPES, progress: bool = True) -> list[Run]:
    """Fig. 11: PyTorch-default init against Xavier-normal with gain 0.5, FP32 and MXFP8 E4M3."""
    s = _as_scale(scale)
    runs = []
    for cfg in (s.config, s.config.replace(init="xavier_normal", init_gain=0.5)):
        runs += _sweep(cfg, store, progress, recipe=list(recipes))
    return runs
