"""``mx-proxy figures``'s parallel training: the runs of several figures are planned
without training, every member once; worker processes train them into the
store, and what they store is what this process trains, bit for bit."""

import numpy as np
import pytest

import mx_proxy as mxp
from mx_proxy.experiments import paper, parallel
from mx_proxy.training.sweeps import members
from mx_proxy.viz.figures import TRAINED, default_dir, generate


def test_experiments_plan_without_training_and_interventions_do_not():
    plan = paper.planned_sweeps(paper.mitigation_runs, "smoke")
    assert [axes["recipe"] for _, axes in plan] == [list(paper.MITIGATION_RECIPES)]
    assert paper.planned_sweeps(paper.intervention_runs, "smoke") is None  # children need a trained parent
    assert paper._plan is None  # planning left no state behind


def test_units_train_every_member_once_and_skip_the_stored(tmp_path):
    sweeps = []
    for name in ("gradient_bias", "ln_clamping", "mitigations"):
        sweeps += paper.planned_sweeps(TRAINED[name][1], "smoke")
    units = parallel.plan_units(sweeps, tmp_path)
    keys = [c.hash() for u in units for c in u.configs]
    every = [c.hash() for config, axes in sweeps for c in members(config, axes)[1]]
    assert len(every) > len(set(every))  # fp32 and mxfp8_e4m3 appear in several figures ...
    assert sorted(keys) == sorted(set(every))  # ... and are trained once
    assert [u.cost for u in units] == sorted((u.cost for u in units), reverse=True)
    lr_pair = [u for u in units if len(u.configs) == 2]  # E4M3 at two LRs: one vmapped program
    assert len(lr_pair) == 1 and lr_pair[0].product and set(lr_pair[0].axes) == {"lr"}


def test_worker_processes_store_what_this_process_trains(tmp_path):
    base = mxp.Config(width=16, depth=2, batch=32, steps=20, diagnostics_every=10, val_every=10,
                        recipe="mxfp8_e4m3")
    configs = [base, base.replace(recipe="fp32"), base.replace(lr=3e-3)]
    units = parallel.plan_units([(base, {"recipe": ["mxfp8_e4m3", "fp32"]}), (base, {"lr": [6e-4, 3e-3]})],
                                tmp_path)
    assert sum(len(u.configs) for u in units) == 3
    parallel.train_all(units, tmp_path, jobs=2, progress=False, log=lambda *_: None)
    for c in configs:
        stored, here = mxp.train(c, store=tmp_path), mxp.train(c, progress=False)
        assert stored.path is not None
        for col in here.metrics.columns:
            assert np.array_equal(stored.metrics[col].to_numpy(), here.metrics[col].to_numpy(), equal_nan=True), col
    assert parallel.plan_units([(base, {"recipe": ["mxfp8_e4m3", "fp32"]})], tmp_path) == []


def test_figures_default_outside_the_checkout_and_refuse_bad_jobs(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_dir("figures") == tmp_path / "proxy" / "figures"
    with pytest.raises(ValueError, match=r"jobs must be an integer in \[1, 64\] or None \(one per core\), got 0"):
        generate(["sawtooth"], jobs=0)
    assert generate(["sawtooth"], log=lambda *_: None) == [str(tmp_path / "proxy" / "figures" / "sawtooth.png")]
