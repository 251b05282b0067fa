"""Statistics of ensembles: rates with intervals, survival, paired tests, signal scores.

Every function wraps ``scipy.stats`` (none re-derives a formula scipy has):

- :func:`rate`: P(event) with a Clopper–Pearson (exact binomial) interval;
- :func:`survival`: Kaplan–Meier survival of time-to-event, right-censored
  at each member's horizon (``scipy.stats.ecdf`` on ``CensoredData``), with
  pointwise confidence bands;
- :func:`mcnemar`: McNemar's exact test on paired binary outcomes (a
  two-sided binomial test on the discordant pairs);
- :func:`logrank`: the log-rank test of two survival samples;
- :func:`cochran_q`: Cochran's Q test that several paired binary outcomes
  share one rate, its p-value by permuting each member's outcomes across the
  arms (``scipy.stats.permutation_test``);
- :func:`sign_test`: the sign test of paired values (which of each pair is
  lower; a two-sided binomial test on the untied pairs);
- :func:`bootstrap_mean`: a mean with a bootstrap (BCa) interval,
  reproducible from its seed;
- :func:`auc`: the area under the ROC curve of a score for a binary label
  (the Mann–Whitney U statistic over n₁·n₀, ties counting one half).

Times are in training steps; an event time ``t`` with ``event=False`` means
"no event seen up to ``t``" (censored).
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from scipy.stats import CensoredData


def _st():
    """``scipy.stats``, imported on first use: it takes ~1 s, and the command line imports this module to build
    its parser, before it knows whether any statistic is asked for."""
    from scipy import stats

    return stats

__all__ = ["Rate", "rate", "survival", "mcnemar", "McNemar", "logrank", "LogRank", "cochran_q", "CochranQ",
           "PERMUTATIONS", "sign_test", "SignTest", "bootstrap_mean", "Estimate", "auc"]

PERMUTATIONS = 9999
"""Permutations :func:`cochran_q` samples where it cannot count them all."""


class Rate(NamedTuple):
    """``k`` events in ``n`` trials: the estimate ``p = k / n`` and its ``[low, high]`` interval."""

    k: int
    n: int
    p: float
    low: float
    high: float


class McNemar(NamedTuple):
    """Paired outcomes of arms A and B: ``only_a`` pairs with the event in A
    only, ``only_b`` in B only, ``both``, ``neither``; ``pvalue`` of the exact
    two-sided test (1.0 with no discordant pair)."""

    only_a: int
    only_b: int
    both: int
    neither: int
    pvalue: float


class LogRank(NamedTuple):
    """The log-rank test: its statistic (signed: positive where the first
    sample's events come sooner) and two-sided ``pvalue``; NaN where no event
    happened in either sample."""

    statistic: float
    pvalue: float


class CochranQ(NamedTuple):
    """Cochran's Q over ``members`` × ``arms`` paired binary outcomes: the
    ``statistic`` and its ``pvalue`` (one-sided: large Q, unequal rates);
    ``exact``: every within-member permutation was counted, else a random
    sample of them."""

    statistic: float
    pvalue: float
    members: int
    arms: int
    exact: bool


class SignTest(NamedTuple):
    """Paired values of A and B: ``lower`` pairs where A's is below B's, ``higher`` above, ``ties``; ``pvalue``
    of the two-sided binomial test on the untied pairs (1.0 without one)."""

    lower: int
    higher: int
    ties: int
    pvalue: float


class Estimate(NamedTuple):
    """A point estimate with its ``[low, high]`` interval and the sample size ``n``."""

    value: float
    low: float
    high: float
    n: int


def _check_confidence(confidence: float) -> float:
    if not isinstance(confidence, (int, float)) or not 0 < confidence < 1:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence!r}")
    return float(confidence)


def rate(k: int, n: int, confidence: float = 0.95) -> Rate:
    """P(event) from ``k`` events in ``n`` trials, with the Clopper–Pearson
    interval (``scipy.stats.binomtest(k, n).proportion_ci(method="exact")``)."""
    if isinstance(k, bool) or isinstance(n, bool) or not (isinstance(k, (int, np.integer))
                                                          and isinstance(n, (int, np.integer))):
        raise TypeError(f"rate needs integer counts, got k={k!r}, n={n!r}")
    if not 0 <= k <= n or n < 1:
        raise ValueError(f"rate needs 0 <= k <= n and n >= 1, got k={k}, n={n}")
    ci = _st().binomtest(int(k), int(n)).proportion_ci(confidence_level=_check_confidence(confidence), method="exact")
    return Rate(int(k), int(n), k / n, float(ci.low), float(ci.high))


def _times(times, events) -> tuple[np.ndarray, np.ndarray]:
    t = np.asarray(times, dtype=float)
    e = np.asarray(events, dtype=bool)
    if t.ndim != 1 or t.shape != e.shape or not len(t):
        raise ValueError(f"times and events must be two 1-D sequences of one non-zero length, got shapes "
                         f"{t.shape} and {e.shape}")
    if not np.all(np.isfinite(t)) or np.any(t < 0):
        raise ValueError(f"times must be finite and >= 0, got {t.tolist()}")
    return t, e


def _censored(t: np.ndarray, e: np.ndarray) -> CensoredData:
    return _st().CensoredData(uncensored=t[e], right=t[~e])


def survival(times, events, confidence: float = 0.95) -> pd.DataFrame:
    """Kaplan–Meier estimate of S(t) = P(no event by step t).

    Args:
      times: per member, the step of its event, or (``events`` False) the
        last step it was seen without one (its horizon).
      events: per member, whether the event happened.

    Returns:
      One row per distinct time, from ``t = 0`` (S = 1): ``t``, ``survival``
      and the pointwise ``low``/``high`` band (the log-log transformed
      Greenwood interval, which stays inside [0, 1]; [1, 1] before the first
      event, [0, 1] where it is undefined because no member is left at risk);
      with no event at all, the one row ``t = 0`` and the last time, both 1.
    """
    t, e = _times(times, events)
    confidence = _check_confidence(confidence)
    if not e.any():
        end = float(t.max())
        return pd.DataFrame({"t": [0.0, end] if end > 0 else [0.0], "survival": 1.0, "low": 1.0, "high": 1.0})
    sf = _st().ecdf(_censored(t, e)).sf
    with warnings.catch_warnings():  # undefined where S is 1 (no event yet) or 0 (the last member at risk had it)
        warnings.simplefilter("ignore", RuntimeWarning)
        band = sf.confidence_interval(confidence, method="log-log")
    df = pd.DataFrame({"t": sf.quantiles, "survival": sf.probabilities,
                       "low": band.low.probabilities, "high": band.high.probabilities})
    certain = df["survival"] == 1.0
    df.loc[certain, ["low", "high"]] = 1.0
    df[["low", "high"]] = df[["low", "high"]].fillna({"low": 0.0, "high": 1.0})
    return pd.concat([pd.DataFrame({"t": [0.0], "survival": [1.0], "low": [1.0], "high": [1.0]}), df],
                     ignore_index=True)


def mcnemar(a, b) -> McNemar:
    """McNemar's exact test of paired binary outcomes ``a[i]``, ``b[i]`` (member
    ``i`` of arms A and B saw the same perturbation): a two-sided binomial
    test of the discordant pairs against p = ½."""
    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    if a.ndim != 1 or a.shape != b.shape or not len(a):
        raise ValueError(f"mcnemar needs two paired 1-D outcome sequences of one non-zero length, got shapes "
                         f"{a.shape} and {b.shape}")
    only_a, only_b = int(np.sum(a & ~b)), int(np.sum(~a & b))
    p = 1.0 if only_a + only_b == 0 else float(_st().binomtest(only_a, only_a + only_b, 0.5).pvalue)
    return McNemar(only_a, only_b, int(np.sum(a & b)), int(np.sum(~a & ~b)), p)


def logrank(times_a, events_a, times_b, events_b) -> LogRank:
    """The log-rank test of two right-censored samples (``scipy.stats.logrank``, two-sided)."""
    ta, ea = _times(times_a, events_a)
    tb, eb = _times(times_b, events_b)
    if not (ea.any() or eb.any()):
        return LogRank(float("nan"), float("nan"))
    res = _st().logrank(_censored(ta, ea), _censored(tb, eb))
    return LogRank(float(res.statistic), float(res.pvalue))


def _q(*arms, axis=-1):
    """Cochran's Q of paired binary outcomes, one sample per arm (vectorized over leading axes)."""
    m = np.stack([np.moveaxis(a, axis, -1) for a in arms], axis=-1)  # (..., members, arms)
    k = m.shape[-1]
    col, row = m.sum(axis=-2), m.sum(axis=-1)
    total = row.sum(axis=-1)
    num = (k - 1) * (k * np.square(col).sum(axis=-1) - np.square(total))
    den = k * total - np.square(row).sum(axis=-1)
    return np.where(den > 0, num / np.where(den > 0, den, 1), 0.0)


