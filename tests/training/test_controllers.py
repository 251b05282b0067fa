"""GNMR stability controller: exact triggers on synthetic norm traces, budget,
locks, NaN handling, vmap/scan agreement, units and events."""

import functools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mx_proxy.training import controllers as C
from mx_proxy.training.controllers import GNMR

T, U = 100, 4


# -- harness -------------------------------------------------------------------
@functools.partial(jax.jit, static_argnums=0)
def _scan(ctrl, norms):
    def body(state, g):
        mask = C.promoted(state)
        state, info = C.update(ctrl, state, g)
        return state, (mask, info)

    final, (mask, info) = jax.lax.scan(body, C.init(ctrl, norms.shape[1]), norms)
    return final, mask, info


_update = jax.jit(C.update, static_argnums=0)


def _loop(ctrl, norms):
    state, masks, infos = C.init(ctrl, norms.shape[1]), [], []
    for g in norms:
        masks.append(np.asarray(C.promoted(state)))
        state, info = _update(ctrl, state, jnp.asarray(g))
        infos.append(jax.tree.map(np.asarray, info))
    return state, np.stack(masks), {k: np.stack([i[k] for i in infos]) for k in infos[0]}


def run(ctrl, norms):
    """(mask (T, U) in force at each step, info of (T, U) arrays, final state);
    the python loop and the jitted scan must agree exactly."""
    norms = np.asarray(norms, np.float32)
    final, mask, info = _scan(ctrl, jnp.asarray(norms))
    final_l, mask_l, info_l = _loop(ctrl, norms)
    np.testing.assert_array_equal(np.asarray(mask), mask_l)
    for k in info:
        np.testing.assert_array_equal(np.asarray(info[k]), info_l[k], err_msg=k)
    for a, b in zip(final, final_l):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    return np.asarray(mask), {k: np.asarray(v) for k, v in info.items()}, final


def flat(**spikes):
    """Ones (T, U) with ``spikes`` given as {"u{unit}_{step}": value}."""
    x = np.ones((T, U), np.float32)
    for key, v in spikes.items():
        u, t = key[1:].split("_")
        x[int(t), int(u)] = v
    return x


def promoted_steps(mask, unit):
    return np.flatnonzero(mask[:, unit]).tolist()


CTRL = GNMR(lock_steps=20)


# -- exact triggers ------------------------------------------------------------
def test_single_spike_promotes_exactly_lock_steps_then_releases():
    mask, info, final = run(CTRL, flat(u3_40=10.0))
    assert promoted_steps(mask, 3) == list(range(41, 61))
    assert not mask[:, :3].any()
    assert np.argwhere(info["triggered"]).tolist() == [[40, 3]]
    assert np.argwhere(info["released"]).tolist() == [[60, 3]]
    np.testing.assert_array_equal(info["promoted"][:-1], mask[1:])
    assert info["gnmr"][40, 3] == 10.0 and info["delta_gnmr"][40, 3] == 10.0
    assert info["gnmr"][39, 0] == 1.0 and info["delta_gnmr"][39, 0] == 1.0
    assert np.isnan(info["gnmr"][0]).all() and np.isnan(info["delta_gnmr"][: CTRL.window]).all()
    assert not np.isnan(info["delta_gnmr"][CTRL.window:]).any()
    assert int(final.count) == T and not np.asarray(C.promoted(final)).any()


def test_ramp_caught_only_by_delta_gnmr():
    x = np.ones((T, U), np.float32)
    x[50:54, 1] = 1.25 ** np.arange(1, 5)      # 1.25 … 2.44, then a plateau
    x[54:, 1] = 1.25 ** 4
    mask, info, _ = run(CTRL, x)
    assert np.argwhere(info["triggered"]).tolist() == [[53, 1]]
    assert np.nanmax(info["gnmr"]) < CTRL.threshold                 # gnmr never fires …
    assert info["delta_gnmr"][53, 1] > CTRL.delta_threshold         # … Δ-GNMR does
    assert promoted_steps(mask, 1) == list(range(54, 74))
    off, info_off, _ = run(dataclass_replace(CTRL, delta_threshold=None), x)
    assert not off.any() and not info_off["triggered"].any()
    np.testing.assert_array_equal(info_off["delta_gnmr"], info["delta_gnmr"])  # still reported


