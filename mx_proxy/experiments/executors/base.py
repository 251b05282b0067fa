"""What every executor takes and gives back: units of work, the executor interface, failures.

A *unit of work* is one compiled program's worth of training: a vmapped
group of sweep members, one paired group (MX recipes sharing their FP32
run), one parent's interventions from one step. Whatever builds units (the
campaign, a sweep, the figures, an ensemble) describes each by
:class:`WorkUnit`: a ``name`` to show, a ``cost`` to order by, the store
``keys`` it writes and a picklable ``fn`` with ``args``. Executors call
``fn(*args, store=STORE, progress=BOOL)``; it trains into the run store
(``STORE``, a folder, or ``None``: memory only, in-process executors only)
with the store's own atomic promote and returns what it trained (the runs;
an executor in another process or on another machine drops the return
value, and the caller reads the store instead: the store is the source of
truth). ``fn`` must be a module-level function (pickled by reference) and
its arguments plain data, so a job on another host can run it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from mx_proxy.store import checkpoint as ckpt
from mx_proxy.store import files
from mx_proxy.store import run_store as _store

__all__ = ["WorkUnit", "Work", "Executor", "Failure", "UnitsFailed", "stored", "newest_checkpoint", "OnUnit"]


@runtime_checkable
class WorkUnit(Protocol):
    """One unit of work (see the module docstring); :class:`Work` and
    :class:`mx_proxy.experiments.parallel.Unit` are two."""

    name: str
    cost: float
    keys: tuple[str, ...]

    @property
    def fn(self) -> Callable[..., Any]: ...

    @property
    def args(self) -> tuple: ...


@dataclasses.dataclass(frozen=True)
class Work:
    """A unit of work as plain data: ``fn(*args, store=..., progress=...)``
    trains the runs of store ``keys``; ``cost`` (any unit, e.g. steps with a
    paired run counted twice) orders units, costliest first; ``labels``:
    optional names of its runs (a campaign's results labels), for status."""

    name: str
    cost: float
    fn: Callable[..., Any]
    args: tuple = ()
    keys: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()


OnUnit = Callable[[WorkUnit, Any], None]


@dataclasses.dataclass(frozen=True)
class Failure:
    """A unit whose job did not finish: its ``state`` (the scheduler's, e.g.
    ``FAILED``, ``CANCELLED``, ``TIMEOUT``), ``job`` id, ``log`` (its files)
    and the last lines of its log (``tail``)."""

    unit: str
    state: str
    job: str | None = None
    log: tuple[str, ...] = ()
    tail: str = ""

    def describe(self) -> str:
        where = f" (job {self.job}, {self.state})" if self.job else f" ({self.state})"
        lines = [f"{self.unit}{where}" + (f"; log: {', '.join(self.log)}" if self.log else "")]
        lines += [f"    | {line}" for line in self.tail.splitlines()]
        return "\n".join(lines)


class UnitsFailed(RuntimeError):
    """Some units did not finish (the others did, and are in the store);
    ``failures``: one :class:`Failure` each. Rerunning the same command
    resumes them from their newest checkpoints."""

    def __init__(self, failures: Sequence[Failure]):
        self.failures = list(failures)
        super().__init__(f"{len(self.failures)} unit(s) did not finish (the others did); rerun the same command to "
                         f"resume them from their newest checkpoints:\n"
                         + "\n".join(f.describe() for f in self.failures))


class Executor(Protocol):
    """Runs units of work into a run store.

    ``name``: ``local`` or ``slurm``. ``concurrent``: units may run at the
    same time (then a caller hands over everything it can at once).
    ``run`` returns when every unit finished or failed: it calls
    ``on_start(unit, None)`` when a unit starts (or is submitted) and
    ``on_done(unit, result)`` when one finishes (``result``: ``fn``'s return
    value in this process, else ``None``: read the store), and returns the
    :class:`Failure` of each unit that did not finish (an in-process
    executor raises the unit's own exception instead)."""

    name: str
    concurrent: bool

    def run(self, units: Sequence[WorkUnit], store: str | Path | None, *, on_start: OnUnit | None = None,
            on_done: OnUnit | None = None, progress: bool = True,
            log: Callable[[str], None] = print) -> list[Failure]: ...


def stored(store: str | Path | None, keys: Sequence[str]) -> bool:
    """Whether every run of ``keys`` is finished in ``store`` by this code
    (an entry made by other code is stale and would be trained again)."""
    st = _store.resolve(store)
    if st is None or not keys:
        return False
    for key in keys:
        if not st.has(key):
            return False
        try:
            if files.read_meta(st.path(key)).get("code_version") != _store.code_version():
                return False
        except files.EntryError:
            return False
    return True


def newest_checkpoint(store: str | Path, keys: Sequence[str]) -> int | None:
    """The step of the newest checkpoint any training folder of ``keys`` in
    ``store`` holds (where the unit resumes), or ``None``."""
    root = Path(store)
    steps = [s for k in keys for d in root.glob(f"{k}.partial-*") for s in ckpt.steps(d / "checkpoints")]
    return max(steps) if steps else None
