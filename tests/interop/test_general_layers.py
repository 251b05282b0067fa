"""DenseGeneral, Einsum, LayerNorm and RMSNorm in unmodified Linen and NNX models quantized with one call: each
layer computes (forward and gradients, bit for bit) what mx_dot_general, mx_einsum and the proxy's norms compute
called directly on the same parameters; bad rules refused before any work, the model left as it was."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mx_proxy.interop.dot_general import mx_dot_general
from mx_proxy.interop.einsum import mx_einsum
from mx_proxy.interop.linen import quantize
from mx_proxy.interop.nnx_model import quantize_nnx
from mx_proxy.nn.norms.layernorm import layer_norm
from mx_proxy.nn.norms.rmsnorm import rms_norm
from mx_proxy.numerics.recipe import PRESETS

R = PRESETS["mxfp8_e4m3"]
EPS = 1e-6  # Flax's default epsilon of both norms
DENSE_DIMS = (((1,), (0,)), ((), ()))  # DenseGeneral over the last axis of a (batch, features) input
X = jax.random.normal(jax.random.key(0), (8, 32))


class Mixed(nn.Module):
    """LayerNorm -> DenseGeneral to (heads, dim) -> RMSNorm -> Einsum back to features: a user's Linen model."""

    @nn.compact
    def __call__(self, x):
        h = nn.LayerNorm(name="ln")(x)
        h = nn.DenseGeneral((2, 32), name="proj")(h)
        h = nn.RMSNorm(name="rms")(h)
        return nn.Einsum((2, 32, 32), "bhd,hdo->bo", name="mix")(h)


def _direct(p, x):
    """Mixed's computation from the interop functions called directly."""
    h = layer_norm(x, p["ln"]["scale"], p["ln"]["bias"], R, EPS)
    h = mx_dot_general(h, p["proj"]["kernel"], DENSE_DIMS, R) + p["proj"]["bias"]
    h = rms_norm(h, p["rms"]["scale"], R, EPS)
    return mx_einsum("bhd,hdo->bo", h, p["mix"]["kernel"], R) + p["mix"]["bias"]


def _equal(a, b):
    jax.tree.map(lambda u, v: np.testing.assert_array_equal(np.asarray(u), np.asarray(v)), a, b)


def test_linen_general_layers_and_norms_compute_the_interop_functions():
    q = quantize(Mixed(), {"*": "mxfp8_e4m3"}, X)
    assert dict(q.layers) == {"ln": "LayerNorm", "proj": "DenseGeneral", "rms": "RMSNorm", "mix": "Einsum"}
    params = Mixed().init(jax.random.key(1), X)
    _equal(q.init(jax.random.key(1), X), params)  # the same parameter tree, values and PRNG streams
    got = q.apply(params, X)
    _equal(got, _direct(params["params"], X))
    assert not np.array_equal(np.asarray(got), np.asarray(Mixed().apply(params, X)))  # it did quantize
    y = jax.random.normal(jax.random.key(2), got.shape)
    grads = jax.grad(lambda p: jnp.sum((q.apply(p, X) - y) ** 2))(params)
    want = jax.grad(lambda p: jnp.sum((_direct(p["params"], X) - y) ** 2))(params)
    _equal(grads, want)


class NnxMixed(nnx.Module):
    """The same model in NNX, written as a user writes it."""

    def __init__(self, rngs):
        self.ln = nnx.LayerNorm(32, rngs=rngs)
        self.proj = nnx.LinearGeneral(32, (2, 32), rngs=rngs)
        self.rms = nnx.RMSNorm(32, rngs=rngs)
        self.mix = nnx.Einsum("bhd,hdo->bo", (2, 32, 32), (32,), rngs=rngs)

    def __call__(self, x):
        return self.mix(self.rms(self.proj(self.ln(x))))


def test_nnx_general_layers_and_norms_compute_the_interop_functions():
    m = NnxMixed(nnx.Rngs(0))
    before = jax.tree.map(np.asarray, nnx.state(m, nnx.Param))
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(before)[0]]
    plain = np.asarray(m(X))
    p = {k: {n: v[...] for n, v in vars(getattr(m, k)).items() if isinstance(v, nnx.Param)}
         for k in ("ln", "proj", "rms", "mix")}
    assert quantize_nnx(m, "mxfp8_e4m3") is m
    after = nnx.state(m, nnx.Param)
    assert [p for p, _ in jax.tree_util.tree_flatten_with_path(after)[0]] == paths  # an optimizer still fits
    _equal(jax.tree.map(np.asarray, after), before)
    got = m(X)
    _equal(got, _direct(p, X))
    assert not np.array_equal(np.asarray(got), plain)


class Outer(nn.Module):
    @nn.compact
    def __call__(self, x):
        init = nn.initializers.normal()
        return nn.Einsum((4,), "bi,o->bio", use_bias=False, kernel_init=init, name="outer")(x)


def test_a_product_with_no_contracting_axis_is_refused_at_quantize():
    with pytest.raises(ValueError, match="contract no axis"):
        quantize(Outer(), {"outer": "mxfp8_e4m3"}, X)
    assert Outer().apply(Outer().init(jax.random.key(0), X), X).shape == (8, 32, 4)  # plain Flax runs it


@pytest.mark.parametrize("rules, match", [({"nope": "mxfp8_e4m3"}, r"match no layer.*ln \(LayerNorm\)"),
                                          ({"*": "mxfp9"}, "unknown recipe 'mxfp9'"),
                                          ([("proj", "mxfp8_e4m3"), "mxfp4"], "a Rule or a")])
def test_nnx_bad_rules_leave_the_model_unchanged(rules, match):
    m = NnxMixed(nnx.Rngs(0))
    with pytest.raises(ValueError, match=match):
        quantize_nnx(m, rules)
    assert type(m.ln) is nnx.LayerNorm and type(m.rms) is nnx.RMSNorm
    assert m.proj.dot_general in (None, jax.lax.dot_general)
    assert m.mix.einsum_op is jnp.einsum
