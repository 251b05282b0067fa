"""Gradient bias and its mechanism: Figs. 4-7 (the ‖ζ‖ bounds, LN clamping, mitigations, interventions)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from mx_proxy.experiments import analysis
from mx_proxy.numerics.quantize import MXSpec
from mx_proxy.viz.plots.style import (
    _auto_smooth,
    _blowup,
    _mark_divergence,
    _plot_smoothed,
    _run_label,
    _series,
    _smooth,
    _trend,
    _zeta_axis,
    color,
    finish,
)


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
    axes[1, 0].text(0.99, 2.0, "divergence expected near 2 ", transform=axes[1, 0].get_yaxis_transform(),
                    ha="right", va="bottom", fontsize=7)
    axes[1, 0].set_ylim(0, max(2.3, axes[1, 0].get_ylim()[1]))
    for ax, ylabel, logy in ((axes[0, 0], "training loss", True), (axes[0, 1], "gradient norm ‖g̃‖", True),
                             (axes[1, 0], "‖ζ‖ bound = ‖g̃ − g‖ / ‖g‖", False),
                             (axes[1, 1], "cos(g̃, g)", False)):
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        if logy:
            ax.set_yscale("log")
    return finish(fig, "Gradient bias of low-precision training (g̃ low precision, g full precision)",
                  legend_axes=[axes[1, 0]], ncol=2)


def reference_name(r) -> str:
    c = r.config
    lab = f"{c.recipe.name} vs {c.reference_recipe.name}"
    if c.reference_seed is not None and c.reference_seed != c.seed:
        lab += f" (seed {c.reference_seed})"
    if c.reference_data_seed is not None and c.reference_data_seed != c.data_seed:
        lab += f" (data seed {c.reference_data_seed})"
    return lab


# the controls of paper_metric, in order: each its own colour and dash pattern (none a recipe colour of Fig. 4's
# MX runs), so that FP32 against FP32 with another seed and with other batches are told apart
CONTROL_STYLES = (("#009E73", (0, (1, 1.5))), ("#CC79A7", (0, (6, 2))), ("#E69F00", (0, (6, 2, 1, 2))),
                  ("#56B4E9", (0, (3, 1, 1, 1, 1, 1))), ("0.45", (0, (1, 3))))


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
    alone). Bottom right: the two cosines (dashed: against the paired run).
    Each control has a colour and dash pattern of its own (:data:`CONTROL_STYLES`)."""
    runs, controls = list(runs), list(controls)
    smooth = _auto_smooth(runs + controls, None)
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    a_loss, a_paper, a_same, a_cos = axes.flat
    ref_drawn = set()
    for r in runs + controls:
        is_control = r in controls
        c, ls = CONTROL_STYLES[controls.index(r) % len(CONTROL_STYLES)] if is_control else \
            (color(r.config.recipe.name), "-")
        name = reference_name(r) if is_control else r.config.recipe.name
        x, y = _series(r, "loss")
        _plot_smoothed(a_loss, x, y, smooth, color=c, ls=ls, lw=1.1, label=_run_label(r, lambda _, name=name: name))
        _mark_divergence(a_loss, r, c)
        key = (r.config.width, r.config.reference_recipe.name, r.config.reference_seed, r.config.reference_data_seed)
        if not is_control and key not in ref_drawn:
            ref_drawn.add(key)
            x, y = _series(r, "ref_loss")
            _plot_smoothed(a_loss, x, y, smooth, color="k", ls="--", lw=1.0,
                           label=f"paired {r.config.reference_recipe.name} run")
        x, y = _series(r, "zeta_paper")
        _trend(a_paper, x, y, c, name, ls)
        if not is_control:
            x, y = _series(r, "zeta_bound")
            _trend(a_same, x, y, c, name)
            x, y = _series(r, "cosine")
            _trend(a_cos, x, y, c)
        x, y = _series(r, "cosine_paper")
        _trend(a_cos, x, y, c, None, "--" if not is_control else ls)
    a_loss.set_yscale("log")
    a_loss.set_ylabel("training loss" + (f" ({smooth}-step mean)" if smooth > 1 else ""))
    a_paper.axhline(2.0, color="k", ls="--", lw=1)
    a_paper.text(0.99, 2.0, "2 = two uncorrelated gradients of equal norm ", transform=a_paper.get_yaxis_transform(),
                 ha="right", va="bottom", fontsize=7, bbox=dict(fc="white", ec="none", alpha=0.8, pad=1))
    a_paper.set_yscale("log")  # decorrelated steps reach 10-100: a log axis keeps 2 and the medians readable
    a_paper.set_ylabel("paper's ζ = ‖g̃ − g_ref‖² / ‖g_ref‖²")
    _zeta_axis(a_same, "same-point ‖ζ‖ bound = ‖g̃ − g‖ / ‖g‖")
    a_cos.set_ylabel("cosine")
    for ax in axes.flat:
        ax.set_xlabel("step")
    a_cos.plot([], [], "-", color="0.3", label="cosine: solid, at the same point; dashed (a control's own "
                                               "pattern), vs the paired run")
    return finish(fig, title or "The paper's ζ against its paired FP32 run, the same-point bound, and the controls",
                  legend_axes=[a_loss, a_cos], ncol=3)


