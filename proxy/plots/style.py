"""Shared look of every figure: one colour per recipe, smoothing, the ‖ζ‖ axis."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from proxy.analysis import instability

_PALETTE = {
    "fp32": "#222222", "bf16": "#7f7f7f", "mxfp8_e4m3": "#d62728", "mxfp8_e5m2": "#ff7f0e",
    "mxfp8_mixed": "#e377c2", "mxfp6_e2m3": "#1f77b4", "mxfp6_e3m2": "#17becf", "mxfp4": "#9467bd",
    "mxint8": "#8c564b", "forward_only": "#2ca02c", "bf16_activations": "#bcbd22", "ln_exempt": "#98df8a",
    "rceil": "#ff9896", "reference_mixed": "#c5b0d5",
    # the authors' code (proxy.recipe FAMILIES["authors_code"]) and its switches
    "paper_e4m3": "#8b0000", "paper_mix": "#c51b7d", "paper_fp6": "#08519c", "paper_forward_only": "#006d2c",
    "paper_no_ln_quant": "#41ab5d", "paper_bump": "#fd8d3c",
    # derived recipes (interventions name them "<recipe>+<intervention>")
    "ln_affine_exempt": "#17becf", "backward_unquantized": "#2ca02c", "gelu_unquantized": "#8c564b",
    "bf16_weights": "#9467bd",
}


# how figures name each normalization of proxy.model.NORMS
NORM_LABELS = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm", "layernorm_noaffine": "LayerNorm, no affine",
               "none": "no norm"}


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
    ax.plot(x, y, ls, color=col, lw=0.5, alpha=0.35)
    if len(y) >= window:
        med = _rolling_median(y, window)
        ax.plot(x, med, ls, color=col, lw=1.4, label=label)
    else:
        ax.plot(x, y, ls, color=col, lw=1.4, label=label)


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
