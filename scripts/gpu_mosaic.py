"""The Mosaic GPU MX GEMM (:mod:`mx_proxy.pallas.mosaic_gemm`) on a GPU: exact, how fast, which tiles.

Step ``mosaic`` of ``scripts/gpu_kernels.py``, or alone (from the repository root)::

    PYTHONUNBUFFERED=1 python scripts/gpu_mosaic.py --out "$OUT" [--budget-s 240]

Three phases, each stopped when ``--budget-s`` is spent (what finished is kept):

1. **Exactness**: the compiled kernel against ``values(a) @ values(b).T``
   (float64 on the host) within ``accumulation_tolerance`` for E4M3, FP4
   E2M1, E5M2, FP6 E2M3 and mixed E4M3 x E5M2 at a ragged (200, 136, 300), and
   E4M3 and E2M1 at (512, 512, 1024); and :func:`~mx_proxy.pallas.mosaic_gemm.mosaic_mx_gemm`
   on operands with an extreme scale (its exact Triton fallback).
2. **Autotune** at 4096^3 E4M3: a small grid of tiles / stages / A through
   registers or shared memory (those within Hopper's shared memory), best
   first.
3. **Timing** with the best configuration, at 4096^3 and 8192^3 for E4M3, then
   E2M1 (prequantized operands): Mosaic kernel, Pallas Triton kernel
   (``mx_gemm``), ``lax.scaled_dot`` and bf16 ``jnp.dot`` (seconds, best of
   ``--iters``), with the kernel's largest error over its bound (on the device,
   float32: ``|out - ref| / (2 K 2**-24 |a||b| + K 2**-126)``; <= 1 is exact
   within the tolerance).

Everything goes to ``OUT/mosaic_gemm.json`` (rewritten atomically after each
phase) and is printed. Without a GPU it prints why it skips and does nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from the source tree, nothing installed

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from mx_proxy.numerics.quantize import MXSpec  # noqa: E402
from mx_proxy.pallas import matmul as mm  # noqa: E402
from mx_proxy.pallas import mosaic_gemm as mg  # noqa: E402
from mx_proxy.pallas import quantize as mxq  # noqa: E402
from mx_proxy.pallas.operand import MXOperand, operand_values, quantize_operand  # noqa: E402
from mx_proxy.pallas.tolerance import accumulation_tolerance  # noqa: E402

EXACT_CASES = tuple((pair, (200, 136, 300)) for pair in (  # every format, ragged; then two square
    ("fp8_e4m3", "fp8_e4m3"), ("fp4_e2m1", "fp4_e2m1"), ("fp8_e5m2", "fp8_e5m2"), ("fp6_e2m3", "fp6_e2m3"),
    ("fp8_e4m3", "fp8_e5m2"))) + tuple((pair, (512, 512, 1024)) for pair in (("fp8_e4m3",) * 2, ("fp4_e2m1",) * 2))
TIMED = ((4096, "fp8_e4m3"), (8192, "fp8_e4m3"), (4096, "fp4_e2m1"), (8192, "fp4_e2m1"))
SDOT_DTYPES = {"fp8_e4m3": jnp.float8_e4m3fn, "fp4_e2m1": jnp.float4_e2m1fn}


def tune_grid() -> list[mg.MosaicConfig]:
    """The autotune candidates within Hopper's shared memory at K = 4096, the default first."""
    grid = [mg.MosaicConfig()]
    for bm, bn, bk, stages, a_smem in itertools.product((64, 128), (128, 256), (128, 256), (2, 3, 4), (False, True)):
        cfg = mg.MosaicConfig(bm, bn, bk, stages, a_smem)
        if cfg not in grid and mg.smem_bytes(cfg, 4096 // bk) <= mg.SMEM_LIMIT:
            grid.append(cfg)
    return grid


def best_time(fn, args, iters: int) -> float:
    """Best wall time (s) of ``fn(*args)`` over ``iters`` runs after one untimed (compiling) run."""
    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return best


def _operands(fa, fb, m, n, k, seed=0):
    rng = np.random.default_rng(seed)
    a = quantize_operand(jnp.asarray(rng.standard_normal((m, k), np.float32)), MXSpec(fa), 1)
    b = quantize_operand(jnp.asarray(rng.standard_normal((k, n), np.float32)), MXSpec(fb), 0)
    return a, b


def _ratio_host(out, a, b) -> float:
    va, vb = operand_values(a).astype(np.float64), operand_values(b).astype(np.float64)
    err = np.abs(np.asarray(out, np.float64) - va @ vb.T)
    return float(np.max(err / accumulation_tolerance(va, vb.T)))


def exactness(deadline: float) -> list[dict]:
    rows = []
    for (fa, fb), (m, n, k) in EXACT_CASES:
        if time.perf_counter() > deadline:
            break
        a, b = _operands(fa, fb, m, n, k)
        row = {"a": fa, "b": fb, "shape": [m, n, k]}
        try:
            row["err_over_bound"] = _ratio_host(mg.mosaic_gemm(a, b), a, b)
            row["ok"] = row["err_over_bound"] <= 1.0
        except Exception as err:  # noqa: BLE001 - a case that fails is reported, the others still run
            row.update(ok=False, error=f"{type(err).__name__}: {str(err)[:300]}")
        print(f"# exact {fa} x {fb} {m}x{n}x{k}: {row}")
        rows.append(row)
    a, b = _operands("fp8_e4m3", "fp8_e4m3", 128, 128, 256)
    sc = np.asarray(a.scales).copy()
    sc[0, 0] = 3  # outside EXACT_SCALES: the whole GEMM takes the exact Triton kernel
    a = MXOperand(a.data, jnp.asarray(sc), a.element, a.block_size, a.rows, a.k)
    row = {"a": "fp8_e4m3 (scale byte 3)", "b": "fp8_e4m3", "shape": [128, 128, 256], "route": "fallback"}
    try:
        row["err_over_bound"] = _ratio_host(jax.jit(mg.mosaic_mx_gemm)(a, b), a, b)
        row["ok"] = row["err_over_bound"] <= 1.0
    except Exception as err:  # noqa: BLE001
        row.update(ok=False, error=f"{type(err).__name__}: {str(err)[:300]}")
    print(f"# exact fallback: {row}")
    rows.append(row)
    return rows


def autotune(deadline: float, iters: int, n: int = 4096) -> list[dict]:
    """Time every :func:`tune_grid` configuration at n^3 E4M3 until ``deadline``; fastest first."""
    a, b = _operands("fp8_e4m3", "fp8_e4m3", n, n, n)
    rows = []
    for cfg in tune_grid():
        if time.perf_counter() > deadline:
            break
        row = {"config": dataclasses.asdict(cfg)}
        try:
            t = best_time(jax.jit(lambda x, y, cfg=cfg: mg.mosaic_gemm(x, y, cfg)), (a, b), iters)
            row.update(seconds=t, tflops=round(2 * n**3 / t / 1e12, 1))
        except Exception as err:  # noqa: BLE001 - a configuration that does not compile is skipped
            row["error"] = f"{type(err).__name__}: {str(err)[:200]}"
        print(f"# autotune {cfg}: {row.get('tflops', row.get('error'))}")
        rows.append(row)
    return sorted(rows, key=lambda r: r.get("seconds", float("inf")))


@jax.jit
def _err_over_bound(out, va, vb):
    k = va.shape[1]
    hi = jax.lax.Precision.HIGHEST
    ref = jnp.dot(va, vb.T, precision=hi)
    bound = 2.0 * k * 2.0**-24 * jnp.dot(jnp.abs(va), jnp.abs(vb).T, precision=hi) + k * 2.0**-126
    return jnp.max(jnp.abs(out - ref) / bound)


def _values(op: MXOperand):
    """float32 (R, K) values of an operand on the device (codes * 2**(s - 127); exact in EXACT_SCALES)."""
    codes, sc, _, _ = mg.padded_inputs(op, op, mg.MosaicConfig(64, 64, 128, 1))
    f = jax.lax.bitcast_convert_type(jnp.repeat(sc.T.astype(jnp.int32), 32, axis=1) << 23, jnp.float32)
    return (codes.astype(jnp.float32) * f)[: op.rows, : op.k]


def timings(deadline: float, cfg: mg.MosaicConfig, iters: int) -> list[dict]:
    rows = []
    for n, fmt in TIMED:
        if time.perf_counter() > deadline:
            break
        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.standard_normal((n, n), np.float32))
        y = jnp.asarray(rng.standard_normal((n, n), np.float32))
        spec = MXSpec(fmt)
        qa, qb = quantize_operand(x, spec, 1), quantize_operand(y, spec, 0)
        row = {"n": n, "format": fmt, "config": dataclasses.asdict(cfg)}
        cases = {"bf16_dot": (jax.jit(jnp.dot), (x.astype(jnp.bfloat16), y.astype(jnp.bfloat16))),
                 "mosaic": (jax.jit(lambda a, b: mg.mosaic_gemm(a, b, cfg)), (qa, qb)),
                 "triton": (jax.jit(mm.mx_gemm), (qa, qb))}
        ta, tb = mxq.quantize_packed(x, spec, 1), mxq.quantize_packed(y, spec, 0)
        ca, cb = (jnp.asarray(t.codes_as_ml_dtype().astype(np.float32)).astype(SDOT_DTYPES[fmt]) for t in (ta, tb))
        sdot = jax.jit(lambda a, b, u, v: jax.lax.scaled_dot(a, b, lhs_scale=u, rhs_scale=v,
                                                            preferred_element_type=jnp.float32))
        cases["scaled_dot"] = (sdot, (ca, cb, ta.scales_as_e8m0(), tb.scales_as_e8m0()))
        for name, (fn, args) in cases.items():
            try:
                row[name + "_s"] = best_time(fn, args, iters)
            except Exception as err:  # noqa: BLE001 - a baseline missing on this card is reported
                row[name + "_error"] = f"{type(err).__name__}: {str(err)[:200]}"
        if "mosaic_s" in row:
            row["err_over_bound"] = float(_err_over_bound(mg.mosaic_gemm(qa, qb, cfg), _values(qa), _values(qb)))
            for base in ("bf16_dot", "scaled_dot", "triton"):
                if base + "_s" in row:
                    row[f"speed_vs_{base}"] = round(row[base + "_s"] / row["mosaic_s"], 3)
        print(f"# time {fmt} {n}^3: {row}")
        rows.append(row)
    return rows


