"""``mx-proxy figures``: regenerate every figure into a folder.

Each entry of :data:`FIGURES` is a function ``(scale) -> Figure``. The
training figures run their experiment through :mod:`mx_proxy.experiments.paper` (the one
place the experiments are defined, shared with the notebooks), which trains
into the run store or loads what is already there, so a second call is fast
and figures that share runs train them once. ``systems`` (notebook 09) runs
the systems (GNMR, 2-D FP4, NVFP4, nGPT) through :mod:`mx_proxy.experiments.systems` the same way.

The ``headline_*`` figures (the paper's Figs. 2, 4, 5 and 7) train nothing:
they read the campaign results committed under ``results/<scale>/`` (see
:mod:`mx_proxy.experiments.campaign`), each from the largest scale whose results hold the
runs it needs, and say in their title which scale that is.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from mx_proxy.experiments import campaign, executors, paper, parallel, systems
from mx_proxy.experiments import scales as _scales
from mx_proxy.experiments.executors.local import MAX_JOBS
from mx_proxy.store import durable
from mx_proxy.viz import plots

__all__ = ["FIGURES", "FIGURE_DOCS", "TRAINED", "HEADLINE", "SCALES", "generate", "headline_source",
           "campaign_figures", "default_dir", "RESULTS_ROOT"]

RESULTS_ROOT = "results"

SCALES = _scales.names()


def _interventions(scale, store=None, progress: bool = True, **_):
    parent, children = paper.intervention_runs(scale, store=store, progress=progress)
    return plots.interventions(parent, children)


def _systems(scale, store=None, progress: bool = True, **_):
    s = paper.scale(scale)
    stress = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in s.stress.items()
                       if k not in ("diagnostics_every", "val_every"))  # recording only: not part of the stress
    return plots.systems(systems.table(systems.runs(s, store=store, progress=progress)), stress_label=stress or None,
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
    return plots.lr_sweep(grid, title=f"Fig. 2 at the {scale} scale: width {w}, {_describe(grid)}\nFP32 vs the "
                                      f"authors' MX recipes across learning rates")


def _headline_zeta(results):
    scale, runs = results
    w, paired = _largest_width([r for r in runs if r.info["kind"] == "paired"])
    controls = [r for r in runs if r.info["kind"] == "control" and r.config.width == w]
    against = "its controls" if controls else "(no control run at this width)"
    return plots.paper_metric(paired, controls, title=f"Fig. 4 at the {scale} scale: width {w}, {_describe(paired)}, "
                                                      f"LR {paired[0].config.lr:g}\nthe paper's ζ against the "
                                                      f"paired FP32 run, {against}, and the same-point bound")


def _headline_ln_clamping(results):
    scale, runs = results
    w, paired = _largest_width([r for r in runs if r.info["kind"] in ("paired", "control")])
    return plots.ln_clamping(paired, labels=[plots.reference_name(r) if r.info["kind"] == "control"
                                             else r.config.recipe.name for r in paired],
                             title=f"Fig. 5 (right) at the {scale} scale, width {w}: LN gains in the E4M3 clamp band "
                                   f"[0.875, 1)·2^k\n(counted where the recipe does not quantize them)")


def _headline_interventions(results):
    scale, runs = results
    children = [r for r in runs if r.info["kind"] == "intervention"]
    parent_key = children[0].info.get("parent")
    parents = [r for r in runs if r.info["kind"] == "paired" and r.info.get("key") == parent_key]
    return plots.interventions(parents[0], children,
                               title=f"Fig. 7 at the {scale} scale: in-situ interventions on "
                                     f"{parents[0].config.recipe.name}, width {parents[0].config.width}")


# name → (the campaign kinds it needs, figure function of (scale, runs))
HEADLINE: dict[str, tuple[tuple[str, ...], Callable]] = {
    "headline_lr_sweep": (("grid",), _headline_lr_sweep),                       # Fig. 2
    "headline_zeta": (("paired",), _headline_zeta),                             # Fig. 4
    "headline_ln_clamping": (("paired",), _headline_ln_clamping),              # Fig. 5 (right)
    "headline_interventions": (("paired", "intervention"), _headline_interventions),  # Fig. 7
}


def _headline(name):
    kinds, fn = HEADLINE[name]

    def make(scale, *, store=None, results=RESULTS_ROOT, **_):
        found = headline_source(kinds, results)
        if found is None:
            raise ValueError(f"figure {name!r} needs campaign results with {', '.join(kinds)} runs under "
                             f"{results}/<scale>/; run `mx-proxy campaign --scale medium --out DIR` and copy "
                             f"DIR/results to {results}/medium")
        return fn(found)

    return make


def campaign_figures(results, out: str = "figures") -> list[str]:
    """Every headline figure that one campaign's results folder can draw,
    written as PNG into ``out``; returns the paths."""
    runs = campaign.load_results(results)
    scale = Path(results).resolve().parent.name if Path(results).name == "results" else Path(results).name
    out = str(durable.checked_path(out, "figures folder", folder=True))
    os.makedirs(out, exist_ok=True)
    written = []
    for name, (kinds, fn) in HEADLINE.items():
        if all(any(r.info["kind"] == k for r in runs) for k in kinds):
            fig = fn((scale, runs))
            path = os.path.join(out, f"{name}.png")
            durable.write_output(path, lambda p, fig=fig: fig.savefig(p, dpi=120, format="png"))
            plots.plt.close(fig)
            written.append(path)
    return written


# figures of runs trained (or loaded from the store) by an mx_proxy.experiments.paper experiment:
# name → (plot, experiment)
TRAINED: dict[str, tuple[Callable, Callable]] = {
    "lr_sweep": (plots.lr_sweep, paper.lr_sweep_runs),                  # Fig. 2
    "lr_summary": (plots.lr_summary, paper.lr_sweep_runs),              # Fig. 2 (summary)
    "ablations": (plots.ablations, paper.ablation_runs),                # Fig. 3
    "gradient_bias": (plots.gradient_bias, paper.gradient_bias_runs),   # Fig. 4
    "ln_clamping": (plots.ln_clamping, paper.mechanism_runs),           # Fig. 5 right + LN-affine ablation
    "mitigations": (plots.mitigations, paper.mitigation_runs),          # Fig. 6
    "spikes_vs_shape": (plots.spikes_vs_shape, paper.shape_runs),       # Fig. 9
    "sgd_momentum": (plots.sgd_momentum, paper.sgd_runs),               # Fig. 10
    "init_ablation": (plots.init_ablation, paper.init_runs),            # Fig. 11
    "quant_stats": (lambda runs: plots.quant_stats(runs[0]), paper.quant_stats_runs),  # Config.quant_stats
}


def _trained(name):
    plot, experiment = TRAINED[name]
    return lambda scale, store=None, progress=True, **_: plot(experiment(scale, store=store, progress=progress))


def _static(plot):
    return lambda scale, **_: plot("fp8_e4m3")


# name → figure function ``(scale, *, store=None, results="results", progress=True) -> Figure``
FIGURES: dict[str, Callable] = {
    "sawtooth": _static(plots.sawtooth),                                        # Fig. 5 left
    "ln_collapse": _static(plots.ln_collapse),                                  # Section 5
    **{name: _trained(name) for name in ("lr_sweep", "lr_summary", "ablations", "gradient_bias", "ln_clamping",
                                         "mitigations")},
    "interventions": _interventions,                                            # Fig. 7
    **{name: _trained(name) for name in ("spikes_vs_shape", "sgd_momentum", "init_ablation", "quant_stats")},
    "systems": _systems,                                                        # notebook 09: the systems
    **{name: _headline(name) for name in HEADLINE},                             # committed campaign results
}

# one line per figure (``mx-proxy figures --help``)
FIGURE_DOCS = {
    "sawtooth": "Fig. 5 left: E4M3's relative gap per code, shaded: the clamp band [0.875, 1) of each binade",
    "ln_collapse": "LN-like gain clusters c·exp(0.02·N(0,1)) collapsing onto one code, versus c",
    "lr_sweep": "Fig. 2: FP32, MXFP8 E4M3 and MXFP6 E2M3 loss curves, one panel per learning rate",
    "lr_summary": "Fig. 2 summary: final loss versus learning rate per recipe",
    "ablations": "Fig. 3: activation and normalization ablations, FP32 vs MXFP8 E4M3",
    "gradient_bias": "Fig. 4: the zeta bound and cosine of E4M3, E2M3 and FP4 over training",
    "ln_clamping": "Fig. 5 right: LN gains clamped, and exempting only the LN affine parameters",
    "mitigations": "Fig. 6: forward-only quantization and bf16 activations: loss relative to FP32, zeta, cosine",
    "interventions": "Fig. 7: in-situ interventions from an early and a late checkpoint: loss relative to the "
                     "unchanged run, zeta",
    "spikes_vs_shape": "Fig. 9: loss spikes and zeta versus depth and width",
    "sgd_momentum": "Fig. 10: SGD with and without momentum",
    "init_ablation": "Fig. 11: PyTorch-default against lower-gain Xavier init",
    "quant_stats": "MXFP8 E4M3's GEMM operands: underflow, saturation, last bin, scale exponents, SNR (quant_stats)",
    "systems": "notebook 09: 2-D blocks with stochastic rounding, NVFP4, nGPT and GNMR",
    "headline_lr_sweep": "Fig. 2 from the committed campaign results (trains nothing)",
    "headline_zeta": "Fig. 4 from the committed campaign results: the paper's zeta, its control, the same-point bound",
    "headline_ln_clamping": "Fig. 5 right from the committed campaign results",
    "headline_interventions": "Fig. 7 from the committed campaign results",
}


def default_dir(kind: str) -> Path:
    """Where ``mx-proxy figures`` writes by default, outside any checkout:
    ``$XDG_CACHE_HOME/proxy/<kind>`` (else ``~/.cache/proxy/<kind>``), with
    ``kind`` ``runs`` (the run store) or ``figures``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "proxy" / kind