def ln_clamping(runs, labels=None, title: str | None = None):
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
        a2.plot(x, 100 * y, color=c, lw=1.4)
        blocks = sorted(k for k in r.metrics.columns if k.startswith("ln_clamp_frac/block_"))
        for k in blocks:
            xb, yb = _series(r, k)
            a2.plot(xb, 100 * yb, color=c, lw=0.6, alpha=0.5)
        _mark_divergence(a2, r, c)
        x, y = _series(r, "zeta_bound")
        if len(y) and np.any(y > 0):
            _trend(a3, x, y, c)
    a1.set_yscale("log")
    a1.set_ylabel("training loss" + (f" ({smooth}-step mean)" if smooth > 1 else ""))
    a2.set_ylabel("LN gains clamped [%]\n(thick: all blocks, thin: per block)")
    _zeta_axis(a3)
    for ax in (a1, a2, a3):
        ax.set_xlabel("step")
    return finish(fig, title or "LayerNorm gains in the clamped region of the MX weight format", legend_axes=[a1])


def ln_gains(run, fmt: str | None = None):
    """Mean LN gain of every block over training, with the bands of gain
    values whose blocks the floor scale clamps: a block whose largest gain
    lies in [0.875, 1) · 2^k (E4M3: max normal 448 = 0.875 · 512) has every
    value above 0.875 · 2^k saturated."""
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
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)  # beside: over no curve
    fig.tight_layout()
    return fig


def mitigations(runs, smooth: int | None = None):
    """Paper Fig. 6: forward-only quantization and bf16 activations against
    the plain MX recipe and FP32: the loss relative to the FP32 run (every
    curve's loss nearly coincides on a log axis: the difference is the
    information), the ‖ζ‖ bound (dashed line at 2) and the cosine."""
    runs = list(runs)
    smooth = _auto_smooth(runs, smooth)
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(14, 3.8))
    ref = next((r for r in runs if r.config.recipe.name == "fp32"), None)
    rx, ry = _series(ref, "loss") if ref is not None else (np.array([]), np.array([]))
    ry = _smooth(ry, smooth)
    rx = rx[len(rx) - len(ry):]
    for r in runs:
        c = color(r.config.recipe.name)
        x, y = _series(r, "loss")
        if ref is None:
            _plot_smoothed(a1, x, y, smooth, color=c, lw=1.1, label=_run_label(r, "recipe"))
        elif r is not ref:
            ys = _smooth(y, smooth)
            xs = x[len(x) - len(ys):]
            n = min(len(xs), len(rx))
            a1.plot(xs[:n], 100 * (ys[:n] / ry[:n] - 1), color=c, lw=1.1, label=_run_label(r, "recipe"))
        else:
            a1.plot([], [], color=c, lw=1.1, label=_run_label(r, "recipe") + " (the reference: 0)")
        _mark_divergence(a1, r, c)
        if not r.config.recipe.is_full_precision:
            for ax, col in ((a2, "zeta_bound"), (a3, "cosine")):
                x, y = _series(r, col)
                _trend(ax, x, y, c)
    if ref is None:
        a1.set_yscale("log")
        a1.set_ylabel("training loss" + (f" ({smooth}-step mean)" if smooth > 1 else ""))
    else:
        a1.axhline(0.0, color="k", lw=0.8)
        a1.set_ylabel("loss relative to FP32 [%]" + (f"\n({smooth}-step means)" if smooth > 1 else ""))
    _zeta_axis(a2)
    a3.set_ylabel("cos(g̃, g)")
    for ax in (a1, a2, a3):
        ax.set_xlabel("step")
    return finish(fig, "Mitigations: forward-only quantization, bf16 activations", legend_axes=[a1], ncol=4)


