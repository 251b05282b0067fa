"""``layernorm``: LayerNorm with a gain and a bias, in the MX library's op order.

``layer_norm`` follows the MX library's ``LayerNormFunction`` op for op,
forward and backward (a ``custom_vjp``) whenever anything in it rounds; in
pure float32 it is the plain formula differentiated by JAX, like
``torch.nn.LayerNorm``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from mx_proxy.nn.norms import Norm, ln_precisions, ones, quantize_affine, register, rounded_mean, zeros
from mx_proxy.nn.rounding import round_grad, round_to
from mx_proxy.numerics.recipe import Recipe

__all__ = ["layer_norm"]


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7, 8))
def _library_ln(x, gain, bias, gain_bwd, eps: float, stats: str, rest: str, bwd: str, rounding: str):
    return _library_ln_fwd(x, gain, bias, gain_bwd, eps, stats, rest, bwd, rounding)[0]


def _library_ln_fwd(x, gain, bias, gain_bwd, eps, stats, rest, bwd, rounding):
    """``_norm_forward`` of the MX library: every op rounded (``stats``
    precision up to the variance, ``rest`` after it)."""
    rs = functools.partial(round_to, precision=stats, rounding=rounding)
    rr = functools.partial(round_to, precision=rest, rounding=rounding)
    x = rs(x)
    mean = rounded_mean(x, rs)
    xs = rs(x - mean)
    var = rounded_mean(rs(xs * xs), rs)
    vare = rr(var + eps)
    std = rr(jnp.sqrt(vare))
    inv = rr(1.0 / std)
    xn = rr(xs * inv)
    y = xn
    if gain is not None:
        y = rr(gain * y)
    if bias is not None:
        y = rr(y + bias)
    return y, (xn, vare, gain_bwd, bias is not None)


def _library_ln_bwd(eps, stats, rest, bwd, rounding, res, g):
    """``LayerNormFunction.backward`` with ``_norm_backward_LN`` of the MX
    library, every op rounded to ``bwd``."""
    xn, vare, gain, has_bias = res
    rb = functools.partial(round_to, precision=bwd, rounding=rounding)
    rg = functools.partial(round_grad, precision=bwd, rounding=rounding)  # the parameter gradients
    g = rb(g)
    rows = tuple(range(g.ndim - 1))
    dbias = rg(jnp.sum(g, axis=rows)) if has_bias else None
    dgain = rg(jnp.sum(rb(g * xn), axis=rows)) if gain is not None else None
    dxn = rb(g * gain) if gain is not None else g
    std = rb(jnp.sqrt(vare))
    inv = rb(1.0 / std)
    dxs = rb(dxn * inv)
    t = rb(rb(dxn * xn) * std)
    t = rounded_mean(t, rb)
    t = rb(t * rb(1.0 / vare))
    dx = rb(dxs + rb(-t * xn))
    dx = rb(dx + -rounded_mean(dx, rb))
    return dx, dgain, dbias, None if gain is None else jnp.zeros_like(gain)


_library_ln.defvjp(_library_ln_fwd, _library_ln_bwd)


def layer_norm(x, gain, bias, recipe: Recipe, eps: float = 1e-5):
    """LayerNorm over the last axis (biased variance, eps inside the square root,
    as ``torch.nn.LayerNorm``), in the recipe's LN precision.

    ``gain``/``bias`` may be ``None`` (no affine). They first pass
    :func:`quantize_affine`; with ``recipe.train_ln_bias`` off the bias gets
    no gradient. Where any of it rounds (``ln_precision`` ``"vector"`` with
    bf16 vector math, or ``"stats_fp32"``), the forward and backward follow the
    MX library's ``LayerNormFunction`` op for op (rounded sum, then the
    rounded division for each mean; 1/sqrt; the backward of
    ``_norm_backward_LN``, using the rounded gain, or the unrounded one when
    the backward runs in float32); in pure float32 it is the plain formula,
    differentiated by JAX.
    """
    stats, rest, bwd = ln_precisions(recipe)
    if bias is not None and not recipe.train_ln_bias:
        bias = jax.lax.stop_gradient(bias)
    raw_gain = gain
    if gain is not None:
        gain = quantize_affine(gain, recipe)
    if bias is not None:
        bias = quantize_affine(bias, recipe)
    if stats == rest == bwd == "fp32":
        mean = jnp.mean(x, axis=-1, keepdims=True)
        xc = x - mean
        var = jnp.mean(xc * xc, axis=-1, keepdims=True)
        y = xc * jax.lax.rsqrt(var + eps)
        if gain is not None:
            y = y * gain
        if bias is not None:
            y = y + bias
        return y
    gain_bwd = None if gain is None else (jax.lax.stop_gradient(raw_gain) if bwd == "fp32" else gain)
    return _library_ln(x, gain, bias, gain_bwd, eps, stats, rest, bwd, recipe.vector_rounding)


NORM = register(Norm(
    name="layernorm",
    doc="LayerNorm with gain (ln_gain) and bias (ln_bias), in the MX library's order of rounded ops",
    label="LayerNorm",
    params=(("ln_gain", ones), ("ln_bias", zeros)),
    apply=lambda z, p, recipe: layer_norm(z, p["ln_gain"], p["ln_bias"], recipe),
    order=0,
))
