"""Analysis of runs: instability measures and the summary tables the notebooks print.

Pure functions of :class:`mxp.Run` objects (no training): :func:`instability`
(divergence, 10× blow-ups, spikes), :func:`summary` (one row per run),
:func:`clamp_window`, :func:`zeta_by_clamping` and :func:`paper_metric_table`
(the paper's ζ and its controls), :func:`gain_drift` (the LN gains' drift into the clamp band) and
:func:`headline` (a paired run's numbers for the README's headline,
finished or not; :mod:`mx_proxy.experiments.report` writes them out).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from mx_proxy.numerics import recipe_json
from mx_proxy.training.config import Config
from mx_proxy.training.result import Run

__all__ = ["instability", "jump_ratio", "loss_jump_ratio", "blowup_window", "window_for_steps", "summary",
           "clamp_window", "zeta_by_clamping", "paper_metric_table", "unstable_at", "unstable_after", "gain_drift",
           "headline"]


def blowup_window(run: Run) -> int:
    """W, the steps over which :func:`instability` takes the running minimum:
    100, or a tenth of a short run (at least 10)."""
    return window_for_steps(run.config.steps)


def window_for_steps(steps: int) -> int:
    """:func:`blowup_window` of a run configured for ``steps`` steps (a recorded history without its Run)."""
    return max(10, min(100, steps // 10))


def jump_ratio(run: Run) -> np.ndarray:
    """Each step's loss over the minimum loss of the W steps before it
    (:func:`blowup_window`), one value per metrics row; 1 for the first W rows
    (the initial transient). A non-finite loss counts as +inf."""
    return loss_jump_ratio(run.metrics["loss"].to_numpy(dtype=float), blowup_window(run))


def loss_jump_ratio(loss, window: int) -> np.ndarray:
    """:func:`jump_ratio` of a bare loss series, one value per step: the loss over the minimum of the ``window``
    losses before it; 1 for the first ``window`` steps; a non-finite loss counts as +inf."""
    loss = np.asarray(loss, dtype=float)
    loss = np.where(np.isfinite(loss), loss, np.inf)
    ratio = np.ones_like(loss)
    if len(loss) > window:
        recent_min = np.lib.stride_tricks.sliding_window_view(loss[:-1], window).min(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio[window:] = loss[window:] / recent_min
    return ratio


def instability(run: Run, factor: float = 10.0) -> dict:
    """Instability measures of one run.

    ``diverged_at``: the engine's stop (non-finite loss, or one step
    ``spike_factor``× the previous). ``blowup_at``: first step whose loss
    exceeds ``factor`` × the minimum of the previous W steps (W = 100, or a
    tenth of a short run; the first W steps, the initial transient, are
    skipped) -- it also catches multi-step blow-ups that never jump 100× in one
    step. ``spikes``: how many separate such excursions (plus one for a
    divergence). ``max_jump``: the largest loss / running-minimum ratio.
    ``max_jump_at``: the step where it is largest. ``blowups``: the first
    step of each excursion.
    """
    ratio = jump_ratio(run)
    hot = ratio > factor
    starts = np.flatnonzero(hot & ~np.r_[False, hot[:-1]])
    steps = run.metrics["step"].to_numpy()
    return {
        "diverged_at": run.diverged_at,
        "blowup_at": int(steps[starts[0]]) if len(starts) else None,
        "blowups": [int(steps[i]) for i in starts],
        "spikes": int(len(starts)) + (run.diverged_at is not None and not hot[-1:].any()),
        "max_jump": float(ratio.max()) if len(ratio) else float("nan"),
        "max_jump_at": int(steps[int(np.argmax(ratio))]) if len(ratio) else None,
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


def _before(run: Run, step: int | None) -> pd.DataFrame:
    """The metrics rows of the steps before ``step`` (all of them for ``None``)."""
    m = run.metrics
    return m if step is None else m[m["step"] < step]


def _before_divergence(run: Run) -> pd.DataFrame:
    """The metrics rows of the steps before any divergence (all of a stable run)."""
    return _before(run, run.diverged_at)


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
        m = _before_divergence(r)
        d = m.dropna(subset=["zeta_bound"]) if "zeta_bound" in m else m.iloc[0:0]
        row = {"recipe": _label(r)}
        iv = r.info.get("intervention") if isinstance(r.info, dict) else None
        if iv:
            row["intervention"] = "+".join(iv.get("apply") or []) or recipe_json.to_json(r.config.recipe)
            row["at_step"] = iv.get("at_step")
        row.update({f: getattr(r.config, f) for f in fields})
        row.update(instability(r))
        row["final_loss"] = r.final_loss
        row["min_loss"] = float(m["loss"].min()) if len(m) else float("nan")
        for col, fn, name in (("zeta_bound", np.median, "zeta_median"), ("zeta_bound", np.max, "zeta_max"),
                              ("cosine", np.min, "cosine_min"), ("ln_clamp_frac", np.max, "ln_clamp_max")):
            v = _finite(d, col)
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


def paper_metric_table(runs) -> pd.DataFrame:
    """One row per paired run: what its reference differs in, the median and
    maximum of the paper's ζ, the fraction of steps with ζ above 1.5, the median cosine against the paired run,
    and (where it differs from
    the run itself) the median same-point ‖ζ‖ bound."""
    rows = []
    for r in runs:
        c = r.config
        d = _before_divergence(r).dropna(subset=["zeta_paper"])
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


def _finite(m: pd.DataFrame, col: str) -> np.ndarray:
    v = m[col].to_numpy(dtype=float) if col in m else np.array([])
    return v[np.isfinite(v)]


def _med_max(m: pd.DataFrame, col: str) -> tuple[float, float]:
    v = _finite(m, col)
    return (float(np.median(v)), float(np.max(v))) if len(v) else (float("nan"), float("nan"))


def _first_step(m: pd.DataFrame, hot: pd.Series) -> int | None:
    return int(m["step"][hot].iloc[0]) if hot.any() else None


def unstable_after(run: Run, step: int = 0, measures: dict | None = None) -> int | None:
    """The first step at or after ``step`` where the run stopped being
    stable: the earlier of the first 10× blow-up over the recent minimum that
    starts there (:func:`instability`'s ``blowups``: a run can blow up by
    orders of magnitude in a few steps, each below the engine's one-step
    ``spike_factor``, and train on, even recover part of the way before it
    diverges) and the engine's ``diverged_at`` (a non-finite loss, which no
    10× comparison sees) or, where a run's metrics hold one its engine did
    not stop at, its first non-finite loss (the rule's divergence, whichever
    file it was read from); ``None`` if none. An intervention's ``step``
    leaves out what it inherited from its parent. ``measures``:
    :func:`instability` of ``run``, if already computed."""
    blowup = next((b for b in (measures or instability(run))["blowups"] if b >= step), None)
    m = run.metrics
    bad = m["step"][(m["step"] >= step) & ~np.isfinite(m["loss"].to_numpy(dtype=float))]
    nonfinite = int(bad.iloc[0]) if len(bad) else None
    onsets = [s for s in (blowup, run.diverged_at, nonfinite) if s is not None and s >= step]
    return min(onsets) if onsets else None


def unstable_at(run: Run, measures: dict | None = None) -> int | None:
    """Where the run stopped being stable (:func:`unstable_after` from step
    0); ``None`` for a stable run."""
    return unstable_after(run, 0, measures)


def gain_drift(run: Run, window: int = 250) -> pd.DataFrame:
    """The LN gains' drift, one row per block: their mean (``ln_gain_mean``)
    averaged over the diagnostic steps of the first and of the last
    ``window`` steps before the run became unstable (:func:`unstable_at`;
    all of a stable run) (``first``, ``last``), whether ``last`` lies in
    E4M3's clamp band [0.875, 1) (``in_band``), and the first step at which
    more than half (``half_clamped_at``) and all (``all_clamped_at``) of the
    block's gains clamped (``None``: never)."""
    m = _before(run, unstable_at(run))
    cols = sorted((c for c in m if c.startswith("ln_gain_mean/block_")), key=lambda c: int(c.rsplit("_", 1)[1]))
    d = m.dropna(subset=cols)
    end = int(m["step"].iloc[-1]) + 1 if len(m) else 0
    rows = []
    for c in cols:
        b = int(c.rsplit("_", 1)[1])
        first = float(d[c][d["step"] < int(d["step"].iloc[0]) + window].mean()) if len(d) else float("nan")
        last = float(d[c][d["step"] >= end - window].mean()) if len(d) else float("nan")
        clamp = m.dropna(subset=[f"ln_clamp_frac/block_{b}"]) if f"ln_clamp_frac/block_{b}" in m else m.iloc[0:0]
        frac = clamp[f"ln_clamp_frac/block_{b}"] if len(clamp) else pd.Series(dtype=float)
        rows.append({"block": b, "first": first, "last": last, "in_band": bool(0.875 <= last < 1.0),
                     "half_clamped_at": _first_step(clamp, frac > 0.5) if len(clamp) else None,
                     "all_clamped_at": _first_step(clamp, frac >= 1.0) if len(clamp) else None})
    df = pd.DataFrame(rows, columns=["block", "first", "last", "in_band", "half_clamped_at", "all_clamped_at"])
    for c in ("half_clamped_at", "all_clamped_at"):
        df[c] = df[c].astype("Int64")
    return df


