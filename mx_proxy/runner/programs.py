"""The compiled programs of the host loop: one set per static key.

Each is a :class:`mx_proxy.store.executables.CachedProgram` (compiled once per
argument signature, kept on disk beside the compilation cache, released when
the process runs short of memory mappings); these functions make them and
cache the wrappers per key:

- :func:`init`: a run's initial train state and teacher;
- :func:`single`: ``(segment, val_loss)`` of one run, without a member axis;
- :func:`twins`: the same for a twin group (:mod:`mx_proxy.training.twins`);
- :func:`members`: the same over a member axis (a sweep's program group), vmapped or not (:func:`vmaps`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import numpy as np

from mx_proxy.store.executables import CachedProgram
from mx_proxy.training import twins as _twins
from mx_proxy.training.config import Config
from mx_proxy.training.engine import Dynamic, compiler_options, program_for

__all__ = ["init", "single", "twins", "members", "vmaps", "stack", "shardings"]


def _program(name: str, fn: Callable, key, static_argnames=()) -> CachedProgram:
    opts = compiler_options(key if isinstance(key, Config) else key[0])
    return CachedProgram(name, jax.jit(fn, static_argnames=static_argnames, compiler_options=opts), key, opts)


@functools.lru_cache(maxsize=64)
def init(key: Config):
    return _program("init", program_for(key).init, key)


@functools.lru_cache(maxsize=64)
def single(key: Config):
    """(segment, val_loss) of ``key``'s program for one member, without a
    member axis: the program of a single run (a size-1 ``vmap`` would let XLA
    fuse, and round, differently from the sweeps it must equal)."""
    program = program_for(key)
    return (_program("segment", program.segment, key, ("size",)), _program("val_loss", program.val_loss, key))


@functools.lru_cache(maxsize=16)
def twins(keys: tuple[Config, ...]):
    """(segment, val_loss) of a twin group (:class:`mx_proxy.training.twins.TwinProgram`)."""
    program = _twins.TwinProgram(keys)
    return (_program("twins_segment", program.segment, keys, ("size",)),
            _program("twins_val_loss", program.val_loss, keys))


def vmaps(key: Config, backend: str, devices: int) -> bool:
    """Whether :func:`members` vmaps the members of ``key`` on ``devices`` devices of ``backend``.

    On a one-device CPU the members run one after another (lax.map), each the single run's very program, so
    a member equals its single run bit for bit by construction: batched (vmapped) dots and reductions sum in
    another order for some shapes, and vmap buys a CPU no speed (mx-proxy bench sweep). A controller's cond
    would also become a select of both branches under vmap, so a controlled run never vmaps. Accelerators and
    several CPU devices (the member axis sharded over them) vmap the members, except CPU devices with
    ``dot="bf16"`` (YNNPACK's batched GEMMs); an accelerator's bf16 dots are its tensor cores' GEMMs, batched
    or not."""
    if key.controller is not None:
        return False
    if backend == "cpu":
        return devices > 1 and key.dot != "bf16"
    return True


@functools.lru_cache(maxsize=64)
def members(key: Config, dyn_axes: tuple, teacher_axis):
    """(segment, val_loss) of ``key``'s program over a member axis."""
    program = program_for(key)
    axes = Dynamic(*dyn_axes)
    vmapped = vmaps(key, jax.default_backend(), jax.device_count())

    def one_by_one(fn, state, dyn, teacher):
        """``fn`` per member, one member after another (lax.map), each running
        the single run's program."""
        mapped = (state, Dynamic(*[v if ax == 0 else None for v, ax in zip(dyn, axes)]),
                  teacher if teacher_axis == 0 else None)

        def member(xs):
            s, d, te = xs
            d = Dynamic(*[v if ax == 0 else full for v, full, ax in zip(d, dyn, axes)])
            return fn(s, d, te if teacher_axis == 0 else teacher)

        return jax.lax.map(member, mapped)

    def segment(state, dyn, teacher, start, n, *, size):
        def one(s, d, te):
            return program.segment(s, d, te, start, n, size=size)

        if vmapped:
            return jax.vmap(one, in_axes=(0, axes, teacher_axis))(state, dyn, teacher)
        return one_by_one(one, state, dyn, teacher)

    def val_loss(state, dyn, teacher):
        if vmapped:
            return jax.vmap(program.val_loss, in_axes=(0, axes, teacher_axis))(state, dyn, teacher)
        return one_by_one(program.val_loss, state, dyn, teacher)  # the same GEMMs as a single run's

    group = (key, dyn_axes, teacher_axis)
    return (_program("members_segment", segment, group, ("size",)), _program("members_val_loss", val_loss, group))


def stack(trees):
    """The host arrays of ``trees`` stacked along a new leading (member) axis."""
    return jax.tree.map(lambda *a: np.stack([np.asarray(x) for x in a]), *trees)


def shardings(n_members: int, shard: bool):
    """((member-axis sharding, replicated sharding) or None, members padded to a multiple of the devices)."""
    devices = jax.devices()
    if not shard or len(devices) < 2:
        return None, n_members
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(devices), ("members",))
    padded = math.ceil(n_members / len(devices)) * len(devices)
    return (NamedSharding(mesh, PartitionSpec("members")), NamedSharding(mesh, PartitionSpec())), padded
