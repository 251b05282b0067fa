"""``mx-proxy bench step``: milliseconds per training step, FP32 vs MX, each against its roofline.

Measured in one run, the timings interleaved: the FP32 step and each MX
recipe's step (default ``paper_e4m3`` and ``mxfp8_e4m3``: every GEMM
operand MX-quantized, bf16 vector math) with each GEMM path
(``Config.dot``: ``f32`` float32 dots, ``bf16`` bf16 dots, on the
AVX512-BF16/AMX units where the CPU has them), diagnostics off (and, with
``--diagnostics``, on every step); and the GEMMs alone: every GEMM of the
student (forward, dgrad and wgrad of every layer, in the layouts the step
uses) run back to back as float32 dots and as bf16 x bf16 -> float32 dots,
and the teacher's forward (always float32), on this machine.

Rooflines. The FP32 step's: its GEMMs as float32 dots. An MX step's: its
GEMMs at this CPU's measured speeds (bf16 dots where both operands hold
bf16 values and ``dot="bf16"``, float32 dots otherwise; the teacher
float32) plus the FP32 step's non-GEMM time (the FP32 step minus its
roofline): what the step would take if quantizing and rounding cost
nothing beyond FP32's own vector math. That part is float32 vector math
on float32 arrays, so it is no strict lower bound: a step that keeps its
activations in bf16 (the ``bf16`` recipe, 0.86 x at width 512) can come in
under it. The GEMMs are timed as the step runs them (:func:`gemm_loop`:
products written in full, nothing else over an operand). Each ``dot``
compiles with its own XLA options (``dot="f32"`` turns YNNPACK's fusions off, see
:func:`mx_proxy.training.engine.compiler_options`), so the GEMMs are timed
under both, and a step is held against the FP32 step and GEMMs compiled
like it. The CPU is printed, since the bf16-dot speedup depends on it.
Each step-to-roofline ratio (of the medians) comes with its range over
the repeats, each repeat's timings taken on their own: the non-GEMM part
is a difference of two large numbers and moves the most between runs.

Targets: ``paper_e4m3`` (``dot="bf16"``) <= 0.8 x the FP32 step on a CPU
with native bf16 dots; every MX step <= 1.25 x its own roofline, on any
CPU; the FP32 step >= 85 % of its roofline.
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from mx_proxy.cli.bench import machine
from mx_proxy.cli.bench.options import add_shape
from mx_proxy.nn.blocks import fc1_width, hidden_width, layer_names
from mx_proxy.nn.dense import wgrad_transposed
from mx_proxy.nn.layers import bf16_exact
from mx_proxy.numerics import recipe as recipes
from mx_proxy.training.config import Config
from mx_proxy.training.engine import compiler_options, dynamic_for, program_for
from mx_proxy.viz.text import plain

KINDS = ("fwd", "dgrad", "wgrad")
DTYPES = ("f32", "bf16")
PAPER_TARGET, ROOFLINE_TARGET, FP32_TARGET = 0.8, 1.25, 0.85
_OPERANDS = {"fwd": ("fwd_x", "fwd_w"), "dgrad": ("dgrad_g", "dgrad_w"), "wgrad": ("wgrad_x", "wgrad_g")}


def interleaved_times(fns: dict, repeats: int) -> dict:
    """Seconds of each blocking ``fn()`` in each of ``repeats`` rounds (an
    array per function), after one warm-up call each, timing the functions in
    turn within every round so that load from other processes hits them alike."""
    for fn in fns.values():
        fn()
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: np.asarray(v) for k, v in times.items()}


def interleaved_medians(fns: dict, repeats: int) -> dict:
    """Median seconds of each blocking ``fn()`` (see :func:`interleaved_times`)."""
    return {k: float(np.median(v)) for k, v in interleaved_times(fns, repeats).items()}


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


def student_gemms(config: Config, dtype: str = "f32") -> list[tuple]:
    """``(layer names, kind, a shape, b shape, contracted axes)`` of every
    GEMM of one student step, in the layouts :func:`mx_proxy.nn.dense.quantized_matmul`
    gives the ``dtype`` dot: forward ``x (B, I) @ W (I, O)``; dgrad ``g (B, O)``
    with ``W (I, O)`` over O; wgrad, for float32 dots, ``x (B, I)`` with
    ``g (B, O)`` over B, and for bf16 dots ``xᵀ (I, B) @ g (B, O)`` (x's
    transposed copy) or, for a layer that narrows, ``gᵀ (O, B) @ x (B, I)``
    (:func:`mx_proxy.nn.dense.wgrad_transposed`)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {DTYPES}")
    d, b = config.width, config.batch
    h = hidden_width(d, config.act)
    out = []
    for i in range(config.depth):
        for fc, (n_in, n_out) in (("fc1", (d, fc1_width(h, config.act))), ("fc2", (h, d))):
            names = layer_names(i, config.depth, fc)
            if dtype == "f32":
                wgrad = ((b, n_in), (b, n_out), (0, 0))
            elif wgrad_transposed(b, n_in, n_out):
                wgrad = ((n_out, b), (b, n_in), (1, 0))
            else:
                wgrad = ((n_in, b), (b, n_out), (1, 0))
            out += [(names, "fwd", (b, n_in), (n_in, n_out), (1, 0)),
                    (names, "dgrad", (b, n_out), (n_in, n_out), (1, 1)),
                    (names, "wgrad", *wgrad)]
    return out


