"""The paper's proxy: a residual-MLP student learning a frozen MLP teacher.

Student: ``depth`` blocks of ``x + fc2(act(fc1(LN(x))))`` with fc1 d→4d (no
bias) and fc2 4d→d (with bias); for SwiGLU fc1 is d→2h, h = round(8d/3), so the
parameter count matches. Teacher: ``depth`` blocks of ``Linear(d, h, no
bias) → act → Linear(h, d, no bias)``, no LN, no residual, never trained.

Every dense layer of the student is :func:`proxy.layers.mx_dense` under the
recipe (or the recipe's override for that layer); the teacher always runs in
float32. ``arch="ngpt"`` swaps the student for the hypersphere-normalized
variant of :mod:`proxy.ngpt`.

Both students take ``(x, key=None, promote=None)``: ``key`` is the PRNG key
of this step's stochastic rounding (block i folds in i, its dense layer j
folds in j); ``promote`` is a (depth, 2) boolean array, per block the
controller's promotion of its normalization unit (column 0) and of its GEMMs
(column 1) to ``high_recipe`` (see :mod:`proxy.controllers`).
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from proxy import layers
from proxy.recipe import PRESETS, Recipe

__all__ = ["Student", "Teacher", "hidden_width", "fc1_width", "student", "INITS", "NORMS", "ARCHS"]

INITS = ("pytorch", "xavier_normal")
NORMS = ("layernorm", "none")
ARCHS = ("resmlp", "ngpt")


def layer_names(index: int, depth: int, fc: str) -> tuple[str, ...]:
    """The names a dense layer answers to in :meth:`Recipe.for_layer`."""
    names = [f"block_{index}/{fc}"]
    if index == 0:
        names.append(f"first/{fc}")
    if index == depth - 1:
        names.append(f"last/{fc}")
    return tuple(names)


def _fold(key, i):
    return None if key is None else jax.random.fold_in(key, i)


def _flag(promote, j):
    return None if promote is None else promote[j]


def hidden_width(width: int, act: str, expansion: int = 4) -> int:
    """Width of the hidden layer: 4d, or round(8d/3) for SwiGLU."""
    return int(round(expansion * 2 * width / 3)) if act == "swiglu" else expansion * width


def fc1_width(hidden: int, act: str) -> int:
    """Outputs of fc1 for a hidden layer of ``hidden`` units: SwiGLU's gate and value halves, 2·hidden."""
    return 2 * hidden if act == "swiglu" else hidden


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
    """One residual block ``x + fc2(act(fc1(LN(x))))`` (block ``index`` of ``depth``)."""

    width: int
    act: str
    norm: str
    init_scheme: str
    init_gain: float
    recipe: Recipe
    index: int = 0
    depth: int = 1
    high_recipe: Recipe | None = None

    @nn.compact
    def __call__(self, x, key=None, promote=None):
        d, h = self.width, hidden_width(self.width, self.act)
        fc1_out = fc1_width(h, self.act)
        r, hi = self.recipe, self.high_recipe
        z = x
        if self.norm == "layernorm":
            gain = self.param("ln_gain", nn.initializers.ones, (d,))
            bias = self.param("ln_bias", nn.initializers.zeros, (d,))
            z = layers.switch(_flag(promote, 0), lambda rc: layers.layer_norm(z, gain, bias, rc), r, hi)
        w1 = self.param("fc1", _kernel_init(self.init_scheme, self.init_gain), (d, fc1_out))
        w2 = self.param("fc2", _kernel_init(self.init_scheme, self.init_gain), (h, d))
        b2 = self.param("fc2_bias", _bias_init(self.init_scheme, h), (d,))
        r1 = r.for_layer(*layer_names(self.index, self.depth, "fc1"))
        r2 = r.for_layer(*layer_names(self.index, self.depth, "fc2"))
        gemm = _flag(promote, 1)
        self.sow("intermediates", "fc1_in", z)
        # the activation belongs to the GEMM unit: promoted, it runs in the high precision too
        a = layers.switch(gemm, lambda rc: layers.activation(self.act, layers.mx_dense(z, w1, None, rc, _fold(key, 0)),
                                                             hi if rc is hi else r), r1, hi)
        self.sow("intermediates", "fc2_in", a)
        return x + layers.switch(gemm, lambda rc: layers.mx_dense(a, w2, b2, rc, _fold(key, 1)), r2, hi)


class Student(nn.Module):
    """Residual MLP student; params ``block_{i}/{ln_gain, ln_bias, fc1, fc2, fc2_bias}``.

    ``high_recipe``: the precision a promoted unit switches to (see the module
    docstring); ``None`` when no controller runs."""

    width: int
    depth: int
    act: str = "gelu"
    norm: str = "layernorm"
    init_scheme: str = "pytorch"
    init_gain: float = 0.5
    recipe: Recipe = PRESETS["fp32"]
    high_recipe: Recipe | None = None

    @nn.compact
    def __call__(self, x, key=None, promote=None):
        for i in range(self.depth):
            x = Block(self.width, self.act, self.norm, self.init_scheme, self.init_gain, self.recipe, i, self.depth,
                      self.high_recipe, name=f"block_{i}")(x, _fold(key, i), None if promote is None else promote[i])
        return x


def student(arch: str = "resmlp", **kw) -> nn.Module:
    """The student module of an architecture: ``resmlp`` (:class:`Student`,
    the paper's proxy) or ``ngpt`` (:class:`proxy.ngpt.NGPTStudent`; no
    LayerNorm, so ``norm`` does not apply to it)."""
    if arch == "resmlp":
        return Student(**kw)
    if arch == "ngpt":
        from proxy.ngpt import NGPTStudent

        kw.pop("norm", None)
        return NGPTStudent(**kw)
    raise ValueError(f"unknown arch {arch!r}; valid: {', '.join(ARCHS)}")


class Teacher(nn.Module):
    """Frozen MLP teacher: ``depth`` × (Linear(d, h) → act → Linear(h, d)), no bias."""

    width: int
    hidden: int
    depth: int
    act: str = "gelu"

    @nn.compact
    def __call__(self, x):
        fp32 = PRESETS["fp32"]
        fc1_out = fc1_width(self.hidden, self.act)
        for i in range(self.depth):
            w1 = self.param(f"fc1_{i}", _kernel_init("pytorch", 1.0), (self.width, fc1_out))
            w2 = self.param(f"fc2_{i}", _kernel_init("pytorch", 1.0), (self.hidden, self.width))
            x = layers.activation(self.act, jnp.dot(x, w1, precision="highest"), fp32)
            x = jnp.dot(x, w2, precision="highest")
        return x
