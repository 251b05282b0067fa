"""The GPU check of the MX kernels, from the source tree, in about five minutes.

Run on a machine with an NVIDIA GPU (the H200 image: jax 0.11 with CUDA,
flax, optax, pytest, hypothesis), from the repository root::

    PYTHONUNBUFFERED=1 python scripts/gpu_kernels.py --out "$OUT"

Steps, each timed; a step that fails is reported and the next one still runs;
a step that would start after ``--budget-s`` is skipped and said so:

1. **Mosaic GPU probe** (first: Mosaic GPU kernels cannot be compiled without
   a GPU): compile and run one E4M3 ``wgmma`` (:mod:`mx_proxy.pallas.mosaic_probe`).
2. **Environment**: jax, device, the Pallas backend chosen for this jax.
   **Mosaic GEMM** (step ``mosaic``, at most ``--mosaic-s`` seconds): the Mosaic GPU MX GEMM
   (:mod:`mx_proxy.pallas.mosaic_gemm`) compiled, checked against the reference, autotuned and timed against
   bf16 ``jnp.dot``, ``lax.scaled_dot`` and the Pallas Triton kernel (``scripts/gpu_mosaic.py``; results in
   ``OUT/mosaic_gemm.json``). Without a GPU it is skipped, saying why.
3. **GPU tests**: ``pytest tests/pallas/test_kernels_gpu.py`` (compiled kernels vs
   the reference, all default configurations, extreme scales).
4. **Benchmark**: ``mx-proxy bench kernels`` (4096^3 and 8192^3, E4M3 and E2M1,
   fused and prequantized against bf16, the XLA path, lax.scaled_dot,
   cuDNN and the f32 emulation, plus one width-512 batch-2048 training step
   per backend).
5. **Autotune** (remaining time): the compile-clean candidate configurations
   of each MMA mode at 8192^3; the best ones are written to
   ``OUT/gemm_tuning.json`` (copy it to ``mx_proxy/pallas/gemm_tuning.json`` to use it).
6. **Interpreted-test files, compiled** (if time is left): the matmul,
   operand and quantize test files, which compile their kernels on a GPU.

Everything printed is also written to ``OUT/gpu_kernels.log``. Exit status: 0
when every step that ran passed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from the source tree, nothing installed

import jax  # noqa: E402
import numpy as np  # noqa: E402

from mx_proxy.cli.bench import kernels as bench_kernels  # noqa: E402
from mx_proxy.numerics.quantize import MXSpec  # noqa: E402
from mx_proxy.pallas import backend, mosaic_probe, tuning  # noqa: E402
from mx_proxy.pallas import matmul as mm  # noqa: E402
from mx_proxy.pallas.operand import quantize_operand  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
import gpu_mosaic  # noqa: E402


class _Tee(io.TextIOBase):
    def __init__(self, *streams):
        self.streams = streams

    def write(self, s):
        for st in self.streams:
            st.write(s)
            st.flush()
        return len(s)


def _pytest(files: list[str], timeout_s: float) -> bool:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(timeout_s, 10), cwd=ROOT)
    except subprocess.TimeoutExpired as err:
        out = err.stdout.decode(errors="replace") if isinstance(err.stdout, bytes) else (err.stdout or "")
        print(out[-3000:])
        print(f"# timed out after {timeout_s:.0f} s")
        return False
    print(proc.stdout[-6000:], proc.stderr[-2000:])
    return proc.returncode == 0


def _autotune(out_dir: str, budget_s: float) -> bool:
    n = 8192
    rng = np.random.default_rng(0)
    a = jax.numpy.asarray(rng.standard_normal((n, n), np.float32))
    b = jax.numpy.asarray(rng.standard_normal((n, n), np.float32))
    entries = []
    modes = {"fp8": ("fp8_e4m3", "fp8_e4m3"), "fp8_fp4": ("fp4_e2m1", "fp4_e2m1"), "bf16": ("fp8_e4m3", "fp8_e5m2")}
    per_mode = budget_s / len(modes)
    for mode, (fa, fb) in modes.items():
        qa = quantize_operand(a, MXSpec(fa), 1, row_multiple=256)
        qb = quantize_operand(b, MXSpec(fb), 0, row_multiple=256)

        def run(cfg, qa=qa, qb=qb):
            jax.block_until_ready(mm.mx_gemm(qa, qb, config=cfg))

        results = tuning.autotune(run, tuning.candidates(mode), iters=3, budget_s=per_mode)
        for cfg, t in results[:3]:
            print(f"# autotune {mode}: {cfg}  {2 * n**3 / t / 1e12:.1f} TFLOP/s")
        if results:
            cfg, t = results[0]
            entries.append({"mode": mode, "size_class": "large", "tflops": round(2 * n**3 / t / 1e12, 1),
                            "config": {k: getattr(cfg, k) for k in ("bm", "bn", "bk", "num_warps", "num_stages",
                                                                      "group_m", "mma")}})
    path = os.path.join(out_dir, "gemm_tuning.json")
    with open(path, "w") as f:
        json.dump({"device": jax.devices()[0].device_kind, "jax": jax.__version__, "size": n, "entries": entries},
                  f, indent=1)
    print(f"# wrote {path}")
    return bool(entries)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/gpu_kernels.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for gpu_kernels.log and gemm_tuning.json")
    p.add_argument("--budget-s", type=float, default=290.0, help="no step starts after this many seconds")
    p.add_argument("--mosaic-s", type=float, default=240.0, help="at most this many seconds for step mosaic")
    p.add_argument("--skip", nargs="*", default=[],
                   choices=["probe", "mosaic", "tests", "bench", "autotune", "cpu_tests"])
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    start = time.perf_counter()
    failed, skipped = [], []
    with open(os.path.join(args.out, "gpu_kernels.log"), "w") as log, contextlib.redirect_stdout(_Tee(sys.stdout, log)):

        def step(name: str, fn, *, reserve_s: float = 0.0) -> None:
            elapsed = time.perf_counter() - start
            if name in args.skip or elapsed + reserve_s > args.budget_s:
                skipped.append(name)
                print(f"\n## {name}: skipped ({'--skip' if name in args.skip else f'{elapsed:.0f} s used'})")
                return
            print(f"\n## {name} (t = {elapsed:.0f} s)", flush=True)
            t0 = time.perf_counter()
            try:
                ok = fn()
            except Exception as err:  # noqa: BLE001 - a broken step is reported, the others still run
                ok = False
                print(f"{type(err).__name__}: {err}")
            if ok is None:  # the step said why it cannot run here
                skipped.append(name)
                print(f"## {name}: skipped in {time.perf_counter() - t0:.0f} s", flush=True)
                return
            print(f"## {name}: {'ok' if ok else 'FAILED'} in {time.perf_counter() - t0:.0f} s", flush=True)
            if not ok:
                failed.append(name)

        def probe():
            ok, message = mosaic_probe.run_probe()
            print(message)
            return ok

        def environment():
            print(f"jax {jax.__version__}, devices {jax.devices()}, backend {jax.default_backend()}, "
                  f"Pallas GPU lowering: {backend.BACKEND}")
            return jax.default_backend() == "gpu"

        def bench():
            return bench_kernels.main([]) == 0

        step("probe", probe)
        step("environment", environment)
        def mosaic():
            return gpu_mosaic.run(args.out, min(args.mosaic_s, args.budget_s - (time.perf_counter() - start) - 10))

        step("mosaic", mosaic, reserve_s=40)
        step("tests", lambda: _pytest(["tests/pallas/test_kernels_gpu.py"],
                                      args.budget_s - (time.perf_counter() - start)))
        step("bench", bench, reserve_s=30)
        step("autotune", lambda: _autotune(args.out, min(90.0, args.budget_s - (time.perf_counter() - start))),
             reserve_s=30)
        step("cpu_tests", lambda: _pytest(["tests/pallas/test_kernels_matmul.py",
                                           "tests/pallas/test_kernels_operand.py",
                                           "tests/pallas/test_kernels_quantize.py"],
                                          args.budget_s - (time.perf_counter() - start)), reserve_s=60)
        print(f"\n# gpu_kernels: {time.perf_counter() - start:.0f} s; failed: {failed or 'none'}; "
              f"skipped: {skipped or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
