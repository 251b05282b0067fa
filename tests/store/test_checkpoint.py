"""Checkpoints (orbax), exact resume, in-situ interventions, the paired-run reference."""


import threading
import time

import numpy as np
import pytest

import mx_proxy as mxp
from mx_proxy.store import checkpoint as C
from mx_proxy.training.engine import dynamic_for, program_for

BASE = mxp.Config(width=32, depth=2, batch=64, steps=40, diagnostics_every=10, val_every=20,
                    recipe="mxfp8_e4m3")


def assert_same(a, b, steps=None):
    ma, mb = a.metrics, b.metrics
    if steps is not None:
        ma, mb = ma[ma["step"] < steps], mb[mb["step"] < steps]
    assert a.diverged_at == b.diverged_at
    assert list(ma.columns) == list(mb.columns) and len(ma) == len(mb)
    for c in ma.columns:
        assert np.array_equal(ma[c].to_numpy(), mb[c].to_numpy(), equal_nan=True), c


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    store = tmp_path_factory.mktemp("runs")
    return mxp.train(BASE.replace(checkpoint_at=(20,)), store=store, progress=False)


def test_checkpoint_roundtrip(tmp_path):
    prog = program_for(BASE)
    dyn = dynamic_for(BASE)
    state, _ = prog.init(dyn)
    C.save(tmp_path, 20, state)
    assert C.steps(tmp_path) == [20]
    back, metrics = C.restore(tmp_path, 20, C.template(prog, dyn))
    assert metrics is None
    import jax

    assert jax.tree.structure(back) == jax.tree.structure(state)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(back)):
        assert np.asarray(a).dtype == b.dtype and np.array_equal(np.asarray(a), b)
    with pytest.raises(ValueError, match=r"no checkpoint at step 30 .*available: \[20\]"):
        C.restore(tmp_path, 30, C.template(prog, dyn))


def test_sink_keeps_only_the_newest_checkpoints_it_is_asked_to(tmp_path):
    state, _ = program_for(BASE).init(dynamic_for(BASE))
    disk, memory = C.CheckpointSink(tmp_path, keep_last=2), C.CheckpointSink(memory={}, keep_last=2)
    for step in (10, 20, 30):
        disk.save(step, state, None)
        memory.save(step, state, None)
    assert disk.steps() == memory.steps() == [20, 30]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000000020", "step_000000030"]
    with pytest.raises(ValueError, match="keep_last must be a positive integer or None, got 0"):
        C.CheckpointSink(tmp_path, keep_last=0)


def test_resume_reproduces_uninterrupted_run(parent, tmp_path):
    plain = mxp.train(BASE, store=False, progress=False)
    assert_same(parent, plain)  # checkpointing changes nothing
    ckdir = parent.path + "/checkpoints"
    assert C.steps(ckdir) == [20]
    # simulate a kill after the checkpoint: a fresh store holding only the checkpoint
    import shutil
    key = parent.info["key"]
    from conftest import killed_run_folder

    shutil.copytree(ckdir, f"{killed_run_folder(tmp_path, key)}/checkpoints")  # a killed trainer's checkpoints
    resumed = mxp.train(parent.config, store=tmp_path, progress=False)
    assert resumed.info.get("resumed_from") == 20
    spent = C.meta(ckdir, 20)["wall_time_s"]  # the stretch before the kill counts too
    assert 0 < spent < parent.wall_time_s and resumed.wall_time_s > spent
    assert_same(resumed, parent)


def test_checkpoint_between_chunks_and_memory_checkpoints():
    cfg = BASE.replace(checkpoint_every=10, steps=30)
    run = mxp.train(cfg, store=False, progress=False)
    assert sorted(run.checkpoints) == [10, 20, 30]
    assert_same(run, mxp.train(BASE.replace(steps=30), store=False, progress=False))
    child = mxp.intervene(run, 10, store=False, progress=False)  # no-op, from memory, mid-chunk
    assert_same(child, run)


def test_noop_intervention_reproduces_parent(parent):
    child = mxp.intervene(parent, 20, progress=False)
    assert_same(child, parent)
    for k in parent.params:
        for leaf in parent.params[k]:
            assert np.array_equal(parent.params[k][leaf], child.params[k][leaf])
    assert child.info["parent"] == parent.info["key"]
    assert child.info["intervention"]["at_step"] == 20
    assert child.path is not None and child.path != parent.path
    again = mxp.intervene(parent.path, 20, progress=False)  # by folder; loaded from the store
    assert again.path == child.path


