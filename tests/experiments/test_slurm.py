"""The Slurm executor against a real one-node Slurm cluster (``scripts/slurm_single_node.sh up``; ``.ci/run``
brings it up for these tests and stops it afterwards). Skipped, with the reason, where it is not up.

- the smoke campaign as an array job: exit 0, results equal to the local executor's bit for bit, a rerun
  trains nothing, ``--status`` names every unit's job;
- a job preempted (SIGUSR2: checkpoint, requeue, continue) and then cancelled mid-run (``scancel``: checkpoint,
  exit), the command rerun: it resumes from the checkpoint and ends equal to an uninterrupted run;
- a failing unit (a config too big for the node) is reported with its log's last lines and blocks no other;
- a rerun after the submitting process died attaches to the job still running instead of submitting another;
- a tiny ensemble as an array job (one task per arm) exports members equal to the local executor's bit for bit,
  its jobs stream their metrics to TensorBoard (``--track``) equal to the stored runs', and ``ensemble --status``
  names each unit's job and log.
"""

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pandas as pd
import pytest

import mx_proxy as mxp
from mx_proxy.cli.main import main
from mx_proxy.experiments import campaign, ensemble_status, executors, scales, tracking
from mx_proxy.experiments.executors import slurm as _slurm
from mx_proxy.store import checkpoint as ckpt

pytestmark = pytest.mark.slurm

CLUSTER = Path(os.environ.get("MX_PROXY_SLURM_DIR", "/tmp/mx-proxy-slurm"))


