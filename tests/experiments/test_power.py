"""The power of McNemar's exact test against an independent computation: every outcome of a few pairs
enumerated, each judged by :func:`mx_proxy.experiments.stats.mcnemar` itself, weighted by its multinomial
probability (exact fractions)."""

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from mx_proxy.experiments import power, stats


def _enumerated_power(p_a, p_b, pairs, alpha=0.05, both=None):
    """Σ over the counts (only A, only B, both, neither) of ``pairs`` pairs of the multinomial probability of
    those counts, where ``stats.mcnemar`` on outcome arrays with those counts rejects at ``alpha``."""
    p_a, p_b = Fraction(p_a), Fraction(p_b)
    both = p_a * p_b if both is None else Fraction(both)
    cells = (p_a - both, p_b - both, both, 1 - p_a - p_b + both)
    total = Fraction(0)
    for x in range(pairs + 1):
        for y in range(pairs + 1 - x):
            for z in range(pairs + 1 - x - y):
                w = pairs - x - y - z
                a = [True] * x + [False] * y + [True] * z + [False] * w
                b = [False] * x + [True] * y + [True] * z + [False] * w
                if stats.mcnemar(a, b).pvalue <= alpha:
                    ways = math.factorial(pairs) // (math.factorial(x) * math.factorial(y) * math.factorial(z)
                                                     * math.factorial(w))
                    total += ways * cells[0] ** x * cells[1] ** y * cells[2] ** z * cells[3] ** w
    return float(total)


@pytest.mark.parametrize("p_a,p_b,pairs,both", [(0.125, 0.375, 8, None), (0.0, 1.0, 6, None), (0.0, 1.0, 5, None),
                                                (0.5, 0.5, 9, None), (0.1, 0.7, 10, 0.1), (0.3, 0.6, 7, 0.05)])
def test_power_equals_the_enumerated_test(p_a, p_b, pairs, both):
    assert power.mcnemar_power(p_a, p_b, pairs, both=both) == pytest.approx(
        _enumerated_power(p_a, p_b, pairs, both=both), abs=1e-12)


@settings(max_examples=25, deadline=None)
@given(hs.integers(0, 16), hs.integers(0, 16), hs.integers(1, 7), hs.sampled_from([0.05, 0.1, 0.3]))
def test_power_equals_the_enumerated_test_anywhere(a, b, pairs, alpha):
    p_a, p_b = a / 16, b / 16
    assert power.mcnemar_power(p_a, p_b, pairs, alpha) == pytest.approx(
        _enumerated_power(p_a, p_b, pairs, alpha), abs=1e-12)


def test_all_of_one_kind_needs_six_discordant_pairs_at_five_percent():
    """2 · ½⁵ = 0.0625 > 0.05 ≥ 2 · ½⁶: arms that always differ are told apart from 6 pairs on, never at 5."""
    assert power.mcnemar_power(0.0, 1.0, 5) == 0.0 and power.mcnemar_power(0.0, 1.0, 6) == 1.0
    assert power.pairs_needed(0.0, 1.0) == 6
    assert power.pairs_needed(0.3, 0.3) is None and power.mcnemar_power(0.3, 0.3, 10, both=0.3) == 0.0


@pytest.mark.parametrize("p_a,p_b", [(0.125, 0.375), (0.375, 0.125), (0.0, 0.5), (0.2, 0.9)])
def test_pairs_needed_is_the_first_count_with_the_power(p_a, p_b):
    n = power.pairs_needed(p_a, p_b, 0.8)
    assert n is not None and power.mcnemar_power(p_a, p_b, n) >= 0.8
    assert all(power.mcnemar_power(p_a, p_b, m) < 0.8 for m in range(1, n))


def test_pairs_needed_gives_up_past_its_limit():
    assert power.pairs_needed(0.10, 0.12, most=50) is None
    assert power.mcnemar_power(0.10, 0.12, 50) < 0.8


