"""The run store: every finished run in a folder keyed by a hash of its config.

Layout of ``<root>/<key>/`` (``key`` = :meth:`proxy.Config.hash` for a run
trained from scratch; interventions hash their parent and change too):

- ``config.json`` — the full config (``Config.to_dict``);
- ``metrics.parquet`` — ``Run.metrics``, one row per step;
- ``params.npz`` — final student parameters (``block_0/fc1`` … keys);
- ``checkpoints/`` — orbax checkpoints (see :mod:`proxy.checkpoint`);
- ``run.json`` — diverged_at, wall time, provenance and the code version
  (a hash of the numerics modules' source); written **last**, so its
  presence marks a complete run. An entry made by other code is stale: it
  is trained again (and overwritten) rather than loaded.

Every file is written under a temporary name and renamed into place
(``os.replace`` is atomic on POSIX), so a run interrupted at any moment leaves
either a complete entry or one that is trained again (resuming from its last
checkpoint) — never a half-written one that loads.

Why Parquet (pyarrow) rather than NetCDF (xarray): the metrics are a flat
table (step × named scalar columns, per-block values already split into
``name/block_i`` columns), which is exactly Parquet's model; it keeps float32
columns bit for bit, is compressed and columnar (reading one metric of a
large sweep touches only that column), is read natively by pandas, polars,
DuckDB and Arrow, and pyarrow is a single wheel already required. NetCDF
shines for labelled N-d arrays; here it would add xarray plus a NetCDF/HDF5
backend for no gain.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path

import numpy as np
import pandas as pd

from proxy.config import Config
from proxy.run import Run

__all__ = ["Store", "resolve", "DEFAULT_ROOT"]

DEFAULT_ROOT = "runs"
_OFF = ("", "0", "off", "false", "no", "none")
# The modules whose code decides a run's numbers: a stored run made by other
# code is stale and is trained again rather than loaded.
_NUMERIC_MODULES = ("formats", "quantize", "recipe", "layers", "model", "ngpt", "data", "engine", "diagnostics",
                    "controllers", "config", "run")
_CODE = None


def code_version() -> str:
    """A hash of the source of the modules that decide a run's numbers."""
    global _CODE
    if _CODE is None:
        h = hashlib.sha256()
        pkg = Path(__file__).parent
        for name in _NUMERIC_MODULES:
            f = pkg / f"{name}.py"
            if f.exists():
                h.update(name.encode() + b"\0" + f.read_bytes())
        _CODE = h.hexdigest()[:16]
    return _CODE


def resolve(store) -> "Store | None":
    """A :class:`Store` for ``store`` (a folder, a Store, ``None`` = the default
    ``$PROXY_STORE`` or ``runs/``), or ``None`` for ``store=False``."""
    if store is False:
        return None
    if isinstance(store, Store):
        return store
    if store is None or store is True:
        env = os.environ.get("PROXY_STORE")
        if env is not None and env.strip().lower() in _OFF:
            return None
        return Store(env or DEFAULT_ROOT)
    if isinstance(store, (str, os.PathLike)):
        return Store(store)
    raise ValueError(f"store must be a folder path, None (default runs/) or False (memory only), got {store!r}")


def _atomic_write(path: Path, write):
    """``write(tmp_path)`` then rename onto ``path``."""
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if tmp.exists():
            tmp.unlink()
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


class Store:
    """A results folder. ``load(key)`` / ``save(run, key)``; see the module doc."""

    def __init__(self, root):
        self.root = Path(root)

    def __repr__(self):
        return f"Store({str(self.root)!r})"

    def path(self, key: str) -> Path:
        return self.root / key

    def checkpoint_dir(self, key: str) -> Path:
        return self.path(key) / "checkpoints"

    def has(self, key: str) -> bool:
        return (self.path(key) / "run.json").exists()

    def keys(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if (p / "run.json").exists())

    def save(self, run: Run, key: str) -> Run:
        """Write ``run`` under ``key`` (atomically, ``run.json`` last); returns it with ``path`` set."""
        d = self.path(key)
        d.mkdir(parents=True, exist_ok=True)
        if (d / "run.json").exists():  # a forced retrain: un-mark the old entry first
            (d / "run.json").unlink()
        _atomic_write(d / "config.json", lambda p: p.write_text(json.dumps(run.config.to_dict(), indent=1, sort_keys=True)))
        _atomic_write(d / "metrics.parquet", lambda p: run.metrics.to_parquet(p, index=False))
        if run.params is not None:
            def write_params(p):
                with open(p, "wb") as f:
                    np.savez(f, **_flatten(run.params))
            _atomic_write(d / "params.npz", write_params)
        from proxy import __version__

        info = dict(run.info, key=key)
        meta = {"diverged_at": run.diverged_at, "wall_time_s": run.wall_time_s, "info": info,
                "proxy_version": __version__, "code_version": code_version()}
        _atomic_write(d / "run.json", lambda p: p.write_text(json.dumps(meta, indent=1, sort_keys=True, default=str)))
        run.info = info
        run.path = str(d)
        return run

    def load(self, key: str) -> Run | None:
        """The stored run of ``key``, or ``None`` if there is no complete entry
        or it was made by different numerics code (see :func:`code_version`)."""
        d = self.path(key)
        if not (d / "run.json").exists():
            return None
        if json.loads((d / "run.json").read_text()).get("code_version") != code_version():
            return None
        return load_dir(d)

    def stale(self, key: str) -> bool:
        """True if ``key`` has an entry (finished, or checkpoints of an
        interrupted run) made by other numerics code than this one's."""
        d = self.path(key)
        metas = [d / "run.json"] + sorted((d / "checkpoints").glob("step_*/meta.json"))
        for m in metas:
            if m.exists() and json.loads(m.read_text()).get("code_version") != code_version():
                return True
        return False

    def discard(self, key: str):
        """Remove an entry (its checkpoints too)."""
        shutil.rmtree(self.path(key), ignore_errors=True)


def load_dir(d) -> Run:
    """Load a stored run from its folder (``<root>/<key>``)."""
    d = Path(d)
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
