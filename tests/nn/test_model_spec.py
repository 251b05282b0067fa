"""The model spec: names resolved once, bad names refused, one spec handed whole to the student and its blocks."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mx_proxy.nn import activations, architectures, norms
from mx_proxy.nn.inits import InitScheme
from mx_proxy.nn.model_spec import ModelSpec, model_spec
from mx_proxy.nn.resmlp import Student
from mx_proxy.numerics.recipe import PRESETS
from mx_proxy.training.config import Config
from mx_proxy.training.engine import Program, model_spec_of


def test_names_become_entries():
    s = model_spec(24, 2, act="swiglu", norm="rmsnorm", init="xavier_normal", init_gain=0.7)
    assert s.act is activations.get("swiglu") and s.norm is norms.get("rmsnorm")
    assert s.init == InitScheme("xavier_normal", 0.7)
    assert (s.hidden, s.fc1_out) == (64, 128)  # round(8·24/3), two halves
    assert model_spec(24, 2, act=s.act, norm=s.norm) == dataclasses.replace(s, init=InitScheme())
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.width = 8
    assert hash(s) == hash(s.replace())


@pytest.mark.parametrize("field, bad, valid", [("act", "gelu2", "swiglu"), ("norm", "batchnorm", "rmsnorm"),
                                               ("init", "he", "xavier_normal")])
def test_bad_names_refused_naming_the_valid_ones(field, bad, valid):
    with pytest.raises(ValueError, match=f"{bad}.*{valid}"):
        model_spec(8, 1, **{field: bad})


def test_engine_builds_one_spec_from_the_config():
    c = Config(width=16, depth=2, act="relu", norm="layernorm_noaffine", init="xavier_normal", init_gain=0.3,
               recipe="mxfp8_e4m3", reference_recipe="fp32")
    p = Program(c)
    assert p.spec == model_spec_of(c, p.recipe) == model_spec(16, 2, "relu", "layernorm_noaffine", "xavier_normal",
                                                              0.3, p.recipe)
    assert p.student.spec is p.spec
    assert p.reference.spec == p.spec.replace(recipe=PRESETS["fp32"].with_dot(c.dot))


def test_every_block_reads_the_same_spec():
    s = model_spec(16, 3, act="relu", norm="rmsnorm")
    blocks = []

    def keep(next_fun, args, kwargs, context):
        if context.method_name == "__call__" and context.module.name and context.module.name.startswith("block_"):
            blocks.append(context.module)
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(keep):
        p = Student(s).init(jax.random.key(0), jnp.zeros((1, 16)))["params"]
    assert [b.index for b in blocks] == [0, 1, 2] and all(b.spec is s for b in blocks)
    assert list(p) == ["block_0", "block_1", "block_2"] and list(p["block_0"]) == ["ln_gain", "fc1", "fc2", "fc2_bias"]


def test_ngpt_ignores_the_norm():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 16)), jnp.float32)
    outs = []
    for norm in ("layernorm", "none"):
        m = architectures.student("ngpt", model_spec(16, 2, norm=norm))
        outs.append(np.asarray(m.apply(m.init(jax.random.key(1), x), x)))
    np.testing.assert_array_equal(*outs)
    with pytest.raises(ValueError, match="resmlp"):
        architectures.student("mlp", model_spec(16, 2))
    assert isinstance(model_spec(16, 2), ModelSpec)
