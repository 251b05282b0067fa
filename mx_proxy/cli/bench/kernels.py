"""``mx-proxy bench kernels``: MX matmul throughput against fair baselines, and one training step per backend.

For M = N = K in ``--sizes`` and each element format in ``--formats``, measured
in one run (ratios matter, machines are shared), as TFLOP/s = 2 M N K / best
time of ``--iters`` runs after a compile run:

* ``pre``      -- the MX GEMM kernel on prequantized operands
  (:func:`mx_proxy.pallas.matmul.mx_gemm`; quantization not timed);
* ``fused``    -- quantize kernel on each operand once, then the GEMM
  (:func:`mx_proxy.pallas.matmul.mx_matmul`);
* ``bf16``     -- ``jnp.dot`` of bfloat16 operands (the bar for a tensor-core GEMM);
* ``xla_q``    -- the XLA path: ``mxp.quantize`` both operands, then an exact
  bf16 ``dot`` with float32 accumulation (MX values are bf16 values);
* ``sdot``     -- ``jax.lax.scaled_dot`` on prequantized FP8/FP4 codes and
  E8M0 scales (``-`` for FP6 / MXINT8, which it cannot take);
* ``cudnn``    -- ``jax.nn.scaled_matmul`` likewise (cuDNN block-scaled GEMM;
  GPU only, ``-`` where unavailable);
* ``emul``     -- ``mxp.quantize`` then a float32 ``dot`` at HIGHEST (the
  numerics everything is checked against);

then the ratios ``pre/bf16``, ``fused/bf16``, ``pre/xla_q``, ``fused/xla_q``
and ``err``: max |fused - emul| over the tolerance bound
(``mx_proxy.pallas.matmul.mma_tolerance`` for compiled FP8 tensor-core results,
``accumulation_tolerance`` otherwise); the command exits 1 if it exceeds 1.

``--step-width/--step-batch``: one training step (Adam, depth 4,
diagnostics off) of ``--step-recipe`` with ``backend="xla"`` and with
``backend="pallas"``, in ms/step (``mx_proxy.cli.bench.step``'s machinery).

On a CPU the kernels run in the Pallas interpreter -- a correctness tool, not
a performance path: the defaults there are one small size, one timed run and
a small step, so the command smoke-tests every path in seconds.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from mx_proxy.cli.bench.step import interleaved_medians, step_timer
from mx_proxy.numerics import recipe as recipes
from mx_proxy.numerics import scale_rules
from mx_proxy.numerics.quantize import MXSpec, quantize
from mx_proxy.pallas import backend
from mx_proxy.pallas import matmul as mm
from mx_proxy.pallas import quantize as mxq
from mx_proxy.pallas.gemm import mma_mode
from mx_proxy.pallas.operand import GEMM_DTYPES, quantize_operand
from mx_proxy.training.config import Config
from mx_proxy.viz.text import plain

DEFAULT_FORMATS = ("fp8_e4m3", "fp4_e2m1")
GPU_SIZES = (4096, 8192)
CPU_SIZES = (256,)
_SDOT_DTYPES = {"fp8_e4m3": jnp.float8_e4m3fn, "fp8_e5m2": jnp.float8_e5m2, "fp4_e2m1": jnp.float4_e2m1fn}
_HIGHEST = jax.lax.Precision.HIGHEST


def best_time(fn, args, iters: int) -> tuple[float, jax.Array]:
    """(best wall time in seconds over ``iters`` runs, last output); one untimed compile run first."""
    out = jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(iters):
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return best, out


@functools.partial(jax.jit, static_argnames=("spec", "fp8_mma"))
def _err_over_bound(out, ref, a, b, spec, fp8_mma: bool):
    """max |out - ref| / tolerance, on the device (see mx_proxy.pallas.matmul.accumulation_tolerance)."""
    k = a.shape[1]
    mag = jnp.dot(jnp.abs(quantize(a, spec, 1)), jnp.abs(quantize(b, spec, 0)), precision=_HIGHEST)
    bound = 2.0 * k * 2.0**-24 * mag + k * 2.0**-126 + (2.0**-8 * mag if fp8_mma else 0.0)
    ok = ~jnp.isnan(ref)
    return jnp.max(jnp.where(ok, jnp.abs(out - ref) / bound, 0.0))


def _codes_for_scaled_dot(x, spec, axis):
    """(codes as the ml_dtypes float type, E8M0 scales) of x blocked along ``axis``, for lax.scaled_dot."""
    t = mxq.quantize_packed(x, spec, axis)
    dtype = _SDOT_DTYPES[spec.element.name]
    if spec.element.name == "fp4_e2m1":  # sub-byte: via the element values (exact in float32), once
        codes = jnp.asarray(t.codes_as_ml_dtype().astype(np.float32)).astype(dtype)
    else:
        codes = jax.lax.bitcast_convert_type(t.codes, dtype)
    return codes, t.scales_as_e8m0()


def _maybe(label: str, fn, args, iters: int):
    """``best_time`` or (nan, reason) when the baseline cannot run here."""
    try:
        return best_time(fn, args, iters)[0], ""
    except Exception as err:  # noqa: BLE001 - a baseline missing on this platform is reported, not fatal
        return float("nan"), f"{label}: {type(err).__name__}: {str(err).splitlines()[0][:100]}"


def gemm_rows(n: int, fmt: str, rule: str, iters: int, block_sizes, on_gpu: bool):
    """One benchmark row (dict of times in seconds and the error ratio) for an n^3 GEMM of format ``fmt``."""
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.standard_normal((n, n), np.float32))
    b = jnp.asarray(rng.standard_normal((n, n), np.float32))
    spec = MXSpec(fmt, scale_rule=rule)
    notes = []
    t = {}
    t["bf16"], _ = best_time(jax.jit(jnp.dot), (a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)), iters)
    def xla_path(x, y):  # the XLA backend's GPU path: quantize, then an exact bf16 dot
        qx, qy = quantize(x, spec, 1).astype(jnp.bfloat16), quantize(y, spec, 0).astype(jnp.bfloat16)
        return jax.lax.dot_general(qx, qy, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)

    xla_q = jax.jit(xla_path)
    t["xla_q"], _ = best_time(xla_q, (a, b), iters)
    emul = jax.jit(functools.partial(mm.mx_matmul_reference, a_spec=spec, b_spec=spec))
    t["emul"], out_e = best_time(emul, (a, b), iters)
    fused = jax.jit(functools.partial(mm.mx_matmul, a_spec=spec, b_spec=spec, block_sizes=block_sizes))
    t["fused"], out_f = best_time(fused, (a, b), iters)
    qa, qb = quantize_operand(a, spec, 1), quantize_operand(b, spec, 0)
    t["pre"], _ = best_time(jax.jit(functools.partial(mm.mx_gemm, block_sizes=block_sizes)), (qa, qb), iters)
    if fmt in _SDOT_DTYPES:
        (ca, sa), (cb, sb) = _codes_for_scaled_dot(a, spec, 1), _codes_for_scaled_dot(b, spec, 0)
        sdot = jax.jit(lambda x, y, u, v: jax.lax.scaled_dot(x, y, lhs_scale=u, rhs_scale=v,
                                                             preferred_element_type=jnp.float32))
        t["sdot"], why = _maybe("lax.scaled_dot", sdot, (ca, cb, sa, sb), iters)
        notes += [why] if why else []
        cudnn = jax.jit(lambda x, y, u, v: jax.nn.scaled_matmul(x[None], y.T[None], u[None], v.T[None],
                                                                preferred_element_type=jnp.float32))
        t["cudnn"], why = _maybe("jax.nn.scaled_matmul", cudnn, (ca, cb, sa, sb), iters) if on_gpu else \
            (float("nan"), "")
        notes += [why] if why else []
    else:
        t["sdot"] = t["cudnn"] = float("nan")
    fp8 = on_gpu and mma_mode(GEMM_DTYPES[fmt], 32, GEMM_DTYPES[fmt], 32) == "fp8"
    err = float(_err_over_bound(out_f.astype(jnp.float32), out_e, a, b, spec, fp8))
    return t, err, notes


def step_times(width: int, batch: int, recipe_name: str, steps: int, repeats: int) -> dict[str, float]:
    """Seconds per training step with ``backend="xla"`` and ``"pallas"`` (median of ``repeats`` calls)."""
    base = recipes.get(recipe_name)
    fns = {}
    for name in ("xla", "pallas"):
        cfg = Config(width=width, depth=4, batch=batch, optimizer="adam", steps=steps, diagnostics_every=0,
                     val_every=0, recipe=base.replace(backend=name))
        fns[name] = step_timer(cfg, steps)
    return {k: v / steps for k, v in interleaved_medians(fns, repeats).items()}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mx-proxy bench kernels", description=plain(__doc__.split("\n\n")[0]))
    p.add_argument("--sizes", type=int, nargs="+", default=None,
                   help="M = N = K values (default: 4096 8192 on a GPU, 256 on a CPU)")
    p.add_argument("--formats", nargs="+", default=list(DEFAULT_FORMATS), choices=list(mxq.MX_FORMATS),
                   help="element formats (default: %(default)s)")
    p.add_argument("--scale-rule", default="floor", choices=list(scale_rules.names()))
    p.add_argument("--iters", type=int, default=None, help="timed runs per measurement (default: 10 GPU, 1 CPU)")
    p.add_argument("--block-sizes", type=int, nargs=3, default=None, metavar=("BM", "BN", "BK"),
                   help="GEMM tiles, powers of two >= 16, BK a multiple of 32 (default: mx_proxy.pallas.tuning)")
    p.add_argument("--step-width", type=int, default=None, help="training-step width (default: 512 GPU, 64 CPU)")
    p.add_argument("--step-batch", type=int, default=None, help="training-step batch (default: 2048 GPU, 64 CPU)")
    p.add_argument("--step-recipe", default="mxfp8_e4m3", help="recipe preset of the step (default: %(default)s)")
    p.add_argument("--step-steps", type=int, default=None, help="steps per timed call (default: 20 GPU, 2 CPU)")
    p.add_argument("--no-step", action="store_true", help="leave out the training-step comparison")
    return p


COLUMNS = ("pre", "fused", "bf16", "xla_q", "sdot", "cudnn", "emul")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    on_gpu = jax.default_backend() == "gpu"
    sizes = args.sizes or (GPU_SIZES if on_gpu else CPU_SIZES)
    if any(s < 16 for s in sizes):
        print(f"mx-proxy bench kernels: sizes must be >= 16, got {sizes}", file=sys.stderr)
        return 2
    iters = args.iters or (10 if on_gpu else 1)
    block_sizes = tuple(args.block_sizes) if args.block_sizes else None
    interpret = backend.resolve_interpret(None)
    print(f"# mx-proxy bench kernels  {datetime.date.today().isoformat()}  device: {jax.devices()[0].device_kind} "
          f"({jax.default_backend()})  jax {jax.__version__}  pallas: {'interpreter' if interpret else backend.BACKEND}"
          f"  scale rule: {args.scale_rule}  best of {iters}")
    if not on_gpu:
        print("# note: on a CPU the kernels run in the Pallas interpreter -- a correctness tool, not a performance "
              "path; these numbers say nothing about a GPU")
    head = ["size", "format"] + list(COLUMNS) + ["pre/bf16", "fus/bf16", "pre/xlaq", "fus/xlaq", "err"]
    print("  ".join(f"{c:>9}" for c in head) + "   (TFLOP/s)")
    status = 0
    for n in sizes:
        flop = 2.0 * n**3
        for fmt in args.formats:
            t, err, notes = gemm_rows(n, fmt, args.scale_rule, iters, block_sizes, on_gpu)
            tf = {k: flop / v / 1e12 for k, v in t.items()}
            row = [str(n), fmt] + [f"{tf[c]:.4g}" if np.isfinite(tf[c]) else "-" for c in COLUMNS]
            row += [f"{t['bf16'] / t['pre']:.3g}", f"{t['bf16'] / t['fused']:.3g}", f"{t['xla_q'] / t['pre']:.3g}",
                    f"{t['xla_q'] / t['fused']:.3g}", f"{err:.2g}"]
            print("  ".join(f"{c:>9}" for c in row), flush=True)
            for note in notes:
                print(f"#   {note}")
            if not err <= 1.0:
                print(f"mx-proxy bench kernels: fused kernel disagrees with the emulation beyond the tolerance "
                      f"({err:.3g} x) for {fmt} at {n}", file=sys.stderr)
                status = 1
    if not args.no_step:
        width, batch = args.step_width or (512 if on_gpu else 64), args.step_batch or (2048 if on_gpu else 64)
        steps = args.step_steps or (20 if on_gpu else 2)
        ms = step_times(width, batch, args.step_recipe, steps, 3 if on_gpu else 1)
        print(f"# train step, width {width}, batch {batch}, depth 4, Adam, {args.step_recipe}: "
              f"xla {ms['xla'] * 1e3:.2f} ms/step, pallas {ms['pallas'] * 1e3:.2f} ms/step, "
              f"pallas/xla {ms['pallas'] / ms['xla']:.3g}")
    return status


if __name__ == "__main__":
    sys.exit(main())
