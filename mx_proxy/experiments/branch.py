"""Branch states: one run's full train state at one step, kept so that ensembles can branch from it.

A branch state is a checkpoint folder (:mod:`mx_proxy.store.checkpoint`:
the orbax state, the metrics of steps 0 … step−1, ``meta.json``) whose
meta also holds the run's config, key, label and code version, and, when
the state was replayed and compared with an exported run, whether the
replayed losses equalled that run's bit for bit. The state is numbers (student
and, for a paired run, FP32-twin parameters and Adam moments), so it stays
valid when the code changes; an ensemble copies it into its own folder and
never reads the run it came from again.

``perturb`` is the ensemble's parameter perturbation: every parameter
scaled by ``1 + ε·z``, z ~ N(0, 1) from a seed (NumPy's PCG64, one stream
per leaf), the same z for the student and its paired run.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import jax
import numpy as np
import pandas as pd

from mx_proxy.runner import interventions
from mx_proxy.store import checkpoint as ckpt
from mx_proxy.store import files
from mx_proxy.store import run_store as _store
from mx_proxy.training.config import Config
from mx_proxy.training.engine import TrainState, dynamic_for, program_for
from mx_proxy.training.paths import checked_path
from mx_proxy.training.result import Run

__all__ = ["Branch", "write", "read", "exists", "perturb", "compare_losses", "source_config", "check_reference"]


@dataclasses.dataclass
class Branch:
    """A branch state: ``state`` before step ``step`` of the run of ``config``,
    its ``metrics`` (steps 0 … step−1), ``key`` (its identity: the run's key
    and the step) and ``meta`` (provenance)."""

    config: Config
    step: int
    state: TrainState
    metrics: pd.DataFrame
    key: str
    meta: dict


def _only_step(folder: Path) -> int:
    found = ckpt.steps(folder)
    if len(found) != 1:
        raise ValueError(f"{folder} must hold exactly one checkpoint (a branch state), found steps {found or 'none'}")
    return found[0]


def exists(folder) -> bool:
    """Whether ``folder`` holds a complete checkpoint at its top (a branch state, not a run's folder)."""
    p = Path(folder)
    return p.is_dir() and any(c.name.startswith("step_") and (c / "meta.json").exists() for c in p.iterdir())


def compare_losses(metrics: pd.DataFrame, reference, step: int, file: str = "metrics.parquet") -> dict:
    """Compare ``metrics`` (a replay) with an exported run's (folder
    ``reference``, its ``file``) before ``step``, column by column for ``loss`` and
    ``ref_loss`` where both have them, every step before ``step`` of ``metrics``:
    ``{"reference", "identical", "first_difference", "columns"}``."""
    ref = files.read_table(Path(reference) / file)
    cols = [c for c in ("loss", "ref_loss") if c in metrics and c in ref]
    if "loss" not in cols:
        raise ValueError(f"{Path(reference) / file} and the state's metrics do not both have a loss column")
    a = metrics[metrics["step"] < step].set_index("step")[cols]
    b = ref[ref["step"] < step].set_index("step")[cols].reindex(a.index)
    same = ((a.to_numpy() == b.to_numpy()) | (np.isnan(a.to_numpy(dtype=float)) & np.isnan(b.to_numpy(dtype=float))))
    rows = same.all(axis=1)
    first = None if rows.all() else int(a.index[~rows][0])
    return {"reference": str(reference), "identical": first is None, "first_difference": first, "columns": cols}


def source_config(source) -> Config:
    """The config a branch from ``source`` continues (what :func:`write` would read), without reading its
    state: a :class:`Run`'s, a stored run's folder's (its ``config.json``, verified) or a branch state's
    folder's (its meta's). Lets a caller check what it builds on the state before anything is written."""
    if isinstance(source, Run):
        return source.config
    if not isinstance(source, (str, Path)):
        raise TypeError(f"a branch source is a mxp.Run, a stored run's folder or a branch state's folder, got "
                        f"{type(source).__name__}")
    folder = checked_path(source, "branch source", folder=True)
    if exists(folder):
        meta = ckpt.meta(folder, _only_step(folder)).get("branch")
        if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict):
            raise ValueError(f"{str(folder)!r} holds a checkpoint without branch provenance: not a branch state")
        return Config.from_dict(meta["config"])
    if not (folder / "config.json").is_file():
        raise ValueError(f"branch source {str(source)!r} is neither a stored run's folder (runs/<key>, with a "
                         f"config.json) nor a branch state's folder")
    return files.read_config(folder / "config.json")


