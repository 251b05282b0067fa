"""``mx-proxy bench diagnostics``: ms per diagnostics step, quantization statistics (``--quant-stats``) off vs on.

Measured in one run, the timings interleaved: for each recipe (default
``mxfp8_e4m3``: every GEMM operand MX-quantized) a plain training step
(diagnostics off), a diagnostics step without and with ``quant_stats``
(``diagnostics_every=1``: every step of the timed segment is one), each a
compiled segment of ``--steps`` steps. Printed: the milliseconds of each,
the ratio of the diagnostics step with quantization statistics to the one
without, and what that makes of a whole run at ``--period`` (the default
``diagnostics_every``): ``((P - 1) plain + on) / ((P - 1) plain + off)``.
"""

from __future__ import annotations

import argparse

import jax

from mx_proxy.cli.bench.options import add_shape
from mx_proxy.cli.bench.step import interleaved_medians, step_timer
from mx_proxy.training.config import Config
from mx_proxy.viz.text import plain

CASES = (("plain", 0, False), ("diagnostics", 1, False), ("quant_stats", 1, True))


def run_cost(plain_s: float, off_s: float, on_s: float, period: int) -> float:
    """A run's time with quantization statistics over its time without, diagnostics every ``period`` steps."""
    return ((period - 1) * plain_s + on_s) / ((period - 1) * plain_s + off_s)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="mx-proxy bench diagnostics", description=plain(__doc__))
    add_shape(p, width=256, batch=512)
    p.add_argument("--steps", type=int, default=10, help="steps per timed call")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--period", type=int, default=Config().diagnostics_every,
                   help="diagnostics period of the whole-run estimate")
    p.add_argument("--recipes", nargs="+", default=["mxfp8_e4m3"], metavar="NAME", help="MX recipes to time")
    args = p.parse_args(argv)
    base = Config(width=args.width, depth=args.depth, batch=args.batch, steps=args.steps, val_every=0)
    print(f"mx-proxy bench diagnostics: width {args.width}, depth {args.depth}, batch {args.batch}, Adam; "
          f"{args.steps} steps per call, median of {args.repeats}; backend {jax.default_backend()}")
    fns = {(r, name): step_timer(base.replace(recipe=r, diagnostics_every=every, quant_stats=quant), args.steps)
           for r in args.recipes for name, every, quant in CASES}
    t = {k: v / args.steps for k, v in interleaved_medians(fns, args.repeats).items()}
    for r in args.recipes:
        plain_s, off, on = (t[r, name] for name, _, _ in CASES)
        print(f"  {r:11s} ms/step: plain {plain_s * 1e3:8.2f}   diagnostics {off * 1e3:8.2f}   with quant stats "
              f"{on * 1e3:8.2f}   quant stats on / off {on / off:5.2f}; a run with diagnostics every "
              f"{args.period}: {run_cost(plain_s, off, on, args.period):5.2f}x")
    return 0
