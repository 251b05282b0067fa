"""In-situ interventions: continue a run from a checkpoint with a change, on the very same batches."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import jax
import numpy as np
import pandas as pd

from mx_proxy.numerics import recipe as _recipes
from mx_proxy.numerics import recipe_json
from mx_proxy.runner import loop as runner
from mx_proxy.runner import progress as _progress
from mx_proxy.runner.interrupt import interruptible
from mx_proxy.store import checkpoint as ckpt
from mx_proxy.store import run_store as _store
from mx_proxy.training import memory as _memory
from mx_proxy.training.config import (
    INTERVENABLE_FIELDS,  # the fields declared knob(..., intervene=True)
    Config,
    check_field,
)
from mx_proxy.training.engine import TrainState, dynamic_for, program_for
from mx_proxy.training.result import Run
from mx_proxy.training.values import ArgumentTypeError, check_flags

__all__ = ["intervene", "continue_state", "state_at", "checkpoint_steps", "with_checkpoint", "replay_summary",
           "INTERVENABLE_FIELDS"]


def _parent_sink(run: Run) -> ckpt.CheckpointSink:
    """Where ``run``'s checkpoints are: those it holds in memory (a run kept
    out of any store, or given one by :func:`with_checkpoint`), else its folder's."""
    if run.path is not None and not run.checkpoints:
        return ckpt.CheckpointSink(Path(run.path) / "checkpoints")
    return ckpt.CheckpointSink(memory=run.checkpoints)


def state_at(run: Run, step: int) -> tuple[TrainState, pd.DataFrame | None]:
    """(train state, metrics before ``step``) of ``run``'s checkpoint at
    ``step`` (in its folder or in memory, e.g. one :func:`with_checkpoint` made)."""
    return _parent_sink(run).restore(step, ckpt.template(program_for(run.config), dynamic_for(run.config)))


def checkpoint_steps(run: Run) -> list[int]:
    """The steps ``run`` holds checkpoints at (in its store folder, or in memory): where it can be continued."""
    return list(_parent_sink(run).steps())


def with_checkpoint(run: Run | str | Path, step: int, *, paired_run: bool | None = None,
                    progress: bool = True) -> Run:
    """``run`` with a train-state checkpoint at ``step`` (in memory), so that
    :func:`intervene` can continue it from there.

    The state is recomputed: from the run's newest checkpoint before
    ``step`` (its initial state if it has none), the run's own config trains
    on to ``step``. The replayed losses are compared with the run's own, bit
    for bit; ``info["replay"]`` records ``from_step``, ``paired_run``,
    ``identical``, ``first_difference`` (the first step whose loss differs,
    or None) and ``of_path`` (the run's folder, kept as the returned run's
    ``path``: a continuation is stored next to it by default). When they are identical the returned run's metrics
    are the run's own; otherwise, before ``step``, the replay's (after the
    run's history before ``from_step``): a continuation then says which
    trajectory it continues. Returns ``run`` itself if it already holds a
    checkpoint at ``step``.

    Args:
      paired_run: ``None`` (default): replay as the run trained, its paired
        FP32 run included; ``False``: without it, about half the cost for a
        paired run (the student never reads it unless a controller does, so
        the student's trajectory is the same up to the compiled program's
        summation order, which the comparison checks). A continuation that
        keeps the paired run then starts it afresh from the student's
        weights at ``step`` (``reset`` records ``paired_run``).

    Raises:
      ValueError: ``step`` outside the run's stable steps (1 … its divergence
        or last step) or not a multiple of its ``diagnostics_every``,
        ``paired_run=False`` with a controller or
        ``gradient_reference="paired_run"``, or the replay diverging before
        ``step``.
    """
    _check_step("step", step)
    if paired_run is not None:
        check_flags(paired_run=paired_run)
    check_flags(progress=progress)
    parent = _parent(run, "with_checkpoint")
    step = int(step)
    pc = parent.config
    last = pc.steps if parent.diverged_at is None else parent.diverged_at
    if not 0 < step <= last:
        raise ValueError(f"step {step} is outside the run: it ran steps 0…{last - 1}")
    sink = _parent_sink(parent)
    available = sink.steps()
    if step in available:
        return parent
    start = max((t for t in available if t < step), default=0)
    keep_pair = _replay_keeps_pair(pc, paired_run)
    cfg = pc.replace(steps=step, checkpoint_every=0, checkpoint_at=(step,), paired_run=pc.paired_run and keep_pair)
    fresh, teacher = runner.init_state(cfg)
    state = fresh
    if start:
        _check_parent(parent, sink, start)
        state, _ = sink.restore(start, ckpt.template(program_for(pc), dynamic_for(pc)))
        if not keep_pair:
            state = state._replace(ref_params=fresh.ref_params, ref_opt=fresh.ref_opt)
    member = runner.Member(cfg, state, teacher, ckpt.CheckpointSink(memory={}), start, [],
                           {"key": f"replay of {parent.info.get('key', pc.hash())}"})
    with interruptible(), runner.tqdm(total=step, initial=start, disable=not progress,
                                      desc=f"replay {pc.recipe.name}", unit="step") as bar:
        (replay,) = runner.run_members([member], start, bar=bar)
    if step not in replay.checkpoints:
        raise ValueError(f"the replay of {parent.info.get('label', pc.recipe.name)} from step {start} diverged at "
                         f"step {replay.diverged_at}, before step {step}; the run itself did not")
    first = _first_difference(parent.metrics, replay.metrics, start, step)
    metrics = parent.metrics if first is None else pd.concat(
        [parent.metrics[parent.metrics["step"] < start], replay.metrics], ignore_index=True)
    info = dict(parent.info, replay={"from_step": start, "paired_run": keep_pair, "identical": first is None,
                                     "first_difference": first, "of_path": parent.path})
    out = Run(pc, metrics.reset_index(drop=True), parent.diverged_at, parent.params, parent.wall_time_s, info,
              parent.path)  # a continuation lands next to the run's folder
    out.checkpoints = {step: replay.checkpoints[step]}
    return out