def teacher_gemms(config: Config) -> list[tuple]:
    """The teacher's forward GEMMs (float32 in every recipe), as :func:`student_gemms`."""
    tw, td, ta = config.teacher
    b, d = config.batch, config.width
    return [(("teacher",), "fwd", a, c, (1, 0)) for _ in range(td)
            for a, c in (((b, d), (d, fc1_width(tw, ta))), ((b, tw), (tw, d)))]


def flops(gemm) -> int:
    _, _, a, c, (ka, kb) = gemm
    return 2 * a[1 - ka] * a[ka] * c[1 - kb]


def gemm_loop(gemms: list, steps: int, dtype: str, options: dict | None = None):
    """``(loop, firsts, seconds)``: ``loop(firsts, seconds)`` runs ``gemms``
    ``steps`` times, float32 dots at HIGHEST precision or bf16 x bf16 ->
    float32 dots, on each GEMM's first and second operand (random normal,
    in the layouts :func:`student_gemms` gives), and returns ``(acc, firsts,
    products)``, the first operands as the last round left them.

    Each round writes a scalar carry into element ``[0, 0]`` of every first
    operand (in place) and adds every product's element ``[0, 0]`` to it, so
    XLA can neither hoist the GEMMs out of the loop nor shrink them, while
    every product is written out in full, as the step writes it. Nothing
    else touches a whole operand or product: an elementwise pass over each
    operand and a sum over each product, which an earlier version used,
    were fused into the GEMMs or ran beside them (float32 GEMMs then timed
    ~20 % over their time in the step)."""
    key = jax.random.key(0)
    dt = jnp.float32 if dtype == "f32" else jnp.bfloat16
    firsts = [jax.random.normal(key, a).astype(dt) for _, _, a, _, _ in gemms]
    seconds = [jax.random.normal(key, c).astype(dt) for _, _, _, c, _ in gemms]
    dims = [(((ka,), (kb,)), ((), ())) for *_, (ka, kb) in gemms]
    precision = jax.lax.Precision.HIGHEST if dtype == "f32" else None

    def body(_, carry):
        acc, firsts, _, seconds = carry
        firsts = [jax.lax.dynamic_update_slice(a, jnp.full((1, 1), acc, dt), (0, 0)) for a in firsts]
        outs = [jax.lax.dot_general(a, c, dn, precision=precision, preferred_element_type=jnp.float32)
                for a, c, dn in zip(firsts, seconds, dims)]
        return acc + sum(o[0, 0] for o in outs) * 1e-30, firsts, outs, seconds

    @functools.partial(jax.jit, compiler_options=options, donate_argnums=0)
    def loop(firsts, seconds):
        outs = [jnp.zeros((a.shape[1 - ka], c.shape[1 - kb]), jnp.float32)
                for a, c, (((ka,), (kb,)), _) in zip(firsts, seconds, dims)]
        return jax.lax.fori_loop(0, steps, body, (jnp.float32(0), firsts, outs, seconds))[:3]

    return loop, firsts, seconds


