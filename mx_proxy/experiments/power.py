"""How many members an ensemble needs: the power of McNemar's exact test.

An ensemble's arms are compared pair by pair (:func:`~mx_proxy.experiments.stats.mcnemar`: member ``i`` of
two arms saw the same perturbation). Before training more members, and when reading a p-value of 0.5 from
8 pairs, the question is what those pairs could have detected at all:

- :func:`mcnemar_power`: the probability that the exact test (two-sided, level ``alpha``) rejects, for arms
  whose blow-up probabilities are ``p_a`` and ``p_b`` (and ``both``: the probability that the two members of a
  pair both blow up; by default ``p_a · p_b``, outcomes independent within a pair), over ``pairs`` pairs;
- :func:`pairs_needed`: the fewest pairs with at least the wanted power;
- :func:`detectable`: the nearest rates above and below ``p_a`` that that many pairs detect with the wanted
  power.

The power is computed exactly, not simulated: the number of discordant pairs ``D`` is binomial
``(pairs, P(only A) + P(only B))``, and given ``D = d`` the count of A-only pairs is binomial
``(d, P(only A) / P(discordant))``; the test rejects where ``2 · F(min(b, d − b); d, ½) ≤ alpha``
(``scipy.stats.binomtest``'s two-sided p-value at ½). The exact test's power is not monotone in the number of
pairs (the rejection region moves in whole counts), so :func:`pairs_needed` is the first count that reaches
the power, and a count above it may fall short again by a little.
"""

from __future__ import annotations

import functools

import numpy as np

from mx_proxy.experiments.stats import _st

__all__ = ["mcnemar_power", "pairs_needed", "detectable", "MOST_PAIRS", "MAX_PAIRS", "GRID"]

MOST_PAIRS = 2000
"""The most pairs :func:`pairs_needed` tries before it answers ``None``."""

MAX_PAIRS = 100_000
"""The most pairs any function here takes: an ensemble's most members per arm
(:data:`mx_proxy.experiments.ensemble_spec.MAX_MEMBERS`); every cost is linear in the pairs, or less."""

GRID = 1000
"""Rates :func:`detectable` tries, evenly spaced over [0, 1] (its answers' resolution: 1 / GRID)."""


SPREAD = 40.0
"""Standard deviations either side of the mean count of discordant pairs that :func:`detectable` sums over:
what lies beyond weighs less than 1e-300, below a float64's resolution of any power."""


def _support(pairs: int, disc: float) -> np.ndarray:
    """The counts of discordant pairs (of ``pairs``, each with probability ``disc``) within :data:`SPREAD`
    standard deviations of the mean (all of them for a few pairs)."""
    mean, sd = pairs * disc, np.sqrt(pairs * disc * (1 - disc))
    lo, hi = max(0, int(mean - SPREAD * sd) - 1), min(pairs, int(np.ceil(mean + SPREAD * sd)) + 1)
    return np.arange(lo, hi + 1)


def _check(p_a: float, p_b: float, both: float | None, alpha: float) -> float:
    for name, p in (("p_a", p_a), ("p_b", p_b)):
        if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0 <= p <= 1:
            raise ValueError(f"{name} must be a probability in [0, 1], got {p!r}")
    if not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise ValueError(f"alpha must lie strictly between 0 and 1, got {alpha!r}")
    both = p_a * p_b if both is None else both
    if not max(0.0, p_a + p_b - 1) - 1e-12 <= both <= min(p_a, p_b) + 1e-12:
        raise ValueError(f"both = {both!r} is no joint probability for p_a = {p_a!r} and p_b = {p_b!r}: it must "
                         f"lie in [max(0, p_a + p_b - 1), min(p_a, p_b)]")
    return float(both)


def _check_pairs(pairs, name: str = "pairs") -> int:
    if isinstance(pairs, bool) or not isinstance(pairs, (int, np.integer)) or pairs < 1:
        raise ValueError(f"{name} must be a positive integer, got {pairs!r}")
    if pairs > MAX_PAIRS:
        raise ValueError(f"{name} must be an integer in [1, {MAX_PAIRS}] (an ensemble's members per arm at most), "
                         f"got {pairs!r}")
    return int(pairs)


def _check_power(power: float) -> float:
    if not isinstance(power, (int, float)) or not 0 < power < 1:
        raise ValueError(f"power must lie strictly between 0 and 1, got {power!r}")
    return float(power)


