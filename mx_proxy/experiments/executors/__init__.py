"""Executors: where the units of work of a campaign, a sweep, the figures or an ensemble train.

Everything that trains several runs plans *units of work* (one compiled
program each: :class:`~mx_proxy.experiments.executors.base.WorkUnit`) and
hands them to one executor::

    ex = executors.make("local")                                   # this process (jobs=1) or worker processes
    ex = executors.make("slurm", folder="out/slurm",
                        slurm=executors.SlurmOptions(partition="gpu", time="4:00:00", gpus_per_task=1))
    failures = ex.run(units, store, on_start=..., on_done=..., log=print)

- ``local`` (the default): today's local path, in this process or in
  worker processes (:mod:`~mx_proxy.experiments.executors.local`);
- ``slurm``: each unit one task of one Slurm array job through submitit
  (:mod:`~mx_proxy.experiments.executors.slurm`; the job side in
  :mod:`~mx_proxy.experiments.executors.job`).

Units train into the run store with its atomic promote; the store is the
source of truth (a rerun skips what it holds and resumes the rest from
their newest checkpoints).
"""

from __future__ import annotations

from pathlib import Path

from mx_proxy.experiments.executors.base import Executor, Failure, UnitsFailed, Work, WorkUnit, stored
from mx_proxy.experiments.executors.local import LocalExecutor
from mx_proxy.experiments.executors.options import SlurmOptions, parse_extra, parse_time
from mx_proxy.experiments.executors.slurm import SlurmExecutor

__all__ = ["EXECUTORS", "make", "Executor", "Failure", "UnitsFailed", "Work", "WorkUnit", "stored", "LocalExecutor",
           "SlurmExecutor", "SlurmOptions", "parse_extra", "parse_time"]

EXECUTORS = ("local", "slurm")


def make(kind: str = "local", *, jobs: int = 1, folder: str | Path = "slurm",
         slurm: SlurmOptions | None = None) -> Executor:
    """The executor named ``kind``: ``local`` with ``jobs`` processes (1:
    this one), or ``slurm`` with ``slurm`` options and its record and logs
    in ``folder``. A ValueError names a bad kind and the valid ones."""
    if kind == "local":
        return LocalExecutor(jobs)
    if kind == "slurm":
        return SlurmExecutor(slurm, folder)
    raise ValueError(f"unknown executor {kind!r}; valid: {', '.join(EXECUTORS)}")