def write_json(path: str, doc: dict) -> None:
    """Write ``doc`` to ``path`` atomically (a temporary file in the same folder, then a rename)."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


def run(out_dir: str, budget_s: float, iters: int = 5) -> bool | None:
    """The three phases within ``budget_s`` seconds; True if every exactness case passed, None (skipped) without
    a GPU."""
    if jax.default_backend() != "gpu":
        print(f"# mosaic: skipped: jax backend is {jax.default_backend()!r}; the Mosaic GPU kernel compiles only on "
              "an NVIDIA GPU (its CPU checks: tests/pallas/test_mosaic_gemm.py)")
        return None
    start = time.perf_counter()
    path = os.path.join(out_dir, "mosaic_gemm.json")
    doc = {"device": jax.devices()[0].device_kind, "jax": jax.__version__}
    doc["exactness"] = exactness(start + 0.25 * budget_s)
    write_json(path, doc)
    doc["autotune"] = autotune(start + 0.55 * budget_s, iters)
    write_json(path, doc)
    best = next((r["config"] for r in doc["autotune"] if "seconds" in r), None)
    cfg = mg.MosaicConfig(**best) if best else mg.MosaicConfig()
    doc["timings"] = timings(start + budget_s, cfg, iters)
    write_json(path, doc)
    print(f"# wrote {path}")
    return bool(doc["exactness"]) and all(r["ok"] for r in doc["exactness"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/gpu_mosaic.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for mosaic_gemm.json")
    p.add_argument("--budget-s", type=float, default=240.0, help="no phase item starts after this many seconds")
    p.add_argument("--iters", type=int, default=5, help="timed runs per measurement (best kept)")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    return 0 if run(args.out, args.budget_s, args.iters) is not False else 1


if __name__ == "__main__":
    sys.exit(main())