def test_intervention_to_full_precision(parent):
    child = mxp.intervene(parent, 20, apply="fp32", progress=False)
    assert child.config.recipe.name == "fp32"
    assert_same(child, parent, steps=20)  # the parent's history is kept
    after = child.metrics[child.metrics["step"] >= 20]
    assert not np.array_equal(after["loss"], parent.metrics[parent.metrics["step"] >= 20]["loss"])
    # the FP32 continuation has an exact shadow gradient
    diag = after.dropna(subset=["zeta_bound"])
    assert (diag["zeta_bound"] == 0).all() and (diag["cosine"] == 1).all()
    assert child.info["intervention"]["apply"] == ["fp32"]


def test_named_interventions():
    r = mxp.recipes.get("mxfp8_e4m3")
    got = {n: mxp.mitigate(r, n) for n in mxp.MITIGATIONS}
    assert got["fp32"].is_full_precision
    assert got["ln_exempt"].ln_precision == "fp32" and got["ln_exempt"].ln_affine is None
    assert all(getattr(got["rceil"], f).scale_rule.name == "rceil" for f in ("fwd_x", "fwd_w", "dgrad_g", "wgrad_g"))
    a = got["bf16_activations"]
    assert a.fwd_x is None and a.dgrad_g is None and a.wgrad_x is None and a.fwd_w is not None
    assert not got["forward_only"].quantizes_backward and got["forward_only"].fwd_x is not None
    assert got["act_fp32"].act_precision == "fp32"
    w = got["bf16_weights"]
    assert w.fwd_w is None and w.dgrad_w is None and w.fwd_x is not None and w.vector == "bf16"
    assert got["ln_exempt"].name == "mxfp8_e4m3+ln_exempt"
    assert got["fp32_keep_bias"] == got["fp32"]  # mxfp8_e4m3 trains its LN bias: plain fp32
    kept = mxp.mitigate("paper_e4m3", "fp32_keep_bias")  # the authors' recipe freezes it: it stays frozen
    assert kept == mxp.Recipe("paper_e4m3+fp32_keep_bias", train_ln_bias=False) and kept.is_full_precision
    assert mxp.mitigate("paper_e4m3", "fp32").train_ln_bias
    both = mxp.mitigate(r, ["ln_exempt", "act_fp32"])
    assert both.ln_precision == "fp32" and both.act_precision == "fp32"


def test_with_checkpoint_replays_the_run_to_a_step_it_did_not_save(parent):
    replayed = mxp.with_checkpoint(parent, 30, progress=False)  # from its checkpoint at 20
    assert replayed.info["replay"] == {"from_step": 20, "paired_run": False, "identical": True,
                                       "first_difference": None, "of_path": parent.path}
    assert sorted(replayed.checkpoints) == [30] and replayed.info["key"] == parent.info["key"]
    child = mxp.intervene(replayed, 30, store=False, progress=False)  # no change: the parent, bit for bit
    assert_same(child, parent)
    assert child.info["parent"] == parent.info["key"] and child.info["intervention"]["replay"]["from_step"] == 20
    early = mxp.with_checkpoint(parent, 10, progress=False)  # nothing saved before 10: from the initial state
    assert early.info["replay"]["from_step"] == 0 and early.info["replay"]["identical"]
    assert_same(mxp.intervene(early, 10, store=False, progress=False), parent)
    assert mxp.with_checkpoint(parent, 20) is parent  # it has that one
    fp32 = mxp.intervene(replayed, 30, apply="fp32", progress=False)  # stored next to the parent by default
    assert fp32.path is not None and fp32.info["parent_path"] == parent.path
    for step, match in ((45, r"step 45 is outside the run: it ran steps 0…39"),
                        (15, "multiple of diagnostics_every"), (1.5, "must be an integer step")):
        with pytest.raises(ValueError, match=match):
            mxp.with_checkpoint(parent, step, progress=False)
    with pytest.raises(ValueError, match="paired_run=True: the run had no paired FP32 run"):
        mxp.with_checkpoint(parent, 30, paired_run=True, progress=False)


