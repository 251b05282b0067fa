"""The one verified reader of every file the run store and a checkpoint read.

Nothing read from disk is used before it is checked here; each failure is an
:class:`EntryError` (a ValueError) naming the file and what is wrong with it:

- JSON files (an entry's ``run.json``, a checkpoint's ``meta.json``): an
  object whose fields have their types at every nesting level (:data:`RUN_META`,
  :data:`CHECKPOINT_META`; fields no schema names are kept as they are);
- ``config.json``: an object that :meth:`Config.from_dict` accepts;
- metrics tables (an entry's or a checkpoint's ``metrics.parquet``, in
  either format :mod:`mx_proxy.store.tables` reads, :func:`read_table`): a
  ``step`` column counting from 0, one row per step the run (or the
  checkpoint) claims, the columns every run of its config has, every column
  numeric (:func:`check_metrics`);
- ``params.npz``: exactly the parameter names, shapes and dtypes of the
  config's student (:func:`check_params`).

Writes are :mod:`mx_proxy.store.durable`'s.
"""

from __future__ import annotations

import functools
import json
import zipfile
from pathlib import Path

import jax
import numpy as np
import pandas as pd

from mx_proxy.store import tables
from mx_proxy.training.config import Config
from mx_proxy.training.engine import dynamic_for, program_for, static_key
from mx_proxy.training.result import Run

__all__ = ["EntryError", "StoreWarning", "RUN_META", "CHECKPOINT_META", "RESULT_META", "check_json", "read_json",
           "read_meta", "read_config", "read_table",
           "read_metrics", "check_metrics", "read_params", "check_params", "read_entry", "required_columns",
           "flatten", "unflatten"]


class EntryError(ValueError):
    """A run-store entry, a checkpoint or one of their files that is missing, damaged or inconsistent."""


class StoreWarning(UserWarning):
    """A run-store entry or checkpoint that cannot be used as it is (damaged,
    edited or stale): it is moved aside (or, stale, kept until replaced) and
    the run resumes from an earlier checkpoint or trains again."""


def flatten(tree, prefix="", leaf=np.asarray):
    """``{"block_0": {"fc1": a}}`` → ``{"block_0/fc1": leaf(a)}``: how ``params.npz`` stores a tree."""
    out = {}
    for k, v in tree.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, name + "/", leaf))
        else:
            out[name] = leaf(v)
    return out


def unflatten(flat):
    """The inverse of :func:`flatten`."""
    tree: dict = {}
    for name, v in flat.items():
        node = tree
        *parents, leaf = name.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v
    return tree


# --------------------------------------------------------------------------- JSON schemas


class _Of:
    """A schema node: a value of one of ``kinds`` (Python types or nested
    schema dicts), ``required`` or optional; ``items``: the schema of each
    element of a list."""

    def __init__(self, *kinds, required=True, items=None, minimum=None):
        self.kinds, self.required, self.items, self.minimum = kinds, required, items, minimum


def _kind_ok(v, kind) -> bool:
    if isinstance(kind, dict):
        return isinstance(v, dict)
    if kind is int:
        return isinstance(v, int) and not isinstance(v, bool)
    if kind is float:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if kind is None:
        return v is None
    return isinstance(v, kind)


def _kind_name(kind) -> str:
    if isinstance(kind, dict):
        return "an object"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list",
            dict: "an object", None: "null"}[kind]


def check_json(value, schema: dict, path, inside: str = "") -> None:
    """Raise an :class:`EntryError` unless JSON ``value`` is an object whose
    fields match ``schema`` (field → :class:`_Of`) at every nesting level;
    the message names file ``path`` and the field (``inside``: the fields
    above it)."""
    if not isinstance(value, dict):
        what = f"{inside!r} is" if inside else "it holds"
        raise EntryError(f"{path} is damaged: {what} a JSON {type(value).__name__}, not an object")
    for name, of in schema.items():
        field = f"{inside}.{name}" if inside else name
        if name not in value:
            if of.required:
                raise EntryError(f"{path} is damaged: {field!r} is missing")
            continue
        v = value[name]
        kind = next((k for k in of.kinds if _kind_ok(v, k)), "none")
        if kind == "none" or (of.minimum is not None and kind in (int, float) and v < of.minimum):
            need = " or ".join(_kind_name(k) for k in of.kinds) + ("" if of.minimum is None else f" >= {of.minimum}")
            raise EntryError(f"{path} is damaged: {field!r} must be {need}, got {v!r:.80}")
        if isinstance(kind, dict):
            check_json(v, kind, path, field)
        if kind is list and of.items is not None:
            for i, item in enumerate(v):
                if not _kind_ok(item, of.items):
                    raise EntryError(f"{path} is damaged: {field}[{i}] must be {_kind_name(of.items)}, got "
                                     f"{item!r:.80}")


REPLAY = {"from_step": _Of(int, minimum=0), "paired_run": _Of(bool), "identical": _Of(bool),
          "first_difference": _Of(int, None), "of_path": _Of(str, None, required=False)}
