"""The plan's H3: a warning signal scored on independent blow-ups, one score per member (docs/plan.md, H3).

For a member of one of H3's arms that blew up at step T, its score is the signal's largest value over its
diagnostic steps in (T − ``window``, T − ``gap``]; for a member that did not, the median over the blow-up times
T_j of the other members of its arm of its largest value over the same window (so both are read at the same
training time). The AUC is the Mann–Whitney statistic of blown-up against stable members' scores
(:func:`mx_proxy.experiments.stats.auc`), with a 95 % bootstrap interval that resamples the blown-up and the
stable members apart (``scipy.stats.bootstrap``, percentile) and the two-sided Mann–Whitney p-value. An arm with
fewer than :data:`MIN_STABLE` stable members is scored instead against its blown-up members' own earlier window
(T − :data:`EARLY` [0], T − :data:`EARLY` [1]] by the paired Wilcoxon signed-rank test, and said so.

The signals are :data:`mx_proxy.experiments.signals.SIGNALS`, read by
:func:`mx_proxy.experiments.signals.labelled` at the ensemble's diagnostic steps.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from mx_proxy.experiments import signals, stats

__all__ = ["MIN_STABLE", "EARLY", "AucOutcome", "scores", "evaluate_auc"]

MIN_STABLE = 5
"""Fewer stable members than this in an arm: its members are scored against their own earlier window."""
EARLY = (1500, 1000)
"""The earlier window (T − 1500, T − 1000] of the paired fallback, in steps before the blow-up."""


@dataclasses.dataclass(frozen=True)
class AucOutcome:
    """H3's test of one signal: ``auc`` with ``low``/``high`` over ``positives`` blown-up and ``negatives``
    stable members of the arms with enough stable ones (``auc_arms``), its Mann–Whitney ``pvalue``; the paired
    fallback's Wilcoxon ``paired_p`` over ``paired_n`` blown-up members of ``paired_arms`` (their median rise,
    window minus earlier window, ``paired_rise``); ``pvalue_used``: the p the report corrects (the Mann–Whitney
    one where it has both classes, else the Wilcoxon one)."""

    signal: str
    auc: float = math.nan
    low: float = math.nan
    high: float = math.nan
    pvalue: float = math.nan
    positives: int = 0
    negatives: int = 0
    auc_arms: tuple[str, ...] = ()
    paired_arms: tuple[str, ...] = ()
    paired_n: int = 0
    paired_rise: float = math.nan
    paired_p: float = math.nan

    @property
    def pvalue_used(self) -> float:
        return self.pvalue if self.positives and self.negatives else self.paired_p


def _window_max(frame: pd.DataFrame, signal: str, t: int, lo: int, hi: int) -> float:
    """The largest finite value of ``signal`` over the steps in (t − lo, t − hi]; NaN without one."""
    v = frame.loc[(frame["step"] > t - lo) & (frame["step"] <= t - hi), signal].to_numpy(float)
    v = v[np.isfinite(v)]
    return float(v.max()) if len(v) else math.nan


def scores(result, arms, signal: str, window: int = 500, gap: int = 50, frames: pd.DataFrame | None = None
           ) -> pd.DataFrame:
    """One row per member of ``arms`` of ``result`` (an EnsembleResult): ``arm``, ``member``, ``event``,
    ``score`` (see the module) and ``early`` (a blown-up member's largest value over its earlier window,
    :data:`EARLY`; NaN for a stable member). ``frames``: ``signals.labelled(result)``, if already computed."""
    if signal not in signals.SIGNALS:
        raise ValueError(f"unknown signal {signal!r}; valid: {', '.join(signals.SIGNALS)}")
    frames = signals.labelled(result) if frames is None else frames
    table = result.table
    rows = []
    for arm in arms:
        mine = table[table["arm"] == arm]
        times = {int(m.member): int(m.blowup_at) for m in mine.itertuples() if m.event}
        for m in mine.itertuples():
            f = frames[(frames["arm"] == arm) & (frames["member"] == m.member)] if len(frames) else frames
            if not len(f):
                rows.append({"arm": arm, "member": m.member, "event": bool(m.event), "score": math.nan,
                             "early": math.nan})
                continue
            if m.event:
                t = times[int(m.member)]
                score, early = _window_max(f, signal, t, window, gap), _window_max(f, signal, t, *EARLY)
            else:
                at = [_window_max(f, signal, t, window, gap) for j, t in times.items() if j != m.member]
                at = [v for v in at if math.isfinite(v)]
                score, early = (float(np.median(at)) if at else math.nan), math.nan
            rows.append({"arm": arm, "member": int(m.member), "event": bool(m.event), "score": score,
                         "early": early})
    return pd.DataFrame(rows, columns=["arm", "member", "event", "score", "early"])


def _auc_pairs(pos, neg, axis=-1):
    """The AUC of positives ``pos`` against negatives ``neg`` (vectorized over leading axes; ties count ½)."""
    p, n = np.moveaxis(pos, axis, -1)[..., :, None], np.moveaxis(neg, axis, -1)[..., None, :]
    return ((p > n) + 0.5 * (p == n)).mean(axis=(-2, -1))


def evaluate_auc(result, arms, signal: str, window: int = 500, gap: int = 50, seed: int = 0,
                 frames: pd.DataFrame | None = None) -> AucOutcome:
    """H3's test of ``signal`` on ``arms`` of ``result`` (see the module); ``seed`` fixes the bootstrap; ``frames``:
    ``signals.labelled(result)``, if already computed."""
    from scipy import stats as st

    s = scores(result, arms, signal, window, gap, frames)
    s = s[np.isfinite(s["score"])]
    stable = s[~s["event"]].groupby("arm").size()
    by_auc = tuple(a for a in arms if stable.get(a, 0) >= MIN_STABLE)
    by_pair = tuple(a for a in arms if a not in by_auc and (s["arm"] == a).any())
    out = {"signal": signal, "auc_arms": by_auc, "paired_arms": by_pair}
    part = s[s["arm"].isin(by_auc)]
    pos, neg = part.loc[part["event"], "score"].to_numpy(float), part.loc[~part["event"], "score"].to_numpy(float)
    if len(pos) and len(neg):
        out.update(auc=stats.auc(part["score"], part["event"]), positives=len(pos), negatives=len(neg),
                   pvalue=float(st.mannwhitneyu(pos, neg, alternative="two-sided").pvalue))
        if len(pos) > 1 and len(neg) > 1:
            ci = st.bootstrap((pos, neg), _auc_pairs, vectorized=True, paired=False, method="percentile",
                              n_resamples=9999, batch=500, rng=np.random.default_rng(seed)).confidence_interval
            out.update(low=float(ci.low), high=float(ci.high))
    fall = s[s["arm"].isin(by_pair) & s["event"] & np.isfinite(s["early"])]
    if len(fall):
        rise = (fall["score"] - fall["early"]).to_numpy(float)
        p = 1.0 if not np.any(rise) else float(st.wilcoxon(fall["score"], fall["early"]).pvalue)
        out.update(paired_n=len(fall), paired_rise=float(np.median(rise)), paired_p=p)
    return AucOutcome(**out)
