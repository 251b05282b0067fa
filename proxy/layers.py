"""Layers that honour a :class:`~proxy.recipe.Recipe`.

``mx_dense`` is a ``jax.custom_vjp`` whose forward, dgrad and wgrad GEMMs each
quantize their operands along that GEMM's contraction axis (see the table in
:mod:`proxy.recipe`). Stochastic rounding draws its bits from a key per
operand role, ``fold_in(key, ROLES.index(role))``, so a training run that
passes ``fold_in``-derived keys per (seed, step, layer) replays exactly. A
2-D-tiled weight spec shared by the forward and dgrad GEMMs is quantized once
(same bits, same key) and both GEMMs see the same quantized weight. LayerNorm and the activation functions round every
intermediate to the recipe's vector precision; because a float32→bf16→float32
round trip differentiates to the same round trip of the cotangent, their
backward passes are rounded too, as in the reference library.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from proxy.quantize import MXSpec, quantize
from proxy.recipe import Recipe

__all__ = ["mx_dense", "mx_matmul", "layer_norm", "activation", "ACTIVATIONS", "vround", "quantize_affine",
           "ROLES", "operand_key", "switch"]

ACTIVATIONS = ("gelu", "relu", "swiglu", "tanh", "linear")
ROLES = ("fwd_x", "fwd_w", "dgrad_g", "dgrad_w", "wgrad_x", "wgrad_g")
_HIGHEST = jax.lax.Precision.HIGHEST


def vround(x, precision: str):
    """Round elementwise to a vector precision (``"bf16"``) or pass (``"fp32"``)."""
    if precision == "bf16":
        return x.astype(jnp.bfloat16).astype(jnp.float32)
    return x


def _q(x, spec: MXSpec | None, axis: int, vector: str, key=None):
    """A GEMM operand: MX-quantized along ``axis``, or in vector precision."""
    if spec is None:
        return vround(x, vector)
    return quantize(vround(x, vector), spec, axis=axis, key=key if spec.rounding == "stochastic" else None)


def operand_key(key, recipe: Recipe, role: str):
    """The stochastic-rounding key of one GEMM operand: ``fold_in(key, role
    index)``, or ``None`` when that operand does not round stochastically.
    The dgrad weight reuses the forward weight's key when both use the same
    2-D-tiled spec, so both GEMMs see the same quantized weight."""
    spec = getattr(recipe, role)
    if key is None or spec is None or spec.rounding != "stochastic":
        return None
    if role == "dgrad_w" and spec == recipe.fwd_w and spec.block_dims == 2:
        role = "fwd_w"
    return jax.random.fold_in(key, ROLES.index(role))


def switch(flag, fn, recipe: Recipe, high: Recipe | None):
    """``fn(recipe)``, or ``fn(high)`` where the traced boolean ``flag`` is
    set (a ``lax.cond``: one branch runs; under ``vmap`` both run and the
    result is selected). ``flag``/``high`` ``None``: plain ``fn(recipe)``.
    This is how a stability controller promotes one unit of the model to a
    higher precision without recompiling."""
    if flag is None or high is None:
        return fn(recipe)
    return jax.lax.cond(flag, lambda: fn(high), lambda: fn(recipe))


def mx_matmul(a, b, a_spec: MXSpec | None, b_spec: MXSpec | None, vector: str = "fp32", backend: str = "xla",
              *, a_axis: int = 1, b_axis: int = 0, a_key=None, b_key=None):
    """Contract 2-D ``a`` and ``b`` over ``a_axis``/``b_axis`` (K), each operand
    quantized along K, float32 accumulation, output rounded to ``vector``.

    The defaults are ``a (M, K) @ b (K, N)``. Other axes avoid materialized
    transposes, so the fp32 recipe reproduces JAX's own dot gradients bit for bit.
    ``a_key``/``b_key``: PRNG keys of operands that round stochastically.
    """
    if backend == "pallas":
        from kernels.mx_matmul import mx_dot  # the fused kernel path (no transposes materialized)

        out = mx_dot(vround(a, vector), vround(b, vector), a_spec, b_spec,
                     a_contract_axis=-1 if a_axis == 1 else 0, b_contract_axis=b_axis)
    else:
        dims = (((a_axis,), (b_axis,)), ((), ()))
        out = jax.lax.dot_general(_q(a, a_spec, a_axis, vector, a_key), _q(b, b_spec, b_axis, vector, b_key),
                                  dims, precision=_HIGHEST)
    return vround(out, vector)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _dense2d(x, w, b, key, recipe: Recipe):
    r = recipe
    y = mx_matmul(x, w, r.fwd_x, r.fwd_w, r.vector, r.backend,
                  a_key=operand_key(key, r, "fwd_x"), b_key=operand_key(key, r, "fwd_w"))
    return y if b is None else vround(y + vround(b, r.vector), r.vector)


def _dense2d_fwd(x, w, b, key, recipe):
    return _dense2d(x, w, b, key, recipe), (x, w, b, key)


def _dense2d_bwd(recipe, res, g):
    x, w, b, key = res
    r = recipe
    g = vround(g, r.vector)
    dx = mx_matmul(g, w, r.dgrad_g, r.dgrad_w, r.vector, r.backend, a_axis=1, b_axis=1,  # over out-features
                   a_key=operand_key(key, r, "dgrad_g"), b_key=operand_key(key, r, "dgrad_w"))
    dw = mx_matmul(x, g, r.wgrad_x, r.wgrad_g, r.vector, r.backend, a_axis=0, b_axis=0,  # over the batch
                   a_key=operand_key(key, r, "wgrad_x"), b_key=operand_key(key, r, "wgrad_g"))
    db = None if b is None else vround(jnp.sum(g, axis=0), r.vector)
    return dx, dw, db, None


_dense2d.defvjp(_dense2d_fwd, _dense2d_bwd)


def mx_dense(x, w, b, recipe: Recipe, key=None):
    """``y = x @ w + b`` with the recipe's MX GEMMs.

    Args:
      x: (..., in_features) activations; leading axes are flattened into the
        batch (the wgrad GEMM contracts over all of them).
      w: (in_features, out_features) kernel.
      b: (out_features,) bias or ``None``.
      recipe: a :class:`Recipe` (static).
      key: PRNG key of this layer at this step; required when an operand of
        the recipe rounds stochastically (each role folds in its index, see
        :func:`operand_key`), ignored otherwise.

    Returns:
      (..., out_features) float32.
    """
    stochastic = any(getattr(recipe, r) is not None and getattr(recipe, r).rounding == "stochastic" for r in ROLES)
    if key is None and stochastic:
        raise ValueError(f"recipe {recipe.name!r} rounds stochastically; mx_dense needs a PRNG key "
                         "(mx_dense(x, w, b, recipe, key=jax.random.key(0)))")
    if not stochastic:
        key = None  # deterministic recipe: the key plays no part (and the program stays the same)
    lead = x.shape[:-1]
    y = _dense2d(x.reshape(-1, x.shape[-1]), w, b, key, recipe)
    return y.reshape(*lead, w.shape[1])


def quantize_affine(p, recipe: Recipe):
    """A LayerNorm gain or bias as the recipe's LN treatment sees it:
    MX-quantized in blocks along the feature axis (straight-through gradient)
    when ``recipe.ln_affine`` is set, else in vector precision."""
    prec = "fp32" if recipe.ln_precision == "fp32" else recipe.vector
    if recipe.ln_affine is None:
        return vround(p, prec)
    return quantize(vround(p, prec), recipe.ln_affine, axis=-1)


def layer_norm(x, gain, bias, recipe: Recipe, eps: float = 1e-5):
    """LayerNorm over the last axis with every op in the recipe's LN precision.

    ``gain``/``bias`` may be ``None`` (no affine). Matches ``torch.nn.LayerNorm``
    (biased variance, eps inside the square root).
    """
    prec = "fp32" if recipe.ln_precision == "fp32" else recipe.vector
    r = functools.partial(vround, precision=prec)
    x = r(x)
    mean = r(jnp.mean(x, axis=-1, keepdims=True))
    xc = r(x - mean)
    var = r(jnp.mean(r(xc * xc), axis=-1, keepdims=True))
    y = r(xc * r(jax.lax.rsqrt(r(var + eps))))
    if gain is not None:
        y = r(y * quantize_affine(gain, recipe))
    if bias is not None:
        y = r(y + quantize_affine(bias, recipe))
    return y


def activation(name: str, x, recipe: Recipe):
    """An activation in the recipe's activation precision.

    ``swiglu`` splits the last axis in halves (a, b) and returns silu(a)·b.
    GELU is the exact (erf) form, PyTorch's default.
    """
    prec = "fp32" if recipe.act_precision == "fp32" else recipe.vector
    r = functools.partial(vround, precision=prec)
    x = r(x)
    if name == "gelu":
        return r(jax.nn.gelu(x, approximate=False))
    if name == "relu":
        return jax.nn.relu(x)
    if name == "tanh":
        return r(jnp.tanh(x))
    if name == "linear":
        return x
    if name == "swiglu":
        a, b = jnp.split(x, 2, axis=-1)
        return r(r(jax.nn.silu(a)) * b)
    raise ValueError(f"unknown activation {name!r}; valid: {', '.join(ACTIVATIONS)}")
