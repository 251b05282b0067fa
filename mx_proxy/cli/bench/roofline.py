"""The roofline of a compiled step: the fastest a device could run it, from XLA's own count of its work.

XLA's ``compiled.cost_analysis()`` gives a program's FLOPs and the bytes it moves. A GEMM runs at the peak of its
dot precision (:data:`DOT_CLASSES`): ``bf16`` (bf16 operands, float32 accumulation: tensor cores on a GPU; the
quantized GEMMs of every MX recipe, exact as bf16 dots), ``tf32`` (float32 operands at JAX's default precision,
which an NVIDIA GPU runs as TF32 on tensor cores) and ``f32`` (float32 operands at ``HIGHEST``: true float32,
no tensor cores). XLA's count does not say which of its FLOPs are which GEMM's, so each GEMM's FLOPs (2·M·N·K, batch
dims included) are counted from the traced program (:func:`dot_flops`: every ``dot_general``, through calls,
custom derivatives and the largest branch of a conditional; a scan's body times its length; a while loop's body
once). The rest of XLA's FLOPs (elementwise, reductions) run at the ``f32`` peak. Then

    compute time = Σ_class GEMM FLOPs / peak(class) + other FLOPs / peak(f32)
    memory time  = bytes accessed / bandwidth
    roofline time = max(compute time, memory time)

and a measured time's *fraction* of the roofline is roofline time / measured time (1 = at the roofline).
:data:`PEAKS` holds the datasheet peaks (dense, no sparsity) of the GPUs this project borrows; a CPU's are measured
on the machine by :func:`measure_cpu` (a float32 and a bf16 GEMM, a streaming copy).
"""

from __future__ import annotations

import math
import time

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np

__all__ = ["DOT_CLASSES", "PEAKS", "Peaks", "peaks_for", "dot_flops", "cost", "roofline_seconds", "measure_cpu"]

DOT_CLASSES = ("bf16", "tf32", "f32")

# datasheet peaks of the SXM parts, FLOP/s dense (no 2:4 sparsity) and bytes/s of HBM
PEAKS = {
    "H200": {"bf16": 989e12, "tf32": 494e12, "f32": 67e12, "bandwidth": 4.8e12},
    "H100": {"bf16": 989e12, "tf32": 494e12, "f32": 67e12, "bandwidth": 3.35e12},
    "A100": {"bf16": 312e12, "tf32": 156e12, "f32": 19.5e12, "bandwidth": 2.039e12},
}


class Peaks(dict):
    """FLOP/s per dot class and ``bandwidth`` (bytes/s) of one device, and where they come from (``source``)."""

    def __init__(self, values: dict, source: str):
        super().__init__(values)
        self.source = source


def peaks_for(device_kind: str) -> Peaks | None:
    """The datasheet peaks of a GPU by its JAX ``device_kind`` (e.g. ``NVIDIA H100 80GB HBM3``), or ``None``."""
    for name, values in PEAKS.items():
        if name.lower() in device_kind.lower():
            return Peaks(values, f"datasheet peaks of the {name} SXM")
    return None


def _dot_class(eqn) -> str:
    dtypes = {v.aval.dtype for v in eqn.invars}
    if all(d == jnp.bfloat16 or jnp.dtype(d).itemsize < 2 for d in dtypes):
        return "bf16"
    precision = eqn.params.get("precision")
    precision = precision[0] if isinstance(precision, tuple) else precision
    return "f32" if precision == jax.lax.Precision.HIGHEST else "tf32"


def _gemm_flops(eqn) -> int:
    (_, rc), (_, rb) = eqn.params["dimension_numbers"]
    lhs, rhs = (v.aval.shape for v in eqn.invars)
    free = [n for d, n in enumerate(rhs) if d not in rc and d not in rb]
    return 2 * math.prod(lhs) * math.prod(free)


