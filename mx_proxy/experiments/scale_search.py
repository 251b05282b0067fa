"""The search for a CPU-sized ("quick") scale that shows the paper's proxy findings.

Every run this script makes is appended, one row per run, to
``results/scale_search.csv`` -- failures and uninteresting runs
included -- so the CSV is the honest record of the search. Experiments are
named; each is a list of (label, Config) pairs built by a function below.

Usage (from the repository root)::

    python -m mx_proxy.experiments.scale_search --list
    python -m mx_proxy.experiments.scale_search NAME [NAME ...] [--show]
    python -m mx_proxy.experiments.scale_search --adhoc LABEL width=64 lr=3e-3 recipe=mxfp8_e4m3 ...

``--show`` prints each run's diagnostic trajectory (a few rows) after it
finishes. What the columns mean: ``seconds`` is wall time of
``mxp.train`` including compilation (a program compiled earlier in the
same process is reused, so the first run of a shape is the slow one);
``diverged_at`` is the first step whose loss was non-finite or spiked above
``spike_factor`` x the previous step's; ``max_zeta``/``min_cosine``/
``max_ln_clamp`` are over the diagnostic steps before any divergence;
``*_pre`` columns are the same over the last 10% of steps before the
divergence (or the end); ``*_early`` over the first 10%. ``jump10_at`` /
``max_jump``: first step whose loss exceeds 10x the minimum of the previous
100 steps, and the largest such ratio -- spikes and multi-step blow-ups that
the engine's one-step 100x divergence test does not flag. (Rows of e01-e02
predate these two columns; rows of e03-e04 computed them including the first
100 steps, so their jumps at steps 7-8 are the initial transient. From e05 on
the first 100 steps are skipped.)

Findings (2-core CPU, load average 4-6 from other jobs; all at width 64 unless
stated):

* No configuration tried made an MX run diverge while the FP32 run with the
  same init, data and LR stayed stable *for a precision reason*. Adam LR 1e-3,
  3e-3, 1e-2 (E4M3, FP6 E2M3, FP4), depth 8, width 128 for 4000 steps, and
  plain SGD up to LR 2.5 are stable in every recipe; the loss sits on the
  ~1/width plateau (0.015 at width 64, 0.009 at 128) the notes describe.
* The "expected" (LR-driven) instability is there and is shared: at Adam LR
  3e-2 both FP32 and E4M3 collapse from ~0.05 to loss ~1 (the trivial
  solution, gains -> 0.1); at 1.5e-2 FP32 blew up 7e4x at step 2746 and the
  mixed recipe 6e3x at 2389 while E4M3 stayed stable; at 2e-2 none did. With
  SGD, FP32 diverges at LR 2.75 (step 20) and E4M3/mixed/FP4 do not; at 3 all
  diverge within 20 steps. So near the edge which recipe fails is a coin toss.
* The LN-clamp window is reproduced: with Adam the gains of every block drift
  down at ~lr per step, and while a block's 32 gains all sit in [0.875, 1)
  the E4M3 floor scale clamps them all (clamp fraction 0.75-0.98 at steps
  600-1000 at LR 3e-3, in FP32 as a diagnostic and in MX as the real thing),
  then falls to 0 as gains leave the window. It leaves no mark on the loss.
* ‖ζ‖ bound: 0.2-0.9 typical for E4M3 on the plateau, isolated maxima 1.0-1.3
  with cosine dips to ~0 (e.g. e01 LR 1e-3 step 1320: 1.07 / 0.07 as the
  clamp fraction stepped 0.125 -> 0.25), FP4 up to 1.7; above 2 only *after*
  the LR-driven collapses (3.3-5.3), never as a precursor.

The quick scale (``mx_proxy.experiments.scales``) is e10: width 64, depth 4, batch 256, Adam
LR 3e-3, 3000 steps: 30 s FP32, 44 s E4M3 per run with compilation.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import math
import os
import sys
import time
import traceback

import numpy as np

from mx_proxy.experiments import scales
from mx_proxy.numerics import recipe as _recipes  # noqa: E402
from mx_proxy.runner.loop import train  # noqa: E402
from mx_proxy.store import durable
from mx_proxy.training.config import Config  # noqa: E402

# the record lives in the source checkout: <repository>/results/scale_search.csv
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CSV_PATH = os.path.join(ROOT, "results", "scale_search.csv")

CONFIG_FIELDS = ("width", "depth", "batch", "lr", "steps", "act", "norm", "init", "init_gain",
                 "teacher_width", "teacher_depth", "teacher_act", "noise", "optimizer", "momentum",
                 "schedule", "lr_min", "warmup_steps", "seed", "data_seed", "teacher_seed",
                 "diagnostics_every", "spike_factor")
COLUMNS = (("time", "experiment", "label", "recipe") + CONFIG_FIELDS +
           ("seconds", "steps_run", "final_loss", "min_loss", "diverged_at", "max_zeta", "min_cosine",
            "max_ln_clamp", "jump10_at", "max_jump", "zeta_early", "cosine_early", "ln_clamp_early", "zeta_pre",
            "cosine_pre", "ln_clamp_pre", "max_ln_clamp_step", "gain_mean_end", "note"))


def _recipe_label(recipe) -> str:
    name = recipe.name
    if _recipes.PRESETS.get(name) != recipe:
        name += "*"  # a modified preset
        if recipe.ln_affine is None:
            name += "(ln_affine=None)"
    return name


def _fmt(v):
    if v is None:
        return ""
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.4g}"
    return v


def summarize(run) -> dict:
    """The CSV numbers of one finished run."""
    m = run.metrics
    n = len(m)
    end = run.diverged_at if run.diverged_at is not None else n
    before = m[m["step"] < end]
    d = before.dropna(subset=["zeta_bound"]) if "zeta_bound" in before else before.iloc[0:0]
    w = max(1, int(0.1 * end))
    early = d[d["step"] < w]
    pre = d[d["step"] >= end - w]

    def agg(frame, col, fn):
        if col not in frame or not len(frame):
            return float("nan")
        v = frame[col].to_numpy(dtype=float)
        v = v[np.isfinite(v)]
        return float(fn(v)) if len(v) else float("nan")

    gains = [c for c in m.columns if c.startswith("ln_gain_mean/")]
    # spikes below the divergence threshold: loss over the minimum of the previous 100 steps
    loss = m["loss"].to_numpy(dtype=float)
    loss = np.where(np.isfinite(loss), loss, np.inf)
    # (the first 100 steps are skipped: the initial transient is not a spike)
    prev_min = np.array([loss[max(0, i - 100):i].min() if i >= 100 else np.inf for i in range(len(loss))])
    ratio = loss / prev_min
    jumps = np.nonzero(ratio[1:] > 10.0)[0]
    out = {
        "steps_run": n,
        "final_loss": run.final_loss,
        "min_loss": agg(before, "loss", np.min),
        "diverged_at": run.diverged_at,
        "jump10_at": int(jumps[0] + 1) if len(jumps) else None,
        "max_jump": float(np.max(ratio[1:])) if len(ratio) > 1 else float("nan"),
        "max_zeta": agg(d, "zeta_bound", np.max),
        "min_cosine": agg(d, "cosine", np.min),
        "max_ln_clamp": agg(d, "ln_clamp_frac", np.max),
        "zeta_early": agg(early, "zeta_bound", np.median),
        "cosine_early": agg(early, "cosine", np.median),
        "ln_clamp_early": agg(early, "ln_clamp_frac", np.mean),
        "zeta_pre": agg(pre, "zeta_bound", np.median),
        "cosine_pre": agg(pre, "cosine", np.median),
        "ln_clamp_pre": agg(pre, "ln_clamp_frac", np.mean),
        "max_ln_clamp_step": (int(d.loc[d["ln_clamp_frac"].idxmax(), "step"])
                              if "ln_clamp_frac" in d and len(d) and d["ln_clamp_frac"].max() > 0 else None),
        "gain_mean_end": (" ".join(f"{d[c].iloc[-1]:.3f}" for c in gains) if gains and len(d) else ""),
    }
    return out


def auto_note(s: dict) -> str:
    parts = []
    if s["diverged_at"] is not None:
        parts.append(f"DIVERGED at {s['diverged_at']}")
    else:
        parts.append("stable")
    if s["jump10_at"] is not None:
        parts.append(f"loss jump >10x at {s['jump10_at']}")
    parts.append(f"max jump {s['max_jump']:.3g}x")
    if s["max_zeta"] == s["max_zeta"]:
        parts.append(f"zeta early/pre/max {s['zeta_early']:.2f}/{s['zeta_pre']:.2f}/{s['max_zeta']:.2f}")
        parts.append(f"cos early/pre/min {s['cosine_early']:.2f}/{s['cosine_pre']:.2f}/{s['min_cosine']:.2f}")
    if s["max_ln_clamp"] == s["max_ln_clamp"]:
        parts.append(f"ln clamp early/pre/max {s['ln_clamp_early']:.2f}/{s['ln_clamp_pre']:.2f}/"
                     f"{s['max_ln_clamp']:.2f}")
    return "; ".join(parts)


def read_rows(path=CSV_PATH) -> list[dict]:
    """The rows of the search's CSV at ``path`` (none where it does not exist yet), each with every column of
    :data:`COLUMNS` (empty where its row predates the column). A ValueError names a header column this
    version does not know, or a row that does not fit the header."""
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        header = tuple(reader.fieldnames or ())
        unknown = [c for c in header if c not in COLUMNS]
        if not header or unknown:
            raise ValueError(f"{path}: header column(s) {unknown or '(none)'} are not among the search's columns "
                             f"{', '.join(COLUMNS)}")
        rows = []
        for line, r in enumerate(reader, start=2):
            if None in r or None in r.values():
                raise ValueError(f"{path}, line {line}: {len(header)} columns in the header, not in this row")
            rows.append({k: r.get(k, "") for k in COLUMNS})
    return rows


def append_row(row: dict, path=CSV_PATH) -> None:
    """Append ``row`` (values by column name) to the CSV at ``path``, rewritten whole and atomically: a file
    started before columns were added gets the new header, its rows kept; a kill leaves the old file."""
    rows = [*read_rows(path), {k: _fmt(row.get(k)) for k in COLUMNS}]

    def write(tmp):
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            w.writeheader()
            w.writerows(rows)

    durable.atomic_write(path, write)


def show(run, every: int | None = None) -> None:
    m = run.metrics.dropna(subset=["zeta_bound"])
    if not len(m):
        return
    every = every or max(1, len(m) // 15)
    depth = run.config.depth
    cols = ["step", "loss", "grad_norm", "zeta_bound", "cosine", "ln_clamp_frac"]
    cols += [f"ln_gain_mean/block_{i}" for i in range(depth) if f"ln_gain_mean/block_{i}" in m]
    cols = [c for c in cols if c in m]
    rows = m[cols].iloc[::every]
    tail = m[cols].iloc[-3:]
    import pandas as pd

    print(pd.concat([rows, tail]).drop_duplicates("step").to_string(index=False, float_format=lambda v: f"{v:.3g}"))


def execute(experiment: str, label: str, cfg: Config, note: str = "", show_traj: bool = False):
    """Train one config, append its row (also on error), return the Run or None."""
    row = {"time": datetime.datetime.now().isoformat(timespec="seconds"), "experiment": experiment,
           "label": label, "recipe": _recipe_label(cfg.recipe)}
    row.update({k: getattr(cfg, k) for k in CONFIG_FIELDS})
    t0 = time.perf_counter()
    try:
        run = train(cfg, progress=False)
    except Exception as e:  # keep the record honest: failures are rows too
        row["seconds"] = time.perf_counter() - t0
        row["note"] = f"ERROR {type(e).__name__}: {e}".replace("\n", " ")[:300]
        append_row(row)
        traceback.print_exc()
        return None
    row["seconds"] = time.perf_counter() - t0
    s = summarize(run)
    row.update(s)
    row["note"] = (note + " | " if note else "") + auto_note(s)
    append_row(row)
    print(f"[{experiment}/{label}] {row['recipe']} w{cfg.width} L{cfg.depth} b{cfg.batch} lr{cfg.lr:g} "
          f"{cfg.steps} steps: {row['seconds']:.1f}s final {s['final_loss']:.4g} | {auto_note(s)}", flush=True)
    if show_traj:
        show(run)
    return run


# ---------------------------------------------------------------------------
# Experiments: name -> function returning [(label, Config, note), ...]
# ---------------------------------------------------------------------------

EXPERIMENTS = {}


def experiment(fn):
    EXPERIMENTS[fn.__name__] = fn
    return fn


def _pair(label, cfg, recipes=("fp32", "mxfp8_e4m3"), note=""):
    return [(f"{label}/{r}", cfg.replace(recipe=r), note) for r in recipes]


def _per_lr(base, lrs, recipes=("fp32", "mxfp8_e4m3")):
    """Per learning rate (outer), the recipes (inner): labels ``lr<lr>/<recipe>``."""
    return [row for lr in lrs for row in _pair(f"lr{lr:g}", base.replace(lr=lr), recipes)]


def _per_recipe(base, recipes, lrs):
    """Per recipe (outer), the learning rates (inner): labels ``lr<lr>/<recipe>``."""
    return [(f"lr{lr:g}/{r}", base.replace(lr=lr, recipe=r), "") for r in recipes for lr in lrs]


def _w64(steps: int, **changes) -> Config:
    """The width-64 proxy of the search: depth 4, batch 256, diagnostics every 20 steps, validation every 100."""
    return Config(width=64, depth=4, batch=256, steps=steps, diagnostics_every=20, val_every=100, **changes)


@experiment
def e01_baseline_w64():
    """Default proxy (teacher = student shape) at width 64, depth 4, batch 256: LR sweep, FP32 vs E4M3."""
    return _per_lr(_w64(2000), (1e-3, 3e-3, 1e-2))


@experiment
def e02_high_lr_w64():
    """Same model, higher LRs (3e-2, 1e-1) and 3000 steps: where does the 'expected' (FP32 too) instability start?"""
    return _per_lr(_w64(3000), (3e-2, 1e-1))


@experiment
def e03_harder_formats_w64():
    """w64 L4 b256, 3000 steps, LR 3e-3 and 1e-2: do FP6 E2M3 / FP4 (wider LN clamp window) collapse where FP32
    does not?"""
    return _per_lr(_w64(3000), (3e-3, 1e-2), recipes=("fp32", "mxfp6_e2m3", "mxfp4"))


@experiment
def e04_edge_lr_w64():
    """w64 L4 b256, 3000 steps, LR between the stable 1e-2 and the collapsing 3e-2: does MX collapse first?"""
    return _per_lr(_w64(3000), (1.5e-2, 2e-2), recipes=("fp32", "mxfp8_e4m3", "mxfp8_mixed"))


@experiment
def e05_w128_long():
    """w128 L4 b512 (the notes' setting, lower 1/width plateau), LR 1e-3 and 3e-3, 4000 steps: FP32 vs E4M3."""
    base = Config(width=128, depth=4, batch=512, steps=4000, diagnostics_every=50, val_every=200)
    return _per_lr(base, (3e-3, 1e-3), recipes=("mxfp8_e4m3", "fp32"))


@experiment
def e06_sgd_w64():
    """Plain SGD (the paper's stability condition is derived for GD): w64 L4 b256, 1500 steps, LR 0.3/1/3,
    FP32 vs E4M3."""
    return _per_recipe(_w64(1500, optimizer="sgd"), ("fp32", "mxfp8_e4m3"), (0.3, 1.0, 3.0))


@experiment
def e07_sgd_edge_w64():
    """SGD near FP32's edge of stability (1 stable, 3 diverges at step 16): LR 1.5/2/2.5, 3000 steps, FP32 vs E4M3."""
    return _per_recipe(_w64(3000, optimizer="sgd"), ("fp32", "mxfp8_e4m3"), (1.5, 2.0, 2.5))


@experiment
def e08_sgd_lr275_w64():
    """SGD at LR 2.75 (between FP32-stable 2.5 and FP32-divergent 3), 3000 steps: FP32, E4M3, mixed, FP4."""
    base = _w64(3000, optimizer="sgd", lr=2.75)
    return [(f"lr2.75/{r}", base.replace(recipe=r), "") for r in ("fp32", "mxfp8_e4m3", "mxfp8_mixed", "mxfp4")]


@experiment
def e09_depth8_w64():
    """Depth 8 (the paper's Fig. 9: deeper models spike more), w64 b256, Adam LR 1e-2, 3000 steps: FP32 vs E4M3."""
    base = Config(width=64, depth=8, batch=256, steps=3000, lr=1e-2, diagnostics_every=20, val_every=100)
    return _pair("lr0.01", base)


@experiment
def e10_quick_final():
    """The shipped quick scale (mx_proxy.experiments.scales 'quick'), timed: FP32 and E4M3 with the same init, data
    and LR."""

    return _pair("quick", scales.get("quick").config, note="timing of the shipped quick scale")


def _parse_value(v: str):
    if v == "None":
        return None
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*")
    p.add_argument("--list", action="store_true")
    p.add_argument("--show", action="store_true", help="print each run's diagnostic trajectory")
    p.add_argument("--adhoc", metavar="LABEL", help="run one config given as key=value pairs")
    p.add_argument("--note", default="")
    args = p.parse_args(argv)
    if args.list:
        for name, fn in EXPERIMENTS.items():
            summary = (fn.__doc__ or "").strip().split("\n\n")[0]  # the first paragraph, on one line
            print(f"{name}: {' '.join(summary.split())}")
        return 0
    if args.adhoc:
        kw = {}
        for item in args.names:
            k, _, v = item.partition("=")
            kw[k] = _parse_value(v)
        execute("adhoc", args.adhoc, Config(**kw), args.note, args.show)
        return 0
    unknown = [n for n in args.names if n not in EXPERIMENTS]
    if unknown:
        print(f"unknown experiment(s) {unknown}; valid: {', '.join(EXPERIMENTS)}", file=sys.stderr)
        return 2
    for name in args.names:
        for label, cfg, note in EXPERIMENTS[name]():
            execute(name, label, cfg, note, args.show)
    return 0


if __name__ == "__main__":
    sys.exit(main())