INTERVENTION = {"at_step": _Of(int, minimum=1), "recipe": _Of(str, dict), "apply": _Of(list, items=str),
                "changes": _Of(dict), "reset": _Of(list, items=str, required=False),
                "replay": _Of(REPLAY, required=False)}
INFO = {"key": _Of(str, required=False), "parent": _Of(str, None, required=False),
        "parent_path": _Of(str, None, required=False), "intervention": _Of(INTERVENTION, None, required=False),
        "replay": _Of(REPLAY, required=False), "resumed_from": _Of(int, required=False, minimum=0),
        "sweep_group_size": _Of(int, required=False, minimum=1),
        "shared_reference": _Of(int, required=False, minimum=1), "stale": _Of(bool, required=False),
        "perturbation": _Of({"seed": _Of(int, minimum=0), "epsilon": _Of(float, minimum=0)}, required=False),
        "ensemble": _Of(dict, required=False)}
RUN_META = {"diverged_at": _Of(int, None, minimum=0), "wall_time_s": _Of(float, minimum=0), "info": _Of(INFO),
            "code_version": _Of(str), "proxy_version": _Of(str, required=False)}
"""The schema of an entry's ``run.json``."""
RESULT_META = {"label": _Of(str), "kind": _Of(str), "diverged_at": _Of(int, None, minimum=0),
               "steps_run": _Of(int, minimum=0), "final_loss": _Of(float, None, required=False),
               "wall_time_s": _Of(float, None, required=False), "key": _Of(str, None, required=False),
               "intervention": _Of(INTERVENTION, None, required=False), "parent": _Of(str, None, required=False),
               "code_version": _Of(str, required=False), "git_commit": _Of(str, None, required=False)}
"""The schema of a campaign result's ``run.json`` (``results/<label>/``)."""
CHECKPOINT_META = {"step": _Of(int, minimum=0), "code_version": _Of(str, required=False),
                   "config_hash": _Of(str, required=False), "parent": _Of(str, None, required=False),
                   "wall_time_s": _Of(float, required=False, minimum=0)}
"""The schema of a checkpoint's ``meta.json``."""


def _missing(path: Path) -> EntryError:
    return EntryError(f"{path.parent} is incomplete: {path.name} is missing")


def _damaged(path: Path, e: Exception) -> EntryError:
    first = (str(e).splitlines() or [""])[0][:200]
    return EntryError(f"{path} is damaged ({type(e).__name__}: {first})")


def read_json(path, schema: dict):
    """The JSON object in file ``path``, checked against ``schema``."""
    path = Path(path)
    if not path.is_file():
        raise _missing(path)
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise _damaged(path, e) from None
    check_json(value, schema, str(path))
    return value


def read_meta(d) -> dict:
    """The verified ``run.json`` of entry folder ``d``; an exported result's (``results/<label>/``: the
    results schema, no ``info``) is an :class:`EntryError` saying so, not calling the file damaged."""
    path = Path(d) / "run.json"
    if not path.exists():
        raise EntryError(f"{d} is not a complete stored run (no run.json)")
    value = read_json(path, {})
    if "info" not in value:
        try:
            check_json(value, RESULT_META, str(path))
        except EntryError:
            pass
        else:
            raise EntryError(f"{d} is an exported result ({value['kind']} run {value['label']!r}: its metrics and "
                             f"config, no parameters or checkpoints), not a stored run; give the run store's "
                             f"folder of the run (runs/<key>; its key is {value.get('key')!r})")
    check_json(value, RUN_META, str(path))
    return value


def read_config(path) -> Config:
    """The Config of a ``config.json`` (its fields are checked by Config itself)."""
    path = Path(path)
    raw = read_json(path, {})
    try:
        return Config.from_dict(raw)
    except Exception as e:  # any field of any type may be damaged: every failure to parse is the file's
        raise _damaged(path, e) from None


# --------------------------------------------------------------------------- metrics


def required_columns(config: Config) -> list[str]:
    """Columns every metrics table of a run of ``config`` has (README: metrics)."""
    cols = ["step", "loss", "lr", "grad_norm", "update_norm", "val_loss"]
    cols += [f"grad_norm/block_{i}" for i in range(config.depth)]
    if config.diagnostics_every:
        cols += ["zeta_bound", "cosine"]
    if config.has_paired_run:
        cols += ["ref_loss", "zeta_paper"]
    if config.controller is not None:
        cols += ["low_precision_frac"]
    return cols


def _dtype_ok(name: str, dtype) -> bool:
    """The dtype the engine records column ``name`` in: int64 steps, float64
    validation losses, bool flags (``promoted/…``), float32 everything else."""
    if name == "step":
        return dtype == np.int64
    if name == "val_loss":
        return dtype == np.float64
    return dtype == np.float32 or (dtype == np.bool_ and name.startswith("promoted/"))


