"""The ensemble statistics against independent computations on data made for the test."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from mx_proxy.experiments import stats


def _binom_tail_ge(k, n, p):
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k, n + 1))


def _bisect(f, lo=0.0, hi=1.0):
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return (lo + hi) / 2


def _clopper_pearson(k, n, alpha=0.05):
    """The exact interval by its definition: the p at which each binomial tail is alpha/2."""
    low = 0.0 if k == 0 else _bisect(lambda p: _binom_tail_ge(k, n, p) - alpha / 2)
    high = 1.0 if k == n else _bisect(lambda p: alpha / 2 - (1 - _binom_tail_ge(k + 1, n, p)))
    return low, high


@pytest.mark.parametrize("k,n", [(0, 8), (3, 8), (8, 8), (1, 16), (13, 40)])
def test_rate_is_clopper_pearson(k, n):
    r = stats.rate(k, n)
    low, high = _clopper_pearson(k, n)
    assert (r.k, r.n, r.p) == (k, n, k / n)
    assert r.low == pytest.approx(low, abs=1e-9) and r.high == pytest.approx(high, abs=1e-9)


@pytest.mark.parametrize("k,n,err", [(-1, 4, ValueError), (5, 4, ValueError), (0, 0, ValueError),
                                     (1.0, 4, TypeError), (True, 4, TypeError)])
def test_rate_refuses_bad_counts(k, n, err):
    with pytest.raises(err, match="rate needs"):
        stats.rate(k, n)


def _kaplan_meier(times, events, z=1.959963984540054):
    """Product-limit estimate with Greenwood's variance and the log-log band, written out."""
    times, events = np.asarray(times, float), np.asarray(events, bool)
    rows, s, g = [(0.0, 1.0, 1.0, 1.0)], 1.0, 0.0
    for t in np.unique(times):
        at_risk = np.sum(times >= t)
        d = np.sum((times == t) & events)
        if d:
            s *= 1 - d / at_risk
            g += d / (at_risk * (at_risk - d)) if at_risk > d else math.inf
        if s > 0 and math.isfinite(g) and g > 0:
            half = z * math.sqrt(g) / abs(math.log(s))
            lo, hi = s ** math.exp(half), s ** math.exp(-half)
        elif s == 1:
            lo = hi = 1.0
        else:
            lo, hi = 0.0, 1.0
        rows.append((float(t), s, lo, hi))
    return rows


def test_survival_is_kaplan_meier_with_loglog_band():
    times = [30, 50, 50, 80, 100, 100, 100, 20]
    events = [True, True, False, True, False, False, False, True]
    df = stats.survival(times, events)
    ref = _kaplan_meier(times, events)
    assert df["t"].tolist() == [r[0] for r in ref]
    np.testing.assert_allclose(df["survival"], [r[1] for r in ref], rtol=1e-12)
    np.testing.assert_allclose(df["low"], [r[2] for r in ref], rtol=1e-9)
    np.testing.assert_allclose(df["high"], [r[3] for r in ref], rtol=1e-9)


def test_survival_without_events_is_one_to_the_horizon():
    df = stats.survival([100, 100, 100], [False] * 3)
    assert df["t"].tolist() == [0.0, 100.0] and (df[["survival", "low", "high"]] == 1.0).all().all()


@settings(max_examples=30, deadline=None)
@given(hs.lists(hs.tuples(hs.integers(1, 50), hs.booleans()), min_size=1, max_size=20))
def test_survival_property_monotone_and_matches_product_limit(members):
    times, events = zip(*members)
    df = stats.survival(times, events)
    assert (np.diff(df["survival"]) <= 1e-15).all()
    assert ((df["low"] <= df["survival"] + 1e-12) & (df["survival"] <= df["high"] + 1e-12)).all()
    if any(events):
        ref = _kaplan_meier(times, events)
        np.testing.assert_allclose(df["survival"], [r[1] for r in ref], atol=1e-12)
        np.testing.assert_allclose(df[["low", "high"]], [r[2:] for r in ref], rtol=1e-9, atol=1e-12)


