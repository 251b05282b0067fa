"""Ensemble figures: survival curves per arm with their bands, P(blow-up) per arm with its interval, and every
member's loss per arm with its blow-up marked."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from mx_proxy.experiments import signals as sig
from mx_proxy.viz.plots.style import color

__all__ = ["survival", "blowup_rates", "cell_rates", "trajectories", "signals_before", "arm_style"]

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


def _survival_curve(ax, result, arm: str, rates: pd.DataFrame, band: bool, label: str | None = None, **style):
    """One arm's Kaplan–Meier step curve (held to the horizon) on ``ax``, its 95 % band shaded if ``band``."""
    s = result.survival(arm)
    t = np.r_[s["t"].to_numpy(), result.spec.horizon]
    y = np.r_[s["survival"].to_numpy(), s["survival"].iloc[-1]]
    st = {**arm_style(result, arm), "lw": 1.8, **style}
    r = rates.loc[arm]
    ax.step(t, y, where="post", color=st["color"], ls=st["ls"], lw=st["lw"],
            label=label or f"{arm}: {int(r['blowups'])}/{int(r['members'])} blew up")
    if band:
        lo = np.r_[s["low"].to_numpy(), s["low"].iloc[-1]]
        hi = np.r_[s["high"].to_numpy(), s["high"].iloc[-1]]
        ax.fill_between(t, lo, hi, step="post", color=st["color"], alpha=0.15, lw=0)


def _survival_axes(ax, result, title: str | None = None):
    ax.set_xlim(0, result.spec.horizon)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title, fontsize=9)


def survival(result, ax=None, band: bool = True, panels: bool | None = None, cols: int = 4):
    """Kaplan–Meier P(no blow-up by step t) per arm, t counted from the
    ensemble's start, with the pointwise 95 % band; each curve's label says
    how many of its members blew up.

    ``panels`` draws one panel per arm against the control arm
    (:attr:`EnsembleResult.control`, dotted grey in every panel, its band too), the
    panel's title with McNemar's p against it: what stays readable when many
    arms' bands overlap. By default (``None``) panels are drawn for more than
    four arms unless ``ax`` is given; ``ax`` takes the single-panel figure."""
    rates = result.rates().set_index("arm")
    arms = [a for a in result.spec.arms if a in rates.index]
    if panels is None:
        panels = ax is None and len(arms) > 4
    if panels and ax is not None:
        raise ValueError("survival(panels=True) draws its own figure of one panel per arm; pass ax=None")
    xlabel = f"steps after {'the branch' if result.spec.kind == 'branch' else 'the start'}"
    if panels:
        return _survival_panels(result, rates, arms, band, cols, xlabel)
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(8.5, 4.6), layout="constrained")
    for arm in arms:
        _survival_curve(ax, result, arm, rates, band)
    _survival_axes(ax, result, _title(result))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("P(no blow-up yet)")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    return fig


