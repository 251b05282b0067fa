"""The MX dense layer: a ``jax.custom_vjp`` whose forward, dgrad and wgrad
GEMMs each quantize their operands along that GEMM's contraction axis (the
table of the six operands: :mod:`mx_proxy.numerics.operands`).

Stochastic rounding draws its bits from a key per operand,
``fold_in(key, OPERANDS.index(operand))``, so a training run that passes
``fold_in``-derived keys per (seed, step, layer) replays exactly. A
2-D-tiled weight spec shared by the forward and dgrad GEMMs is quantized
once (same bits, same key) and both GEMMs see the same quantized weight.
GEMM inputs and outputs are rounded elementwise to the recipe's vector
precision (:func:`~mx_proxy.nn.rounding.vround`), and a rounding's backward
rounds the cotangent the same way (or, with ``backward_precision="fp32"``,
not at all), as the reference library rounds its backward.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from mx_proxy.nn.copies import transposed_copy
from mx_proxy.nn.rounding import round_grad, vround
from mx_proxy.numerics.operands import OPERANDS
from mx_proxy.numerics.quantize import MXSpec, quantize
from mx_proxy.numerics.recipe import Recipe
from mx_proxy.pallas.matmul import mx_dot

__all__ = ["mx_dense", "quantized_matmul", "quantize_operand", "operand_key", "switch", "wgrad_transposed",
           "bf16_exact", "OPERANDS"]

_HIGHEST = jax.lax.Precision.HIGHEST


def quantize_operand(x, spec: MXSpec | None, axis: int, vector: str, key=None, rounding: str = "even"):
    """A GEMM operand: MX-quantized along ``axis``, or in vector precision.
    A bf16-rounded operand enters the quantizer as bfloat16 (exact), which
    rounds it on 16-bit words (:func:`~mx_proxy.numerics.quantize.quantize`)."""
    x = vround(x, vector, rounding)
    if spec is None:
        return x
    if vector == "bf16":
        x = x.astype(jnp.bfloat16)
    return quantize(x, spec, axis=axis, key=key if spec.rounding == "stochastic" else None)


def operand_key(key, recipe: Recipe, operand: str):
    """The stochastic-rounding key of one GEMM operand: ``fold_in(key,
    OPERANDS.index(operand))``, or ``None`` when that operand does not round
    stochastically. The dgrad weight reuses the forward weight's key when
    both use the same 2-D-tiled spec, so both GEMMs see the same quantized weight."""
    spec = getattr(recipe, operand)
    if key is None or spec is None or spec.rounding != "stochastic":
        return None
    if operand == "dgrad_w" and spec == recipe.fwd_w and spec.block_dims == 2:
        operand = "fwd_w"
    return jax.random.fold_in(key, OPERANDS.index(operand))


def switch(flag, fn, recipe: Recipe, high: Recipe | None):
    """``fn(recipe)``, or ``fn(high)`` where the traced boolean ``flag`` is
    set (a ``lax.cond``: one branch runs; under ``vmap`` both run and the
    result is selected). ``flag``/``high`` ``None``: plain ``fn(recipe)``.
    This is how a stability controller promotes one unit of the model to a
    higher precision without recompiling."""
    if flag is None or high is None:
        return fn(recipe)
    return jax.lax.cond(flag, lambda: fn(high), lambda: fn(recipe))


def quantized_matmul(a, b, a_spec: MXSpec | None, b_spec: MXSpec | None, vector: str = "fp32", backend: str = "xla",
              *, a_axis: int = 1, b_axis: int = 0, a_key=None, b_key=None, rounding: str = "even",
              dot: str = "f32"):
    """Contract 2-D ``a`` and ``b`` over ``a_axis``/``b_axis`` (K), each operand
    quantized along K, float32 accumulation, output rounded to ``vector``
    (ties ``rounding``, also for the operands' vector rounding).

    The defaults are ``a (M, K) @ b (K, N)``. Other axes avoid materialized
    transposes, so the fp32 recipe reproduces JAX's own dot gradients bit for bit.
    ``a_key``/``b_key``: PRNG keys of operands that round stochastically.

    ``dot`` (:attr:`Recipe.dot`) picks how a GEMM whose two operands hold only
    bfloat16 values (:func:`bf16_exact`) is computed on the CPU: ``"f32"``,
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
    """:func:`quantized_matmul` before its output rounding: the float32 accumulation."""
    if backend == "pallas" and a_spec is not None and b_spec is not None:
        # both operands MX: Pallas quantize kernels + MX GEMM, no transposes materialized (mx_proxy/pallas/README.md).
        # A GEMM with an unquantized operand is an ordinary GEMM: the XLA code below, on every backend.
        out = mx_dot(vround(a, vector, rounding), vround(b, vector, rounding), a_spec, b_spec,
                     a_contract_axis=-1 if a_axis == 1 else 0, b_contract_axis=b_axis)
    else:
        dims = (((a_axis,), (b_axis,)), ((), ()))
        qa = quantize_operand(a, a_spec, a_axis, vector, a_key, rounding)
        qb = quantize_operand(b, b_spec, b_axis, vector, b_key, rounding)

        def f32_dot(qa, qb):  # a real float32 GEMM (on NVIDIA GPUs the default precision would be TF32)
            return jax.lax.dot_general(qa, qb, dims, precision=_HIGHEST)

        def bf16_dot(qa, qb):  # exact: both operands are bf16 values; float32 accumulation on tensor cores
            return jax.lax.dot_general(qa.astype(jnp.bfloat16), qb.astype(jnp.bfloat16), dims,
                                       preferred_element_type=jnp.float32)

        def cpu_bf16_dot(qa, qb):
            # YNNPACK's bf16 GEMM is fast for a (M, K) @ (K, N) and (M, K) x (N, K) but not when a's K is
            # its major axis (the wgrad GEMM): give that operand a row-major (K-minor) transposed copy, in a
            # loop of its own, not fused with the quantizer's (mx_proxy.nn.copies). Where b is narrow enough
            # (a layer that narrows, as the MLP's second), (b^T a)^T moves fewer bytes: b's transposed copy and
            # the float32 (N, M) product's, 4 N (K + 2 M) bytes against a's 4 K M. The same products, float32 sums.
            qa, qb = qa.astype(jnp.bfloat16), qb.astype(jnp.bfloat16)
            if a_axis == 0:
                if wgrad_transposed(qa.shape[-2], qa.shape[-1], qb.shape[-1 - b_axis]):
                    qbt = transposed_copy(qb) if b_axis == 0 else qb
                    out_t = jax.lax.dot_general(qbt, qa, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
                    return transposed_copy(out_t)
                qa = transposed_copy(qa)
                return jax.lax.dot_general(qa, qb, (((1,), (b_axis,)), ((), ())), preferred_element_type=jnp.float32)
            return jax.lax.dot_general(qa, qb, dims, preferred_element_type=jnp.float32)

        if bf16_exact(a_spec, vector) and bf16_exact(b_spec, vector):
            cpu = cpu_bf16_dot if dot == "bf16" else f32_dot
            out = jax.lax.platform_dependent(qa, qb, cuda=bf16_dot, rocm=bf16_dot, default=cpu)
        else:
            out = f32_dot(qa, qb)
    return out


def wgrad_transposed(k: int, m: int, n: int) -> bool:
    """Whether the CPU bf16 dot takes a GEMM whose first operand ``a (K, M)``
    is contracted over its major axis (the wgrad, with ``b (K, N)``) as
    ``(bᵀ a)ᵀ``: b's transposed copy and the float32 ``(N, M)`` product's,
    ``4 N (K + 2 M)`` bytes, against a's transposed copy, ``4 K M``."""
    return n * (k + 2 * m) < k * m


def bf16_exact(spec: MXSpec | None, vector: str) -> bool:
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
    y = quantized_matmul(x, w, r.fwd_x, r.fwd_w, v, r.backend, rounding=rnd, dot=r.dot,
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
    dx = quantized_matmul(g, w, r.dgrad_g, r.dgrad_w, v, r.backend, a_axis=1, b_axis=1,  # over out-features
                   rounding=rnd, dot=r.dot,
                   a_key=operand_key(key, r, "dgrad_g"), b_key=operand_key(key, r, "dgrad_w"))
    dw = round_grad(_gemm(x, g, r.wgrad_x, r.wgrad_g, v, r.backend, 0, 0,  # over the batch
                           operand_key(key, r, "wgrad_x"), operand_key(key, r, "wgrad_g"), rnd, r.dot), v, rnd)
    db = None if b is None else round_grad(jnp.sum(g, axis=0), v, rnd)
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
        the recipe rounds stochastically (each operand folds in its index, see
        :func:`operand_key`), ignored otherwise.

    Returns:
      (..., out_features) float32.
    """
    stochastic = any(getattr(recipe, r) is not None and getattr(recipe, r).rounding == "stochastic" for r in OPERANDS)
    if key is None and stochastic:
        raise ValueError(f"recipe {recipe.name!r} rounds stochastically; mx_dense needs a PRNG key "
                         "(mx_dense(x, w, b, recipe, key=jax.random.key(0)))")
    if not stochastic:
        key = None  # deterministic recipe: the key plays no part (and the program stays the same)
    lead = x.shape[:-1]
    y = _dense2d(x.reshape(-1, x.shape[-1]), w, b, key, recipe)
    return y.reshape(*lead, w.shape[1])

