"""A run's memory, estimated before anything is traced or compiled.

:func:`check` refuses (a ValueError with the estimate) a run, or a group of
sweep members trained as one program, whose estimate exceeds the memory
available to this process: an absurd size (``width=200000``) fails at once
instead of paging or hanging in the compiler. It first counts the
parameters from the config alone (:func:`parameter_floor`: no model is
built, so a refusal takes milliseconds whatever the depth), then the full
estimate, a lower bound: the train state from ``jax.eval_shape`` of the
program's init (parameters, optimizer state, the paired run); a gradient and
an update of the parameters; the activations of one step's forward and
backward pass, twice with diagnostics (the reference gradient); one
validation batch; the segment program's metric buffers (``chunk`` rows) and
the host's metrics table (one row per step); and, for a run kept in memory,
every checkpoint it keeps. A run it refuses cannot fit.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax
import numpy as np

from mx_proxy.nn.blocks import fc1_width, hidden_width
from mx_proxy.training.config import Config
from mx_proxy.training.engine import dynamic_for, program_for, static_key

__all__ = ["estimate", "available", "check", "parameter_floor"]

# activations kept per block and row for the backward pass (inputs, normalized, hidden pre- and post-activation
# at the MLP's width multiple, their quantized copies): a floor, in float32 values per unit of width
_ACT_PER_WIDTH = 8


def _nbytes(tree) -> int:
    return sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in jax.tree.leaves(tree))


def parameter_floor(config: Config) -> int:
    """Bytes of the student's and the teacher's weight matrices, counted
    from the config alone (no model built, nothing traced)."""
    d = config.width
    h = hidden_width(d, config.act)
    tw, td, ta = config.teacher
    th = hidden_width(tw, ta)
    return 4 * (config.depth * (d * fc1_width(h, config.act) + h * d) + td * (d * fc1_width(th, ta) + th * d))


def _metric_values(config: Config) -> int:
    """Metric values each step records, at least (docs/training.md: metrics)."""
    n = 5 + config.depth
    if config.diagnostics_every:
        n += 5 + 10 * config.depth
    if config.has_paired_run:
        n += 4
    return n


def _buffers(config: Config) -> int:
    """Bytes of one run's activations, validation batch and metric buffers (from the config alone)."""
    width = max(config.width, config.teacher[0])
    acts = config.batch * width * (config.depth + config.teacher[1]) * _ACT_PER_WIDTH * 4
    metrics = _metric_values(config) * 4 * (config.chunk + config.steps)
    return acts * (2 if config.diagnostics_every else 1) + metrics + 2 * config.batch * config.width * 4


def estimate(config: Config, members: int = 1, *, checkpoints_in_memory: bool = False) -> int:
    """Bytes ``members`` runs of ``config`` need at least (see the module
    docstring); ``checkpoints_in_memory``: the runs keep their checkpoints
    in memory (no run store)."""
    state, teacher = jax.eval_shape(program_for(static_key(config)).init, dynamic_for(config))
    params = _nbytes(state.params) * (2 if config.diagnostics_every else 1)
    kept = len(config.checkpoint_steps()) * _nbytes(state) if checkpoints_in_memory else 0
    per_member = _nbytes(state) + 2 * params + _buffers(config) + kept
    return members * per_member + _nbytes(teacher)


def _cgroup_free() -> int | None:
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else max(int(limit) - used, 0)


def available() -> int:
    """Bytes this process can still use: the accelerator's memory limit on
    GPU/TPU, else the host's available memory (``MemAvailable``, or
    ``os.sysconf``), bounded by a cgroup limit."""
    dev = jax.devices()[0]
    if dev.platform != "cpu":
        stats = dev.memory_stats() or {}
        if "bytes_limit" in stats:
            return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    free = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        free = None
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return 1 << 62
    cg = _cgroup_free()
    return free if cg is None else min(free, cg)


def _gib(n: int) -> str:
    return f"{n / 2 ** 30:.1f} GiB"


def check(config: Config, members: int = 1, *, checkpoints_in_memory: bool = False) -> None:
    """Raise a ValueError, with the estimate, if ``members`` runs of
    ``config`` trained as one program cannot fit in :func:`available` memory
    (what the config alone tells first, so an absurd size is refused before
    any tracing)."""
    free = available()
    need = members * (parameter_floor(config) + _buffers(config))
    if need <= free:
        need = estimate(config, members, checkpoints_in_memory=checkpoints_in_memory)
    if need > free:
        who = "this run" if members == 1 else f"these {members} sweep members (one program)"
        raise ValueError(f"{who} needs at least {_gib(need)} of memory (width {config.width}, depth {config.depth}, "
                         f"batch {config.batch}) but {_gib(free)} is available; make it smaller"
                         + ("" if members == 1 else " or pass group_size="))
