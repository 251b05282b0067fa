"""One call on an unmodified Linen and NNX model; the drop-ins; bad rules refused before any work."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mx_proxy.interop.layers import MXDotGeneral
from mx_proxy.interop.linen import quantize
from mx_proxy.interop.nnx_model import quantize_nnx
from mx_proxy.nn.dense import mx_dense
from mx_proxy.numerics.recipe import PRESETS

R = PRESETS["mxfp8_e4m3"]


class Mlp(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(8, name="out")(jax.nn.relu(nn.Dense(32, name="hidden")(x)))


def test_linen_rules_first_match_wins_and_unmatched_stay_fp32():
    x = jax.random.normal(jax.random.key(0), (4, 32))
    q = quantize(Mlp(), [("hidden", "mxfp8_e4m3"), ("*", "fp32"), ("out", "mxfp4")], x)
    assert list(q.table()["recipe"]) == ["mxfp8_e4m3", "fp32"]
    p = Mlp().init(jax.random.key(1), x)
    h = mx_dense(x, p["params"]["hidden"]["kernel"], p["params"]["hidden"]["bias"], R)
    want = mx_dense(jax.nn.relu(h), p["params"]["out"]["kernel"], p["params"]["out"]["bias"], PRESETS["fp32"])
    np.testing.assert_array_equal(np.asarray(q.apply(p, x)), np.asarray(want))


def test_dense_drop_in_is_the_dense_layer_without_bias_rounding():
    x = jax.random.normal(jax.random.key(0), (4, 32))
    layer = nn.Dense(16, use_bias=False, dot_general=MXDotGeneral("mxfp8_e4m3"))
    p = layer.init(jax.random.key(1), x)
    want = mx_dense(x, p["params"]["kernel"], None, R)
    np.testing.assert_array_equal(np.asarray(layer.apply(p, x)), np.asarray(want))


def test_nnx_model_in_one_call_keeps_its_state():
    class Net(nnx.Module):
        def __init__(self, rngs):
            self.fc = nnx.Linear(32, 8, rngs=rngs)

        def __call__(self, x):
            return self.fc(x)

    m = Net(nnx.Rngs(0))
    kernel, bias = m.fc.kernel[...], m.fc.bias[...]
    x = jax.random.normal(jax.random.key(0), (4, 32))
    quantize_nnx(m, {"fc": "mxfp8_e4m3"})
    np.testing.assert_array_equal(np.asarray(m(x)), np.asarray(mx_dense(x, kernel, bias, R)))


@pytest.mark.parametrize("rules, match", [([("nope/*", "mxfp8_e4m3")], "match no layer"),
                                          ([("*", "mxfp9")], "mxfp9")])
def test_bad_rules_are_refused_before_any_work(rules, match):
    with pytest.raises(ValueError, match=match):
        quantize(Mlp(), rules, jnp.ones((4, 32)))
