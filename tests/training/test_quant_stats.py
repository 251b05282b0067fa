"""``Config.quant_stats``: per-operand quantization statistics of every GEMM at the diagnostic steps, through the
API and the command line; off (the default), a run's metrics are those of the code before the feature."""

import json
import subprocess
import sys

import jax
import numpy as np
import pandas as pd
import pytest

import mx_proxy as mxp
from mx_proxy.nn import dense
from mx_proxy.nn.blocks import layer_names
from mx_proxy.numerics.operand_stats import STATS
from mx_proxy.numerics.operands import OPERANDS
from mx_proxy.numerics.recipe import PRESETS
from mx_proxy.training import engine, quant_stats

CFG = mxp.Config(width=16, depth=2, batch=32, steps=20, lr=1e-3, diagnostics_every=5, val_every=10, val_batches=1,
                 recipe="mxfp8_e4m3")
# the metrics columns of CFG's run before quant_stats existed (and with it off)
COLUMNS_BEFORE = [
    "step", "loss", "lr", "grad_norm", "update_norm", "zeta_bound", "cosine", "ln_clamp_frac", "weight_clamp_frac",
    "act_clamp_frac", "act_clamp_frac/block_0", "act_clamp_frac/block_1", "cosine/block_0", "cosine/block_1",
    "grad_norm/block_0", "grad_norm/block_1", "ln_bias_mean/block_0", "ln_bias_mean/block_1", "ln_bias_var/block_0",
    "ln_bias_var/block_1", "ln_clamp_frac/block_0", "ln_clamp_frac/block_1", "ln_gain_mean/block_0",
    "ln_gain_mean/block_1", "ln_gain_var/block_0", "ln_gain_var/block_1", "ln_last_bin_frac/block_0",
    "ln_last_bin_frac/block_1", "weight_clamp_frac/block_0", "weight_clamp_frac/block_1",
    "weight_fwd_dgrad_diff/block_0", "weight_fwd_dgrad_diff/block_1", "zeta_bound/block_0", "zeta_bound/block_1",
    "val_loss"]
QUANT_COLUMNS = [f"quant/{layer}/{op}/{stat}{block}" for layer in ("fc1", "fc2") for op in OPERANDS for stat in STATS
                 for block in ("", "/block_0", "/block_1")]


@pytest.fixture(scope="module")
def runs():
    return mxp.train(CFG, progress=False), mxp.train(CFG.replace(quant_stats=True), progress=False)


def test_off_the_metrics_are_unchanged_and_on_only_columns_are_added(runs):
    off, on = runs
    assert list(off.metrics.columns) == COLUMNS_BEFORE
    assert sorted(on.metrics.columns) == sorted(COLUMNS_BEFORE + QUANT_COLUMNS)
    for c in COLUMNS_BEFORE:  # the statistics only watch: every other number of the run is the same, bit for bit
        np.testing.assert_array_equal(on.metrics[c].to_numpy(), off.metrics[c].to_numpy(), err_msg=c)
    for a, b in zip(jax.tree.leaves(on.params), jax.tree.leaves(off.params)):
        np.testing.assert_array_equal(a, b)


def _check_plausible(metrics: pd.DataFrame, period: int):
    diag = metrics[metrics.step % period == 0]
    assert metrics.loc[metrics.step % period != 0, [c for c in QUANT_COLUMNS]].isna().all().all()
    for layer in ("fc1", "fc2"):
        for op in OPERANDS:
            col = f"quant/{layer}/{op}"
            for stat in ("underflow_frac", "clamp_frac", "last_bin_frac"):
                v = diag[f"{col}/{stat}"]
                assert ((v >= 0) & (v <= 1)).all(), (col, stat)
            # saturating elements land on the top code: clamped ones are a part of the last bin
            assert (diag[f"{col}/clamp_frac"] <= diag[f"{col}/last_bin_frac"]).all()
            lo, hi = diag[f"{col}/scale_exp_min"], diag[f"{col}/scale_exp_max"]
            assert (lo == np.round(lo)).all() and (lo <= hi).all() and (hi < 0).all() and (lo > -127).all()
            for i in (0, 1):
                assert np.allclose(diag[f"{col}/snr_db/block_{i}"], -10 * np.log10(diag[f"{col}/rel_mse/block_{i}"]),
                                   rtol=1e-5)
            # E4M3 keeps 4 significant bits: about 30 dB for Gaussian-like blocks
            assert diag[f"{col}/snr_db"].between(20, 40).all(), col
            blocks = diag[[f"{col}/snr_db/block_0", f"{col}/snr_db/block_1"]].to_numpy()
            assert np.allclose(diag[f"{col}/snr_db"], blocks.mean(axis=1), rtol=1e-6)
            assert (diag[f"{col}/scale_exp_min"] == diag[[f"{col}/scale_exp_min/block_{i}" for i in (0, 1)]]
                    .min(axis=1)).all()


