"""End-to-end runs of the engine: determinism, learning, diagnostics, divergence."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mx_proxy as mxp
from mx_proxy.runner import programs
from mx_proxy.training import data, engine
from mx_proxy.training.result import segment_length

SMALL = mxp.Config(width=32, depth=2, batch=64, steps=60, lr=1e-3, diagnostics_every=10, val_every=20)


def test_same_config_twice_gives_identical_metrics():
    cfg = SMALL.replace(recipe="mxfp8_mixed")
    a, b = mxp.train(cfg, progress=False), mxp.train(cfg, progress=False)
    assert a.metrics.equals(b.metrics)


def _toy_step(s, t):
    s = s * 1.5 + t.astype(jnp.float32)
    return s, {"s": s, "t": t}


def test_run_steps_runs_n_steps_of_one_program_of_size_rows():
    f = jax.jit(engine.run_steps, static_argnums=(0, 4))
    for n in (0, 3, 5):
        state, rows = f(_toy_step, jnp.float32(1), jnp.int32(7), jnp.int32(n), 5)
        ref_state, ref = jax.lax.scan(_toy_step, jnp.float32(1), 7 + jnp.arange(n, dtype=jnp.int32))
        assert np.asarray(state) == np.asarray(ref_state)
        np.testing.assert_array_equal(np.asarray(rows["s"])[:n], np.asarray(ref["s"]))
        np.testing.assert_array_equal(np.asarray(rows["t"])[:n], np.asarray(ref["t"]))
        assert np.isnan(np.asarray(rows["s"])[n:]).all() and (np.asarray(rows["t"])[n:] == 0).all()
    assert f._cache_size() == 1  # every n ran the one compiled program


def test_every_segment_length_of_a_run_is_one_compiled_program():
    cfg = mxp.Config(width=16, depth=1, batch=8, steps=50, diagnostics_every=10, val_every=20, val_batches=1,
                     checkpoint_at=(30,), recipe="mxfp8_e4m3")
    lengths, t = [], 0
    while t < cfg.steps:
        lengths.append(segment_length(cfg, t))
        t += lengths[-1]
    assert lengths == [20, 10, 10, 10]  # to the validation step, the checkpoint, the validation step, the end
    run = mxp.train(cfg, progress=False)
    assert list(run.metrics.step) == list(range(50))
    segment, _ = programs.single(engine.static_key(cfg))
    assert len(segment._memory) == 1  # one signature compiled (or loaded) for all four segments


@pytest.mark.parametrize("dot", ["f32", "bf16"])
def test_copy_insertion_by_region_analysis_leaves_every_value_as_it_was(dot):
    """compiler_options turns XLA:CPU's region-based copy insertion on (fewer copies of the loop's carried
    state); the segment it compiles gives the same state and metrics, bit for bit, as without it."""
    if jax.default_backend() != "cpu":
        pytest.skip("a CPU compiler option")
    cfg = SMALL.replace(recipe="paper_e4m3", dot=dot, diagnostics_every=5)
    opts = engine.compiler_options(cfg)
    assert opts.pop("xla_cpu_copy_insertion_use_region_analysis") is True
    program, dyn = engine.program_for(cfg), engine.dynamic_for(cfg)
    state, teacher = program.init(dyn)
    outs = [jax.jit(program.segment, static_argnames=("size",), compiler_options=o)(
        state, dyn, teacher, np.int32(0), np.int32(30), size=30) for o in (engine.compiler_options(cfg), opts or None)]
    leaves = [jax.tree.leaves(o) for o in outs]
    assert len(leaves[0]) == len(leaves[1]) > 10
    for a, b in zip(*leaves, strict=True):
        assert np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)


def test_data_is_a_pure_function_of_seed_and_step():
    import jax
    k = jax.random.key(3)
    x1, n1 = data.train_inputs(k, 17, 8, 4)
    x2, n2 = data.train_inputs(k, 17, 8, 4)
    x3, _ = data.train_inputs(k, 18, 8, 4)
    v, _ = data.val_inputs(k, 0, 8, 4)
    assert np.array_equal(x1, x2) and np.array_equal(n1, n2) and not np.array_equal(x1, x3)
    assert not np.array_equal(x1, v)


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**31, 2**32 - 1])
def test_host_built_key_data_equals_jax_key_data(seed):
    import jax

    from mx_proxy.training import dynamic
    assert np.array_equal(dynamic._key_data(seed), jax.random.key_data(jax.random.key(seed)))


@pytest.mark.e2e
def test_two_hundred_steps_learn_in_fp32_and_mxfp8():
    cfg = mxp.Config(width=64, depth=2, batch=128, steps=200, lr=1e-3, diagnostics_every=20, val_every=100)
    fp32 = mxp.train(cfg, progress=False)
    mx = mxp.train(cfg.replace(recipe="mxfp8_e4m3"), progress=False)
    for run in (fp32, mx):
        loss = run.metrics["loss"].to_numpy()
        assert run.diverged_at is None and len(loss) == 200
        assert loss[-20:].mean() < 0.2 * loss[:5].mean()
    diag = fp32.metrics.dropna(subset=["zeta_bound"])
    assert len(diag) == 10 and (diag["zeta_bound"] == 0).all() and (diag["cosine"] == 1).all()
    mxd = mx.metrics.dropna(subset=["zeta_bound"])
    assert (mxd["zeta_bound"] > 0).all() and (mxd["cosine"] < 1).all()
    assert mxd["cosine"].iloc[0] > 0.99 and (mxd["cosine"] > 0).all()  # noisier as the true gradient shrinks
    assert fp32.metrics["val_loss"].notna().sum() == 2


def test_metrics_columns_and_per_layer_diagnostics():
    run = mxp.train(SMALL.replace(recipe="mxfp8_e4m3", steps=20), progress=False)
    m = run.metrics
    for col in ["step", "loss", "val_loss", "grad_norm", "update_norm", "lr", "zeta_bound", "cosine",
                "ln_clamp_frac", "weight_clamp_frac", "act_clamp_frac", "grad_norm/block_0", "zeta_bound/block_1",
                "cosine/block_0", "ln_clamp_frac/block_1", "ln_gain_mean/block_0", "ln_gain_var/block_0",
                "ln_bias_mean/block_1", "ln_bias_var/block_1", "weight_clamp_frac/block_0",
                "act_clamp_frac/block_1", "ln_last_bin_frac/block_0"]:
        assert col in m.columns, col
    assert list(m["step"]) == list(range(20))
    assert m["zeta_bound"].notna().sum() == 2 and m["loss"].notna().all()


def test_diagnostics_off_records_no_shadow_gradient():
    run = mxp.train(SMALL.replace(diagnostics_every=0, steps=25, val_every=0), progress=False)
    assert "zeta_bound" not in run.metrics.columns and len(run.metrics) == 25


def test_paired_run_reference_compares_with_the_fp32_run():
    cfg = SMALL.replace(recipe="mxfp8_e4m3", steps=30, gradient_reference="paired_run")
    run = mxp.train(cfg, progress=False)
    fp32 = mxp.train(SMALL.replace(steps=30), progress=False)
    np.testing.assert_array_equal(run.metrics["ref_loss"].to_numpy(), fp32.metrics["loss"].to_numpy())
    assert (run.metrics["zeta_bound"].dropna() > 0).all()


def test_absurd_learning_rate_diverges_cleanly():
    run = mxp.train(SMALL.replace(lr=50.0, recipe="mxfp8_e4m3"), progress=False)
    assert run.diverged_at is not None and run.diverged_at < 60
    before = run.metrics[run.metrics["step"] < run.diverged_at]
    assert np.isfinite(before["loss"]).all()
    assert run.metrics["step"].iloc[-1] == run.diverged_at
    assert "diverged at step" in run.summary() and math.isfinite(run.final_loss)


def test_cosine_schedule_and_sgd():
    run = mxp.train(SMALL.replace(schedule="cosine", lr_min=1e-5, optimizer="sgd", momentum=0.9, lr=0.05,
                                    steps=40, diagnostics_every=0, val_every=0), progress=False)
    lr = run.metrics["lr"].to_numpy()
    assert lr[0] == pytest.approx(0.05) and lr[-1] < 0.002 and np.all(np.diff(lr) <= 0)


@pytest.mark.parametrize("bad, match", [
    (dict(width=0), "width"), (dict(depth=-1), "depth"), (dict(batch=2.5), "batch"), (dict(lr=-1.0), "lr"),
    (dict(lr=float("nan")), "lr"), (dict(recipe="mxfp9"), "valid: fp32"), (dict(act="elu"), "valid: gelu"),
    (dict(optimizer="lion"), "valid: adam"), (dict(val_every=15), "multiple"), (dict(beta2=1.0), "beta2"),
    (dict(widht=3), "unknown config field"),
])
def test_bad_config_values_are_value_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        SMALL.replace(**bad)


def test_config_json_round_trip_and_hash():
    cfg = SMALL.replace(recipe=mxp.recipes.get("mxfp8_e4m3").replace(name="x", ln_affine=None))
    back = mxp.Config.from_dict(cfg.to_dict())
    assert back == cfg and back.hash() == cfg.hash() and cfg.hash() != SMALL.hash()