@pytest.mark.parametrize("p_a,pairs", [(0.125, 8), (0.125, 32), (0.5, 40), (0.0, 12)])
def test_detectable_rates_are_the_nearest_grid_rates_with_the_power(p_a, pairs):
    above, below = power.detectable(p_a, pairs)
    step = 1 / power.GRID
    for rate, nearer in ((above, -step), (below, step)):
        if math.isnan(rate):
            continue
        assert power.mcnemar_power(p_a, rate, pairs) >= 0.8
        if not math.isclose(rate + nearer, p_a, abs_tol=1e-9):
            assert power.mcnemar_power(p_a, rate + nearer, pairs) < 0.8
    if math.isnan(above):
        assert all(power.mcnemar_power(p_a, float(r), pairs) < 0.8 for r in np.linspace(p_a, 1, 50)[1:])


def test_eight_pairs_detect_only_large_differences():
    """What the committed Fig. 7 ensemble's 8 pairs could tell from its control's 1 in 8: only ≥ 0.94, and
    nothing below it (a fall to 0 gives at most 8 · ⅛ discordant pairs on average, and 6 are needed)."""
    above, below = power.detectable(0.125, 8)
    assert above == pytest.approx(0.938, abs=1e-9) and math.isnan(below)
    # docs/ensembles.md quotes these: 1 in 8 against 3 in 8
    assert power.mcnemar_power(0.125, 0.375, 8) == pytest.approx(0.014, abs=5e-4)
    assert power.pairs_needed(0.125, 0.375) == 53


@pytest.mark.parametrize("call,message", [
    (lambda: power.mcnemar_power(1.5, 0.2, 8), "p_a must be a probability in [0, 1], got 1.5"),
    (lambda: power.mcnemar_power(0.2, 0.3, 0), "pairs must be a positive integer, got 0"),
    (lambda: power.mcnemar_power(0.2, 0.3, 8, alpha=1.0), "alpha must lie strictly between 0 and 1, got 1.0"),
    (lambda: power.mcnemar_power(0.2, 0.3, 8, both=0.25), "both = 0.25 is no joint probability"),
    (lambda: power.pairs_needed(0.2, 0.3, power=1.0), "power must lie strictly between 0 and 1, got 1.0"),
    (lambda: power.detectable(0.2, 2.5), "pairs must be a positive integer, got 2.5"),
])
def test_bad_input_names_the_value(call, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        call()


def _critical_by_definition(most: int, alpha: float) -> np.ndarray:
    """The exact test's critical counts the slow way: every count of every number of discordant pairs."""
    from scipy import stats as st

    c = np.full(most + 1, -1)
    for d in range(1, most + 1):
        b = np.arange(d // 2 + 1)
        rejected = b[2 * st.binom.cdf(b, d, 0.5) <= alpha]
        if len(rejected):
            c[d] = rejected[-1]
    return c


@pytest.mark.parametrize("alpha", [0.05, 0.01, 0.1, 0.5, 0.999, 1e-6])
def test_the_critical_counts_are_the_tests_own_and_linear_to_compute(alpha):
    assert np.array_equal(power._critical(1500, alpha), _critical_by_definition(1500, alpha))


def test_pairs_are_bounded_and_the_largest_count_returns_in_seconds():
    """Was: any number of pairs, quadratic in it (10**6 pairs did not return)."""
    import time

    for call in (lambda: power.mcnemar_power(0.1, 0.2, power.MAX_PAIRS + 1),
                 lambda: power.detectable(0.1, 10 ** 6), lambda: power.pairs_needed(0.1, 0.2, most=10 ** 6)):
        with pytest.raises(ValueError, match=r"must be an integer in \[1, 100000\].*got 1000"):
            call()
    t0 = time.perf_counter()
    assert power.mcnemar_power(0.10, 0.12, power.MAX_PAIRS) == pytest.approx(1.0)
    assert power.mcnemar_power(0.10, 0.101, power.MAX_PAIRS) < 0.8
    assert time.perf_counter() - t0 < 30