def dataclass_replace(ctrl, **kw):
    return GNMR(**{**ctrl.to_dict(), **kw})


def test_gnmr_alone_catches_a_level_jump():
    x = flat(u0_30=4.0)      # gnmr 4 > 3 with Δ off
    mask, info, _ = run(dataclass_replace(CTRL, delta_threshold=None), x)
    assert np.argwhere(info["triggered"]).tolist() == [[30, 0]]


def test_warmup():
    ctrl = dataclass_replace(CTRL, warmup=20)
    mask, info, _ = run(ctrl, flat(u0_19=50.0, u1_20=50.0, u2_5=float("nan")))
    assert np.argwhere(info["triggered"]).tolist() == [[20, 1]]
    assert promoted_steps(mask, 1) == list(range(21, 41)) and not mask[:, [0, 2, 3]].any()


@pytest.mark.parametrize("budget, winners", [(1, [2]), (2, [2, 3]), (3, [0, 2, 3])])
def test_budget_keeps_highest_ratios(budget, winners):
    mask, info, _ = run(dataclass_replace(CTRL, max_overrides=budget), flat(u0_40=5.0, u2_40=8.0, u3_40=6.0))
    assert np.flatnonzero(info["triggered"][40]).tolist() == winners
    assert info["triggered"].sum() == len(winners)
    for u in range(U):
        assert promoted_steps(mask, u) == (list(range(41, 61)) if u in winners else [])


def test_budget_ties_go_to_lowest_index_and_nan_ranks_first():
    _, info, _ = run(CTRL, flat(u1_40=5.0, u2_40=5.0, u3_40=5.0))
    assert np.flatnonzero(info["triggered"][40]).tolist() == [1]
    _, info, _ = run(CTRL, flat(u0_40=1e6, u3_40=float("nan")))
    assert np.flatnonzero(info["triggered"][40]).tolist() == [3]


def test_budget_full_drops_triggers_and_releases_free_slots_at_once():
    mask, info, _ = run(CTRL, flat(u0_30=10.0, u1_40=10.0, u2_50=10.0))
    # unit 0 holds the only slot over steps 31..50; unit 1's spike is dropped;
    # unit 0 is released by update 50, whose slot unit 2 takes at that update.
    assert np.argwhere(info["triggered"]).tolist() == [[30, 0], [50, 2]]
    assert promoted_steps(mask, 0) == list(range(31, 51))
    assert promoted_steps(mask, 1) == []
    assert promoted_steps(mask, 2) == list(range(51, 71))
    assert mask.sum(axis=1).max() == 1


def test_lock_neither_extends_nor_retriggers():
    mask, info, _ = run(CTRL, flat(u0_40=10.0, u0_45=10.0, u0_60=10.0))
    # 45 is inside the lock; 60 is the release update (norm from a promoted step)
    assert np.argwhere(info["triggered"]).tolist() == [[40, 0]]
    assert promoted_steps(mask, 0) == list(range(41, 61))
    mask, info, _ = run(CTRL, flat(u0_40=10.0, u0_61=10.0))
    assert np.argwhere(info["triggered"]).tolist() == [[40, 0], [61, 0]]
    assert promoted_steps(mask, 0) == list(range(41, 61)) + list(range(62, 82))
    assert np.argwhere(info["released"]).tolist() == [[60, 0], [81, 0]]


