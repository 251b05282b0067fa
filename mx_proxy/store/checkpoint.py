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
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import threading
import warnings
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pandas as pd

from mx_proxy.store.files import fsync_dir, owner_gone, tmp_name
from mx_proxy.training.engine import Program, TrainState

__all__ = ["save", "restore", "drop", "steps", "step_dir", "template", "clean", "CheckpointSink", "CheckpointError", "CheckpointWarning"]


class CheckpointError(ValueError):
    """A checkpoint that cannot be restored (damaged, truncated, foreign); the message names it."""


class CheckpointWarning(UserWarning):
    """A checkpoint folder holds something that is not a checkpoint, or a damaged one that was skipped."""


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


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (on this host)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
        if owner_gone(p.name[len(_TMP):].split("-", 1)[0]):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def save(directory, step: int, state: TrainState, metrics: pd.DataFrame | None = None, meta: dict | None = None):
    """Save the train state before ``step`` (and the metrics so far) atomically.
    An existing checkpoint of that step is kept (see the module docstring)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = step_dir(directory, step)
    tmp = directory / tmp_name(final.name)
    with _deferred_interrupt():
        tmp.mkdir()
        try:
            state = jax.device_get(state)
            with ocp.StandardCheckpointer() as ckptr:
                ckptr.save((tmp / "state").absolute(), state)
                ckptr.wait_until_finished()
            if metrics is not None:
                metrics.to_parquet(tmp / "metrics.parquet", index=False)
            (tmp / "meta.json").write_text(json.dumps({"step": int(step), **(meta or {})}, sort_keys=True))
            for f in tmp.rglob("*"):  # durable before the rename makes the checkpoint visible
                if f.is_file():
                    with open(f, "rb+") as fh:
                        os.fsync(fh.fileno())
            try:
                os.rename(tmp, final)
                fsync_dir(directory)
            except OSError as e:  # the step exists: another writer finished it first
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def drop(directory, step: int) -> None:
    """Delete the checkpoint at ``step`` (a damaged one, or one no longer needed)."""
    shutil.rmtree(step_dir(directory, step), ignore_errors=True)


def steps(directory) -> list[int]:
    """The steps with a complete checkpoint under ``directory`` (sorted)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    out = []
    for p in directory.iterdir():
        if p.name.startswith(_TMP):
            continue
        digits = p.name[len(_PREFIX):]
        if not (p.name.startswith(_PREFIX) and digits.isdigit() and p.is_dir()):
            warnings.warn(f"{p} is not a checkpoint (expected step_<digits>/ folders only); ignored",
                          CheckpointWarning, stacklevel=2)
        elif (p / "meta.json").exists():
            out.append(int(digits))
    return sorted(out)


def meta(directory, step: int) -> dict:
    """The ``meta.json`` of the checkpoint at ``step`` ({} if unreadable)."""
    try:
        return json.loads((step_dir(directory, step) / "meta.json").read_text())
    except (OSError, ValueError):
        return {}


def restore(directory, step: int, target: TrainState) -> tuple[TrainState, pd.DataFrame | None]:
    """(state, metrics before ``step``) of the checkpoint at ``step``;
    ``target`` is the abstract state (see :func:`template`)."""
    path = step_dir(directory, step)
    if not (path / "meta.json").exists():
        raise ValueError(f"no checkpoint at step {step} in {directory}; available: {steps(directory) or 'none'}")
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), target)
    try:
        m = json.loads((path / "meta.json").read_text())
        if not isinstance(m, dict) or m.get("step") != step:
            raise ValueError(f"meta.json {m!r} is not that of step {step}")
        with _deferred_interrupt(), ocp.StandardCheckpointer() as ckptr:
            state = ckptr.restore((path / "state").absolute(), abstract)
        state = jax.tree.map(np.asarray, state)
        bad = [a.shape for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(abstract)) if a.shape != b.shape]
        if bad or jax.tree.structure(state) != jax.tree.structure(abstract):
            raise ValueError("its state does not have this run's shapes")
        metrics = pd.read_parquet(path / "metrics.parquet") if (path / "metrics.parquet").exists() else None
        if metrics is not None and (len(metrics) != step or "step" not in metrics
                                    or not np.array_equal(metrics["step"].to_numpy(), np.arange(step))):
            raise ValueError(f"metrics.parquet has {len(metrics)} rows, not one per step before {step}")
    except KeyboardInterrupt:
        raise
    except Exception as e:  # orbax, tensorstore, pyarrow and json raise their own types for damaged files
        raise CheckpointError(f"checkpoint {path} is damaged ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]})") \
            from None
    return state, metrics


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

    def restore(self, step: int, target: TrainState):
        if self.directory is not None:
            return restore(self.directory, step, target)
        if step not in self.memory:
            raise ValueError(f"no checkpoint at step {step}; available: {sorted(self.memory) or 'none'}")
        state, metrics = self.memory[step]
        return state, None if metrics is None else metrics.copy()
