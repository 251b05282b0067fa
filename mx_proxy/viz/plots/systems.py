"""Notebook 09's figure: the systems (GNMR, 2-D FP4, NVFP4, nGPT) against plain MX and the paper's mitigations."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib import ticker

from mx_proxy.experiments import systems as _systems
from mx_proxy.experiments.systems import SYSTEMS
from mx_proxy.viz.plots.style import color

_SEED_COLORS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02")


def _system_style(system: str) -> dict:
    """Bar style of a notebook-09 system: the colour of its recipe's family;
    2-D tiles hatched ``xx``, nGPT systems ``//``, GNMR ones ``..``."""
    changes = SYSTEMS.get(system, {})
    recipe = str(changes.get("recipe", system))
    style = {"color": color(recipe), "edgecolor": "0.25", "lw": 0.6}
    if recipe.endswith("_2d"):
        style["hatch"] = "xx"
    elif changes.get("arch") == "ngpt":
        style["hatch"] = "//"
    elif changes.get("controller") is not None:
        style["hatch"] = ".."
    return style


def systems(runs_or_table, *, stress_label: str | None = None, title: str | None = None):
    """Notebook 09: the systems (GNMR, 2-D FP4, NVFP4, nGPT) against plain MX
    and the paper's mitigations (:mod:`mx_proxy.experiments.systems`).

    Left, base setting: final loss relative to the FP32 run of the same
    architecture (same seed; nGPT in FP32 for the nGPT systems, hatched
    ``//`` and annotated with their ratio to the resmlp FP32 run; GNMR
    systems ``..``), one bar per system on a log axis; each bar says the
    fraction of GEMM work that ran in low precision where it is below 100 %
    or a controller ran (its cost). Right, stress setting: per system and
    seed the step the run diverged (×), or ○ at the end where it stayed
    stable (△: a 10× blow-up the engine did not stop on); dashed lines: the
    FP32 run's divergence step on each seed.

    ``runs_or_table``: the mapping of :func:`mx_proxy.experiments.systems.runs` or the frame
    of :func:`mx_proxy.experiments.systems.table`; ``stress_label`` names the stress setting
    in the right panel's title."""
    df = runs_or_table if isinstance(runs_or_table, pd.DataFrame) else _systems.table(runs_or_table)
    order = [s for s in SYSTEMS if s in set(df["system"])]
    ypos = {s: i for i, s in enumerate(order)}
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(14, 1.2 + 0.42 * max(len(order), 4)), sharey=True)

    _base_panel(a1, df, order, ypos)
    _stress_panel(a2, df, order, ypos, stress_label)
    a1.set_yticks(range(len(order)))
    a1.set_yticklabels(order, fontsize=8)
    a1.set_ylim(len(order) - 0.5, -0.5)
    for ax in (a1, a2):
        ax.grid(axis="x", color="0.9", lw=0.6)
        ax.set_axisbelow(True)
    fig.suptitle(title or "Beyond the paper: 2-D blocks + SR, NVFP4, nGPT and GNMR against the paper's mitigations")
    fig.tight_layout()
    return fig


def _base_notes(s: str, row) -> list[str]:
    """The text beside a system's base-setting bar: its ratio (or where it diverged), nGPT's ratio to
    the resmlp FP32 run, and the share of GEMM work in low precision where it is below 100 % or a
    controller ran."""
    v = row["vs_own_fp32"]
    notes = []
    if np.isfinite(v):
        notes.append(f"×{v:.3f}")
    elif pd.notna(row["diverged_at"]):
        notes.append(f"diverged @ {int(row['diverged_at'])}")
    if SYSTEMS[s].get("arch") == "ngpt" and np.isfinite(row["vs_fp32"]):
        notes.append(f"(×{row['vs_fp32']:.2g} of resmlp FP32)")
    lp = row["low_precision_frac"]
    is_ctrl = SYSTEMS[s].get("controller") is not None
    if is_ctrl or 0 < lp < 1 or (lp == 0 and s != "fp32" and "fp32" not in s):
        notes.append(f"LP GEMMs {100 * lp:.1f}%" + (f", {int(row['promotions'])} promotions" if is_ctrl else ""))
    return notes


