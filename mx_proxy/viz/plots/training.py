"""Loss curves: the LR sweep (Fig. 2), ablations (Fig. 3) and the appendix figures (Figs. 9-11)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from mx_proxy.viz.plots.style import (
    _auto_smooth,
    _blowup,
    _color_for,
    _label,
    _mark_divergence,
    _plot_smoothed,
    _series,
    color,
    finish,
    norm_label,
)


def loss_grid(runs, panel_by="lr", color_by="recipe", column: str = "loss", smooth: int | None = None,
              title: str | None = None, logy: bool = True, ncols: int = 3, ymax: float | None = 10.0):
    """Curves of ``column`` over steps: one panel per value of ``panel_by``
    (a Config field, or a function of a run), one line per ``color_by``.
    Instabilities are marked in the run's colour: a triangle at the top of
    the panel at its first 10× blow-up (the loss 10× above its recent
    minimum, :func:`mx_proxy.experiments.analysis.instability`), a dotted
    vertical line at a divergence (the run stopped). One legend, below the
    panels. ``smooth``: moving-average window in steps (``None``: ~1/150 of
    the run); ``ymax``: top of a log axis (blow-ups run off it; ``None``:
    automatic)."""
    from matplotlib.lines import Line2D

    runs = list(runs)
    smooth = _auto_smooth(runs, smooth)
    panels: dict[str, list] = {}
    for r in runs:
        panels.setdefault(_label(r, panel_by), []).append(r)
    n = len(panels)
    ncols = min(ncols, n)
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.2 * nrows), squeeze=False, sharey=True)
    blew = stopped = False
    for ax, (name, group) in zip(axes.flat, panels.items()):
        for r in group:
            x, y = _series(r, column)
            col = _color_for(r, color_by) or "k"
            _plot_smoothed(ax, x, y, smooth, color=col, lw=1.1, label=_label(r, color_by))
            _mark_divergence(ax, r, col)
            stopped |= r.diverged_at is not None
            at = _blowup(r)["blowup_at"] if r.diverged_at is None else None
            if at is not None:
                ax.plot([at], [0.97], "v", color=col, ms=7, transform=ax.get_xaxis_transform(), clip_on=False)
                blew = True
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step")
        if logy:
            ax.set_yscale("log")
    if blew:
        axes.flat[0].add_line(Line2D([], [], ls="none", marker="v", color="0.3", ms=7,
                                     label="first blow-up: loss 10× its recent minimum"))
    if stopped:
        axes.flat[0].add_line(Line2D([], [], ls=":", color="0.3", lw=1, label="diverged (run stopped)"))
    ylabel = column.replace("_", " ") + (f" ({smooth}-step mean)" if smooth > 1 else "")
    if logy and ymax is not None:  # blow-ups run off the top rather than squash the plateaus
        lo, hi = axes[0, 0].get_ylim()
        axes[0, 0].set_ylim(lo, min(hi, ymax))
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    return finish(fig, title, legend_axes=list(axes.flat)[:n], ncol=5)


def lr_sweep(runs, column: str = "loss", smooth: int | None = None, title: str | None = None):
    """Paper Fig. 2: FP32 vs MX formats across learning rates (panel per LR)."""
    return loss_grid(runs, panel_by=lambda r: f"learning rate {r.config.lr:g}", color_by="recipe", column=column,
                     smooth=smooth, title=title or "Full vs low precision across learning rates (Adam)")


def lr_summary(runs):
    """Final loss (before any divergence) versus learning rate per recipe; a
    cross marks a run that diverged, an open circle one whose loss blew up
    10× above its recent minimum (:func:`mx_proxy.experiments.paper.instability`)."""
    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    by_recipe: dict[str, list] = {}
    for r in runs:
        by_recipe.setdefault(r.config.recipe.name, []).append(r)
    for name, group in by_recipe.items():
        group = sorted(group, key=lambda r: r.config.lr)
        lrs = [r.config.lr for r in group]
        ax.plot(lrs, [r.final_loss for r in group], "o-", color=color(name), label=name, ms=4)
        div = [r for r in group if r.diverged_at is not None]
        ax.plot([r.config.lr for r in div], [r.final_loss for r in div], "x", color=color(name), ms=10, mew=2)
        blow = [r for r in group if r.diverged_at is None and _blowup(r)["blowup_at"] is not None]
        ax.plot([r.config.lr for r in blow], [r.final_loss for r in blow], "o", mfc="none", color=color(name),
                ms=11, mew=1.5)
    ax.plot([], [], "x", color="k", label="diverged (stopped)")
    ax.plot([], [], "o", mfc="none", color="k", label="blew up ≥10×")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("final training loss")
    return finish(fig, "Final loss versus learning rate", legend_axes=[ax], ncol=4)


def ablations(runs, column: str = "loss", smooth: int | None = None):
    """Paper Fig. 3: activation functions and normalizations (panel per
    (activation, norm), named by :func:`norm_label`), full vs low precision."""
    return loss_grid(runs, panel_by=lambda r: f"{r.config.act}, {norm_label(r.config.norm)}",
                     color_by="recipe", column=column, smooth=smooth, title="Activation and normalization ablations")


def spikes_vs_shape(runs):
    """Paper Fig. 9: instability versus model depth and width. Left: spikes
    per run (separate excursions of the loss 10× above its recent minimum,
    plus a divergence; :func:`mx_proxy.experiments.paper.instability`); middle: the largest
    such ratio, with the 10× threshold; right: the median ‖ζ‖ bound of the
    quantized recipes. One bar per recipe for each (depth, width)."""
    rows: dict = {}
    for r in runs:
        key = (r.config.depth, r.config.width)
        d = r.metrics.dropna(subset=["zeta_bound"]) if "zeta_bound" in r.metrics else r.metrics.iloc[0:0]
        if r.diverged_at is not None:
            d = d[d["step"] < r.diverged_at]
        zeta = float(d["zeta_bound"].median()) if len(d) else float("nan")
        rows.setdefault(key, {})[r.config.recipe.name] = dict(_blowup(r), zeta=zeta,
                                                              quantized=not r.config.recipe.is_full_precision)
    keys = sorted(rows)
    recipes_ = sorted({name for v in rows.values() for name in v})
    quantized = [n for n in recipes_ if any(rows[k].get(n, {}).get("quantized") for k in keys)]
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(max(13, 2.6 * len(keys)), 3.9))
    pos = np.arange(len(keys))
    for ax, names, field in ((a1, recipes_, "spikes"), (a2, recipes_, "max_jump"), (a3, quantized, "zeta")):
        w = 0.8 / max(len(names), 1)
        for j, name in enumerate(names):
            vals = [rows[k][name][field] if name in rows[k] else np.nan for k in keys]
            if field == "max_jump":  # bars rise from a ratio of 1 on the log axis
                ax.bar(pos + j * w, np.asarray(vals) - 1.0, w, bottom=1.0, color=color(name), label=name)
            else:
                ax.bar(pos + j * w, vals, w, color=color(name), label=name)
        ax.set_xticks(pos + 0.4 - w / 2)
        ax.set_xticklabels([f"depth {d}\nwidth {wd}" for d, wd in keys], fontsize=8)
    total = sum(v["spikes"] for row in rows.values() for v in row.values())
    if total == 0:
        a1.text(0.5, 0.5, "no spikes in any run", transform=a1.transAxes, ha="center", va="center", color="0.4")
    a1.set_ylabel("spikes (≥10× blow-ups) + divergence")
    a1.set_ylim(0, max(1, a1.get_ylim()[1]))
    a2.axhline(10, color="k", ls="--", lw=1)
    a2.set_yscale("log")
    a2.set_ylim(1, max(20, a2.get_ylim()[1]))
    a2.set_ylabel("largest loss / recent-minimum ratio")
    a3.set_ylabel("median ‖ζ‖ bound")
    return finish(fig, "Instability versus depth and width", legend_axes=[a1], ncol=6)


def sgd_momentum(runs, smooth: int | None = None):
    """Paper Fig. 10: SGD without and with momentum (panel per momentum)."""
    return loss_grid(runs, panel_by=lambda r: f"SGD, momentum {r.config.momentum:g}, LR {r.config.lr:g}",
                     color_by="recipe", smooth=smooth, title="SGD with and without momentum")


def init_ablation(runs, smooth: int | None = None):
    """Paper Fig. 11: the default (PyTorch) initialisation against a
    lower-gain Xavier-normal one (panel per init)."""
    def name(r):
        c = r.config
        return "PyTorch default init" if c.init == "pytorch" else f"{c.init}, gain {c.init_gain:g}"

    return loss_grid(runs, panel_by=name, color_by="recipe", smooth=smooth, title="Lower-gain initialisation")


