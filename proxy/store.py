"""The run store: every finished run in a folder keyed by a hash of its config.

Layout of ``<root>/<key>/`` (``key`` = :meth:`proxy.Config.hash` for a run
trained from scratch; an intervention's key hashes its config, parent and
step, see :func:`entry_key`):

- ``config.json`` — the full config (``Config.to_dict``);
- ``metrics.parquet`` — ``Run.metrics``, one row per step;
- ``params.npz`` — final student parameters (``block_0/fc1`` … keys);
- ``checkpoints/`` — orbax checkpoints (see :mod:`proxy.checkpoint`);
- ``run.json`` — diverged_at, wall time, provenance and the code version (a
  hash of the numerics modules' source), written last.

A run trains in ``<root>/<key>.partial-<pid>/``, a folder of the training
process's own (its checkpoints land there), and is promoted to
``<root>/<key>/`` only when complete, under a per-key file lock: an older
entry (a stale one, made by other numerics code, or one being retrained with
``force``) is kept until its replacement exists, and several processes
training the same config into one store never crash or corrupt it (the first
to finish wins; the others' identical results are dropped). A later process
adopts the training folder of a killed one, so an interrupted run resumes
from its last checkpoint.

Loading verifies an entry: its config must hash to its key (an edited
``config.json`` is reported, not silently returned as the answer to another
config), its files must parse (a truncated file is reported), and its code
version must be this code's (a stale entry is retrained). Each problem is one
:class:`StoreWarning` naming the entry, and the run is trained again.

Why Parquet (pyarrow) rather than NetCDF (xarray): the metrics are a flat
table (step × named scalar columns, per-block values already split into
``name/block_i`` columns), which is exactly Parquet's model; it keeps float32
columns bit for bit, is compressed and columnar, is read natively by pandas,
polars, DuckDB and Arrow, and pyarrow is a single wheel already required.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd

from proxy import checkpoint as ckpt
from proxy.config import Config
from proxy.run import Run
from proxy.version import __version__

__all__ = ["Store", "StoreWarning", "resolve", "code_version", "entry_key", "load_dir"]

# The modules whose code decides a run's numbers: a stored run made by other
# code is stale and is trained again rather than loaded.
_NUMERIC_MODULES = ("formats", "quantize", "recipe", "layers", "model", "ngpt", "blocks", "architectures", "data",
                    "engine", "diagnostics", "controllers", "config")
_NUMERIC_PACKAGES = ("mx",)
_CODE = None


class StoreWarning(UserWarning):
    """A run-store entry that cannot be used as it is (damaged, edited or
    stale); the run is trained again."""


def code_version() -> str:
    """A hash of the source of the modules that decide a run's numbers."""
    global _CODE
    if _CODE is None:
        h = hashlib.sha256()
        pkg = Path(__file__).parent
        files = [pkg / f"{n}.py" for n in _NUMERIC_MODULES]
        files += sorted(f for p in _NUMERIC_PACKAGES for f in (pkg / p).glob("*.py"))
        for f in files:
            if f.exists():
                h.update(str(f.relative_to(pkg)).encode() + b"\0" + f.read_bytes())
        _CODE = h.hexdigest()[:16]
    return _CODE


def entry_key(config: Config, parent: str | None = None, at_step: int | None = None) -> str:
    """The store key of a run: its config hash, or for an intervention a hash
    of (config, parent key, step)."""
    if parent is None:
        return config.hash()
    blob = json.dumps({"config": config.to_dict(), "parent": parent, "at_step": int(at_step)}, sort_keys=True,
                      default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def resolve(store) -> "Store | None":
    """A :class:`Store` for ``store`` (a folder path or a Store), or ``None``
    (keep results in memory) for ``None``/``False``."""
    if store is None or store is False:
        return None
    if isinstance(store, Store):
        return store
    if isinstance(store, (str, os.PathLike)):
        return Store(store)
    raise ValueError(f"store must be a folder path, a proxy.store.Store, or None (memory only), got {store!r}")


def _atomic_write(path: Path, write):
    """``write(tmp_path)`` then rename onto ``path``."""
    tmp = path.with_name(ckpt.tmp_name(path.name))
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _flatten(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, name + "/"))
        else:
            out[name] = np.asarray(v)
    return out