def test_lock_of_one_step():
    mask, info, _ = run(dataclass_replace(CTRL, lock_steps=1), flat(u2_40=10.0, u2_41=10.0, u2_42=10.0))
    assert np.argwhere(info["triggered"]).tolist() == [[40, 2], [42, 2]]
    assert promoted_steps(mask, 2) == [41, 43]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_norm_triggers_and_does_not_poison_statistics(bad):
    mask, info, final = run(CTRL, flat(u1_40=bad))
    assert np.argwhere(info["triggered"]).tolist() == [[40, 1]]
    assert promoted_steps(mask, 1) == list(range(41, 61))
    assert np.all(info["gnmr"][41:, 1] == 1.0) and np.all(info["delta_gnmr"][41:, 1] == 1.0)
    assert int(final.n[1]) == T - 1 and float(final.total[1]) == T - 1
    assert int(final.n[0]) == T


def test_all_non_finite_window_gives_nan_delta_and_zero_norm_unit_never_fires():
    x = flat()
    x[30:40, 0] = np.nan
    x[:, 3] = 0.0
    _, info, _ = run(CTRL, x)
    assert np.isnan(info["delta_gnmr"][40, 0]) and info["gnmr"][40, 0] == 1.0
    assert np.isnan(info["gnmr"][:, 3]).all() and not info["triggered"][:, 3].any()


def test_vmap_over_members_equals_separate_runs():
    a, b = flat(u3_40=10.0), flat(u0_25=7.0, u1_25=9.0, u2_70=float("nan"))
    final, mask, info = jax.vmap(_scan, in_axes=(None, 0))(CTRL, jnp.stack([a, b]))
    for m, x in enumerate((a, b)):
        f1, m1, i1 = _scan(CTRL, jnp.asarray(x))
        np.testing.assert_array_equal(mask[m], m1)
        for k in i1:
            np.testing.assert_array_equal(info[k][m], i1[k])
        for p, q in zip(final, f1):
            np.testing.assert_array_equal(p[m], q)
    assert not np.array_equal(mask[0], mask[1])


# -- property ------------------------------------------------------------------
PROP_CTRLS = [GNMR(threshold=2.0, delta_threshold=1.5, window=3, warmup=5, max_overrides=1, lock_steps=4),
              GNMR(threshold=4.0, delta_threshold=None, window=2, warmup=2, max_overrides=2, lock_steps=7),
              GNMR(threshold=1.5, delta_threshold=3.0, window=4, warmup=8, max_overrides=3, lock_steps=1)]
PT, PU = 60, 5


@settings(max_examples=40, deadline=None)
@given(ctrl=st.sampled_from(PROP_CTRLS),
       x=hnp.arrays(np.float32, (PT, PU),
                    elements=st.sampled_from([1.0, 0.9, 1.2, 0.0, 3.0, 10.0, 100.0, np.nan, np.inf])))
def test_budget_and_lock_invariants(ctrl, x):
    final, mask, info = _scan(ctrl, jnp.asarray(x))
    mask = np.concatenate([np.asarray(mask), np.asarray(C.promoted(final))[None]])   # steps 0..PT
    info = {k: np.asarray(v) for k, v in info.items()}
    assert mask.sum(axis=1).max() <= ctrl.max_overrides
    np.testing.assert_array_equal(info["promoted"], mask[1:])
    for u in range(PU):
        col = np.concatenate([[0], mask[:, u].astype(int), [0]])
        starts, ends = np.flatnonzero(np.diff(col) == 1), np.flatnonzero(np.diff(col) == -1)
        for s, e in zip(starts, ends):
            assert e - s == ctrl.lock_steps or e == len(mask)   # only the trace end cuts a lock
            assert info["triggered"][s - 1, u]
        assert info["triggered"][:, u].sum() == len(starts)
    fires = ~np.isfinite(x) | (info["gnmr"] > ctrl.threshold)
    if ctrl.delta_threshold is not None:
        fires |= info["delta_gnmr"] > ctrl.delta_threshold
    cand = fires & ~mask[:-1] & (np.arange(PT) >= ctrl.warmup)[:, None]
    assert not (info["triggered"] & ~cand).any()
    score = np.where(np.isfinite(x), np.fmax(np.nan_to_num(info["gnmr"], nan=-np.inf),
                                             np.nan_to_num(info["delta_gnmr"], nan=-np.inf)), np.inf)
    for t in np.flatnonzero((cand & ~info["triggered"]).any(axis=1)):
        assert mask[t + 1].sum() == ctrl.max_overrides     # dropped only when the budget is full
        won = info["triggered"][t]
        if won.any():
            assert score[t][cand[t] & ~won].max() <= score[t][won].min()


