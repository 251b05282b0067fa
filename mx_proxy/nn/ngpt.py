"""A hypersphere-normalized student: nGPT (Loshchilov et al., 2024) adapted to the MLP proxy.

nGPT keeps every hidden state and every weight vector along the embedding
dimension on the unit sphere, and replaces the residual add by a learned step
towards the block's (normalized) output. Adapted to the proxy's residual MLP
(d = ``spec.width``, h = :attr:`~mx_proxy.nn.model_spec.ModelSpec.hidden`, f = h, or 2h for
SwiGLU; ``Norm(z) = z / ‖z‖₂`` over the last axis)::

    h₀     = Norm(x)                                   x: (B, d) ~ N(0, I)
    block i = 0 … depth−1 (params block_{i}/{fc1, fc2, alpha, s_u}):
      u    = (√d · s_u) ⊙ (h @ W₁)                     W₁ = fc1: (d, f), s_u: (f,)
      a    = act(u)                                    (B, h)
      v    = a @ W₂                                    W₂ = fc2: (h, d)
      h_M  = Norm(v)
      h    ← Norm(h + α ⊙ (h_M − h)),  α = alpha · α_init · √d            alpha: (d,)
    y      = (√d · scale) ⊙ h                          head/scale: (d,)

Weights (kernels stored (in, out), as in :mod:`mx_proxy.nn.resmlp`) are unit vectors
along the embedding dimension, nGPT's "rows" of its (out, in) matrices:

* ``fc1`` (d, f) is normalized over axis 0 (−2 counting from the end): column
  j is hidden unit j's input weight vector in embedding space, so h @ W₁ is a
  vector of cosines between h and the units' directions, each O(1/√d) for
  unrelated directions. The fixed √d factor (nGPT's ``s_v·√d_model``) brings
  the pre-activations back to O(1), the regime where the nonlinearity bends.
* ``fc2`` (h, d) is normalized over axis 1 (−1): row j is hidden unit j's
  output vector in embedding space, so the block's output is a combination
  of unit vectors (its overall scale is removed by ``Norm`` anyway).

``init`` draws the kernels with the proxy's scheme (``spec.init``; the gain
plays no part once normalized) and normalizes them; :func:`normalize_weights`
projects them back after every optimizer step (the engine calls it), as nGPT
does.

Scalings and their inits (nGPT's ``θ_eff = θ · init/scale`` reparametrization:
the stored θ starts at ``scale``; Adam moves θ by ~lr per step whatever its
size, so θ_eff moves by ~lr · init/scale):

* ``s_u``: stored directly (nGPT's s_u_init = s_u_scale = 1), init 1; the √d
  factor is a constant, not learned. For SwiGLU one s_u entry per fc1 output,
  both halves (nGPT scales only the gate by √d; here the linear half is
  scaled too, which changes only the overall magnitude that the block's
  ``Norm`` removes up to the per-unit scales).
* ``alpha`` (the "eigen learning rate"): stored init ``1/√d``
  (α_scale), effective α = alpha · α_init · √d, α_init = ``ALPHA_INIT_FACTOR
  / depth`` (nGPT uses 0.05 at 24 layers, i.e. ~1/depth). So α starts at
  1/depth in every dimension and moves by ~lr·√d/depth per Adam step. The
  stored ``alpha`` is what optimizers, controllers and diagnostics see; the
  effective step is ``alpha · alpha_init(depth) · √d``. (At width 32, depth
  2, α_init = 1/depth trained slightly better than 0.5/depth.)
* ``head/scale``: effective output scale √d · scale (nGPT's s_z with
  s_z_scale = 1/√d), stored init ``HEAD_INIT`` = 0.05: since h is a unit
  vector, each output coordinate starts with RMS 0.05, between the default
  teacher's per-coordinate output RMS at teacher depth 1 (≈ 0.19) and 2
  (≈ 0.033) and small enough that the initial loss is close to the
  predict-zero loss (a start at 1.0 costs ~300 Adam steps at lr 3e-3 just to
  shrink the output); Adam moves the output RMS by ~lr per step at any width.

Precision: every dense layer is :func:`mx_proxy.nn.layers.mx_dense` under the
recipe (or its override for ``block_{i}/fc{j}`` etc.), with the key folding
of :class:`mx_proxy.nn.resmlp.Student`. Normalizations, the residual interpolation
and ``alpha`` are the block's normalization unit: rounded elementwise with
:func:`mx_proxy.nn.layers.vround` in the recipe's LN precision (``ln_precision
= "fp32"`` keeps them float32, else the vector precision); the s_u scaling and
the activation are rounded in the vector precision (the activation in its
activation precision); ``ln_affine`` does not apply (there is no LayerNorm;
``alpha`` and the scales are never MX-quantized). Unlike the resmlp
student, whose residual stream x + fc2(…) stays float32, the hidden state h
here is the output of a rounded ``Norm``, so under a bf16 vector precision
the residual stream itself is bf16 (unit norm to ~3·2⁻⁸).
``promote[i, 0]`` switches block i's normalization unit to ``high_recipe``
(block 0's also covers the input ``Norm(x)``, the last block's the head
scaling); ``promote[i, 1]`` its GEMM unit (fc1, the s_u scaling and the
activation, fc2). So an all-True ``promote`` runs the high recipe: a jitted
forward pass is bitwise that of the model built with the high recipe; under
autodiff XLA compiles the ``lax.cond`` branches apart from their neighbours
and results may differ from the unpromoted program in the last float32 ulp.

Simplified from nGPT: no attention (the proxy has none), no embeddings or
vocabulary logits (the head is a per-dimension scale of the last hidden
state), weight normalization is plain projection after the optimizer step
(no Riemannian update), no weight decay/warm-up choices are made here (the
engine's), and the step size α is shared by the whole block (nGPT has one
for attention and one for the MLP).
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from mx_proxy.nn import layers
from mx_proxy.nn.blocks import flag, fold, layer_recipes
from mx_proxy.nn.inits import InitScheme
from mx_proxy.nn.model_spec import ModelSpec
from mx_proxy.numerics.recipe import Recipe

__all__ = ["NGPTStudent", "NGPTBlock", "normalize_weights", "sphere_norm", "WEIGHT_NORM_AXES",
           "ALPHA_INIT_FACTOR", "HEAD_INIT", "alpha_init"]

WEIGHT_NORM_AXES = {"fc1": -2, "fc2": -1}
"""Axis (from the end, so a leading vmapped member axis is allowed) along
which each kernel's vectors are unit norm: the embedding dimension."""

