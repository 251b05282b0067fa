"""The run store: every finished run in a folder keyed by a hash of its config.

Layout of ``<root>/<key>/`` (``key`` = :meth:`mxp.Config.hash` for a run
trained from scratch; an intervention's key hashes its config, parent and
step, see :func:`entry_key`):

- ``config.json`` — the full config (``Config.to_dict``);
- ``metrics.parquet`` — ``Run.metrics``, one row per step (:mod:`mx_proxy.store.tables`' compact format);
- ``params.npz`` — final student parameters (``block_0/fc1`` … keys);
- ``checkpoints/`` — orbax checkpoints (see :mod:`mx_proxy.store.checkpoint`);
- ``run.json`` — diverged_at, wall time, provenance and the code version
  (:func:`mx_proxy.training.code_version.code_version`: a hash of the source of
  every subpackage that decides a run's numbers, ``code_version.SOURCES``:
  numerics, pallas, nn, training and runner), written last.

A run trains in ``<root>/<key>.partial-<pid>@<host>/``, a folder of the training
process's own (its checkpoints land there), and is promoted to
``<root>/<key>/`` only when complete, under a per-key file lock
(:mod:`mx_proxy.store.promote`: crash-safe at every step; a later process
finishes what a killed one left halfway). Several processes training the
same config into one store never crash or corrupt it (the first to finish
wins; the others' identical results are dropped). A later process adopts
the training folder of a killed one, so an interrupted run resumes from its
last checkpoint. Only this host's dead processes can be told apart from
live ones; a scheduler's job, which knows that no other job trains its runs
(on any host), claims their keys (:func:`claim`) and adopts their training
folders whoever left them.

Loading verifies an entry (:func:`mx_proxy.store.files.read_entry`, the one
reader of every file): its config must hash to its key (an edited
``config.json`` is reported, not silently returned as the answer to another
config), its files must parse and have their types, columns, shapes and
sizes, and its code version must be this code's (a stale entry is retrained,
and kept until its replacement exists). A damaged or edited entry is moved
aside to ``<key>.damaged-<id>/`` with one :class:`StoreWarning` naming the
file and what is wrong; the run then resumes from that entry's newest good
checkpoint, or trains again. Files are written atomically and fsync'ed; a
save that fails anyway writes the run elsewhere and raises :class:`SaveError`
saying where. docs/store.md tabulates these guarantees.

Why Parquet (pyarrow) rather than NetCDF (xarray): the metrics are a flat
table (step × named scalar columns, per-block values already split into
``name/block_i`` columns), which is exactly Parquet's model; it keeps float32
columns bit for bit, is compressed and columnar, is read natively by pandas,
polars, DuckDB and Arrow, and pyarrow is a single wheel already required.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import uuid
import warnings
from pathlib import Path

import numpy as np

from mx_proxy.store import checkpoint as ckpt
from mx_proxy.store import durable, files, promote, tables
from mx_proxy.training.code_version import code_version
from mx_proxy.training.config import Config
from mx_proxy.training.result import Run
from mx_proxy.version import __version__

__all__ = ["Store", "StoreWarning", "SaveError", "resolve", "code_version", "entry_key", "load_dir", "claim"]

_CLAIMED: set[str] = set()


def claim(keys) -> None:
    """Declare that this process alone trains the runs of ``keys`` (a
    scheduler's job, whose submitter runs one job per unit at a time): their
    training folders left by any other process, on any host, are then taken
    for orphans and adopted (resumed from their newest checkpoint)."""
    _CLAIMED.update(keys)

StoreWarning = files.StoreWarning


class SaveError(OSError):
    """A trained run that could not be written into its store. ``run`` holds
    it (in memory) and ``kept`` names the folder it was written to instead
    (``None`` when that failed too)."""

    def __init__(self, message, run: Run, kept: Path | None):
        super().__init__(message)
        self.run, self.kept = run, kept

    def __str__(self):
        return self.args[0]


def entry_key(config: Config, parent: str | None = None, at_step: int | None = None,
              perturbation: dict | None = None) -> str:
    """The store key of a run: its config hash, or for an intervention a hash
    of (config, parent key, step), and for an ensemble's branch member also
    of its ``perturbation`` (seed and ε)."""
    if parent is None:
        return config.hash()
    what = {"config": config.to_dict(), "parent": parent, "at_step": int(at_step)}
    if perturbation is not None:
        what["perturbation"] = perturbation
    blob = json.dumps(what, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def resolve(store) -> Store | None:
    """A :class:`Store` for ``store`` (a folder path or a Store), or ``None``
    (keep results in memory) for ``None``/``False``."""
    if store is None or store is False:
        return None
    if isinstance(store, Store):
        return store
    if isinstance(store, (str, os.PathLike)):
        if not str(os.fspath(store)).strip():
            raise ValueError("store must name a folder, got an empty path; pass store=None (or --store off) to "
                             "keep results in memory")
        return Store(store)
    raise ValueError(f"store must be a folder path, an mx_proxy.store.run_store.Store, or None (memory only), "
                     f"got {store!r}")


def _write_entry(d: Path, run: Run, meta: dict) -> None:
    """Write the files of ``run`` into folder ``d``, each atomically and
    durably, ``run.json`` last."""
    d.mkdir(parents=True, exist_ok=True)
    durable.atomic_write(d / "config.json",
                         lambda p: p.write_text(json.dumps(run.config.to_dict(), indent=1, sort_keys=True)))
    tables.write(d / "metrics.parquet", run.metrics)

    def write_params(p):
        with open(p, "wb") as f:
            np.savez(f, **files.flatten(run.params))
    durable.atomic_write(d / "params.npz", write_params)
    durable.atomic_write(d / "run.json", lambda p: p.write_text(json.dumps(meta, indent=1, sort_keys=True,
                                                                           default=str)))


class Store:
    """A results folder; see the module docstring."""

    def __init__(self, root):
        self.root = durable.checked_path(root, "run store", folder=True)

    def __repr__(self):
        return f"Store({str(self.root)!r})"

    def path(self, key: str) -> Path:
        return self.root / key

    def partial(self, key: str) -> Path:
        """Where this process trains the run of ``key`` until it is complete."""
        return self.root / f"{key}.partial-{durable.mark()}"

    def checkpoint_dir(self, key: str) -> Path:
        """Checkpoints of a run this process is training (``<key>.partial-<pid>@<host>/checkpoints``)."""
        return self.partial(key) / "checkpoints"

    def _orphans(self, key: str) -> list[Path]:
        """Training folders of ``key`` left by processes that are gone."""
        claimed = [p for p in self.root.glob(f"{key}.partial-*")
                   if key in _CLAIMED and p.name.rsplit(".partial-", 1)[1] != durable.mark()]
        return list(dict.fromkeys(promote.orphans(self.root, key) + claimed))  # another host's too, once claimed

    def has(self, key: str) -> bool:
        return (self.path(key) / "run.json").exists()

    def stale(self, key: str) -> bool:
        """Whether the entry ``key`` exists and was made by other numerics code (:meth:`load` would report it
        and return ``None``); read from its ``run.json`` alone, nothing reported."""
        try:
            return self.has(key) and files.read_meta(self.path(key))["code_version"] != code_version()
        except files.EntryError:
            return False

    def keys(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if (p / "run.json").exists() and "." not in p.name)

    def check_writable(self, key: str | None = None):
        """Raise a ValueError naming the place at fault unless runs can be
        written there: the folder, its ``.locks`` and, given a ``key``, the
        entry's path (checked before any training, so no result is thrown away)."""
        where = self.root
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            for where in [self.root, self.root / ".locks"]:
                where.mkdir(exist_ok=True)
                probe = where / durable.tmp_name("probe")
                probe.write_text("")
                probe.unlink()
            if key is not None:
                for where in (self.path(key), self.root / ".locks" / f"{key}.lock"):
                    if where.exists() and where.is_dir() == where.name.endswith(".lock"):
                        raise NotADirectoryError(0, "a file, not a folder" if where.is_file() else
                                                 "a folder, not a lock file")
        except OSError as e:
            raise ValueError(f"run store {self.root} is not writable: {where} ({e.strerror or e}); pass another "
                             f"folder, or store=None to keep results in memory") from None

    def clean(self) -> list[Path]:
        """Finish the promotions killed processes left halfway
        (:func:`mx_proxy.store.promote.recover`), then remove their leftovers
        in the store, its entries and their checkpoint folders (see
        :func:`mx_proxy.store.checkpoint.clean`); returns what was removed."""
        if not self.root.is_dir():
            return []
        removed = []
        for key in promote.pending(self.root):
            with promote.lock(self.root, key):
                removed += promote.recover(self.root, key,
                                           lambda key=key: self._usable(key, quiet=True)[0] is not None)
        removed += ckpt.clean(self.root)
        for d in self.root.iterdir():
            if d.is_dir():
                removed += ckpt.clean(d) + ckpt.clean(d / "checkpoints")
        for d in self.root.glob("*.partial-*"):  # a killed run with no checkpoint and no result holds nothing
            if d in self._orphans(d.name.rsplit(".partial-", 1)[0]) and not ckpt.steps(d / "checkpoints") \
                    and not (d / "run.json").exists():
                durable.discard(d)
                removed.append(d)
        return removed

    def prepare(self, key: str, *, fresh: bool) -> Path:
        """This process's training folder of ``key``. Unless ``fresh`` (a
        forced retrain), it adopts the folder of a killed process that trained
        the same run (the one with the latest checkpoint), or else the
        checkpoints of an entry moved aside as damaged, so the run resumes;
        a damaged checkpoint is moved aside (with a :class:`StoreWarning`)
        and checkpoints made by other code are dropped."""
        part = self.partial(key)
        if fresh:
            durable.discard(part)
        elif not part.exists():
            for orphan in sorted(self._orphans(key), key=lambda p: max(ckpt.steps(p / "checkpoints"), default=-1),
                                 reverse=True):
                try:
                    os.rename(orphan, part)  # atomic: of two processes adopting it, one wins
                    break
                except OSError:
                    continue
        part.mkdir(parents=True, exist_ok=True)
        cdir = part / "checkpoints"
        if not fresh and not ckpt.steps(cdir):
            self._adopt_set_aside(key, cdir)
        for step in ckpt.steps(cdir):
            try:
                m = ckpt.meta(cdir, step)
            except files.EntryError as e:
                ckpt.set_aside(cdir, step, str(e))
                continue
            if m.get("code_version") != code_version():
                durable.discard(ckpt.step_dir(cdir, step))
        return part

    def _adopt_set_aside(self, key: str, cdir: Path) -> None:
        """Move the checkpoints of the newest entry of ``key`` moved aside as
        damaged into ``cdir`` (this process's, holding none)."""
        for aside in sorted(self.root.glob(f"{key}.damaged-*"), key=lambda p: p.stat().st_mtime, reverse=True):
            if ckpt.steps(aside / "checkpoints"):
                shutil.rmtree(cdir, ignore_errors=True)  # empty: no checkpoint of its own
                durable.rename(aside / "checkpoints", cdir)
                return

    def save(self, run: Run, key: str) -> Run:
        """Write ``run`` as the entry ``key`` (see the module docstring);
        returns it with ``path`` and ``info["key"]`` set. If it cannot be
        written (a full disk, a folder gone), it is written to a fresh folder
        under the system's temporary folder instead and a :class:`SaveError`
        says where (its ``run`` holds the result in memory)."""
        part = self.partial(key)
        info = dict(run.info, key=key)
        meta = {"diverged_at": run.diverged_at, "wall_time_s": float(run.wall_time_s), "info": info,
                "proxy_version": __version__, "code_version": code_version()}
        try:
            _write_entry(part, run, meta)
            with promote.lock(self.root, key):
                final = promote.promote(self.root, key, part, self._usable(key, quiet=True)[0] is not None)
        except OSError as e:
            run.info = info
            kept = None
            try:
                kept = Path(tempfile.mkdtemp(prefix=f"proxy-unsaved-{key}-"))
                _write_entry(kept, run, meta)
            except OSError:
                kept = None
            where = f"it is kept in {kept} (mxp.load that folder, or copy it into the store as {key}/)" \
                if kept is not None else "it could not be written anywhere and is kept only in memory (SaveError.run)"
            raise SaveError(f"could not save run {key} into {self.root} ({e.strerror or e}); {where}", run,
                            kept) from e
        run.info = info
        run.path = str(final)
        return run

    def load(self, key: str) -> Run | None:
        """The stored run of ``key``, or ``None`` if there is no usable entry.
        A stale one (made by other numerics code) is reported with a
        :class:`StoreWarning` and kept until its replacement exists; a damaged
        or edited one is reported and moved aside (see the module docstring)."""
        run, problem, stale = self._usable(key, quiet=False)
        if problem is None or stale:
            return run
        with promote.lock(self.root, key):
            run, problem, _ = self._usable(key, quiet=True)  # another process may have replaced it meanwhile
            if problem is None:
                return run
            aside = self.root / f"{key}.damaged-{uuid.uuid4().hex[:8]}"
            durable.rename(self.path(key), aside)
        warnings.warn(f"run store entry {self.path(key)}: {problem}; moved aside to {aside.name}, training it again "
                      f"(from its newest good checkpoint, if any)", StoreWarning, stacklevel=3)
        return None

    def _usable(self, key: str, quiet: bool):
        """(run or None, what is wrong or None, whether it is stale) of the entry ``key``."""
        d = self.path(key)
        if not (d / "run.json").exists():
            return None, None, False
        try:
            meta = files.read_meta(d)
            if meta["code_version"] != code_version():
                if not quiet:
                    warnings.warn(f"run store entry {d}: made by other numerics code (stale; kept until the new "
                                  f"run replaces it); training it again", StoreWarning, stacklevel=4)
                return None, "stale", True
            run = files.read_entry(d, meta)
        except files.EntryError as e:
            return None, f"damaged or incomplete: {e}", False
        expected = _expected_key(run)
        if expected != key:
            return None, f"its config.json hashes to {expected}, not to its key (edited?)", False
        return run, None, False


def _expected_key(run: Run) -> str:
    iv = run.info.get("intervention") or {}
    if run.info.get("parent"):
        return entry_key(run.config, run.info.get("parent"), iv.get("at_step"), run.info.get("perturbation"))
    return run.config.hash()


def load_dir(d) -> Run:
    """Load a stored run from its folder (``<root>/<key>``), every file
    verified. Raises a ValueError on a missing, damaged or incomplete entry
    and on one whose ``config.json`` no longer hashes to its key (edited);
    an entry made by other numerics code loads with a :class:`StoreWarning`
    (its numbers are not this code's; ``intervene`` refuses to continue it)."""
    d = durable.checked_path(d, "run folder", folder=True)
    meta = files.read_meta(d)
    run = files.read_entry(d, meta)
    expected, recorded = _expected_key(run), run.info.get("key", d.name)
    if expected != recorded:
        raise files.EntryError(f"{d / 'config.json'} hashes to {expected}, not to the run's key {recorded} "
                               f"(edited?); train that config instead")
    if meta["code_version"] != code_version():
        warnings.warn(f"run {d} was made by other numerics code (code version {meta['code_version']}, this code "
                      f"is {code_version()}): its numbers may differ from this code's", StoreWarning, stacklevel=2)
        run.info["stale"] = True
    return run