def headline(run: Run, tail: int = 100, before: int = 500, settle: int = 1000) -> dict:
    """A paired run's headline numbers, over the steps its metrics hold (all
    of a finished run; those before the newest checkpoint of one in progress).

    ``steps``: steps recorded. ``loss`` and ``vs_fp32_pct``: the mean loss
    over the last ``tail`` recorded steps before any divergence (the end of
    the run, whatever happened in it), and how far above (+) or below its
    FP32 run's mean loss over the same steps it is, in %.
    ``fp32_ratio_max`` (at ``fp32_ratio_max_at``): the largest loss / FP32
    loss ratio from step ``settle`` on, and ``loss_max`` (at
    ``loss_max_at``) the largest loss. The :func:`instability` measures, and
    ``unstable_at`` (:func:`unstable_at`). Over the steps before
    ``unstable_at`` (all of a stable run): ``zeta_median``, ``zeta_max``, the
    same-point ‖ζ‖ bound; ``zeta_paper_median``, ``zeta_paper_max`` (at
    ``zeta_paper_max_at``), the paper's ζ; ``ln_clamp_max``, the largest
    fraction of LN gains clamped; ``clamp_window``: :func:`clamp_window`.
    An unstable run adds ``zeta_before``, ``zeta_before_max``,
    ``zeta_paper_before`` (medians and maximum) and
    ``zeta_paper_before_max`` over the ``before`` steps before ``unstable_at``.
    """
    m = _before_divergence(run)
    last = m.tail(tail)
    loss, ref = _finite(last, "loss"), _finite(last, "ref_loss")
    mean, ref_mean = (float(loss.mean()) if len(loss) else float("nan")), (float(ref.mean()) if len(ref) else np.nan)
    out = {"steps": int(len(run.metrics)), "loss": mean,
           "vs_fp32_pct": 100.0 * (mean / ref_mean - 1.0) if ref_mean > 0 else float("nan")}
    out.update(instability(run))
    out["unstable_at"] = onset = unstable_at(run, out)
    late = m[m["step"] >= settle]
    ratio = (late["loss"] / late["ref_loss"]).to_numpy(dtype=float) if "ref_loss" in m else np.array([])
    ok = np.isfinite(ratio)
    out["fp32_ratio_max"] = float(ratio[ok].max()) if ok.any() else float("nan")
    out["fp32_ratio_max_at"] = int(late["step"].to_numpy()[ok][np.argmax(ratio[ok])]) if ok.any() else None
    finite = m[np.isfinite(m["loss"].to_numpy(dtype=float))]
    out["loss_max"] = float(finite["loss"].max()) if len(finite) else float("nan")
    out["loss_max_at"] = int(finite["step"].loc[finite["loss"].idxmax()]) if len(finite) else None
    s = _before(run, onset)
    out["zeta_median"], out["zeta_max"] = _med_max(s, "zeta_bound")
    out["zeta_paper_median"], out["zeta_paper_max"] = _med_max(s, "zeta_paper")
    zp = s.dropna(subset=["zeta_paper"]) if "zeta_paper" in s else s.iloc[0:0]
    zp = zp[np.isfinite(zp["zeta_paper"].to_numpy(dtype=float))] if len(zp) else zp
    out["zeta_paper_max_at"] = int(zp["step"].loc[zp["zeta_paper"].idxmax()]) if len(zp) else None
    clamp = _finite(s, "ln_clamp_frac")
    out["ln_clamp_max"] = float(clamp.max()) if len(clamp) else float("nan")
    out["clamp_window"] = clamp_window(run)
    if onset is not None:
        w = s[s["step"] >= onset - before]
        out["zeta_before"], out["zeta_before_max"] = _med_max(w, "zeta_bound")
        out["zeta_paper_before"], out["zeta_paper_before_max"] = _med_max(w, "zeta_paper")
    return out
