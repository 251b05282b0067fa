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

__all__ = ["color", "sawtooth", "ln_collapse", "loss_grid", "lr_sweep", "lr_summary", "ablations", "gradient_bias",
           "ln_clamping", "mitigations", "interventions", "spikes_vs_shape", "sgd_momentum", "init_ablation", "ln_gains",
           "beyond", "paper_metric"]

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
# training figures: inputs are Runs (``proxy.train`` results, ``Sweep.runs``,
# the lists of ``proxy.paper``)

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


def _trend(ax, x, y, col, label=None, ls="-", window: int = 5):
    """Raw diagnostic points (thin, faint) and their rolling median (solid)."""
    if not len(x):
        return
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
    from proxy.paper import instability

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


def loss_grid(runs, panel_by="lr", color_by="recipe", column: str = "loss", smooth: int | None = None,
              title: str | None = None, logy: bool = True, ncols: int = 3, ymax: float | None = 10.0):
    """Curves of ``column`` over steps: one panel per value of ``panel_by``
    (a Config field, or a function of a run), one line per ``color_by``.
    A dotted vertical line marks each run's divergence step; the legend names
    any divergence or 10× blow-up (see :func:`proxy.paper.instability`).
    ``smooth``: moving-average window in steps (``None``: ~1/150 of the run);
    ``ymax``: top of a log axis (blow-ups run off it; ``None``: automatic)."""
    runs = list(runs)
    smooth = _auto_smooth(runs, smooth)
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
            _plot_smoothed(ax, x, y, smooth, color=col, lw=1.1, label=_run_label(r, color_by))
            _mark_divergence(ax, r, col or "k")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step")
        if logy:
            ax.set_yscale("log")
        ax.legend(fontsize=7)
    ylabel = column.replace("_", " ") + (f" ({smooth}-step mean)" if smooth > 1 else "")
    if logy and ymax is not None:  # blow-ups run off the top rather than squash the plateaus
        lo, hi = axes[0, 0].get_ylim()
        axes[0, 0].set_ylim(lo, min(hi, ymax))
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def lr_sweep(runs, column: str = "loss", smooth: int | None = None):
    """Paper Fig. 2: FP32 vs MX formats across learning rates (panel per LR)."""
    return loss_grid(runs, panel_by=lambda r: f"learning rate {r.config.lr:g}", color_by="recipe", column=column,
                     smooth=smooth, title="Full vs low precision across learning rates (Adam)")


def lr_summary(runs):
    """Final loss (before any divergence) versus learning rate per recipe; a
    cross marks a run that diverged, an open circle one whose loss blew up
    10× above its recent minimum (:func:`proxy.paper.instability`)."""
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
    ax.set_title("Final loss versus learning rate")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def ablations(runs, column: str = "loss", smooth: int | None = None):
    """Paper Fig. 3: activation functions and LayerNorm on/off (panel per
    (activation, norm)), full vs low precision."""
    return loss_grid(runs, panel_by=lambda r: f"{r.config.act}, {'LayerNorm' if r.config.norm != 'none' else 'no norm'}",
                     color_by="recipe", column=column, smooth=smooth, title="Activation and LayerNorm ablations")


def _ref_label(r, lr=None) -> str:
    lab = r.config.recipe.name + (" vs paired FP32 run" if r.config.gradient_reference == "paired_run"
                                  else " vs FP32 at same weights")
    if lr is not None and r.config.lr != lr:
        lab += f", LR {r.config.lr:g}"
        b = _blowup(r)
        if r.diverged_at is not None or b["blowup_at"] is not None:
            lab += f" (blow-up @ {r.diverged_at if r.diverged_at is not None else b['blowup_at']})"
    return lab


def _common_lr(runs):
    lrs = [r.config.lr for r in runs]
    return max(set(lrs), key=lrs.count) if lrs else None


