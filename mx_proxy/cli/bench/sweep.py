"""``mx-proxy bench sweep``: an 8-member LR sweep as one vmapped call vs 8 runs in a row.

Measured in one run, on the issue's configuration (width 128, depth 4, batch
256, 300 steps, ``mxfp8_e4m3``, default diagnostics every 10 steps). Both
paths are compiled first by a warm-up of one segment (the same compiled
shapes), so the ratio compares training, not compilation; the compile
times are printed too. Prints ``ratio = vmapped / sequential`` (target ≤ 0.75).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from mx_proxy.cli.bench.options import add_shape
from mx_proxy.runner import loop as runner
from mx_proxy.training.config import Config
from mx_proxy.viz.text import plain


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="mx-proxy bench sweep", description=plain(__doc__.splitlines()[0]))
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--members", type=int, default=8)
    add_shape(p, width=128, batch=256)
    p.add_argument("--recipe", default="mxfp8_e4m3")
    p.add_argument("--diagnostics-every", type=int, default=10)
    args = p.parse_args(argv)

    cfg = Config(width=args.width, depth=args.depth, batch=args.batch, steps=args.steps, recipe=args.recipe,
                       diagnostics_every=args.diagnostics_every)
    lrs = [float(x) for x in np.geomspace(1e-4, 3e-3, args.members)]
    warm = cfg.replace(steps=min(cfg.steps, cfg.chunk))

    t = time.perf_counter()
    runner.train(warm, store=None, progress=False)
    compile_single = time.perf_counter() - t
    t = time.perf_counter()
    runner.sweep(warm, store=None, progress=False, lr=lrs)
    compile_sweep = time.perf_counter() - t

    t = time.perf_counter()
    seq = [runner.train(cfg.replace(lr=lr), store=None, progress=False) for lr in lrs]
    t_seq = time.perf_counter() - t
    t = time.perf_counter()
    sw = runner.sweep(cfg, store=None, progress=False, lr=lrs)
    t_vmap = time.perf_counter() - t

    exact = all(np.array_equal(a.metrics["loss"].to_numpy(), b.metrics["loss"].to_numpy(), equal_nan=True)
                for a, b in zip(seq, sw.runs))
    member_steps = args.members * args.steps
    print(f"sweep of {args.members} LRs, width {args.width}, depth {args.depth}, batch {args.batch}, "
          f"{args.steps} steps, {args.recipe}, diagnostics every {args.diagnostics_every}")
    print(f"  warm-up (compile + {warm.steps} steps): single {compile_single:.1f} s, vmapped {compile_sweep:.1f} s")
    print(f"  {args.members} runs one after another: {t_seq:.2f} s "
          f"({1e3 * t_seq / member_steps:.2f} ms per member-step)")
    print(f"  one vmapped sweep:           {t_vmap:.2f} s ({1e3 * t_vmap / member_steps:.2f} ms per member-step)")
    print(f"  ratio vmapped / sequential = {t_vmap / t_seq:.3f} (target <= 0.75); "
          f"members equal their single runs bit for bit: {exact}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