def _base_panel(a1, df, order, ypos) -> None:
    """Left panel: each system's final loss over its own FP32 run's, base setting, first seed."""
    base = df[df["setting"] == "base"]
    if len(base):
        seed0 = base["seed"].min()
        base = base[base["seed"] == seed0].set_index("system")
        vals = []
        for s in order:
            if s in base.index and np.isfinite(base.loc[s, "vs_own_fp32"]):
                v = base.loc[s, "vs_own_fp32"]
                a1.barh(ypos[s], v - 1.0, left=1.0, height=0.7, **_system_style(s))
                vals.append(v)
        lo, hi = (min(vals + [1.0]), max(vals + [1.0])) if vals else (0.9, 1.1)
        a1.set_xscale("log")
        a1.set_xlim(lo / 1.04, hi * (1.0 + 0.6 * (hi / lo - 1.0) + 0.12))
        a1.xaxis.set_major_locator(ticker.MaxNLocator(6))
        a1.xaxis.set_minor_locator(ticker.NullLocator())
        a1.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        for s in order:
            if s not in base.index:
                continue
            row = base.loc[s]
            v = row["vs_own_fp32"]
            notes = _base_notes(s, row)
            x = max(v, 1.0) if np.isfinite(v) else 1.0
            a1.text(x * 1.003, ypos[s], " " + "  ".join(notes), va="center", fontsize=7)
        a1.axvline(1.0, color=color("fp32"), lw=1)
        a1.set_title(f"base setting (seed {seed0}): final loss / FP32's of the same architecture", fontsize=10)
    else:
        a1.text(0.5, 0.5, "no base runs", transform=a1.transAxes, ha="center", va="center", color="0.4")
    a1.set_xlabel("final training loss / FP32's (log; nGPT systems: / nGPT in FP32)")


def _stress_panel(a2, df, order, ypos, stress_label) -> None:
    """Right panel: per system and seed, the step each stress-setting run diverged or blew up."""
    stress = df[df["setting"] == "stress"]
    if len(stress):
        seeds = sorted(stress["seed"].unique())
        n = len(seeds)
        end = int(stress["steps"].max())
        for j, seed in enumerate(seeds):
            sc = _SEED_COLORS[j % len(_SEED_COLORS)]
            off = (j - (n - 1) / 2) * min(0.22, 0.7 / max(n, 1))
            part = stress[stress["seed"] == seed].set_index("system")
            for s in order:
                if s not in part.index:
                    continue
                row = part.loc[s]
                y = ypos[s] + off
                if pd.notna(row["diverged_at"]):
                    a2.plot(int(row["diverged_at"]), y, "X", color=sc, ms=8, mec="k", mew=0.4)
                elif pd.notna(row["blowup_at"]):
                    a2.plot(int(row["blowup_at"]), y, "^", color=sc, ms=7, mfc="none", mew=1.4)
                    a2.plot(int(row["steps"]), y, "o", color=sc, ms=6, mfc="none", mew=1.2)
                else:
                    a2.plot(int(row["steps"]), y, "o", color=sc, ms=6, mfc="none", mew=1.2)
            ref = part.loc["fp32"] if "fp32" in part.index else None
            if ref is not None and pd.notna(ref["diverged_at"]):
                a2.axvline(int(ref["diverged_at"]), color=sc, ls="--", lw=1)
                a2.text(int(ref["diverged_at"]), 0.01, f"FP32 seed {seed} ", color=sc, fontsize=7, rotation=90,
                        va="bottom", ha="right", transform=a2.get_xaxis_transform())
            a2.plot([], [], "s", color=sc, label=f"seed {seed}")
        a2.plot([], [], "X", color="0.5", mec="k", mew=0.4, label="diverged (stopped)")
        a2.plot([], [], "o", color="0.5", mfc="none", label="stable to the end")
        a2.plot([], [], "^", color="0.5", mfc="none", label="10× blow-up, not stopped")
        a2.plot([], [], "--", color="0.5", label="FP32 diverged (same seed)")
        a2.set_xlim(0, end * 1.04)
        a2.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.09), ncol=4, frameon=False)
        label = f" ({stress_label})" if stress_label else ""
        a2.set_title(f"stress setting{label}: step each run diverged", fontsize=10)
    else:
        a2.text(0.5, 0.5, "no stress runs", transform=a2.transAxes, ha="center", va="center", color="0.4")
    a2.set_xlabel("step")
