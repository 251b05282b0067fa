"""Refactoring guard: paired runs whose metrics must not change by one bit.

Trains a width-64 paired run (the FP32 run alongside) of 200 steps, diagnostics every
5 steps, for each of ``paper_e4m3``, ``mxfp8_e4m3`` and ``mxfp6_e2m3``, in memory (no
run store, so nothing is loaded from an earlier run), and either saves every metric
column (``--save FILE.npz``) or compares them with a saved baseline (``--check
FILE.npz``): the same columns, and ``np.array_equal`` (NaN equal to NaN) on each.

    nice -n 15 python scripts/check_bit_exact.py --save /tmp/bit_exact_baseline.npz   # before a change
    nice -n 15 python scripts/check_bit_exact.py --check /tmp/bit_exact_baseline.npz  # after it

Exit status 0 when every column of every run is equal, 1 otherwise (the differing
columns are printed).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import mx_proxy as mxp

RECIPES = ("paper_e4m3", "mxfp8_e4m3", "mxfp6_e2m3")
BASE = dict(width=64, steps=200, diagnostics_every=5, paired_run=True)


def columns() -> dict[str, np.ndarray]:
    """``{recipe/column: values}`` of the guarded runs."""
    out = {}
    for recipe in RECIPES:
        run = mxp.train(mxp.Config(recipe=recipe, **BASE), progress=False)
        for col in run.metrics.columns:
            out[f"{recipe}/{col}"] = run.metrics[col].to_numpy()
        out[f"{recipe}/#diverged_at"] = np.array(-1 if run.diverged_at is None else run.diverged_at)
    return out


def compare(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> list[str]:
    """The differences between two column sets, one line each (empty: bit for bit equal)."""
    problems = [f"missing column {k}" for k in sorted(set(want) - set(got))]
    problems += [f"new column {k}" for k in sorted(set(got) - set(want))]
    for k in sorted(set(got) & set(want)):
        a, b = np.asarray(got[k]), np.asarray(want[k])
        if a.shape != b.shape or not np.array_equal(a, b, equal_nan=a.dtype.kind == "f"):
            problems.append(f"column {k} differs")
    return problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--save", metavar="FILE", help="write the columns to FILE (.npz)")
    g.add_argument("--check", metavar="FILE", help="compare the columns with FILE (.npz)")
    args = p.parse_args(argv)
    got = columns()
    if args.save:
        np.savez(args.save, **got)
        print(f"saved {len(got)} columns of {len(RECIPES)} runs to {args.save}")
        return 0
    with np.load(args.check) as f:
        want = {k: f[k] for k in f.files}
    problems = compare(got, want)
    for line in problems:
        print(line)
    print(f"{len(got)} columns of {len(RECIPES)} runs: " + ("bit for bit equal" if not problems else
                                                             f"{len(problems)} differences"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