def test_with_checkpoint_of_a_paired_run_keeps_or_drops_its_fp32_run():
    paired = mxp.train(BASE.replace(paired_run=True, checkpoint_at=(20,)), store=False, progress=False)
    kept = mxp.with_checkpoint(paired, 30, progress=False)
    assert kept.info["replay"]["paired_run"] and kept.info["replay"]["identical"]  # the same program: exact
    assert_same(mxp.intervene(kept, 30, store=False, progress=False), paired)
    dropped = mxp.with_checkpoint(paired, 30, paired_run=False, progress=False)
    assert dropped.info["replay"]["paired_run"] is False
    child = mxp.intervene(dropped, 30, store=False, progress=False)
    assert child.info["intervention"]["reset"] == ["paired_run"]  # its FP32 run restarts from the weights at 30
    after = child.metrics[child.metrics["step"] >= 30]
    assert len(after) == 10 and np.isfinite(after["ref_loss"]).all()


@pytest.mark.parametrize("kwargs, match", [
    (dict(at_step=60), r"at_step 60 is beyond the run .*checkpoints at: \[20\]"),
    (dict(at_step=10), r"no checkpoint at step 10; checkpoints at: \[20\]"),
    (dict(at_step=20, apply="nope"), "unknown mitigation 'nope'; valid: fp32, ln_exempt"),
    (dict(at_step=20, width=64), "cannot change mid-run.*changeable: optimizer, lr, .*recipe"),
    (dict(at_step=20, recipe="mxfp9"), "unknown recipe 'mxfp9'"),
    (dict(at_step=20, steps=20), r"steps \(20\) must exceed at_step"),
])
def test_intervention_bad_input(parent, kwargs, match):
    with pytest.raises(ValueError, match=match):
        mxp.intervene(parent, progress=False, **kwargs)


def test_checkpoint_steps_validated():
    with pytest.raises(ValueError, match="multiple of diagnostics_every"):
        BASE.replace(checkpoint_at=(15,))
    with pytest.raises(ValueError, match="positive integer steps"):
        BASE.replace(checkpoint_at=(0,))
    assert BASE.replace(checkpoint_at=[30, 10, 30]).checkpoint_at == (10, 30)


def test_paired_run_reference_matches_the_fp32_run(tmp_path):
    """gradient_reference='paired_run' trains the FP32 run alongside: its loss
    is the separate FP32 run's loss, and the paired state checkpoints and
    resumes with the rest (also inside a sweep)."""
    paired = BASE.replace(gradient_reference="paired_run", checkpoint_at=(20,))
    sw = mxp.sweep(paired, store=tmp_path, progress=False, lr=[1e-3, 3e-3])
    fp32 = [mxp.train(BASE.replace(recipe="fp32", lr=lr), store=False, progress=False) for lr in (1e-3, 3e-3)]
    for mx, ref in zip(sw.runs, fp32):
        np.testing.assert_allclose(mx.metrics["ref_loss"], ref.metrics["loss"], rtol=1e-5)
        assert mx.metrics["zeta_bound"].dropna().gt(0).all()
    run = sw.runs[1]
    state, _ = C.restore(run.path + "/checkpoints", 20, C.template(program_for(paired), dynamic_for(paired)))
    assert state.ref_params is not None
    child = mxp.intervene(run, 20, progress=False)
    assert_same(child, run)
    # turning the pairing on at an intervention starts it from the current weights
    on = mxp.intervene(sw.runs[0], 20, gradient_reference="same_point", progress=False)
    assert "ref_loss" not in on.metrics.columns or on.metrics.loc[on.metrics.step >= 20, "ref_loss"].isna().all()


def test_the_folder_of_a_failed_write_is_removed_again_when_a_late_write_brings_it_back(tmp_path):
    tmp = tmp_path / ".tmp-1@host-x-step_000000005"
    (tmp / "state").mkdir(parents=True)

    def late_write():  # what tensorstore does when it finishes a write after the save failed
        time.sleep(0.2)
        (tmp / "state" / "d").mkdir(parents=True, exist_ok=True)
        (tmp / "state" / "d" / "chunk").write_bytes(b"late")

    writer = threading.Thread(target=late_write)
    writer.start()
    C._remove_failed(tmp, quiet_s=0.5, limit_s=3.0)
    writer.join()
    assert not tmp.exists()