def _intervention(run):
    iv = run.info.get("intervention") if isinstance(run.info, dict) else None
    if not iv:
        return None, run.config.recipe.name
    return iv.get("at_step"), "+".join(iv.get("apply") or []) or run.config.recipe.name


def interventions(parent, children, labels=None, smooth: int | None = None, title: str | None = None):
    """Paper Fig. 7: a run and its in-situ interventions, resumed from its
    checkpoints with a changed recipe on the same batches. One column per
    intervention step (early, late); top: each child's training loss
    relative to the unchanged parent's on the same steps (in %, smoothed;
    the parent is the 0 line: on a log axis every curve coincides, the
    difference is the information; where the parent blows up after the step,
    :func:`~mx_proxy.experiments.analysis.unstable_after`, the losses
    themselves on a log axis, unsmoothed, so every blow-up shows), bottom: the ‖ζ‖ bound of the parent and of
    each child after the step (a grey line marks it). One legend, below the
    panels."""
    children = list(children)
    info = [_intervention(c) for c in children]
    labels = labels or [name for _, name in info]
    steps = sorted({at for at, _ in info if at is not None})
    smooth = _auto_smooth([parent], smooth)
    ncol = max(1, len(steps))
    fig, axes = plt.subplots(2, ncol, figsize=(max(9.0, 5.6 * ncol), 6.0), squeeze=False, sharex="col")
    pname = parent.config.recipe.name
    pc = color(pname)
    px, py = _series(parent, "loss")
    pys = _smooth(py, smooth)
    pxs = px[len(px) - len(pys):]
    by_step = dict(zip(pxs.tolist(), pys))
    measures = analysis.instability(parent)
    for j, at in enumerate(steps or [None]):
        a_loss, a_zeta = axes[0, j], axes[1, j]
        # a parent that blows up after the step: relative losses would only say -100 %, so show the losses
        onset = analysis.unstable_after(parent, at, measures) if at is not None else None
        absolute = onset is not None
        if absolute:
            plabel = f"{pname} (no change, blew up at step {onset})"
            keep = px >= at - 300  # unsmoothed: a trailing mean would spread a blow-up over its window
            a_loss.plot(px[keep], py[keep], color=pc, lw=1.6, label=plabel)
            a_loss.set_yscale("log")
            ends = [int(c.metrics["step"].iloc[-1]) for c, (cat, _) in zip(children, info) if cat == at]
            a_loss.set_xlim(at - 300, max(ends + [onset]) + 100)  # the children's horizon
        else:
            plabel = f"{pname} (no change: the 0 line)"
            a_loss.axhline(0.0, color=pc, lw=1.6, label=plabel)
        _mark_divergence(a_loss, parent, pc)
        x, y = _series(parent, "zeta_bound")
        _trend(a_zeta, x, y, pc, plabel)
        used = {pc}
        for c, (cat, _), lab in zip(children, info, labels):
            if cat != at:
                continue
            col = color(lab)
            if col in used:  # two names on one palette colour: take a free one unlike the palette's blues
                col = next((k for k in ("tab:green", "tab:red", "tab:purple", "tab:brown", "tab:olive")
                            if k not in used), col)
            used.add(col)
            x, y = _series(c, "loss")
            keep = x >= (at or 0)
            ys = y[keep] if absolute else _smooth(y[keep], smooth)
            xs = x[keep][len(x[keep]) - len(ys):]
            ref = np.array([by_step.get(int(t), np.nan) for t in xs])
            xz, yz = _series(c, "zeta_bound")
            zkeep = xz >= (at or 0)
            zero = not np.any(yz[zkeep] > 0)
            name = lab + (" (‖ζ‖ = 0 after)" if zero else "")
            a_loss.plot(xs, ys if absolute else 100 * (ys / ref - 1), color=col, lw=1.1, label=name)
            _mark_divergence(a_loss, c, col)
            if not zero:
                _trend(a_zeta, xz[zkeep], yz[zkeep], col, name)
        for ax in (a_loss, a_zeta):
            if at is not None:
                ax.axvline(at, color="0.6", lw=1)
        a_loss.set_title(f"intervention at step {at}" if at is not None else "interventions", fontsize=10)
        a_loss.set_ylabel("training loss (every step)" if absolute else f"loss relative to {pname} [%]"
                          + (f"\n({smooth}-step means)" if smooth > 1 else ""))
        _zeta_axis(a_zeta)
        a_zeta.set_xlabel("step")
    return finish(fig, title or "In-situ interventions, early and late", legend_axes=list(axes.ravel()), ncol=3)
