"""The systems (GNMR, 2-D FP4, NVFP4, nGPT) against the paper's mitigations, defined once.

Notebook 09 and the ``systems`` figure of ``mx-proxy figures`` call the functions
here. Every *system* (:data:`SYSTEMS`) is a set of :class:`~mx_proxy.training.config.Config`
changes -- a recipe, an architecture, a stability controller -- trained in two
*settings*:

* ``base``: the scale's base config (``ExperimentScale.config``, one seed);
* ``stress``: the base config with the scale's ``stress`` changes
  (``ExperimentScale.stress``, e.g. a higher LR and a lower Adam beta2 at the quick
  scale) over ``ExperimentScale.stress_seeds``: a setting where plain MX runs diverge.
  At the quick scale FP32 diverges there too (an LR/beta2 instability shared
  by every precision), so every system is read against FP32 on the same seed.

:func:`runs` trains (or loads from the run store, like :mod:`mx_proxy.experiments.paper`)
every (system, setting, seed); the seeds of one system and setting share one
compiled program (``mxp.sweep``). :func:`table` turns them into
one row per run: final loss, its ratio to FP32's, whether and when the run
diverged, and the fraction of the GEMM work that ran in low precision.

What "low precision" counts (:func:`gemm_precision`, :func:`low_precision_frac`):
a GEMM (forward, dgrad or wgrad of a dense layer) runs in low precision when
BOTH its operands are block-scaled (MX or NVFP4) -- a GEMM with one operand
in bf16 runs at bf16 rate on hardware, so ``bf16_activations`` (weights MX,
activations bf16) counts 0 and ``forward_only`` 1/3. GEMMs are weighted by
their FLOPs (with GELU every student GEMM has the same size, so this is the
fraction of GEMMs). A layer that a recipe's ``overrides`` keep in MXFP8
(``mxfp4_2d``'s sensitive GEMMs) still counts as low precision, but not as
FP4 (``fp4_frac``). A GEMM unit a stability controller promoted at a step
runs in the controller's action precision (bf16/fp32) and counts 0 at that
step; the run's value is the mean over the steps it ran.

The GNMR controller runs with the settings :data:`GNMR_SETTINGS`, chosen once
(the controller's own defaults; see there) and never tuned per seed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from mx_proxy.experiments.analysis import instability
from mx_proxy.experiments.scales import get as _scale
from mx_proxy.nn.resmlp import fc1_width, hidden_width, layer_names
from mx_proxy.numerics import recipe as _recipes
from mx_proxy.runner import loop as runner
from mx_proxy.training import diagnostics
from mx_proxy.training.config import Config
from mx_proxy.training.controllers import GNMR
from mx_proxy.training.result import Run

__all__ = ["SYSTEMS", "FAMILIES", "SETTINGS", "GNMR_SETTINGS", "NEW_RECIPES", "Key", "systems_for",
           "config", "runs", "gemm_precision", "low_precision_frac", "table", "transpose_mismatch",
           "weight_disagreement"]

GNMR_SETTINGS = GNMR(threshold=3.0, delta_threshold=2.0, window=10, warmup=20, max_overrides=1, lock_steps=50,
                     action="bf16")
"""The GNMR knobs of notebook 09, chosen once, before any run: the
controller's own defaults (``GNMR()``; trigger at 3× the historical mean or
2× the mean of the last 10 norms, after 20 updates, one unit promoted at a
time, for 50 steps), with the bf16 action. Deliberately not tuned to this
proxy: the question is what an off-the-shelf GNMR does here, and tuning its
thresholds on the very seeds it is judged on would answer a different one.
With one override at a time and 2·depth units, at least 1 − 1/depth of the
GEMM work stays in low precision."""

SYSTEMS: Mapping[str, Mapping[str, Any]] = MappingProxyType({
    # reference and plain MX
    "fp32": MappingProxyType({"recipe": "fp32"}),
    "mxfp8_e4m3": MappingProxyType({"recipe": "mxfp8_e4m3"}),
    "mxfp4": MappingProxyType({"recipe": "mxfp4"}),
    # the paper's mitigations
    "forward_only": MappingProxyType({"recipe": "forward_only"}),
    "bf16_activations": MappingProxyType({"recipe": "bf16_activations"}),
    "ln_exempt": MappingProxyType({"recipe": "ln_exempt"}),
    # 2-D block FP4 (and FP8): 2-D tiles + rceil + stochastic rounding of gradients
    "mxfp8_2d": MappingProxyType({"recipe": "mxfp8_2d"}),
    "mxfp4_2d": MappingProxyType({"recipe": "mxfp4_2d"}),
    # NVFP4
    "nvfp4": MappingProxyType({"recipe": "nvfp4"}),
    "nvfp4_2d": MappingProxyType({"recipe": "nvfp4_2d"}),
    # nGPT (hypersphere-normalized student)
    "ngpt (fp32)": MappingProxyType({"arch": "ngpt", "recipe": "fp32"}),
    "ngpt + mxfp4": MappingProxyType({"arch": "ngpt", "recipe": "mxfp4"}),
    "ngpt + nvfp4": MappingProxyType({"arch": "ngpt", "recipe": "nvfp4"}),
    # the GNMR stability controller
    "gnmr + mxfp8_e4m3": MappingProxyType({"recipe": "mxfp8_e4m3", "controller": GNMR_SETTINGS}),
    "gnmr + mxfp4": MappingProxyType({"recipe": "mxfp4", "controller": GNMR_SETTINGS}),
})
"""System name → Config changes applied to the scale's base config."""