def _survival_panels(result, rates: pd.DataFrame, arms: list[str], band: bool, cols: int, xlabel: str):
    control = result.control
    others = [a for a in arms if a != control] or arms
    tests = result.paired_tests().set_index("arm") if control in arms else pd.DataFrame()
    cols = max(1, min(cols, len(others)))
    rows = -(-len(others) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.3 * cols, 2.6 * rows + 0.7), sharex=True, sharey=True,
                             layout="constrained", squeeze=False)
    for ax, arm in zip(axes.flat, others, strict=False):
        if control in arms and arm != control:
            r = rates.loc[control]
            _survival_curve(ax, result, control, rates, band, color="0.3", ls=":", lw=1.5,
                            label=f"{control}: {int(r['blowups'])}/{int(r['members'])}")
        _survival_curve(ax, result, arm, rates, band)
        r = rates.loc[arm]
        p = f", McNemar p = {tests.loc[arm, 'mcnemar_p']:.2f}" if arm in tests.index else ""
        _survival_axes(ax, result, f"{arm}: {int(r['blowups'])}/{int(r['members'])} blew up{p}")
        ax.title.set_color(arm_style(result, arm)["color"])
    for ax in axes.flat[len(others):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel(xlabel)
    for ax in axes[:, 0]:
        ax.set_ylabel("P(no blow-up yet)")
    fig.suptitle(f"{_title(result)}\nKaplan–Meier survival with 95 % bands; dotted grey: the control, {control}",
                 fontsize=9)
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


def cell_rates(rates: pd.DataFrame, title: str | None = None, ax=None):
    """An ablation's rates (:meth:`mx_proxy.experiments.cell_rates.CellRates.rates`): one row per cell (its
    changed fields), P(blow-up) of each recipe with its Clopper–Pearson 95 % interval, the recipes side by side
    in their colours, k/n beside each."""
    stat = ["arm", "members", "blowups", "p", "low", "high", "mcnemar_p"]
    keys = [c for c in rates.columns if c not in stat]
    if not len(rates):
        raise ValueError("no rates to draw (an empty table)")
    cells = list(dict.fromkeys(map(tuple, rates[keys].astype(str).to_numpy()))) if keys else [()]
    arms = list(dict.fromkeys(rates["arm"]))
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(
        figsize=(7.5, 0.32 * len(cells) * len(arms) + 0.25 * len(cells) + 1.5), layout="constrained")
    offsets = np.linspace(-0.3, 0.3, len(arms)) if len(arms) > 1 else np.zeros(1)
    for r in rates.itertuples(index=False):
        cell = tuple(str(getattr(r, k)) for k in keys)
        y = cells.index(cell) + offsets[arms.index(r.arm)]
        ax.errorbar(r.p, y, xerr=[[r.p - r.low], [r.high - r.p]], fmt="o", color=color(r.arm), capsize=3, lw=1.4,
                    label=r.arm if cells.index(cell) == 0 else None)
        ax.annotate(f"{r.blowups}/{r.members}", (r.high, y), xytext=(5, 0), textcoords="offset points",
                    va="center", fontsize=7)
    ax.set_yticks(range(len(cells)), [", ".join(c) for c in cells])
    ax.invert_yaxis()
    ax.set_xlim(-0.02, 1.12)
    ax.set_xlabel("P(blow-up), 95 % Clopper–Pearson interval")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title or f"Blow-up rates per cell ({int(rates['members'].max())} seeds per recipe)", fontsize=9)
    return fig