def _sub(value):
    """The jaxprs a primitive's parameter holds (a jaxpr, a closed jaxpr, or a tuple of them)."""
    if isinstance(value, jex.ClosedJaxpr):
        return [value.jaxpr]
    if isinstance(value, jex.Jaxpr):
        return [value]
    if isinstance(value, (tuple, list)):
        return [j for v in value for j in _sub(v)]
    return []


def dot_flops(jaxpr) -> dict[str, int]:
    """GEMM FLOPs per dot class (:data:`DOT_CLASSES`) of a (closed) jaxpr; see the module docstring."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    total = dict.fromkeys(DOT_CLASSES, 0)
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            total[_dot_class(eqn)] += _gemm_flops(eqn)
            continue
        if eqn.primitive.name == "cond":  # the branch a diagnostic step takes: the largest
            branches = [dot_flops(b) for b in eqn.params["branches"]]
            best = max(branches, key=lambda f: sum(f.values()))
            for k in DOT_CLASSES:
                total[k] += best[k]
            continue
        times = eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1
        for name, value in eqn.params.items():
            if eqn.primitive.name == "while" and name == "cond_jaxpr":
                continue
            for sub in _sub(value):
                for k, v in dot_flops(sub).items():
                    total[k] += times * v
    return total


def cost(fn, *args) -> dict:
    """``{"flops", "bytes", "dots": {class: FLOPs}}`` of ``jax.jit(fn)(*args)``: XLA's ``cost_analysis()`` of the
    compiled program (FLOPs, bytes accessed) and its GEMM FLOPs per dot class (:func:`dot_flops`)."""
    compiled = jax.jit(fn).lower(*args).compile()
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
    return {"flops": float(analysis.get("flops", 0.0)), "bytes": float(analysis.get("bytes accessed", 0.0)),
            "dots": dot_flops(jax.make_jaxpr(fn)(*args))}


def roofline_seconds(c: dict, peaks: dict) -> dict:
    """``{"compute", "memory", "seconds", "bound"}``: the roofline of cost ``c`` (:func:`cost`) on a device with
    ``peaks`` (FLOP/s per dot class, ``bandwidth`` in bytes/s); see the module docstring."""
    gemm = sum(c["dots"].values())
    compute = sum(c["dots"][k] / peaks[k] for k in DOT_CLASSES) + max(c["flops"] - gemm, 0.0) / peaks["f32"]
    memory = c["bytes"] / peaks["bandwidth"]
    return {"compute": compute, "memory": memory, "seconds": max(compute, memory),
            "bound": "compute" if compute >= memory else "memory"}


def _best(fn, *args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return min(times)


def measure_cpu(n: int = 1024, stream_mib: int = 64, repeats: int = 5) -> Peaks:
    """This machine's peaks, measured: an ``n``×``n`` float32 GEMM at ``HIGHEST`` (the ``f32`` and ``tf32``
    peaks: a CPU has no TF32), a bf16 × bf16 → float32 GEMM (``bf16``), and a ``stream_mib`` MiB float32 array
    scaled into a new one (bandwidth: read + write); the best of ``repeats`` each."""
    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), jnp.float32)
    f32 = jax.jit(lambda x: jax.lax.dot(x, x, precision=jax.lax.Precision.HIGHEST))
    b16 = jax.jit(lambda x: jax.lax.dot(x, x, preferred_element_type=jnp.float32))
    flops = 2.0 * n ** 3
    x = jnp.ones(stream_mib * 2 ** 20 // 4, jnp.float32)
    stream = jax.jit(lambda v: v * 2.0)
    values = {"f32": flops / _best(f32, a, repeats=repeats), "bf16": flops / _best(b16, a.astype(jnp.bfloat16),
                                                                                 repeats=repeats),
              "bandwidth": 2 * x.nbytes / _best(stream, x, repeats=repeats)}
    values["tf32"] = values["f32"]
    return Peaks(values, f"measured here: {n}x{n} GEMMs, a {stream_mib} MiB stream")
