"""``proxy figures``: regenerate every figure into a folder.

Each entry of :data:`FIGURES` is a function ``(scale) -> Figure``. The
training figures run their experiment through :mod:`proxy.paper` (the one
place the experiments are defined, shared with the notebooks), which trains
into the run store or loads what is already there, so a second call is fast
and figures that share runs train them once. ``beyond`` (notebook 09) runs
seed 003's systems through :mod:`proxy.beyond` the same way.

The ``headline_*`` figures (the paper's Figs. 2, 4, 5 and 7) train nothing:
they read the campaign results committed under ``results/<scale>/`` (see
:mod:`proxy.campaign`), each from the largest scale whose results hold the
runs it needs, and say in their title which scale that is.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

from proxy import beyond, campaign, paper, plots
from proxy import scales as _scales

__all__ = ["FIGURES", "HEADLINE", "SCALES", "generate", "headline_source", "campaign_figures", "RESULTS_ROOT"]

RESULTS_ROOT = "results"

SCALES = _scales.names()


def _interventions(scale, store=None, **_):
    parent, children = paper.intervention_runs(scale, store=store)
    return plots.interventions(parent, children)


def _beyond(scale, store=None, **_):
    s = paper.scale(scale)
    stress = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in s.stress.items()
                       if k not in ("diagnostics_every", "val_every"))  # recording only: not part of the stress
    return plots.beyond(beyond.table(beyond.runs(s, store=store)), stress_label=stress or None,
                        title=f"Beyond the paper ({s.name} scale): 2-D blocks + SR, NVFP4, nGPT and GNMR against "
                              f"plain MX and the paper's mitigations")


def headline_source(kinds, root=RESULTS_ROOT) -> tuple[str, list] | None:
    """(scale, runs) of the largest scale whose results under ``root``
    (``results/`` by default) hold runs of every one of ``kinds``; ``None``
    when no scale has them."""
    root = Path(root)
    for name in reversed(_scales.names()):  # largest first
        folder = root / name
        if not folder.is_dir():
            continue
        runs = campaign.load_results(folder)
        if all(any(r.info["kind"] == k for r in runs) for k in kinds):
            return name, runs
    return None


def _describe(runs) -> str:
    c = runs[0].config
    return f"depth {c.depth}, batch {c.batch}, Adam, {c.steps} steps"


def _largest_width(runs):
    w = max(r.config.width for r in runs)
    return w, [r for r in runs if r.config.width == w]


def _headline_lr_sweep(results):
    scale, runs = results
    w, grid = _largest_width([r for r in runs if r.info["kind"] == "grid"])
    fig = plots.lr_sweep(grid)
    fig.suptitle(f"Fig. 2 at the {scale} scale: width {w}, {_describe(grid)}\nFP32 vs the authors' MX recipes "
                 f"across learning rates")
    return fig


def _headline_zeta(results):
    scale, runs = results
    w, paired = _largest_width([r for r in runs if r.info["kind"] == "paired"])
    controls = [r for r in runs if r.info["kind"] == "control" and r.config.width == w]
    return plots.paper_metric(paired, controls, title=f"Fig. 4 at the {scale} scale: width {w}, {_describe(paired)}, "
                                                      f"LR {paired[0].config.lr:g}\nthe paper's ζ against the "
                                                      f"paired FP32 run, its controls, and the same-point bound")


def _headline_ln_clamping(results):
    scale, runs = results
    w, paired = _largest_width([r for r in runs if r.info["kind"] in ("paired", "control")])
    fig = plots.ln_clamping(paired, labels=[plots.reference_name(r) if r.info["kind"] == "control"
                                            else r.config.recipe.name for r in paired])
    fig.suptitle(f"Fig. 5 (right) at the {scale} scale, width {w}: LN gains in the E4M3 clamp region\n"
                 f"(counted where the recipe does not quantize them)")
    return fig


def _headline_interventions(results):
    scale, runs = results
    children = [r for r in runs if r.info["kind"] == "intervention"]
    parent_key = children[0].info.get("parent")
    parents = [r for r in runs if r.info["kind"] == "paired" and r.info.get("key") == parent_key]
    fig = plots.interventions(parents[0], children)
    fig.suptitle(f"Fig. 7 at the {scale} scale: in-situ interventions on {parents[0].config.recipe.name}, "
                 f"width {parents[0].config.width}")
    return fig


# name → (the campaign kinds it needs, figure function of (scale, runs))
HEADLINE: dict[str, tuple[tuple[str, ...], Callable]] = {
    "headline_lr_sweep": (("grid",), _headline_lr_sweep),                       # Fig. 2
    "headline_zeta": (("paired",), _headline_zeta),                             # Fig. 4
    "headline_ln_clamping": (("paired",), _headline_ln_clamping),              # Fig. 5 (right)
    "headline_interventions": (("paired", "intervention"), _headline_interventions),  # Fig. 7
}


def _headline(name):
    kinds, fn = HEADLINE[name]

    def make(scale, *, store=None, results=RESULTS_ROOT):
        found = headline_source(kinds, results)
        if found is None:
            raise ValueError(f"figure {name!r} needs campaign results with {', '.join(kinds)} runs under "
                             f"{results}/<scale>/; run `proxy campaign --scale medium --out DIR` and copy "
                             f"DIR/results to {results}/medium")
        return fn(found)

    return make


def campaign_figures(results, out: str = "figures") -> list[str]:
    """Every headline figure that one campaign's results folder can draw,
    written as PNG into ``out``; returns the paths."""
    runs = campaign.load_results(results)
    scale = Path(results).resolve().parent.name if Path(results).name == "results" else Path(results).name
    os.makedirs(out, exist_ok=True)
    written = []
    for name, (kinds, fn) in HEADLINE.items():
        if all(any(r.info["kind"] == k for r in runs) for k in kinds):
            fig = fn((scale, runs))
            path = os.path.join(out, f"{name}.png")
            fig.savefig(path, dpi=120)
            plots.plt.close(fig)
            written.append(path)
    return written


def _trained(plot, experiment):
    """A figure of runs trained (or loaded from the store) by a :mod:`proxy.paper` experiment."""
    return lambda scale, store=None, **_: plot(experiment(scale, store=store))


def _static(plot):
    return lambda scale, **_: plot("fp8_e4m3")


# name → figure function ``(scale, *, store=None, results="results") -> Figure``
FIGURES: dict[str, Callable] = {
    "sawtooth": _static(plots.sawtooth),                                        # Fig. 5 left
    "ln_collapse": _static(plots.ln_collapse),                                  # Section 5
    "lr_sweep": _trained(plots.lr_sweep, paper.lr_sweep_runs),                  # Fig. 2
    "lr_summary": _trained(plots.lr_summary, paper.lr_sweep_runs),              # Fig. 2 (summary)
    "ablations": _trained(plots.ablations, paper.ablation_runs),                # Fig. 3
    "gradient_bias": _trained(plots.gradient_bias, paper.gradient_bias_runs),   # Fig. 4
    "ln_clamping": _trained(plots.ln_clamping, paper.mechanism_runs),           # Fig. 5 right + LN-affine ablation
    "mitigations": _trained(plots.mitigations, paper.mitigation_runs),          # Fig. 6
    "interventions": _interventions,                                            # Fig. 7
    "spikes_vs_shape": _trained(plots.spikes_vs_shape, paper.shape_runs),       # Fig. 9
    "sgd_momentum": _trained(plots.sgd_momentum, paper.sgd_runs),               # Fig. 10
    "init_ablation": _trained(plots.init_ablation, paper.init_runs),            # Fig. 11
    "beyond": _beyond,                                                          # notebook 09: seed 003's systems
    **{name: _headline(name) for name in HEADLINE},                             # committed campaign results
}


def generate(names=None, *, scale: str = "quick", out: str = "figures", store=None, results=RESULTS_ROOT,
             pdf: bool = False, log=print) -> list[str]:
    """Write the named figures (default: all) as PNG (and PDF) into ``out``.
    Training figures train into (or load from) ``store`` (``None``: memory
    only); the ``headline_*`` figures read campaign results under ``results``.

    Raises:
      ValueError: for an unknown figure name or scale, naming the valid ones.
    """
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; valid: {', '.join(SCALES)}")
    if names:
        names = list(names)
        unknown = [n for n in names if n not in FIGURES]
        if unknown:
            raise ValueError(f"unknown figure(s) {unknown}; valid: {', '.join(FIGURES)}")
    else:  # everything this checkout can draw: headline figures only where results exist
        names = [n for n in FIGURES if n not in HEADLINE or headline_source(HEADLINE[n][0], results) is not None]
        for n in HEADLINE:
            if n not in names:
                log(f"skipping {n}: no campaign results under {results}/ (see proxy campaign)")
    os.makedirs(out, exist_ok=True)
    written = []
    for i, name in enumerate(names, 1):
        t0 = time.perf_counter()
        log(f"[{i}/{len(names)}] {name} ({scale}) ...")
        fig = FIGURES[name](scale, store=store, results=results)
        for ext in ("png", "pdf") if pdf else ("png",):
            path = os.path.join(out, f"{name}.{ext}")
            fig.savefig(path, dpi=120)
            written.append(path)
        plots.plt.close(fig)
        log(f"[{i}/{len(names)}] {name}: {time.perf_counter() - t0:.1f}s -> {os.path.join(out, name)}.png")
    return written
