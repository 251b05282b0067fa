"""The Slurm executor: each unit of work one task of one Slurm array job, through submitit.

The submitting process only plans, submits, polls and hands back: jobs
train into the run store (on a filesystem every node sees) with the store's
own atomic promote, and the store is the source of truth. So a rerun of
the same command after a crash, an ``scancel`` or a node failure

- skips every unit whose runs are all in the store (never retrains them),
- attaches to the job of a unit still pending or running (recorded in
  ``FOLDER/units.json``), and
- submits the rest again as one array; each resumes from its newest
  checkpoint (:mod:`mx_proxy.experiments.executors.job`).

A unit whose job fails (an exception, ``CANCELLED``, ``TIMEOUT``, a node
failure) does not stop the others: :meth:`SlurmExecutor.run` returns its
:class:`~mx_proxy.experiments.executors.base.Failure` with the last lines of
its log. Job states come from ``sacct`` (submitit's parser), so the cluster
needs accounting (slurmdbd). Logs and submitit's pickles live in
``FOLDER/<job id>/``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from mx_proxy.experiments import tracking
from mx_proxy.experiments.executors.base import Failure, OnUnit, WorkUnit, newest_checkpoint, stored
from mx_proxy.experiments.executors.job import UnitJob
from mx_proxy.experiments.executors.options import SlurmOptions
from mx_proxy.experiments.executors.submitit_import import import_submitit
from mx_proxy.store import durable

if TYPE_CHECKING:
    import submitit

__all__ = ["SlurmExecutor", "unit_id", "read_record", "job_states", "log_tail", "jobs", "ACTIVE", "RECORD"]

RECORD = "units.json"
ACTIVE = ("PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING",
          "SUSPENDED", "RESIZING", "PREEMPTED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "UNKNOWN")
"""Job states in which a job may still run (``UNKNOWN``: not yet in ``sacct``)."""


def _submitit():
    """submitit, imported only where a job is submitted or watched, so that everything else (an ensemble on
    the local executor, say on a GPU image without submitit) runs without it."""
    try:
        return import_submitit()
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(f"the slurm executor needs submitit ({e}); pip install submitit, or use the "
                                  f"local executor") from e


def unit_id(unit: WorkUnit) -> str:
    """A stable id of a unit across reruns: a hash of its store keys (of its name if it has none)."""
    text = "\n".join(sorted(unit.keys)) if unit.keys else unit.name
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_record(folder: str | Path) -> dict[str, dict]:
    """The submission record of ``folder``: unit id → {``name``, ``keys``,
    ``labels``, ``job``, ``stdout``, ``stderr``, ``submitted``, ``earlier``
    (job ids of earlier submissions)}; empty when nothing was submitted."""
    path = Path(folder) / RECORD
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ValueError(f"the Slurm submission record {path} is damaged ({e}); remove it to resubmit "
                         f"everything the run store does not hold") from None
    return record if isinstance(record, dict) else {}


def _write_record(folder: Path, record: dict) -> None:
    durable.atomic_write(folder / RECORD, lambda p: p.write_text(json.dumps(record, indent=1, sort_keys=True)))


def job_states(job_ids: Sequence[str]) -> dict[str, str]:
    """The state of each job (``RUNNING``, ``COMPLETED``, ``CANCELLED``…;
    ``UNKNOWN`` while ``sacct`` does not know it) from one ``sacct`` call."""
    ids = [str(j) for j in job_ids if j]
    if not ids:
        return {}
    if shutil.which("sacct") is None:
        return dict.fromkeys(ids, "UNKNOWN")  # no scheduler here to ask
    watcher = _submitit().slurm.slurm.SlurmInfoWatcher(delay_s=0)
    for j in ids:
        watcher.register_job(j)
    watcher.update()
    return {j: watcher.get_state(j, mode="cache").split()[0] for j in ids}


def log_tail(paths: Sequence[str | Path], lines: int = 20) -> str:
    """The last ``lines`` lines of the first of ``paths`` that holds any (a job's stderr, then its stdout)."""
    for p in paths:
        try:
            text = Path(p).read_text(errors="replace").rstrip()
        except OSError:
            continue
        if text:
            return "\n".join(text.splitlines()[-lines:])
    return ""


class SlurmExecutor:
    """Units as the tasks of one Slurm array job (see the module docstring).

    ``options``: the resources each job asks for (:class:`SlurmOptions`);
    ``folder``: the submission record, logs and submitit's pickles, on a
    filesystem the nodes share (the campaign uses ``OUT/slurm``)."""

    name = "slurm"
    concurrent = True

    def __init__(self, options: SlurmOptions | None = None, folder: str | Path = "slurm"):
        self.options = options or SlurmOptions()
        self.folder = Path(folder).expanduser().resolve()

    def __repr__(self):
        return f"SlurmExecutor({self.options!r}, folder={str(self.folder)!r})"

    def check(self) -> None:
        """Raise a ValueError unless this machine can submit (``sbatch`` and ``sacct`` on the PATH)."""
        missing = [c for c in ("sbatch", "sacct") if shutil.which(c) is None]
        if missing:
            raise ValueError(f"--executor slurm needs Slurm's {' and '.join(missing)} on the PATH (run it on a "
                             f"login node of the cluster); valid executors here: local")
        try:
            _submitit()
        except ModuleNotFoundError as e:
            raise ValueError(f"--executor slurm: {e}") from None

    def run(self, units: Sequence[WorkUnit], store: str | Path | None, *, on_start: OnUnit | None = None,
            on_done: OnUnit | None = None, progress: bool = True,
            log: Callable[[str], None] = print) -> list[Failure]:
        """Submit what the store does not hold, wait, and return the failures
        (see :class:`~mx_proxy.experiments.executors.base.Executor`)."""
        if store is None:
            raise ValueError("the Slurm executor trains into a run store on a filesystem the nodes share; give "
                             "one (not --no-store)")
        self.check()
        store = str(Path(store).expanduser().resolve())
        on_start = on_start or (lambda u, r: None)
        on_done = on_done or (lambda u, r: None)
        pending = []
        for unit in units:
            if stored(store, unit.keys):
                on_done(unit, None)
            else:
                pending.append(unit)
        if not pending:
            return []
        self.folder.mkdir(parents=True, exist_ok=True)
        with self._only_submitter():
            jobs = self._attach(pending, log)
            fresh = [u for u in pending if unit_id(u) not in jobs]
            jobs.update(self._submit(fresh, store, log))
            for unit in pending:
                on_start(unit, None)
            return self._wait(pending, jobs, on_done, log)

    @contextlib.contextmanager
    def _only_submitter(self):
        """Hold ``FOLDER/.submitter.lock`` while submitting and polling: two
        commands submitting the same units at once would run two jobs per unit."""
        with open(self.folder / ".submitter.lock", "a+") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                f.seek(0)
                raise ValueError(f"another command is already submitting and polling the units of {self.folder} "
                                 f"({f.read().strip() or 'a live process'}); wait for it, or stop it (its jobs keep "
                                 f"running) and rerun") from None
            f.seek(0)
            f.truncate()
            f.write(f"pid {os.getpid()} on {socket.gethostname()}")
            f.flush()
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _attach(self, units: Sequence[WorkUnit], log) -> dict[str, submitit.SlurmJob]:
        """The jobs of a previous call still pending or running, by unit id."""
        record = read_record(self.folder)
        ids = {unit_id(u) for u in units}
        known = {uid: r["job"] for uid, r in record.items() if uid in ids and r.get("job")}
        states = job_states(list(known.values()))
        alive = {uid: _submitit().SlurmJob(self.folder / "%j", job) for uid, job in known.items()
                 if states.get(job, "UNKNOWN") in ACTIVE and states.get(job) != "UNKNOWN"}
        if alive:
            log(f"attached to {len(alive)} job(s) still pending or running: "
                f"{', '.join(j.job_id for j in alive.values())}")
        return alive

    def _submit(self, units: Sequence[WorkUnit], store: str, log) -> dict[str, submitit.SlurmJob]:
        """Submit ``units`` (costliest first) as one array job and record them."""
        if not units:
            return {}
        units = sorted(units, key=lambda u: -u.cost)
        ex = _submitit().SlurmExecutor(folder=self.folder / "%j", max_num_timeout=self.options.max_requeues)
        ex.update_parameters(**self.options.parameters())
        with ex.batch():
            track = tracking.current()  # the jobs stream where this process would (--track)
            submitted = [ex.submit(UnitJob(u.name, u.fn, u.args, store, tuple(u.keys), track)) for u in units]
        record = read_record(self.folder)
        now = time.strftime("%Y-%m-%dT%H:%M:%S")
        for unit, job in zip(units, submitted):
            uid = unit_id(unit)
            old = record.get(uid, {})
            earlier = old.get("earlier", []) + ([old["job"]] if old.get("job") else [])
            record[uid] = {"name": unit.name, "keys": list(unit.keys), "labels": list(getattr(unit, "labels", ())),
                           "job": job.job_id, "stdout": str(job.paths.stdout), "stderr": str(job.paths.stderr),
                           "submitted": now, "earlier": earlier}
        _write_record(self.folder, record)
        array = submitted[0].job_id.split("_")[0]
        log(f"submitted {len(units)} unit(s) as Slurm array job {array} (logs in {self.folder}/{array}_*)")
        return {unit_id(u): j for u, j in zip(units, submitted)}

    def _wait(self, units: Sequence[WorkUnit], jobs: dict, on_done: OnUnit, log) -> list[Failure]:
        """Poll every job until each finished; ``on_done`` for those that
        completed, a :class:`Failure` for the others. Result files (written
        as a job's function returns) are looked for every second, the
        scheduler (``sacct``) every ``poll_s`` seconds."""
        left = {unit_id(u): u for u in units}
        failures: list[Failure] = []
        states: dict[str, str] = {}
        asked = 0.0
        while left:
            if time.time() - asked >= self.options.poll_s:
                states, asked = job_states([jobs[uid].job_id for uid in left]), time.time()
            for uid, unit in list(left.items()):
                job = jobs[uid]
                outcome = _outcome(job, states.get(job.job_id, "UNKNOWN"))
                if outcome is None:
                    continue
                del left[uid]
                if outcome == "COMPLETED":
                    log(f"unit {unit.name}: done (job {job.job_id})")
                    on_done(unit, None)
                else:
                    logs = (str(job.paths.stderr), str(job.paths.stdout))
                    failures.append(Failure(unit.name, outcome, job.job_id, logs, log_tail(logs)))
                    log(f"unit {unit.name}: {outcome} (job {job.job_id}); log: {logs[0]}")
            if left:
                time.sleep(min(1.0, self.options.poll_s))
        return failures


def _outcome(job: submitit.SlurmJob, state: str) -> str | None:
    """``COMPLETED``, another final state (``FAILED`` for an exception
    raised in the job), or ``None`` while the job may still run. A job's
    result file decides first: it is written when the function returned or
    raised, before Slurm's state catches up."""
    folder = job.paths.folder
    try:  # refresh a network filesystem's view of the folder (as submitit does) before looking for the result
        folder.chmod(folder.stat().st_mode)
    except OSError:
        pass
    if job.paths.result_pickle.exists():
        try:
            job.result()
        except Exception:  # noqa: BLE001 -- the job's own exception, reported with its log
            return "FAILED"
        return "COMPLETED"
    if state in ACTIVE:
        return None
    return "FAILED" if state == "COMPLETED" else state  # finished without a result: it did not return


def jobs(folder: str | Path, store: str | Path) -> list[dict]:
    """Where each unit ever submitted from ``folder`` stands, from the
    scheduler and the store (one ``sacct`` call): per unit ``unit``,
    ``labels``, ``job`` (its newest job id), ``state`` (``done`` when the store
    holds all its runs; else ``pending``, ``running``, ``requeued`` or
    ``failed (STATE)`` from the scheduler and the job's result file),
    ``checkpoint`` (the step of its newest checkpoint: where a rerun
    resumes), ``stdout``, ``stderr`` and, for a failed unit, ``tail`` (its
    log's last lines)."""
    folder, store = Path(folder), Path(store)
    record = read_record(folder)
    states = job_states([r.get("job") for r in record.values()])
    rows = []
    for r in record.values():
        job, keys = r.get("job"), r.get("keys", [])
        row = {"unit": r.get("name"), "labels": r.get("labels", []), "job": job, "state": "done",
               "checkpoint": None, "stdout": r.get("stdout"), "stderr": r.get("stderr"), "tail": ""}
        if not stored(store, keys):
            outcome = _outcome(_submitit().SlurmJob(folder / "%j", job), states.get(job, "UNKNOWN")) if job else None
            state = states.get(job, "UNKNOWN")
            if outcome is None:
                row["state"] = state.lower()
            else:
                row["state"] = "done" if outcome == "COMPLETED" else f"failed ({outcome})"
                if outcome != "COMPLETED":
                    row["tail"] = log_tail((row["stderr"], row["stdout"]))
            row["checkpoint"] = newest_checkpoint(store, keys)
        rows.append(row)
    return rows