FAMILIES: Mapping[str, str] = MappingProxyType({
    "fp32": "reference", "mxfp8_e4m3": "plain MX", "mxfp4": "plain MX",
    "forward_only": "paper mitigation", "bf16_activations": "paper mitigation", "ln_exempt": "paper mitigation",
    "mxfp8_2d": "2-D + SR", "mxfp4_2d": "2-D + SR", "nvfp4": "NVFP4", "nvfp4_2d": "NVFP4",
    "ngpt (fp32)": "nGPT", "ngpt + mxfp4": "nGPT", "ngpt + nvfp4": "nGPT",
    "gnmr + mxfp8_e4m3": "GNMR", "gnmr + mxfp4": "GNMR",
})

SETTINGS = ("base", "stress")
NEW_RECIPES = ("mxfp8_2d", "mxfp4_2d", "nvfp4", "nvfp4_2d")
_NGPT_REFERENCE = "ngpt (fp32)"


class Key(NamedTuple):
    """The key of one run of :func:`runs`."""

    system: str
    setting: str
    seed: int


def _check_systems(names) -> tuple[str, ...]:
    if isinstance(names, str):
        names = (names,)
    names = tuple(names)
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown:
        raise ValueError(f"unknown system(s) {unknown}; valid: {', '.join(SYSTEMS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"systems given twice in {list(names)}")
    return names


def _check_setting(setting: str) -> str:
    if setting not in SETTINGS:
        raise ValueError(f"unknown setting {setting!r}; valid: {', '.join(SETTINGS)}")
    return setting


def systems_for(scale="quick") -> tuple[str, ...]:
    """The systems trained at this scale: its ``systems``, or every one
    of :data:`SYSTEMS` when that is ``None``."""
    s = _scale(scale)
    return tuple(SYSTEMS) if s.systems is None else _check_systems(s.systems)


def config(system: str, scale="quick", setting: str = "base") -> Config:
    """The config of ``system`` in ``setting`` (seed: the base config's; the
    stress setting sweeps ``ExperimentScale.stress_seeds``).

    Raises:
      ValueError: an unknown system or setting, naming the valid ones.
    """
    (system,) = _check_systems((system,))
    _check_setting(setting)
    s = _scale(scale)
    cfg = s.config.replace(**SYSTEMS[system])
    return cfg.replace(**s.stress) if setting == "stress" else cfg


def runs(scale="quick", *, store=None, systems: Iterable[str] | None = None, settings: Iterable[str] = SETTINGS,
         progress: bool = True) -> dict[Key, Run]:
    """Train (or load from the run store) every system of the scale (or
    ``systems``) in each setting: ``base`` on the base config's seed,
    ``stress`` over the scale's ``stress_seeds`` (one vmapped sweep per
    system). Returns ``{Key(system, setting, seed): Run}`` in
    (setting, system, seed) order.

    Raises:
      ValueError: an unknown system or setting, naming the valid ones.
    """
    s = _scale(scale)
    names = _check_systems(systems_for(s) if systems is None else systems)
    settings = tuple(_check_setting(x) for x in ([settings] if isinstance(settings, str) else settings))
    out: dict[Key, Run] = {}
    for setting in settings:
        for name in names:
            cfg = config(name, s, setting)
            seeds = [cfg.seed] if setting == "base" else list(s.stress_seeds)
            sw = runner.sweep(cfg, store=store, progress=progress, seed=seeds)
            for seed, run in zip(seeds, sw.runs):
                out[Key(name, setting, int(seed))] = run
    return out


# --------------------------------------------------------------------------- precision accounting


def gemm_precision(config: Config) -> pd.DataFrame:
    """One row per dense layer of the student: ``block``, ``layer``
    (``block_i/fc1``…), the recipe it runs (after ``overrides``), its
    ``flops`` weight (in × out features: each of its three GEMMs costs
    batch × in × out) and the fractions of its three GEMMs (forward, dgrad,
    wgrad) with both operands block-scaled (``low``) and both in FP4 E2M1
    (``fp4``; MXFP4 or NVFP4), when no controller promotes it."""
    d, depth = config.width, config.depth
    h = hidden_width(d, config.act)
    f = fc1_width(h, config.act)
    shapes = {"fc1": (d, f), "fc2": (h, d)}
    rows = []
    for i in range(depth):
        for fc, (n_in, n_out) in shapes.items():
            r = config.recipe.for_layer(*layer_names(i, depth, fc))
            pairs = [(r.fwd_x, r.fwd_w), (r.dgrad_g, r.dgrad_w), (r.wgrad_x, r.wgrad_g)]
            low = [a is not None and b is not None for a, b in pairs]
            fp4 = [lo and a.element.name == "fp4_e2m1" and b.element.name == "fp4_e2m1"
                   for lo, (a, b) in zip(low, pairs)]
            rows.append({"block": i, "layer": f"block_{i}/{fc}", "recipe": r.name, "flops": n_in * n_out,
                         "low": sum(low) / 3.0, "fp4": sum(fp4) / 3.0})
    return pd.DataFrame(rows)


def _steps_before_divergence(run: Run) -> pd.DataFrame:
    m = run.metrics
    return m[m["step"] < run.diverged_at] if run.diverged_at is not None else m


def low_precision_frac(run: Run, kind: str = "low") -> float:
    """The fraction of the run's GEMM work (FLOP-weighted, mean over the steps
    before any divergence) that ran with both operands block-scaled
    (``kind="low"``) or both in FP4 (``kind="fp4"``); see the module
    docstring. A GEMM unit promoted by the controller counts 0 at that step."""
    if kind not in ("low", "fp4"):
        raise ValueError(f"unknown kind {kind!r}; valid: low, fp4")
    g = gemm_precision(run.config)
    w = g["flops"].to_numpy(float) * g[kind].to_numpy(float)
    total = float(g["flops"].sum())
    m = _steps_before_divergence(run)
    cols = [f"promoted/block_{i}/gemm" for i in g["block"]]
    if run.config.controller is None or not len(m) or not all(c in m for c in cols):
        return float(w.sum() / total)
    promoted = m[cols].to_numpy(bool)                          # (T, layers)
    return float(((~promoted) * w).sum(axis=1).mean() / total)


# --------------------------------------------------------------------------- the table


def _as_items(runs_) -> list[tuple[Key, Run]]:
    if isinstance(runs_, Mapping):
        items = [(Key(*k), r) for k, r in runs_.items()]
    else:
        raise ValueError(f"table needs the mapping {{(system, setting, seed): Run}} of systems.runs, got "
                         f"{type(runs_).__name__}")
    _check_systems(dict.fromkeys(k.system for k, _ in items))
    for k, r in items:
        _check_setting(k.setting)
        if not isinstance(r, Run):
            raise ValueError(f"{k}: expected a mxp.Run, got {type(r).__name__}")
    return items


def _ratio(run: Run, ref: Run | None) -> float:
    """final loss / the reference's, only when both ran every step (a run cut
    short by divergence stopped at another step, so the ratio would compare
    different points of training)."""
    if ref is None or run.diverged_at is not None or ref.diverged_at is not None:
        return float("nan")
    return run.final_loss / ref.final_loss


def table(runs_: Mapping) -> pd.DataFrame:
    """One row per run of :func:`runs` (in :data:`SYSTEMS` order, then
    setting, then seed):

    ``system``, ``family``, ``setting``, ``seed``; ``final_loss`` (training
    loss of the last step before any divergence); ``vs_fp32``: final loss /
    the ``fp32`` run's in the same setting and seed, and ``vs_own_fp32``: the
    same against the system's own full-precision architecture (``ngpt
    (fp32)`` for the nGPT systems, else ``fp32``) -- both NaN when either
    run diverged or the reference is missing; ``diverged_at`` (the engine's
    stop: non-finite loss or a 100× one-step spike; ``<NA>`` if stable),
    ``fp32_diverged_at`` (the fp32 run's, same setting and seed),
    ``blowup_at`` (first loss 10× above its recent minimum,
    :func:`mx_proxy.experiments.analysis.instability`); ``steps`` (configured) and
    ``steps_run`` (steps before any divergence); ``low_precision_frac`` and ``fp4_frac``
    (:func:`low_precision_frac`); ``promotions`` (GNMR promote events,
    0 without a controller).

    Raises:
      ValueError: not a mapping of :class:`Key` to runs, or an unknown system
        or setting (naming the valid ones).
    """
    items = _as_items(runs_)
    by_key = {k: r for k, r in items}
    order = {n: i for i, n in enumerate(SYSTEMS)}
    items.sort(key=lambda kr: (order[kr[0].system], SETTINGS.index(kr[0].setting), kr[0].seed))
    rows = []
    for k, r in items:
        fp32 = by_key.get(Key("fp32", k.setting, k.seed))
        own = by_key.get(Key(_NGPT_REFERENCE if r.config.arch == "ngpt" else "fp32", k.setting, k.seed))
        ev = r.events
        rows.append({
            "system": k.system, "family": FAMILIES[k.system], "setting": k.setting, "seed": k.seed,
            "final_loss": r.final_loss,
            "vs_fp32": _ratio(r, fp32),
            "vs_own_fp32": _ratio(r, own),
            "diverged_at": r.diverged_at,
            "fp32_diverged_at": fp32.diverged_at if fp32 is not None else None,
            "blowup_at": instability(r)["blowup_at"],
            "steps": r.config.steps,
            "steps_run": int(len(_steps_before_divergence(r))),
            "low_precision_frac": low_precision_frac(r, "low"),
            "fp4_frac": low_precision_frac(r, "fp4"),
            "promotions": int((ev["event"] == "promote").sum()) if len(ev) else 0,
        })
    df = pd.DataFrame(rows, columns=["system", "family", "setting", "seed", "final_loss", "vs_fp32", "vs_own_fp32",
                                     "diverged_at", "fp32_diverged_at", "blowup_at", "steps", "steps_run",
                                     "low_precision_frac", "fp4_frac", "promotions"])
    for c in ("diverged_at", "fp32_diverged_at", "blowup_at"):
        df[c] = df[c].astype("Int64")
    return df


# --------------------------------------------------------------------------- forward vs dgrad weights


def transpose_mismatch(run: Run, recipe=None) -> np.ndarray:
    """Per block, ‖Q_fwd(W) − Q_dgrad(W)‖ / ‖W‖ over fc1 and fc2 of the run's
    final weights, quantized with the forward and dgrad weight specs of
    ``recipe`` (default: the run's own): how far the weight the forward GEMM
    sees is from the one the dgrad GEMM sees
    (:func:`mx_proxy.training.diagnostics.weight_transpose_mismatch`). Exactly 0 for a
    2-D-tiled weight spec shared by both GEMMs.

    Raises:
      ValueError: a recipe that leaves a weight operand unquantized, or a run
        without parameters.
    """
    r = _recipes.get(recipe) if recipe is not None else run.config.recipe
    if r.fwd_w is None or r.dgrad_w is None:
        raise ValueError(f"recipe {r.name!r} does not quantize the weight in both the forward and dgrad GEMMs")
    if run.params is None:
        raise ValueError("the run has no parameters (train it, or load it from a run store)")
    return np.asarray(diagnostics.weight_transpose_mismatch(run.params, r.fwd_w, r.dgrad_w))


def weight_disagreement(runs_: Mapping, pairs=(("mxfp4", "mxfp4_2d"),), setting: str = "base") -> pd.DataFrame:
    """Forward-vs-dgrad weight disagreement of 1-D against 2-D blocks, per
    block, one row per (weights of system, specs of recipe): for each pair
    (1-D system, 2-D system), the final weights of each system's run in
    ``setting`` (lowest seed) quantized with both systems' specs, plus the
    median over training of the engine's own ``weight_fwd_dgrad_diff/block_i``
    column (recorded at diagnostic steps, under the run's own specs)."""
    items = dict(_as_items(runs_))
    rows = []
    for pair in pairs:
        for owner in pair:
            keys = sorted((k for k in items if k.system == owner and k.setting == setting), key=lambda k: k.seed)
            if not keys:
                continue
            run = items[keys[0]]
            for spec_of in pair:
                vals = transpose_mismatch(run, SYSTEMS[spec_of]["recipe"])
                for b, v in enumerate(vals):
                    col = f"weight_fwd_dgrad_diff/block_{b}"
                    own = col in run.metrics and spec_of == owner
                    during = run.metrics[col].dropna() if own else pd.Series(dtype=float)
                    rows.append({"weights_of": owner, "specs_of": spec_of, "block": b, "final": float(v),
                                 "median_during_training": float(during.median()) if len(during) else float("nan")})
    return pd.DataFrame(rows, columns=["weights_of", "specs_of", "block", "final", "median_during_training"])
