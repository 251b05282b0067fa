"""Promoting a finished run into its store entry, crash-safe at every step.

A run is written whole into its training folder ``<key>.partial-<mark>/``
(``run.json`` last), then, under the key's file lock, :func:`promote` makes
it the entry ``<key>/``: the entry it replaces (stale, damaged or forced) is
renamed to ``<key>.old-<id>-<mark>/``, the training folder to ``<key>/``,
and only then is the old one discarded (renamed to a temporary name, then
deleted). Each step is one rename, a fault point of
:mod:`mx_proxy.store.durable`. Whatever step a kill interrupts, a complete
run survives, and :func:`recover` (run by the next process that cleans the
store) finishes the job:

- the entry is gone but a complete training folder of a dead process holds
  the run: it becomes the entry;
- the entry is gone and nothing complete replaced it: the old entry comes back;
- the entry is there: old entries left beside it are discarded, and so is a
  complete training folder whose run the entry already holds usably; one
  whose entry is stale or damaged replaces it.

Legacy leftovers of the earlier promotion (``.tmp-<mark>-<id>-old-<key>``)
are handled like old entries, so a store killed under older code recovers too.
"""

from __future__ import annotations

import contextlib
import fcntl
import re
import uuid
from collections.abc import Callable
from pathlib import Path

from mx_proxy.store import durable, files

__all__ = ["lock", "promote", "recover", "pending", "orphans", "olds"]

_LEGACY_OLD = re.compile(r"^\.tmp-(?P<mark>[^-]+)-[0-9a-f]{8}-old-(?P<key>[^./]+)$")
_OLD = re.compile(r"^(?P<key>[^./]+)\.old-[0-9a-f]{8}-(?P<mark>[^-]+)$")


@contextlib.contextmanager
def lock(root: Path, key: str):
    """Hold the per-key file lock ``<root>/.locks/<key>.lock``."""
    locks = Path(root) / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{key}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def orphans(root: Path, key: str) -> list[Path]:
    """Training folders of ``key`` left by processes that are gone (a live
    process's, or another host's, are never taken)."""
    return [p for p in Path(root).glob(f"{key}.partial-*") if durable.owner_gone(p.name.rsplit(".partial-", 1)[1])]


def olds(root: Path, key: str | None = None) -> list[tuple[str, Path]]:
    """(key, folder) of the old entries that dead processes left while promoting (of ``key`` only, if given)."""
    out = []
    for p in Path(root).iterdir():
        m = _OLD.match(p.name) or _LEGACY_OLD.match(p.name)
        if m and p.is_dir() and (key is None or m["key"] == key) and durable.owner_gone(m["mark"]):
            out.append((m["key"], p))
    return out


def _complete(folder: Path) -> bool:
    """Whether ``folder`` holds a whole, verified run (its files as :func:`files.read_entry` checks them)."""
    try:
        files.read_entry(folder)
    except files.EntryError:
        return False
    return True


def pending(root: Path) -> list[str]:
    """Keys with something for :func:`recover` to do: an old entry or a
    training folder holding a run.json, left by a dead process."""
    keys = {k for k, _ in olds(root)}
    for p in Path(root).glob("*.partial-*"):
        key = p.name.rsplit(".partial-", 1)[0]
        if (p / "run.json").exists() and p in orphans(root, key):
            keys.add(key)
    return sorted(keys)


def promote(root: Path, key: str, part: Path, final_usable: bool) -> Path:
    """Make training folder ``part`` the entry ``<root>/<key>`` (the caller
    holds :func:`lock`); if the entry is already usable (another process
    finished first), ``part`` is discarded instead. Returns the entry's path."""
    final = Path(root) / key
    durable.fault("promote: locked")
    if final_usable:
        durable.discard(part)
        return final
    old = None
    if final.exists():
        old = Path(root) / f"{key}.old-{uuid.uuid4().hex[:8]}-{durable.mark()}"
        durable.rename(final, old)
    try:
        durable.rename(part, final)
    except OSError:
        if old is not None:  # put the previous entry back
            durable.rename(old, final)
        raise
    if old is not None:
        durable.discard(old)
    return final


def recover(root: Path, key: str, final_usable: Callable[[], bool]) -> list[Path]:
    """Finish a promotion of ``key`` that a killed process left halfway (see
    the module docstring; the caller holds :func:`lock`). ``final_usable()``
    says whether the entry as it is now is usable (whole, this code's).
    Returns the leftovers it removed."""
    final = Path(root) / key
    done = [p for p in orphans(root, key) if (p / "run.json").exists() and _complete(p)]
    left = [p for _, p in olds(root, key) if (p / "run.json").exists()]
    if not final.exists():
        if done:
            durable.rename(done.pop(0), final)
        elif left:
            durable.rename(max(left, key=lambda p: p.stat().st_mtime), final)
    removed = []
    for _, p in olds(root, key):
        durable.discard(p)
        removed.append(p)
    for p in done:
        if final_usable():
            durable.discard(p)
            removed.append(p)
        else:
            promote(root, key, p, False)
    return removed
