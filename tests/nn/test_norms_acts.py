"""RMSNorm, LayerNorm without affine, squared ReLU and SiLU: the math against
numpy, the MX treatment of the RMSNorm gain, and short training runs in FP32
and two MX recipes with the metric columns each norm should (not) produce."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import mx_proxy as mxp
from mx_proxy.nn.layers import ACTIVATIONS, activation, layer_norm, quantize_affine, rms_norm
from mx_proxy.nn.resmlp import NORMS, Student, Teacher, model_spec
from mx_proxy.numerics import recipe as recipes
from mx_proxy.numerics.quantize import MXSpec
from mx_proxy.training import controllers, diagnostics

FP32, BF16, E4M3 = recipes.get("fp32"), recipes.get("bf16"), recipes.get("mxfp8_e4m3")
EPS = 1e-5


def _x(shape=(16, 64), seed=0, scale=1.5):
    return np.asarray(jax.random.normal(jax.random.key(seed), shape) * scale, np.float32)


def _bf16_away(a):
    """bf16 rounding with ties away from zero, on the bits: half a bf16 ulp added to the magnitude, then cut."""
    bits = np.asarray(a, np.float32).view(np.uint32)
    return ((bits + np.uint32(0x8000)) & np.uint32(0xFFFF0000)).view(np.float32)


def _bf16(a):
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


NP_ACTS = {
    "relu2": lambda x: np.square(np.maximum(x, 0.0)),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
}
NP_ACT_GRADS = {
    "relu2": lambda x: 2.0 * np.maximum(x, 0.0),
    "silu": lambda x: (s := 1.0 / (1.0 + np.exp(-x))) + x * s * (1.0 - s),
}


def test_new_names_are_registered():
    assert {"relu2", "silu"} <= set(ACTIVATIONS)
    assert {"rmsnorm", "layernorm_noaffine"} <= set(NORMS)


@pytest.mark.parametrize("name", ["relu2", "silu"])
def test_activation_fp32_values_and_gradients_match_numpy(name):
    x = _x()
    y, vjp = jax.vjp(lambda v: activation(name, v, FP32), jnp.asarray(x))
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(np.asarray(y), NP_ACTS[name](x64), rtol=2e-6, atol=1e-7)
    (dx,) = vjp(jnp.ones_like(y))
    np.testing.assert_allclose(np.asarray(dx), NP_ACT_GRADS[name](x64), rtol=2e-6, atol=1e-7)


def test_relu2_in_bf16_rounds_input_and_output_exactly():
    x = _x(seed=1)
    y = np.asarray(activation("relu2", jnp.asarray(x), BF16))
    xb = _bf16(x)
    # the square of a bf16 value is exact in float32, so one rounding of it is the whole story
    np.testing.assert_array_equal(y, _bf16(np.square(np.maximum(xb, 0.0))))


def test_silu_in_bf16_is_bf16_valued_and_close():
    x = _x(seed=2)
    y, vjp = jax.vjp(lambda v: activation("silu", v, BF16), jnp.asarray(x))
    y = np.asarray(y)
    np.testing.assert_array_equal(y, _bf16(y))
    ref = NP_ACTS["silu"](_bf16(x).astype(np.float64))
    np.testing.assert_allclose(y, ref, rtol=2 ** -8, atol=1e-6)
    (dx,) = vjp(jnp.asarray(_x(seed=3)))
    np.testing.assert_array_equal(np.asarray(dx), _bf16(dx))  # the backward is rounded to bf16 too
    # act_precision="fp32" (the paper's authors' setting) keeps the function itself in float32
    y32 = np.asarray(activation("silu", jnp.asarray(x), BF16.replace(act_precision="fp32")))
    np.testing.assert_allclose(y32, NP_ACTS["silu"](x.astype(np.float64)), rtol=2e-6, atol=1e-7)


def test_unknown_activation_names_the_new_ones():
    with pytest.raises(ValueError, match="relu2.*silu"):
        activation("swish", jnp.zeros(4), FP32)


def _np_rms(x, g):
    x = x.astype(np.float64)
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS)
    return x * r * g, r


def test_rms_norm_fp32_values_and_gradients_match_numpy():
    x, dy = _x(seed=4), _x(seed=5, scale=1.0)
    g = (1.0 + 0.1 * _x((64,), seed=6, scale=1.0)).astype(np.float32)
    y, vjp = jax.vjp(lambda a, b: rms_norm(a, b, FP32), jnp.asarray(x), jnp.asarray(g))
    ey, r = _np_rms(x, g)
    np.testing.assert_allclose(np.asarray(y), ey, rtol=1e-5, atol=1e-6)
    dx, dg = vjp(jnp.asarray(dy))
    gd = g * dy.astype(np.float64)
    x64 = x.astype(np.float64)
    edx = r * gd - x64 * r ** 3 * np.mean(x64 * gd, axis=-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(dx), edx, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(dg), np.sum(dy * x64 * r, axis=0), rtol=1e-4, atol=1e-5)
    # RMSNorm is LayerNorm without the centring: equal on zero-mean rows
    xc = x - x.mean(axis=-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(rms_norm(jnp.asarray(xc), jnp.asarray(g), FP32)),
                               np.asarray(layer_norm(jnp.asarray(xc), jnp.asarray(g), None, FP32)),
                               rtol=1e-5, atol=1e-6)


def test_rms_norm_rounds_in_the_ln_precision():
    x, g = _x(seed=7), np.full(64, 1.0, np.float32)
    y, vjp = jax.vjp(lambda a: rms_norm(a, jnp.asarray(g), BF16), jnp.asarray(x))
    y = np.asarray(y)
    np.testing.assert_array_equal(y, _bf16(y))
    np.testing.assert_allclose(y, _np_rms(_bf16(x), g)[0], rtol=2 ** -6, atol=1e-3)
    (dx,) = vjp(jnp.asarray(_x(seed=8)))
    np.testing.assert_array_equal(np.asarray(dx), _bf16(dx))
    # ln_precision="fp32" (ln_exempt) is the float32 formula, bit for bit
    ex = recipes.get("ln_exempt")
    np.testing.assert_array_equal(np.asarray(rms_norm(jnp.asarray(x), jnp.asarray(g), ex)),
                                  np.asarray(rms_norm(jnp.asarray(x), jnp.asarray(g), FP32)))
    # stats_fp32: mean square unrounded, the rest in bf16 (outputs bf16-valued, forward differs from "vector")
    st = BF16.replace(ln_precision="stats_fp32")
    ys = np.asarray(rms_norm(jnp.asarray(x), jnp.asarray(g), st))
    np.testing.assert_array_equal(ys, _bf16(ys))
    (dxs,) = jax.vjp(lambda a: rms_norm(a, jnp.asarray(g), st), jnp.asarray(x))[1](jnp.asarray(_x(seed=8)))
    assert not np.array_equal(np.asarray(dxs), _bf16(dxs))  # its backward runs in float32


def _clustered_gains(centre=0.95, n=64, seed=9):
    z = np.asarray(jax.random.normal(jax.random.key(seed), (n,)))
    return (centre * np.exp(0.005 * z)).astype(np.float32)


def test_mx_quantized_rmsnorm_gain_clamps_like_layernorm():
    gains = _clustered_gains()
    assert 0.9 < gains.min() and gains.max() < 0.99
    q = np.asarray(quantize_affine(jnp.asarray(gains), E4M3))
    np.testing.assert_array_equal(q, np.full_like(gains, 0.875))  # E4M3 floor scale: 486/512 > 448/512
    x = _x((8, 64), seed=10)
    unquantized = E4M3.replace(ln_affine=None)
    np.testing.assert_array_equal(np.asarray(rms_norm(jnp.asarray(x), jnp.asarray(gains), E4M3)),
                                  np.asarray(rms_norm(jnp.asarray(x), jnp.asarray(q), unquantized)))
    # the straight-through gradient reaches the raw gain
    dg = jax.grad(lambda g: jnp.sum(rms_norm(jnp.asarray(x), g, E4M3)))(jnp.asarray(gains))
    assert np.all(np.isfinite(dg)) and np.any(np.asarray(dg) != 0)
    # the diagnostics count it as clamped, with or without a bias beside it
    spec = MXSpec("fp8_e4m3")
    rms = diagnostics.ln_statistics({"block_0": {"ln_gain": gains}, "block_1": {"ln_gain": gains}}, spec)
    ln = diagnostics.ln_statistics({"block_0": {"ln_gain": gains, "ln_bias": np.zeros(64, np.float32)}}, spec)
    np.testing.assert_array_equal(np.asarray(rms["ln_clamp_frac"]), [1.0, 1.0])
    np.testing.assert_array_equal(np.asarray(ln["ln_clamp_frac"]), [1.0])
    assert set(ln) - set(rms) == {"ln_bias_mean", "ln_bias_var"}
    assert diagnostics.ln_statistics({"block_0": {"fc1": gains}}, spec) == {}


def _student(norm, act="gelu", width=32, depth=2):
    m = Student(model_spec(width=width, depth=depth, act=act, norm=norm))
    return m, m.init(jax.random.key(0), jnp.zeros((1, width)))["params"]


def test_student_parameters_per_norm():
    _, p = _student("rmsnorm")
    assert set(p["block_0"]) == {"ln_gain", "fc1", "fc2", "fc2_bias"}
    assert np.all(np.asarray(p["block_0"]["ln_gain"]) == 1)
    _, p = _student("layernorm_noaffine")
    assert set(p["block_0"]) == {"fc1", "fc2", "fc2_bias"}
    with pytest.raises(ValueError, match="rmsnorm.*layernorm_noaffine"):
        _student("batchnorm")
    with pytest.raises(ValueError, match="layernorm_noaffine"):
        mxp.Config(norm="batchnorm")


def test_noaffine_student_is_layernorm_with_unit_gain_and_zero_bias():
    x = jnp.asarray(_x((8, 32), seed=11))
    m0, p0 = _student("layernorm_noaffine")
    m1, _ = _student("layernorm")
    p1 = {b: dict(v, ln_gain=jnp.ones(32), ln_bias=jnp.zeros(32)) for b, v in p0.items()}
    for r in (FP32, BF16):
        y0 = m0.clone(spec=m0.spec.replace(recipe=r)).apply({"params": p0}, x)
        y1 = m1.clone(spec=m1.spec.replace(recipe=r)).apply({"params": p1}, x)
        np.testing.assert_array_equal(np.asarray(y0), np.asarray(y1))


def test_controller_units_of_the_new_norms():
    m, p = _student("rmsnorm")
    norms = np.asarray(controllers.unit_norms(p))
    assert norms[0] == pytest.approx(np.sqrt(32.0))  # block_0/ln: the unit gain, ‖1‖ over 32 features
    _, p = _student("layernorm_noaffine")
    assert np.asarray(controllers.unit_norms(p))[0] == 0.0  # no LN parameters: never fires


@pytest.mark.parametrize("act", ["relu2", "silu"])
def test_teacher_with_new_activation_matches_numpy(act):
    t = Teacher(width=16, hidden=24, depth=2, act=act)
    p = t.init(jax.random.key(1), jnp.zeros((1, 16)))["params"]
    x = _x((5, 16), seed=12, scale=1.0)
    h = x.astype(np.float64)
    for i in range(2):
        h = NP_ACTS[act](h @ np.asarray(p[f"fc1_{i}"], np.float64)) @ np.asarray(p[f"fc2_{i}"], np.float64)
    np.testing.assert_allclose(np.asarray(t.apply({"params": p}, jnp.asarray(x))), h, rtol=1e-4, atol=1e-5)


TINY = mxp.Config(width=32, depth=2, batch=32, steps=6, lr=3e-3, diagnostics_every=2, val_every=2, val_batches=1)
CELLS = [("rmsnorm", "relu2"), ("layernorm_noaffine", "silu")]


@pytest.mark.e2e
@pytest.mark.parametrize("norm,act", CELLS)
def test_new_norms_and_acts_train_in_fp32_and_mx(norm, act):
    runs = mxp.sweep(TINY.replace(norm=norm, act=act), recipe=["fp32", "mxfp8_e4m3", "paper_e4m3"],
                       store=False, progress=False).runs
    for run in runs:
        m = run.metrics
        name = run.config.recipe.name
        assert run.config.teacher[2] == act  # the teacher uses the same activation
        assert run.diverged_at is None and len(m) == TINY.steps, name
        assert np.all(np.isfinite(m["loss"])) and m["loss"].iloc[-1] < m["loss"].iloc[0], name
        d = m.dropna(subset=["zeta_bound"])
        assert list(d.step) == [0, 2, 4]
        if name == "fp32":
            assert np.all(d.zeta_bound == 0) and np.all(d.cosine == 1)
        else:
            assert np.all(d.zeta_bound > 0) and np.all(d.cosine < 1), name
        ln_cols = {c for c in m.columns if c.startswith("ln_")}
        blocks = set(run.params)
        if norm == "rmsnorm":
            assert {"ln_clamp_frac", "ln_clamp_frac/block_0", "ln_last_bin_frac/block_1", "ln_gain_mean/block_0",
                    "ln_gain_var/block_1"} <= ln_cols, name
            assert not any(c.startswith("ln_bias") for c in ln_cols), name
            assert np.all(d[["ln_clamp_frac", "ln_gain_mean/block_0"]].notna().to_numpy())
            assert all("ln_gain" in run.params[b] and "ln_bias" not in run.params[b] for b in blocks)
            gains = np.asarray(run.params["block_0"]["ln_gain"])
            assert np.any(gains != 1)  # the gain trains
        else:
            assert ln_cols == set(), (name, sorted(ln_cols))
            assert all(set(run.params[b]) == {"fc1", "fc2", "fc2_bias"} for b in blocks)


def test_train_ln_bias_gives_the_authors_layernorm_the_bias_gradient_its_backward_computes():
    """paper_e4m3 freezes the LN bias (zero gradient); with ``train_ln_bias`` it gets the sum of the output
    gradient over the rows, in bf16 with ties away from zero (the recipe's LN backward; a sum of bf16 values often
    lands on a tie), and the input and gain gradients are unchanged."""
    x, g = _x(), _x(seed=1, scale=0.3)
    gain, bias = np.full(64, 0.93, np.float32), np.linspace(-0.1, 0.1, 64, dtype=np.float32)
    frozen = recipes.get("paper_e4m3")
    trained = mxp.mitigate(frozen, "train_ln_bias")
    assert trained.train_ln_bias and trained == frozen.replace(name="paper_e4m3+train_ln_bias", train_ln_bias=True)
    assert mxp.mitigate("mxfp8_e4m3", "train_ln_bias").train_ln_bias  # already trained: unchanged but its name

    def grads(r):
        _, vjp = jax.vjp(lambda a, w, b: layer_norm(a, w, b, r), x, gain, bias)
        return [np.asarray(v) for v in vjp(jnp.asarray(g))]

    dx0, dgain0, dbias0 = grads(frozen)
    dx1, dgain1, dbias1 = grads(trained)
    assert not dbias0.any()
    np.testing.assert_array_equal(dbias1, _bf16_away(_bf16_away(g).sum(axis=0, dtype=np.float32)))
    np.testing.assert_array_equal(dx1, dx0)
    np.testing.assert_array_equal(dgain1, dgain0)
