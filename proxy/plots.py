"""One function per figure: results in, a labelled matplotlib Figure out.

Colours are fixed per recipe (:func:`color`) so every figure reads alike.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg", force=False)
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from proxy import formats  # noqa: E402
from proxy.quantize import MXSpec, quantize  # noqa: E402

__all__ = ["color", "sawtooth", "ln_collapse"]

_PALETTE = {
    "fp32": "#222222", "bf16": "#7f7f7f", "mxfp8_e4m3": "#d62728", "mxfp8_e5m2": "#ff7f0e",
    "mxfp8_mixed": "#e377c2", "mxfp6_e2m3": "#1f77b4", "mxfp6_e3m2": "#17becf", "mxfp4": "#9467bd",
    "mxint8": "#8c564b", "forward_only": "#2ca02c", "bf16_activations": "#bcbd22", "ln_exempt": "#98df8a",
    "rceil": "#ff9896", "reference_mixed": "#c5b0d5",
}


def color(name: str) -> str:
    """The colour of a recipe (stable across figures; unknown names hash into tab20)."""
    if name in _PALETTE:
        return _PALETTE[name]
    return plt.get_cmap("tab20")(hash(name) % 20)


def sawtooth(fmt: str = "fp8_e4m3"):
    """Paper Fig. 5 (left): relative gap between successive positive codes,
    with the region a block's values reach only by saturating (OCP floor
    scale: scaled magnitudes in (max_normal, 2**(emax+1)) clamp to max_normal)."""
    f = formats.get(fmt)
    codes, gaps = formats.relative_gaps(f)
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.plot(codes, 100 * gaps, ".-", lw=0.8, ms=3, color=color("mxfp8_e4m3"))
    ax.axvspan(f.max_normal, 2.0 ** (f.emax + 1), color="0.8", hatch="//", alpha=0.6,
               label=f"clamped to {f.max_normal:g} (scaled |x| > {f.max_normal:g})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"positive {f.name} code x_t (log2 scale)")
    ax.set_ylabel("relative gap (x_{t+1} − x_t)/x_t  [%]")
    ax.set_title(f"{f.name}: precision within each binade (the sawtooth)")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return fig


def ln_collapse(fmt: str = "fp8_e4m3", centers=None, sigma: float = 0.02, n: int = 4096, seed: int = 0):
    """How tightly clustered LayerNorm-like gains g = c·exp(σ·N(0,1)) collapse
    under the OCP floor scale: the fraction the scale saturates onto the top
    code (the paper's clamping) and the distinct codes left per 32-block,
    versus the cluster centre c. Clusters just below a power of two clamp."""
    from proxy.quantize import quantize_stats

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
# training figures: inputs are Runs (``proxy.train`` results, ``Sweep.runs``)

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
    return s["step"].to_numpy(), s[column].to_numpy()


def _mark_divergence(ax, run, col):
    if run.diverged_at is not None:
        ax.axvline(run.diverged_at, color=col, ls=":", lw=1)


def _color_for(run, color_by):
    if color_by == "recipe":
        return color(run.config.recipe.name)
    return None


def _smooth(y, window: int):
    if window <= 1 or len(y) < window:
        return y
    kernel = np.ones(window) / window
    return np.convolve(y, kernel, mode="valid")


def loss_grid(runs, panel_by="lr", color_by="recipe", column: str = "loss", smooth: int = 1,
              title: str | None = None, logy: bool = True, ncols: int = 3):
    """Curves of ``column`` over steps: one panel per value of ``panel_by``
    (a Config field, or a function of a run), one line per ``color_by``.
    A dotted vertical line marks each run's divergence step."""
    runs = list(runs)
    panels: dict[str, list] = {}
    for r in runs:
        panels.setdefault(_label(r, panel_by), []).append(r)
    n = len(panels)
    ncols = min(ncols, n)
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.2 * nrows), squeeze=False, sharey=True)
    for ax, (name, group) in zip(axes.flat, panels.items()):
        for r in group:
            x, y = _series(r, column)
            col = _color_for(r, color_by)
            lab = _label(r, color_by) + (f" (diverged @ {r.diverged_at})" if r.diverged_at is not None else "")
            y_s = _smooth(y, smooth)
            ax.plot(x[len(x) - len(y_s):], y_s, color=col, lw=1.1, label=lab)
            _mark_divergence(ax, r, col or "k")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step")
        if logy:
            ax.set_yscale("log")
        ax.legend(fontsize=7)
    for ax in axes[:, 0]:
        ax.set_ylabel(column.replace("_", " "))
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def lr_sweep(runs, column: str = "loss", smooth: int = 1):
    """Paper Fig. 2: FP32 vs MX formats across learning rates (panel per LR)."""
    return loss_grid(runs, panel_by="lr", color_by="recipe", column=column, smooth=smooth,
                     title="Full vs low precision across learning rates")


