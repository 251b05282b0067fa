"""Quantization statistics of the GEMM operands over training (runs trained with ``Config.quant_stats``)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from mx_proxy.numerics.operands import OPERANDS
from mx_proxy.viz.plots.style import _mark_divergence, _series, finish

__all__ = ["quant_stats", "operand_columns", "worst_operand"]

# one Okabe & Ito colour per operand (the forward's warm, dgrad's blue, wgrad's green); fc2 dashed
OPERAND_COLORS = dict(zip(OPERANDS, ("#D55E00", "#E69F00", "#0072B2", "#56B4E9", "#009E73", "#CC79A7")))
LAYER_STYLES = {"fc1": "-", "fc2": "--"}
# (statistic, axis label, factor, y scale); "scale_exp" draws scale_exp_max thick and scale_exp_min thin
PANELS = (("underflow_frac", "underflowed to zero [% of non-zero]", 100, "linear"),
          ("clamp_frac", "saturated at max normal [%]", 100, "linear"),
          ("last_bin_frac", "on the top code [%]", 100, "linear"),
          ("scale_exp", "shared scale exponent\n(thick: max, thin: min over blocks)", 1, "linear"),
          ("snr_db", "SNR = −10·log10 rel. MSE [dB]", 1, "linear"),
          ("rel_mse", "relative MSE ‖q(x) − x‖² / ‖x‖²", 1, "log"))
_BEST = {"snr_db": "min", "scale_exp_min": "min"}  # worst_operand: the lowest of these, the highest of the others


def operand_columns(metrics: pd.DataFrame) -> list[tuple[str, str]]:
    """The (layer, operand) pairs whose ``quant/<layer>/<operand>/…`` columns ``metrics`` holds."""
    found = {tuple(c.split("/")[1:3]) for c in metrics.columns if c.startswith("quant/") and c.count("/") == 3}
    return [(layer, op) for layer in LAYER_STYLES for op in OPERANDS if (layer, op) in found]


def worst_operand(metrics: pd.DataFrame, stat: str) -> pd.Series:
    """Per row, ``stat`` of the operand where it is worst: the lowest SNR (or minimum scale exponent),
    the highest of every other statistic, over every (layer, operand) (NaN on non-diagnostic steps)."""
    cols = [f"quant/{layer}/{op}/{stat}" for layer, op in operand_columns(metrics)]
    if not cols:
        return pd.Series(np.nan, index=metrics.index)
    values = metrics[cols]
    return values.min(axis=1) if _BEST.get(stat) == "min" else values.max(axis=1)


def quant_stats(run, title: str | None = None):
    """The quantization statistics of every quantized GEMM operand of ``run``
    over training, each the mean over the blocks (scale exponents: the
    extremes over the blocks): underflow, saturation, last bin, the shared
    scale exponents' range, SNR and relative MSE. One colour per operand
    (fwd_x … wgrad_g), fc1 solid, fc2 dashed.

    Raises:
      ValueError: ``run`` has no quantization statistics (train it with ``quant_stats=True``).
    """
    pairs = operand_columns(run.metrics)
    if not pairs:
        raise ValueError(f"run {run.config.recipe.name!r} has no quant/ columns: train it with quant_stats=True "
                         f"(a recipe that quantizes some GEMM operand)")
    fig, axes = plt.subplots(2, 3, figsize=(14, 6.4))
    for layer, op in pairs:
        kw = dict(color=OPERAND_COLORS[op], ls=LAYER_STYLES[layer])
        base = f"quant/{layer}/{op}"
        for ax, (stat, _, factor, _) in zip(axes.flat, PANELS):
            label = f"{layer} {op}" if ax is axes.flat[0] else None
            if stat == "scale_exp":
                x, hi = _series(run, f"{base}/scale_exp_max")
                ax.plot(x, hi, lw=1.2, **kw)
                x, lo = _series(run, f"{base}/scale_exp_min")
                ax.plot(x, lo, lw=0.6, alpha=0.7, **kw)
                continue
            x, y = _series(run, f"{base}/{stat}")
            ax.plot(x, factor * y, lw=1.1, label=label, **kw)
    for ax, (_, ylabel, _, yscale) in zip(axes.flat, PANELS):
        _mark_divergence(ax, run, "0.4")
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.set_yscale(yscale)
    c = run.config
    return finish(fig, title or f"{c.recipe.name}, width {c.width}: quantization statistics of the GEMM operands "
                                f"(mean over {c.depth} blocks)", legend_axes=[axes.flat[0]], ncol=6)
