"""The systems (GNMR, 2-D FP4, NVFP4, nGPT) inside training: 2-D/NVFP4 recipes, sensitive-GEMM
overrides, stochastic rounding keyed by (seed, step, layer, role), the
forward/dgrad weight disagreement, and the nGPT student under the engine."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mx_proxy as mxp
from mx_proxy.nn import layers
from mx_proxy.nn import resmlp as model
from mx_proxy.numerics import recipe as recipes
from mx_proxy.numerics import recipe_json
from mx_proxy.numerics.quantize import NVFP4, MXSpec, quantize
from mx_proxy.training import diagnostics

SMALL = mxp.Config(width=32, depth=2, batch=64, steps=40, lr=3e-3, diagnostics_every=10, val_every=20)


# ----------------------------------------------------------------------------- recipes


def test_new_presets():
    two = recipes.get("mxfp4_2d")
    assert two.fwd_w is two.dgrad_w and two.fwd_w.block_dims == 2 and two.fwd_w.scale_rule.name == "rceil"
    assert {two.dgrad_g.rounding, two.wgrad_g.rounding} == {"stochastic"} and two.fwd_x.rounding == "even"
    assert two.stochastic and not recipes.get("mxfp8_2d").stochastic
    assert two.for_layer("block_0/fc1", "first/fc1").fwd_x.element.name == "fp8_e4m3"
    assert two.for_layer("block_1/fc1") is two and two.for_layer("block_3/fc2", "last/fc2").name.startswith("mxfp8_2d")
    nv = recipes.get("nvfp4")
    assert {getattr(nv, r) for r in layers.OPERANDS} == {NVFP4}
    nv2 = recipes.get("nvfp4_2d")
    assert nv2.fwd_w == NVFP4.replace(block_dims=2) and nv2.wgrad_g.rounding == "stochastic"
    for name in ("mxfp8_2d", "mxfp4_2d", "nvfp4", "nvfp4_2d"):
        assert f"`{name}`" in recipes.table()
        r = recipes.get(name)
        assert recipe_json.from_json(recipe_json.to_json(r)) == r
        custom = r.replace(name=f"{name}-copy")
        # a dict with tiles, scale format, overrides
        assert recipe_json.from_json(recipe_json.to_json(custom)) == custom


def test_overrides_and_pallas_validation():
    inner = recipes.get("mxfp8_e4m3")
    r = recipes.get("mxfp4").replace(overrides=(("block_*/fc2", inner),))
    assert r.for_layer("block_5/fc2") is inner and r.for_layer("block_5/fc1") is r
    with pytest.raises(ValueError, match="pairs"):
        recipes.get("mxfp4").replace(overrides=(("fc2",),))
    with pytest.raises(ValueError, match="cannot have overrides"):
        recipes.get("mxfp4").replace(overrides=(("x", r),))
    with pytest.raises(ValueError, match="use 2-D tiles"):
        recipes.get("mxfp8_2d").replace(backend="pallas")
    with pytest.raises(ValueError, match="stochastic"):
        recipes.get("nvfp4_2d").replace(backend="pallas")


def test_interventions_apply_to_new_presets():
    r = recipes.mitigate("nvfp4_2d", "rceil")
    assert r.fwd_w == recipes.get("nvfp4_2d").fwd_w  # E4M3 scales have no exponent to bump
    m = recipes.mitigate("mxfp4_2d", ["ln_exempt", "rceil"])
    assert m.ln_precision == "fp32" and m.overrides[0][1].fwd_x.scale_rule.name == "rceil"
    sr = recipes.get("mxfp4_2d").map_specs(lambda s: s.replace(rounding="even"))
    assert not sr.stochastic and all(not o.stochastic for _, o in sr.overrides)


def test_override_changes_only_the_named_layer():
    """The Student routes each dense layer through for_layer: overriding the
    last fc2 with fp32 equals running that one GEMM unquantized."""
    x = jax.random.normal(jax.random.key(1), (16, 32))
    base = recipes.get("mxfp4")
    over = base.replace(overrides=(("last/fc2", recipes.get("fp32")),))
    m = model.Student(model.model_spec(width=32, depth=2, recipe=base))
    p = m.init(jax.random.key(0), x)["params"]
    y_base = m.apply({"params": p}, x)
    y_over = model.Student(model.model_spec(width=32, depth=2, recipe=over)).apply({"params": p}, x)
    assert not np.array_equal(y_base, y_over)
    # by hand: block 0 in mxfp4, block 1's fc2 in fp32
    h = model.Block(model.model_spec(width=32, depth=2, recipe=base), 0).apply({"params": p["block_0"]}, x)
    b1 = p["block_1"]
    z = layers.layer_norm(h, b1["ln_gain"], b1["ln_bias"], base)
    a = layers.activation("gelu", layers.mx_dense(z, b1["fc1"], None, base), base)
    y = h + layers.mx_dense(a, b1["fc2"], b1["fc2_bias"], recipes.get("fp32"))
    assert np.array_equal(y, y_over)


# ----------------------------------------------------------------------------- stochastic rounding


def test_operand_keys_are_distinct_and_the_2d_weight_is_shared():
    sr = recipes.get("mxfp8_e4m3").map_specs(lambda s: s.replace(rounding="stochastic"))
    k = jax.random.key(7)
    keys = [jax.random.key_data(layers.operand_key(k, sr, r)) for r in layers.OPERANDS]
    assert len({tuple(np.asarray(v).ravel()) for v in keys}) == 6
    w2d = MXSpec("fp4_e2m1", scale_rule="rceil", rounding="stochastic", block_dims=2)
    tied = sr.replace(fwd_w=w2d, dgrad_w=w2d)
    assert np.array_equal(jax.random.key_data(layers.operand_key(k, tied, "dgrad_w")),
                          jax.random.key_data(layers.operand_key(k, tied, "fwd_w")))
    assert layers.operand_key(k, recipes.get("mxfp4"), "fwd_x") is None
    with pytest.raises(ValueError, match="PRNG key"):
        layers.mx_dense(jnp.ones((4, 32)), jnp.ones((32, 8)), None, sr)


def test_two_d_shared_weight_is_one_quantized_tensor_in_both_gemms():
    """dgrad's dx = g @ Q(W)ᵀ uses the forward's Q(W) exactly (SR weights too)."""
    w2d = MXSpec("fp4_e2m1", scale_rule="rceil", rounding="stochastic", block_dims=2)
    r = recipes.Recipe("tied", fwd_w=w2d, dgrad_w=w2d)
    kx, kw, kg, kk = jax.random.split(jax.random.key(3), 4)
    x, w, g = jax.random.normal(kx, (8, 64)), jax.random.normal(kw, (64, 96)), jax.random.normal(kg, (8, 96))
    y, vjp = jax.vjp(lambda x: layers.mx_dense(x, w, None, r, kk), x)
    qw = quantize(w, w2d, axis=0, key=layers.operand_key(kk, r, "fwd_w"))
    assert np.array_equal(y, jnp.dot(x, qw, precision="highest"))
    (dx,) = vjp(g)
    assert np.array_equal(dx, jax.lax.dot_general(g, qw, (((1,), (1,)), ((), ())), precision="highest"))


def test_stochastic_gemm_is_unbiased():
    """E[Q(x) Q(w)] = x w with independent per-operand keys: the mean over N
    keys lies within 5 standard errors of the exact product, for every entry."""
    spec = MXSpec("fp4_e2m1", scale_rule="rceil", rounding="stochastic")
    r = recipes.Recipe("sr", fwd_x=spec, fwd_w=spec)
    kx, kw = jax.random.split(jax.random.key(11))
    x, w = jax.random.normal(kx, (4, 64)), jax.random.normal(kw, (64, 8))
    n = 2000
    ys = jax.vmap(lambda k: layers.mx_dense(x, w, None, r, k))(jax.random.split(jax.random.key(5), n))
    exact = jnp.dot(x, w, precision="highest")
    se = jnp.std(ys, axis=0) / np.sqrt(n)
    z = jnp.abs(jnp.mean(ys, axis=0) - exact) / se
    assert float(jnp.max(z)) < 5.0
    # and it is really random: round-to-nearest is a single, biased draw
    assert float(jnp.min(jnp.std(ys, axis=0))) > 0


@pytest.fixture(scope="module")
def sr_run():
    return mxp.train(SMALL.replace(recipe="mxfp4_2d"), store=False, progress=False)


def test_stochastic_training_replays_exactly(sr_run, tmp_path):
    again = mxp.train(SMALL.replace(recipe="mxfp4_2d"), store=False, progress=False)
    assert again.metrics.equals(sr_run.metrics)
    det = recipes.get("mxfp4_2d").map_specs(lambda s: s.replace(rounding="even"))
    other = mxp.train(SMALL.replace(recipe=det), store=False, progress=False)
    assert not np.array_equal(other.metrics["loss"], sr_run.metrics["loss"])
    assert np.array_equal(other.metrics["loss"][:1], sr_run.metrics["loss"][:1])  # forward of step 0 is deterministic
    # resuming from a checkpoint continues the same rounding stream
    cfg = SMALL.replace(recipe="mxfp4_2d", checkpoint_at=(20,))
    parent = mxp.train(cfg, store=tmp_path / "a", progress=False)
    import shutil

    key = parent.info["key"]
    from conftest import killed_run_folder

    shutil.copytree(tmp_path / "a" / key / "checkpoints", f"{killed_run_folder(tmp_path / 'b', key)}/checkpoints")
    resumed = mxp.train(cfg, store=tmp_path / "b", progress=False)
    assert resumed.info.get("resumed_from") == 20 and resumed.metrics.equals(sr_run.metrics)


def test_weight_disagreement_is_zero_only_with_2d_tiles(sr_run):
    cols = [c for c in sr_run.metrics if c.startswith("weight_fwd_dgrad_diff/")]
    assert len(cols) == SMALL.depth and (sr_run.metrics[cols].dropna() == 0).all().all()
    # weights whose rows and columns live on different scales (as trained weights drift to):
    # 1-D blocks along the rows and along the columns then pick different scales
    k = jax.random.split(jax.random.key(2), 4)
    spread = lambda key, shape: jnp.exp2(jax.random.randint(key, shape, -3, 3).astype(jnp.float32))
    p = {f"block_{i}": {"fc1": jax.random.normal(k[2 * i], (32, 128)) * spread(k[2 * i + 1], (32, 1)),
                        "fc2": jax.random.normal(k[2 * i + 1], (128, 32)) * spread(k[2 * i], (1, 32))}
         for i in range(2)}
    one_d = MXSpec("fp4_e2m1", scale_rule="rceil")
    diff = diagnostics.weight_transpose_mismatch(p, one_d, one_d)
    assert diff.shape == (2,) and bool(jnp.all(diff > 0.01))
    tiles = one_d.replace(block_dims=2)
    assert bool(jnp.all(diagnostics.weight_transpose_mismatch(p, tiles, tiles) == 0))
    nv = diagnostics.weight_transpose_mismatch(p, NVFP4, NVFP4)
    assert bool(jnp.all(nv > 0)) and bool(jnp.all(diagnostics.weight_transpose_mismatch(
        p, NVFP4.replace(block_dims=2), NVFP4.replace(block_dims=2)) == 0))


# ----------------------------------------------------------------------------- nGPT under the engine


def test_ngpt_trains_with_unit_norm_weights_after_every_step():
    cfg = SMALL.replace(arch="ngpt", recipe="nvfp4", steps=20, checkpoint_every=10, val_every=10)
    run = mxp.train(cfg, store=False, progress=False)
    assert run.diverged_at is None
    assert run.metrics["loss"].iloc[-1] < 0.5 * run.metrics["loss"].iloc[0]
    assert "head" in run.params and run.metrics["zeta_bound"].notna().sum() == 2
    for state, _ in [run.checkpoints[t] for t in sorted(run.checkpoints)] + [(None, None)]:
        params = run.params if state is None else state.params
        for i in range(cfg.depth):
            b = params[f"block_{i}"]
            np.testing.assert_allclose(np.linalg.norm(b["fc1"], axis=0), 1.0, rtol=2e-6)
            np.testing.assert_allclose(np.linalg.norm(b["fc2"], axis=1), 1.0, rtol=2e-6)


def test_arch_bad_input():
    with pytest.raises(ValueError, match="unknown arch 'gpt'; valid: resmlp, ngpt"):
        mxp.Config(arch="gpt")