def gradient_bias(runs, labels=None):
    """Paper Fig. 4: loss, gradient norm, the ‖ζ‖ bound (dashed line at 2) and
    cos(g̃, g) over training. Solid: the reference gradient is FP32 at the same
    weights and batch; dashed: the gradient of the separate FP32 run (the
    paper's definition); dotted: a run at another learning rate. Faint lines
    are the raw diagnostics, solid ones their rolling median."""
    runs = list(runs)
    lr0 = _common_lr(runs)
    labels = labels or [_ref_label(r, lr0) for r in runs]
    smooth = _auto_smooth(runs, None)
    fig, axes = plt.subplots(2, 2, figsize=(10.4, 6.6))
    for r, lab in zip(runs, labels):
        c = color(r.config.recipe.name)
        ls = "--" if r.config.gradient_reference == "paired_run" else (":" if r.config.lr != lr0 else "-")
        for ax, col in ((axes[0, 0], "loss"), (axes[0, 1], "grad_norm")):
            x, y = _series(r, col)
            _plot_smoothed(ax, x, y, smooth, color=c, ls=ls, lw=1.1, label=lab)
            _mark_divergence(ax, r, c)
        for ax, col in ((axes[1, 0], "zeta_bound"), (axes[1, 1], "cosine")):
            x, y = _series(r, col)
            _trend(ax, x, y, c, lab, ls)
            _mark_divergence(ax, r, c)
    axes[1, 0].axhline(2.0, color="k", ls="--", lw=1)
    axes[1, 0].text(0.01, 2.0, " divergence expected near 2", transform=axes[1, 0].get_yaxis_transform(),
                    va="bottom", fontsize=7)
    axes[1, 0].set_ylim(0, max(2.3, axes[1, 0].get_ylim()[1]))
    for ax, ylabel, logy in ((axes[0, 0], "training loss", True), (axes[0, 1], "gradient norm ‖g̃‖", True),
                             (axes[1, 0], "‖ζ‖ bound = ‖g̃ − g‖ / ‖g‖", False),
                             (axes[1, 1], "cos(g̃, g)", False)):
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        if logy:
            ax.set_yscale("log")
    axes[1, 0].legend(fontsize=7, loc="upper right")
    fig.suptitle("Gradient bias of low-precision training (g̃ low precision, g full precision)")
    fig.tight_layout()
    return fig


def _reference_name(r) -> str:
    c = r.config
    lab = f"{c.recipe.name} vs {c.reference_recipe.name}"
    if c.reference_seed is not None and c.reference_seed != c.seed:
        lab += f" (seed {c.reference_seed})"
    if c.reference_data_seed is not None and c.reference_data_seed != c.data_seed:
        lab += f" (data seed {c.reference_data_seed})"
    return lab


def paper_metric(runs, controls=(), title: str | None = None):
    """Paper Fig. 4 with its controls. ``runs``: low-precision runs trained
    with their FP32 run alongside (``paired_run=True``); ``controls``: runs
    whose paired reference differs by construction (FP32 against FP32 with
    another seed, bf16 against FP32).

    Top left: loss of each run (solid) and of its paired FP32 run (dashed,
    black). Top right: the paper's ζ, ‖g̃ − g_ref‖² / ‖g_ref‖² against the
    paired run (dashed line at 2: what two decorrelated gradients of equal
    norm give). Bottom left: the same-point ‖ζ‖ bound, ‖g̃ − g‖ / ‖g‖ with g
    the FP32 gradient at the same weights and batch (the quantization error
    alone). Bottom right: the two cosines (dashed: against the paired run)."""
    runs, controls = list(runs), list(controls)
    smooth = _auto_smooth(runs + controls, None)
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    a_loss, a_paper, a_same, a_cos = axes.flat
    ref_drawn = set()
    for r in runs + controls:
        is_control = r in controls
        c = "0.55" if is_control and r.config.recipe.is_full_precision else color(r.config.recipe.name)
        ls = ":" if is_control else "-"
        name = _reference_name(r) if is_control else r.config.recipe.name
        x, y = _series(r, "loss")
        _plot_smoothed(a_loss, x, y, smooth, color=c, ls=ls, lw=1.1, label=_run_label(r, lambda _: name))
        _mark_divergence(a_loss, r, c)
        key = (r.config.width, r.config.reference_recipe.name, r.config.reference_seed, r.config.reference_data_seed)
        if not is_control and key not in ref_drawn:
            ref_drawn.add(key)
            x, y = _series(r, "ref_loss")
            _plot_smoothed(a_loss, x, y, smooth, color="k", ls="--", lw=1.0,
                           label=f"paired {r.config.reference_recipe.name} run")
        x, y = _series(r, "zeta_paper")
        _trend(a_paper, x, y, c, name, ls if is_control else "-")
        if not is_control:
            x, y = _series(r, "zeta_bound")
            _trend(a_same, x, y, c, name)
            x, y = _series(r, "cosine")
            _trend(a_cos, x, y, c, f"{name}: same point")
        x, y = _series(r, "cosine_paper")
        _trend(a_cos, x, y, c, f"{name}: vs paired run", "--" if not is_control else ":")
    a_loss.set_yscale("log")
    a_loss.set_ylabel("training loss" + (f" ({smooth}-step mean)" if smooth > 1 else ""))
    a_paper.axhline(2.0, color="k", ls="--", lw=1)
    a_paper.text(0.01, 2.0, " 2 = two uncorrelated gradients of equal norm", transform=a_paper.get_yaxis_transform(),
                 va="bottom", fontsize=7)
    a_paper.set_ylim(0, max(2.4, a_paper.get_ylim()[1]))
    a_paper.set_ylabel("paper's ζ = ‖g̃ − g_ref‖² / ‖g_ref‖²")
    _zeta_axis(a_same, "same-point ‖ζ‖ bound = ‖g̃ − g‖ / ‖g‖")
    a_cos.set_ylabel("cosine")
    for ax in axes.flat:
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    fig.suptitle(title or "The paper's ζ against its paired FP32 run, the same-point bound, and the controls")
    fig.tight_layout()
    return fig


