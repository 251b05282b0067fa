"""One shared FP32 twin for paired runs that differ only in recipe (mx_proxy.training.twins)."""

import jax
import numpy as np
import pytest
from tiers import unit_and_e2e

import mx_proxy as mxp
from mx_proxy.training import twins

BASE = mxp.Config(width=32, depth=2, batch=64, steps=40, paired_run=True, diagnostics_every=10, val_every=20,
                    checkpoint_every=20)
RECIPES = ["mxfp8_e4m3", "paper_e4m3", "mxfp6_e2m3"]


def _same(a, b):
    assert list(a.metrics.columns) == list(b.metrics.columns)
    for col in b.metrics.columns:
        np.testing.assert_array_equal(a.metrics[col].values, b.metrics[col].values, err_msg=col)
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert a.diverged_at == b.diverged_at


@pytest.fixture(scope="module")
def shared():
    return mxp.sweep(BASE, recipe=RECIPES, progress=False)


def test_recipes_of_a_paired_sweep_share_one_reference_run(shared):
    assert [r.info.get("shared_reference") for r in shared.runs] == [3, 3, 3]
    # one reference run: every member records the same reference losses
    ref = shared.runs[0].metrics["ref_loss"].values
    for r in shared.runs[1:]:
        np.testing.assert_array_equal(r.metrics["ref_loss"].values, ref)


@pytest.mark.parametrize("i", unit_and_e2e(range(len(RECIPES)), lambda i: i == 0))
def test_each_member_equals_its_separately_paired_run_bit_for_bit(shared, i):
    """Losses, the paired metrics (ref_loss, zeta_paper, cosine_paper), the
    diagnostics, validation losses and the final parameters (the unit tier checks the first member; the other
    members run the same group program with another recipe)."""
    run = shared.runs[i]
    _same(run, mxp.train(run.config, progress=False))


def test_equal_bit_for_bit_with_bf16_dots_too():
    c = BASE.replace(width=64, batch=128, steps=20, dot="bf16", checkpoint_every=0)
    sw = mxp.sweep(c, recipe=["mxfp8_e4m3", "paper_e4m3"], progress=False)
    for run in sw.runs:
        _same(run, mxp.train(run.config, progress=False))


def test_members_with_other_metric_columns_share_too():
    """fp32 beside an MX recipe: the MX run records a column the FP32 one
    does not (the forward/dgrad weight mismatch); each keeps its own."""
    c = BASE.replace(steps=10, checkpoint_every=0)
    sw = mxp.sweep(c, recipe=["fp32", "mxfp8_e4m3"], progress=False)
    assert [r.info.get("shared_reference") for r in sw.runs] == [2, 2]
    for run in sw.runs:
        _same(run, mxp.train(run.config, progress=False))


def test_a_members_checkpoint_is_its_paired_runs_state(shared):
    """Continued from a twin member's checkpoint as a single paired run (a
    no-op intervention), the run reproduces the member exactly."""
    run = shared.runs[1]
    child = mxp.intervene(run, 20, store=False, progress=False)
    _same(child, run)


def test_a_store_serves_twin_members_to_single_runs(tmp_path):
    sw = mxp.sweep(BASE.replace(steps=20, checkpoint_every=0), recipe=RECIPES[:2], store=tmp_path, progress=False)
    loaded = mxp.train(sw.runs[0].config, store=tmp_path, progress=False)
    _same(loaded, sw.runs[0])


def test_shareable_needs_paired_runs_that_differ_only_in_recipe():
    a, b = BASE.replace(recipe="mxfp8_e4m3"), BASE.replace(recipe="paper_e4m3")
    assert twins.shareable([a, b])
    assert not twins.shareable([a])
    assert not twins.shareable([a, a])
    assert not twins.shareable([a, b.replace(lr=1e-3)])
    assert not twins.shareable([a.replace(paired_run=False), b.replace(paired_run=False)])
    assert not twins.shareable([a.replace(controller="gnmr"), b.replace(controller="gnmr")])
    assert not twins.shareable([a.replace(reference_data_seed=3), b.replace(reference_data_seed=3)])
    with pytest.raises(ValueError, match="twin group needs"):
        twins.TwinProgram((a, b.replace(lr=1e-3)))


def test_lr_sweep_of_paired_runs_keeps_a_reference_each():
    """Members differing in LR cannot share a reference (its LR differs): they
    stay one group of paired runs, each with its own reference."""
    sw = mxp.sweep(BASE.replace(steps=10, checkpoint_every=0, recipe="mxfp8_e4m3"), lr=[3e-4, 6e-4],
                     progress=False)
    assert [r.info.get("shared_reference") for r in sw.runs] == [None, None]
    assert not np.array_equal(sw.runs[0].metrics["ref_loss"].values, sw.runs[1].metrics["ref_loss"].values)
