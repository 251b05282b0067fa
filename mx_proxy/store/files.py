"""The files of a run-store entry: durable writes and one verified reader.

Every file of an entry (``run.json``, ``config.json``, ``metrics.parquet``,
``params.npz``) is written by :func:`atomic_write` (a temporary sibling,
fsync'ed, renamed into place, the folder fsync'ed) and read back only by
:func:`read_entry`, which checks each one: ``run.json`` is an object whose
fields have their types, the config parses, the metrics hold exactly the
rows a run of that config (and divergence) has, one per step from 0, and the
parameters exist. Any failure is an :class:`EntryError` (a ValueError)
naming the file at fault.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd

from mx_proxy.training.config import Config
from mx_proxy.training.result import Run

__all__ = ["EntryError", "atomic_write", "fsync_dir", "read_meta", "read_entry", "flatten", "unflatten", "mark",
           "owner_gone", "tmp_name"]

_TMP = ".tmp-"
_HOST = "".join(c if c.isalnum() else "_" for c in socket.gethostname()) or "host"


def mark() -> str:
    """This process's mark in the names of what it writes: ``<pid>@<host>``."""
    return f"{os.getpid()}@{_HOST}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def owner_gone(text: str) -> bool:
    """Whether the process of mark ``text`` (``<pid>@<host>``, or a bare
    ``<pid>`` of this host) is gone: only a process of this host can be
    judged, so another host's marks are never taken for dead ones."""
    pid, _, host = text.partition("@")
    if not pid.isdigit() or (host and host != _HOST):
        return False
    return int(pid) != os.getpid() and not _pid_alive(int(pid))


class EntryError(ValueError):
    """A run-store entry (or one of its files) that is missing, damaged or inconsistent."""


def tmp_name(final: str) -> str:
    """A temporary sibling name of ``final`` owned by this process."""
    return f"{_TMP}{mark()}-{uuid.uuid4().hex[:8]}-{final}"


def fsync_dir(path) -> None:
    """Make a rename inside folder ``path`` durable (best effort where the
    file system cannot fsync a folder)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, write) -> None:
    """``write(tmp_path)``, fsync it, rename it onto ``path`` and fsync the
    folder: ``path`` holds the old content or the whole new one, never part."""
    path = Path(path)
    tmp = path.with_name(tmp_name(path.name))
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def flatten(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, name + "/"))
        else:
            out[name] = np.asarray(v)
    return out


def unflatten(flat):
    tree: dict = {}
    for name, v in flat.items():
        node = tree
        *parents, leaf = name.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v
    return tree


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# run.json: field -> (check, what it must be)
_META = {
    "diverged_at": (lambda v: v is None or (_is_int(v) and v >= 0), "null or a step (integer >= 0)"),
    "wall_time_s": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    "info": (lambda v: isinstance(v, dict), "an object"),
    "code_version": (lambda v: isinstance(v, str), "a string"),
}


def _damaged(path: Path, e: Exception) -> EntryError:
    return EntryError(f"{path} is damaged ({type(e).__name__}: {e})")


def read_meta(d) -> dict:
    """The verified ``run.json`` of entry folder ``d``."""
    path = Path(d) / "run.json"
    if not path.exists():
        raise EntryError(f"{d} is not a complete stored run (no run.json)")
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise _damaged(path, e) from None
    if not isinstance(meta, dict):
        raise EntryError(f"{path} is damaged (a JSON {type(meta).__name__}, not an object)")
    for name, (ok, what) in _META.items():
        if name not in meta or not ok(meta[name]):
            raise EntryError(f"{path} is damaged ({name!r} must be {what}, got {meta.get(name, 'nothing')!r})")
    return meta


def _read_config(path: Path) -> Config:
    try:
        raw = json.loads(path.read_text())
        if not isinstance(raw, dict):
            raise ValueError(f"a JSON {type(raw).__name__}, not an object")
        return Config.from_dict(raw)
    except (OSError, ValueError, TypeError) as e:
        raise _damaged(path, e) from None


def _read_metrics(path: Path, config: Config, diverged_at) -> pd.DataFrame:
    try:
        metrics = pd.read_parquet(path)
    except Exception as e:  # OSError, or pyarrow's own error types for a truncated file
        raise _damaged(path, e) from None
    rows = config.steps if diverged_at is None else min(diverged_at + 1, config.steps)
    if "step" not in metrics or len(metrics) != rows \
            or not np.array_equal(metrics["step"].to_numpy(), np.arange(rows)):
        raise EntryError(f"{path} is incomplete: {len(metrics)} rows, a run of {config.steps} steps"
                         f"{'' if diverged_at is None else f' diverged at {diverged_at}'} has {rows}, one per step "
                         f"from 0")
    return metrics


def _read_params(path: Path):
    if not path.exists():
        raise EntryError(f"{path.parent} is incomplete (no params.npz)")
    try:
        with np.load(path) as z:
            return unflatten({k: z[k] for k in z.files})
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as e:
        raise _damaged(path, e) from None


def read_entry(d, meta: dict | None = None) -> Run:
    """The stored run in folder ``d``, every file verified (see the module
    docstring); raises :class:`EntryError` naming the file at fault."""
    d = Path(d)
    meta = read_meta(d) if meta is None else meta
    config = _read_config(d / "config.json")
    metrics = _read_metrics(d / "metrics.parquet", config, meta["diverged_at"])
    params = _read_params(d / "params.npz")
    return Run(config, metrics, meta["diverged_at"], params, float(meta["wall_time_s"]), meta["info"], path=str(d))