def ln_clamping(runs, labels=None):
    """Paper Fig. 5 (right) and the LN-affine ablation: loss, the fraction of
    LN gains the weight spec clamps (overall thick, per block thin; for
    unquantized gains it is counted as a diagnostic), and the ‖ζ‖ bound."""
    runs = list(runs)
    labels = labels or [r.config.recipe.name for r in runs]
    smooth = _auto_smooth(runs, None)
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(14, 3.8))
    for r, lab in zip(runs, labels):
        c = color(r.config.recipe.name)
        x, y = _series(r, "loss")
        _plot_smoothed(a1, x, y, smooth, color=c, lw=1, label=lab)
        _mark_divergence(a1, r, c)
        x, y = _series(r, "ln_clamp_frac")
        a2.plot(x, 100 * y, color=c, lw=1.4, label=f"{lab}: all blocks")
        blocks = sorted(k for k in r.metrics.columns if k.startswith("ln_clamp_frac/block_"))
        for k in blocks:
            xb, yb = _series(r, k)
            a2.plot(xb, 100 * yb, color=c, lw=0.6, alpha=0.5)
        _mark_divergence(a2, r, c)
        x, y = _series(r, "zeta_bound")
        if len(y) and np.any(y > 0):
            _trend(a3, x, y, c, lab)
    a1.set_yscale("log")
    a1.set_ylabel("training loss" + (f" ({smooth}-step mean)" if smooth > 1 else ""))
    a2.set_ylabel("LN gains clamped [%] (thin: per block)")
    _zeta_axis(a3)
    for ax in (a1, a2, a3):
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    fig.suptitle("LayerNorm gains in the clamped region of the MX weight format")
    fig.tight_layout()
    return fig


def ln_gains(run, fmt: str | None = None):
    """Mean LN gain of every block over training, with the bands of gain
    values whose blocks the floor scale clamps: a block whose largest gain
    lies in [0.875, 1) · 2^k (E4M3: max normal 448 = 0.875 · 512) has every
    value above 0.875 · 2^k saturated."""
    from proxy.quantize import MXSpec

    spec = MXSpec(fmt) if fmt else (run.config.recipe.weight_spec or MXSpec(run.config.diagnostic_format))
    f = spec.element
    lo = f.max_normal / 2.0 ** (f.emax + 1)
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    blocks = sorted(k for k in run.metrics.columns if k.startswith("ln_gain_mean/block_"))
    cmap = plt.get_cmap("viridis")
    ys = []
    for i, k in enumerate(blocks):
        x, y = _series(run, k)
        ys.append(y)
        ax.plot(x, y, color=cmap(i / max(1, len(blocks) - 1)), lw=1.2, label=f"block {i}")
    top = max((float(np.max(y)) for y in ys if len(y)), default=1.0)
    bottom = min((float(np.min(y)) for y in ys if len(y)), default=0.5)
    for kexp in range(int(np.floor(np.log2(max(bottom, 1e-3)))) - 1, int(np.ceil(np.log2(max(top, 1e-3)))) + 1):
        ax.axhspan(lo * 2.0 ** kexp, 2.0 ** kexp, color=color("mxfp8_e4m3"), alpha=0.12, lw=0)
    ax.set_ylim(max(0.0, bottom - 0.05), top + 0.05)
    ax.set_xlabel("step")
    ax.set_ylabel("mean LN gain per block")
    ax.set_title(f"{run.config.recipe.name}: LN gains; shaded: {spec.element.name} clamp bands "
                 f"[{lo:g}, 1)·2^k", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def mitigations(runs, smooth: int | None = None):
    """Paper Fig. 6: forward-only quantization and bf16 activations against
    the plain MX recipe and FP32: loss, ‖ζ‖ bound (dashed line at 2) and cosine."""
    runs = list(runs)
    smooth = _auto_smooth(runs, smooth)
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(14, 3.8))
    for r in runs:
        c = color(r.config.recipe.name)
        name = r.config.recipe.name
        x, y = _series(r, "loss")
        _plot_smoothed(a1, x, y, smooth, color=c, lw=1.1, label=_run_label(r, "recipe"))
        _mark_divergence(a1, r, c)
        if not r.config.recipe.is_full_precision:
            for ax, col in ((a2, "zeta_bound"), (a3, "cosine")):
                x, y = _series(r, col)
                _trend(ax, x, y, c, name)
    a1.set_yscale("log")
    a1.set_ylabel("training loss" + (f" ({smooth}-step mean)" if smooth > 1 else ""))
    _zeta_axis(a2)
    a3.set_ylabel("cos(g̃, g)")
    for ax in (a1, a2, a3):
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    fig.suptitle("Mitigations: forward-only quantization, bf16 activations")
    fig.tight_layout()
    return fig


