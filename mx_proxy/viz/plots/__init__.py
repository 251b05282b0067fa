"""One function per figure: results in, a labelled matplotlib Figure out.

Colours are fixed per recipe (:func:`color`) so every figure reads alike.
The figures sit by subject: the number formats (:mod:`.formats`), loss
curves (:mod:`.training`), gradient bias and its mechanism
(:mod:`.gradients`), the GEMM operands' quantization statistics (:mod:`.quantization`), the systems:
GNMR, 2-D FP4, NVFP4, nGPT (:mod:`.systems`), ensembles' rates,
survival, members' losses and the warning signals before their blow-ups (:mod:`.ensemble`), the plan's
registered comparisons (:mod:`.plan`).

This package never chooses a matplotlib backend: in Jupyter the kernel's
inline backend shows each figure; headless entry points (the ``mx-proxy``
command, the tests) select Agg themselves.
"""

import matplotlib.pyplot as plt

from mx_proxy.viz.plots.ensemble import blowup_rates, cell_rates, signals_before, survival, trajectories
from mx_proxy.viz.plots.formats import ln_collapse, sawtooth
from mx_proxy.viz.plots.gradients import (
    gradient_bias,
    interventions,
    ln_clamping,
    ln_gains,
    mitigations,
    paper_metric,
    reference_name,
)
from mx_proxy.viz.plots.plan import plan_effects
from mx_proxy.viz.plots.quantization import quant_stats
from mx_proxy.viz.plots.style import color, norm_label
from mx_proxy.viz.plots.systems import systems
from mx_proxy.viz.plots.training import (
    ablations,
    init_ablation,
    loss_grid,
    lr_summary,
    lr_sweep,
    sgd_momentum,
    spikes_vs_shape,
)

__all__ = ["plt", "color", "norm_label", "sawtooth", "ln_collapse", "loss_grid", "lr_sweep", "lr_summary", "ablations",
           "gradient_bias", "paper_metric", "ln_clamping", "ln_gains", "mitigations", "interventions",
           "spikes_vs_shape", "sgd_momentum", "init_ablation", "systems", "reference_name", "survival", "blowup_rates",
           "cell_rates", "trajectories", "signals_before", "quant_stats", "plan_effects"]