def _check_step(name: str, step) -> None:
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
        raise ArgumentTypeError(f"{name} must be an integer step, got {step!r} ({type(step).__name__})")


def _parent(run, who: str) -> Run:
    """The parent run: ``run`` itself, or the stored run in folder ``run``."""
    if isinstance(run, (str, os.PathLike)):
        return _store.load_dir(run)
    if not isinstance(run, Run):
        raise ArgumentTypeError(f"{who} needs a mxp.Run or a stored run folder (str or os.PathLike), got "
                        f"{type(run).__name__}")
    return run


def _mitigations(apply) -> list[str]:
    """``apply`` (a mitigation name or an iterable of names) as a list, each checked."""
    if isinstance(apply, str):
        apply = [apply]
    elif not isinstance(apply, (list, tuple, set, frozenset)):
        raise ArgumentTypeError(f"apply must be a mitigation name or a list of names (valid: "
                        f"{', '.join(_recipes.MITIGATIONS)}), got {apply!r} ({type(apply).__name__})")
    for name in apply:
        if not isinstance(name, str):
            raise ArgumentTypeError(f"apply must hold mitigation names (str), got {name!r} ({type(name).__name__})")
        _recipes.mitigation(name)  # a ValueError naming the valid ones
    return list(apply)


def replay_summary(replay: dict, step: int, whose: str = "the run's") -> str:
    """One line on a :func:`with_checkpoint` replay (its ``info["replay"]``) to ``step``."""
    return (f"replayed from step {replay['from_step']} to {step}: losses "
            + (f"identical to {whose}" if replay["identical"] else
               f"differ from {whose} from step {replay['first_difference']}"))


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


