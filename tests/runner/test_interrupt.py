"""Ctrl-C during training (the SIGINT Kernel → Interrupt sends): the host loop stops at the end of its segment,
what finished is kept, and one line says what; a second SIGINT stops at once; progress lines are the runs' own."""

import os
import signal

import pytest

import mx_proxy as mxp
from mx_proxy.runner import loop as runner
from mx_proxy.runner import progress
from mx_proxy.runner.interrupt import Interrupted
from mx_proxy.store import checkpoint as ckpt

pytestmark = pytest.mark.usefixtures("sigint_raises")

CHEAP = dict(width=8, depth=1, batch=16, diagnostics_every=0, val_every=0)  # the suite's cheapest program


def _interrupt_at(step):
    def on_segment(t, runs):
        if t == step:
            os.kill(os.getpid(), signal.SIGINT)
    return on_segment


def test_train_without_a_store_stops_at_the_segment_and_hands_back_what_it_trained():
    cfg = mxp.Config(steps=1000, **CHEAP)  # segments of 100 steps
    with pytest.raises(Interrupted) as err:
        mxp.train(cfg, progress=False, on_segment=_interrupt_at(200))
    assert str(err.value) == ("fp32 stopped at step 200 of 1000, not kept (no store: its metrics so far are in "
                              "Interrupted.runs)")
    (run,) = err.value.runs
    assert list(run.metrics["step"]) == list(range(200))
    assert err.value._render_traceback_() == [f"Interrupted: {err.value}"]  # IPython: one line, no traceback
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler and not runner.stop.is_set()
    assert len(mxp.train(cfg.replace(steps=100), progress=False).metrics) == 100  # nothing left asking to stop


def test_a_sweep_keeps_its_finished_groups_and_checkpoints_the_one_training(tmp_path, trained):
    cfg = mxp.Config(steps=300, **CHEAP)
    first = []

    def interrupt_after_the_first_group(config):
        if not first:
            first.append(config)
            os.kill(os.getpid(), signal.SIGINT)  # between groups: the next one does not start

    runner.hooks.append(interrupt_after_the_first_group)
    try:
        with pytest.raises(Interrupted, match=r"^1 finished run\(s\) kept \(fp32\) in .*$") as err:
            mxp.sweep(cfg, width=[8, 16], store=tmp_path, progress=False)
    finally:
        runner.hooks.remove(interrupt_after_the_first_group)
    assert [r.config.width for r in err.value.runs] == [8] and len(trained) == 1
    assert (tmp_path / cfg.hash()).is_dir()  # stored
    with pytest.raises(Interrupted, match=r"^fp32 stopped at step 100 of 300, checkpointed in .* \(a rerun resumes "
                                          r"there\)$"):
        mxp.train(cfg.replace(width=16), store=tmp_path, progress=False, on_segment=_interrupt_at(100))
    (part,) = tmp_path.glob(f"{cfg.replace(width=16).hash()}.partial-*")
    assert ckpt.steps(part / "checkpoints") == [100]
    again = mxp.sweep(cfg, width=[8, 16], store=tmp_path, progress=False)  # loads one, resumes the other
    assert [r.info.get("resumed_from") for r in again.runs] == [None, 100]


def test_a_second_interrupt_stops_at_once():
    cfg = mxp.Config(steps=1000, **CHEAP)

    def twice(t, runs):
        if t == 100:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt) as err:
        mxp.train(cfg, progress=False, on_segment=twice)
    assert not isinstance(err.value, Interrupted)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_finished_progress_line_is_the_runs_own_trained_or_loaded(tmp_path):
    cfg = mxp.Config(steps=200, **CHEAP)
    run = mxp.train(cfg, store=tmp_path, progress=False)
    loaded = mxp.train(cfg, store=tmp_path, progress=False)
    line = progress.finished_line("fp32", [run])
    assert line == progress.finished_line("fp32", [loaded])
    assert line == f"fp32: 200/200 steps [{progress.clock(run.wall_time_s)}]"
    diverged = run.__class__(cfg, run.metrics.iloc[:51], 50, None, 1.5)
    assert progress.finished_line("sweep of 2 runs", [run, diverged]) == (
        f"sweep of 2 runs: 251/400 steps [{progress.clock(run.wall_time_s + 1.5)}], 1 diverged")
