"""``mx-proxy transformer --scale smoke|quick|gpu``: a small decoder-only transformer, FP32 vs MX recipes.

    mx-proxy transformer --scale smoke --out /tmp/transformer.csv

Trains :class:`mx_proxy.experiments.transformer.Decoder` under each recipe
(default: fp32, mxfp8_e4m3, paper_e4m3) from the same initial parameters on
the same batches of the copy task, prints one line per recipe (final loss,
the blow-up rule's step, the gradient bias ζ and cosine against FP32; with ``--quant-stats`` the
largest clamp, flush and last-bin fractions of any operand after the last
step) and, with ``--out``, writes the per-step history atomically (.parquet
or .csv). Bad input (a scale, a recipe, an unwritable ``--out``) is one line
on stderr and exit status 2, before any training.
"""

from __future__ import annotations

import pandas as pd

from mx_proxy.cli.experiment_commands import check_out, guard
from mx_proxy.experiments import transformer
from mx_proxy.numerics import recipe as recipes

__all__ = ["add_transformer_command"]


def _fmt(value, spec: str) -> str:
    return "-" if pd.isna(value) else format(value, spec)


def _run(args) -> int:
    out = check_out(args.out) if args.out is not None else None
    for name in args.recipes:
        recipes.get(name)  # an unknown recipe: exit 2 naming the presets, before any training
    scale = transformer.SCALES[args.scale]
    print(f"decoder: {scale.depth} blocks, width {scale.width}, {scale.heads} heads, vocab {scale.vocab}, "
          f"sequences of {scale.seq_len}, batch {scale.batch}, {scale.steps} Adam steps at lr {scale.lr:g}")
    result = transformer.compare(scale, args.recipes, args.seed, quant_stats=args.quant_stats)
    table = transformer.summary(result)
    for _, r in table.iterrows():
        blowup = "none" if pd.isna(r["blowup_at"]) else f"step {r['blowup_at']}"
        line = (f"{r['recipe']:<12} final loss {r['final_loss']:.4f}  blow-up {blowup:<10} "
                f"zeta mean {_fmt(r['zeta_mean'], '.4f')} last {_fmt(r['zeta_last'], '.4f')}  "
                f"cosine {_fmt(r['cosine_last'], '.4f')}")
        if args.quant_stats:
            line += (f"  clamp {_fmt(r['max_clamp_frac'], '.2e')}  flush {_fmt(r['max_underflow_frac'], '.2e')}  "
                     f"last-bin {_fmt(r['max_last_bin_frac'], '.2e')}")
        print(line)
    if out is not None:
        print(f"history -> {transformer.write(result, out)}")
    return 0


def add_transformer_command(subparsers) -> None:
    """Add ``transformer`` to an ``mx-proxy`` argparse subparsers object."""
    p = subparsers.add_parser(
        "transformer", help="a small decoder-only transformer trained FP32 vs MX recipes side by side",
        description="Train a small decoder-only flax.linen transformer (RMSNorm, causal attention, a GELU MLP) on "
                    "a synthetic copy task under each recipe, from the same init on the same batches, quantized "
                    "with one call of mx_proxy.interop's rules; print per recipe the final loss, the blow-up "
                    "rule's step, the gradient bias against FP32 (zeta, cosine) and, with --quant-stats, the worst "
                    "operand clamp, flush and last-bin fractions. docs/interop.md explains each number.")
    p.add_argument("--scale", required=True, choices=list(transformer.SCALES),
                   help="smoke (seconds to minutes on a CPU), quick (minutes on a 2-core CPU), gpu (one GPU)")
    p.add_argument("--recipes", nargs="+", default=list(transformer.RECIPES), metavar="RECIPE",
                   help=f"recipes to train (default: {' '.join(transformer.RECIPES)}); fp32 is the model as written")
    p.add_argument("--seed", type=int, default=0, help="initial parameters key(SEED), batches key(SEED + 1)")
    p.add_argument("--out", default=None, metavar="FILE", help="write the per-step history (.parquet or .csv)")
    p.add_argument("--quant-stats", action="store_true",
                   help="also print the largest clamp, flush and last-bin fractions of any operand after the last "
                        "step (compiling them takes minutes on a CPU)")
    p.set_defaults(func=guard(_run), parser=p)
