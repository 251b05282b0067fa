"""Executors without a cluster: the Slurm options refuse bad values naming the valid ones, the local executor runs
any unit of work, a stop request checkpoints where the loop stands and the resumed run is the uninterrupted one
bit for bit, a job claims the training folders of its keys, and a job keeps XLA to its CPUs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mx_proxy as mxp
from mx_proxy.experiments import executors, parallel
from mx_proxy.experiments.executors import job as _job
from mx_proxy.runner import loop as runner
from mx_proxy.store import checkpoint as ckpt
from mx_proxy.store import durable
from mx_proxy.store import run_store as _store

TINY = mxp.Config(width=16, depth=2, batch=32, steps=40, diagnostics_every=10, val_every=10, recipe="mxfp8_e4m3")


def _same(a, b):
    assert list(a.metrics.columns) == list(b.metrics.columns)
    for col in a.metrics.columns:
        assert np.array_equal(a.metrics[col].to_numpy(), b.metrics[col].to_numpy(), equal_nan=True), col


@pytest.mark.parametrize("text, minutes", [("90", 90), ("1:30", 2), ("2:00:00", 120), ("1-0", 1440),
                                           ("1-2:30", 1590), ("0-0:0:30", 1), (45, 45)])
def test_slurm_times_in_every_sbatch_form(text, minutes):
    assert executors.parse_time(text) == minutes


@pytest.mark.parametrize("kw, message", [
    ({"time": "1h"}, "slurm time '1h' is not a Slurm time limit; valid forms: MINUTES, .*DAYS-HOURS:MINUTES:SECONDS"),
    ({"time": "0"}, "must be longer than 0"),
    ({"cpus_per_task": 0}, "slurm cpus per task must be an integer >= 1, got 0"),
    ({"gpus_per_task": -1}, "slurm gpus per task must be an integer >= 0, got -1"),
    ({"array_parallelism": 2.5}, "slurm array parallelism must be an integer >= 1, got 2.5"),
    ({"partition": "gpu; rm -rf"}, "is not a partition name"),
    ({"extra": {"array": "0-3"}}, "'array' is set by the executor itself; options it sets: array, output"),
    ({"extra": {"time": "5"}}, "'time' has its own flag: --slurm-time"),
    ({"setup": [1]}, "slurm setup must be shell lines"),
    ({"time": 5, "signal_delay_s": 300}, r"slurm signal delay \(300 s\) must be shorter than the time limit \(5 min\)"),
])
def test_slurm_options_refuse_bad_values_naming_what_is_valid(kw, message):
    with pytest.raises(ValueError, match=message):
        executors.SlurmOptions(**kw)


def test_slurm_options_become_submitit_parameters():
    o = executors.SlurmOptions(partition="gpu", time="4:00:00", gpus_per_task=1, cpus_per_task=8,
                               setup="module load cuda", extra=executors.parse_extra(["mem=16G", "--exclusive"]))
    p = o.parameters()
    assert p["time"] == 240 and p["partition"] == "gpu" and p["gpus_per_task"] == 1 and p["cpus_per_task"] == 8
    assert p["setup"] == ["module load cuda"] and p["additional_parameters"] == {"mem": "16G", "exclusive": True}
    assert p["signal_delay_s"] == 300
    assert "gpus_per_task" not in executors.SlurmOptions().parameters()  # CPU jobs ask for no GPU
    with pytest.raises(ValueError, match="slurm option 'x y' is not KEY=VALUE"):
        executors.parse_extra(["x y"])
    with pytest.raises(ValueError, match="unknown executor 'pbs'; valid: local, slurm"):
        executors.make("pbs")
    with pytest.raises(ValueError, match=r"jobs must be an integer in \[1, 64\], got 0"):
        executors.make("local", jobs=0)


def _echo(tag, *, store, progress):
    return [tag, store, progress]


def test_the_local_executor_runs_any_unit_here_in_order():
    units = [executors.Work(f"u{i}", cost=i, fn=_echo, args=(i,)) for i in (1, 3, 2)]
    seen = []
    failures = executors.make("local").run(units, "S", on_start=lambda u, r: seen.append(("start", u.name, r)),
                                           on_done=lambda u, r: seen.append(("done", u.name, r)), progress=False)
    assert failures == []
    assert seen == [("start", "u1", None), ("done", "u1", [1, "S", False]), ("start", "u3", None),
                    ("done", "u3", [3, "S", False]), ("start", "u2", None), ("done", "u2", [2, "S", False])]
    assert isinstance(units[0], executors.WorkUnit) and isinstance(parallel.Unit([TINY]), executors.WorkUnit)


def test_a_stop_request_checkpoints_where_the_loop_stands_and_the_rerun_is_the_uninterrupted_run(tmp_path):
    cfg = TINY.replace(checkpoint_every=30)
    runner.stop.set()
    try:
        with pytest.raises(runner.Stopped, match="stopped at step 10"):
            mxp.train(cfg, store=tmp_path, progress=False)
    finally:
        runner.stop.clear()
    (part,) = tmp_path.glob(f"{cfg.hash()}.partial-*")
    assert ckpt.steps(part / "checkpoints") == [10] and ckpt.meta(part / "checkpoints", 10)["stopped"]
    resumed = mxp.train(cfg, store=tmp_path, progress=False)
    assert resumed.info["resumed_from"] == 10
    _same(resumed, mxp.train(cfg, progress=False))
    assert not ckpt.meta(tmp_path / cfg.hash() / "checkpoints", 30).get("stopped")  # a planned one


def test_a_job_adopts_the_training_folder_of_its_claimed_keys_whoever_left_it(tmp_path):
    cfg = TINY.replace(checkpoint_every=20)
    st = _store.Store(tmp_path)
    key = cfg.hash()
    runner.stop.set()
    try:
        with pytest.raises(runner.Stopped):
            mxp.train(cfg.replace(), store=tmp_path, progress=False)
    finally:
        runner.stop.clear()
    (part,) = tmp_path.glob(f"{key}.partial-*")
    other = tmp_path / f"{key}.partial-12345@another_host"  # a job on another node, whose life this host cannot judge
    os.rename(part, other)
    assert st._orphans(key) == []
    _store.claim([key])
    try:
        assert st._orphans(key) == [other]
        assert mxp.train(cfg, store=tmp_path, progress=False).info["resumed_from"] == 10
    finally:
        _store._CLAIMED.discard(key)


def test_a_job_keeps_to_its_cpus_where_slurm_does_not_pin(monkeypatch):
    pinned = []
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: pinned.append(cpus))
    assert _job.limit_cpus({"SLURM_CPUS_PER_TASK": "2"}, allocated={1, 3}) == {1, 3}  # what Slurm allocated
    assert _job.limit_cpus({"SLURM_CPUS_PER_TASK": "2", "SLURM_ARRAY_TASK_ID": "1"}, allocated=set()) == {2, 3}
    assert _job.limit_cpus({"SLURM_CPUS_PER_TASK": "1", "SLURM_ARRAY_TASK_ID": "5"}, allocated={7}) == {1}
    assert _job.limit_cpus({"SLURM_CPUS_PER_TASK": "4"}) is None  # already its own
    assert _job.limit_cpus({}) is None and pinned == [{1, 3}, {2, 3}, {1}]
    assert _job._expand("0-2,5") == {0, 1, 2, 5} and _job.allocated_cpus(None) == set()


def test_the_slurm_record_and_stored_units(tmp_path):
    from mx_proxy.experiments.executors import slurm

    assert slurm.read_record(tmp_path) == {}
    (tmp_path / slurm.RECORD).write_text("{not json")
    with pytest.raises(ValueError, match="submission record .* is damaged"):
        slurm.read_record(tmp_path)
    run = mxp.train(TINY, store=tmp_path / "runs", progress=False)
    assert executors.stored(tmp_path / "runs", [run.info["key"]])
    assert not executors.stored(tmp_path / "runs", [run.info["key"], "0" * 16]) and not executors.stored(None, ["x"])
    meta = json.loads((tmp_path / "runs" / run.info["key"] / "run.json").read_text())
    durable.atomic_write(tmp_path / "runs" / run.info["key"] / "run.json",
                       lambda p: p.write_text(json.dumps(dict(meta, code_version="0" * 16))))
    assert not executors.stored(tmp_path / "runs", [run.info["key"]])  # stale: trained again
    failure = executors.Failure("grid: a, b", "FAILED", "7_1", ("7_1.err",), "Traceback\nValueError: too big")
    assert "grid: a, b (job 7_1, FAILED); log: 7_1.err\n    | Traceback\n    | ValueError: too big" in \
        str(executors.UnitsFailed([failure]))


def test_one_submitter_at_a_time_per_folder(tmp_path):
    ex = executors.make("slurm", folder=tmp_path)
    with ex._only_submitter():
        with pytest.raises(ValueError, match=r"another command is already submitting .* \(pid \d+ on "):
            with executors.make("slurm", folder=tmp_path)._only_submitter():
                pass
    with ex._only_submitter():  # released
        pass


_WITHOUT_SUBMITIT = """
import shutil, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "submitit" or name.startswith("submitit."):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, Block())
from mx_proxy.experiments import branch_replay, ensemble, executors, paper_seeds, unstable_search  # noqa: F401
from mx_proxy import cli  # noqa: F401
assert executors.make("local").run([executors.Work("u", 1.0, lambda store, progress: 7)], None) == []
shutil.which = lambda command: "/usr/bin/" + command  # as if Slurm were here, so that check() gets to submitit
try:
    executors.make("slurm").check()
