"""``cell_rates``: each ablation cell a paired seed ensemble of its recipes; its rates and McNemar p-values
checked against scipy on the members' own losses, with the blow-up rule recomputed here."""

import numpy as np
import pytest
from scipy import stats as sps

from mx_proxy.experiments import cell_rates, scales

RECIPES = ["fp32", "mxfp8_e4m3"]
CELLS = [{"act": "gelu", "norm": "layernorm"}, {"act": "relu2", "norm": "rmsnorm"}]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("cells")
    config = scales.get("smoke").config.replace(lr=0.1, steps=80, diagnostics_every=20, val_every=0)
    return config, out, cell_rates.train(config, RECIPES, 3, cells=CELLS, out=out)


def _blew_up(run) -> bool:
    """The rule, written again: past the first W steps (W = 100, a tenth of a short run, at least 10) some step's
    loss is non-finite or > 10x the minimum of the W before it; or the engine stopped the run (diverged)."""
    loss, w = run.metrics["loss"].to_numpy(dtype=float), max(10, min(100, run.config.steps // 10))
    return run.diverged_at is not None or any(
        not np.isfinite(loss[t]) or loss[t] > 10 * np.where(np.isfinite(loss[t - w:t]), loss[t - w:t], np.inf).min()
        for t in range(w, len(loss)))


def test_members_are_paired_seeds_of_each_cell(trained):
    config, _, cells = trained
    assert len(cells.runs) == len(CELLS) * len(RECIPES) * 3
    for changes, e in zip(CELLS, cells.ensembles):
        for arm in RECIPES:
            runs = e.runs[arm]
            assert [(r.config.seed, r.config.data_seed) for r in runs] == [(1, 1), (2, 2), (3, 3)]
            assert all(r.config.recipe.name == arm and r.config.act == changes["act"]
                       and r.config.norm == changes["norm"] and r.config.lr == config.lr for r in runs)


def test_rates_and_mcnemar_match_scipy_on_the_members_losses(trained):
    _, _, cells = trained
    rates = cells.rates()
    assert list(rates.columns) == ["act", "norm", "arm", "members", "blowups", "p", "low", "high", "mcnemar_p"]
    assert len(rates) == len(CELLS) * len(RECIPES)
    assert rates["blowups"].sum() > 0  # LR 0.1 at the smoke size: some member blows up, so the test bites
    for changes, e in zip(CELLS, cells.ensembles):
        outcome = {arm: [_blew_up(r) for r in e.runs[arm]] for arm in RECIPES}
        for arm in RECIPES:
            row = rates[(rates.act == changes["act"]) & (rates.norm == changes["norm"]) & (rates.arm == arm)].iloc[0]
            k, n = sum(outcome[arm]), len(outcome[arm])
            ci = sps.binomtest(k, n).proportion_ci(0.95, method="exact")
            assert (row.members, row.blowups) == (n, k)
            assert row.p == pytest.approx(k / n)
            assert (row.low, row.high) == (pytest.approx(ci.low), pytest.approx(ci.high))
        b = sum(c and not m for c, m in zip(outcome["fp32"], outcome["mxfp8_e4m3"]))
        c = sum(m and not c for c, m in zip(outcome["fp32"], outcome["mxfp8_e4m3"]))
        row = rates[(rates.act == changes["act"]) & (rates.arm == "mxfp8_e4m3")].iloc[0]
        assert row.mcnemar_p == pytest.approx(sps.binomtest(b, b + c, 0.5).pvalue if b + c else 1.0)
        assert np.isnan(rates[(rates.act == changes["act"]) & (rates.arm == "fp32")].iloc[0].mcnemar_p)


def test_a_rerun_loads_the_same_members(trained):
    config, out, cells = trained
    again = cell_rates.train(config, RECIPES, 3, cells=CELLS, out=out)
    assert again.rates().equals(cells.rates())
    assert [r.info["key"] for r in again.runs] == [r.info["key"] for r in cells.runs]


def test_cell_names_are_folder_safe():
    assert cell_rates.cell_name({}) == "base"
    assert cell_rates.cell_name({"norm": "layernorm_noaffine", "act": "relu"}) == "act-relu__norm-layernorm_noaffine"
    assert cell_rates.cell_name({"act": "a/b c", "lr": 0.001}) == "act-a-b-c__lr-0.001"


@pytest.mark.parametrize("args, match", [
    (dict(recipes=[], members=2), "at least one recipe"),
    (dict(recipes=RECIPES, members=0), "members must be an integer >= 1, got 0"),
    (dict(recipes=RECIPES, members=True), "members must be an integer >= 1, got True"),
    (dict(recipes=RECIPES, members=2, cells=[{"act": "gelu"}, {"act": "nope"}]), "ablation cell {'act': 'nope'}"),
    (dict(recipes=RECIPES, members=2, cells=[{"widht": 8}]), "ablation cell {'widht': 8}"),
])
def test_bad_input_is_refused_before_anything_trains(tmp_path, args, match):
    with pytest.raises(ValueError, match=match.replace("{", r"\{").replace("}", r"\}")):
        cell_rates.train(scales.get("smoke").config, out=tmp_path / "x", **args)
    assert not (tmp_path / "x").exists()


def test_the_figure_draws_each_rate_with_its_interval(trained):
    import matplotlib

    matplotlib.use("Agg")
    from mx_proxy.viz import plots

    rates = trained[2].rates()
    fig = plots.cell_rates(rates)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["gelu, layernorm", "relu2, rmsnorm"]
    drawn = []  # (p, low, high) of each error bar, from the drawn artists
    for bars in ax.containers:
        (seg,) = bars.lines[2][0].get_segments()  # the horizontal interval bar
        drawn.append((bars.lines[0].get_xdata()[0], seg[0][0], seg[1][0]))
    assert drawn == [pytest.approx((r.p, r.low, r.high)) for r in rates.itertuples()]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == RECIPES
    plots.plt.close(fig)
    with pytest.raises(ValueError, match="no rates"):
        plots.cell_rates(rates.iloc[:0])


def test_parse_cell_reads_each_value_as_its_type():
    assert cell_rates.parse_cell("act=relu,norm=rmsnorm") == {"act": "relu", "norm": "rmsnorm"}
    assert cell_rates.parse_cell("lr=1e-3,depth=3,paired_run=true") == {"lr": 1e-3, "depth": 3, "paired_run": True}
    with pytest.raises(ValueError, match="'act' is not FIELD=VALUE"):
        cell_rates.parse_cell("act")
    with pytest.raises(ValueError, match="unknown field 'widht'; valid: .*width"):
        cell_rates.parse_cell("widht=3")


def test_the_command_writes_the_table_after_each_cell_and_resumes(tmp_path, capsys):
    import pandas as pd

    argv = ["--scale", "smoke", "--steps", "30", "--members", "2", "--out", str(tmp_path / "ens"),
            "--cells", "act=gelu,norm=layernorm", "act=relu2", "--table", str(tmp_path / "rates.csv")]
    assert cell_rates.main(argv) == 0
    table = pd.read_csv(tmp_path / "rates.csv")
    again = cell_rates.train(scales.get("smoke").config.replace(steps=30), RECIPES, 2,
                             cells=[{"act": "gelu", "norm": "layernorm"}, {"act": "relu2"}], out=tmp_path / "ens")
    expected = again.rates()  # loaded, not trained again: the same members
    assert list(table.columns) == list(expected.columns)
    assert table[["act", "norm", "arm", "members", "blowups"]].values.tolist() == \
        expected[["act", "norm", "arm", "members", "blowups"]].values.tolist()
    assert table["norm"].tolist() == ["layernorm"] * 4  # the second cell keeps the base config's norm
    assert "relu2" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--cells", "widht=3"], "unknown field 'widht'"),
    (["--cells", "act=nope"], "ablation cell {'act': 'nope'}"),
    (["--members", "0"], "--members must be >= 1, got 0"),
    (["--scale", "quick"], "scale 'quick' has no rate_members; give --members N"),
    (["--recipes", "fp32", "mxfp9"], "mxfp9"),
    (["--scale", "huge"], "huge"),
    (["--steps", "0"], "--steps must be >= 1, got 0"),
])
def test_the_command_refuses_bad_input_with_status_2_before_training(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as e:
        cell_rates.main(["--scale", "smoke", "--out", str(tmp_path / "ens"), *args])
    assert e.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "ens").exists()
