"""Checkpoints of a run's train state, saved with orbax-checkpoint.

A checkpoint at step ``t`` holds the state *before* step ``t`` runs (after
steps 0 … t−1): student parameters, optimizer state, the previous loss and the
divergence flags, and, with a paired reference run, its parameters and
optimizer state. The data stream needs no saved PRNG state: the batch of step
``t`` is a pure function of the config's data seed and ``t`` (see
:mod:`mx_proxy.training.data`), so a resumed run sees the very same batches. The metrics
recorded up to ``t`` are kept beside the state, so an interrupted run can
resume and still return its whole history.

On disk (``<folder>/step_<t>/``): ``state/`` (orbax ``StandardCheckpointer``),
``metrics.parquet`` and ``meta.json`` (written last). A checkpoint is
assembled under a temporary name holding the writer's process id and renamed
into place; if the step already exists (another process training the same
config got there first: the content is the same, a run being deterministic),
the new copy is dropped, so several processes never crash on, nor corrupt,
one checkpoint folder. Leftovers of killed writers are removed by
:func:`clean`. Runs kept in memory hold the same ``(state, metrics)`` pairs
in :attr:`mxp.Run.checkpoints`.

Reading one checks every file before use (:mod:`mx_proxy.store.files`):
``meta.json`` against its schema and step, the state's tree and shapes
against the run's, the metrics' rows and columns against the steps before
it and the config. A checkpoint that fails is a :class:`CheckpointError`
naming it; :func:`set_aside` moves it out of the way (never deletes it). A
write that fails (a full disk) is an OSError naming the checkpoint. orbax
and tensorstore report such failures from their own threads and asyncio
loops (``ERROR:absl`` records with tracebacks, "Event loop is closed"
tracebacks long after the call returned); that noise is held back, so a
failure is the one message its caller turns into a warning.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
import uuid
import warnings
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pandas as pd

from mx_proxy.store import durable, files, tables
from mx_proxy.training.config import Config
from mx_proxy.training.engine import Program, TrainState

__all__ = ["save", "restore", "drop", "steps", "step_dir", "template", "clean", "meta", "set_aside", "CheckpointSink",
           "CheckpointError", "CheckpointWarning"]


class CheckpointError(files.EntryError):
    """A checkpoint that cannot be restored (damaged, truncated, foreign); the message names it."""


class CheckpointWarning(files.StoreWarning):
    """A checkpoint folder holds something that is not a checkpoint, or a damaged one that was moved aside."""


class _HoldRecords(logging.Filter):
    """Holds the records of a logger while an orbax call runs."""

    def __init__(self):
        super().__init__()
        self.held = []

    def filter(self, record):
        self.held.append(record)
        return False


def _drop_closed_loop_noise(previous):
    """An unraisable-exception hook that drops the "Event loop is closed"
    RuntimeErrors tensorstore's callbacks raise into orbax's closed asyncio
    loops after a failed read or write, and passes everything else on."""
    def hook(unraisable):
        e = unraisable.exc_value
        if isinstance(e, RuntimeError) and str(e) == "Event loop is closed":
            return
        previous(unraisable)
    hook.drops_closed_loop_noise = True
    return hook


class _DropOrbaxTasks(logging.Filter):
    """Drops asyncio's "Task exception was never retrieved" records of
    orbax's own tasks, logged when a failed write's tasks are collected."""

    def filter(self, record):
        return not ("never retrieved" in record.getMessage() and "/orbax/" in record.getMessage())


_DROP_ORBAX_TASKS = _DropOrbaxTasks()


@contextlib.contextmanager
def _quiet_orbax():
    """Run an orbax call with its failure noise held back (see the module
    docstring): absl records are replayed if the call succeeds, dropped if
    it fails; the late "Event loop is closed" reports and asyncio's records
    of orbax's failed tasks are dropped."""
    if not getattr(sys.unraisablehook, "drops_closed_loop_noise", False):
        sys.unraisablehook = _drop_closed_loop_noise(sys.unraisablehook)
    logging.getLogger("asyncio").addFilter(_DROP_ORBAX_TASKS)  # a no-op when it is already there
    absl = logging.getLogger("absl")
    hold = _HoldRecords()
    absl.addFilter(hold)
    try:
        yield
    except BaseException:
        absl.removeFilter(hold)
        raise
    absl.removeFilter(hold)
    for record in hold.held:
        absl.handle(record)


@contextlib.contextmanager
def _deferred_interrupt():
    """Hold a Ctrl-C (SIGINT) that arrives inside the block until it ends:
    a checkpoint is written whole or not at all, and orbax's writer threads
    are never torn down mid-write (no traceback of theirs)."""
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda *a: caught.append(a))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt

_PREFIX = "step_"
_TMP = ".tmp-"


def step_dir(directory: Path, step: int) -> Path:
    """The folder of the checkpoint at ``step`` under ``directory``."""
    return Path(directory) / f"{_PREFIX}{step:09d}"


def template(program: Program, dyn) -> TrainState:
    """Abstract (shape/dtype) train state of ``program``: the restore target."""
    state, _ = jax.eval_shape(program.init, dyn)
    return state


def clean(directory) -> list[Path]:
    """Remove leftovers of killed writers (``.tmp-<pid>@<host>-…`` entries
    whose process, on this host, is gone) directly under ``directory``;
    returns what was removed."""
    directory = Path(directory)
    removed = []
    if not directory.is_dir():
        return removed
    for p in directory.iterdir():
        if not p.name.startswith(_TMP):
            continue
        if durable.owner_gone(p.name[len(_TMP):].split("-", 1)[0]):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def save(directory, step: int, state: TrainState, metrics: pd.DataFrame | None = None, meta: dict | None = None):
    """Save the train state before ``step`` (and the metrics so far) atomically.
    An existing checkpoint of that step is kept (see the module docstring).
    A write that fails is an OSError naming the checkpoint (nothing is left)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = step_dir(directory, step)
    tmp = directory / durable.tmp_name(final.name)
    with _deferred_interrupt():
        tmp.mkdir()
        try:
            _write(tmp, step, jax.device_get(state), metrics, meta)
            try:
                durable.rename(tmp, final)
            except OSError as e:  # the step exists: another writer finished it first
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
        except Exception as e:
            _remove_failed(tmp)
            code = e.errno if isinstance(e, OSError) and e.errno else errno.EIO
            raise OSError(code, f"could not write checkpoint {final} ({_first_line(e)})") from None
        except BaseException:
            _remove_failed(tmp)
            raise
    return final


def _remove_failed(tmp: Path, quiet_s: float = 0.5, limit_s: float = 3.0) -> None:
    """Delete the folder of a failed write, and again if it comes back: after
    a failed save tensorstore may still finish writes it had started (its file
    driver makes the parent folders), so the folder is gone only once it has
    stayed gone ``quiet_s`` seconds (at most ``limit_s`` in all)."""
    start = last_seen = time.monotonic()
    while True:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
            last_seen = time.monotonic()
        now = time.monotonic()
        if now - last_seen >= quiet_s or now - start >= limit_s:
            return
        time.sleep(0.05)


def drop(directory, step: int) -> None:
    """Delete the checkpoint at ``step`` (one no longer needed; a damaged one is :func:`set_aside`)."""
    shutil.rmtree(step_dir(directory, step), ignore_errors=True)


def _first_line(e: BaseException) -> str:
    text = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
    return f"{type(e).__name__}: {(text.splitlines() or [''])[0][:300]}"


def _write(tmp: Path, step: int, state, metrics, meta) -> None:
    """The files of a checkpoint in folder ``tmp``, fsync'ed, ``meta.json`` last."""
    with _quiet_orbax(), ocp.StandardCheckpointer() as ckptr:
        ckptr.save((tmp / "state").absolute(), state)
        ckptr.wait_until_finished()
    if metrics is not None:
        tables.to_file(metrics, tmp / "metrics.parquet")
    (tmp / "meta.json").write_text(json.dumps({"step": int(step), **(meta or {})}, sort_keys=True))
    for f in tmp.rglob("*"):  # durable before the rename makes the checkpoint visible
        if f.is_file():
            with open(f, "rb+") as fh:
                os.fsync(fh.fileno())