def lr_summary(runs):
    """Final loss (before any divergence) versus learning rate per recipe; a
    cross marks a run that diverged, at the loss it had reached."""
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
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("final training loss (× = diverged)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def ablations(runs, column: str = "loss", smooth: int = 1):
    """Paper Fig. 3: activation functions and LayerNorm on/off (panel per
    (activation, norm)), full vs low precision."""
    return loss_grid(runs, panel_by=lambda r: f"{r.config.act}, norm={r.config.norm}", color_by="recipe",
                     column=column, smooth=smooth, title="Activation and LayerNorm ablations", ncols=4)


def gradient_bias(runs, labels=None):
    """Paper Fig. 4: loss, gradient norm, the ‖ζ‖ bound (dashed line at 2) and
    cos(g̃, g) over training."""
    runs = list(runs)
    labels = labels or [r.config.recipe.name + (" (paired run)" if r.config.gradient_reference == "paired_run"
                                                 else "") for r in runs]
    fig, axes = plt.subplots(2, 2, figsize=(9.6, 6.4))
    panels = [("loss", "training loss", True), ("grad_norm", "gradient norm ‖g̃‖", True),
              ("zeta_bound", "‖ζ‖ bound = ‖g̃ − g‖/‖g‖", True), ("cosine", "cos(g̃, g)", False)]
    for ax, (col, ylabel, logy) in zip(axes.flat, panels):
        for r, lab in zip(runs, labels):
            x, y = _series(r, col)
            c = color(r.config.recipe.name)
            ls = "--" if r.config.gradient_reference == "paired_run" else "-"
            if len(x):
                ax.plot(x, y, ls, color=c, lw=1.1, label=lab)
            _mark_divergence(ax, r, c)
        if col == "zeta_bound":
            ax.axhline(2.0, color="k", ls="--", lw=1)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        if logy:
            ax.set_yscale("log")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle("Gradient bias of low-precision training")
    fig.tight_layout()
    return fig


def ln_clamping(runs, labels=None):
    """Paper Fig. 5 (right): fraction of LN gains the weight spec clamps, per
    block and overall, with the loss, before divergence."""
    runs = list(runs)
    labels = labels or [r.config.recipe.name for r in runs]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for r, lab in zip(runs, labels):
        c = color(r.config.recipe.name)
        x, y = _series(r, "loss")
        a1.plot(x, y, color=c, lw=1, label=lab)
        _mark_divergence(a1, r, c)
        x, y = _series(r, "ln_clamp_frac")
        a2.plot(x, 100 * y, color=c, lw=1.4, label=f"{lab}: all blocks")
        blocks = sorted(k for k in r.metrics.columns if k.startswith("ln_clamp_frac/block_"))
        for k in blocks:
            xb, yb = _series(r, k)
            a2.plot(xb, 100 * yb, color=c, lw=0.6, alpha=0.5)
        _mark_divergence(a2, r, c)
    a1.set_yscale("log")
    a1.set_xlabel("step")
    a1.set_ylabel("training loss")
    a2.set_xlabel("step")
    a2.set_ylabel("LN gains clamped [%] (thin: per block)")
    a1.legend(fontsize=7)
    a2.legend(fontsize=7)
    fig.tight_layout()
    return fig


def mitigations(runs, smooth: int = 1):
    """Paper Fig. 6: forward-only quantization and bf16 activations against
    the plain MX recipe and FP32 (loss and gradient norm)."""
    runs = list(runs)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for r in runs:
        c = color(r.config.recipe.name)
        for ax, col in ((a1, "loss"), (a2, "grad_norm")):
            x, y = _series(r, col)
            y_s = _smooth(y, smooth)
            ax.plot(x[len(x) - len(y_s):], y_s, color=c, lw=1.1, label=r.config.recipe.name)
            _mark_divergence(ax, r, c)
    for ax, lab in ((a1, "training loss"), (a2, "gradient norm")):
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel(lab)
    a1.legend(fontsize=7)
    fig.suptitle("Mitigations")
    fig.tight_layout()
    return fig


def interventions(parent, children, labels=None):
    """Paper Fig. 7: a diverging run and runs resumed from its checkpoints
    with a changed recipe; a vertical line marks each intervention step."""
    children = list(children)
    labels = labels or [c.info.get("intervention", c.config.recipe.name) if isinstance(c.info, dict) else
                        c.config.recipe.name for c in children]
    fig, ax = plt.subplots(figsize=(6.8, 4))
    x, y = _series(parent, "loss")
    ax.plot(x, y, color=color(parent.config.recipe.name), lw=1.2, label=f"{parent.config.recipe.name} (parent)")
    _mark_divergence(ax, parent, color(parent.config.recipe.name))
    cmap = plt.get_cmap("tab10")
    for i, (c, lab) in enumerate(zip(children, labels)):
        x, y = _series(c, "loss")
        at = c.info.get("at_step") if isinstance(c.info, dict) else None
        if at is not None:
            keep = x >= at
            x, y = x[keep], y[keep]
            ax.axvline(at, color="0.7", lw=0.8)
        ax.plot(x, y, color=cmap(i % 10), lw=1, label=str(lab))
        _mark_divergence(ax, c, cmap(i % 10))
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.legend(fontsize=7)
    ax.set_title("In-situ interventions")
    fig.tight_layout()
    return fig


def spikes_vs_shape(runs):
    """Paper Fig. 9: instability versus model depth and width. Per run, the
    spikes are the steps whose loss exceeds 10× the previous step's, plus one
    for a divergence; one bar per recipe for each (depth, width)."""
    rows = {}
    for r in runs:
        loss = r.metrics["loss"].to_numpy()
        jumps = int(np.sum(loss[1:] > 10 * loss[:-1])) if len(loss) > 1 else 0
        key = (r.config.depth, r.config.width)
        rows.setdefault(key, {})[r.config.recipe.name] = jumps + (r.diverged_at is not None)
    keys = sorted(rows)
    recipes_ = sorted({name for v in rows.values() for name in v})
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(keys)), 3.6))
    w = 0.8 / max(len(recipes_), 1)
    for j, name in enumerate(recipes_):
        ax.bar(np.arange(len(keys)) + j * w, [rows[k].get(name, 0) for k in keys], w, color=color(name), label=name)
    ax.set_xticks(np.arange(len(keys)) + 0.4 - w / 2)
    ax.set_xticklabels([f"depth {d}\nwidth {wd}" for d, wd in keys], fontsize=8)
    ax.set_ylabel("spikes (>10× jump) + divergence")
    ax.legend(fontsize=7)
    ax.set_title("Instability versus depth and width")
    fig.tight_layout()
    return fig
