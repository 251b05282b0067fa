"""The ``quant_stats`` figure and the explorer's quantization panels, drawn from hand-made metrics and a short
live training."""

import numpy as np
import pandas as pd
import pytest

import mx_proxy as mxp
from mx_proxy.numerics.operand_stats import STATS
from mx_proxy.training.result import Run
from mx_proxy.viz import plots
from mx_proxy.viz.explore_results import PANELS, QUANT_PANELS, panels
from mx_proxy.viz.figures import FIGURE_DOCS, FIGURES
from mx_proxy.viz.plots.quantization import operand_columns, worst_operand


def _run(pairs=(("fc1", "fwd_x"), ("fc2", "dgrad_g"))):
    steps = np.arange(30)
    cols = {"step": steps, "loss": np.linspace(1, 0.1, 30, dtype=np.float32)}
    for k, (layer, op) in enumerate(pairs):
        for stat in STATS:
            v = np.where(steps % 10 == 0, 0.01 * (k + 1) + 0.001 * steps, np.nan).astype(np.float32)
            cols[f"quant/{layer}/{op}/{stat}"] = 30 - 10 * v if stat == "snr_db" else v
            cols[f"quant/{layer}/{op}/{stat}/block_0"] = v
    cfg = mxp.Config(width=16, depth=1, recipe="mxfp8_e4m3", quant_stats=True, steps=30)
    return Run(cfg, pd.DataFrame(cols), None)


def test_the_figure_draws_every_statistic_of_every_operand():
    run = _run()
    assert operand_columns(run.metrics) == [("fc1", "fwd_x"), ("fc2", "dgrad_g")]
    fig = plots.quant_stats(run)
    axes = fig.axes[:6]
    assert [len(ax.lines) for ax in axes] == [2, 2, 2, 4, 2, 2]  # the exponent panel: max and min per operand
    assert {t.get_text() for t in fig.legends[0].get_texts()} == {"fc1 fwd_x", "fc2 dgrad_g"}
    assert axes[1].lines[0].get_linestyle() == "-" and axes[1].lines[1].get_linestyle() == "--"  # fc1, fc2
    np.testing.assert_allclose(axes[0].lines[0].get_ydata(), 100 * run.metrics["quant/fc1/fwd_x/underflow_frac"]
                               .dropna())
    plots.plt.close(fig)
    assert "quant_stats" in FIGURES and "quant_stats" in FIGURE_DOCS


def test_a_run_without_statistics_is_refused_by_name():
    run = Run(mxp.Config(width=16), pd.DataFrame({"step": [0], "loss": [1.0]}), None)
    with pytest.raises(ValueError, match="train it with quant_stats=True"):
        plots.quant_stats(run)


def test_worst_operand_is_the_lowest_snr_and_the_highest_of_the_rest():
    m = _run().metrics
    row = m.iloc[10]
    assert worst_operand(m, "snr_db").iloc[10] == min(row["quant/fc1/fwd_x/snr_db"], row["quant/fc2/dgrad_g/snr_db"])
    assert worst_operand(m, "clamp_frac").iloc[10] == row["quant/fc2/dgrad_g/clamp_frac"]
    assert np.isnan(worst_operand(m, "clamp_frac").iloc[1])


@pytest.mark.e2e
def test_the_explorer_adds_the_worst_operand_panels_when_quant_stats_is_on():
    small = dict(width=16, depth=1, batch=16, steps=10, diagnostics_every=5, val_every=5, val_batches=1)
    assert panels(mxp.Config()) == PANELS
    panel = mxp.explore(quant_stats=True, **small)
    assert panels(panel.base) == PANELS + QUANT_PANELS and len(panel.axes) == 6
    runs = panel.train()
    snr_ax = panel.axes[4]
    assert [line.get_label() for line in snr_ax.lines] == ["mxfp8_e4m3"]  # FP32 quantizes nothing: no curve
    assert np.all(np.isfinite(snr_ax.lines[0].get_ydata())) and len(snr_ax.lines[0].get_ydata()) == 2
    assert "quant/fc1/fwd_x/snr_db" in runs[1].metrics
