"""Figures of the number formats themselves: the E4M3 sawtooth and LN-gain collapse."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from mx_proxy.numerics import formats
from mx_proxy.numerics.quantize import MXSpec, quantize, quantize_stats
from mx_proxy.viz.plots.style import color


def sawtooth(fmt: str = "fp8_e4m3"):
    """Paper Fig. 5 (left): relative gap between successive positive codes.
    Shaded: the clamp band. Under the OCP floor scale a block's largest
    magnitude is scaled into [2**emax, 2**(emax+1)); scaled values above the
    top code (E4M3: 448 = 0.875 · 512) saturate onto it, so a block whose
    maximum lies in [0.875, 1) · 2^k (E4M3) has it clamped: the band drawn,
    in scaled code units, is (max_normal, 2**(emax+1))."""
    f = formats.get(fmt)
    codes, gaps = formats.relative_gaps(f)
    top = 2.0 ** (f.emax + 1)
    lo = f.max_normal / top
    fig, ax = plt.subplots(figsize=(6.8, 3.8))
    ax.axvspan(f.max_normal, top, color=color("mxfp8_e4m3"), alpha=0.25, lw=0)
    ax.plot(codes, 100 * gaps, ".-", lw=0.8, ms=3, color="#000000")
    ax.set_xscale("log", base=2)
    ax.set_xlim(right=top * 1.6)
    ax.annotate(f"clamp band: scaled |x| in ({f.max_normal:g}, {top:g})\nsaturates to {f.max_normal:g}; i.e. a "
                f"block maximum\nin [{lo:g}, 1)·2^k is clamped", xy=(f.max_normal * 1.07, 60),
                xytext=(2.0 ** (f.emax - 5), 60), fontsize=8, va="center", ha="center",
                arrowprops=dict(arrowstyle="->", color=color("mxfp8_e4m3")), color=color("mxfp8_e4m3"))
    ax.set_xlabel(f"positive {f.name} code x_t (log2 scale)")
    ax.set_ylabel("relative gap (x_{t+1} − x_t)/x_t  [%]")
    ax.set_title(f"{f.name}: precision within each binade (the sawtooth) and its clamp band", fontsize=10)
    fig.tight_layout()
    return fig


def ln_collapse(fmt: str = "fp8_e4m3", centers=None, sigma: float = 0.02, n: int = 4096, seed: int = 0):
    """How tightly clustered LayerNorm-like gains g = c·exp(σ·N(0,1)) collapse
    under the OCP floor scale: the fraction the scale saturates onto the top
    code (the paper's clamping) and the distinct codes left per 32-block,
    versus the cluster centre c. Clusters just below a power of two clamp."""

    centers = np.linspace(0.6, 1.25, 66) if centers is None else np.asarray(centers)
    rng = np.random.default_rng(seed)
    spec = MXSpec(fmt)
    z = rng.standard_normal(n)
    clamped, distinct = [], []
    for c in centers:
        g = (c * np.exp(sigma * z)).astype(np.float32)
        clamped.append(100 * float(quantize_stats(g, spec).clamped_frac))
        q = np.asarray(quantize(g, spec)).reshape(-1, 32)
        distinct.append(np.mean([len(np.unique(b)) for b in q]))
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.plot(centers, clamped, color=color("mxfp8_e4m3"), label="clamped to the top code [%]")
    ax.set_xlabel("gain cluster centre c")
    ax.set_ylabel("clamped [%]", color=color("mxfp8_e4m3"))
    ax2 = ax.twinx()
    ax2.plot(centers, distinct, color=color("mxfp6_e2m3"), label="distinct codes per block")
    ax2.set_ylabel("distinct codes per 32-block", color=color("mxfp6_e2m3"))
    for k in (0.5, 1.0):
        ax.axvline(k, color="0.6", lw=0.8, ls=":")
    ax.set_title(f"{spec.element.name}, floor scale: LN-like gains c·exp({sigma:g}·N(0,1))", fontsize=10)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------
# training figures: inputs are Runs (``mxp.train`` results, ``Sweep.runs``,
# the lists of ``mx_proxy.experiments.paper``)
