"""mx_proxy.experiments.scales: the named scales construct, are frozen, and smoke trains end to end."""

import dataclasses

import numpy as np
import pytest

import mx_proxy as mxp
from mx_proxy.experiments import scales


def test_names_and_get():
    assert scales.names() == ("smoke", "quick", "medium", "unstable", "paper")
    for name in scales.names():
        s = scales.get(name)
        assert s.name == name
        assert isinstance(s.config, mxp.Config)
        assert s.config.recipe.name == "fp32"
        early, late = s.intervention_steps
        assert 0 < early < late < s.config.steps
        assert len(s.lr_grid) >= 2 and list(s.lr_grid) == sorted(s.lr_grid)
        assert s.depths and s.widths and s.sgd_lr > 0


def test_unknown_scale_names_the_valid_ones():
    with pytest.raises(ValueError, match="smoke, quick, medium, unstable, paper"):
        scales.get("huge")
    with pytest.raises(ValueError):
        scales.get(None)


def test_scales_are_frozen():
    with pytest.raises(TypeError):
        scales.SCALES["new"] = scales.get("smoke")
    with pytest.raises(dataclasses.FrozenInstanceError):
        scales.get("quick").lr_grid = (1.0,)


def test_paper_scale_matches_the_paper():
    c = scales.get("paper").config
    assert (c.width, c.depth, c.batch, c.lr) == (512, 4, 2048, 6e-4)
    assert c.steps >= 9000
    assert scales.get("paper").intervention_steps == (4500, 5080)


def test_unstable_scale_is_the_search_setting_that_qualified():
    """The ``unstable`` scale's config is the unstable search's base config of the first qualifying row of the
    committed table (its single-run seed aside), and it trains rates over 8 seeds."""
    import pathlib

    from mx_proxy.experiments import unstable_search as us

    table = us.read_table(pathlib.Path(__file__).resolve().parents[2] / "results" / "unstable_search.csv")
    row = table[table["verdict"] == "qualifies"].iloc[0]
    s = scales.get("unstable")
    assert (s.config.width, s.config.depth, s.config.lr) == (row.width, row.depth, row.lr)
    assert s.config.replace(seed=0, data_seed=0) == us.base_config(int(row.width), int(row.depth), float(row.lr))
    assert s.rate_members == us.MEMBERS == 8 and s.campaign is None


@pytest.mark.parametrize("bad", [-1, True, 2.0, "8"])
def test_rate_members_must_be_a_count(bad):
    with pytest.raises(ValueError, match=f"rate_members must be an integer >= 0, got {bad!r}"):
        dataclasses.replace(scales.get("smoke"), rate_members=bad)


def test_bad_intervention_steps_are_rejected():
    with pytest.raises(ValueError, match="intervention"):
        dataclasses.replace(scales.get("smoke"), intervention_steps=(80, 40))


@pytest.mark.parametrize("recipe", ["fp32", "mxfp8_e4m3"])
def test_smoke_trains_end_to_end_with_every_metric(recipe):
    s = scales.get("smoke")
    run = mxp.train(s.config.replace(recipe=recipe), progress=False)
    m = run.metrics
    assert len(m) == s.config.steps and run.diverged_at is None
    assert np.isfinite(run.final_loss) and run.final_loss < m["loss"].iloc[0]
    for col in ("loss", "grad_norm", "update_norm", "zeta_bound", "cosine", "ln_clamp_frac", "weight_clamp_frac",
                "act_clamp_frac", "val_loss", "ln_clamp_frac/block_0", "ln_last_bin_frac/block_0",
                "ln_gain_mean/block_0", "ln_gain_var/block_0", f"zeta_bound/block_{s.config.depth - 1}"):
        assert col in m, col
        assert np.isfinite(m[col].dropna()).all() and m[col].notna().any(), col
    diag = m.dropna(subset=["zeta_bound"])
    assert len(diag) == s.config.steps // s.config.diagnostics_every
    if recipe == "fp32":
        assert (diag["zeta_bound"] == 0).all() and (diag["cosine"] == 1).all()
    else:
        assert (diag["zeta_bound"] > 0).all() and (diag["cosine"] < 1).all()
