"""The hypersphere-normalized (nGPT-style) student of mx_proxy.nn.ngpt.

Every model call is jitted through a few cached programs (compiling once per
recipe is far cheaper than dispatching the model's ops one by one)."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mx_proxy.nn import architectures, layers, ngpt
from mx_proxy.nn import resmlp as model
from mx_proxy.numerics.recipe import PRESETS

D, DEPTH, B = 32, 2, 64
SR = PRESETS["mxfp8_e4m3"].map_specs(lambda s: s.replace(rounding="stochastic"))
RECIPES = {"sr": SR}

# bf16 unit roundoff (8-bit significand, round to nearest): u = 2^-8. The
# sphere norm computes ss = fl(Σ fl(x_i²)) (relative error ≤ 2u, a weighted
# mean of the terms' errors, then the sum's), inv = fl(rsqrt(ss)) (≤ ½·2u + u
# = 2u) and y_i = fl(x_i·inv) (≤ u each, so ≤ u on ‖y‖): to first order
# |‖y‖ − 1| ≤ 3u. The test takes the norm in float32 of exactly representable
# bf16 values, which adds only float32 error (1% slack covers both).
BF16_NORM_TOL = 3 * 2.0**-8 * 1.01
FP32_NORM_TOL = 1e-6


def _recipe(name):
    return None if name is None else RECIPES.get(name) or PRESETS[name]


def _x(seed=0, n=B, scale=1.0):
    return scale * jax.random.normal(jax.random.key(seed), (n, D), jnp.float32)


def _apply(m, p, x, key=None, promote=None):
    y, st = m.apply({"params": p}, x, key, promote, mutable=["intermediates"])
    return y, st["intermediates"]


@functools.cache
def _init_fn(act, depth):
    return jax.jit(ngpt.NGPTStudent(model.model_spec(width=D, depth=depth, act=act)).init)


def _params(seed=1, act="gelu", depth=DEPTH):
    return _init_fn(act, depth)(jax.random.key(seed), jnp.zeros((1, D)))["params"]


@functools.cache
def _forward(recipe="fp32", high=None, act="gelu", depth=DEPTH):
    """jitted (p, x, key=None, promote=None) -> (y, intermediates)."""
    m = ngpt.NGPTStudent(model.model_spec(width=D, depth=depth, act=act, recipe=_recipe(recipe),
                                                       high_recipe=_recipe(high)))
    return jax.jit(functools.partial(_apply, m))


@functools.cache
def _grads(recipe="fp32"):
    """jitted (p, x, target) -> gradients of the MSE."""
    m = ngpt.NGPTStudent(model.model_spec(width=D, depth=DEPTH, recipe=_recipe(recipe)))
    return jax.jit(jax.grad(lambda q, x, t: jnp.mean(jnp.square(m.apply({"params": q}, x) - t))))


def _norm_err(h):
    return float(jnp.max(jnp.abs(jnp.linalg.norm(h, axis=-1) - 1.0)))


@pytest.mark.parametrize("act", ["gelu", "swiglu"])
def test_factory_param_names_shapes_and_init(act):
    m = architectures.student("ngpt", model.model_spec(width=D, depth=3, act=act, recipe=PRESETS["mxfp8_e4m3"],
                                                        norm="layernorm"))
    assert isinstance(m, ngpt.NGPTStudent) and m.spec.recipe == PRESETS["mxfp8_e4m3"]
    p = _params(act=act, depth=3)
    assert jax.tree.structure(jax.eval_shape(m.init, jax.random.key(1), jnp.zeros((1, D)))["params"]) == \
        jax.tree.structure(p)
    h = model.hidden_width(D, act)
    f = 2 * h if act == "swiglu" else h
    assert set(p) == {"block_0", "block_1", "block_2", "head"}
    assert set(p["head"]) == {"scale"} and p["head"]["scale"].shape == (D,)
    for i in range(3):
        b = p[f"block_{i}"]
        assert set(b) == {"fc1", "fc2", "alpha", "s_u"}
        assert b["fc1"].shape == (D, f) and b["fc2"].shape == (h, D)
        assert b["alpha"].shape == (D,) and b["s_u"].shape == (f,)
        np.testing.assert_allclose(b["alpha"], 1 / math.sqrt(D), rtol=1e-6)
        np.testing.assert_allclose(b["alpha"] * ngpt.alpha_init(3) * math.sqrt(D), 1 / 3, rtol=1e-6)  # effective α
        np.testing.assert_array_equal(b["s_u"], 1.0)
        # unit vectors along the embedding dimension: fc1 columns, fc2 rows
        np.testing.assert_allclose(jnp.linalg.norm(b["fc1"], axis=0), 1.0, atol=FP32_NORM_TOL)
        np.testing.assert_allclose(jnp.linalg.norm(b["fc2"], axis=1), 1.0, atol=FP32_NORM_TOL)
    np.testing.assert_array_equal(p["head"]["scale"], np.float32(ngpt.HEAD_INIT))


@pytest.mark.parametrize("act", ["gelu", "swiglu"])
def test_hidden_states_unit_norm_fp32(act):
    p = _params(act=act, depth=3)
    y, inter = _forward(act=act, depth=3)(p, _x(scale=5.0))
    h = model.hidden_width(D, act)
    assert y.shape == (B, D)
    assert inter["block_0"]["fc1_in"][0].shape == (B, D) and inter["block_0"]["fc2_in"][0].shape == (B, h)
    assert _norm_err(inter["block_0"]["fc1_in"][0]) < FP32_NORM_TOL  # Norm(x)
    for i in range(3):
        assert _norm_err(inter[f"block_{i}"]["hidden"][0]) < FP32_NORM_TOL
        if i:
            np.testing.assert_array_equal(inter[f"block_{i}"]["fc1_in"][0], inter[f"block_{i - 1}"]["hidden"][0])
    # the head scales the last hidden state per dimension
    np.testing.assert_allclose(y, inter["block_2"]["hidden"][0] * ngpt.HEAD_INIT * math.sqrt(D), rtol=1e-6)


def test_hidden_states_unit_norm_mx():
    p, x = _params(), _x(scale=3.0)
    _, inter = _forward("mxfp8_e4m3")(p, x)
    errs = []
    for i in range(DEPTH):
        h = inter[f"block_{i}"]["hidden"][0]
        np.testing.assert_array_equal(h, layers.vround(h, "bf16"))  # the residual stream is in bf16
        errs.append(_norm_err(h))
    assert max(errs) < BF16_NORM_TOL, errs
    assert max(errs) > FP32_NORM_TOL  # really rounded
    # ln_precision="fp32" keeps the normalization math in float32
    _, inter = _forward("ln_exempt")(p, x)
    for i in range(DEPTH):
        assert _norm_err(inter[f"block_{i}"]["hidden"][0]) < FP32_NORM_TOL


def test_normalize_weights_after_adam():
    p = p0 = _params()
    x, target = _x(0), _x(7)
    tx = optax.adam(1e-2)
    opt = tx.init(p)
    for _ in range(3):
        u, opt = tx.update(_grads()(p, x, target), opt, p)
        p = optax.apply_updates(p, u)
    drift = max(float(jnp.max(jnp.abs(jnp.linalg.norm(p[f"block_{i}"]["fc1"], axis=0) - 1))) for i in range(DEPTH))
    assert drift > 1e-3  # the steps left the sphere
    normalize = jax.jit(ngpt.normalize_weights)
    q = normalize(p)
    assert jax.tree.structure(q) == jax.tree.structure(p)
    for i in range(DEPTH):
        b, c = p[f"block_{i}"], q[f"block_{i}"]
        np.testing.assert_allclose(jnp.linalg.norm(c["fc1"], axis=ngpt.WEIGHT_NORM_AXES["fc1"]), 1.0,
                                   atol=FP32_NORM_TOL)
        np.testing.assert_allclose(jnp.linalg.norm(c["fc2"], axis=ngpt.WEIGHT_NORM_AXES["fc2"]), 1.0,
                                   atol=FP32_NORM_TOL)
        for k in ("alpha", "s_u"):
            np.testing.assert_array_equal(c[k], b[k])
            assert not np.allclose(b[k], p0[f"block_{i}"][k])  # Adam did move them
        # a projection: each vector keeps its direction
        np.testing.assert_allclose(c["fc1"] * jnp.linalg.norm(b["fc1"], axis=0), b["fc1"], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(c["fc2"] * jnp.linalg.norm(b["fc2"], axis=1, keepdims=True), b["fc2"],
                                   rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(q["head"]["scale"], p["head"]["scale"])
    # idempotent
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-7), normalize(q), q)
    # a leading (vmapped) member axis
    ns = normalize(jax.tree.map(lambda a, b: jnp.stack([a, b]), p, _params(seed=5)))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
                 jax.tree.map(lambda a: a[0], ns), q)
    np.testing.assert_allclose(jnp.linalg.norm(ns["block_1"]["fc1"], axis=-2), 1.0, atol=FP32_NORM_TOL)
    np.testing.assert_allclose(jnp.linalg.norm(ns["block_1"]["fc2"], axis=-1), 1.0, atol=FP32_NORM_TOL)


def test_training_learns_teacher():
    # measured: the held-out loss falls ~11-12x in 100 steps (seeds 0-4), from
    # ~3.0-3.5 to ~0.26-0.31 of E[y²] (the loss of predicting zero).
    m = architectures.student("ngpt", model.model_spec(width=D, depth=DEPTH))
    teacher = model.Teacher(width=D, hidden=D, depth=DEPTH)
    tp = teacher.init(jax.random.key(10), jnp.zeros((1, D)))
    p = ngpt.normalize_weights(_params())
    tx = optax.adam(3e-3)
    xv = _x(11, n=1024)
    yv = teacher.apply(tp, xv)
    loss = lambda q, x, y: jnp.mean(jnp.square(m.apply({"params": q}, x) - y))

    @jax.jit
    def train(p):
        def one(c, i):
            p, opt = c
            x = jax.random.normal(jax.random.fold_in(jax.random.key(12), i), (B, D))
            g = jax.grad(loss)(p, x, teacher.apply(tp, x))
            u, opt = tx.update(g, opt, p)
            return (ngpt.normalize_weights(optax.apply_updates(p, u)), opt), None

        p1 = jax.lax.scan(one, (p, tx.init(p)), jnp.arange(100))[0][0]
        return loss(p, xv, yv), loss(p1, xv, yv), p1

    l0, l1, p1 = train(p)
    l0, l1, var = float(l0), float(l1), float(jnp.mean(jnp.square(yv)))
    assert l0 / l1 > 6.0, (l0, l1)
    assert l1 < 0.5 * var, (l1, var)
    for i in range(DEPTH):
        np.testing.assert_allclose(jnp.linalg.norm(p1[f"block_{i}"]["fc1"], axis=0), 1.0, atol=FP32_NORM_TOL)


def test_stochastic_rounding_keys():
    p, x = _params(), _x()  # (init runs without a key only under a deterministic recipe)
    f = _forward("sr")
    y1, i1 = f(p, x, jax.random.key(3))
    y2, _ = f(p, x, jax.random.key(3))
    y3, _ = f(p, x, jax.random.key(4))
    np.testing.assert_array_equal(y1, y2)
    assert not np.array_equal(y1, y3)
    with pytest.raises(ValueError, match="PRNG key"):
        ngpt.NGPTStudent(model.model_spec(width=D, depth=DEPTH, recipe=SR)).apply({"params": p}, x)
    # key folding as model.Student: block i folds in i, its fc1 folds in 0
    r = SR.for_layer(*model.layer_names(0, DEPTH, "fc1"))
    k00 = jax.random.fold_in(jax.random.fold_in(jax.random.key(3), 0), 0)

    @jax.jit
    def block0_fc2_in(p, x):
        u = layers.mx_dense(ngpt.sphere_norm(x, "bf16"), p["block_0"]["fc1"], None, r, k00)
        u = layers.vround(u * layers.vround(p["block_0"]["s_u"] * math.sqrt(D), "bf16"), "bf16")
        return layers.activation("gelu", u, SR)

    np.testing.assert_allclose(block0_fc2_in(p, x), i1["block_0"]["fc2_in"][0], rtol=0, atol=1e-6)
    # promote all-False is no promote, stochastic rounding included
    y0, _ = _forward("sr", "fp32")(p, x, jax.random.key(3), jnp.zeros((DEPTH, 2), bool))
    np.testing.assert_array_equal(y0, y1)


def test_promote():
    p, x = _params(), _x()
    run = _forward("mxfp8_e4m3", "fp32")
    ones, zeros = jnp.ones((DEPTH, 2), bool), jnp.zeros((DEPTH, 2), bool)
    y_ref, i_ref = _forward()(p, x)
    y_none, i_none = _forward("mxfp8_e4m3")(p, x)
    y, inter = run(p, x, None, ones)
    np.testing.assert_array_equal(y, y_ref)
    jax.tree.map(np.testing.assert_array_equal, inter, i_ref)
    y, inter = run(p, x, None, zeros)
    np.testing.assert_array_equal(y, y_none)
    jax.tree.map(np.testing.assert_array_equal, inter, i_none)
    # each unit alone changes the output
    for i in range(DEPTH):
        for j in range(2):
            y, _ = run(p, x, None, zeros.at[i, j].set(True))
            assert not np.array_equal(y, y_none) and not np.array_equal(y, y_ref), (i, j)


@pytest.mark.parametrize("recipe", ["fp32", "mxfp8_e4m3"])
def test_gradients_reach_every_parameter(recipe):
    g = _grads(recipe)(_params(), _x(0), _x(7))
    for path, leaf in jax.tree_util.tree_leaves_with_path(g):
        assert bool(jnp.all(jnp.isfinite(leaf))), path
        assert float(jnp.linalg.norm(leaf)) > 0, path
        if leaf.ndim == 1:  # alpha, s_u, head/scale: (nearly) every entry gets a gradient
            assert float(jnp.mean((leaf != 0).astype(jnp.float32))) > 0.9, path
