"""The GNMR controller inside training runs: exactness, triggers, budget, sweeps, resume, bad input."""

import os

import numpy as np
import pytest

import mx_proxy as mxp
from mx_proxy.training import controllers
from mx_proxy.training.controllers import GNMR

BASE = mxp.Config(width=32, depth=2, batch=64, steps=60, lr=1e-3, diagnostics_every=10, val_every=20,
                    recipe="mxfp8_e4m3")
# fires often on this short run: a short window and warm-up, a low threshold
EAGER = GNMR(threshold=1.3, delta_threshold=1.2, window=4, warmup=8, lock_steps=5, max_overrides=2, action="fp32")


def _same_params(a, b):
    import jax

    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.fixture(scope="module")
def plain():
    return mxp.train(BASE, store=False, progress=False)


@pytest.fixture(scope="module")
def eager():
    return mxp.train(BASE.replace(controller=EAGER), store=False, progress=False)


def test_controller_without_triggers_equals_the_run_without_it(plain):
    quiet = GNMR(threshold=1e30, delta_threshold=None)
    run = mxp.train(BASE.replace(controller=quiet), store=False, progress=False)
    assert run.events.empty and (run.metrics["low_precision_frac"] == 1.0).all()
    for col in plain.metrics.columns:
        assert np.array_equal(plain.metrics[col].to_numpy(), run.metrics[col].to_numpy(), equal_nan=True), col
    assert _same_params(plain.params, run.params)


def test_triggers_switch_precision_from_the_next_step(plain, eager):
    ev = eager.events
    assert len(ev) and set(ev["event"]) <= {"promote", "release"}
    first = int(ev["step"].min())
    loss_a, loss_b = plain.metrics["loss"].to_numpy(), eager.metrics["loss"].to_numpy()
    # identical up to the step that fired; the promoted step computes differently
    assert np.array_equal(loss_a[:first], loss_b[:first])
    assert loss_a[first] != loss_b[first]
    assert first >= EAGER.warmup + 1


def test_events_match_the_recorded_mask_budget_and_lock(eager):
    m, ev = eager.metrics, eager.events
    names = controllers.unit_names(BASE.depth)
    mask = m[[f"promoted/{n}" for n in names]].to_numpy(bool)
    assert mask.sum(axis=1).max() <= EAGER.max_overrides
    gemm = mask[:, 1::2]
    assert np.allclose(m["low_precision_frac"], 1.0 - gemm.mean(axis=1))
    for unit, rows in ev.groupby("unit"):
        i = names.index(unit)
        steps = rows.sort_values("step")
        for _, r in steps.iterrows():
            t = int(r["step"])
            if r["event"] == "promote":
                assert mask[t, i] and (t == 0 or not mask[t - 1, i])
                # promoted for exactly lock_steps steps (unless the run ended first)
                end = min(t + EAGER.lock_steps, len(mask))
                assert mask[t:end, i].all() and (end == len(mask) or not mask[end, i])
            else:
                assert not mask[t, i] and mask[t - 1, i]


def test_vmapped_sweep_with_controller_equals_single_runs():
    cfg = BASE.replace(controller=EAGER, steps=40)
    sw = mxp.sweep(cfg, store=False, progress=False, lr=[1e-3, 2e-3])
    for c, run in zip(sw.configs, sw.runs):
        single = mxp.train(c, store=False, progress=False)
        assert single.events.equals(run.events)
        for col in ("loss", "grad_norm", "low_precision_frac"):
            assert np.array_equal(single.metrics[col].to_numpy(), run.metrics[col].to_numpy()), col


def test_resume_with_controller_state(tmp_path, eager):
    cfg = BASE.replace(controller=EAGER, checkpoint_at=(30,))
    parent = mxp.train(cfg, store=tmp_path / "a", progress=False)
    assert parent.metrics["loss"].equals(eager.metrics["loss"])
    import shutil

    from conftest import killed_run_folder

    shutil.copytree(tmp_path / "a" / parent.info["key"] / "checkpoints",
                    os.path.join(killed_run_folder(tmp_path / "b", parent.info["key"]), "checkpoints"))
    resumed = mxp.train(cfg, store=tmp_path / "b", progress=False)
    assert resumed.info.get("resumed_from") == 30
    assert resumed.metrics.equals(parent.metrics) and resumed.events.equals(parent.events)


def test_config_accepts_text_and_round_trips():
    c = mxp.Config(controller="gnmr:threshold=2.5,lock_steps=7,action=fp32")
    assert c.controller == GNMR(threshold=2.5, lock_steps=7, action="fp32")
    import json

    assert mxp.Config.from_dict(json.loads(c.to_json())) == c
    # every field is serialized, under a schema version that is part of the hash
    assert mxp.Config().to_dict()["controller"] is None and mxp.Config().to_dict()["arch"] == "resmlp"
    assert c.hash() != mxp.Config().hash()


@pytest.mark.parametrize("value, match", [
    ("gnmr:treshold=3", "treshold"),
    ("gnmr:threshold=0.5", "threshold"),
    ("gnmr:action=fp8", "fp8"),
    ("pid", "pid"),
    (3.0, "controller must be"),
])
def test_bad_controller_raises(value, match):
    with pytest.raises(ValueError, match=match):
        mxp.Config(controller=value)


def test_cli_train_with_controller_and_bad_value(tmp_path, capsys):
    from mx_proxy.cli.main import main

    rc = main(["train", "--width", "16", "--depth", "1", "--batch", "16", "--steps", "30", "--diagnostics-every", "0",
               "--val-every", "0", "--recipe", "mxfp4", "--controller", "gnmr:warmup=10,window=5,threshold=1.5",
               "--quiet", "--out", str(tmp_path)])
    assert rc == 0 and "mxfp4" in capsys.readouterr().out
    with pytest.raises(SystemExit) as err:
        main(["train", "--controller", "gnmr:lock=3", "--quiet"])
    assert err.value.code == 2 and "lock" in capsys.readouterr().err
