"""Every figure function of ``mx-proxy figures`` drawn in the unit tier, cheaply: from the runs committed under
``results/`` (real metrics, nothing trained), where the end-to-end tier trains their experiments at the smoke
scale. Each figure is checked against the data it was given: a line per run carrying that run's values, the
panels and titles the function documents, the files :func:`figures.generate` says it wrote."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from mx_proxy.experiments import campaign  # noqa: E402
from mx_proxy.viz import figures, plots  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"
MEDIUM = RESULTS / "medium"


@pytest.fixture(scope="module")
def runs():
    return campaign.load_results(MEDIUM)


def _lines(fig):
    return [ln for ax in fig.axes for ln in ax.get_lines()]


def _carries(fig, values) -> bool:
    """Some line of ``fig`` has exactly ``values`` (finite entries) as its y data."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    for ln in _lines(fig):
        y = np.asarray(ln.get_ydata(), dtype=float)
        y = y[np.isfinite(y)]
        if y.shape == values.shape and np.array_equal(y, values):
            return True
    return False


def test_loss_curves_carry_each_runs_losses_unsmoothed(runs):
    fig = plots.lr_sweep(runs, smooth=1)
    try:
        for r in runs:
            assert _carries(fig, r.metrics["loss"]), r.config.recipe.name
        titles = {ax.get_title() for ax in fig.axes if ax.get_visible()}
        assert titles == {f"learning rate {r.config.lr:g}" for r in runs}  # one panel per learning rate
        labels = {t.get_text() for t in fig.legends[0].get_texts()}
        assert {r.config.recipe.name for r in runs} <= labels
    finally:
        plots.plt.close(fig)


def test_final_loss_summary_marks_each_recipe_at_its_final_loss(runs):
    fig = plots.lr_summary(runs)
    try:
        by_label = {ln.get_label(): ln for ln in _lines(fig)}
        for r in runs:
            line = by_label[r.config.recipe.name]
            assert line.get_ydata()[0] == r.final_loss and line.get_xdata()[0] == r.config.lr
    finally:
        plots.plt.close(fig)


@pytest.mark.parametrize("name", ["ablations", "gradient_bias", "ln_clamping", "mitigations", "spikes_vs_shape",
                                  "sgd_momentum", "init_ablation"])
def test_every_trained_figure_draws_the_committed_runs(runs, name):
    fig = figures.TRAINED[name][0](runs)
    try:
        assert fig.axes and any(ax.has_data() for ax in fig.axes), name
        assert fig._suptitle is not None or any(ax.get_title() for ax in fig.axes), name
    finally:
        plots.plt.close(fig)


def test_ln_gains_plots_each_blocks_gain_mean(runs):
    r = next(r for r in runs if r.config.recipe.name == "paper_e4m3")
    fig = plots.ln_gains(r)
    try:
        assert fig.axes and any(ax.has_data() for ax in fig.axes)
    finally:
        plots.plt.close(fig)


def test_generate_writes_the_figures_that_train_nothing(tmp_path):
    names = ["sawtooth", "ln_collapse", "headline_zeta", "headline_ln_clamping", "headline_interventions"]
    said = []
    written = figures.generate(names, out=tmp_path / "figs", results=RESULTS, log=said.append, progress=False)
    assert [Path(p).name for p in written] == [f"{n}.png" for n in names]
    for p in written:
        assert Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and Path(p).stat().st_size > 10_000
    # each headline figure names the committed results it was drawn from
    src = figures.headline_source(figures.HEADLINE["headline_zeta"][0], RESULTS)
    assert any("headline_zeta (committed " in s and src[0] in s for s in said)
    assert len([s for s in said if " -> " in s]) == len(names)


def test_generate_refuses_unknown_names_and_scales_before_drawing(tmp_path):
    with pytest.raises(ValueError, match="unknown figure.*'nope'.*sawtooth"):
        figures.generate(["nope"], out=tmp_path / "a")
    with pytest.raises(ValueError, match="unknown scale 'huge'; valid: "):
        figures.generate(["sawtooth"], scale="huge", out=tmp_path / "b")
    with pytest.raises(ValueError, match="jobs must be an integer"):
        figures.generate(["sawtooth"], jobs=0, out=tmp_path / "c")
    assert not any(tmp_path.iterdir())  # nothing written


def test_a_headline_figure_without_its_runs_says_which_it_needs(tmp_path):
    with pytest.raises(ValueError, match="needs campaign results with grid runs"):
        figures.FIGURES["headline_lr_sweep"]("quick", results=tmp_path)


def test_campaign_figures_draws_what_one_folder_holds(tmp_path):
    written = figures.campaign_figures(MEDIUM, out=str(tmp_path / "figs"))
    have = {r.info["kind"] for r in campaign.load_results(MEDIUM)}
    expect = [f"{n}.png" for n, (kinds, _) in figures.HEADLINE.items() if set(kinds) <= have]
    assert [Path(p).name for p in written] == expect and expect