def trajectories(result, cols: int = 3):
    """Every exported member's training loss against steps from the
    ensemble's start (a branch member's from the 100 steps of history its
    export keeps), one panel per arm on one log scale; member i has the same
    colour in every panel (the arms' members are paired: same perturbation),
    its blow-up by the report's rule is a cross, a stop by the engine a
    square. What the rates count, member by member."""
    arms = [a for a in result.spec.arms if any(r is not None for r in result.runs.get(a, []))]
    if not arms:
        raise ValueError(f"ensemble {result.spec.name!r} has no exported member to draw")
    cols = max(1, min(cols, len(arms)))
    rows = -(-len(arms) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.9 * rows + 0.6), sharex=True, sharey=True,
                             layout="constrained", squeeze=False)
    start, members = result.spec.start, result.spec.members
    palette = plt.get_cmap("viridis")(np.linspace(0.0, 0.9, max(members, 2)))
    table = result.table.set_index(["arm", "member"])
    for ax, arm in zip(axes.flat, arms, strict=False):
        blew = 0
        for i, run in enumerate(result.runs[arm]):
            if run is None:
                continue
            m = run.metrics
            x = m["step"].to_numpy() - start
            y = m["loss"].to_numpy(dtype=float)
            ok = np.isfinite(y) & (y > 0)
            ax.plot(x[ok], y[ok], color=palette[i], lw=0.7, alpha=0.85)
            at = table.loc[(arm, i), "blowup_at"]
            if not pd.isna(at):
                blew += 1
                j = int(np.searchsorted(m["step"].to_numpy(), int(at)))
                if j < len(y) and np.isfinite(y[j]):
                    ax.plot(x[j], y[j], "x", color=palette[i], ms=8, mew=2)
            if run.diverged_at is not None and run.diverged_at >= start and ok.any():
                last = np.flatnonzero(ok)[-1]
                ax.plot(x[last], y[last], "s", mfc="none", color=palette[i], ms=7, mew=1.5)
        n = sum(r is not None for r in result.runs[arm])
        ax.set_title(f"{arm}: {blew}/{n} blew up", fontsize=9, color=arm_style(result, arm)["color"])
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        if start:
            ax.axvline(0, color="0.5", lw=0.8, ls=":")
    for ax in axes.flat[len(arms):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel(f"steps after {'the branch' if result.spec.kind == 'branch' else 'the start'}")
    for ax in axes[:, 0]:
        ax.set_ylabel("training loss")
    fig.suptitle(_title(result) + "; × blow-up, □ stopped by the engine", fontsize=9)
    return fig


def signals_before(result, history: pd.DataFrame | None = None, window: int = 500, cols: int = 4):
    """Every warning signal of :data:`mx_proxy.experiments.signals.SIGNALS`
    against the steps left to each blow-up: one panel per signal, each member
    that blew up a thin line in its arm's colour over the ``window`` steps
    before (its diagnostic steps), their median per diagnostics interval the
    thick black line, and the signal at the *quiet* steps (no blow-up within
    the longest scoring horizon, every arm) as the grey band between its 5th
    and 95th percentiles, the 95th (the alarm threshold of the report's
    table) dashed. A signal that warns rises out of the band before 0.
    ``history``: the branch state's metrics (for GNMR's mean since step 0)."""
    d = sig.labelled(result, history)
    hot = d[np.isfinite(d["until"]) & (d["until"] <= window)] if len(d) else d
    if not len(hot):
        raise ValueError(f"ensemble {result.spec.name!r} has no member that blew up after a diagnostic step: "
                         f"no signal to draw before a blow-up")
    quiet = d[d["until"] > max(sig.HORIZONS)]
    scores = sig.score_labelled(d).set_index("signal")
    names = [n for n in sig.SIGNALS if n in scores.index]
    cols = max(1, min(cols, len(names)))
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.6 * rows + 0.7), sharex=True, layout="constrained",
                             squeeze=False)
    every = max(int(result.spec.diagnostics or 1), 1)
    for ax, name in zip(axes.flat, names, strict=False):
        s = scores.loc[name]
        q = quiet[name].to_numpy(dtype=float)
        q = q[np.isfinite(q)]
        if len(q):  # the band's top is the report's alarm threshold, its 95th percentile
            ax.axhspan(np.quantile(q, 0.05), s["threshold"], color="0.85", lw=0)
            ax.axhline(s["threshold"], color="0.4", ls="--", lw=1)
        for (arm, _), g in hot.groupby(["arm", "member"], sort=False):
            g = g.sort_values("step")
            ax.plot(-g["until"], g[name], color=arm_style(result, arm)["color"], lw=0.6, alpha=0.6)
        binned = hot.assign(bin=-(np.ceil(hot["until"] / every) * every)).groupby("bin")[name].median()
        ax.plot(binned.index, binned.to_numpy(), color="black", lw=1.8)
        vals = np.r_[hot[name].to_numpy(dtype=float), q]
        vals = vals[np.isfinite(vals)]
        if len(vals) and vals.min() > 0 and vals.max() / vals.min() > 100:
            ax.set_yscale("log")
        ax.set_title(f"{s['label']}\nwarned {int(s['warned'])}/{int(s['events'])}, AUC₁₀₀ {s['auc_100']:.2f}",
                     fontsize=8.5)
        ax.axvline(0, color="0.5", lw=0.8, ls=":")
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("steps to the blow-up")
    events = hot.groupby(["arm", "member"]).ngroups
    fig.suptitle(f"{_title(result)}\nthe signals before each of {events} blow-ups (thin: a member, its arm's colour; "
                 f"black: their median); grey: quiet steps, 5th–95th percentile", fontsize=9)
    return fig
