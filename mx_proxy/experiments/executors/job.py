"""The job side of the Slurm executor: one unit of work as one task of an array job.

:class:`UnitJob` is what submitit pickles and runs on a compute node. It

- claims the unit's store keys (:func:`mx_proxy.store.run_store.claim`):
  the submitter runs one job per unit at a time, so a training folder a
  cancelled or failed job left, on any host, is this job's to resume;
- keeps XLA to the job's ``--cpus-per-task`` where Slurm does not pin CPUs
  (``task/none``): it pins itself to the CPUs Slurm allocated it (XLA sizes
  its thread pool by the process's CPU affinity);
- on ``SIGUSR1``/``SIGUSR2`` (Slurm's warning before a time limit or a
  preemption: ``SIGUSR2``, ``SlurmOptions.signal_delay_s`` ahead) or ``SIGTERM``
  (``scancel``, preemption) sets :data:`mx_proxy.runner.loop.stop`: the host
  loop checkpoints every unfinished run at the end of its segment and stops.
  After a USR signal the job is requeued through submitit
  (:class:`submitit.helpers.Checkpointable`; the requeued job resumes from
  that checkpoint, bit for bit); after ``SIGTERM`` it exits without a result
  (the scheduler's state says what happened, and a rerun of the command
  resumes the unit);
- streams its runs' metrics to the tracking that was active where it was
  submitted (``--track``: :mod:`mx_proxy.experiments.tracking`), into the
  same folder on the shared filesystem.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

from mx_proxy.experiments.executors.submitit_import import import_submitit

try:
    Checkpointable = import_submitit().helpers.Checkpointable
except ModuleNotFoundError:  # only submitting needs submitit (slurm._submitit says so): without it no job runs here
    Checkpointable = object

from mx_proxy.experiments import tracking
from mx_proxy.experiments.executors.base import newest_checkpoint
from mx_proxy.runner import loop as runner
from mx_proxy.store import run_store as _store

__all__ = ["UnitJob", "limit_cpus", "allocated_cpus"]

_REQUEUE_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)


def _expand(ids: str) -> set[int]:
    """``0-2,5`` as {0, 1, 2, 5}."""
    out: set[int] = set()
    for part in ids.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def allocated_cpus(job_id: str | None) -> set[int]:
    """The CPU ids Slurm allocated to job ``job_id`` on this node
    (``scontrol show job -d``: ``CPU_IDs=``), or an empty set where it does
    not say. Slurm assigns them even where its task plugin does not enforce
    them (``task/none``)."""
    if not job_id or shutil.which("scontrol") is None:
        return set()
    try:
        text = subprocess.run(["scontrol", "show", "job", "-d", str(job_id)], capture_output=True, text=True,
                              timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    host = socket.gethostname().split(".")[0]
    for line in text.splitlines():
        m = re.search(r"Nodes=(\S+) CPU_IDs=([\d,-]+)", line)
        if m and (m.group(1) == host or len(re.findall("CPU_IDs=", text)) == 1):
            return _expand(m.group(2))
    return set()


def limit_cpus(environ=os.environ, allocated: set[int] | None = None) -> set[int] | None:
    """Pin this process to its ``SLURM_CPUS_PER_TASK`` CPUs when Slurm left
    it more (``task/none``): those Slurm allocated to the job (``allocated``,
    default :func:`allocated_cpus`), else a block chosen by the array task
    index; returns the CPUs pinned to, or ``None`` where nothing needed
    pinning. XLA sizes its thread pool by this affinity, so it must run
    before JAX starts its CPU backend."""
    want = int(environ.get("SLURM_CPUS_PER_TASK") or 0)
    have = sorted(os.sched_getaffinity(0))
    if not want or want >= len(have):
        return None
    if allocated is None:
        allocated = allocated_cpus(environ.get("SLURM_JOB_ID"))
    cpus = allocated & set(have)
    if len(cpus) != want:
        first = int(environ.get("SLURM_ARRAY_TASK_ID") or 0) * want % len(have)
        cpus = {have[(first + i) % len(have)] for i in range(want)}
    os.sched_setaffinity(0, cpus)
    return cpus


def _say(text: str) -> None:
    print(f"[mx-proxy {time.strftime('%H:%M:%S')}] {text}", flush=True)


class UnitJob(Checkpointable):
    """``fn(*args, store=store, progress=False)`` in a Slurm job (see the
    module docstring); returns a small summary (the runs are in the store)."""

    def __init__(self, name: str, fn, args: tuple, store: str, keys: tuple[str, ...],
                 track: tracking.Tracking | None = None):
        self.name, self.fn, self.args, self.store, self.keys = name, fn, tuple(args), str(store), tuple(keys)
        self.track = track

    def __call__(self) -> dict:
        cpus = limit_cpus()
        _store.claim(self.keys)
        received: list[int] = []
        handlers = {s: signal.getsignal(s) for s in (*_REQUEUE_SIGNALS, signal.SIGTERM)}

        def stop(signum, frame):
            _say(f"received {signal.Signals(signum).name}: checkpointing at the end of the current segment")
            received.append(signum)
            runner.stop.set()

        for s in handlers:
            signal.signal(s, stop)
        resume = newest_checkpoint(self.store, self.keys)
        _say(f"unit {self.name}: {len(self.keys)} run(s) into {self.store} on {socket.gethostname()}"
             + (f", CPUs {sorted(cpus)}" if cpus else "")
             + (f"; resuming from the checkpoint at step {resume}" if resume is not None else "")
             + (f"; streaming metrics to {self.track.kind} in {self.track.where}" if self.track else ""))
        t0 = time.time()
        try:
            with tracking.active(self.track):
                self.fn(*self.args, store=self.store, progress=False)
        except runner.Stopped as e:
            _say(f"unit {self.name}: {e}")
            self._leave(received[-1] if received else signal.SIGTERM, handlers)
        _say(f"unit {self.name}: done in {time.time() - t0:.0f} s")
        return {"unit": self.name, "keys": list(self.keys), "seconds": time.time() - t0}

    @staticmethod
    def _leave(signum: int, handlers: dict) -> None:
        """After a stop: requeue through submitit's handler of the USR
        signal (it calls :meth:`checkpoint` and ``scontrol requeue``, then
        exits), or exit without a result after ``SIGTERM``."""
        if signum in _REQUEUE_SIGNALS:
            requeue = next((h for s, h in handlers.items() if s in _REQUEUE_SIGNALS and callable(h)), None)
            if requeue is not None:
                requeue(signum, None)  # exits
        sys.exit(128 + int(signum))