def cochran_q(outcomes, seed: int = 0, resamples: int = PERMUTATIONS) -> CochranQ:
    """Cochran's Q test that k arms have one rate, over paired binary
    outcomes ``outcomes[i, j]`` (member ``i`` of arm ``j``; each member saw
    the same perturbation in every arm). Q = (k−1)(k·ΣC_j² − T²) / (k·T − ΣR_i²)
    with C_j the arms' and R_i the members' totals; its p-value comes from
    permuting each member's outcomes across the arms
    (``scipy.stats.permutation_test``, ``permutation_type="samples"``): exact
    when there are at most ``resamples`` distinct permutations, else
    ``resamples`` random ones drawn from ``seed``. Members whose outcome is
    the same in every arm carry no information (Q = 0, p = 1 with no other)."""
    x = np.asarray(outcomes)
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 2:
        raise ValueError(f"cochran_q needs a (members, arms) table with at least 1 member and 2 arms, got shape "
                         f"{x.shape}")
    if x.dtype != bool and not np.isin(x, (0, 1)).all():
        raise ValueError(f"cochran_q needs binary outcomes (bool, or 0 and 1), got {np.unique(x).tolist()}")
    x = x.astype(float)
    n, k = x.shape
    exact = math.factorial(k) ** n <= resamples
    if not np.any((x.sum(axis=1) > 0) & (x.sum(axis=1) < k)):
        return CochranQ(0.0, 1.0, n, k, True)
    if n == 1:  # one member: every permutation of its outcomes gives the same Q
        return CochranQ(float(_q(*x.T)), 1.0, n, k, True)
    res = _st().permutation_test(tuple(x.T), _q, permutation_type="samples", vectorized=True, n_resamples=resamples,
                                 alternative="greater", rng=np.random.default_rng(seed))
    return CochranQ(float(res.statistic), float(res.pvalue), n, k, exact)


