"""Durable, atomic file-system operations, and the hook tests kill them at.

Everything the project writes (run-store entries, checkpoints, ``sweep
--out``, figures, reports, campaign results) is written by
:func:`atomic_write`: a temporary sibling owned by this process, fsync'ed,
renamed into place, the folder fsync'ed, so a reader sees the old content or
the whole new one. A folder is removed by :func:`discard`: renamed to a
temporary name first, so a kill halfway through leaves only a leftover of a
dead process (which :func:`owner_gone` lets a later process remove), never a
half-deleted folder under a name that means something.

Every step goes through :func:`fault`, which calls :data:`FAULT_HOOK` with
the step's name when it is set: a test exits there (``os._exit`` in a forked
process) to play a process killed between any two file-system operations,
with no timing involved (``tests/store/test_promote_faults.py``).

:func:`checked_path` (:mod:`mx_proxy.training.paths`, re-exported here) turns a
user's path into an absolute one or a ValueError quoting it (an unknown
``~user``, a symbolic-link loop, a file where a folder should be), before
any work starts.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

from mx_proxy.training.paths import checked_path

__all__ = ["FAULT_HOOK", "fault", "mark", "owner_gone", "tmp_name", "is_tmp", "fsync_dir", "atomic_write",
           "rename", "discard", "checked_path", "write_output", "OutputError"]

TMP = ".tmp-"
_HOST = "".join(c if c.isalnum() else "_" for c in socket.gethostname()) or "host"

FAULT_HOOK: Callable[[str], None] | None = None
"""Called with the name of each file-system step about to run (tests only)."""


def fault(step: str) -> None:
    """The fault-injection point before file-system step ``step``."""
    if FAULT_HOOK is not None:
        FAULT_HOOK(step)


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


def tmp_name(final: str) -> str:
    """A temporary sibling name of ``final`` owned by this process."""
    return f"{TMP}{mark()}-{uuid.uuid4().hex[:8]}-{final}"


def is_tmp(name: str) -> bool:
    """Whether ``name`` is a temporary name (:func:`tmp_name`)."""
    return name.startswith(TMP)


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


def atomic_write(path, write) -> None:
    """``write(tmp_path)``, fsync it, rename it onto ``path`` and fsync the
    folder: ``path`` holds the old content or the whole new one, never part."""
    path = Path(path)
    tmp = path.with_name(tmp_name(path.name))
    try:
        fault(f"write {path.name}")
        write(tmp)
        fault(f"fsync {path.name}")
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        fault(f"rename {path.name}")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fault(f"fsync folder of {path.name}")
    fsync_dir(path.parent)


def rename(src: Path, dst: Path) -> None:
    """``os.rename(src, dst)`` and fsync ``dst``'s folder, a fault point before it."""
    fault(f"rename {Path(src).name} -> {Path(dst).name}")
    os.rename(src, dst)
    fsync_dir(Path(dst).parent)


def discard(path: Path) -> None:
    """Remove folder ``path``: renamed to a temporary name of this process
    first (atomic), then deleted, so a kill halfway leaves a leftover that
    :func:`owner_gone` marks, never part of a folder under its own name."""
    path = Path(path)
    if not path.exists():
        return
    doomed = path.with_name(tmp_name(path.name))
    try:
        rename(path, doomed)
    except FileNotFoundError:  # another process removed or moved it first
        return
    fault(f"delete {path.name}")
    shutil.rmtree(doomed, ignore_errors=True)


class OutputError(OSError):
    """An output file that could not be written; ``kept`` names where its
    content went instead (``None``: nowhere, it is only in memory)."""

    def __init__(self, message: str, kept: Path | None):
        super().__init__(message)
        self.kept = kept

    def __str__(self):
        return self.args[0]


def write_output(path, write, *, elsewhere: str = "") -> Path:
    """Write output file ``path`` atomically with ``write(tmp_path)``. If that
    fails (a full disk, no permission), the content is written to a fresh
    file under the system's temporary folder and an :class:`OutputError`
    says where (and ``elsewhere``: where else the results are, e.g. a run
    store); returns ``path``."""
    path = Path(path)
    try:
        atomic_write(path, write)
        return path
    except OSError as e:
        reason = e.strerror or str(e) or errno.errorcode.get(e.errno or 0, "error")
    kept = None
    try:
        fd, name = tempfile.mkstemp(prefix="proxy-unsaved-", suffix=f"-{path.name}")
        os.close(fd)
        kept = Path(name)
        write(kept)
    except OSError:
        if kept is not None:
            kept.unlink(missing_ok=True)
        kept = None
    where = f"written to {kept} instead" if kept is not None else "not written anywhere"
    raise OutputError(f"could not write {path} ({reason}); it was {where}" + (f"; {elsewhere}" if elsewhere else ""),
                      kept)
