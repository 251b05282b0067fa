"""Which signal warns first: candidate early-warning signals of a blow-up, scored across an ensemble.

Every member of every arm contributes its diagnostic steps ``t`` from its
start up to its blow-up (or its censoring). At each such step a signal has a
value (higher = more alarming) and a label: does the member blow up within
the next H steps (``0 < T − t ≤ H``, T its blow-up step)? Pooled over all
members, a signal is scored by

- ``auc_H``: the area under its ROC curve for that label
  (:func:`mx_proxy.experiments.stats.auc`), for H = 100 and 500: 0.5 is no
  better than chance, 1 a perfect warning;
- ``lead``: its median lead time over the members that blew up: T minus the
  step from which the signal stayed above its alarm threshold (the 95th
  percentile of its values at the *quiet* steps: no blow-up within
  ``H_max``, every arm) up to the blow-up, within the ``H_max`` steps before T;
  ``warned``: how many blow-ups it warned of that way (above the threshold at
  the last diagnostic step before T).

Steps are pooled, so the AUCs describe a signal's behaviour over many
correlated steps of few members: read them with the number of blow-ups
(``events``) in mind.

The signals (:data:`SIGNALS`) come from the members' recorded metrics:
same-point ‖ζ‖ bound, the paper's ζ (members trained with their FP32 run),
the LN clamp fraction, 1 − gradient cosine, the update norm, the loss jump
(loss over its minimum of the previous 100 steps, the blow-up rule's own
ratio), and the GNMR controller's ratios (:func:`mx_proxy.training.controllers.update`
run over each block's recorded gradient norm, the largest over blocks):
GNMR (norm over its mean since step 0, where a branch's history is
available, else since the export's first step) and Δ-GNMR (over the mean
of its previous ``window`` norms).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from mx_proxy.experiments import stats
from mx_proxy.training import controllers

__all__ = ["SIGNALS", "signal_frame", "labelled", "score", "score_labelled", "HORIZONS", "QUIET_QUANTILE"]

HORIZONS = (100, 500)
QUIET_QUANTILE = 0.95


def _col(m: pd.DataFrame, c: str) -> np.ndarray:
    return m[c].to_numpy(dtype=float) if c in m else np.full(len(m), np.nan)


def _loss_jump(m: pd.DataFrame, window: int = 100) -> np.ndarray:
    loss = np.where(np.isfinite(_col(m, "loss")), _col(m, "loss"), np.inf)
    prior = pd.Series(loss).rolling(window, min_periods=window).min().shift(1).to_numpy()
    return loss / prior


@functools.cache
def _gnmr_scan(window: int):
    ctrl = controllers.GNMR(window=window, warmup=window)

    @jax.jit
    def run(norms):
        def step(state, g):
            state, info = controllers.update(ctrl, state, g)
            return state, (info["gnmr"], info["delta_gnmr"])
        _, (g, d) = jax.lax.scan(step, controllers.init(ctrl, norms.shape[1]), norms)
        return g, d
    return run


def _gnmr(m: pd.DataFrame, window: int = 10) -> tuple[np.ndarray, np.ndarray]:
    cols = sorted((c for c in m if c.startswith("grad_norm/block_")), key=lambda c: int(c.rsplit("_", 1)[1]))
    if not cols:
        return np.full(len(m), np.nan), np.full(len(m), np.nan)
    g, d = _gnmr_scan(window)(jnp.asarray(m[cols].to_numpy(dtype=np.float32)))
    with np.errstate(all="ignore"):
        return np.nanmax(np.asarray(g, float), axis=1, initial=-np.inf), np.nanmax(np.asarray(d, float), axis=1,
                                                                                  initial=-np.inf)


SIGNALS = {
    "zeta_bound": "same-point ‖ζ‖ bound",
    "zeta_paper": "paper's ζ (vs the FP32 run)",
    "ln_clamp_frac": "LN gains clamped",
    "cosine_deficit": "1 − gradient cosine",
    "update_norm": "update norm",
    "loss_jump": "loss jump (÷ min of previous 100)",
    "gnmr": "GNMR (max over blocks)",
    "delta_gnmr": "Δ-GNMR (max over blocks)",
}


def signal_frame(metrics: pd.DataFrame, history: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every signal of :data:`SIGNALS` per recorded step of ``metrics``
    (``history``: the rows before them, e.g. a branch state's, that the
    ratios over a running history see first)."""
    m = metrics if history is None else pd.concat(
        [history[history["step"] < metrics["step"].iloc[0]], metrics], ignore_index=True)
    g, d = _gnmr(m)
    df = pd.DataFrame({"step": m["step"].to_numpy(), "zeta_bound": _col(m, "zeta_bound"),
                       "zeta_paper": _col(m, "zeta_paper"), "ln_clamp_frac": _col(m, "ln_clamp_frac"),
                       "cosine_deficit": 1.0 - _col(m, "cosine"), "update_norm": _col(m, "update_norm"),
                       "loss_jump": _loss_jump(m), "gnmr": g, "delta_gnmr": d})
    df = df[df["step"] >= metrics["step"].iloc[0]].reset_index(drop=True)
    return df.replace([np.inf, -np.inf], np.nan)