def steps(directory) -> list[int]:
    """The steps with a checkpoint under ``directory`` (sorted; each is
    checked when it is read). Names starting with a dot (leftovers being
    written, checkpoints moved aside) are skipped; anything else that is not
    a ``step_<digits>/`` folder is ignored with a warning naming it."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    out = []
    for p in directory.iterdir():
        if p.name.startswith("."):
            continue
        digits = p.name[len(_PREFIX):]
        if not (p.name.startswith(_PREFIX) and digits.isdigit() and p.is_dir()):
            warnings.warn(f"{p} is not a checkpoint (expected step_<digits>/ folders only); ignored",
                          CheckpointWarning, stacklevel=2)
        elif (p / "meta.json").exists():
            out.append(int(digits))
    return sorted(out)


def meta(directory, step: int) -> dict:
    """The verified ``meta.json`` of the checkpoint at ``step`` (a
    :class:`CheckpointError` naming it when damaged)."""
    path = step_dir(directory, step) / "meta.json"
    try:
        m = files.read_json(path, files.CHECKPOINT_META)
    except files.EntryError as e:
        raise CheckpointError(str(e)) from None
    if m["step"] != step:
        raise CheckpointError(f"{path} is damaged: it is the meta.json of step {m['step']}, not {step}")
    return m


def set_aside(directory, step: int, why: str) -> Path | None:
    """Move the checkpoint at ``step`` out of the way (to
    ``.damaged-<id>-step_<t>/`` beside it, kept for inspection) with one
    :class:`CheckpointWarning` saying ``why``; returns where it went."""
    path = step_dir(directory, step)
    aside = path.with_name(f".damaged-{uuid.uuid4().hex[:8]}-{path.name}")
    try:
        durable.rename(path, aside)
    except FileNotFoundError:  # another process moved it first
        return None
    warnings.warn(f"{why}; moved aside to {aside.name}, resuming from an earlier one", CheckpointWarning,
                  stacklevel=3)
    return aside


def restore(directory, step: int, target: TrainState, config: Config | None = None):
    """(state, metrics before ``step``) of the checkpoint at ``step``;
    ``target`` is the abstract state (see :func:`template`). Given the run's
    ``config``, its metrics are required and checked against it (a resumed
    run's history); otherwise they are returned when present (or None).
    Raises a :class:`CheckpointError` naming a checkpoint that fails a check."""
    path = step_dir(directory, step)
    if not (path / "meta.json").exists():
        raise ValueError(f"no checkpoint at step {step} in {directory}; available: {steps(directory) or 'none'}")
    meta(directory, step)
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), target)
    try:
        with _deferred_interrupt(), _quiet_orbax(), ocp.StandardCheckpointer() as ckptr:
            state = ckptr.restore((path / "state").absolute(), abstract)
        state = jax.tree.map(np.asarray, state)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # orbax and tensorstore raise their own types for damaged files
        raise CheckpointError(f"checkpoint {path} is damaged ({_first_line(e)})") from None
    bad = [a.shape for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(abstract)) if a.shape != b.shape]
    if bad or jax.tree.structure(state) != jax.tree.structure(abstract):
        raise CheckpointError(f"checkpoint {path} is damaged: its state does not have this run's shapes")
    metrics = None
    if config is not None or (path / "metrics.parquet").exists():
        try:
            metrics = _read_metrics(path / "metrics.parquet", step, config)
        except files.EntryError as e:
            raise CheckpointError(f"checkpoint {path} is damaged: {e}") from None
    return state, metrics


def _read_metrics(path: Path, step: int, config: Config | None) -> pd.DataFrame:
    if config is not None:
        return files.read_metrics(path, step, config)
    metrics = files.read_table(path)
    if len(metrics) != step or "step" not in metrics or not np.array_equal(metrics["step"].to_numpy(), np.arange(step)):
        raise files.EntryError(f"{path} has {len(metrics)} rows, not one per step before {step}")
    return metrics


class CheckpointSink:
    """Where a run's checkpoints go: a folder (orbax) or a dict (memory)."""

    def __init__(self, directory=None, memory: dict | None = None, keep_last: int | None = None):
        """``keep_last``: keep only that many newest checkpoints (those a
        resume needs), deleting older ones after each save; ``None`` keeps all."""
        self.directory = Path(directory) if directory is not None else None
        self.memory = memory if memory is not None else {}
        if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1):
            raise ValueError(f"keep_last must be a positive integer or None, got {keep_last!r}")
        self.keep_last = keep_last

    def save(self, step: int, state: TrainState, metrics: pd.DataFrame | None, meta: dict | None = None):
        if self.directory is not None:
            save(self.directory, step, state, metrics, meta)
        else:
            self.memory[int(step)] = (jax.device_get(state), None if metrics is None else metrics.copy())
        if self.keep_last is not None:
            for old in self.steps()[:-self.keep_last]:
                if self.directory is not None:
                    drop(self.directory, old)
                else:
                    del self.memory[old]

    def steps(self) -> list[int]:
        return steps(self.directory) if self.directory is not None else sorted(self.memory)

    def meta(self, step: int) -> dict:
        return meta(self.directory, step) if self.directory is not None else {}

    def restore(self, step: int, target: TrainState, config: Config | None = None):
        if self.directory is not None:
            return restore(self.directory, step, target, config)
        if step not in self.memory:
            raise ValueError(f"no checkpoint at step {step}; available: {sorted(self.memory) or 'none'}")
        state, metrics = self.memory[step]
        return state, None if metrics is None else metrics.copy()