@pytest.fixture(scope="module")
def cluster():
    """The environment of a running one-node cluster (``SLURM_CONF`` set); skips, saying why, without one."""
    if (CLUSTER / "unavailable").exists():
        pytest.skip(f"no Slurm cluster: {(CLUSTER / 'unavailable').read_text().strip()}")
    if not (CLUSTER / "up").exists():
        pytest.skip(f"no Slurm cluster is up ({CLUSTER}/up is missing): scripts/slurm_single_node.sh up, as root, "
                    f"installs Debian's slurm-wlm, slurmdbd, munge and mariadb-server and starts one")
    before = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(CLUSTER / "slurm.conf")
    probe = subprocess.run(["sinfo", "-h"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"the Slurm cluster in {CLUSTER} does not answer: {probe.stderr.strip()}")
    yield dict(os.environ)
    if before is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = before


def _wait(what, predicate, timeout=120.0, job=None, log=None):
    """``predicate()``'s first true value within ``timeout`` seconds; on a timeout, what Slurm says of ``job`` and
    the last lines of its ``log`` (default: the one ``scontrol`` names)."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}" + (_job_detail(job, log) if job else ""))


def _job_detail(job: str, log=None) -> str:
    """For a failure message: ``scontrol show job`` (gone ``MinJobAge`` after the job ended), ``sacct``'s history
    of each of its starts, slurmctld's log lines about it and its log's last lines."""
    shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    history = subprocess.run(["sacct", "-j", job, "--duplicates", "-P", "-o", "JobID,State,ExitCode,Start,End"],
                             capture_output=True, text=True).stdout
    ctld = CLUSTER / "log" / "slurmctld.log"
    said = [line for line in ctld.read_text(errors="replace").splitlines() if f"JobId={job} " in f"{line} "] \
        if ctld.exists() else []
    log = log or next((line.split("=", 1)[1] for line in shown.split() if line.startswith("StdOut=")), None)
    tail = Path(log).read_text().splitlines()[-20:] if log and Path(log).exists() else []
    return "\n".join(["", shown, "sacct:", history, "slurmctld:", *said[-15:], "the job's log, last lines:", *tail])


def _same_metrics(a: pd.DataFrame, b: pd.DataFrame):
    assert list(a.columns) == list(b.columns)
    for col in a.columns:
        assert np.array_equal(a[col].to_numpy(), b[col].to_numpy(), equal_nan=True), col


def _same_results(local: Path, remote: Path, labels) -> None:
    """The exported results of ``labels`` under ``local`` and ``remote`` hold the same run: metrics, config and
    divergence step."""
    for label in labels:
        a, b = local / "results" / label, remote / "results" / label
        _same_metrics(pd.read_parquet(a / "metrics.parquet"), pd.read_parquet(b / "metrics.parquet"))
        assert (a / "config.json").read_text() == (b / "config.json").read_text()
        assert json.loads((b / "run.json").read_text())["diverged_at"] == \
            json.loads((a / "run.json").read_text())["diverged_at"]


def _main(capsys, *args) -> tuple[int, str, str]:
    """The mx-proxy command in this process (the submitter only plans, submits, polls and exports)."""
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_smoke_campaign_as_an_array_job_equals_the_local_executors_bit_for_bit(cluster, tmp_path, capsys):
    local, remote = tmp_path / "local", tmp_path / "slurm"
    index = campaign.run("smoke", local, progress=False, log=lambda *_: None)  # compiles: the jobs reuse the cache
    code, out, err = _main(capsys, "campaign", "--scale", "smoke", "--out", remote, "--executor", "slurm", "--quiet")
    assert code == 0, err[-3000:]
    assert "submitted 4 unit(s) as Slurm array job" in out  # paired, control, 2 grid groups
    assert "submitted 1 unit(s)" in out  # then the interventions, from the trained paired run
    labels = sorted(index["label"])
    assert sorted(p.parent.name for p in (remote / "results").glob("*/run.json")) == labels
    _same_results(local, remote, labels)
    code, out, err = _main(capsys, "campaign", "--scale", "smoke", "--out", remote, "--executor", "slurm", "--quiet")
    assert code == 0 and "submitted" not in out  # the store holds everything: nothing retrains
    code, status, err = _main(capsys, "campaign", "--scale", "smoke", "--out", remote, "--status")
    assert code == 0, err
    units = _slurm.jobs(remote / "slurm", remote / "runs")
    assert len(units) == 5 and {u["state"] for u in units} == {"done"}
    for u in units:
        assert u["job"] in status and u["stdout"] in status


SWEEP = ["sweep", "--width", "32", "--depth", "2", "--batch", "64", "--steps", "2000", "--diagnostics-every", "10",
         "--val-every", "50", "--checkpoint-every", "200", "--recipe", "mxfp8_e4m3", "--executor", "slurm", "--quiet"]


def _checkpoints(store: Path) -> list[int]:
    return sorted(s for d in store.glob("*.partial-*") for s in ckpt.steps(d / "checkpoints"))


def _state(job: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True).stdout.strip()


def _requeue_hold() -> int:
    """Seconds Slurm holds a requeued job before it may start again: ``AuthInfo=cred_expire`` + 1 (121 by
    default; scripts/slurm_single_node.sh sets 10)."""
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
    m = re.search(r"^AuthInfo\s*=.*cred_expire=(\d+)", config, re.MULTILINE)
    return (int(m.group(1)) if m else 120) + 1


def test_a_preempted_then_cancelled_job_resumes_and_ends_equal_to_an_uninterrupted_run(cluster, tmp_path, capsys):
    store = tmp_path / "runs"
    running = subprocess.Popen([sys.executable, "-m", "mx_proxy.cli", *SWEEP, "--store", str(store)], env=cluster,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait("the first checkpoint", lambda: _checkpoints(store))
        (record,) = _slurm.read_record(store / ".slurm").values()
        job = record["job"]
        subprocess.run(["scancel", "--signal=USR2", job], check=True)  # Slurm's warning before a preemption
        stopped = _wait("the requeue", lambda: _state(job) == "PENDING" and _checkpoints(store), job=job,
                        log=record["stdout"])[-1]
        # the requeued job starts on its own after the cluster's cred_expire + 1 s (scripts/slurm_single_node.sh)
        _wait(f"a checkpoint after the requeue (stopped at {stopped})", lambda: _checkpoints(store)[-1] > stopped,
              timeout=_requeue_hold() + 120.0, job=job, log=record["stdout"])
        subprocess.run(["scancel", job], check=True)  # SIGTERM: checkpoint, exit
        out, err = running.communicate(timeout=120)
    finally:
        running.kill()
    assert running.returncode == 1, err[-3000:]
    assert f"(job {job}, CANCELLED)" in err and "    | " in err  # the unit, with its log's last lines
    assert "rerun the same command to resume" in err
    log = Path(record["stdout"]).read_text()
    assert f"stopped at step {stopped}" in log and "Requeued job" in log
    cancelled_at = _checkpoints(store)[-1]
    code, out, err = _main(capsys, *SWEEP, "--store", store)
    assert code == 0, err[-3000:]
    assert "submitted 1 unit(s)" in out
    cfg = mxp.Config(width=32, depth=2, batch=64, steps=2000, diagnostics_every=10, val_every=50,
                     checkpoint_every=200, recipe="mxfp8_e4m3")
    stored = mxp.load(store / cfg.hash())
    assert stored.info["resumed_from"] == cancelled_at > stopped > 0
    assert stopped % 200 == 0 or ckpt.meta(store / cfg.hash() / "checkpoints", stopped)["stopped"]
    here = mxp.train(cfg, progress=False)
    _same_metrics(stored.metrics, here.metrics)
    for a, b in zip(jax.tree.leaves(stored.params), jax.tree.leaves(here.params), strict=True):
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_a_failing_unit_is_reported_with_its_log_and_blocks_no_other(cluster, tmp_path, capsys):
    s = scales.get("smoke")
    s = dataclasses.replace(s, campaign=dataclasses.replace(s.campaign, grid_widths=(32, 1 << 16),
                                                            grid_recipes=("fp32",)))  # width 65536: too big
    ex = executors.make("slurm", folder=tmp_path / "slurm", slurm=executors.SlurmOptions(poll_s=1))
    with pytest.raises(executors.UnitsFailed) as failed:
        campaign.run(s, tmp_path, kinds=("grid",), executor=ex, progress=False, log=lambda *_: None)
    (failure,) = failed.value.failures
    assert failure.unit.startswith("grid: grid-w65536-fp32") and failure.state == "FAILED"
    assert "needs at least" in failure.tail and "make it smaller" in failure.tail
    assert sorted(p.parent.name for p in (tmp_path / "results").glob("*/run.json")) == \
        ["grid-w32-fp32-lr1e-2", "grid-w32-fp32-lr3e-3"]  # the other unit finished and was exported
    code, status, err = _main(capsys, "campaign", "--scale", "smoke", "--out", tmp_path, "--status", "--only", "grid")
    assert code == 0, err
    assert "failed (FAILED)" in status and "needs at least" in status and failure.log[0] in status


def test_a_rerun_after_the_submitter_died_attaches_to_the_running_job(cluster, tmp_path, capsys):
    store = tmp_path / "runs"
    argv = [*SWEEP, "--steps", "400", "--store", str(store), "--slurm-setup", "sleep 8"]  # the job runs a while
    submitter = subprocess.Popen([sys.executable, "-m", "mx_proxy.cli", *argv], env=cluster,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        record = _wait("the submission", lambda: _slurm.read_record(store / ".slurm"))
        (job,) = [r["job"] for r in record.values()]
        _wait("the job to start", lambda: _state(job) == "RUNNING")
    finally:
        submitter.kill()  # the login session ends; the job runs on
        submitter.wait(timeout=60)
    code, out, err = _main(capsys, *argv)
    assert code == 0, err[-3000:]
    assert f"attached to 1 job(s) still pending or running: {job}" in out and "submitted" not in out


ENSEMBLE = ["ensemble", "--kind", "seed", "--arms", "fp32", "mxfp8_e4m3", "--members", "2", "--horizon", "20",
            "--width", "16", "--depth", "2", "--batch", "32", "--diagnostics-every", "5", "--checkpoint-every", "10",
            "--quiet"]


def test_an_ensemble_as_an_array_job_equals_the_local_executors_bit_for_bit_and_streams(cluster, tmp_path, capsys):
    local, remote = tmp_path / "local", tmp_path / "slurm"
    code, _, err = _main(capsys, *ENSEMBLE, "--out", local)  # compiles: the jobs reuse the cache
    assert code == 0, err[-3000:]
    try:
        tracking.check_installed("tensorboard")
        track = ["--track", "tensorboard"]
    except tracking.TrackingUnavailable:  # the comparison stands without it
        track = []
    code, out, err = _main(capsys, *ENSEMBLE, "--out", remote, "--executor", "slurm", *track)
    assert code == 0, err[-3000:]
    assert "submitted 2 unit(s) as Slurm array job" in out  # one unit per arm
    labels = sorted(p.parent.name for p in (local / "results").glob("*/run.json"))
    assert labels == ["fp32-m00", "fp32-m01", "mxfp8_e4m3-m00", "mxfp8_e4m3-m01"]
    assert sorted(p.parent.name for p in (remote / "results").glob("*/run.json")) == labels
    _same_results(local, remote, labels)
    if track:  # streamed from the jobs, into the run store's folder on the shared filesystem
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        for entry in (remote / "runs").glob("*/run.json"):
            run = mxp.load(entry.parent)
            (folder,) = (remote / "runs" / "tensorboard").glob(f"*/*-{run.info['key']}")
            events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
            events.Reload()
            columns = [c for c in run.metrics.columns if c != "step" and run.metrics[c].notna().any()]
            assert sorted(events.Tags()["scalars"]) == sorted(columns)
            for column in columns:
                want = run.metrics[["step", column]].dropna()
                got = events.Scalars(column)
                assert [e.step for e in got] == want["step"].tolist(), column
                assert np.array_equal(np.float32([e.value for e in got]), want[column].to_numpy(np.float32)), column
    code, status, err = _main(capsys, "ensemble", "--out", remote, "--status")
    assert code == 0, err
    units = ensemble_status.jobs(remote)
    assert len(units) == 2 and set(units["state"]) == {"done"}
    for u in units.itertuples():
        assert u.job in status and u.stdout in status
