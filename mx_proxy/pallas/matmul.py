"""Block-scaled (MX) matmuls: the public entry points, each beside its plain-JAX reference.

``mx_matmul(a, b, a_spec, b_spec)`` -- fused: ``quantize(a) @ quantize(b)``
with each operand MX-quantized along K **once** by the Pallas quantize kernel
(:func:`mx_proxy.pallas.operand.quantize_operand`, written K-major in the form the
GEMM reads: FP8 codes, FP6 as E4M3 codes, FP4 packed two per byte), then the
MX GEMM kernel (:func:`mx_proxy.pallas.gemm.gemm`: FP8 tensor cores with
per-32-chunk E8M0 rescaling, or exact bf16 tiles). No float32 fake-quantized
copy of either operand is written. Either operand may be stored the other way
round (``a_layout="km"``: a is (K, M); ``b_layout="nk"``: b is (N, K),
K-major); the quantize kernel transposes tiles, so no caller materializes a
transpose. An unquantized operand (spec ``None``) makes it an ordinary GEMM:
it runs in XLA (``mxp.quantize`` of the other operand, float32 ``dot`` at
HIGHEST), never through Pallas.

``mx_gemm(a_op, b_op)`` -- prequantized :class:`~mx_proxy.pallas.operand.MXOperand`
pair (the fastest path when operands are reused). ``mx_scaled_matmul(a_codes,
a_scales, b_codes, b_scales, ...)`` -- prequantized codes + E8M0 scales in
the layouts of ``jax.lax.scaled_dot`` / ``jax.nn.scaled_matmul`` (converted to
operands with XLA, then the GEMM). ``mx_dot`` -- the entry point for
``mx_proxy.nn.layers`` (leading axes, contraction axes).

Agreement with the reference (interpret mode): quantized values bit for bit;
products exact; only the float32 summation order differs, elementwise within
:func:`accumulation_tolerance` ``= 2 K 2**-24 (|qa| @ |qb|) + K 2**-126``. On
Hopper, FP8 tensor cores keep fewer bits while summing a 32-deep chunk:
:func:`mma_tolerance` adds ``2**-8 (|qa| @ |qb|)`` for that (both in
:mod:`mx_proxy.pallas.tolerance`; the argument checks in
:mod:`mx_proxy.pallas.arguments`; both re-exported here).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mx_proxy.numerics.quantize import MXSpec, quantize
from mx_proxy.pallas import backend
from mx_proxy.pallas import quantize as mxq
from mx_proxy.pallas.arguments import (
    A_LAYOUTS,
    B_LAYOUTS,
    OUT_DTYPES,
    check_choice,
    check_matrix,
    check_mnk,
    check_out_dtype,
    check_scaled,
    k_axis,
    resolve_config,
)
from mx_proxy.pallas.gemm import gemm, tuning_mode
from mx_proxy.pallas.operand import (
    CHUNK,
    GEMM_DTYPES,
    ZERO_BLOCK_SCALE,
    MXOperand,
    operand_from_codes,
    quantize_operand,
)
from mx_proxy.pallas.supported import check_spec
from mx_proxy.pallas.tolerance import accumulation_tolerance, mma_tolerance
from mx_proxy.pallas.tuning import GemmConfig

__all__ = [
    "mx_matmul", "mx_matmul_reference", "mx_gemm", "mx_scaled_matmul", "mx_scaled_matmul_reference", "mx_dot",
    "A_LAYOUTS", "B_LAYOUTS", "OUT_DTYPES", "METHODS", "resolve_config", "accumulation_tolerance", "mma_tolerance",
]

METHODS = ("fused", "two_pass")
_HIGHEST = jax.lax.Precision.HIGHEST


# ----------------------------------------------------------------------------
# fused


def _xla_matmul(a, b, a_spec, b_spec, a_layout, b_layout, out_name):
    """The GEMM with an unquantized operand: XLA quantize + float32 dot at HIGHEST."""
    qa = a.astype(jnp.float32) if a_spec is None else quantize(a, a_spec, k_axis(a_layout))
    qb = b.astype(jnp.float32) if b_spec is None else quantize(b, b_spec, k_axis(b_layout))
    dims = (((k_axis(a_layout),), (k_axis(b_layout),)), ((), ()))
    return jax.lax.dot_general(qa, qb, dims, precision=_HIGHEST,
                               preferred_element_type=jnp.float32).astype(out_name)


def mx_matmul(a, b, a_spec: MXSpec | None, b_spec: MXSpec | None, *, out_dtype=jnp.float32,
              block_sizes: tuple[int, int, int] | None = None, config: GemmConfig | None = None,
              interpret: bool | None = None, a_layout: str = "mk", b_layout: str = "kn") -> jax.Array:
    """Fused MX matmul ``quantize(a, a_spec, K axis) @ quantize(b, b_spec, K axis)``.

    Args:
      a: (M, K) float array (any float dtype; cast to float32 in the kernel),
        or (K, M) with ``a_layout="km"``.
      b: (K, N) float array, or (N, K) with ``b_layout="nk"``.
      a_spec, b_spec: :class:`mxp.MXSpec` (rounding "even" or "away",
        power-of-two block size) or None for an unquantized operand (then the
        GEMM runs in XLA, see the module docstring).
      out_dtype: float32 (default), bfloat16 or float16; accumulation is float32.
      block_sizes: (bm, bn, bk) overriding the tuned tiles: powers of two >= 16,
        bk a multiple of 32.
      config: a full :class:`mx_proxy.pallas.tuning.GemmConfig` (tiles, warps, stages, order).
      interpret: None (auto: interpreted on CPU), True or False.
      a_layout, b_layout: see above.

    Returns:
      (M, N) array of ``out_dtype``.

    Raises:
      ValueError: mismatched K, bad specs/block sizes/layout/dtype, naming the
        valid choices.
    """
    a, b = check_matrix(a, "a"), check_matrix(b, "b")
    a_spec, b_spec = check_spec(a_spec, "a_spec"), check_spec(b_spec, "b_spec")
    check_choice(a_layout, A_LAYOUTS, "a_layout")
    check_choice(b_layout, B_LAYOUTS, "b_layout")
    out_name = check_out_dtype(out_dtype)
    m, n, k = check_mnk(a, b, a_layout, b_layout)
    for x, what in ((a, "a"), (b, "b")):
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"{what} must be a float array (float32, bfloat16, float16), got {x.dtype}")
    interp = backend.resolve_interpret(interpret)
    if a_spec is None or b_spec is None:
        resolve_config(m, n, k, "bf16", interp, block_sizes, config)  # validated all the same
        return _xla_matmul(a, b, a_spec, b_spec, a_layout, b_layout, out_name)
    mode = tuning_mode(GEMM_DTYPES[a_spec.element.name], a_spec.block_size, GEMM_DTYPES[b_spec.element.name],
                       b_spec.block_size)
    cfg = resolve_config(m, n, k, mode, interp, block_sizes, config)
    k_multiple = max(cfg.bk, 2 * CHUNK, a_spec.block_size, b_spec.block_size)
    qa = quantize_operand(a, a_spec, k_axis(a_layout), row_multiple=cfg.bm, k_multiple=k_multiple, interpret=interp)
    qb = quantize_operand(b, b_spec, k_axis(b_layout),
                          row_multiple=cfg.bn, k_multiple=k_multiple, interpret=interp)
    return gemm(qa, qb, cfg, out_name, interp)


def mx_matmul_reference(a, b, a_spec: MXSpec | None, b_spec: MXSpec | None, *, out_dtype=jnp.float32,
                        a_layout: str = "mk", b_layout: str = "kn") -> jax.Array:
    """Plain JAX: ``mxp.quantize`` both operands along K, ``jnp.dot`` at HIGHEST, float32."""
    qa = a.astype(jnp.float32) if a_spec is None else quantize(a, a_spec, k_axis(a_layout))
    qb = b.astype(jnp.float32) if b_spec is None else quantize(b, b_spec, k_axis(b_layout))
    qa = qa.T if a_layout == "km" else qa
    qb = qb.T if b_layout == "nk" else qb
    return jnp.dot(qa, qb, precision=_HIGHEST, preferred_element_type=jnp.float32).astype(out_dtype)


# ----------------------------------------------------------------------------
# prequantized


def mx_gemm(a: MXOperand, b: MXOperand, *, out_dtype=jnp.float32, block_sizes=None,
            config: GemmConfig | None = None, interpret: bool | None = None) -> jax.Array:
    """``values(a) @ values(b).T`` of two prequantized K-major operands
    (:func:`mx_proxy.pallas.operand.quantize_operand`): (M, N) of ``out_dtype``."""
    for op, what in ((a, "a"), (b, "b")):
        if not isinstance(op, MXOperand):
            raise ValueError(f"{what} must be an mx_proxy.pallas.operand.MXOperand, got {type(op).__name__}")
    if a.k != b.k:
        raise ValueError(f"contraction sizes differ: a has K={a.k}, b has K={b.k}")
    out_name = check_out_dtype(out_dtype)
    interp = backend.resolve_interpret(interpret)
    mode = tuning_mode(a.gemm_dtype, a.block_size, b.gemm_dtype, b.block_size)
    cfg = resolve_config(a.rows, b.rows, a.k, mode, interp, block_sizes, config)
    return gemm(a, b, cfg, out_name, interp)


def mx_scaled_matmul(a_codes, a_scales, b_codes, b_scales, a_format: str, b_format: str, *,
                     out_dtype=jnp.float32, block_sizes: tuple[int, int, int] | None = None,
                     config: GemmConfig | None = None, interpret: bool | None = None, a_layout: str = "mk",
                     b_layout: str = "kn") -> jax.Array:
    """Matmul of prequantized MX operands (codes + E8M0 scales), float32 accumulation.

    Args:
      a_codes: (M, K) uint8 codes in the ml_dtypes layout (or float8 of
        a_format), K whole blocks; (K, M) with ``a_layout="km"``.
      a_scales: (M, K/bs_a) uint8 or float8_e8m0fnu; (K/bs_a, M) with "km".
      b_codes: (K, N) codes, or (N, K) with ``b_layout="nk"``.
      b_scales: (K/bs_b, N), or (N, K/bs_b) with ``b_layout="nk"``.
      a_format, b_format: element format names (see ``mx_proxy.pallas.supported.MX_FORMATS``).
      out_dtype, block_sizes, config, interpret: as for :func:`mx_matmul`.

    Returns:
      (M, N) ``sum_k dequant(a)[m, k] * dequant(b)[k, n]``; the dequantized
      values are exactly those of ``mx_proxy.pallas.quantize.dequantize``. The codes
      are converted to GEMM operands with XLA first (FP6 to E4M3 codes by a
      64-entry table, FP4 packed, K-major); prequantized
      :class:`~mx_proxy.pallas.operand.MXOperand` s skip that (:func:`mx_gemm`).
    """
    a_fmt, b_fmt, ac, asc, bc, bsc, a_bs, b_bs, (m, n, k) = check_scaled(
        a_codes, a_scales, b_codes, b_scales, a_format, b_format, a_layout, b_layout)
    out_name = check_out_dtype(out_dtype)
    interp = backend.resolve_interpret(interpret)
    mode = tuning_mode(GEMM_DTYPES[a_fmt.name], a_bs, GEMM_DTYPES[b_fmt.name], b_bs)
    cfg = resolve_config(m, n, k, mode, interp, block_sizes, config)
    k_multiple = max(cfg.bk, 2 * CHUNK, a_bs, b_bs)
    qa = operand_from_codes(ac, asc, a_fmt.name, a_bs, k_axis(a_layout), row_multiple=cfg.bm, k_multiple=k_multiple)
    qb = operand_from_codes(bc, bsc, b_fmt.name, b_bs, k_axis(b_layout), row_multiple=cfg.bn,
                            k_multiple=k_multiple)
    return gemm(qa, qb, cfg, out_name, interp)


def mx_scaled_matmul_reference(a_codes, a_scales, b_codes, b_scales, a_format: str, b_format: str, *,
                               out_dtype=jnp.float32, a_layout: str = "mk", b_layout: str = "kn") -> jax.Array:
    """Reference for :func:`mx_scaled_matmul`: exact host dequantization
    (:func:`mx_proxy.pallas.quantize.dequantize_reference`, ml_dtypes) then
    ``jnp.dot`` at HIGHEST. (The tests also compare FP8/FP4 operands with
    ``jax.lax.scaled_dot``, which cannot take FP6 or MXINT8 codes.)"""
    a_fmt, b_fmt, ac, asc, bc, bsc, a_bs, b_bs, _ = check_scaled(
        a_codes, a_scales, b_codes, b_scales, a_format, b_format, a_layout, b_layout)
    ka, kb = k_axis(a_layout), k_axis(b_layout)
    qa = mxq.dequantize_reference(mxq.MXTensor(ac, asc, a_fmt.name, a_bs, ka, ac.shape[ka]))
    qb = mxq.dequantize_reference(mxq.MXTensor(bc, bsc, b_fmt.name, b_bs, kb, bc.shape[kb]))
    qa = qa.T if a_layout == "km" else qa
    qb = qb.T if b_layout == "nk" else qb
    out = jnp.dot(jnp.asarray(qa), jnp.asarray(qb), precision=_HIGHEST, preferred_element_type=jnp.float32)
    return out.astype(out_dtype)


# ----------------------------------------------------------------------------
# the entry point for mx_proxy.nn.layers


def mx_dot(a, b, a_spec: MXSpec | None, b_spec: MXSpec | None, *, a_contract_axis: int = -1,
           b_contract_axis: int = 0, out_dtype=jnp.float32, method: str = "fused", block_sizes=None,
           config: GemmConfig | None = None, interpret: bool | None = None):
    """One MX GEMM for the dense layer, each operand MX-quantized along K.

    Args:
      a: (..., K) float array with ``a_contract_axis=-1`` (leading axes are
        flattened into M), or a 2-D (K, M) array with ``a_contract_axis=0``
        (e.g. activations ``x (batch, in)`` in the wgrad ``x.T @ g``).
      b: (K, N) with ``b_contract_axis=0``, or (N, K) with 1 (e.g. a weight
        ``w (in, out)`` in the dgrad ``g @ w.T``).
      a_spec, b_spec: MXSpec or None (an unquantized operand: XLA, not Pallas).
      out_dtype: float32, bfloat16 or float16.
      method: ``"fused"`` (:func:`mx_matmul`: the quantize kernel writes GEMM
        operands, the GEMM kernel reads them) or ``"two_pass"`` (the public
        packed form in between: :func:`mx_proxy.pallas.quantize.quantize_packed`,
        then :func:`mx_scaled_matmul`; needs both specs). Both give the same
        numbers bit for bit (same operands, same tiles).
      block_sizes, config, interpret: passed on.

    Returns:
      (..., N) array, or (M, N) for ``a_contract_axis=0``. No transposes are
      materialized. Not differentiable on its own: the layer's custom_vjp
      calls it once per GEMM (forward, dgrad, wgrad).
    """
    check_choice(method, METHODS, "method")
    check_choice(a_contract_axis, (-1, 0), "a_contract_axis")
    check_choice(b_contract_axis, (0, 1), "b_contract_axis")
    a = jnp.asarray(a)
    if a_contract_axis == 0:
        a2, lead, a_layout = check_matrix(a, "a (with a_contract_axis=0)"), (), "km"
    else:
        if a.ndim < 1:
            raise ValueError(f"a must have rank >= 1, got shape {tuple(a.shape)}")
        a2, lead, a_layout = a.reshape(-1, a.shape[-1]), a.shape[:-1], "mk"
    b_layout = "kn" if b_contract_axis == 0 else "nk"
    if method == "fused":
        out = mx_matmul(a2, b, a_spec, b_spec, out_dtype=out_dtype, block_sizes=block_sizes, config=config,
                        interpret=interpret, a_layout=a_layout, b_layout=b_layout)
    else:
        if a_spec is None or b_spec is None:
            raise ValueError("method='two_pass' needs both a_spec and b_spec; for an unquantized operand use "
                             "method='fused'")
        b = check_matrix(b, "b")
        check_mnk(a2, b, a_layout, b_layout)
        ta = mxq.quantize_packed(a2, check_spec(a_spec, "a_spec"), k_axis(a_layout), interpret=interpret)
        tb = mxq.quantize_packed(b, check_spec(b_spec, "b_spec"), k_axis(b_layout), interpret=interpret)
        kp = max(ta.codes.shape[ta.axis], tb.codes.shape[tb.axis])  # whole blocks of both block sizes
        out = mx_scaled_matmul(*_pad_k(ta, kp), *_pad_k(tb, kp), ta.element, tb.element, out_dtype=out_dtype,
                               block_sizes=block_sizes, config=config, interpret=interpret, a_layout=a_layout,
                               b_layout=b_layout)
    return out if a_contract_axis == 0 else out.reshape(tuple(lead) + out.shape[-1:])


def _pad_k(t: mxq.MXTensor, kp: int):
    """Codes and scales of a packed matrix padded along its block axis to kp elements (zero codes, scale 2**0)."""
    extra = kp - t.codes.shape[t.axis]
    if not extra:
        return t.codes, t.scales
    widths = [(0, 0), (0, 0)]
    widths[t.axis] = (0, extra)
    swidths = [(0, 0), (0, 0)]
    swidths[t.axis] = (0, extra // t.block_size)
    return jnp.pad(t.codes, widths), jnp.pad(t.scales, swidths, constant_values=ZERO_BLOCK_SCALE)