def continue_state(state: TrainState, parent: Config, child: Config) -> tuple[TrainState, object, list[str]]:
    """``state``, a train state of a ``parent`` run, made a valid state of
    ``child``: ``(state, child's teacher, what was reset)``. A new optimizer
    kind (or a recipe that trains other parameters) starts a fresh optimizer
    state (``"opt_state"``); a paired run the parent lacked (or that a replay
    left out) starts from the student's weights (``"paired_run"``); one the
    child lacks is dropped; the controller's state follows the child's."""
    p_prog, c_prog = program_for(parent), program_for(child)
    fresh, teacher = runner.init_state(child)
    reset = []
    if jax.tree.structure(fresh.opt_state) != jax.tree.structure(state.opt_state):
        state = state._replace(opt_state=c_prog.tx.init(state.params))
        reset.append("opt_state")
    if c_prog.paired and (not p_prog.paired or state.ref_params is None):  # off, or replayed without it
        state = state._replace(ref_params=state.params, ref_opt=c_prog.tx.init(state.params))
        reset.append("paired_run")
    elif c_prog.paired and jax.tree.structure(fresh.ref_opt) != jax.tree.structure(state.ref_opt):
        state = state._replace(ref_opt=c_prog.tx.init(state.ref_params))
    elif not c_prog.paired:
        state = state._replace(ref_params=None, ref_opt=None)
    if (c_prog.selector is None) != (state.ctrl is None):
        state = state._replace(ctrl=fresh.ctrl)
    return state, teacher, reset


def intervene(run: Run | str | Path, at_step: int, recipe: str | _recipes.Recipe | None = None, *,
              apply: str | Iterable[str] = (), store=None, force: bool = False, progress: bool = True,
              **changes) -> Run:
    """Continue ``run`` from its checkpoint at ``at_step`` with a change.

    Args:
      run: a :class:`Run` (or the folder of a stored run) trained with a
        checkpoint at ``at_step`` (``Config.checkpoint_at`` / ``checkpoint_every``),
        or given one by :func:`with_checkpoint` (then ``info["intervention"]
        ["replay"]`` of the result records that replay).
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
    applied = _check_arguments(at_step, recipe, apply, force, progress, changes)
    parent = _parent(run, "intervene")
    pc = parent.config
    sink = _parent_sink(parent)
    at_step = int(at_step)
    _check_checkpoint(parent, sink, at_step)
    new_recipe = _recipes.get(recipe) if recipe is not None else pc.recipe
    if applied:
        new_recipe = _recipes.mitigate(new_recipe, applied)
    child = _child_config(pc, new_recipe, changes, at_step)
    _memory.check(child, checkpoints_in_memory=store is False or (store is None and parent.path is None))
    parent_key = parent.info.get("key", pc.hash())
    key = _store.entry_key(child, parent_key, at_step)
    st = _child_store(store, parent)
    if st is not None:
        st.check_writable()
        if not force:
            found = st.load(key)
            if found is not None:
                _progress.report(None, f"{new_recipe.name} from step {at_step}", [found], progress=progress,
                                 start=at_step)
                return found
        st.prepare(key, fresh=True)

    state, _ = sink.restore(at_step, ckpt.template(program_for(pc), dynamic_for(pc)))
    state, teacher, reset = continue_state(state, pc, child)
    history = parent.metrics[parent.metrics["step"] < at_step].reset_index(drop=True)
    info = {"key": key, "parent": parent_key, "parent_path": parent.path,
            "intervention": {"at_step": at_step, "recipe": recipe_json.to_json(new_recipe), "apply": applied,
                             "changes": {k: v for k, v in child.to_dict().items() if k in changes}, "reset": reset}}
    if "replay" in parent.info:  # the state at at_step was recomputed (with_checkpoint)
        info["intervention"]["replay"] = parent.info["replay"]
    csink = ckpt.CheckpointSink(st.checkpoint_dir(key)) if st is not None else ckpt.CheckpointSink(memory={})
    member = runner.Member(child, state, teacher, csink, at_step, [history] if len(history) else [], info)
    with interruptible() as interruption:
        with runner.tqdm(total=child.steps, initial=at_step, disable=not progress, desc=new_recipe.name,
                         unit="step") as bar:
            (out,) = runner.run_members([member], at_step, bar=bar)
        runner.notify(child)
        out = st.save(out, key) if st is not None else out
        interruption.finish(out)
        _progress.report(bar, f"{new_recipe.name} from step {at_step}", [out], progress=progress, start=at_step)
    return out


def _replay_keeps_pair(pc: Config, paired_run: bool | None) -> bool:
    """Whether :func:`with_checkpoint`'s replay trains the paired FP32 run (``paired_run``: None, as the run
    trained); refuses dropping it where the run reads it and keeping one the run did not have."""
    keep_pair = pc.has_paired_run if paired_run is None else bool(paired_run)
    if pc.has_paired_run and not keep_pair and (pc.controller is not None or pc.gradient_reference == "paired_run"):
        raise ValueError(f"paired_run=False: the run's {'controller' if pc.controller is not None else 'diagnostics'} "
                         f"reads its paired FP32 run; replay it with paired_run=None")
    if keep_pair and not pc.has_paired_run:
        raise ValueError("paired_run=True: the run had no paired FP32 run to replay")
    return keep_pair


def _first_difference(own_metrics: pd.DataFrame, replay_metrics: pd.DataFrame, start: int, step: int) -> int | None:
    """The first step in ``start`` … ``step``−1 whose replayed loss differs from the run's own, bit for bit
    (NaN equal to NaN; a step the run lacks differs), or None."""
    own = own_metrics[(own_metrics["step"] >= start) & (own_metrics["step"] < step)]
    both = replay_metrics[["step", "loss"]].merge(own[["step", "loss"]], on="step", how="left", suffixes=("", "_own"))
    a, b = both["loss"].to_numpy(dtype=float), both["loss_own"].to_numpy(dtype=float)  # NaN: a step the run lacks
    same = (a == b) | (np.isnan(a) & np.isnan(b) & both["step"].isin(own["step"]).to_numpy())
    return None if same.all() else int(both["step"].to_numpy()[~same][0])


def _check_arguments(at_step, recipe, apply, force, progress, changes) -> list[str]:
    """:func:`intervene`'s arguments checked on their own, before the parent is read; returns the
    mitigations' names."""
    applied = _mitigations(apply)
    _check_step("at_step", at_step)
    if recipe is not None and not isinstance(recipe, (str, _recipes.Recipe)):
        raise ArgumentTypeError(f"recipe must be a preset name (str), a Recipe or None, got {recipe!r} "
                                f"({type(recipe).__name__})")
    check_flags(force=force, progress=progress)
    bad = sorted(set(changes) - set(INTERVENABLE_FIELDS))
    if bad:
        unknown = [b for b in bad if b not in Config.field_names()]
        what = "unknown config field(s)" if unknown else "field(s) that cannot change mid-run"
        raise ValueError(f"intervene: {what} {bad}; changeable: {', '.join(INTERVENABLE_FIELDS)}")
    for name, value in changes.items():  # each value on its own before the parent is read
        if name != "checkpoint_at":
            check_field(name, value)
    return applied