def gemm_timer(gemms: list, steps: int, dtype: str, options: dict | None = None):
    """A blocking callable running :func:`gemm_loop` once (``steps`` rounds of
    ``gemms``), its first operands carried from call to call."""
    loop, firsts, seconds = gemm_loop(gemms, steps, dtype, options)
    held = [firsts]

    def run():
        held[0] = jax.block_until_ready(loop(held[0], seconds))[1]

    return run


def gemm_dtype(recipe, names, kind: str, dot: str) -> str:
    """Which dot a student GEMM of ``recipe`` takes on the CPU: ``"bf16"``
    where ``dot="bf16"`` and both operands hold only bf16 values."""
    r = recipes.get(recipe).for_layer(*names)
    vector = r.vector if kind == "fwd" else r.backward_vector
    exact = all(bf16_exact(getattr(r, role), vector) for role in _OPERANDS[kind])
    return "bf16" if dot == "bf16" and exact else "f32"


def roofline(recipe, dot: str, config: Config, seconds_per_flop: dict, t_teacher: float, non_gemm: float) -> float:
    """Seconds of an MX step's roofline: its student GEMMs at the measured
    speed of their dot (``seconds_per_flop[(dtype, kind)]``), the teacher's
    GEMMs (``t_teacher``) and the FP32 step's non-GEMM time."""
    gemms = sum(flops(g) * seconds_per_flop[gemm_dtype(recipe, g[0], g[1], dot), g[1]] for g in student_gemms(config))
    return gemms + t_teacher + non_gemm


def gemm_speeds(t: dict, dot: str, compiled, kind_flops) -> dict:
    """Seconds per FLOP of each GEMM kind and dtype timed under ``dot``'s XLA options, from timings ``t`` (keyed
    as :func:`main` keys them: medians, or one round of the interleaved repeats), by ``(dtype, kind)``."""
    return {(dt, k): t["gemm", dot, dt, k] / kind_flops[k] for dt in DTYPES for k in KINDS if (dot, dt) in compiled}


def fp32_gemm_time(t: dict, dot: str) -> float:
    """Seconds of the FP32 step's GEMMs (float32 dots and the teacher) under ``dot``'s XLA options: its roofline."""
    return sum(t["gemm", dot, "f32", k] for k in KINDS) + t["teacher", dot]


def non_gemm_time(t: dict, dot: str, diagnostics: int) -> float:
    """The FP32 step's time (with ``dot``'s options) minus its GEMMs' (never below 0)."""
    return max(t["fp32", dot, diagnostics] - fp32_gemm_time(t, dot), 0.0)