def sign_test(a, b) -> SignTest:
    """The sign test of paired values ``a[i]`` against ``b[i]`` (e.g. two arms' losses, member by member):
    how often A is lower, higher, tied, and ``scipy.stats.binomtest`` on the untied pairs at 1/2. Values may be
    +inf (a member stopped before the horizon counts as higher than any finite loss); NaN is refused."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"sign_test needs two 1-D samples of one length, got shapes {a.shape} and {b.shape}")
    if np.isnan(a).any() or np.isnan(b).any():
        raise ValueError("sign_test needs values without NaN (a stopped member's loss is +inf, not NaN)")
    lower, higher = int((a < b).sum()), int((a > b).sum())
    n = lower + higher
    p = float(_st().binomtest(lower, n, 0.5).pvalue) if n else 1.0
    return SignTest(lower, higher, len(a) - n, p)


def bootstrap_mean(x, confidence: float = 0.95, seed: int = 0, resamples: int = 9999) -> Estimate:
    """The mean of ``x`` (NaNs dropped) with a bootstrap interval
    (``scipy.stats.bootstrap``, BCa; percentile where BCa is undefined, e.g. all
    values equal). ``seed`` fixes the resampling, so a report is reproducible.
    Fewer than two values: the interval is NaN."""
    v = np.asarray(x, dtype=float).ravel()
    v = v[np.isfinite(v)]
    if not len(v):
        return Estimate(float("nan"), float("nan"), float("nan"), 0)
    mean = float(v.mean())
    if len(v) < 2 or np.all(v == v[0]):
        return Estimate(mean, mean if len(v) > 1 else float("nan"), mean if len(v) > 1 else float("nan"), len(v))
    res = _st().bootstrap((v,), np.mean, confidence_level=_check_confidence(confidence), n_resamples=resamples,
                        method="BCa", rng=np.random.default_rng(seed))
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (np.isfinite(low) and np.isfinite(high)):
        res = _st().bootstrap((v,), np.mean, confidence_level=confidence, n_resamples=resamples, method="percentile",
                            rng=np.random.default_rng(seed))
        low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return Estimate(mean, low, high, len(v))


def auc(scores, labels) -> float:
    """Area under the ROC curve of ``scores`` for the binary ``labels``: the
    probability that a positive outscores a negative, ties counting ½
    (``scipy.stats.mannwhitneyu``'s U over n₁·n₀). NaN scores are dropped;
    NaN if either class is empty."""
    s, y = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    if s.shape != y.shape:
        raise ValueError(f"scores and labels must have one shape, got {s.shape} and {y.shape}")
    ok = np.isfinite(s)
    pos, neg = s[ok & y], s[ok & ~y]
    if not len(pos) or not len(neg):
        return float("nan")
    u = _st().mannwhitneyu(pos, neg, alternative="two-sided", method="asymptotic").statistic
    return float(u / (len(pos) * len(neg)))
