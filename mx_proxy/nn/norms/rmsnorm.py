"""``rmsnorm``: RMSNorm with a gain, in the recipe's LN precisions.

``rms_norm`` has no library counterpart to follow: it is plain rounded ops
in the same precisions as LayerNorm, differentiated by JAX (each rounding's
backward rounds the cotangent, as the rest of the vector math).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mx_proxy.nn.norms import Norm, ln_precisions, ones, quantize_affine, register, rounded_mean
from mx_proxy.nn.rounding import rounder
from mx_proxy.numerics.recipe import Recipe

__all__ = ["rms_norm"]


def rms_norm(x, gain, recipe: Recipe, eps: float = 1e-5):
    """RMSNorm over the last axis, ``x / sqrt(mean(x²) + eps) · gain``, in the
    recipe's LN precision.

    Args:
      x: (..., d) float32 activations.
      gain: (d,) gain (no bias), or ``None`` for none. It first passes
        :func:`quantize_affine`, exactly like a LayerNorm gain: rounded to the
        LN precision and MX-quantized in blocks along the feature axis when
        ``recipe.ln_affine`` is set (straight-through gradient), so gains
        clustered just below 1 clamp as LayerNorm's do.
      recipe: a :class:`Recipe` (static).
      eps: added to the mean square inside the square root (as LayerNorm's
        ``eps``; the same value, so the two norms differ only in centring).

    Returns:
      (..., d) float32.

    Precisions follow :func:`layer_norm` (see :func:`ln_precisions`): the
    input, its square and their mean in the stats precision; eps, sqrt,
    reciprocal, normalize and scale in the rest precision; the backward in
    the backward precision. In pure float32 it is the plain formula with
    ``rsqrt`` (as ``torch.nn.RMSNorm``). Where it rounds it is a chain of
    rounded ops differentiated by JAX (each rounding rounds its cotangent to
    the backward precision), not a hand-written library-order backward like
    :func:`layer_norm`'s: the MX library has no RMSNorm to follow.
    """
    stats, rest, bwd = ln_precisions(recipe)
    if gain is not None:
        gain = quantize_affine(gain, recipe)
    if stats == rest == bwd == "fp32":
        y = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
        return y if gain is None else y * gain
    rnd = recipe.vector_rounding
    rs = rounder(stats, rnd, None if stats == "fp32" else bwd)
    rr = rounder(rest, rnd, None if rest == "fp32" else bwd)
    x = rs(x)
    ms = rounded_mean(rs(x * x), rs)
    std = rr(jnp.sqrt(rr(ms + eps)))
    y = rr(x * rr(1.0 / std))
    return y if gain is None else rr(gain * y)


NORM = register(Norm(
    name="rmsnorm",
    doc="RMSNorm with a gain (ln_gain, clamped like LayerNorm's), no bias",
    label="RMSNorm",
    params=(("ln_gain", ones),),
    apply=lambda z, p, recipe: rms_norm(z, p["ln_gain"], recipe),
    order=2,
))
