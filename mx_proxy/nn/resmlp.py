"""The paper's proxy: a residual-MLP student learning a frozen MLP teacher.

Student: ``depth`` blocks of ``x + fc2(act(fc1(LN(x))))`` with fc1 d→4d (no
bias) and fc2 4d→d (with bias), LN one of :data:`~mx_proxy.nn.norms.NORMS`
(LayerNorm with gain and bias, RMSNorm with a gain, LayerNorm without affine
parameters, or none; ``mx-proxy list norms``), the activation one of
:data:`~mx_proxy.nn.activations.ACTIVATIONS`; for a gated activation (SwiGLU)
fc1 is d→2h, h = round(8d/3), so the parameter count matches. Teacher: ``depth`` blocks of ``Linear(d, h, no
bias) → act → Linear(h, d, no bias)``, no LN, no residual, never trained.

Every dense layer of the student is :func:`mx_proxy.nn.dense.mx_dense` under the
recipe (or the recipe's override for that layer); the teacher always runs in
float32. ``arch="ngpt"`` swaps the student for the hypersphere-normalized
variant of :mod:`mx_proxy.nn.ngpt` (see :mod:`mx_proxy.nn.architectures`).

Both students mark each GEMM output with flax's ``perturb`` (``fc1_out``,
``fc2_out``): a no-op unless a ``perturbations`` collection is passed, which
the quantization statistics do to read the gradient each GEMM's backward
receives (:mod:`mx_proxy.training.quant_stats`).

Both students are built from one :class:`~mx_proxy.nn.model_spec.ModelSpec`
(``Student(spec)``; :func:`~mx_proxy.nn.model_spec.model_spec` makes one from
names) and take ``(x, key=None, promote=None)``: ``key`` is the PRNG key of
this step's stochastic rounding (block i folds in i, its dense layer j folds
in j); ``promote`` is a (depth, 2) boolean array, per block the
controller's promotion of its normalization unit (column 0) and of its GEMMs
(column 1) to ``high_recipe`` (see :mod:`mx_proxy.training.controllers`).
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from mx_proxy.nn import activations, dense
from mx_proxy.nn.blocks import fc1_width, flag, fold, hidden_width, layer_names, layer_recipes
from mx_proxy.nn.inits import INITS, kernel_init
from mx_proxy.nn.model_spec import ModelSpec, model_spec
from mx_proxy.nn.norms import NORMS, normalize
from mx_proxy.numerics.recipe import PRESETS

__all__ = ["Student", "Block", "Teacher", "ModelSpec", "model_spec", "hidden_width", "fc1_width", "layer_names",
           "normalize", "INITS", "NORMS"]


class Block(nn.Module):
    """One residual block ``x + fc2(act(fc1(norm(x))))``: block ``index`` of the student ``spec`` describes
    (its width, activation, norm, init, recipes: read here, where each is used)."""

    spec: ModelSpec
    index: int = 0

    @nn.compact
    def __call__(self, x, key=None, promote=None):
        s = self.spec
        d, h, r, hi = s.width, s.hidden, s.recipe, s.high_recipe
        z = normalize(self, s.norm, x, d, flag(promote, 0), r, hi)
        w1 = self.param("fc1", s.init.kernel(), (d, s.fc1_out))
        w2 = self.param("fc2", s.init.kernel(), (h, d))
        b2 = self.param("fc2_bias", s.init.bias(h), (d,))
        r1, r2 = layer_recipes(r, self.index, s.depth)
        gemm = flag(promote, 1)
        self.sow("intermediates", "fc1_in", z)

        def fc1(rc):  # the activation belongs to the GEMM unit: promoted, it runs in the high precision too
            y1 = self.perturb("fc1_out", dense.mx_dense(z, w1, None, rc, fold(key, 0)))
            return activations.apply(s.act, y1, hi if rc is hi else r)

        a = dense.switch(gemm, fc1, r1, hi)
        self.sow("intermediates", "fc2_in", a)
        y2 = dense.switch(gemm, lambda rc: dense.mx_dense(a, w2, b2, rc, fold(key, 1)), r2, hi)
        return x + self.perturb("fc2_out", y2)


class Student(nn.Module):
    """Residual MLP student of ``spec`` (:class:`~mx_proxy.nn.model_spec.ModelSpec`, handed whole to each
    block); params ``block_{i}/{ln_gain, ln_bias, fc1, fc2, fc2_bias}`` (``ln_gain`` only with an RMSNorm
    ``spec.norm``; neither with ``layernorm_noaffine`` or ``none``). ``spec.high_recipe``: the precision a
    promoted unit switches to (see the module docstring); ``None`` when no controller runs."""

    spec: ModelSpec

    @nn.compact
    def __call__(self, x, key=None, promote=None):
        for i in range(self.spec.depth):
            x = Block(self.spec, i, name=f"block_{i}")(x, fold(key, i), flag(promote, i))
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
        fc1_out = fc1_width(self.hidden, self.act)
        for i in range(self.depth):
            w1 = self.param(f"fc1_{i}", kernel_init("pytorch", 1.0), (self.width, fc1_out))
            w2 = self.param(f"fc2_{i}", kernel_init("pytorch", 1.0), (self.hidden, self.width))
            x = activations.apply(self.act, jnp.dot(x, w1, precision="highest"), fp32)
            x = jnp.dot(x, w2, precision="highest")
        return x
