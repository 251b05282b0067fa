"""The lean ensemble mode (mx_proxy.experiments.lean): what it changes in a spec, and that on a CPU its members'
losses are today's members' bit for bit, in groups of any size."""

import jax
import numpy as np
import pytest

import mx_proxy as mxp
from mx_proxy.experiments import ensemble as E
from mx_proxy.experiments import lean as L
from mx_proxy.experiments import plan as P
from mx_proxy.experiments import plan_queue
from mx_proxy.experiments.ensemble_result import load
from mx_proxy.runner.members import init_state
from mx_proxy.runner.programs import stack
from mx_proxy.training.engine import dynamic_for, program_for

BASE = mxp.Config(width=16, depth=1, batch=32, steps=20, lr=3e-3, diagnostics_every=5, val_every=0)


def test_lean_spec_records_diagnostics_only_where_signals_are_scored():
    spec = E.Ensemble("s", "seed", BASE, ("fp32", "paper_e4m3"), 2, 20, checkpoint_every=10)
    assert L.lean(spec, signals=False).diagnostics == 0
    assert L.lean(spec, signals=True, period=10).diagnostics == 10
    assert L.lean(spec, signals=False).arms == spec.arms
    plan = P.load()
    assert L.scored(plan, "h1") and not L.scored(plan, "h2") and not L.scored(plan, "h4-gpu")
    assert L.study_spec(plan, plan.study("h1")).diagnostics == 50  # H3's signals: every 50 steps, as registered
    assert L.study_spec(plan, plan.study("h2")).diagnostics == 0
    assert plan_queue.spec_of(plan, plan.study("h2")) == plan.study("h2").ensemble_spec


def test_a_lean_branch_ensemble_drops_its_twin_unless_asked():
    parent = BASE.replace(recipe="paper_e4m3", paired_run=True)
    spec = E.Ensemble("b", "branch", parent, ("unchanged", "twin", "fp32"), 1, 10, branch_at=10, checkpoint_every=10)
    assert L.lean(spec, signals=False).arms == ("unchanged", "fp32")
    kept = L.lean(spec, signals=False, twin=True, period=5)
    assert kept.arms == spec.arms and kept.diagnostics == 5  # the twin's ζ needs diagnostic steps


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the bits of a CPU's programs")
def test_lean_members_have_todays_losses_bit_for_bit(tmp_path):
    spec = E.Ensemble("s", "seed", BASE, ("fp32", "paper_e4m3"), 2, 20, checkpoint_every=10)
    E.run(spec, tmp_path / "today", group_size=1, progress=False, log=lambda *_: None)
    E.run(L.lean(spec, signals=False), tmp_path / "lean", group_size=2, progress=False, log=lambda *_: None)
    today, lean = load(tmp_path / "today" / "results"), load(tmp_path / "lean" / "results")
    for arm in spec.arms:
        for a, b in zip(today.runs[arm], lean.runs[arm]):
            assert np.array_equal(a.metrics["loss"].to_numpy(), b.metrics["loss"].to_numpy())
            assert len(b.metrics) == 20 and a.diverged_at == b.diverged_at
            assert a.metrics["zeta_bound"].notna().sum() == 4 and "zeta_bound" not in b.metrics  # 0, 5, 10, 15


def test_the_diagnostics_stay_a_conditional_under_a_sweeps_vmap():
    """The plain steps of vmapped members skip the diagnostics: the step, the cond's predicate, is not batched."""
    configs = [BASE.replace(seed=s, data_seed=s) for s in range(2)]
    states = [init_state(c) for c in configs]
    program, teacher = program_for(BASE), states[0][1]
    jaxpr = jax.make_jaxpr(lambda s, t, d: jax.vmap(lambda si, di: program._step(si, t, di, teacher))(s, d))(
        stack([s for s, _ in states]), np.int32(0), stack([dynamic_for(c) for c in configs]))
    assert str(jaxpr).count("cond[") == 1