def step_roofline(t: dict, recipe: str, dot: str, diagnostics: int, config: Config, compiled, kind_flops) -> float:
    """:func:`roofline` of ``recipe``'s step from one set of timings ``t`` (:func:`gemm_speeds`): its GEMMs at
    the speeds timed under ``dot``'s XLA options, the teacher, and :func:`non_gemm_time`."""
    return roofline(recipe, dot, config, gemm_speeds(t, dot, compiled, kind_flops), t["teacher", dot],
                    non_gemm_time(t, dot, diagnostics))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="mx-proxy bench step", description=plain(__doc__))
    add_shape(p, width=256, batch=512)
    p.add_argument("--steps", type=int, default=20, help="steps per timed call")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--recipes", nargs="+", default=["paper_e4m3", "mxfp8_e4m3"], metavar="NAME",
                   help="MX recipes to time beside FP32")
    p.add_argument("--diagnostics", action="store_true", help="also time steps with diagnostics every step")
    args = p.parse_args(argv)
    base = Config(width=args.width, depth=args.depth, batch=args.batch, optimizer="adam", steps=args.steps,
                  diagnostics_every=0, val_every=0)
    print(f"mx-proxy bench step: width {args.width}, depth {args.depth}, batch {args.batch}, Adam; "
          f"{args.steps} steps per call, median of {args.repeats}; backend {jax.default_backend()}")
    cpu = machine.cpu()
    print(f"  CPU: {machine.describe(cpu)}")
    cases = [("fp32", "f32"), ("fp32", "bf16")] + [(r, d) for r in args.recipes for d in ("f32", "bf16")]
    diags = (0, 1) if args.diagnostics else (0,)
    fns = {(r, d, g): step_timer(base.replace(recipe=r, dot=d, diagnostics_every=g), args.steps)
           for g in diags for r, d in cases}
    student = student_gemms(base)
    # the GEMMs as each dot setting compiles them: (dot setting, dtype) -> XLA options
    compiled = {(d, dt): compiler_options(base.replace(dot=d)) for d in ("f32", "bf16") for dt in DTYPES
                if dt == "f32" or d == "bf16"}
    for (d, dt), options in compiled.items():
        for kind in KINDS:
            fns["gemm", d, dt, kind] = gemm_timer([g for g in student_gemms(base, dt) if g[1] == kind], args.steps,
                                                  dt, options)
        if dt == "f32":
            fns["teacher", d] = gemm_timer(teacher_gemms(base), args.steps, "f32", options)
    samples = {k: v / args.steps for k, v in interleaved_times(fns, args.repeats).items()}
    t = {k: float(np.median(v)) for k, v in samples.items()}

    kind_flops = {kind: sum(flops(g) for g in student if g[1] == kind) for kind in KINDS}
    speeds = {d: gemm_speeds(t, d, compiled, kind_flops) for d in ("f32", "bf16")}
    print("  GEMMs alone, GFLOP/s                     " + "  ".join(f"{k:>6s}" for k in KINDS))
    labels = {"f32": "float32 dots", "bf16": "bf16 x bf16 -> f32"}
    for d, dt in compiled:
        print(f"    {labels[dt]:19s} as dot={d:4s} compiles" + "  ".join(f"{1e-9 / speeds[d][dt, k]:6.0f}"
                                                             for k in KINDS))
    fp32_gemm = {d: fp32_gemm_time(t, d) for d in ("f32", "bf16")}
    rounds = [{k: float(v[i]) for k, v in samples.items()} for i in range(args.repeats)]
    for g in diags:
        print("  diagnostics " + ("every step" if g else "off") + "   (ms/step; / the FP32 step with dot=f32; "
              "/ its own roofline, and its range over the repeats)")
        f = t["fp32", "f32", g]
        for r, d in cases:
            step = t[r, d, g]
            line = f"    {r:11s} dot={d:4s} {step * 1e3:8.2f}   / fp32 {step / f:5.2f}"
            if r == "fp32":
                print(f"{line}   roofline {fp32_gemm[d] * 1e3:8.2f} (its GEMMs), step at "
                      f"{100 * fp32_gemm[d] / step:3.0f} % of it (target >= {100 * FP32_TARGET:.0f} %)")
                continue
            roof = step_roofline(t, r, d, g, base, compiled, kind_flops)
            spread = [x[r, d, g] / step_roofline(x, r, d, g, base, compiled, kind_flops) for x in rounds]
            target = (f" (target <= {PAPER_TARGET:.2f})" if r == "paper_e4m3" and d == "bf16" and cpu["native_bf16"]
                      else "")
            print(f"{line}{target}   roofline {roof * 1e3:8.2f}, step / roofline {step / roof:5.2f} "
                  f"[{min(spread):.2f}, {max(spread):.2f}] (target <= {ROOFLINE_TARGET:.2f})")
    gflop = (sum(kind_flops.values()) + sum(flops(g) for g in teacher_gemms(base))) / 1e9
    non_gemm = ", ".join(f"dot={d} {non_gemm_time(t, d, 0) * 1e3:.2f} ms" for d in fp32_gemm)
    print(f"  {gflop:.2f} GFLOP of GEMMs per step; an MX roofline's non-GEMM time is the FP32 step's with the "
          f"same dot setting minus its GEMMs: {non_gemm}")
    return 0