@functools.lru_cache(maxsize=16)
def _critical(most: int, alpha: float) -> np.ndarray:
    """``c[d]`` for ``d = 0 … most`` discordant pairs: the largest count ``b`` of one kind the exact test rejects
    at (with its mirror ``d − b``), −1 where it rejects none. Linear in ``most``: the binomial quantile at
    ``alpha / 2`` puts ``c[d]`` within one of it, and the test's own condition ``2 · F(b; d, ½) ≤ alpha``
    picks it among the neighbours."""
    st, d = _st(), np.arange(most + 1)
    guess = np.nan_to_num(st.binom.ppf(alpha / 2, d, 0.5), nan=0.0).astype(np.int64)
    c = np.full(most + 1, -1)
    for b in (guess - 2, guess - 1, guess, guess + 1):  # the rejected counts are 0 … c[d]: keep the largest
        ok = (b >= 0) & (b <= d // 2) & (2 * st.binom.cdf(b, d, 0.5) <= alpha)
        c = np.where(ok, np.maximum(c, b), c)
    c[0] = -1
    return c


def _rejects(only_a, only_b, most: int, alpha: float) -> np.ndarray:
    """P(reject | D = d) for d = 0 … most, one row per (only_a, only_b) pair of probabilities (broadcast)."""
    only_a, only_b = np.atleast_1d(np.asarray(only_a, float)), np.atleast_1d(np.asarray(only_b, float))
    disc = only_a + only_b
    q = np.divide(only_a, disc, out=np.full_like(disc, 0.5), where=disc > 0)[:, None]
    d = np.arange(most + 1)
    c = _critical(most, alpha)
    st = _st()
    return st.binom.cdf(c, d, q) + st.binom.sf(d - c - 1, d, q)


def _discordant(p_a: float, p_b: float, both: float | None, alpha: float) -> tuple[float, float]:
    """(P(only A blows up), P(only B blows up)) within a pair, once the arguments are checked."""
    both = _check(p_a, p_b, both, alpha)
    return max(p_a - both, 0.0), max(p_b - both, 0.0)


def _power_at(pairs: int, disc: float, rejects: np.ndarray) -> float:
    """The power over ``pairs`` pairs, each discordant with probability ``disc``, from ``rejects[d]`` =
    P(reject | d discordant pairs) (:func:`_rejects`, at least ``pairs + 1`` long)."""
    return float(_st().binom.pmf(np.arange(pairs + 1), pairs, disc) @ rejects[: pairs + 1])


def mcnemar_power(p_a: float, p_b: float, pairs: int, alpha: float = 0.05, both: float | None = None) -> float:
    """P(McNemar's exact two-sided test rejects at level ``alpha``) over ``pairs`` pairs whose arms blow up
    with probabilities ``p_a`` and ``p_b``, both members of a pair with probability ``both`` (default
    ``p_a · p_b``: independent within a pair). 0 where no pair can be discordant."""
    only_a, only_b = _discordant(p_a, p_b, both, alpha)
    pairs = _check_pairs(pairs)
    if only_a + only_b == 0:
        return 0.0
    return _power_at(pairs, only_a + only_b, _rejects(only_a, only_b, pairs, float(alpha))[0])


def pairs_needed(p_a: float, p_b: float, power: float = 0.8, alpha: float = 0.05, both: float | None = None,
                 most: int = MOST_PAIRS) -> int | None:
    """The fewest pairs whose :func:`mcnemar_power` reaches ``power``; ``None`` if ``most`` pairs do not (or
    no pair can be discordant)."""
    only_a, only_b = _discordant(p_a, p_b, both, alpha)
    power, most = _check_power(power), _check_pairs(most, "most")
    disc = only_a + only_b
    if disc == 0:
        return None
    r = _rejects(only_a, only_b, most, float(alpha))[0]
    return next((n for n in range(1, most + 1) if _power_at(n, disc, r) >= power), None)


def detectable(p_a: float, pairs: int, power: float = 0.8, alpha: float = 0.05) -> tuple[float, float]:
    """``(above, below)``: the smallest rate above ``p_a`` and the largest below it that ``pairs`` pairs detect
    with at least ``power`` (outcomes independent within a pair), on a grid of :data:`GRID` steps; NaN where
    no rate on that side is detected."""
    _check(p_a, p_a, None, alpha)
    pairs, power = _check_pairs(pairs), _check_power(power)
    st, c = _st(), _critical(pairs, float(alpha))
    p_b = np.linspace(0.0, 1.0, GRID + 1)
    ok = np.zeros(len(p_b), bool)
    for j, rate in enumerate(p_b):
        only_a, only_b = p_a * (1 - rate), rate * (1 - p_a)
        disc = only_a + only_b
        if disc == 0:
            continue
        d = _support(pairs, disc)
        q = only_a / disc
        rejects = st.binom.cdf(c[d], d, q) + st.binom.sf(d - c[d] - 1, d, q)
        ok[j] = float(st.binom.pmf(d, pairs, disc) @ rejects) >= power
    above, below = ok & (p_b > p_a), ok & (p_b < p_a)
    return (float(p_b[above][0]) if above.any() else float("nan"),
            float(p_b[below][-1]) if below.any() else float("nan"))