def _prefetch(names, scale, store, jobs, progress, log, executor=None):
    """Train every planned run of ``names`` not yet in ``store`` in parallel
    processes (:mod:`mx_proxy.experiments.parallel`), or on ``executor`` (a
    Slurm executor: one array task per unit)."""
    sweeps = []
    for name in names:
        if name in TRAINED:
            sweeps += paper.planned_sweeps(TRAINED[name][1], scale) or []
    units = parallel.plan_units(sweeps, store)
    if executor is not None and executor.name != "local":
        failures = executor.run(units, store, progress=progress, log=log)
        if failures:
            raise executors.UnitsFailed(failures)
        return
    jobs = jobs or parallel.default_jobs(len(units))
    if jobs > 1 and len(units) > 1:
        wall = parallel.train_all(units, store, jobs=jobs, progress=progress, log=log)
        log(f"trained {sum(len(u.configs) for u in units)} runs in {wall:.0f}s")


def generate(names=None, *, scale: str = "quick", out=None, store=None, results=RESULTS_ROOT,
             pdf: bool = False, log=print, jobs: int | None = None, progress: bool = True,
             executor: executors.Executor | None = None) -> list[str]:
    """Write the named figures (default: all) as PNG (and PDF) into ``out``
    (``None``: :func:`default_dir` ``("figures")``, outside the checkout).
    Training figures train into (or load from) ``store`` (``None``: memory
    only); with a store, the runs of every figure asked for are first trained
    in ``jobs`` parallel processes (``None``: one per core, at most 4; 1: all
    in this process), or on ``executor`` (``executors.make("slurm", ...)``:
    one Slurm array task per compiled program; the figures are then drawn
    here from the store). The ``headline_*`` figures read campaign results
    under ``results``.

    Raises:
      ValueError: for an unknown figure name or scale, or a bad ``jobs``, naming the valid ones.
    """
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; valid: {', '.join(SCALES)}")
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or not 1 <= jobs <= MAX_JOBS):
        raise ValueError(f"jobs must be an integer in [1, {MAX_JOBS}] or None (one per core), got {jobs!r}")
    if names:
        names = list(names)
        unknown = [n for n in names if n not in FIGURES]
        if unknown:
            raise ValueError(f"unknown figure(s) {unknown}; valid: {', '.join(FIGURES)}")
    else:  # everything this checkout can draw: headline figures only where results exist
        names = [n for n in FIGURES if n not in HEADLINE or headline_source(HEADLINE[n][0], results) is not None]
        for n in HEADLINE:
            if n not in names:
                log(f"skipping {n}: no campaign results under {results}/ (see mx-proxy campaign)")
    out = str(durable.checked_path(default_dir("figures") if out is None else out, "figures folder", folder=True))
    os.makedirs(out, exist_ok=True)
    if store is not None and (jobs != 1 or executor is not None):
        _prefetch(names, scale, store, jobs, progress, log, executor)
    written = []
    for i, name in enumerate(names, 1):
        t0 = time.perf_counter()
        source = scale
        if name in HEADLINE:  # drawn from committed results, whatever --scale says
            found = headline_source(HEADLINE[name][0], results)
            source = f"committed {found[0]} results, {Path(results) / found[0]}" if found else "no results"
        log(f"[{i}/{len(names)}] {name} ({source}) ...")
        fig = FIGURES[name](scale, store=store, results=results, progress=progress)
        for ext in ("png", "pdf") if pdf else ("png",):
            path = os.path.join(out, f"{name}.{ext}")
            durable.write_output(path, lambda p, fig=fig, ext=ext: fig.savefig(p, dpi=120, format=ext), elsewhere=(
                f"its runs are in the run store {store}" if store is not None else ""))
            written.append(path)
        plots.plt.close(fig)
        log(f"[{i}/{len(names)}] {name}: {time.perf_counter() - t0:.1f}s -> {os.path.join(out, name)}.png")
    return written