ALPHA_INIT_FACTOR = 1.0
"""α starts at ALPHA_INIT_FACTOR / depth (nGPT's α_init ~ 1/n_layers)."""

HEAD_INIT = 0.05
"""Stored init of ``head/scale``; the effective scale is √d · scale."""

_EPS = 1e-12


def alpha_init(depth: int) -> float:
    """The effective step size α of every dimension at init."""
    return ALPHA_INIT_FACTOR / max(depth, 1)


def sphere_norm(x, precision: str = "fp32", eps: float = _EPS, rounding: str = "even"):
    """``x / ‖x‖₂`` over the last axis, every op rounded to ``precision``
    (``"fp32"`` or ``"bf16"``, ties ``rounding``), as :func:`mx_proxy.nn.layers.layer_norm` rounds."""
    r = functools.partial(layers.vround, precision=precision, rounding=rounding)
    x = r(x)
    ss = r(jnp.sum(r(x * x), axis=-1, keepdims=True))
    return r(x * r(jax.lax.rsqrt(r(ss + eps))))


def _unit(w, axis):
    return w * jax.lax.rsqrt(jnp.maximum(jnp.sum(jnp.square(w), axis=axis, keepdims=True), _EPS))


def normalize_weights(params):
    """Project every ``fc1``/``fc2`` kernel back to unit vectors along the
    embedding dimension (:data:`WEIGHT_NORM_AXES`); other leaves pass
    unchanged. Pure and jittable; the kernels may carry leading (vmapped
    member) axes."""

    def f(path, leaf):
        name = getattr(path[-1], "key", None) if path else None
        return _unit(leaf, WEIGHT_NORM_AXES[name]) if name in WEIGHT_NORM_AXES else leaf

    return jax.tree_util.tree_map_with_path(f, params)


def _unit_init(init: InitScheme, axis: int):
    base = init.kernel()

    def f(key, shape, dtype=jnp.float32):
        return _unit(base(key, shape, dtype), axis)

    return f


def _norm_precision(recipe: Recipe) -> str:
    return recipe.vector if recipe.ln_precision == "vector" else "fp32"


