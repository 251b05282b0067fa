"""The paper's proxy: a residual-MLP student learning a frozen MLP teacher.

Student: ``depth`` blocks of ``x + fc2(act(fc1(LN(x))))`` with fc1 d→4d (no
bias) and fc2 4d→d (with bias); for SwiGLU fc1 is d→2h, h = round(8d/3), so the
parameter count matches. Teacher: ``depth`` blocks of ``Linear(d, h, no
bias) → act → Linear(h, d, no bias)``, no LN, no residual, never trained.

Every dense layer of the student is :func:`proxy.layers.mx_dense` under the
recipe; the teacher always runs in float32.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from proxy import layers
from proxy.recipe import PRESETS, Recipe

__all__ = ["Student", "Teacher", "hidden_width", "INITS", "NORMS"]

INITS = ("pytorch", "xavier_normal")
NORMS = ("layernorm", "none")


def hidden_width(width: int, act: str, expansion: int = 4) -> int:
    """Width of the hidden layer: 4d, or round(8d/3) for SwiGLU."""
    return int(round(expansion * 2 * width / 3)) if act == "swiglu" else expansion * width


def _kernel_init(init: str, gain: float):
    """Kernel (in, out) initializer.

    ``pytorch``: U(±1/sqrt(fan_in)) (torch.nn.Linear's default);
    ``xavier_normal``: N(0, gain²·2/(fan_in+fan_out)).
    """

    def f(key, shape, dtype=jnp.float32):
        fan_in, fan_out = shape
        if init == "pytorch":
            bound = 1.0 / math.sqrt(fan_in)
            return jax.random.uniform(key, shape, dtype, -bound, bound)
        std = gain * math.sqrt(2.0 / (fan_in + fan_out))
        return std * jax.random.normal(key, shape, dtype)

    return f


def _bias_init(init: str, fan_in: int):
    def f(key, shape, dtype=jnp.float32):
        if init == "pytorch":
            bound = 1.0 / math.sqrt(fan_in)
            return jax.random.uniform(key, shape, dtype, -bound, bound)
        return jnp.zeros(shape, dtype)

    return f


class Block(nn.Module):
    """One residual block ``x + fc2(act(fc1(LN(x))))``."""

    width: int
    act: str
    norm: str
    init_scheme: str
    init_gain: float
    recipe: Recipe

    @nn.compact
    def __call__(self, x):
        d, h = self.width, hidden_width(self.width, self.act)
        fc1_out = 2 * h if self.act == "swiglu" else h
        z = x
        if self.norm == "layernorm":
            gain = self.param("ln_gain", nn.initializers.ones, (d,))
            bias = self.param("ln_bias", nn.initializers.zeros, (d,))
            z = layers.layer_norm(z, gain, bias, self.recipe)
        w1 = self.param("fc1", _kernel_init(self.init_scheme, self.init_gain), (d, fc1_out))
        w2 = self.param("fc2", _kernel_init(self.init_scheme, self.init_gain), (h, d))
        b2 = self.param("fc2_bias", _bias_init(self.init_scheme, h), (d,))
        self.sow("intermediates", "fc1_in", z)
        a = layers.activation(self.act, layers.mx_dense(z, w1, None, self.recipe), self.recipe)
        self.sow("intermediates", "fc2_in", a)
        return x + layers.mx_dense(a, w2, b2, self.recipe)


class Student(nn.Module):
    """Residual MLP student; params ``block_{i}/{ln_gain, ln_bias, fc1, fc2, fc2_bias}``."""

    width: int
    depth: int
    act: str = "gelu"
    norm: str = "layernorm"
    init_scheme: str = "pytorch"
    init_gain: float = 0.5
    recipe: Recipe = PRESETS["fp32"]

    @nn.compact
    def __call__(self, x):
        for i in range(self.depth):
            x = Block(self.width, self.act, self.norm, self.init_scheme, self.init_gain, self.recipe, name=f"block_{i}")(x)
        return x


class Teacher(nn.Module):
    """Frozen MLP teacher: ``depth`` × (Linear(d, h) → act → Linear(h, d)), no bias."""

    width: int
    hidden: int
    depth: int
    act: str = "gelu"

    @nn.compact
    def __call__(self, x):
        fp32 = PRESETS["fp32"]
        fc1_out = 2 * self.hidden if self.act == "swiglu" else self.hidden
        for i in range(self.depth):
            w1 = self.param(f"fc1_{i}", _kernel_init("pytorch", 1.0), (self.width, fc1_out))
            w2 = self.param(f"fc2_{i}", _kernel_init("pytorch", 1.0), (self.hidden, self.width))
            x = layers.activation(self.act, jnp.dot(x, w1, precision="highest"), fp32)
            x = jnp.dot(x, w2, precision="highest")
        return x
