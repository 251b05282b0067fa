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


@pytest.mark.usefixtures("sigint_raises")
def test_an_interrupt_stops_the_workers_at_the_end_of_their_segment_and_keeps_their_checkpoints(tmp_path):
    """Ctrl-C (Kernel → Interrupt) while worker processes train: the workers (which ignore SIGINT) are asked
    to stop, checkpoint where their segment ends and exit; train_all raises Interrupted saying what was kept."""
    import os
    import signal
    import threading

    from mx_proxy.runner.interrupt import Interrupted
    from mx_proxy.store import checkpoint as ckpt

    cheap = mxp.Config(width=8, depth=1, batch=16, steps=10 ** 7, diagnostics_every=0, val_every=0)
    units = parallel.plan_units([(cheap, {"recipe": ["fp32"]})], tmp_path)

    def started(unit, _):  # the worker has its task: interrupt this process a moment later
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()

    with pytest.raises(Interrupted, match=r"0 of 1 training units finished and are kept in .*; 1 stopped at the "
                                          r"end of a segment \(step \d+\), checkpointed there \(a rerun resumes\)"):
        parallel.train_all(units, tmp_path, jobs=1, progress=False, log=lambda *_: None, on_start=started)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    (part,) = tmp_path.glob(f"{cheap.hash()}.partial-*")
    assert len(ckpt.steps(part / "checkpoints")) == 1
