"""``mx-proxy bench quantize``: the cost of MX fake-quantization, relative to bf16.

For each case, prints median(time of jitted ``mxp.quantize`` on a size x size
float32 array) / median(time of a jitted float32 -> bf16 -> float32 round trip
of the same array), both measured in this run, alternately, after a warm-up
(compile) call. The target for E4M3 (floor scale, ties to even, axis -1) is a
ratio of at most 2.0; every element format and axis 0 are reported too, and
(no target) 2-D tiles, NVFP4, and E4M3 of the same values held as bfloat16
with the result taken as bfloat16, as the MX dense layer hands over and
takes back its operands (rounded on 16-bit words).
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

from mx_proxy.numerics.quantize import NVFP4, MXSpec, quantize
from mx_proxy.viz.text import plain

TARGET = 2.0
CASES = (  # (spec, block axis, input dtype); the first one is the target case
    (MXSpec("fp8_e4m3"), -1, "float32"),
    (MXSpec("fp8_e4m3"), 0, "float32"),
    (MXSpec("fp8_e5m2"), -1, "float32"),
    (MXSpec("fp6_e3m2"), -1, "float32"),
    (MXSpec("fp6_e2m3"), -1, "float32"),
    (MXSpec("fp4_e2m1"), -1, "float32"),
    (MXSpec("int8"), -1, "float32"),
    (MXSpec("fp4_e2m1", scale_rule="rceil", block_dims=2), -1, "float32"),  # 32x32 tiles
    (NVFP4, -1, "float32"),
    (NVFP4.replace(block_dims=2), -1, "float32"),  # 16x16 tiles
    (MXSpec("fp8_e4m3"), -1, "bfloat16"),  # x rounded to bf16, held and taken back as bf16
    (MXSpec("fp8_e4m3"), 0, "bfloat16"),
)


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _seconds(fn, x) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(x))
    return time.perf_counter() - start


def interleaved_medians(fn, baseline, x, repeats: int) -> tuple[float, float]:
    """Median wall seconds of ``fn(x)`` and ``baseline(x)``, timed alternately
    (so both see the same machine load) after one warm-up call each."""
    jax.block_until_ready(fn(x))
    jax.block_until_ready(baseline(x))
    times, base_times = [], []
    for _ in range(repeats):
        times.append(_seconds(fn, x))
        base_times.append(_seconds(baseline, x))
    return statistics.median(times), statistics.median(base_times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mx-proxy bench quantize", description=plain(__doc__.splitlines()[0]))
    parser.add_argument("--size", type=_positive_int, default=4096, help="array is size x size float32")
    parser.add_argument("--repeats", type=_positive_int, default=10, help="timed calls per function and case")
    args = parser.parse_args(argv)

    x = jax.random.normal(jax.random.key(0), (args.size, args.size), jnp.float32)
    bf16_round_trip = jax.jit(lambda a: a.astype(jnp.bfloat16).astype(jnp.float32))
    for _ in range(3):  # warm the allocator and thread pool before the first case
        jax.block_until_ready(bf16_round_trip(x))
    print(f"mx-proxy bench quantize: {args.size}x{args.size} float32 on {jax.devices()[0].platform}, "
          f"median of {args.repeats} interleaved calls; ratio = quantize / (f32->bf16->f32)")
    print(f"{'spec':<28} {'axis':>4} {'input':>8} {'quantize ms':>12} {'bf16 ms':>9} {'ratio':>7}  target")
    x_bf16 = x.astype(jnp.bfloat16)
    for i, (spec, axis, dtype) in enumerate(CASES):
        if dtype == "float32":
            def fn(a, spec=spec, axis=axis):
                return quantize(a, spec, axis=axis)
        else:  # the baseline's values held as bf16, the result taken as bf16 (the float32 convert folds away)
            q = jax.jit(lambda a, spec=spec, axis=axis: quantize(a, spec, axis=axis).astype(jnp.bfloat16))

            def fn(_, q=q):
                return q(x_bf16)

        t, t_base = interleaved_medians(fn, bf16_round_trip, x, args.repeats)
        ratio = t / t_base
        target = (f"<= {TARGET} ({'met' if ratio <= TARGET else 'missed'})" if i == 0
                  else f"(<= {TARGET} for E4M3)" if spec.block_dims == 1 and spec.scale_format == "e8m0"
                  else "(none)")
        print(f"{spec.name:<28} {axis:>4} {dtype:>8} {t * 1e3:>12.1f} {t_base * 1e3:>9.1f} {ratio:>7.2f}  {target}",
              flush=True)
    return 0
