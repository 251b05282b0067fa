"""The local executor: units of work in this process, or in local worker processes.

``LocalExecutor(jobs=1)`` runs each unit here, one after another, in the
order given (the campaign's default: a time-limited run keeps what it
finished first, and a unit's exception propagates as it always did);
``jobs > 1`` hands them to ``jobs`` worker processes, the costliest first,
with one progress bar (:func:`mx_proxy.experiments.parallel.train_all`, what
``mx-proxy figures`` has always used).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from mx_proxy.experiments import parallel
from mx_proxy.experiments.executors.base import Failure, OnUnit, WorkUnit

__all__ = ["LocalExecutor"]


MAX_JOBS = 64  # local worker processes, at most


class LocalExecutor:
    """Units in this process (``jobs=1``) or in ``jobs`` local worker processes."""

    name = "local"

    def __init__(self, jobs: int = 1):
        if isinstance(jobs, bool) or not isinstance(jobs, int) or not 1 <= jobs <= MAX_JOBS:
            raise ValueError(f"jobs must be an integer in [1, {MAX_JOBS}], got {jobs!r}")
        self.jobs = jobs

    @property
    def concurrent(self) -> bool:
        return self.jobs > 1

    def __repr__(self):
        return f"LocalExecutor(jobs={self.jobs})"

    def run(self, units: Sequence[WorkUnit], store: str | Path | None, *, on_start: OnUnit | None = None,
            on_done: OnUnit | None = None, progress: bool = True,
            log: Callable[[str], None] = print) -> list[Failure]:
        """Run ``units`` into ``store`` (see :class:`~mx_proxy.experiments.executors.base.Executor`)."""
        units = list(units)
        if self.jobs > 1 and len(units) > 1:
            if store is None:
                raise ValueError("worker processes train into a run store; give one, or use jobs=1")
            parallel.train_all(sorted(units, key=lambda u: -u.cost), str(store), jobs=min(self.jobs, len(units)),
                               progress=progress, log=log, on_start=on_start, on_done=on_done)
            return []
        for unit in units:
            if on_start is not None:
                on_start(unit, None)
            result = unit.fn(*unit.args, store=None if store is None else str(store), progress=progress)
            if on_done is not None:
                on_done(unit, result)
        return []
