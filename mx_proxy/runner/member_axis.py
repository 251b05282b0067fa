"""How the members of one program group are laid out for their compiled program (:func:`place`): paired
members that differ only in recipe as a twin group beside one shared reference run
(:mod:`mx_proxy.training.twins`); one member as the single-run program, its member axis on the host; several
stacked on a member axis (``lax.map`` on a one-device CPU, ``vmap`` on accelerators, sharded over several
devices), with only the dynamic fields that differ batched. Each layout gives the host loop the same three
functions: a segment, the validation loss, and one member's tree out of the program's."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import numpy as np

from mx_proxy.runner import programs
from mx_proxy.runner.members import Member
from mx_proxy.training import twins as _twins
from mx_proxy.training.engine import Dynamic, TrainState, dynamic_for, static_key

__all__ = ["Placed", "place"]


class Placed(NamedTuple):
    """A program group ready for the host loop.

    ``state``, ``dyn``, ``teacher``: the members' train state, dynamic fields and teacher as the program takes
    them; ``segment(state, dyn, teacher, start, n)`` → (new state, each member's metrics of its ``n`` steps);
    ``val(state, dyn, teacher)`` → each member's validation loss; ``unstack(tree, i)`` → member ``i``'s part of
    a (host) tree of the program's."""

    state: TrainState
    dyn: Dynamic
    teacher: object
    segment: Callable
    val: Callable
    unstack: Callable


def _rows(metrics: dict, n: int) -> dict:
    """The first ``n`` rows of a segment's metrics (its steps; the program's
    buffers hold ``chunk`` rows, see :func:`mx_proxy.training.engine.run_steps`)."""
    return {k: v[:n] for k, v in metrics.items()}


def place(group: list[Member], *, shard: bool = True, twins: bool = False) -> Placed:
    """The layout of ``group`` (see the module docstring); ``twins``: the members are paired runs that differ
    only in recipe (:func:`mx_proxy.training.twins.shareable`)."""
    dyns = [dynamic_for(m.config) for m in group]
    if twins:
        return _twin_group(group, dyns)
    if len(group) == 1:
        return _single(group, dyns)
    return _stacked(group, dyns, shard)


def _twin_group(group: list[Member], dyns) -> Placed:
    """Members differing only in recipe, one reference run: see :mod:`mx_proxy.training.twins`."""
    chunk = group[0].config.chunk
    seg2, val2 = programs.twins(tuple(static_key(m.config) for m in group))

    def seg(state, dyn, teacher, start, n):
        new, m = seg2(state, dyn, teacher, start, np.int32(n), size=chunk)
        return new, [_rows(mi, n) for mi in jax.device_get(m)]

    def val(state, dyn, teacher):
        return np.asarray(val2(state, dyn, teacher))

    def unstack(tree, i):
        return _twins.member(tree, i)

    return Placed(_twins.twin_state([m.state for m in group]), dyns[0], group[0].teacher, seg, val, unstack)


def _single(group: list[Member], dyns) -> Placed:
    """One member: the single-run program; the member axis lives on the host."""
    chunk = group[0].config.chunk
    seg1, val1 = programs.single(static_key(group[0].config))

    def seg(state, dyn, teacher, start, n):
        new, m = seg1(state, dyn, teacher, start, np.int32(n), size=chunk)
        return new, [_rows(jax.device_get(m), n)]

    def val(state, dyn, teacher):
        return np.asarray(val1(state.params, dyn, teacher))[None]

    def unstack(tree, i):
        return tree

    return Placed(group[0].state, dyns[0], group[0].teacher, seg, val, unstack)


def _stacked(group: list[Member], dyns, shard: bool) -> Placed:
    """Several members stacked on a member axis, padded to a multiple of the devices and sharded over them."""
    M = len(group)
    chunk = group[0].config.chunk
    sh, padded = programs.shardings(M, shard and M > 1)
    # batched dynamic fields: those that differ, and always lr (the engine's per-member batch copy keys on it)
    batched = {f: f == "lr" or any(not np.array_equal(getattr(d, f), getattr(dyns[0], f)) for d in dyns)
               for f in Dynamic._fields}
    share_teacher = not batched["teacher_seed"]
    dyn_axes = tuple(0 if batched[f] else None for f in Dynamic._fields)
    teacher_axis = None if share_teacher else 0
    pad = list(range(M)) + [M - 1] * (padded - M)

    def member_axis(trees):
        return programs.stack([trees[i] for i in pad])

    state = member_axis([m.state for m in group])
    dyn = Dynamic(*(member_axis([getattr(d, f) for d in dyns]) if batched[f] else getattr(dyns[0], f)
                    for f in Dynamic._fields))
    teacher = group[0].teacher if share_teacher else member_axis([m.teacher for m in group])
    if sh is not None:
        split, repl = sh
        state = jax.device_put(state, split)
        dyn = Dynamic(*(jax.device_put(v, split if batched[f] else repl) for f, v in zip(Dynamic._fields, dyn)))
        teacher = jax.device_put(teacher, repl if share_teacher else split)
    seg_members, val_params = programs.members(static_key(group[0].config), dyn_axes, teacher_axis)

    def seg(state, dyn, teacher, start, n):
        new, m = seg_members(state, dyn, teacher, start, np.int32(n), size=chunk)
        m = jax.device_get(m)
        return new, [_rows({k: v[i] for k, v in m.items()}, n) for i in range(M)]

    def val(state, dyn, teacher):
        return np.asarray(val_params(state.params, dyn, teacher))

    def unstack(tree, i):
        return jax.tree.map(lambda a: a[i], tree)

    return Placed(state, dyn, teacher, seg, val, unstack)