def check_reference(reference) -> Path:
    """``reference`` as an exported run's folder (one holding ``metrics.parquet``), or a ValueError quoting it."""
    folder = checked_path(reference, "--reference", folder=True)
    if not (folder / "metrics.parquet").is_file():
        raise ValueError(f"--reference {str(reference)!r} is not an exported run's folder (results/<label>, with "
                         f"a metrics.parquet)")
    return folder


def write(source, step: int, folder, *, reference=None) -> Path:
    """Write the state of ``source`` at ``step`` as a branch state in ``folder``.

    ``source``: a :class:`Run`, a stored run's folder (its checkpoint at
    ``step`` is used, or the state is replayed there from the newest one before
    it, :func:`mx_proxy.runner.interventions.with_checkpoint`, which checks the replay's
    losses against the run's own), or another branch state's folder (copied).
    ``reference``: an exported run's folder (e.g. ``results/paper/<label>``)
    to compare the state's loss history with, recorded in the meta.
    """
    folder = Path(folder)
    reference = check_reference(reference) if reference is not None else None  # before any replay
    if isinstance(source, (str, Path)) and exists(source):
        if Path(source).resolve() != folder.resolve():
            shutil.copytree(source, folder, dirs_exist_ok=False)
        return folder
    run = _store.load_dir(source) if isinstance(source, (str, Path)) else source
    if not isinstance(run, Run):
        raise TypeError(f"a branch source is a mxp.Run, a stored run's folder or a branch state's folder, got "
                        f"{type(source).__name__}")
    run = interventions.with_checkpoint(run, step)
    state, metrics = interventions.state_at(run, step)
    if metrics is None or len(metrics) != step:
        metrics = run.metrics[run.metrics["step"] < step].reset_index(drop=True)
    meta = {"config": run.config.to_dict(), "parent_key": run.info.get("key", run.config.hash()),
            "parent_label": run.info.get("label"), "parent_path": run.path,
            "parent_stale": bool(run.info.get("stale")),
            "replay": run.info.get("replay")}
    if reference is not None:
        meta["compared_with"] = compare_losses(metrics, reference, step)
    if exists(folder):
        raise ValueError(f"{folder} already holds a branch state; remove it or branch from it")
    ckpt.save(folder, step, state, metrics, {"branch": meta})
    return folder


def read(folder) -> Branch:
    """The branch state in ``folder``, validated (its config parses, its state
    has that config's shapes, its metrics one row per step before it)."""
    folder = Path(folder)
    step = _only_step(folder)
    meta = ckpt.meta(folder, step).get("branch")
    if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict):
        raise ValueError(f"{ckpt.step_dir(folder, step) / 'meta.json'} has no branch provenance: not a branch state")
    config = Config.from_dict(meta["config"])
    state, metrics = ckpt.restore(folder, step, ckpt.template(program_for(config), dynamic_for(config)), config)
    key = f"{meta.get('parent_key')}@{step}"
    return Branch(config, step, state, metrics, key, meta)


def _scale(tree, epsilon: float, seed: int):
    leaves, treedef = jax.tree.flatten(tree)
    out = [np.asarray(x) * (1 + np.float32(epsilon) * np.random.default_rng([seed, j]).standard_normal(
        np.shape(x), dtype=np.float32)) for j, x in enumerate(leaves)]
    return jax.tree.unflatten(treedef, [o.astype(np.asarray(x).dtype) for o, x in zip(out, leaves)])


def perturb(state: TrainState, epsilon: float, seed: int) -> TrainState:
    """``state`` with every student parameter (and the paired run's, with the
    same z) scaled by ``1 + ε·z``; ``epsilon = 0`` returns it unchanged."""
    if not epsilon:
        return state
    state = state._replace(params=_scale(state.params, epsilon, seed))
    if state.ref_params is not None:
        state = state._replace(ref_params=_scale(state.ref_params, epsilon, seed))
    return state
