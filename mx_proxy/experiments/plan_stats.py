"""The statistics the pre-registered plan registers (docs/plan.md, "Rules that hold for every study"), one test at a
time, on members' outcomes paired by seed.

Every outcome here is one member's "blown up by the horizon" (``True``/``False``, the ensembles' rule,
:func:`mx_proxy.experiments.ensemble_result.outcomes`), and a sample is a :class:`pandas.Series` of them indexed
by seed, so two arms (of one study or of two) are paired by their common seeds:

- :func:`difference`: an effect as the mean over seeds of a per-seed difference, with its 95 % bootstrap
  interval over seeds (:func:`mx_proxy.experiments.stats.bootstrap_mean`);
- :func:`sign_flip`: the exact two-sided sign-flip permutation test of a mean of paired differences
  (``scipy.stats.permutation_test``, ``permutation_type="samples"`` with one sample), every one of the 2ⁿ flips
  counted while the seeds whose difference is not zero are at most :data:`EXACT_UP_TO` (a zero difference flips
  to itself, so leaving it out changes no p-value); beyond that, where every difference is a multiple of ½ (the
  plan's contrasts of 0/1 outcomes always are), the same exact p from the null distribution of the sum of ±|dᵢ|,
  convolved seed by seed in integer counts; else :data:`RESAMPLES` random sign flips drawn from ``seed``;
- :func:`holm`: Holm's step-down adjusted p-values of one family;
- :func:`evaluate`: one registered test (:class:`mx_proxy.experiments.plan.Test`, but ``auc``) on the samples
  of the arms it reads: McNemar's exact test on the discordant pairs, a 2 × 2's main effect or interaction by the
  sign-flip test, or Cochran's Q over all the arms.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from mx_proxy.experiments import stats

__all__ = ["EXACT_UP_TO", "RESAMPLES", "Outcome", "paired", "difference", "sign_flip", "holm", "evaluate",
           "contrast"]

EXACT_UP_TO = 20
"""The most non-zero paired differences :func:`sign_flip` enumerates all 2ⁿ sign flips of."""
RESAMPLES = 99_999
"""Random sign flips :func:`sign_flip` draws beyond :data:`EXACT_UP_TO` non-zero differences."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One test's result: ``pairs`` (seeds every arm it reads has), the effect ``estimate`` (a difference of rates,
    with ``low``/``high``, its 95 % bootstrap interval; NaN for Cochran's Q), the two-sided ``pvalue`` (NaN
    without pairs), ``statistic`` (Cochran's Q; NaN otherwise), ``only_a``/``only_b`` (McNemar's discordant
    pairs), ``exact`` (every permutation counted) and ``method``."""

    kind: str
    pairs: int
    estimate: float = math.nan
    low: float = math.nan
    high: float = math.nan
    pvalue: float = math.nan
    statistic: float = math.nan
    only_a: int | None = None
    only_b: int | None = None
    exact: bool = True
    method: str = ""


def paired(samples: dict[str, pd.Series], refs) -> pd.DataFrame:
    """The outcomes of the arms ``refs`` (keys of ``samples``) as 0/1 columns, one row per seed all of them have,
    in seed order."""
    missing = [r for r in refs if r not in samples]
    if missing:
        raise ValueError(f"no sample for arm {missing[0]!r}; arms with samples: {', '.join(samples)}")
    cols = {r: samples[r].astype(float) for r in refs}
    seeds = sorted(set.intersection(*(set(c.index) for c in cols.values())))
    return pd.DataFrame({r: c.loc[seeds].to_numpy() for r, c in cols.items()}, index=pd.Index(seeds, name="seed"))


def difference(d, seed: int = 0) -> stats.Estimate:
    """The mean of the per-seed differences ``d`` with its 95 % bootstrap interval over seeds."""
    return stats.bootstrap_mean(np.asarray(d, float), 0.95, seed=seed)


def _convolved(v: np.ndarray) -> float | None:
    """The exact two-sided sign-flip p of the differences ``v`` (none 0) where each is a multiple of ½: P(|Σ ±kᵢ| ≥
    |Σ kᵢ sᵢ|) with kᵢ = 2|vᵢ|, from the null distribution of the signed sum counted exactly (int64: up to 62
    seeds); ``None`` where some difference is no multiple of ½ or there are more seeds."""
    k = 2 * np.abs(v)
    if len(v) > 62 or not np.allclose(k, np.round(k)):
        return None
    counts = np.ones(1, np.int64)
    for ki in np.round(k).astype(int):
        step = np.zeros(2 * ki + 1, np.int64)
        step[0] = step[-1] = 1
        counts = np.convolve(counts, step)
    total = int(np.round(2 * v.sum()))
    centre = (len(counts) - 1) // 2  # counts[centre + s] = flips whose signed sum is s
    s = np.arange(len(counts)) - centre
    return float(counts[np.abs(s) >= abs(total)].sum() / 2.0 ** len(v))


def sign_flip(d, seed: int = 0, exact_up_to: int = EXACT_UP_TO) -> tuple[float, bool]:
    """``(p, exact)``: the two-sided sign-flip permutation test that the paired differences ``d`` have mean 0 (each
    seed's sign flipped at random under the null), ``scipy.stats.permutation_test`` with one sample and
    ``permutation_type="samples"`` up to ``exact_up_to`` non-zero differences, the exact convolution beyond (see
    the module). 1.0 where every difference is 0."""
    from scipy import stats as st

    v = np.asarray(d, float)
    if v.ndim != 1 or not np.isfinite(v).all():
        raise ValueError(f"sign_flip needs a 1-D sequence of finite differences, got {v!r}")
    v = v[v != 0]
    if not len(v):
        return 1.0, True
    exact = len(v) <= exact_up_to
    if not exact and (p := _convolved(v)) is not None:
        return min(1.0, p), True
    res = st.permutation_test((v,), lambda x, axis=-1: np.mean(x, axis=axis), permutation_type="samples",
                              vectorized=True, n_resamples=2 ** len(v) if exact else RESAMPLES,
                              alternative="two-sided", rng=np.random.default_rng(seed))
    return float(min(1.0, res.pvalue)), exact


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjusted p-values of one family (reject test i at level α where its adjusted p ≤ α): the
    k-th smallest p times (m − k + 1), made non-decreasing in that order and capped at 1. A NaN p (a test without
    members yet) counts as 1, so the family keeps its registered size."""
    p = np.asarray(pvalues, float)
    if p.ndim != 1:
        raise ValueError(f"holm needs a 1-D sequence of p-values, got shape {p.shape}")
    p = np.where(np.isnan(p), 1.0, p)
    if ((p < 0) | (p > 1)).any():
        raise ValueError(f"p-values must lie in [0, 1], got {p.tolist()}")
    m = len(p)
    order = np.argsort(p, kind="stable")
    adjusted = np.minimum(1.0, np.maximum.accumulate(p[order] * (m - np.arange(m))))
    out = np.empty(m)
    out[order] = adjusted
    return out


def contrast(test, table: pd.DataFrame) -> np.ndarray:
    """The per-seed difference a test's effect is the mean of, from ``table`` (:func:`paired` of its arms): a − b
    (McNemar), ½ of the two paired differences of the levels (main effect: ``cells`` = (hi: [x₁, x₂]),
    (lo: [y₁, y₂]) gives ½((x₁ − y₁) + (x₂ − y₂))), or (a₁ − a₂) − (b₁ − b₂) (interaction)."""
    col = lambda r: table[r].to_numpy()  # noqa: E731
    if test.kind == "mcnemar":
        return col(test.a) - col(test.b)
    if test.kind == "main_effect":
        (_, (x1, x2)), (_, (y1, y2)) = test.cells
        return 0.5 * ((col(x1) - col(y1)) + (col(x2) - col(y2)))
    if test.kind == "interaction":
        return (col(test.a[0]) - col(test.a[1])) - (col(test.b[0]) - col(test.b[1]))
    raise ValueError(f"a {test.kind!r} test has no per-seed contrast; valid: mcnemar, main_effect, interaction")


def evaluate(test, samples: dict[str, pd.Series], refs=None, seed: int = 0) -> Outcome:
    """``test`` (an :class:`mx_proxy.experiments.plan.Test` of kind ``mcnemar``, ``main_effect``,
    ``interaction`` or ``cochran``) on ``samples`` (arm reference → outcomes by seed); ``refs``: the arms it reads
    (default ``test.arms()``; Cochran's Q: give every arm). No common seed: an :class:`Outcome` with 0 pairs."""
    refs = tuple(test.arms() if refs is None else refs)
    if test.kind == "auc":
        raise ValueError("an 'auc' test scores signals (mx_proxy.experiments.plan_signals), not outcomes")
    table = paired(samples, refs)
    n = len(table)
    if not n:
        return Outcome(test.kind, 0, method="no pairs yet")
    if test.kind == "cochran":
        q = stats.cochran_q(table.to_numpy(dtype=bool), seed=seed)
        return Outcome("cochran", n, pvalue=q.pvalue, statistic=q.statistic, exact=q.exact,
                       method="Cochran's Q, within-seed permutations" + ("" if q.exact else f" ({stats.PERMUTATIONS}"
                                                                            " sampled)"))
    d = contrast(test, table)
    est = difference(d, seed)
    if test.kind == "mcnemar":
        mc = stats.mcnemar(table[test.a].to_numpy(bool), table[test.b].to_numpy(bool))
        return Outcome("mcnemar", n, est.value, est.low, est.high, mc.pvalue, only_a=mc.only_a, only_b=mc.only_b,
                       method="McNemar exact (binomial on the discordant pairs)")
    p, exact = sign_flip(d, seed)
    return Outcome(test.kind, n, est.value, est.low, est.high, p, exact=exact,
                   method="sign-flip permutation" + (" (exact)" if exact else f" ({RESAMPLES} sampled flips)"))
