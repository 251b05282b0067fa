"""The CPU a benchmark ran on, in words: benchmarks print it, since a
ratio of a bf16-dot step to an FP32 step depends on whether the CPU
multiplies bf16 natively (AVX512-BF16, AMX) or not (AVX2 only)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

__all__ = ["cpu", "describe"]

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu(cpuinfo: str | None = None) -> dict:
    """``{"model", "cores", "flags", "native_bf16"}`` of this machine (or of
    the given ``/proc/cpuinfo`` text): the model name, the CPUs this process
    may run on, which of AVX2/AVX512-BF16/AMX-BF16 it has, and whether it
    has a native bf16 dot (``None`` where ``/proc/cpuinfo`` is not there)."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text() if path.exists() else ""
    fields = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    model = fields.get("model name") or platform.processor() or platform.machine() or "unknown CPU"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"model": model, "cores": cores, "flags": [f for f in ("avx2", *NATIVE_BF16_FLAGS) if f in flags],
            "native_bf16": (any(f in flags for f in NATIVE_BF16_FLAGS) if flags else None)}


def describe(info: dict | None = None) -> str:
    """One line: ``AMD EPYC, 2 cores; avx2 avx512_bf16: native bf16 dots``."""
    info = cpu() if info is None else info
    native = {True: "native bf16 dots", False: "no native bf16 dots", None: "bf16 dot support unknown"}
    flags = " ".join(info["flags"]) or "no AVX2/AVX512-BF16/AMX"
    return f"{info['model']}, {info['cores']} cores; {flags}: {native[info['native_bf16']]}"