def labelled(result, history: pd.DataFrame | None = None, diagnostics_every: int | None = None) -> pd.DataFrame:
    """One row per (member, diagnostic step before its blow-up or censoring):
    ``arm``, ``member``, ``step``, every signal of :data:`SIGNALS` and
    ``until`` = steps to the member's blow-up (inf: none). What :func:`score`
    scores; ``diagnostics_every`` (default: the spec's) keeps the steps where
    the diagnostics were recorded."""
    if diagnostics_every is None:
        diagnostics_every = result.spec.diagnostics
    spec, table = result.spec, result.table.set_index(["arm", "member"])
    frames = []
    for arm, runs in result.runs.items():
        for i, r in enumerate(runs):
            if r is None or (arm, i) not in table.index:
                continue
            o = table.loc[(arm, i)]
            stop = spec.start + int(o["time"])
            f = signal_frame(r.metrics, history)
            f = f[(f["step"] >= spec.start) & (f["step"] < stop)]
            if diagnostics_every:
                f = f[f["step"] % diagnostics_every == 0]
            f = f.assign(arm=arm, member=i, until=(stop - f["step"]) if bool(o["event"]) else np.inf)
            frames.append(f)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def score(result, history: pd.DataFrame | None = None, horizons=HORIZONS) -> pd.DataFrame:
    """One row per signal: ``auc_<H>`` for each H of ``horizons``, the
    ``threshold`` (95th percentile at quiet steps), ``events`` (blow-ups
    scored), ``warned`` and ``lead`` (median lead time, steps), ``steps``
    (member-steps with a value). ``result``: an
    :class:`mx_proxy.experiments.ensemble_result.EnsembleResult`; ``history``:
    the branch state's metrics, if any (for GNMR's mean since step 0)."""
    return score_labelled(labelled(result, history), horizons)


def score_labelled(d: pd.DataFrame, horizons=HORIZONS) -> pd.DataFrame:
    """:func:`score` of a :func:`labelled` frame ``d`` (for a caller that
    already holds it, e.g. a figure of the same steps)."""
    h_max = max(horizons)
    rows = []
    for name, label in SIGNALS.items():
        if not len(d) or not np.isfinite(d[name]).any():
            continue
        v = d[name].to_numpy(dtype=float)
        ok = np.isfinite(v)
        row = {"signal": name, "label": label, "steps": int(ok.sum())}
        for h in horizons:
            row[f"auc_{h}"] = stats.auc(v, d["until"].to_numpy() <= h)
        quiet = ok & (d["until"].to_numpy() > h_max)
        thr = float(np.quantile(v[quiet], QUIET_QUANTILE)) if quiet.any() else np.nan
        leads, events = [], 0
        for _, g in d[np.isfinite(d["until"])].groupby(["arm", "member"]):
            events += 1
            near = g[g["until"] <= h_max].sort_values("step")
            above = (near[name] > thr).to_numpy()
            if len(above) and above[-1]:  # the alarm that lasted to the blow-up: from the last quiet step on
                first = len(above) - int(np.argmin(above[::-1])) if not above.all() else 0
                leads.append(int(near["until"].iloc[first]))
        row.update(threshold=thr, events=events, warned=len(leads),
                   lead=float(np.median(leads)) if leads else np.nan)
        rows.append(row)
    return pd.DataFrame(rows)