# -- units ---------------------------------------------------------------------
def test_unit_names():
    assert C.unit_names(2) == ("block_0/ln", "block_0/gemm", "block_1/ln", "block_1/gemm")
    with pytest.raises(ValueError, match="depth"):
        C.unit_names(0)


def grads_tree():
    f = lambda *v: jnp.asarray(v, jnp.float32)
    return {
        "head": {"w": f(100.0)},
        "block_10": {"fc1": f(2.0)},
        "block_2": {"alpha": f(0.0, 0.6, 0.8), "fc1": f([6.0]), "fc2": f([8.0]), "s_u": f(0.0)},
        "block_1": {"fc1": f(1.0), "fc2": f(0.0)},
        "block_0": {"ln_gain": f(3.0, 0.0), "ln_bias": f(4.0), "fc1": f([1.0, 2.0], [2.0, 0.0]),
                    "fc2": f([0.0]), "fc2_bias": f(0.0)},
    }


def test_unit_norms_exact():
    g = grads_tree()
    del g["block_10"]
    expected = [5.0, 3.0, 0.0, 1.0, 1.0, 10.0]
    np.testing.assert_array_equal(C.unit_norms(g), np.float32(expected))
    np.testing.assert_array_equal(jax.jit(C.unit_norms)(g), np.float32(expected))
    assert C.unit_norms(g).dtype == jnp.float32


def test_unit_norms_rejects_unknown_params_and_gaps():
    with pytest.raises(ValueError, match="numbered 0"):
        C.unit_norms(grads_tree())                       # block_10 leaves a gap
    with pytest.raises(ValueError, match=r"'weird'.*valid: ln_gain"):
        C.unit_norms({"block_0": {"weird": jnp.ones(2)}})
    with pytest.raises(ValueError, match="block_"):
        C.unit_norms({"head": {"w": jnp.ones(2)}})


# -- events --------------------------------------------------------------------
def test_events_from_a_recorded_mask():
    names = C.unit_names(1)
    steps = np.arange(100, 110)
    mask = np.zeros((10, 2), bool)
    mask[2:5, 1] = True
    mask[4:6, 0] = True
    mask[8:, 1] = True                                  # still promoted at the end
    gnmr = np.arange(20, dtype=float).reshape(10, 2)
    delta = -gnmr
    ev = C.events(steps, mask, gnmr, delta, names)
    assert list(ev.columns) == list(C.EVENT_COLUMNS)
    assert ev.to_dict("records") == [
        {"step": 102, "unit": "block_0/gemm", "event": "promote", "gnmr": 3.0, "delta_gnmr": -3.0},
        {"step": 104, "unit": "block_0/ln", "event": "promote", "gnmr": 6.0, "delta_gnmr": -6.0},
        {"step": 105, "unit": "block_0/gemm", "event": "release", "gnmr": 9.0, "delta_gnmr": -9.0},
        {"step": 106, "unit": "block_0/ln", "event": "release", "gnmr": 10.0, "delta_gnmr": -10.0},
        {"step": 108, "unit": "block_0/gemm", "event": "promote", "gnmr": 15.0, "delta_gnmr": -15.0},
    ]
    empty = C.events(steps, np.zeros((10, 2), bool), gnmr, delta, names)
    assert empty.empty and list(empty.columns) == list(C.EVENT_COLUMNS)
    with pytest.raises(ValueError, match="events needs"):
        C.events(steps, mask[:, :1], gnmr, delta, names)