def _intervention(run):
    iv = run.info.get("intervention") if isinstance(run.info, dict) else None
    if not iv:
        return None, run.config.recipe.name
    return iv.get("at_step"), "+".join(iv.get("apply") or []) or run.config.recipe.name


def interventions(parent, children, labels=None, smooth: int | None = None):
    """Paper Fig. 7: a run and its in-situ interventions, resumed from its
    checkpoints with a changed recipe on the same batches. One column per
    intervention step (early, late); top: loss (zoomed on the steps after the
    intervention), bottom: ‖ζ‖ bound. A grey line marks the step; children
    are drawn from it on."""
    children = list(children)
    info = [_intervention(c) for c in children]
    labels = labels or [name for _, name in info]
    steps = sorted({at for at, _ in info if at is not None})
    smooth = _auto_smooth([parent], smooth)
    ncol = max(1, len(steps))
    fig, axes = plt.subplots(2, ncol, figsize=(5.6 * ncol, 6.4), squeeze=False, sharex=True)
    pc = color(parent.config.recipe.name)
    for j, at in enumerate(steps or [None]):
        a_loss, a_zeta = axes[0, j], axes[1, j]
        x, y = _series(parent, "loss")
        _plot_smoothed(a_loss, x, y, smooth, color=pc, lw=1.6, label=f"{parent.config.recipe.name} (no change)")
        _mark_divergence(a_loss, parent, pc)
        x, y = _series(parent, "zeta_bound")
        _trend(a_zeta, x, y, pc, f"{parent.config.recipe.name} (no change)")
        after = [y[x >= (at or 0)] for x, y in [_series(parent, "loss")]]
        for c, (cat, _), lab in zip(children, info, labels):
            if cat != at:
                continue
            col = color(lab)
            x, y = _series(c, "loss")
            keep = x >= (at or 0) - smooth
            after.append(y[x >= (at or 0)])
            xz, yz = _series(c, "zeta_bound")
            zkeep = xz >= (at or 0)
            zero = not np.any(yz[zkeep] > 0)
            _plot_smoothed(a_loss, x[keep], y[keep], smooth, color=col, lw=1,
                           label=lab + (" (‖ζ‖ = 0 after)" if zero else ""))
            _mark_divergence(a_loss, c, col)
            if not zero:
                _trend(a_zeta, xz[zkeep], yz[zkeep], col, lab)
        finite = np.concatenate([_smooth(a, smooth) for a in after if len(a)] or [np.array([])])
        finite = finite[np.isfinite(finite)]
        if len(finite) and at is not None:  # zoom on the steps after the intervention
            lo, hi = float(finite.min()), float(finite.max())
            a_loss.set_ylim(lo / 1.15, hi * 1.15)
        for ax in (a_loss, a_zeta):
            if at is not None:
                ax.axvline(at, color="0.6", lw=1)
        a_loss.set_title(f"intervention at step {at}" if at is not None else "interventions", fontsize=10)
        a_loss.set_yscale("log")
        a_loss.set_ylabel("training loss" + (f" ({smooth}-step mean)" if smooth > 1 else ""))
        _zeta_axis(a_zeta)
        a_zeta.set_xlabel("step")
        a_loss.legend(fontsize=7)
    fig.suptitle("In-situ interventions, early and late")
    fig.tight_layout()
    return fig


