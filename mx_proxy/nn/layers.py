"""Layers that honour a :class:`~mx_proxy.numerics.recipe.Recipe`.

``mx_dense`` is a ``jax.custom_vjp`` whose forward, dgrad and wgrad GEMMs each
quantize their operands along that GEMM's contraction axis (see the table in
:mod:`mx_proxy.numerics.recipe`). Stochastic rounding draws its bits from a key per
operand role, ``fold_in(key, ROLES.index(role))``, so a training run that
passes ``fold_in``-derived keys per (seed, step, layer) replays exactly. A
2-D-tiled weight spec shared by the forward and dgrad GEMMs is quantized once
(same bits, same key) and both GEMMs see the same quantized weight.

Vector math is rounded elementwise to the recipe's vector precision with its
rounding mode (:func:`vround`, in :mod:`mx_proxy.nn.rounding`); a rounding's backward rounds the cotangent
the same way (or, with ``backward_precision="fp32"``, not at all), as the
reference library rounds its backward. ``layer_norm`` follows the MX
library's ``LayerNormFunction`` op for op, forward and backward (a
``custom_vjp``) whenever anything in it rounds; in pure float32 it is the
plain formula differentiated by JAX, like ``torch.nn.LayerNorm``.
``rms_norm`` (RMSNorm, gain only) has no library counterpart to follow: it
is plain rounded ops in the same precisions, differentiated by JAX (each
rounding's backward rounds the cotangent, as the rest of the vector math).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental.layout import Layout, with_layout_constraint

from mx_proxy.nn.rounding import _round_grad, _round_to, _rounder, bf16_round, vround
from mx_proxy.numerics.quantize import MXSpec, quantize
from mx_proxy.numerics.recipe import Recipe
from mx_proxy.pallas.matmul import mx_dot

__all__ = ["mx_dense", "mx_matmul", "layer_norm", "rms_norm", "activation", "ACTIVATIONS", "vround", "bf16_round",
           "quantize_affine", "ROLES", "operand_key", "switch"]

ACTIVATIONS = ("gelu", "relu", "swiglu", "tanh", "linear", "relu2", "silu")
ROLES = ("fwd_x", "fwd_w", "dgrad_g", "dgrad_w", "wgrad_x", "wgrad_g")
_HIGHEST = jax.lax.Precision.HIGHEST


def _q(x, spec: MXSpec | None, axis: int, vector: str, key=None, rounding: str = "even"):
    """A GEMM operand: MX-quantized along ``axis``, or in vector precision."""
    if spec is None:
        return vround(x, vector, rounding)
    return quantize(vround(x, vector, rounding), spec, axis=axis, key=key if spec.rounding == "stochastic" else None)


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
              *, a_axis: int = 1, b_axis: int = 0, a_key=None, b_key=None, rounding: str = "even",
              dot: str = "f32"):
    """Contract 2-D ``a`` and ``b`` over ``a_axis``/``b_axis`` (K), each operand
    quantized along K, float32 accumulation, output rounded to ``vector``
    (ties ``rounding``, also for the operands' vector rounding).

    The defaults are ``a (M, K) @ b (K, N)``. Other axes avoid materialized
    transposes, so the fp32 recipe reproduces JAX's own dot gradients bit for bit.
    ``a_key``/``b_key``: PRNG keys of operands that round stochastically.

    ``dot`` (:attr:`Recipe.dot`) picks how a GEMM whose two operands hold only
    bfloat16 values (:func:`_bf16_exact`) is computed on the CPU: ``"f32"``,
    a float32 dot; ``"bf16"``, a bfloat16 × bfloat16 → float32 dot, which
    XLA's YNNPACK runs on the AVX512-BF16/AMX units (with the contracted axis
    of a transposed operand made minor first, so all three GEMMs get the fast
    kernel). Both multiply the same values exactly and accumulate in float32:
    they differ only in summation order. GPUs always take the bf16 dot (tensor
    cores). Other GEMMs are float32 dots at HIGHEST precision everywhere.
    """
    return vround(_gemm(a, b, a_spec, b_spec, vector, backend, a_axis, b_axis, a_key, b_key, rounding, dot),
                  vector, rounding)


def _gemm(a, b, a_spec, b_spec, vector, backend, a_axis, b_axis, a_key, b_key, rounding, dot):
    """:func:`mx_matmul` before its output rounding: the float32 accumulation."""
    if backend == "pallas" and a_spec is not None and b_spec is not None:
        # both operands MX: Pallas quantize kernels + MX GEMM, no transposes materialized (mx_proxy/pallas/README.md).
        # A GEMM with an unquantized operand is an ordinary GEMM: the XLA code below, on every backend.
        out = mx_dot(vround(a, vector, rounding), vround(b, vector, rounding), a_spec, b_spec,
                     a_contract_axis=-1 if a_axis == 1 else 0, b_contract_axis=b_axis)
    else:
        dims = (((a_axis,), (b_axis,)), ((), ()))
        qa, qb = _q(a, a_spec, a_axis, vector, a_key, rounding), _q(b, b_spec, b_axis, vector, b_key, rounding)

        def f32_dot(qa, qb):  # a real float32 GEMM (on NVIDIA GPUs the default precision would be TF32)
            return jax.lax.dot_general(qa, qb, dims, precision=_HIGHEST)

        def bf16_dot(qa, qb):  # exact: both operands are bf16 values; float32 accumulation on tensor cores
            return jax.lax.dot_general(qa.astype(jnp.bfloat16), qb.astype(jnp.bfloat16), dims,
                                       preferred_element_type=jnp.float32)

        def cpu_bf16_dot(qa, qb):
            # YNNPACK's bf16 GEMM is fast for a (M, K) @ (K, N) and (M, K) x (N, K) but not when a's K is
            # its major axis (the wgrad GEMM): give that operand a row-major (K-minor) transposed copy.
            qa, qb = qa.astype(jnp.bfloat16), qb.astype(jnp.bfloat16)
            if a_axis == 0:
                qa = with_layout_constraint(qa.T, Layout(major_to_minor=(0, 1)))
                return jax.lax.dot_general(qa, qb, (((1,), (b_axis,)), ((), ())), preferred_element_type=jnp.float32)
            return jax.lax.dot_general(qa, qb, dims, preferred_element_type=jnp.float32)

        if _bf16_exact(a_spec, vector) and _bf16_exact(b_spec, vector):
            cpu = cpu_bf16_dot if dot == "bf16" else f32_dot
            out = jax.lax.platform_dependent(qa, qb, cuda=bf16_dot, rocm=bf16_dot, default=cpu)
        else:
            out = f32_dot(qa, qb)
    return out


def _bf16_exact(spec: MXSpec | None, vector: str) -> bool:
    """Whether a GEMM operand holds only bfloat16 values: an MX element (≤ 8
    significant bits) times a power-of-two E8M0 scale, or a value rounded to
    bf16 vector precision. (Products below 2**-126, bf16 subnormals, are the
    one inexact corner: tensor cores may flush them.) NVFP4's float32 tensor
    scale makes its values not bf16-exact."""
    if spec is None:
        return vector == "bf16"
    return spec.scale_format == "e8m0" and spec.element.mantissa_bits + 1 <= 8


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _dense2d(x, w, b, key, recipe: Recipe):
    r = recipe
    v, rnd = r.vector, r.vector_rounding
    y = mx_matmul(x, w, r.fwd_x, r.fwd_w, v, r.backend, rounding=rnd, dot=r.dot,
                  a_key=operand_key(key, r, "fwd_x"), b_key=operand_key(key, r, "fwd_w"))
    return y if b is None else vround(y + vround(b, v, rnd), v, rnd)


def _dense2d_fwd(x, w, b, key, recipe):
    return _dense2d(x, w, b, key, recipe), (x, w, b, key)


def _dense2d_bwd(recipe, res, g):
    """dgrad and wgrad GEMMs on the saved (unrounded) x and W: an unquantized
    operand enters in the backward's vector precision (float32 for
    ``backward_precision="fp32"``, as the library's forward-only backward
    uses its saved float32 input and weight)."""
    x, w, b, key = res
    r = recipe
    v, rnd = r.backward_vector, r.vector_rounding
    g = vround(g, v, rnd)
    dx = mx_matmul(g, w, r.dgrad_g, r.dgrad_w, v, r.backend, a_axis=1, b_axis=1,  # over out-features
                   rounding=rnd, dot=r.dot,
                   a_key=operand_key(key, r, "dgrad_g"), b_key=operand_key(key, r, "dgrad_w"))
    dw = _round_grad(_gemm(x, g, r.wgrad_x, r.wgrad_g, v, r.backend, 0, 0,  # over the batch
                           operand_key(key, r, "wgrad_x"), operand_key(key, r, "wgrad_g"), rnd, r.dot), v, rnd)
    db = None if b is None else _round_grad(jnp.sum(g, axis=0), v, rnd)
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
    when ``recipe.ln_affine`` is set, else rounded to the LN precision
    (unrounded with ``ln_precision`` ``"fp32"`` or ``"stats_fp32"``)."""
    prec = recipe.vector if recipe.ln_precision == "vector" else "fp32"
    p = vround(p, prec, recipe.vector_rounding, recipe.backward_vector, param=True)
    if recipe.ln_affine is None:
        return p
    return quantize(p, recipe.ln_affine, axis=-1)