def _mcnemar_exact(b, c):
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(0, min(b, c) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


@pytest.mark.parametrize("a,b", [
    ([1, 1, 1, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0]),
    ([1, 0, 1, 0, 1, 1, 0, 0], [1, 1, 0, 0, 1, 0, 0, 1]),
    ([0, 0, 0, 0], [0, 0, 0, 0]),
    ([1] * 10 + [0] * 6, [0] * 2 + [1] * 8 + [0] * 6),
])
def test_mcnemar_is_the_exact_binomial_on_discordant_pairs(a, b):
    res = stats.mcnemar(a, b)
    a, b = np.array(a, bool), np.array(b, bool)
    only_a, only_b = int((a & ~b).sum()), int((~a & b).sum())
    assert (res.only_a, res.only_b, res.both, res.neither) == (only_a, only_b, int((a & b).sum()),
                                                                int((~a & ~b).sum()))
    assert res.pvalue == pytest.approx(_mcnemar_exact(only_a, only_b), rel=1e-12)


@given(hs.lists(hs.tuples(hs.sampled_from([0.5, 1.0, 2.0, math.inf]), hs.sampled_from([0.5, 1.0, 2.0, math.inf])),
                min_size=1, max_size=14))
def test_sign_test_counts_the_pairs_and_is_the_two_sided_binomial_on_the_untied(pairs):
    a, b = (np.array(x, float) for x in zip(*pairs, strict=True))
    res = stats.sign_test(a, b)
    lower, higher = sum(x < y for x, y in pairs), sum(x > y for x, y in pairs)
    assert (res.lower, res.higher, res.ties) == (lower, higher, len(pairs) - lower - higher)
    n = lower + higher
    tail = sum(math.comb(n, i) for i in range(0, min(lower, higher) + 1)) / 2 ** n if n else 0.5
    assert res.pvalue == pytest.approx(min(1.0, 2 * tail), rel=1e-9)


def test_sign_test_refuses_nan_and_unequal_samples():
    with pytest.raises(ValueError, match="without NaN"):
        stats.sign_test([1.0, math.nan], [1.0, 2.0])
    with pytest.raises(ValueError, match=r"shapes \(2,\) and \(3,\)"):
        stats.sign_test([1.0, 2.0], [1.0, 2.0, 3.0])


def _cochran_q_deviations(x):
    """Cochran's Q in its other textbook form: k(k−1)·Σ_j (C_j − C̄)² / Σ_i R_i (k − R_i)."""
    x = np.asarray(x, float)
    k = x.shape[1]
    col, row = x.sum(axis=0), x.sum(axis=1)
    return k * (k - 1) * float(np.sum((col - col.mean()) ** 2)) / float(np.sum(row * (k - row)))


def _cochran_exact_p(x):
    """P(Q ≥ the observed Q) over every within-member permutation of the arms' outcomes, enumerated."""
    x = np.asarray(x, float)
    observed = _cochran_q_deviations(x)
    orders = list(itertools.permutations(range(x.shape[1])))
    hits = total = 0
    for choice in itertools.product(orders, repeat=len(x)):
        y = np.array([row[list(o)] for row, o in zip(x, choice, strict=True)])
        hits += _cochran_q_deviations(y) >= observed - 1e-9
        total += 1
    return hits / total


@pytest.mark.parametrize("table", [
    [[1, 0, 0], [1, 1, 0], [1, 0, 0], [0, 0, 1]],
    [[1, 0, 0], [1, 0, 0], [1, 1, 0], [1, 0, 1]],
    [[0, 1, 1, 0], [0, 1, 0, 0]],  # 4 arms: 24² permutations, still all counted
])
def test_cochran_q_is_the_textbook_statistic_with_its_exact_permutation_p(table):
    res = stats.cochran_q(table)
    assert res.exact and (res.members, res.arms) == np.shape(table)
    assert res.statistic == pytest.approx(_cochran_q_deviations(table), rel=1e-12)
    assert res.pvalue == pytest.approx(_cochran_exact_p(table), rel=1e-12)


@pytest.mark.parametrize("a,b", [([1, 1, 1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 1]),
                                 ([1, 0, 1, 0, 1, 1, 0, 0], [1, 1, 0, 0, 1, 0, 0, 1])])
def test_cochran_q_of_two_arms_is_mcnemars_test(a, b):
    q = stats.cochran_q(np.column_stack([a, b]).astype(bool))
    mc = stats.mcnemar(a, b)
    assert q.statistic == pytest.approx((mc.only_a - mc.only_b) ** 2 / (mc.only_a + mc.only_b))
    assert q.pvalue == pytest.approx(mc.pvalue, rel=1e-12)


def test_cochran_q_without_discordant_members_and_bad_tables():
    assert stats.cochran_q([[1, 1, 1], [0, 0, 0]]) == stats.CochranQ(0.0, 1.0, 2, 3, True)
    assert stats.cochran_q([[0, 1, 1]]) == stats.CochranQ(pytest.approx(_cochran_q_deviations([[0, 1, 1]])), 1.0, 1,
                                                          3, True)  # one member: Q = k − 1, and no other order
    big = stats.cochran_q(np.random.default_rng(1).random((8, 5)) < 0.3)
    assert not big.exact and 0 < big.pvalue <= 1 and big == stats.cochran_q(
        np.random.default_rng(1).random((8, 5)) < 0.3)  # a random sample of permutations, fixed by the seed
    with pytest.raises(ValueError, match="at least 1 member and 2 arms, got shape \\(3, 1\\)"):
        stats.cochran_q([[1], [0], [1]])
    with pytest.raises(ValueError, match="binary outcomes"):
        stats.cochran_q([[0, 2], [1, 0]])


def _logrank_z(ta, ea, tb, eb):
    """(O_a - E_a) / sqrt(V) summed over the distinct event times, written out."""
    ta, ea, tb, eb = map(np.asarray, (ta, ea, tb, eb))
    t_all = np.concatenate([ta, tb])
    e_all = np.concatenate([ea, eb]).astype(bool)
    o_minus_e, var = 0.0, 0.0
    for t in np.unique(t_all[e_all]):
        n_a, n = np.sum(ta >= t), np.sum(t_all >= t)
        d_a, d = np.sum((ta == t) & ea.astype(bool)), np.sum((t_all == t) & e_all)
        o_minus_e += d_a - d * n_a / n
        if n > 1:
            var += d * (n_a / n) * (1 - n_a / n) * (n - d) / (n - 1)
    return o_minus_e / math.sqrt(var)


def test_logrank_against_the_written_out_statistic():
    ta, ea = [10, 20, 20, 35, 60, 100, 100], [1, 1, 1, 1, 0, 0, 0]
    tb, eb = [40, 70, 100, 100, 100, 100, 100], [1, 1, 0, 0, 0, 0, 0]
    z = _logrank_z(ta, ea, tb, eb)
    res = stats.logrank(ta, ea, tb, eb)
    assert res.statistic == pytest.approx(z, rel=1e-9)
    assert res.pvalue == pytest.approx(math.erfc(abs(z) / math.sqrt(2)), rel=1e-9)


def test_logrank_without_events_is_nan():
    res = stats.logrank([5, 5], [0, 0], [5, 5], [0, 0])
    assert math.isnan(res.statistic) and math.isnan(res.pvalue)


def test_bootstrap_mean_is_reproducible_and_close_to_the_t_interval():
    rng = np.random.default_rng(7)
    x = rng.normal(2.0, 1.0, size=200)
    a, b = stats.bootstrap_mean(x, seed=3), stats.bootstrap_mean(x, seed=3)
    assert a == b and a.n == 200 and a.value == pytest.approx(x.mean())
    half = 1.959963984540054 * x.std(ddof=1) / math.sqrt(len(x))
    assert a.low == pytest.approx(x.mean() - half, abs=0.05 * half * 2)
    assert a.high == pytest.approx(x.mean() + half, abs=0.05 * half * 2)


def test_bootstrap_mean_degenerate_samples():
    assert math.isnan(stats.bootstrap_mean([]).value)
    one = stats.bootstrap_mean([0.5, np.nan])
    assert one.value == 0.5 and one.n == 1 and math.isnan(one.low)
    same = stats.bootstrap_mean([0.25] * 5)
    assert (same.value, same.low, same.high) == (0.25, 0.25, 0.25)


@settings(max_examples=40, deadline=None)
@given(hs.lists(hs.tuples(hs.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0]), hs.booleans()), min_size=2, max_size=25))
def test_auc_is_the_pairwise_win_rate(pairs):
    s, y = map(np.array, zip(*pairs))
    pos, neg = s[y], s[~y]
    got = stats.auc(s, y)
    if not len(pos) or not len(neg):
        assert math.isnan(got)
        return
    wins = sum((p > q) + 0.5 * (p == q) for p in pos for q in neg)
    assert got == pytest.approx(wins / (len(pos) * len(neg)), rel=1e-12)