def _unflatten(flat):
    tree: dict = {}
    for name, v in flat.items():
        node = tree
        *parents, leaf = name.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v
    return tree


_DAMAGE = (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, EOFError)


class Store:
    """A results folder; see the module docstring."""

    def __init__(self, root):
        self.root = Path(root).expanduser().resolve()

    def __repr__(self):
        return f"Store({str(self.root)!r})"

    def path(self, key: str) -> Path:
        return self.root / key

    def partial(self, key: str) -> Path:
        """Where this process trains the run of ``key`` until it is complete."""
        return self.root / f"{key}.partial-{os.getpid()}"

    def checkpoint_dir(self, key: str) -> Path:
        """Checkpoints of a run this process is training (``<key>.partial-<pid>/checkpoints``)."""
        return self.partial(key) / "checkpoints"

    def _orphans(self, key: str) -> list[Path]:
        """Training folders of ``key`` left by processes that are gone."""
        out = []
        for p in self.root.glob(f"{key}.partial-*"):
            try:
                pid = int(p.name.rsplit("-", 1)[1])
            except ValueError:
                continue
            if pid != os.getpid() and not ckpt.pid_alive(pid):
                out.append(p)
        return out

    def has(self, key: str) -> bool:
        return (self.path(key) / "run.json").exists()

    def keys(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if (p / "run.json").exists() and "." not in p.name)

    def check_writable(self):
        """Raise a ValueError naming the folder unless runs can be written
        there (checked before any training, so no result is thrown away)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / ckpt.tmp_name("probe")
            probe.write_text("")
            probe.unlink()
        except OSError as e:
            raise ValueError(f"run store {self.root} is not writable ({e.strerror or e}); pass another folder, "
                             f"or store=None to keep results in memory") from None

    def clean(self) -> list[Path]:
        """Remove leftovers of killed writers in the store, its entries and
        their checkpoint folders (see :func:`proxy.checkpoint.clean`)."""
        removed = ckpt.clean(self.root)
        if self.root.is_dir():
            for d in self.root.iterdir():
                if d.is_dir():
                    removed += ckpt.clean(d) + ckpt.clean(d / "checkpoints")
            for d in self.root.glob("*.partial-*"):  # a killed run with no checkpoint holds nothing to resume
                if d in self._orphans(d.name.rsplit(".partial-", 1)[0]) and not ckpt.steps(d / "checkpoints"):
                    shutil.rmtree(d, ignore_errors=True)
                    removed.append(d)
        return removed

    @contextlib.contextmanager
    def _lock(self, key: str):
        locks = self.root / ".locks"
        locks.mkdir(parents=True, exist_ok=True)
        with open(locks / f"{key}.lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def prepare(self, key: str, *, fresh: bool) -> Path:
        """This process's training folder of ``key``. Unless ``fresh`` (a
        forced retrain), it adopts the folder of a killed process that trained
        the same run (the one with the latest checkpoint), so the run resumes;
        checkpoints made by other code are dropped."""
        part = self.partial(key)
        if fresh:
            shutil.rmtree(part, ignore_errors=True)
        elif not part.exists():
            for orphan in sorted(self._orphans(key), key=lambda p: max(ckpt.steps(p / "checkpoints"), default=-1),
                                 reverse=True):
                try:
                    os.rename(orphan, part)  # atomic: of two processes adopting it, one wins
                    break
                except OSError:
                    continue
        cdir = part / "checkpoints"
        for step in ckpt.steps(cdir):
            if ckpt.meta(cdir, step).get("code_version") != code_version():
                shutil.rmtree(cdir / f"step_{step:09d}", ignore_errors=True)
        part.mkdir(parents=True, exist_ok=True)
        return part

    def save(self, run: Run, key: str) -> Run:
        """Write ``run`` as the entry ``key`` (see the module docstring);
        returns it with ``path`` and ``info["key"]`` set."""
        self.check_writable()
        part = self.partial(key)
        part.mkdir(parents=True, exist_ok=True)
        _atomic_write(part / "config.json",
                      lambda p: p.write_text(json.dumps(run.config.to_dict(), indent=1, sort_keys=True)))
        _atomic_write(part / "metrics.parquet", lambda p: run.metrics.to_parquet(p, index=False))
        if run.params is not None:
            def write_params(p):
                with open(p, "wb") as f:
                    np.savez(f, **_flatten(run.params))
            _atomic_write(part / "params.npz", write_params)
        info = dict(run.info, key=key)
        meta = {"diverged_at": run.diverged_at, "wall_time_s": run.wall_time_s, "info": info,
                "proxy_version": __version__, "code_version": code_version()}
        _atomic_write(part / "run.json", lambda p: p.write_text(json.dumps(meta, indent=1, sort_keys=True, default=str)))
        final = self.path(key)
        with self._lock(key):
            if self._usable(key, quiet=True) is not None:  # another process finished it: keep theirs
                shutil.rmtree(part, ignore_errors=True)
            else:
                old = None
                if final.exists():
                    old = self.root / ckpt.tmp_name(f"old-{key}")
                    os.rename(final, old)
                os.rename(part, final)
                if old is not None:
                    shutil.rmtree(old, ignore_errors=True)
        run.info = info
        run.path = str(final)
        return run

    def load(self, key: str) -> Run | None:
        """The stored run of ``key``, or ``None`` if there is no usable entry
        (none, damaged, edited or stale: each of the last three is reported
        with a :class:`StoreWarning`)."""
        return self._usable(key, quiet=False)

    def _usable(self, key: str, quiet: bool) -> Run | None:
        d = self.path(key)
        if not (d / "run.json").exists():
            return None

        def report(why):
            if not quiet:
                warnings.warn(f"run store entry {d}: {why}; training it again", StoreWarning, stacklevel=3)
            return None

        try:
            meta = json.loads((d / "run.json").read_text())
            if meta.get("code_version") != code_version():
                return report("made by other numerics code (stale; kept until the new run replaces it)")
            run = load_dir(d)
        except _DAMAGE as e:
            return report(f"damaged ({type(e).__name__}: {e})")
        except Exception as e:  # pyarrow raises its own error types for truncated files
            if type(e).__module__.startswith("pyarrow"):
                return report(f"damaged ({type(e).__name__}: {e})")
            raise
        iv = run.info.get("intervention") or {}
        expected = entry_key(run.config, run.info.get("parent"), iv.get("at_step")) if run.info.get("parent") \
            else run.config.hash()
        if expected != key:
            return report(f"its config.json hashes to {expected}, not to its key (edited?)")
        return run


def load_dir(d) -> Run:
    """Load a stored run from its folder (``<root>/<key>``); raises on a
    missing or damaged entry."""
    d = Path(d).expanduser().resolve()
    if not (d / "run.json").exists():
        raise ValueError(f"{d} is not a complete stored run (no run.json)")
    meta = json.loads((d / "run.json").read_text())
    config = Config.from_dict(json.loads((d / "config.json").read_text()))
    metrics = pd.read_parquet(d / "metrics.parquet")
    params = None
    if (d / "params.npz").exists():
        with np.load(d / "params.npz") as z:
            params = _unflatten({k: z[k] for k in z.files})
    return Run(config, metrics, meta["diverged_at"], params, meta.get("wall_time_s", 0.0), meta.get("info", {}),
               path=str(d))
