"""``mx-proxy bench step``: milliseconds per training step, FP32 vs MX.

Measured in one run, the timings interleaved: the FP32 step, and the
``paper_e4m3`` and ``mxfp8_e4m3`` steps (every GEMM operand MX-quantized, bf16
vector math) with each GEMM path (``Config.dot``: ``f32`` float32 dots,
``bf16`` bf16 dots on the AVX512-BF16/AMX units), diagnostics off (and, with
``--diagnostics``, on every step); and the FP32 roofline -- the time of
exactly the step's GEMMs (forward, dgrad, wgrad of every layer, the teacher's
forward) run back to back as plain float32 ``jnp.dot``s on this machine.
Targets: MX step (``dot="bf16"``) <= 0.6 x the FP32 step; FP32 step >= 85 %
of its roofline.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from mx_proxy.nn.resmlp import hidden_width
from mx_proxy.training.config import Config
from mx_proxy.training.engine import compiler_options, dynamic_for, program_for
from mx_proxy.viz.text import plain


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
    segment = jax.jit(program.segment, static_argnames=("size",), compiler_options=compiler_options(config))

    def run():
        s, m = segment(state, dyn, teacher, np.int32(0), np.int32(steps), size=steps)
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
    p = argparse.ArgumentParser(prog="mx-proxy bench step", description=plain(__doc__))
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--steps", type=int, default=20, help="steps per timed call")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--diagnostics", action="store_true", help="also time steps with diagnostics every step")
    args = p.parse_args(argv)
    base = Config(width=args.width, depth=args.depth, batch=args.batch, optimizer="adam", steps=args.steps,
                  diagnostics_every=0, val_every=0)
    print(f"mx-proxy bench step: width {args.width}, depth {args.depth}, batch {args.batch}, Adam; "
          f"{args.steps} steps per call, median of {args.repeats}; backend {jax.default_backend()}")
    gemm, flops = gemm_timer(base, args.steps)
    cases = [("fp32", "f32"), ("fp32", "bf16")] + [(r, d) for r in ("paper_e4m3", "mxfp8_e4m3") for d in ("f32", "bf16")]
    diags = (0, 1) if args.diagnostics else (0,)
    fns = {(r, d, g): step_timer(base.replace(recipe=r, dot=d, diagnostics_every=g), args.steps)
           for g in diags for r, d in cases}
    fns["gemm"] = gemm
    results = {k: v / args.steps for k, v in interleaved_medians(fns, args.repeats).items()}
    t_gemm = results["gemm"]
    for g in diags:
        print("  diagnostics " + ("every step" if g else "off"))
        f = results["fp32", "f32", g]
        for r, d in cases:
            t = results[r, d, g]
            target = "   (target <= 0.60)" if r != "fp32" and d == "bf16" and not g else ""
            print(f"    {r:11s} dot={d:4s} {t * 1e3:8.2f} ms/step   / fp32 step {t / f:5.2f}{target}")
    f = results["fp32", "f32", 0]
    print(f"  fp32 roofline (its GEMMs alone) {t_gemm * 1e3:8.2f} ms/step ({flops / args.steps / 1e9:.2f} GFLOP/step, "
          f"{flops / args.steps / t_gemm / 1e9:.0f} GFLOP/s)   fp32 step at {100 * t_gemm / f:4.0f} % of it "
          f"(target >= 85 %)")
    return 0
