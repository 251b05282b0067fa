"""The proxy's student rebuilt from plain flax.linen.Dense/LayerNorm layers plus rules trains bit for bit like
the proxy's own MX student (same parameters, data, steps; the stochastic-rounding keys folded as the proxy folds
them)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiers import unit_and_e2e

from mx_proxy.interop.linen import quantize
from mx_proxy.nn.blocks import layer_names
from mx_proxy.nn.resmlp import Student, model_spec
from mx_proxy.numerics.recipe import PRESETS

WIDTH, DEPTH, STEPS, LR = 32, 2, 3, 0.05


class PlainStudent(nn.Module):
    """The residual MLP as a user writes it: nothing of mx_proxy in it."""

    @nn.compact
    def __call__(self, x):
        for i in range(DEPTH):
            z = nn.LayerNorm(epsilon=1e-5, name=f"block_{i}_ln")(x)
            h = jax.nn.relu(nn.Dense(4 * WIDTH, use_bias=False, name=f"block_{i}_fc1")(z))
            x = x + nn.Dense(WIDTH, name=f"block_{i}_fc2")(h)
        return x


def _to_plain(p):
    out = {}
    for i in range(DEPTH):
        b = p["params"][f"block_{i}"]
        out[f"block_{i}_ln"] = {"scale": b["ln_gain"], "bias": b["ln_bias"]}
        out[f"block_{i}_fc1"] = {"kernel": b["fc1"]}
        out[f"block_{i}_fc2"] = {"kernel": b["fc2"], "bias": b["fc2_bias"]}
    return {"params": out}


def _proxy_fold(key, path):
    """The proxy's folds: block i folds in i, its fc1/fc2 fold in 0/1."""
    block, _, fc = path.rpartition("_")
    return jax.random.fold_in(jax.random.fold_in(key, int(block.split("_")[1])), {"fc1": 0, "fc2": 1}[fc])


def _train(loss, params, xs, ys, keys):
    step = jax.jit(lambda p, x, y, k: jax.tree.map(lambda a, g: a - LR * g, p, jax.grad(loss)(p, x, y, k)))
    for x, y, k in zip(xs, ys, keys):
        params = step(params, x, y, k)
    return params


UNIT_TIER = ("fp32", "bf16", "paper_e4m3", "mxfp8_e4m3", "nvfp4", "mxfp4_2d")
"""The presets the unit tier trains (each kind of code path: full precision, a bf16 cast, the authors'
computation, MX with its E8M0 scale, NVFP4's two-level scale, a 2-D tile); the end-to-end tier trains every
other preset too."""


@pytest.mark.parametrize("name", unit_and_e2e(sorted(PRESETS), lambda n: n in UNIT_TIER))
def test_plain_dense_student_trains_like_the_proxys(name):
    recipe = PRESETS[name]
    proxy = Student(model_spec(WIDTH, DEPTH, act="relu", recipe=recipe))
    xs = jax.random.normal(jax.random.key(1), (STEPS, 16, WIDTH))
    ys = jax.random.normal(jax.random.key(2), (STEPS, 16, WIDTH))
    keys = jax.random.split(jax.random.key(3), STEPS)
    # a stochastic recipe's init rounds too; only the parameters train (not the statistics' perturbations)
    p0 = {"params": proxy.init(jax.random.key(0), xs[0], keys[0])["params"]}
    rules = [(f"block_{i}_{fc}", recipe.for_layer(*layer_names(i, DEPTH, fc))) for i in range(DEPTH)
             for fc in ("fc1", "fc2")] + [("block_*_ln", recipe)]
    q = quantize(PlainStudent(), rules, xs[0])
    assert dict(q.layers) == {f"block_{i}_{s}": k for i in range(DEPTH)
                              for s, k in (("ln", "LayerNorm"), ("fc1", "Dense"), ("fc2", "Dense"))}

    def proxy_loss(p, x, y, k):
        return jnp.mean((proxy.apply(p, x, k) - y) ** 2)

    def plain_loss(p, x, y, k):
        return jnp.mean((q.apply(p, x, rounding_key=k, layer_key=_proxy_fold) - y) ** 2)

    want = _to_plain(_train(proxy_loss, p0, xs, ys, keys))
    got = _train(plain_loss, _to_plain(p0), xs, ys, keys)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), got, want)
    moved = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), want, _to_plain(p0))["params"]
    for layer, leaves in moved.items():
        for leaf, m in leaves.items():  # a recipe that does not train the LN bias freezes it (the paper's)
            assert m == (recipe.train_ln_bias or not (layer.endswith("_ln") and leaf == "bias")), (layer, leaf)
