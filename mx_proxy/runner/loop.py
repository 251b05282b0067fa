"""One host loop for every run: ``train``, ``sweep`` (and ``mx_proxy.runner.interventions.intervene``).

:func:`run_members` drives a *member axis*: members share one compiled
program (their configs differ only in the engine's dynamic fields: learning
rate, LR floor, noise, spike factor, seeds), their train states are stacked
and the engine's pure ``segment`` and ``val_loss`` run over them: one after
another (``lax.map``) on a one-device CPU, ``jax.vmap``-ed on accelerators
(see :func:`mx_proxy.runner.programs.members`; the layouts:
:mod:`mx_proxy.runner.member_axis`; the members and where each starts:
:mod:`mx_proxy.runner.members`). Per segment the loop records metrics,
checkpoints the members that reach a checkpoint step, calls ``on_segment`` and stops a member that
diverged (the engine has frozen it). ``train`` is that loop over one member,
``sweep`` over the members of each program group, ``intervene`` over one
member restored from a checkpoint. Paired members that differ only in recipe
run as a twin group instead (:mod:`mx_proxy.training.twins`): one program trains their
shared reference run once beside them, and each member's paired train state
is sliced out of it for checkpoints and results.

What members share is computed once: the teacher (unless ``teacher_seed``
differs) and the batches (unless ``data_seed`` or ``noise`` does). With
several JAX devices the member axis is sharded over them (padded to a
multiple of the device count); across hosts, call
``jax.distributed.initialize()`` in every process first. A stability
controller's step is one ``lax.cond``, which ``vmap`` would turn into a
select of both branches, so controller groups always map their members with
``lax.map``. On a one-device CPU a member of a sweep is its single run's
program, and reproduces that run bit for bit.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable

import jax
import numpy as np
import pandas as pd

from mx_proxy.runner import device as _device
from mx_proxy.runner import interrupt
from mx_proxy.runner import progress as _progress
from mx_proxy.runner.interrupt import Stopped, interruptible, stop  # noqa: F401 (stop: part of this API)
from mx_proxy.runner.member_axis import place
from mx_proxy.runner.members import Member, init_state, prepare_member
from mx_proxy.store import run_store as _store
from mx_proxy.training import memory as _memory
from mx_proxy.training import twins as _twins
from mx_proxy.training.config import Config
from mx_proxy.training.engine import TrainState, static_key
from mx_proxy.training.result import Run, metrics_frame, segment_length
from mx_proxy.training.sweeps import Sweep, members
from mx_proxy.training.values import ArgumentTypeError, check_flags

tqdm = _progress.bar  # the host loop's bar factory (a training worker of mx_proxy.experiments.parallel replaces it)

__all__ = ["train", "sweep", "load", "run_members", "init_state", "Member", "hooks", "notify", "stop", "Stopped"]

# Called with the Config of every run or sweep member actually trained (not loaded from a store).
hooks: list[Callable[[Config], None]] = []

# --------------------------------------------------------------------------- the host loop


def _finish(member: Member, state: TrainState, frames, wall: float) -> Run:
    metrics = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame({"step": []})
    diverged_at = int(state.diverged_at) if bool(state.diverged) else None
    if diverged_at is not None:
        metrics = metrics[metrics["step"] <= diverged_at].reset_index(drop=True)
    run = Run(member.config, metrics, diverged_at, jax.device_get(state.params), member.wall_before + wall,
              dict(member.info, device=_device.joined(member.info.get("device"), _device.describe())))
    if member.sink.directory is None:
        run.checkpoints = member.sink.memory
    return run


def run_members(group: list[Member], start: int, *, bar=None, shard: bool = True,
                on_segment: Callable | None = None, twins: bool = False) -> list[Run]:
    """Train the members of one program group from step ``start`` to the end
    as one compiled program; see the module docstring. ``twins``: the
    members are paired runs that differ only in recipe (:func:`mx_proxy.training.twins.shareable`)
    and train beside one shared reference run.

    ``on_segment(t, runs_so_far)`` is called after every segment with the
    step reached and, per member, a :class:`Run` of its metrics so far
    (parameters omitted): how a live view follows a run.
    """
    t0 = time.perf_counter()
    c0 = group[0].config
    M = len(group)
    state, dyn, teacher, seg, val, unstack = place(group, shard=shard, twins=twins)
    frames = [list(m.frames) for m in group]
    stopped = [bool(np.asarray(m.state.diverged)) for m in group]
    ckpt_steps = set(c0.checkpoint_steps())
    meta = {"code_version": _store.code_version()}
    here = _device.describe()  # each checkpoint records the machines its member trained on so far
    t = start
    while t < c0.steps and not all(stopped):
        n = segment_length(c0, t)
        vals = val(state, dyn, teacher) if c0.val_every and t % c0.val_every == 0 else None
        state, m = seg(state, dyn, teacher, np.int32(t), n=n)  # m: each member's metrics
        active = [i for i in range(M) if not stopped[i]]
        for i in active:
            frame = metrics_frame(m[i], start=t)
            frame["val_loss"] = np.nan
            if vals is not None:
                frame.loc[frame.index[0], "val_loss"] = float(vals[i])
            frames[i].append(frame)
        first = t == start
        t += n
        if bar is not None:
            bar.update(n * len(active))
            if first:
                _progress.restart_clock(bar)
        diverged = np.asarray(state.diverged).reshape(-1)
        for i in active:
            stopped[i] = bool(diverged[i])
        if on_segment is not None:
            on_segment(t, [Run(g.config, pd.concat(f, ignore_index=True), None, info=dict(g.info))
                           for g, f in zip(group, frames)])
        halt = interrupt.requested() and t < c0.steps and not all(stopped)  # asked during the segment or on_segment
        if t in ckpt_steps or halt:
            host = jax.device_get(state)
            spent = (time.perf_counter() - t0) / M
            for i in active:
                _checkpoint(group[i], t, unstack(host, i), frames[i],
                            dict(meta, config_hash=group[i].config.hash(), parent=group[i].info.get("parent"),
                                 wall_time_s=group[i].wall_before + spent,
                                 device=_device.joined(group[i].info.get("device"), here),
                                 **({"stopped": True} if t not in ckpt_steps else {})))
        if halt:
            raise Stopped(t, [Run(group[i].config, pd.concat(frames[i], ignore_index=True), None,
                                  info=dict(group[i].info)) for i in active],
                          [group[i].sink.directory for i in active])
    host = jax.device_get(state)
    wall = (time.perf_counter() - t0) / M
    return [_finish(g, unstack(host, i), frames[i], wall) for i, g in enumerate(group)]


def _checkpoint(member: Member, t: int, state, frames, meta: dict) -> None:
    """Save ``member``'s checkpoint at step ``t``; one that cannot be written
    (a full disk) is one warning, and the run goes on without it."""
    try:
        member.sink.save(t, state, pd.concat(frames, ignore_index=True), meta)
    except OSError as e:
        warnings.warn(f"{e.strerror or e}; the run goes on without it (a rerun resumes from an earlier checkpoint, "
                      f"or trains again)", _store.StoreWarning, stacklevel=3)


# --------------------------------------------------------------------------- train / sweep / intervene


def _check_config(config):
    if not isinstance(config, Config):
        raise ArgumentTypeError(f"config must be a mxp.Config, got {type(config).__name__}")


def notify(config: Config):
    """Call every hook with the config of a run that was actually trained."""
    for h in list(hooks):
        h(config)


def train(config: Config, *, store=None, force: bool = False, progress: bool = True,
          on_segment: Callable | None = None) -> Run:
    """Train the student of ``config`` from its seed; returns a :class:`Run`.

    Never raises on divergence: a NaN/Inf or spiking loss stops the run
    cleanly with ``diverged_at`` set and everything before it kept.

    ``store``: a run-store folder (see :mod:`mx_proxy.store.run_store`) or ``None`` (the
    default: memory only, nothing written). With a store, a config already
    stored there is loaded instead of trained (``force=True`` retrains), and
    a run interrupted after a checkpoint resumes from it. ``on_segment``: see
    :func:`run_members`. Ctrl-C (Kernel → Interrupt) stops it at the end of the
    segment, checkpointed in the store, and raises
    :class:`mx_proxy.runner.interrupt.Interrupted` saying so in one line.
    """
    _check_config(config)
    check_flags(on_segment, force=force, progress=progress)
    st = _store.resolve(store)
    key = config.hash()
    if st is not None:
        st.check_writable(key)
        st.clean()
        if not force:
            run = st.load(key)
            if run is not None:
                _progress.report(None, config.recipe.name, [run], progress=progress)
                return run
    _memory.check(config, checkpoints_in_memory=st is None)
    with interruptible() as state:
        member = prepare_member(config, st, key, force)
        with tqdm(total=config.steps, initial=member.start, disable=not progress, desc=config.recipe.name,
                  unit="step") as bar:
            (run,) = run_members([member], member.start, bar=bar, on_segment=on_segment)
        notify(config)
        run = st.save(run, key) if st is not None else run
        state.finish(run)
        _progress.report(bar, config.recipe.name, [run], progress=progress)
    return run


def load(path) -> Run:
    """A stored run from its folder (``<store>/<key>``), verified (see
    :func:`mx_proxy.store.run_store.load_dir`: a damaged, incomplete or edited entry
    raises a ValueError, a stale one warns)."""
    return _store.load_dir(path)


def _group_key(c: Config):
    return static_key(c), c.steps, c.checkpoint_steps()


def sweep(config: Config, *, store=None, force: bool = False, progress: bool = True, shard: bool = True,
          group_size: int | None = None, **axes) -> Sweep:
    """Train every combination of ``axes`` (Config fields → lists of values).

    Members that differ only in dynamic fields (``lr``, ``lr_min``, ``noise``,
    ``spike_factor``, ``seed``, ``data_seed``, ``teacher_seed``, the reference
    seeds) run as one compiled program over a member axis; other axes loop over such
    groups. Paired members (``paired_run=True``) that differ only in
    ``recipe`` train as one program beside one shared reference run
    (:mod:`mx_proxy.training.twins`): k recipes cost 1 + k runs, not 2k, with the same
    results bit for bit. With a ``store``, members already there are loaded (a damaged,
    edited or stale member alone is retrained) and each finished group is
    saved before the next starts. ``shard``: split the member axis over all
    JAX devices when there are several. ``group_size`` caps members per
    compiled call (memory). Ctrl-C (Kernel → Interrupt) stops at the end of the
    segment: finished groups are kept (stored), the group training is
    checkpointed, and :class:`mx_proxy.runner.interrupt.Interrupted` says so in one line.

    Raises:
      ValueError: an unknown axis (naming the valid fields), an axis with no
        values, or an invalid value (the Config's own message).
    """
    _check_config(config)
    check_flags(force=force, progress=progress, shard=shard)
    if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer))):
        raise ArgumentTypeError(f"group_size must be a positive integer or None, got {group_size!r}")
    if group_size is not None and group_size < 1:
        raise ValueError(f"group_size must be a positive integer or None, got {group_size!r}")
    axes, configs = members(config, axes)
    st = _store.resolve(store)
    if st is not None:
        st.check_writable()
        st.clean()
    keys = [c.hash() for c in configs]
    results: dict[str, Run] = {}
    if st is not None and not force:
        for k in dict.fromkeys(keys):
            r = st.load(k)
            if r is not None:
                results[k] = r
    todo = {k: c for k, c in zip(keys, configs) if k not in results}
    twin_sets: dict = {}  # paired members that differ only in recipe share one reference run
    for k, c in todo.items():
        twin_sets.setdefault(c.replace(recipe="fp32"), []).append(k)
    twin_chunks = [ks for ks in twin_sets.values() if _twins.shareable([todo[k] for k in ks])]
    shared = {k for ks in twin_chunks for k in ks}
    groups: dict = {}
    for k, c in todo.items():
        if k not in shared:
            groups.setdefault(_group_key(c), []).append(k)
    chunks = [(ks, True) for ks in twin_chunks]
    for ks in groups.values():
        size = group_size or len(ks)
        chunks += [(ks[i:i + size], False) for i in range(0, len(ks), size)]
    for ks, _ in chunks:
        _memory.check(todo[ks[0]], members=len(ks), checkpoints_in_memory=st is None)
    total = sum(c.steps for c in todo.values())
    with interruptible() as state, tqdm(total=total, disable=not progress or not total,
                                        desc=f"sweep ({len(todo)} to train)", unit="step") as bar:
        for ks, twins in chunks:
            if state.requested.is_set():  # interrupted between groups: the finished ones are kept
                break
            group = [prepare_member(todo[k], st, k, force) for k in ks]
            if len({m.start for m in group}) > 1:  # resumed from different checkpoints: from the earliest
                at = min(m.start for m in group)
                group = [prepare_member(todo[k], st, k, force, at=at) for k in ks]
            runs = run_members(group, group[0].start, bar=bar, shard=shard, twins=twins)
            failed = []
            for k, run in zip(ks, runs):
                notify(run.config)
                run.info["sweep_group_size"] = len(ks)
                if twins:
                    run.info["shared_reference"] = len(ks)
                try:
                    results[k] = st.save(run, k) if st is not None else run
                    state.finish(results[k])
                except _store.SaveError as e:  # save the group's other members all the same
                    failed.append(e)
            if failed:
                raise _store.SaveError("; ".join(str(e) for e in failed), failed[0].run, failed[0].kept)
        if not state.requested.is_set():
            _progress.report(bar, f"sweep of {len(set(keys))} runs", [results[k] for k in dict.fromkeys(keys)],
                             progress=progress)
    return Sweep(config, axes, configs, [results[k] for k in keys])