except ValueError as e:
    print(e)
"""


def test_everything_but_the_slurm_executor_runs_without_submitit(tmp_path):
    """A GPU image without submitit still trains ensembles locally; asking for Slurm there names what is missing."""
    done = subprocess.run([sys.executable, "-c", _WITHOUT_SUBMITIT], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(Path(mxp.__file__).parents[1])})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "--executor slurm: the slurm executor needs submitit" in done.stdout
    assert "pip install submitit" in done.stdout


_KEEPS_HANDLERS = """
import io, logging, os, sys


class Closing(logging.StreamHandler):  # closes its stream when closed, as absl's handler does
    def close(self):
        self.stream.close()
        super().close()


root_stream, user_stream = io.StringIO(), io.StringIO()
root_handler, user_handler = Closing(root_stream), Closing(user_stream)
logging.getLogger().addHandler(root_handler)
logging.getLogger("user").addHandler(user_handler)
import mx_proxy.experiments.executors  # imports submitit (the job side subclasses its Checkpointable)
from mx_proxy.experiments.executors.submitit_import import import_submitit
import_submitit()  # a second call adds nothing
assert not root_stream.closed and not user_stream.closed
assert root_handler in logging.getLogger().handlers and user_handler in logging.getLogger("user").handlers
assert "SUBMITIT_LOG_LEVEL" not in os.environ
log = logging.getLogger("submitit")
assert len(log.handlers) == 2 and log.level == logging.INFO
log.info("an info line"); log.warning("a warning line")
"""


def test_importing_submitit_keeps_the_process_logging(tmp_path):
    """submitit's own import-time logging configuration closes every handler the process has (it closed pytest's
    captured stderr under a test that ran the CLI); through import_submitit the handlers stay, and submitit's
    logger still writes as its configuration would: everything to stdout, warnings also to stderr."""
    pytest.importorskip("submitit")
    env = {k: v for k, v in os.environ.items() if k != "SUBMITIT_LOG_LEVEL"}
    env["PYTHONPATH"] = str(Path(mxp.__file__).parents[1])
    res = subprocess.run([sys.executable, "-c", _KEEPS_HANDLERS], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "submitit INFO" in res.stdout and "submitit WARNING" in res.stdout
    assert "a warning line" in res.stderr and "an info line" not in res.stderr


def test_a_chosen_submitit_log_level_is_left_to_submitit(tmp_path):
    pytest.importorskip("submitit")
    code = ("import os, logging; import mx_proxy.experiments.executors; "
            "assert os.environ['SUBMITIT_LOG_LEVEL'] == 'WARNING'; "
            "assert logging.getLogger('submitit').level == logging.WARNING, logging.getLogger('submitit').level")
    env = {**os.environ, "SUBMITIT_LOG_LEVEL": "WARNING", "PYTHONPATH": str(Path(mxp.__file__).parents[1])}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]


def test_submitit_imported_first_keeps_its_own_logging(tmp_path):
    """Where the user imported submitit before, it configured its logger itself: nothing is added to it."""
    pytest.importorskip("submitit")
    code = ("import logging, submitit; before = list(logging.getLogger('submitit').handlers); "
            "import mx_proxy.experiments.executors; from mx_proxy.experiments.executors.submitit_import import "
            "import_submitit; import_submitit(); assert logging.getLogger('submitit').handlers == before, "
            "logging.getLogger('submitit').handlers; assert len(before) == 2")
    env = {k: v for k, v in os.environ.items() if k != "SUBMITIT_LOG_LEVEL"}
    env["PYTHONPATH"] = str(Path(mxp.__file__).parents[1])
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
