"""Shared look of every figure: one colour per recipe, smoothing, the ‖ζ‖ axis."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from mx_proxy.experiments.analysis import instability
from mx_proxy.nn.norms import NORMS

# Okabe & Ito's colour-blind-safe palette (black, vermillion, blue, sky blue, bluish green, orange, reddish
# purple; yellow left out: too faint on white), assigned so that recipes drawn in one figure never share a colour:
# the headline pair mxfp8_e4m3 (vermillion) / paper_e4m3 (blue); Fig. 4's E4M3 / E2M3 / FP4; Fig. 6's four.
_OKABE_ITO = {"black": "#000000", "vermillion": "#D55E00", "blue": "#0072B2", "sky": "#56B4E9",
              "green": "#009E73", "orange": "#E69F00", "purple": "#CC79A7", "grey": "#999999"}
_PALETTE = {
    "fp32": "#000000", "bf16": "#999999", "mxfp8_e4m3": "#D55E00", "mxfp8_e5m2": "#E69F00",
    "mxfp8_mixed": "#CC79A7", "mxfp6_e2m3": "#56B4E9", "mxfp6_e3m2": "#009E73", "mxfp4": "#CC79A7",
    "mxint8": "#999999", "forward_only": "#009E73", "bf16_activations": "#56B4E9", "ln_exempt": "#CC79A7",
    "rceil": "#E69F00", "reference_mixed": "#0072B2",
    # the authors' code (mx_proxy.numerics.recipe FAMILIES["authors_code"]) and its switches
    "paper_e4m3": "#0072B2", "paper_mix": "#CC79A7", "paper_fp6": "#56B4E9", "paper_forward_only": "#009E73",
    "paper_no_ln_quant": "#E69F00", "paper_bump": "#CC79A7",
    # the systems' formats take their family's colour (the systems figure hatches the 2-D tiles)
    "mxfp8_2d": "#D55E00", "mxfp4_2d": "#CC79A7", "nvfp4": "#E69F00", "nvfp4_2d": "#E69F00",
    # derived recipes (interventions name them "<recipe>+<intervention>")
    "ln_affine_exempt": "#0072B2", "backward_unquantized": "#009E73", "gelu_unquantized": "#999999",
    "bf16_weights": "#56B4E9", "act_fp32": "#999999",
}


def norm_label(name: str) -> str:
    """How figures name a normalization: its entry's ``label`` (``mx-proxy list norms``); an unknown name as is."""
    return NORMS[name].label if name in NORMS else name


def color(name: str) -> str:
    """The colour of a recipe (stable across figures and processes). A derived
    name ``base+change`` takes the colour of its last change (so every
    "…+rceil" intervention looks alike); unknown names hash into tab20."""
    if name in _PALETTE:
        return _PALETTE[name]
    last = name.rsplit("+", 1)[-1]
    if last in _PALETTE:
        return _PALETTE[last]
    import zlib

    return plt.get_cmap("tab20")(zlib.crc32(name.encode()) % 20)


def _label(run, by) -> str:
    if callable(by):
        return str(by(run))
    if by == "recipe":
        return run.config.recipe.name
    return f"{by}={getattr(run.config, by)}"


def _series(run, column: str):
    m = run.metrics
    if column not in m.columns:
        return np.array([]), np.array([])
    s = m[["step", column]].dropna()
    return s["step"].to_numpy(), s[column].to_numpy(dtype=float)


def _mark_divergence(ax, run, col):
    if run.diverged_at is not None:
        ax.axvline(run.diverged_at, color=col, ls=":", lw=1)


def _color_for(run, color_by):
    if color_by == "recipe":
        return color(run.config.recipe.name)
    return None


def _smooth(y, window: int):
    """Trailing moving average (the first ``window − 1`` points are dropped)."""
    if window <= 1 or len(y) < window:
        return y
    kernel = np.ones(window) / window
    return np.convolve(y, kernel, mode="valid")


def _auto_smooth(runs, smooth):
    """``smooth`` or, for ``None``, a window of ~1/150 of the longest run."""
    if smooth is not None:
        return int(smooth)
    longest = max((len(r.metrics) for r in runs), default=0)
    return max(1, longest // 150)


def _plot_smoothed(ax, x, y, window, **kw):
    y_s = _smooth(y, window)
    return ax.plot(x[len(x) - len(y_s):], y_s, **kw)


def _trend(ax, x, y, col, label=None, ls="-", window: int | None = None):
    """Raw diagnostic points (thin, faint) and their rolling median (solid;
    ``window`` points, by default ~1/60 of the series and at least 5)."""
    if not len(x):
        return
    window = window or max(5, len(x) // 60)
    ax.plot(x, y, linestyle=ls, color=col, lw=0.5, alpha=0.35)
    if len(y) >= window:
        med = _rolling_median(y, window)
        ax.plot(x, med, linestyle=ls, color=col, lw=1.4, label=label)
    else:
        ax.plot(x, y, linestyle=ls, color=col, lw=1.4, label=label)


def _rolling_median(y, window: int):
    import pandas as pd

    return pd.Series(y).rolling(window, center=True, min_periods=1).median().to_numpy()


def _blowup(run):
    return instability(run)


def _run_label(run, by) -> str:
    lab = _label(run, by)
    if run.diverged_at is not None:
        return lab + f" (diverged @ {run.diverged_at})"
    b = _blowup(run)["blowup_at"]
    return lab + (f" (×10 blow-up @ {b})" if b is not None else "")


def _zeta_axis(ax, label: str = "‖ζ‖ bound"):
    """A linear ‖ζ‖-bound axis from 0 with the paper's dashed line at 2."""
    ax.axhline(2.0, color="k", ls="--", lw=1)
    ax.set_ylim(0, max(2.3, ax.get_ylim()[1]))
    ax.set_ylabel(label)


def _legend_entries(axes):
    seen = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if not lab.startswith("_") and lab not in seen:
                seen[lab] = h
    return list(seen.values()), list(seen)


def finish(fig, title: str | None = None, legend_axes=(), ncol: int = 3, fontsize: float = 8):
    """Lay a figure out so that nothing overlaps: the legend of ``legend_axes``
    (their entries, once each) in rows *below* the panels (never over data or
    notes), the figure made taller by exactly that, and the title in its own
    band above the panels (never touching a frame)."""
    handles, labels = _legend_entries(legend_axes)
    rows = -(-len(labels) // ncol) if labels else 0
    title_lines = title.count("\n") + 1 if title else 0
    legend_h, title_h = 0.1 + 0.2 * rows if rows else 0.0, 0.05 + 0.22 * title_lines if title else 0.0
    h = fig.get_figheight()
    fig.set_figheight(h + legend_h + title_h)
    h = fig.get_figheight()
    if rows:
        fig.legend(handles, labels, loc="lower center", ncol=min(ncol, len(labels)), fontsize=fontsize,
                   frameon=False)
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, legend_h / h, 1, 1))  # tight_layout keeps the suptitle's band clear itself
    return fig