def _check_checkpoint(parent: Run, sink, at_step: int) -> None:
    """Refuse an ``at_step`` the parent did not reach or holds no (valid) checkpoint at."""
    available = sink.steps()
    last = parent.config.steps if parent.diverged_at is None else parent.diverged_at
    if not 0 < at_step <= last:
        raise ValueError(f"at_step {at_step} is beyond the run (it ran steps 0…{last - 1}"
                         f"{'' if parent.diverged_at is None else f', diverged at {parent.diverged_at}'}); "
                         f"checkpoints at: {available or 'none'}")
    if at_step not in available:
        raise ValueError(f"no checkpoint at step {at_step}; checkpoints at: {available or 'none'} "
                         f"(train the parent with checkpoint_at=({at_step},) or checkpoint_every=N, N dividing "
                         f"{at_step}, or replay it there with mxp.with_checkpoint(run, {at_step}))")
    _check_parent(parent, sink, at_step)


def _child_config(pc: Config, new_recipe, changes: dict, at_step: int) -> Config:
    """The continued run's config: the parent's with the new recipe and ``changes``. The new recipe is whole
    (the parent's ``scale_rule`` is already applied to the parent's recipe, a change of it applies it again or
    another rule), so the child's ``scale_rule`` is ``None``."""
    child = pc.replace(recipe=new_recipe, scale_rule=None, **changes)
    if child.steps <= at_step:
        raise ValueError(f"steps ({child.steps}) must exceed at_step ({at_step}) to continue the run")
    if child.diagnostics_every and at_step % child.diagnostics_every:
        raise ValueError(f"at_step {at_step} must be a multiple of diagnostics_every ({child.diagnostics_every})")
    return child


def _child_store(store, parent: Run):
    """Where the continued run is kept: ``store``, or by default next to its parent (memory only for a
    parent kept in memory)."""
    if store is None and parent.path is not None:
        return _store.Store(Path(parent.path).resolve().parent)
    return _store.resolve(store)