def test_on_every_operand_of_every_gemm_has_plausible_statistics(runs):
    _, on = runs
    _check_plausible(on.metrics, CFG.diagnostics_every)
    diag = on.metrics[on.metrics.step % CFG.diagnostics_every == 0]
    # the backward's operands are the loss's gradients: tiny, so their scales sit far below the weights'
    assert (diag["quant/fc2/dgrad_g/scale_exp_max"] < diag["quant/fc2/fwd_w/scale_exp_min"]).all()


def test_output_gradients_are_the_cotangents_the_low_precision_backward_receives():
    """Fed to the layer's own custom-VJP backward, the perturbation gradients give back the training step's
    weight gradients and bias gradient bit for bit."""
    prog = engine.program_for(CFG)
    dyn = engine.dynamic_for(CFG)
    state, teacher = prog.init(dyn)
    params = state.params

    @jax.jit
    def pieces(params):
        x, y = prog._batch(dyn, teacher, 0)
        _, grads, inter = prog.loss_grad(prog.student, params, x, y)
        out = jax.grad(lambda p: prog.loss(prog.student, params, x, y, None, None, p)[0])(
            quant_stats.output_perturbations(params, x.shape[0]))
        backward = {}
        for b in ("block_0", "block_1"):
            for _i, layer in enumerate(("fc1", "fc2")):
                r = prog.recipe.for_layer(*layer_names(int(b[-1]), CFG.depth, layer))
                bias = params[b]["fc2_bias"] if layer == "fc2" else None
                res = (inter[b][f"{layer}_in"][0], params[b][layer], bias, None)
                backward[b, layer] = dense._dense2d_bwd(r, res, out[b][f"{layer}_out"])
        return grads, backward

    grads, backward = pieces(params)
    for (b, layer), (_, dw, db, _) in backward.items():
        np.testing.assert_array_equal(dw, grads[b][layer], err_msg=f"{b}/{layer}")
        if layer == "fc2":
            np.testing.assert_array_equal(db, grads[b]["fc2_bias"])


def test_a_block_that_leaves_an_operand_unquantized_has_nan_there_and_the_mean_skips_it():
    recipe = PRESETS["mxfp8_e4m3"].replace(name="mxfp8_e4m3_fp32_first_fc1", overrides=(("first/fc1",
                                                                                         PRESETS["fp32"]),))
    run = mxp.train(CFG.replace(recipe=recipe, quant_stats=True, steps=5), progress=False)
    row = run.metrics.iloc[0]
    assert np.isnan(row["quant/fc1/fwd_x/snr_db/block_0"]) and np.isfinite(row["quant/fc1/fwd_x/snr_db/block_1"])
    assert row["quant/fc1/fwd_x/snr_db"] == row["quant/fc1/fwd_x/snr_db/block_1"]
    assert np.isfinite(row["quant/fc2/fwd_x/snr_db/block_0"])


def test_unquantized_operands_get_no_columns_and_diagnostics_are_needed():
    assert quant_stats.operand_columns(PRESETS["fp32"], 2) == ()
    fwd = quant_stats.operand_columns(PRESETS["forward_only"], 2)
    assert {op for _, op in fwd} == {"fwd_x", "fwd_w"} and not quant_stats.needs_output_grads(fwd)
    with pytest.raises(ValueError, match="needs diagnostics_every > 0"):
        CFG.replace(quant_stats=True, diagnostics_every=0, val_every=0)


def test_the_command_line_flag_records_the_columns(tmp_path):
    args = ["train", "--width", "16", "--depth", "2", "--batch", "32", "--steps", "20", "--diagnostics-every", "5",
            "--val-every", "10", "--val-batches", "1", "--lr", "1e-3", "--recipe", "mxfp8_e4m3", "--quant-stats",
            "true", "--quiet", "--out", str(tmp_path)]
    done = subprocess.run([sys.executable, "-m", "mx_proxy.cli", *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert json.loads((folder / "config.json").read_text())["quant_stats"] is True
    metrics = pd.read_parquet(folder / "metrics.parquet")
    assert set(QUANT_COLUMNS) <= set(metrics.columns)
    _check_plausible(metrics, 5)
