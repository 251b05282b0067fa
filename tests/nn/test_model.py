"""Student and teacher shapes, parameter counts, initialization."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mx_proxy.nn.resmlp import Student, Teacher, hidden_width, model_spec


def _params(act, width=48, depth=3, norm="layernorm", init="pytorch"):
    m = Student(model_spec(width=width, depth=depth, act=act, norm=norm, init=init))
    return m.init(jax.random.key(0), jnp.zeros((1, width)))["params"]


@pytest.mark.parametrize("act", ["gelu", "relu", "tanh", "linear", "swiglu"])
def test_student_shapes_and_counts(act):
    d, L = 48, 3
    p = _params(act, d, L)
    assert sorted(p) == [f"block_{i}" for i in range(L)]
    h = hidden_width(d, act)
    fc1_out = 2 * h if act == "swiglu" else h
    for b in p.values():
        assert b["fc1"].shape == (d, fc1_out) and b["fc2"].shape == (h, d) and b["fc2_bias"].shape == (d,)
        assert b["ln_gain"].shape == b["ln_bias"].shape == (d,)
    count = sum(x.size for x in jax.tree.leaves(p))
    per_block = 2 * d + d * fc1_out + h * d + d
    assert count == L * per_block
    if act == "swiglu":
        assert h == round(8 * d / 3)
        assert abs(per_block - (8 * d * d + 3 * d)) / (8 * d * d) < 0.01  # matches the MLP's count
    else:
        assert per_block == 8 * d * d + 3 * d


def test_no_layernorm_ablation_has_no_ln_params():
    p = _params("gelu", norm="none")
    assert "ln_gain" not in p["block_0"]


def test_pytorch_and_xavier_inits():
    d = 64
    p = _params("gelu", d, 1)["block_0"]
    bound = 1 / np.sqrt(d)
    assert np.abs(p["fc1"]).max() <= bound and np.abs(p["fc1"]).max() > 0.9 * bound
    assert np.abs(p["fc2"]).max() <= 1 / np.sqrt(4 * d)
    assert np.all(p["ln_gain"] == 1) and np.all(p["ln_bias"] == 0)
    px = _params("gelu", d, 1, init="xavier_normal")["block_0"]
    std = 0.5 * np.sqrt(2 / (d + 4 * d))
    assert abs(np.std(px["fc1"]) / std - 1) < 0.05
    assert np.all(px["fc2_bias"] == 0)


def test_teacher_shapes_and_frozen_targets():
    from mx_proxy.training import data
    t = Teacher(width=16, hidden=24, depth=2, act="relu")
    p = t.init(jax.random.key(1), jnp.zeros((1, 16)))["params"]
    assert p["fc1_0"].shape == (16, 24) and p["fc2_1"].shape == (24, 16)
    x = jax.random.normal(jax.random.key(2), (4, 16))
    grad = jax.grad(lambda q: jnp.sum(data.targets(lambda v: t.apply({"params": q}, v), x, x, 0.0)))(p)
    assert all(np.all(np.asarray(g) == 0) for g in jax.tree.leaves(grad))  # the teacher is never trained
