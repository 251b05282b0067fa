"""``proxy bench step``: milliseconds per training step, FP32 vs MXFP8.

Measured in one run: the FP32 and MXFP8 E4M3 steps (both GEMM passes
quantized, bf16 vector math), with diagnostics off and on every step, and a
matmul-bound estimate -- the time of exactly the step's GEMMs (forward,
dgrad, wgrad of every layer, the teacher's forward) run back to back as
plain float32 ``jnp.dot``s on this machine.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from proxy.config import Config
from proxy.engine import compiler_options, dynamic_for, program_for
from proxy.model import hidden_width


def interleaved_medians(fns: dict, repeats: int) -> dict:
    """Median seconds of each blocking ``fn()``, after one warm-up call each,
    timing the functions in turn within every repeat so that load from other
    processes hits them alike."""
    for fn in fns.values():
        fn()
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: float(np.median(v)) for k, v in times.items()}


def step_timer(config: Config, steps: int):
    """A callable running ``steps`` training steps as one compiled segment."""
    program = program_for(config)
    dyn = dynamic_for(config)
    state, teacher = program.init(dyn)
    segment = jax.jit(program.segment, static_argnames=("n",), compiler_options=compiler_options())

    def run():
        s, m = segment(state, dyn, teacher, np.int32(0), n=steps)
        jax.block_until_ready(m["loss"])

    return run


def gemm_timer(config: Config, steps: int):
    """The same GEMMs as ``steps`` FP32 training steps, and nothing else."""
    d, b = config.width, config.batch
    h = hidden_width(d, config.act)
    tw, td, _ = config.teacher
    shapes = []
    for _ in range(config.depth):  # student: forward, dgrad, wgrad of fc1 and fc2
        for i, o in ((d, h), (h, d)):
            shapes += [((b, i), (i, o)), ((b, o), (o, i)), ((i, b), (b, o))]
    for _ in range(td):  # teacher forward
        shapes += [((b, d), (d, tw)), ((b, tw), (tw, d))]
    key = jax.random.key(0)
    operands = [(jax.random.normal(key, a), jax.random.normal(key, c)) for a, c in shapes]

    @jax.jit
    def gemms(ops):
        # the carry feeds every operand and every output is consumed, so XLA
        # can neither hoist the GEMMs out of the loop nor shrink them
        def body(acc, _):
            return acc + sum(jnp.sum(jnp.dot(a + acc, c, precision="highest")) for a, c in ops) * 1e-30, None
        return jax.lax.scan(body, jnp.float32(0), None, length=steps)[0]

    flops = steps * sum(2 * a[0] * a[1] * c[1] for a, c in shapes)
    return (lambda: jax.block_until_ready(gemms(operands))), flops


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="proxy bench step", description=__doc__)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--steps", type=int, default=20, help="steps per timed call")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    base = Config(width=args.width, depth=args.depth, batch=args.batch, optimizer="adam", steps=args.steps,
                  diagnostics_every=0, val_every=0)
    print(f"proxy bench step: width {args.width}, depth {args.depth}, batch {args.batch}, Adam; "
          f"{args.steps} steps per call, median of {args.repeats}; backend {jax.default_backend()}")
    gemm, flops = gemm_timer(base, args.steps)
    fns = {(r, d): step_timer(base.replace(recipe=r, diagnostics_every=d), args.steps)
           for d in (0, 1) for r in ("fp32", "mxfp8_e4m3")}
    fns["gemm"] = gemm
    results = {k: v / args.steps for k, v in interleaved_medians(fns, args.repeats).items()}
    t_gemm = results["gemm"]
    for diag, label in ((0, "diagnostics off"), (1, "diagnostics every step")):
        f, m = results["fp32", diag], results["mxfp8_e4m3", diag]
        print(f"  {label:24s} fp32 {f * 1e3:8.2f} ms/step   mxfp8_e4m3 {m * 1e3:8.2f} ms/step   "
              f"ratio {m / f:5.2f}" + ("   (target <= 1.30)" if not diag else ""))
    f = results["fp32", 0]
    print(f"  matmul-bound estimate   {t_gemm * 1e3:8.2f} ms/step ({flops / args.steps / 1e9:.2f} GFLOP/step, "
          f"{flops / args.steps / t_gemm / 1e9:.0f} GFLOP/s)   fp32 step / estimate {f / t_gemm:5.2f}   (target <= 2.50)")
    return 0