def spikes_vs_shape(runs):
    """Paper Fig. 9: instability versus model depth and width. Left: spikes
    per run (separate excursions of the loss 10× above its recent minimum,
    plus a divergence; :func:`proxy.paper.instability`); middle: the largest
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
        ax.legend(fontsize=7)
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
    fig.suptitle("Instability versus depth and width")
    fig.tight_layout()
    return fig


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


_SEED_COLORS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02")


def _system_style(system: str) -> dict:
    """Bar style of a notebook-09 system: the colour of its recipe; nGPT
    systems hatched ``//``, GNMR ones ``..``."""
    from proxy.beyond import SYSTEMS

    changes = SYSTEMS.get(system, {})
    style = {"color": color(str(changes.get("recipe", system))), "edgecolor": "0.25", "lw": 0.6}
    if changes.get("arch") == "ngpt":
        style["hatch"] = "//"
    elif changes.get("controller") is not None:
        style["hatch"] = ".."
    return style


def beyond(runs_or_table, *, stress_label: str | None = None, title: str | None = None):
    """Notebook 09: seed 003's systems against plain MX and the paper's
    mitigations (:mod:`proxy.beyond`).

    Left, base setting: final loss relative to the FP32 run of the same
    architecture (same seed; nGPT in FP32 for the nGPT systems, hatched
    ``//`` and annotated with their ratio to the resmlp FP32 run; GNMR
    systems ``..``), one bar per system on a log axis; each bar says the
    fraction of GEMM work that ran in low precision where it is below 100 %
    or a controller ran (its cost). Right, stress setting: per system and
    seed the step the run diverged (×), or ○ at the end where it stayed
    stable (△: a 10× blow-up the engine did not stop on); dashed lines: the
    FP32 run's divergence step on each seed.

    ``runs_or_table``: the mapping of :func:`proxy.beyond.runs` or the frame
    of :func:`proxy.beyond.table`; ``stress_label`` names the stress setting
    in the right panel's title."""
    import pandas as pd

    from proxy import beyond as _beyond

    df = runs_or_table if isinstance(runs_or_table, pd.DataFrame) else _beyond.table(runs_or_table)
    order = [s for s in _beyond.SYSTEMS if s in set(df["system"])]
    ypos = {s: i for i, s in enumerate(order)}
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(14, 1.2 + 0.42 * max(len(order), 4)), sharey=True)

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
        from matplotlib import ticker

        a1.xaxis.set_major_locator(ticker.MaxNLocator(6))
        a1.xaxis.set_minor_locator(ticker.NullLocator())
        a1.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        for s in order:
            if s not in base.index:
                continue
            row = base.loc[s]
            v = row["vs_own_fp32"]
            notes = []
            if np.isfinite(v):
                notes.append(f"×{v:.3f}")
            elif pd.notna(row["diverged_at"]):
                notes.append(f"diverged @ {int(row['diverged_at'])}")
            if _beyond.SYSTEMS[s].get("arch") == "ngpt" and np.isfinite(row["vs_fp32"]):
                notes.append(f"(×{row['vs_fp32']:.2g} of resmlp FP32)")
            lp = row["low_precision_frac"]
            is_ctrl = _beyond.SYSTEMS[s].get("controller") is not None
            if is_ctrl or 0 < lp < 1 or (lp == 0 and s != "fp32" and "fp32" not in s):
                notes.append(f"LP GEMMs {100 * lp:.1f}%" + (f", {int(row['promotions'])} promotions" if is_ctrl
                                                            else ""))
            x = max(v, 1.0) if np.isfinite(v) else 1.0
            a1.text(x * 1.003, ypos[s], " " + "  ".join(notes), va="center", fontsize=7)
        a1.axvline(1.0, color=color("fp32"), lw=1)
        a1.set_title(f"base setting (seed {seed0}): final loss / FP32's of the same architecture", fontsize=10)
    else:
        a1.text(0.5, 0.5, "no base runs", transform=a1.transAxes, ha="center", va="center", color="0.4")
    a1.set_xlabel("final training loss / FP32's (log; nGPT systems: / nGPT in FP32)")

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
    a1.set_yticks(range(len(order)))
    a1.set_yticklabels(order, fontsize=8)
    a1.set_ylim(len(order) - 0.5, -0.5)
    for ax in (a1, a2):
        ax.grid(axis="x", color="0.9", lw=0.6)
        ax.set_axisbelow(True)
    fig.suptitle(title or "Beyond the paper: 2-D blocks + SR, NVFP4, nGPT and GNMR against the paper's mitigations")
    fig.tight_layout()
    return fig