class NGPTBlock(nn.Module):
    """One block on the sphere: block ``index`` of the student ``spec`` describes (its width,
    activation, init, recipes: read here, where each is used; ``spec.norm`` plays no part); see the
    module docstring. Params ``fc1, fc2, alpha, s_u``; sows ``fc1_in``, ``fc2_in`` and ``hidden``
    (its output)."""

    spec: ModelSpec
    index: int = 0

    @nn.compact
    def __call__(self, h, key=None, promote=None):
        s = self.spec
        d, hid, f = s.width, s.hidden, s.fc1_out
        r, hi = s.recipe, s.high_recipe
        w1 = self.param("fc1", _unit_init(s.init, WEIGHT_NORM_AXES["fc1"]), (d, f))
        w2 = self.param("fc2", _unit_init(s.init, WEIGHT_NORM_AXES["fc2"]), (hid, d))
        s_u = self.param("s_u", nn.initializers.ones, (f,))
        a_init, a_scale = alpha_init(s.depth), 1.0 / math.sqrt(d)
        alpha = self.param("alpha", nn.initializers.constant(a_scale), (d,))
        r1, r2 = layer_recipes(r, self.index, s.depth)
        norm_flag, gemm = flag(promote, 0), flag(promote, 1)

        def scale_act(u, rc):
            rv = functools.partial(layers.vround, precision=rc.vector, rounding=rc.vector_rounding)
            u = rv(u * rv(s_u * math.sqrt(d)))
            return layers.activation(s.act, u, rc)

        def update(h, v, rc):  # h ← Norm(h + α ⊙ (Norm(v) − h))
            p = _norm_precision(rc)
            rn = functools.partial(layers.vround, precision=p, rounding=rc.vector_rounding)
            h_m = sphere_norm(v, p, rounding=rc.vector_rounding)
            a = rn(alpha * (a_init / a_scale))
            return sphere_norm(rn(h + rn(a * rn(h_m - h))), p, rounding=rc.vector_rounding)

        self.sow("intermediates", "fc1_in", h)
        u = self.perturb("fc1_out", layers.switch(gemm, lambda rc: layers.mx_dense(h, w1, None, rc, fold(key, 0)),
                                                  r1, hi))  # perturb: a no-op, see mx_proxy.nn.resmlp
        a = layers.switch(gemm, lambda rc: scale_act(u, rc), r, hi)
        self.sow("intermediates", "fc2_in", a)
        v = self.perturb("fc2_out", layers.switch(gemm, lambda rc: layers.mx_dense(a, w2, None, rc, fold(key, 1)),
                                                  r2, hi))
        h = layers.switch(norm_flag, lambda rc: update(h, v, rc), r, hi)
        self.sow("intermediates", "hidden", h)
        return h


class _Head(nn.Module):
    """``y = (√d · scale) ⊙ h`` (param ``scale``, shape (d,))."""

    width: int
    recipe: Recipe
    high_recipe: Recipe | None = None

    @nn.compact
    def __call__(self, h, promoted=None):
        scale = self.param("scale", nn.initializers.constant(HEAD_INIT), (self.width,))
        root = math.sqrt(self.width)

        def out(rc):
            rv = functools.partial(layers.vround, precision=rc.vector, rounding=rc.vector_rounding)
            return rv(h * rv(scale * root))

        return layers.switch(promoted, out, self.recipe, self.high_recipe)


class NGPTStudent(nn.Module):
    """Hypersphere-normalized residual MLP student (nGPT-style) of ``spec``
    (:class:`~mx_proxy.nn.model_spec.ModelSpec`, handed whole to each block;
    ``spec.norm`` plays no part); params ``block_{i}/{fc1, fc2, alpha, s_u}``
    and ``head/scale``. Call signature and ``promote``/``key`` semantics as
    :class:`mx_proxy.nn.resmlp.Student`; after every optimizer step the
    weights need :func:`normalize_weights`."""

    spec: ModelSpec

    @nn.compact
    def __call__(self, x, key=None, promote=None):
        s = self.spec
        r, hi = s.recipe, s.high_recipe
        first = None if promote is None or s.depth < 1 else promote[0, 0]
        last = None if promote is None or s.depth < 1 else promote[s.depth - 1, 0]
        h = layers.switch(first, lambda rc: sphere_norm(x, _norm_precision(rc), rounding=rc.vector_rounding), r, hi)
        for i in range(s.depth):
            h = NGPTBlock(s, i, name=f"block_{i}")(h, fold(key, i), flag(promote, i))
        return _Head(s.width, r, hi, name="head")(h, last)
