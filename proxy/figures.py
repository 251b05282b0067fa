"""``proxy figures``: regenerate every figure into a folder.

Each entry of :data:`FIGURES` is a function ``(scale) -> Figure``. The
training figures run their experiment through :mod:`proxy.paper` (the one
place the experiments are defined, shared with the notebooks), which trains
into the run store or loads what is already there, so a second call is fast
and figures that share runs train them once. ``beyond`` (notebook 09) runs
seed 003's systems through :mod:`proxy.beyond` the same way.
"""

from __future__ import annotations

import os
import time
from typing import Callable

from proxy import beyond, paper, plots

__all__ = ["FIGURES", "SCALES", "generate"]

SCALES = ("smoke", "quick", "paper")


def _interventions(scale):
    parent, children = paper.intervention_runs(scale)
    return plots.interventions(parent, children)


def _beyond(scale):
    s = paper.scale(scale)
    stress = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in s.stress.items()
                       if k not in ("diagnostics_every", "val_every"))  # recording only: not part of the stress
    return plots.beyond(beyond.table(beyond.runs(s)), stress_label=stress or None,
                        title=f"Beyond the paper ({s.name} scale): 2-D blocks + SR, NVFP4, nGPT and GNMR against "
                              f"plain MX and the paper's mitigations")


FIGURES: dict[str, Callable] = {
    "sawtooth": lambda scale: plots.sawtooth("fp8_e4m3"),                       # Fig. 5 left
    "ln_collapse": lambda scale: plots.ln_collapse("fp8_e4m3"),                 # Section 5
    "lr_sweep": lambda scale: plots.lr_sweep(paper.lr_sweep_runs(scale)),       # Fig. 2
    "lr_summary": lambda scale: plots.lr_summary(paper.lr_sweep_runs(scale)),   # Fig. 2 (summary)
    "ablations": lambda scale: plots.ablations(paper.ablation_runs(scale)),     # Fig. 3
    "gradient_bias": lambda scale: plots.gradient_bias(paper.gradient_bias_runs(scale)),  # Fig. 4
    "ln_clamping": lambda scale: plots.ln_clamping(paper.mechanism_runs(scale)),  # Fig. 5 right + LN-affine ablation
    "mitigations": lambda scale: plots.mitigations(paper.mitigation_runs(scale)),  # Fig. 6
    "interventions": _interventions,                                            # Fig. 7
    "spikes_vs_shape": lambda scale: plots.spikes_vs_shape(paper.shape_runs(scale)),  # Fig. 9
    "sgd_momentum": lambda scale: plots.sgd_momentum(paper.sgd_runs(scale)),    # Fig. 10
    "init_ablation": lambda scale: plots.init_ablation(paper.init_runs(scale)),  # Fig. 11
    "beyond": _beyond,                                                          # notebook 09: seed 003's systems
}


def generate(names=None, *, scale: str = "quick", out: str = "figures", pdf: bool = False, log=print) -> list[str]:
    """Write the named figures (default: all) as PNG (and PDF) into ``out``.

    Raises:
      ValueError: for an unknown figure name or scale, naming the valid ones.
    """
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; valid: {', '.join(SCALES)}")
    names = list(FIGURES) if not names else list(names)
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        raise ValueError(f"unknown figure(s) {unknown}; valid: {', '.join(FIGURES)}")
    os.makedirs(out, exist_ok=True)
    written = []
    for i, name in enumerate(names, 1):
        t0 = time.perf_counter()
        log(f"[{i}/{len(names)}] {name} ({scale}) ...")
        fig = FIGURES[name](scale)
        for ext in ("png", "pdf") if pdf else ("png",):
            path = os.path.join(out, f"{name}.{ext}")
            fig.savefig(path, dpi=120)
            written.append(path)
        plots.plt.close(fig)
        log(f"[{i}/{len(names)}] {name}: {time.perf_counter() - t0:.1f}s -> {os.path.join(out, name)}.png")
    return written