def _ln_precisions(recipe: Recipe) -> tuple[str, str, str]:
    """(stats, rest, backward) precisions of LayerNorm: the input, mean and
    variance; the rest of the forward (eps, sqrt, reciprocal, normalize,
    scale, shift); the backward."""
    if recipe.ln_precision == "fp32":
        return "fp32", "fp32", "fp32"
    if recipe.ln_precision == "stats_fp32":
        return "fp32", recipe.vector, "fp32"
    return recipe.vector, recipe.vector, recipe.backward_vector


def _mean(x, r):
    """The library's ``vec_reduce_mean`` over the last axis: sum, round, divide, round."""
    return r(r(jnp.sum(x, axis=-1, keepdims=True)) / x.shape[-1])


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7, 8))
def _library_ln(x, gain, bias, gain_bwd, eps: float, stats: str, rest: str, bwd: str, rounding: str):
    return _library_ln_fwd(x, gain, bias, gain_bwd, eps, stats, rest, bwd, rounding)[0]


def _library_ln_fwd(x, gain, bias, gain_bwd, eps, stats, rest, bwd, rounding):
    """``_norm_forward`` of the MX library: every op rounded (``stats``
    precision up to the variance, ``rest`` after it)."""
    rs = functools.partial(_round_to, precision=stats, rounding=rounding)
    rr = functools.partial(_round_to, precision=rest, rounding=rounding)
    x = rs(x)
    mean = _mean(x, rs)
    xs = rs(x - mean)
    var = _mean(rs(xs * xs), rs)
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
    rb = functools.partial(_round_to, precision=bwd, rounding=rounding)
    rg = functools.partial(_round_grad, precision=bwd, rounding=rounding)  # the parameter gradients
    g = rb(g)
    rows = tuple(range(g.ndim - 1))
    dbias = rg(jnp.sum(g, axis=rows)) if has_bias else None
    dgain = rg(jnp.sum(rb(g * xn), axis=rows)) if gain is not None else None
    dxn = rb(g * gain) if gain is not None else g
    std = rb(jnp.sqrt(vare))
    inv = rb(1.0 / std)
    dxs = rb(dxn * inv)
    t = rb(rb(dxn * xn) * std)
    t = _mean(t, rb)
    t = rb(t * rb(1.0 / vare))
    dx = rb(dxs + rb(-t * xn))
    dx = rb(dx + -_mean(dx, rb))
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
    stats, rest, bwd = _ln_precisions(recipe)
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

    Precisions follow :func:`layer_norm` (see :func:`_ln_precisions`): the
    input, its square and their mean in the stats precision; eps, sqrt,
    reciprocal, normalize and scale in the rest precision; the backward in
    the backward precision. In pure float32 it is the plain formula with
    ``rsqrt`` (as ``torch.nn.RMSNorm``). Where it rounds it is a chain of
    rounded ops differentiated by JAX (each rounding rounds its cotangent to
    the backward precision), not a hand-written library-order backward like
    :func:`layer_norm`'s: the MX library has no RMSNorm to follow.
    """
    stats, rest, bwd = _ln_precisions(recipe)
    if gain is not None:
        gain = quantize_affine(gain, recipe)
    if stats == rest == bwd == "fp32":
        y = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
        return y if gain is None else y * gain
    rnd = recipe.vector_rounding
    rs = _rounder(stats, rnd, None if stats == "fp32" else bwd)
    rr = _rounder(rest, rnd, None if rest == "fp32" else bwd)
    x = rs(x)
    ms = _mean(rs(x * x), rs)
    std = rr(jnp.sqrt(rr(ms + eps)))
    y = rr(x * rr(1.0 / std))
    return y if gain is None else rr(gain * y)


def activation(name: str, x, recipe: Recipe):
    """An activation in the recipe's activation precision.

    ``swiglu`` splits the last axis in halves (a, b) and returns silu(a)·b.
    GELU is the exact (erf) form, PyTorch's default. ``relu2`` is the squared
    ReLU, max(x, 0)²; ``silu`` is x·sigmoid(x). Each rounds its input and its
    output (one rounding after the whole function, as GELU does; ReLU, whose
    outputs are its inputs, needs none).

    Raises:
      ValueError: an unknown ``name`` (naming the valid ones).
    """
    prec = "fp32" if recipe.act_precision == "fp32" else recipe.vector
    r = _rounder(prec, recipe.vector_rounding, None if prec == "fp32" else recipe.backward_vector)
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
    if name == "relu2":
        return r(jnp.square(jax.nn.relu(x)))
    if name == "silu":
        return r(jax.nn.silu(x))
    raise ValueError(f"unknown activation {name!r}; valid: {', '.join(ACTIVATIONS)}")
