"""In-situ interventions: continue a run from a checkpoint with a change, on the very same batches."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import jax
import numpy as np
from tqdm.auto import tqdm

from mx_proxy.numerics import recipe as _recipes
from mx_proxy.numerics import recipe_json
from mx_proxy.runner import loop as runner
from mx_proxy.store import checkpoint as ckpt
from mx_proxy.store import run_store as _store
from mx_proxy.training import memory as _memory
from mx_proxy.training.config import INTERVENABLE_FIELDS, Config  # the fields declared knob(..., intervene=True)
from mx_proxy.training.engine import dynamic_for, program_for
from mx_proxy.training.result import Run

__all__ = ["intervene", "checkpoint_steps", "INTERVENABLE_FIELDS"]


def _parent_sink(run: Run) -> ckpt.CheckpointSink:
    if run.path is not None:
        return ckpt.CheckpointSink(Path(run.path) / "checkpoints")
    return ckpt.CheckpointSink(memory=run.checkpoints)


def checkpoint_steps(run: Run) -> list[int]:
    """The steps ``run`` holds checkpoints at (in its store folder, or in memory): where it can be continued."""
    return list(_parent_sink(run).steps())


def _check_parent(parent: Run, sink: ckpt.CheckpointSink, at_step: int) -> None:
    """Refuse to splice a checkpoint onto a run it does not belong to: one made
    by other numerics code, or of a config other than the parent's (an edited
    ``config.json``)."""
    if sink.directory is None:
        return
    meta = sink.meta(at_step)
    where = sink.directory / f"step_{at_step:09d}"
    if parent.info.get("stale") or meta.get("code_version") != _store.code_version():
        raise ValueError(f"checkpoint {where} was made by other numerics code (code version "
                         f"{meta.get('code_version')}, this code is {_store.code_version()}): continuing it would "
                         f"splice old-code state onto new code; retrain the parent (mx-proxy train --force)")
    if meta.get("config_hash") != parent.config.hash():
        raise ValueError(f"checkpoint {where} belongs to config {meta.get('config_hash')}, not to the parent's "
                         f"config {parent.config.hash()} (config.json edited?); retrain the parent")


def intervene(run: Run | str | Path, at_step: int, recipe: str | _recipes.Recipe | None = None, *,
              apply: str | Iterable[str] = (), store=None, force: bool = False, progress: bool = True,
              **changes) -> Run:
    """Continue ``run`` from its checkpoint at ``at_step`` with a change.

    Args:
      run: a :class:`Run` (or the folder of a stored run) trained with a
        checkpoint at ``at_step`` (``Config.checkpoint_at`` / ``checkpoint_every``).
      at_step: the step the change takes effect (steps 0 … at_step−1 are the parent's).
      recipe: the new recipe (a preset name or a :class:`Recipe`); default the parent's.
      apply: names of :data:`mx_proxy.numerics.recipe.MITIGATIONS` applied to that recipe.
      store: a run-store folder; ``None`` (default): the parent's store if it
        has one, else memory only; ``False``: memory only.
      **changes: other Config fields (see :data:`INTERVENABLE_FIELDS`: LR,
        schedule, optimizer settings, steps, …).

    Returns:
      The continued :class:`Run`: its metrics are the parent's before
      ``at_step`` followed by the new steps; ``info`` records ``parent`` (key),
      ``parent_path`` and ``intervention`` (step, recipe, applied names,
      changes). With no change at all it reproduces the parent exactly.
      Switching the optimizer kind re-initializes the optimizer state; turning
      on a paired reference run starts it at the intervention from the same
      weights.

    Raises:
      ValueError: ``at_step`` beyond the run or without a checkpoint (naming
        the available ones), an unknown mitigation, or a field that cannot
        change mid-run.
    """
    applied = [apply] if isinstance(apply, str) else list(apply)
    for name in applied:
        if name not in _recipes.MITIGATIONS:
            raise ValueError(f"unknown mitigation {name!r}; valid: {', '.join(_recipes.MITIGATIONS)}")
    parent = _store.load_dir(run) if isinstance(run, (str, Path)) else run
    if not isinstance(parent, Run):
        raise ValueError(f"intervene needs a mxp.Run or a stored run folder, got {type(run).__name__}")
    bad = sorted(set(changes) - set(INTERVENABLE_FIELDS))
    if bad:
        unknown = [b for b in bad if b not in Config.field_names()]
        what = "unknown config field(s)" if unknown else "field(s) that cannot change mid-run"
        raise ValueError(f"intervene: {what} {bad}; changeable: {', '.join(INTERVENABLE_FIELDS)}")
    pc = parent.config
    sink = _parent_sink(parent)
    available = sink.steps()
    if isinstance(at_step, bool) or not isinstance(at_step, (int, np.integer)):
        raise ValueError(f"at_step must be an integer step, got {at_step!r}")
    at_step = int(at_step)
    last = pc.steps if parent.diverged_at is None else parent.diverged_at
    if not 0 < at_step <= last:
        raise ValueError(f"at_step {at_step} is beyond the run (it ran steps 0…{last - 1}"
                         f"{'' if parent.diverged_at is None else f', diverged at {parent.diverged_at}'}); "
                         f"checkpoints at: {available or 'none'}")
    if at_step not in available:
        raise ValueError(f"no checkpoint at step {at_step}; checkpoints at: {available or 'none'} "
                         f"(train the parent with checkpoint_at=({at_step},) or checkpoint_every=N, N dividing "
                         f"{at_step})")
    _check_parent(parent, sink, at_step)
    new_recipe = _recipes.get(recipe) if recipe is not None else pc.recipe
    if applied:
        new_recipe = _recipes.mitigate(new_recipe, applied)
    child = pc.replace(recipe=new_recipe, **changes)
    if child.steps <= at_step:
        raise ValueError(f"steps ({child.steps}) must exceed at_step ({at_step}) to continue the run")
    if child.diagnostics_every and at_step % child.diagnostics_every:
        raise ValueError(f"at_step {at_step} must be a multiple of diagnostics_every ({child.diagnostics_every})")

    _memory.check(child)
    parent_key = parent.info.get("key", pc.hash())
    key = _store.entry_key(child, parent_key, at_step)
    if store is None and parent.path is not None:  # next to its parent
        st = _store.Store(Path(parent.path).resolve().parent)
    else:
        st = _store.resolve(store)
    if st is not None:
        st.check_writable()
        if not force:
            found = st.load(key)
            if found is not None:
                return found
        st.prepare(key, fresh=True)

    p_prog, c_prog = program_for(pc), program_for(child)
    state, _ = sink.restore(at_step, ckpt.template(p_prog, dynamic_for(pc)))
    fresh, teacher = runner.init_state(child)
    reset = []
    if jax.tree.structure(fresh.opt_state) != jax.tree.structure(state.opt_state):
        state = state._replace(opt_state=c_prog.tx.init(state.params))
        reset.append("opt_state")
    if c_prog.paired and not p_prog.paired:
        state = state._replace(ref_params=state.params, ref_opt=c_prog.tx.init(state.params))
        reset.append("paired_run")
    elif c_prog.paired and jax.tree.structure(fresh.ref_opt) != jax.tree.structure(state.ref_opt):
        state = state._replace(ref_opt=c_prog.tx.init(state.ref_params))
    elif not c_prog.paired:
        state = state._replace(ref_params=None, ref_opt=None)
    if (c_prog.selector is None) != (state.ctrl is None):
        state = state._replace(ctrl=fresh.ctrl)
    history = parent.metrics[parent.metrics["step"] < at_step].reset_index(drop=True)
    info = {"key": key, "parent": parent_key, "parent_path": parent.path,
            "intervention": {"at_step": at_step, "recipe": recipe_json.to_json(new_recipe), "apply": applied,
                             "changes": {k: v for k, v in changes.items() if k != "recipe"}, "reset": reset}}
    csink = ckpt.CheckpointSink(st.checkpoint_dir(key)) if st is not None else ckpt.CheckpointSink(memory={})
    member = runner.Member(child, state, teacher, csink, at_step, [history] if len(history) else [], info)
    with tqdm(total=child.steps, initial=at_step, disable=not progress, desc=new_recipe.name, unit="step",
              leave=False) as bar:
        (out,) = runner.run_members([member], at_step, bar=bar)
    runner.notify(child)
    return st.save(out, key) if st is not None else out
