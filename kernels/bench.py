"""``proxy bench kernels``: MX matmul throughput on whatever device is present.

For M = N = K in ``--sizes`` and each element format in ``--formats`` it
measures, within one run (ratios matter, machines are shared):

* ``kernel``  -- fused Pallas kernel :func:`kernels.mx_matmul.mx_matmul`;
* ``2pass``   -- Pallas quantize kernel on both operands, then the
  prequantized Pallas matmul (``mx_dot(..., method="two_pass")``);
* ``emul``    -- plain-JAX emulation: ``proxy.quantize`` both operands, then
  ``jnp.dot`` in float32 at ``precision=HIGHEST`` (the numerics the kernels
  reproduce; :func:`kernels.mx_matmul.mx_matmul_reference`);
* ``emul_d``  -- the same with ``jnp.dot``'s default precision (TF32 on
  recent NVIDIA GPUs, so not bit-comparable; shown because it is what an
  unconfigured JAX program gets);
* ``bf16``    -- ``jnp.dot`` of bfloat16 operands;

as TFLOP/s (2 M N K / best time of ``--iters`` runs after a compile run),
the ratios kernel/emul and kernel/bf16, and ``err``: max |kernel - emul|
divided by the float32 accumulation bound (must be <= 1).

On a CPU the kernels run in the Pallas interpreter, which is a correctness
tool, not a performance path: the default there is one size (1024) and one
timed run, and the numbers say nothing about a GPU.
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

import proxy
from kernels import backend
from kernels import mx_matmul as mm
from kernels import mx_quantize as mxq
from proxy.quantize import SCALE_RULES

DEFAULT_FORMATS = ("fp8_e4m3", "fp8_e5m2", "fp4_e2m1")
GPU_SIZES = (1024, 4096, 8192)
CPU_SIZES = (1024,)


def _best_time(fn, args, iters: int) -> tuple[float, jax.Array]:
    """(best wall time in seconds over ``iters`` runs, last output); one untimed compile run first."""
    out = jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(iters):
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return best, out


@functools.partial(jax.jit, static_argnames=("spec",))
def _err_over_bound(out, ref, a, b, spec):
    """max |out - ref| / (2 K u (|qa| @ |qb|) + K 2**-126), on the device (see accumulation_tolerance)."""
    k = a.shape[1]
    qa, qb = proxy.quantize(a, spec, 1), proxy.quantize(b, spec, 0)
    mag = jnp.dot(jnp.abs(qa), jnp.abs(qb), precision=jax.lax.Precision.HIGHEST)
    bound = 2.0 * k * 2.0**-24 * mag + k * 2.0**-126
    return jnp.max(jnp.abs(out - ref) / bound)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="proxy bench kernels", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=None,
                   help="M = N = K values (default: 1024 4096 8192 on a GPU, 1024 on a CPU)")
    p.add_argument("--formats", nargs="+", default=list(DEFAULT_FORMATS), choices=list(mxq.MX_FORMATS),
                   help="element formats (default: %(default)s)")
    p.add_argument("--scale-rule", default="floor", choices=list(SCALE_RULES))
    p.add_argument("--iters", type=int, default=None, help="timed runs per measurement (default: 10 GPU, 1 CPU)")
    p.add_argument("--block-sizes", type=int, nargs=3, default=None, metavar=("BM", "BN", "BK"),
                   help="kernel tiles, powers of two >= 16 (default: kernels.mx_matmul.default_block_sizes)")
    p.add_argument("--skip-2pass", action="store_true", help="leave out the two-pass measurement")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    on_cpu = jax.default_backend() == "cpu"
    sizes = args.sizes or (CPU_SIZES if on_cpu else GPU_SIZES)
    if any(s < 16 for s in sizes):
        print(f"proxy bench kernels: sizes must be >= 16, got {sizes}", file=sys.stderr)
        return 2
    iters = args.iters or (1 if on_cpu else 10)
    block_sizes = tuple(args.block_sizes) if args.block_sizes else None
    interpret = backend.resolve_interpret(None)
    dev = jax.devices()[0]
    print(f"# proxy bench kernels  {datetime.date.today().isoformat()}  device: {dev.device_kind} "
          f"({jax.default_backend()})  jax {jax.__version__}  pallas backend: "
          f"{'interpreter' if interpret else backend.BACKEND}  scale rule: {args.scale_rule}  best of {iters}")
    if on_cpu:
        print("# note: on a CPU the kernels run in the Pallas interpreter -- a correctness tool, not a "
              "performance path; these numbers say nothing about a GPU")
    cols = ["size", "format", "kernel", "2pass", "emul", "emul_d", "bf16", "kern/emul", "kern/bf16", "err"]
    print("  ".join(f"{c:>9}" for c in cols) + "   (TFLOP/s)")
    rng = np.random.default_rng(0)
    for n in sizes:
        a = jnp.asarray(rng.standard_normal((n, n), np.float32))
        b = jnp.asarray(rng.standard_normal((n, n), np.float32))
        flop = 2.0 * n * n * n
        tflops = lambda t: flop / t / 1e12  # noqa: E731
        a16, b16 = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
        t_bf16, _ = _best_time(jax.jit(lambda x, y: jnp.dot(x, y)), (a16, b16), iters)
        for name in args.formats:
            spec = proxy.MXSpec(name, scale_rule=args.scale_rule)
            kernel = jax.jit(lambda x, y, s=spec: mm.mx_matmul(x, y, s, s, block_sizes=block_sizes))
            emul = jax.jit(lambda x, y, s=spec: mm.mx_matmul_reference(x, y, s, s))
            emul_d = jax.jit(lambda x, y, s=spec: jnp.dot(proxy.quantize(x, s, 1), proxy.quantize(y, s, 0)))
            t_k, out_k = _best_time(kernel, (a, b), iters)
            t_e, out_e = _best_time(emul, (a, b), iters)
            t_d, _ = _best_time(emul_d, (a, b), iters)
            if args.skip_2pass:
                t_2 = float("nan")
            else:
                two = jax.jit(lambda x, y, s=spec: mm.mx_dot(x, y, s, s, method="two_pass", block_sizes=block_sizes))
                t_2, _ = _best_time(two, (a, b), iters)
            err = float(_err_over_bound(out_k, out_e, a, b, spec))
            row = [f"{n}", name] + [f"{tflops(t):.4g}" for t in (t_k, t_2, t_e, t_d, t_bf16)]
            row += [f"{t_e / t_k:.3g}", f"{t_bf16 / t_k:.3g}", f"{err:.2g}"]
            print("  ".join(f"{c:>9}" for c in row), flush=True)
            if not err <= 1.0:
                print(f"proxy bench kernels: kernel disagrees with the emulation beyond the float32 bound "
                      f"({err:.3g} x tolerance) for {name} at {n}", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