def test_events_round_trip_with_controller():
    mask, info, _ = run(CTRL, flat(u3_40=10.0))
    ev = C.events(np.arange(T), mask, info["gnmr"], info["delta_gnmr"], C.unit_names(2))
    assert ev[["step", "unit", "event"]].values.tolist() == [[41, "block_1/gemm", "promote"],
                                                            [61, "block_1/gemm", "release"]]
    assert ev["gnmr"].iloc[0] == 10.0


# -- settings ------------------------------------------------------------------
def test_defaults_hashable_and_serializable():
    g = GNMR()
    assert (g.threshold, g.delta_threshold, g.window, g.max_overrides, g.lock_steps, g.action, g.warmup) == \
        (3.0, 2.0, 10, 1, 50, "bf16", 20)
    assert hash(GNMR(threshold=3)) == hash(g) and GNMR(threshold=3) == g
    assert isinstance(GNMR(threshold=3).threshold, float)
    c = GNMR(delta_threshold=None, action="fp32", window=5, warmup=5)
    assert GNMR.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    assert GNMR.parse(c.to_text()) == c and GNMR.parse(g.to_text()) == g


def test_parse():
    assert GNMR.parse("gnmr") == GNMR() == GNMR.parse("") == GNMR.parse(" GNMR: ")
    assert GNMR.parse("threshold=3,lock_steps=50,action=fp32") == GNMR(lock_steps=50, action="fp32")
    assert GNMR.parse("gnmr:delta_threshold=none, window=4,warmup=4") == \
        GNMR(delta_threshold=None, window=4, warmup=4)


@pytest.mark.parametrize("text, match", [
    ("thresh=3", r"unknown GNMR field 'thresh'.*valid: threshold, delta_threshold, window, max_overrides, "
                 r"lock_steps, action, warmup"),
    ("foo:threshold=3", r"unknown controller 'foo'.*valid: gnmr"),
    ("threshold", r"expected key=value"),
    ("window=2.5", r"window must be an integer"),
    ("threshold=big", r"threshold must be a number"),
    ("action=fp8", r"unknown action 'fp8'; valid: bf16, fp32"),
    ("window=3,window=4", r"given twice"),
    ("threshold=0.5", r"threshold must be a finite number > 1"),
])
def test_parse_errors(text, match):
    with pytest.raises(ValueError, match=match):
        GNMR.parse(text)


@pytest.mark.parametrize("kw, match", [
    ({"threshold": 1.0}, r"threshold must be a finite number > 1, got 1\.0"),
    ({"threshold": float("inf")}, r"threshold must be a finite number > 1"),
    ({"threshold": "3"}, r"threshold must be a finite number > 1, got '3'"),
    ({"threshold": True}, r"threshold must be a finite number > 1"),
    ({"delta_threshold": 0.9}, r"delta_threshold must be a finite number > 1 or None"),
    ({"delta_threshold": float("nan")}, r"delta_threshold must be a finite number > 1 or None"),
    ({"window": 0}, r"window must be a positive integer, got 0"),
    ({"window": 2.0}, r"window must be a positive integer"),
    ({"max_overrides": 0}, r"max_overrides must be a positive integer, got 0"),
    ({"max_overrides": True}, r"max_overrides must be a positive integer"),
    ({"lock_steps": -1}, r"lock_steps must be a positive integer, got -1"),
    ({"action": "fp16"}, r"unknown action 'fp16'; valid: bf16, fp32"),
    ({"warmup": 5}, r"warmup must be an integer >= window \(10\), got 5"),
    ({"warmup": 3, "window": 4}, r"warmup must be an integer >= window \(4\), got 3"),
])
def test_bad_settings(kw, match):
    with pytest.raises(ValueError, match=match):
        GNMR(**kw)


def test_bad_from_dict_and_init():
    with pytest.raises(ValueError, match=r"unknown GNMR field\(s\) \['x'\]; valid: threshold"):
        GNMR.from_dict({"x": 1})
    with pytest.raises(ValueError, match="n_units"):
        C.init(GNMR(), 0)
    assert math.isnan(float(C.init(GNMR(window=3, warmup=3), 2).history[2, 1]))