def check_metrics(metrics: pd.DataFrame, rows: int, config: Config, where) -> pd.DataFrame:
    """``metrics`` if it holds one row per step 0 … ``rows``−1 and the
    columns of a run of ``config``, each of the dtype the engine records it
    in; else an :class:`EntryError` naming ``where``."""
    missing = [c for c in required_columns(config) if c not in metrics.columns]
    if missing:
        raise EntryError(f"{where} is damaged: it lacks the column(s) {', '.join(missing)}")
    bad = [c for c in metrics.columns if not isinstance(c, str) or not _dtype_ok(c, metrics[c].dtype)]
    if bad:
        raise EntryError(f"{where} is damaged: column {bad[0]!r} is of type {metrics[bad[0]].dtype}")
    deeper = f"grad_norm/block_{config.depth}"
    if deeper in metrics.columns:
        raise EntryError(f"{where} is damaged: it has a column {deeper!r} of a deeper model")
    if len(metrics) != rows or not np.array_equal(metrics["step"].to_numpy(), np.arange(rows)):
        raise EntryError(f"{where} is incomplete: {len(metrics)} rows, not one per step from 0 to {rows - 1}")
    return metrics


def read_metrics(path, rows: int, config: Config) -> pd.DataFrame:
    """The metrics table in ``path``, checked by :func:`check_metrics`."""
    path = Path(path)
    return check_metrics(read_table(path), rows, config, path)


def read_table(path) -> pd.DataFrame:
    """The table in file ``path`` (compact or legacy, :func:`mx_proxy.store.tables.read`: readable, of a
    known format, numeric columns); an :class:`EntryError` naming the file where it is missing or damaged."""
    try:
        return tables.read(path)
    except tables.TableError as e:
        raise EntryError(str(e)) from None


# --------------------------------------------------------------------------- parameters


@functools.lru_cache(maxsize=32)
def _param_shapes(key: Config) -> dict:
    state, _ = jax.eval_shape(program_for(key).init, dynamic_for(key))
    return {k: (tuple(a.shape), np.dtype(a.dtype)) for k, a in flatten(state.params, leaf=lambda a: a).items()}


def check_params(flat: dict, config: Config, where) -> dict:
    """``flat`` (name → array) if it holds exactly the student parameters of
    ``config``, each of its shape and dtype; else an :class:`EntryError`."""
    want = _param_shapes(static_key(config))
    if set(flat) != set(want):
        gone, odd = sorted(set(want) - set(flat)), sorted(set(flat) - set(want))
        raise EntryError(f"{where} is damaged: " + (f"it lacks {', '.join(gone[:3])}" if gone else
                                                    f"it holds unknown arrays {', '.join(odd[:3])}"))
    for name, (shape, dtype) in want.items():
        a = flat[name]
        if tuple(a.shape) != shape or a.dtype != dtype:
            raise EntryError(f"{where} is damaged: {name} is {a.dtype}{list(a.shape)}, this config's is "
                             f"{dtype}{list(shape)}")
    return flat


def read_params(path, config: Config):
    """The parameter tree in ``params.npz`` at ``path``, checked by :func:`check_params`."""
    path = Path(path)
    if not path.is_file():
        raise _missing(path)
    try:
        with open(path, "rb") as f, np.load(f, allow_pickle=False) as z:
            flat = {k: z[k] for k in z.files}
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as e:
        raise _damaged(path, e) from None
    return unflatten(check_params(flat, config, path))


def _check_provenance(info: dict, config: Config, path: Path) -> None:
    """An intervention's record agrees with its config: it has one exactly
    when it has a parent, and each change it lists is the config's value."""
    iv = info.get("intervention")
    if (info.get("parent") is None) != (iv is None):
        raise EntryError(f"{path} is damaged: 'info.parent' and 'info.intervention' must be given together")
    if iv is None:
        return
    fields = json.loads(json.dumps(config.to_dict(), default=str))  # as its run.json holds them
    for name, value in iv["changes"].items():
        if name not in fields or fields[name] != value:
            raise EntryError(f"{path} is damaged: 'info.intervention.changes.{name}' is {value!r:.80}, its config's "
                             f"is {fields.get(name, 'no such field')!r:.80}")
    if iv["recipe"] != fields["recipe"]:
        raise EntryError(f"{path} is damaged: 'info.intervention.recipe' is not its config's recipe")


def read_entry(d, meta: dict | None = None) -> Run:
    """The stored run in folder ``d``, every file verified (see the module
    docstring); raises :class:`EntryError` naming the file at fault."""
    d = Path(d)
    meta = read_meta(d) if meta is None else meta
    config = read_config(d / "config.json")
    diverged_at = meta["diverged_at"]
    rows = config.steps if diverged_at is None else min(diverged_at + 1, config.steps)
    metrics = read_metrics(d / "metrics.parquet", rows, config)
    params = read_params(d / "params.npz", config)
    _check_provenance(meta["info"], config, d / "run.json")
    return Run(config, metrics, diverged_at, params, float(meta["wall_time_s"]), meta["info"], path=str(d))
