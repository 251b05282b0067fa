"""Ensemble figures: survival curves per arm with their bands, P(blow-up) per arm with its interval."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

__all__ = ["survival", "blowup_rates", "arm_style"]

# distinct colour-blind-safe colours (Okabe & Ito) by arm position; the FP32 twin is black and dashed
_ARM_COLOURS = ("#0072B2", "#D55E00", "#009E73", "#E69F00", "#CC79A7", "#56B4E9", "#999999", "#882255", "#117733")


def arm_style(result, arm: str) -> dict:
    """Colour and line style of ``arm`` in every ensemble figure (by its position among the arms)."""
    if arm in ("twin", "fp32") and arm == result.reference_arm():
        return {"color": "#000000", "ls": "--"}
    others = [a for a in result.spec.arms if not (a in ("twin", "fp32") and a == result.reference_arm())]
    return {"color": _ARM_COLOURS[others.index(arm) % len(_ARM_COLOURS)], "ls": "-"}


def _title(result) -> str:
    s = result.spec
    where = f"branched at step {s.branch_at}" if s.kind == "branch" else f"{s.kind} ensemble from step 0"
    eps = f", ε = {s.epsilon:g}" if s.epsilon else ""
    return (f"{s.name}: {s.base.recipe.name}, width {s.base.width}, {where}{eps}; "
            f"{s.members} members per arm, horizon {s.horizon} steps")


def survival(result, ax=None, band: bool = True):
    """Kaplan–Meier P(no blow-up by step t) per arm, t counted from the
    ensemble's start, with the pointwise 95 % band; each curve's label says
    how many of its members blew up."""
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(8.5, 4.6), layout="constrained")
    rates = result.rates().set_index("arm")
    for arm in result.spec.arms:
        if arm not in rates.index:
            continue
        s = result.survival(arm)
        t = np.r_[s["t"].to_numpy(), result.spec.horizon]
        y = np.r_[s["survival"].to_numpy(), s["survival"].iloc[-1]]
        st = arm_style(result, arm)
        r = rates.loc[arm]
        ax.step(t, y, where="post", color=st["color"], ls=st["ls"], lw=1.8,
                label=f"{arm}: {int(r['blowups'])}/{int(r['members'])} blew up")
        if band:
            lo = np.r_[s["low"].to_numpy(), s["low"].iloc[-1]]
            hi = np.r_[s["high"].to_numpy(), s["high"].iloc[-1]]
            ax.fill_between(t, lo, hi, step="post", color=st["color"], alpha=0.12, lw=0)
    ax.set_xlim(0, result.spec.horizon)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel(f"steps after {'the branch' if result.spec.kind == 'branch' else 'the start'}")
    ax.set_ylabel("P(no blow-up yet)")
    ax.set_title(_title(result), fontsize=9)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    ax.grid(alpha=0.3)
    return fig


def blowup_rates(result, ax=None):
    """P(blow-up within the horizon) per arm with its Clopper–Pearson 95 % interval, k/n beside each."""
    rates = result.rates()
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(
        figsize=(7.5, 0.45 * max(len(rates), 2) + 1.4), layout="constrained")
    for y, r in enumerate(rates.itertuples()):
        st = arm_style(result, r.arm)
        ax.errorbar(r.p, y, xerr=[[r.p - r.low], [r.high - r.p]], fmt="o", color=st["color"], capsize=4, lw=1.6)
        ax.annotate(f"{r.blowups}/{r.members}", (r.high, y), xytext=(6, 0), textcoords="offset points",
                    va="center", fontsize=8)
    ax.set_yticks(range(len(rates)), rates["arm"].tolist())
    ax.invert_yaxis()
    ax.set_xlim(-0.02, 1.12)
    ax.set_xlabel(f"P(blow-up within {result.spec.horizon} steps), 95 % Clopper–Pearson interval")
    ax.set_title(_title(result), fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    return fig
