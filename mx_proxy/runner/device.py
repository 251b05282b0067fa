"""The machine a run trained on, in words: what its checkpoints and exported results record.

A GPU (or other accelerator) is named by JAX's ``device_kind`` (``gpu: NVIDIA H100 80GB HBM3``); a CPU by its model
name from ``/proc/cpuinfo`` (``cpu: AMD EPYC 7B13``), since JAX names every CPU device ``cpu``. The blow-up rate of a
configuration may depend on the machine (the plan's H4), so a member records where each stretch of it trained.
"""

from __future__ import annotations

import platform
from pathlib import Path

import jax

__all__ = ["describe", "cpu_model", "joined"]


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name (from ``/proc/cpuinfo``, or the given text of one; else what ``platform`` knows)."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text() if path.exists() else ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            return value.strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def describe(backend: str | None = None, kind: str | None = None) -> str:
    """``"<backend>: <name>"`` of this process's first JAX device (or of the given backend and device kind): the
    device kind of an accelerator, the CPU's model name for the CPU backend."""
    backend = jax.default_backend() if backend is None else backend
    if backend == "cpu":
        return f"cpu: {cpu_model()}"
    return f"{backend}: {jax.devices()[0].device_kind if kind is None else kind}"


def joined(before: str | None, now: str) -> str:
    """The machines of a run resumed on ``now`` after stretches on ``before`` (``None``: no earlier stretch, or
    one that recorded none): ``now`` alone when they are the same, else ``"before, then now"``."""
    if not before or before == now:
        return now
    if before.endswith(f", then {now}"):
        return before
    return f"{before}, then {now}"
