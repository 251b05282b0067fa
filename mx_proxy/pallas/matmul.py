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
:func:`mma_tolerance` adds ``2**-8 (|qa| @ |qb|)`` for that.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from mx_proxy.numerics import formats as _formats
from mx_proxy.numerics.quantize import MXSpec, quantize
from mx_proxy.pallas import backend
from mx_proxy.pallas import quantize as mxq
from mx_proxy.pallas.gemm import gemm, tuning_mode
from mx_proxy.pallas.operand import (CHUNK, GEMM_DTYPES, ZERO_BLOCK_SCALE, MXOperand, operand_from_codes,
                                     quantize_operand)
from mx_proxy.pallas.tuning import GemmConfig, config_for

__all__ = [
    "mx_matmul", "mx_matmul_reference", "mx_gemm", "mx_scaled_matmul", "mx_scaled_matmul_reference", "mx_dot",
    "A_LAYOUTS", "B_LAYOUTS", "OUT_DTYPES", "METHODS", "resolve_config", "accumulation_tolerance", "mma_tolerance",
]

A_LAYOUTS = ("mk", "km")  # a as (M, K) [lax.scaled_dot] or (K, M)
B_LAYOUTS = ("kn", "nk")  # b as (K, N) [lax.scaled_dot] or K-major (N, K) [jax.nn.scaled_matmul]
OUT_DTYPES = ("float32", "bfloat16", "float16")
METHODS = ("fused", "two_pass")
_HIGHEST = jax.lax.Precision.HIGHEST


# ----------------------------------------------------------------------------
# validation


def _check_choice(value, valid, what):
    if value not in valid:
        raise ValueError(f"{what} {value!r} is not supported; valid: {', '.join(map(repr, valid))}")
    return value


def _check_out_dtype(out_dtype) -> str:
    try:
        name = jnp.dtype(out_dtype).name
    except TypeError:
        name = repr(out_dtype)
    return _check_choice(name, OUT_DTYPES, "out_dtype")


def _check_matrix(x, what):
    x = jnp.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"{what} must be a matrix (rank 2), got shape {tuple(x.shape)}")
    return x


def _k_axis(layout: str) -> int:
    """Axis of K in an operand stored in ``layout`` ("mk", "km", "kn", "nk")."""
    return layout.index("k")


def _sizes(x, layout: str) -> tuple[int, int]:
    """(non-contracted size, K) of an operand stored in ``layout``."""
    ka = _k_axis(layout)
    return x.shape[1 - ka], x.shape[ka]


def _check_mnk(a, b, a_layout, b_layout, what=("a", "b")) -> tuple[int, int, int]:
    (m, k), (n, kb) = _sizes(a, a_layout), _sizes(b, b_layout)
    if k != kb:
        raise ValueError(f"contraction sizes differ: {what[0]} {tuple(a.shape)} (a_layout={a_layout!r}, K={k}), "
                         f"{what[1]} {tuple(b.shape)} (b_layout={b_layout!r}, K={kb})")
    return m, n, k


def resolve_config(m: int, n: int, k: int, mode: str, interpret: bool, block_sizes=None,
                   config: GemmConfig | None = None) -> GemmConfig:
    """The GEMM configuration: ``config`` as given, else the tuned one for the
    shape (:func:`mx_proxy.pallas.tuning.config_for`) with ``block_sizes=(bm, bn, bk)``
    replacing its tiles if given.

    Raises:
      ValueError: bad ``block_sizes`` / ``config`` (naming the valid choices).
    """
    if config is not None:
        if not isinstance(config, GemmConfig):
            raise ValueError(f"config must be an mx_proxy.pallas.tuning.GemmConfig or None, got {type(config).__name__}")
        return config
    cfg = config_for(m, n, k, mode, interpret)
    if block_sizes is None:
        return cfg
    if not (isinstance(block_sizes, (tuple, list)) and len(block_sizes) == 3):
        raise ValueError(f"block_sizes must be (bm, bn, bk) or None, got {block_sizes!r}")
    return cfg.replace(bm=block_sizes[0], bn=block_sizes[1], bk=block_sizes[2])


def accumulation_tolerance(qa, qb) -> np.ndarray:
    """Elementwise bound on ``|kernel - reference|`` for ``qa (M, K) @ qb (K, N)``.

    Both sides add the same exact float32 products in different orders; each
    sum is within ``K * u * sum_k |qa[m, k] * qb[k, n]|`` (u = 2**-24) of the
    exact value, so they differ by at most twice that. ``2**-126 * K`` more
    covers products flushed to zero where float32 subnormals are (XLA CPU).
    Host-side float64 (for tests and the benchmark's sanity column).
    """
    qa = np.nan_to_num(np.abs(np.asarray(qa, np.float64)), nan=0.0)
    qb = np.nan_to_num(np.abs(np.asarray(qb, np.float64)), nan=0.0)
    k = qa.shape[1]
    return 2.0 * k * 2.0**-24 * (qa @ qb) + k * 2.0**-126


def mma_tolerance(qa, qb) -> np.ndarray:
    """:func:`accumulation_tolerance` plus ``2**-8 (|qa| @ |qb|)``: the FP8 tensor
    cores of Hopper sum the products of a 32-deep chunk in a fixed-point
    window of about 14 bits (DeepSeek-V3, sec. 3.3.2); with at least 13 bits
    each of the 32 products loses at most ``2**-13`` of the largest, i.e. at
    most ``2**-8`` of the chunk's sum of magnitudes. For compiled fp8-mode
    results on a GPU; interpreted kernels meet :func:`accumulation_tolerance`."""
    qa64 = np.nan_to_num(np.abs(np.asarray(qa, np.float64)), nan=0.0)
    qb64 = np.nan_to_num(np.abs(np.asarray(qb, np.float64)), nan=0.0)
    return accumulation_tolerance(qa, qb) + 2.0**-8 * (qa64 @ qb64)


# ----------------------------------------------------------------------------
# fused


def _xla_matmul(a, b, a_spec, b_spec, a_layout, b_layout, out_name):
    """The GEMM with an unquantized operand: XLA quantize + float32 dot at HIGHEST."""
    qa = a.astype(jnp.float32) if a_spec is None else quantize(a, a_spec, _k_axis(a_layout))
    qb = b.astype(jnp.float32) if b_spec is None else quantize(b, b_spec, _k_axis(b_layout))
    dims = (((_k_axis(a_layout),), (_k_axis(b_layout),)), ((), ()))
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
    a, b = _check_matrix(a, "a"), _check_matrix(b, "b")
    a_spec, b_spec = mxq.check_spec(a_spec, "a_spec"), mxq.check_spec(b_spec, "b_spec")
    _check_choice(a_layout, A_LAYOUTS, "a_layout")
    _check_choice(b_layout, B_LAYOUTS, "b_layout")
    out_name = _check_out_dtype(out_dtype)
    m, n, k = _check_mnk(a, b, a_layout, b_layout)
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
    qa = quantize_operand(a, a_spec, _k_axis(a_layout), row_multiple=cfg.bm, k_multiple=k_multiple, interpret=interp)
    qb = quantize_operand(b, b_spec, _k_axis(b_layout),
                          row_multiple=cfg.bn, k_multiple=k_multiple, interpret=interp)
    return gemm(qa, qb, cfg, out_name, interp)


def mx_matmul_reference(a, b, a_spec: MXSpec | None, b_spec: MXSpec | None, *, out_dtype=jnp.float32,
                        a_layout: str = "mk", b_layout: str = "kn") -> jax.Array:
    """Plain JAX: ``mxp.quantize`` both operands along K, ``jnp.dot`` at HIGHEST, float32."""
    qa = a.astype(jnp.float32) if a_spec is None else quantize(a, a_spec, _k_axis(a_layout))
    qb = b.astype(jnp.float32) if b_spec is None else quantize(b, b_spec, _k_axis(b_layout))
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
    out_name = _check_out_dtype(out_dtype)
    interp = backend.resolve_interpret(interpret)
    mode = tuning_mode(a.gemm_dtype, a.block_size, b.gemm_dtype, b.block_size)
    cfg = resolve_config(a.rows, b.rows, a.k, mode, interp, block_sizes, config)
    return gemm(a, b, cfg, out_name, interp)


_CODE_DTYPES = {"fp8_e4m3": jnp.float8_e4m3fn, "fp8_e5m2": jnp.float8_e5m2}


def _as_code_bytes(codes, fmt, what):
    codes = _check_matrix(codes, what)
    if codes.dtype == jnp.uint8:
        return codes
    if fmt.name in _CODE_DTYPES and codes.dtype == _CODE_DTYPES[fmt.name]:
        return jax.lax.bitcast_convert_type(codes, jnp.uint8)
    valid = ["uint8"] + ([jnp.dtype(_CODE_DTYPES[fmt.name]).name] if fmt.name in _CODE_DTYPES else [])
    raise ValueError(f"{what} for {fmt.name} must have dtype {' or '.join(valid)} (codes one per byte, see "
                     f"mx_proxy.pallas.quantize), got {codes.dtype}")


def _as_scale_bytes(scales, what):
    scales = _check_matrix(scales, what)
    if scales.dtype == jnp.uint8:
        return scales
    if scales.dtype == jnp.float8_e8m0fnu:
        return jax.lax.bitcast_convert_type(scales, jnp.uint8)
    raise ValueError(f"{what} must be E8M0 bytes: dtype uint8 or float8_e8m0fnu, got {scales.dtype}")


def _block_size_of(codes, scales, layout: str, what: str) -> int:
    """Block size of a packed operand from its code and scale shapes (same layout, K divided)."""
    other, k = _sizes(codes, layout)
    s_other, k_scales = _sizes(scales, layout)
    expect = "(K/block, {0})" if _k_axis(layout) == 0 else "({0}, K/block)"
    if s_other != other:
        raise ValueError(f"{what} must be {expect.format(other)} for layout {layout!r}, got {tuple(scales.shape)}")
    if k_scales == 0 or k % k_scales or not backend.is_pow2(k // k_scales):
        raise ValueError(f"{what}: K={k} codes with {k_scales} scales per row/column; K must be a "
                         "power-of-two multiple of the scale count (block sizes 1, 2, 4, ..., 32, ...)")
    return k // k_scales


def _check_scaled(a_codes, a_scales, b_codes, b_scales, a_format, b_format, a_layout, b_layout):
    a_fmt = _formats.get(a_format)
    b_fmt = _formats.get(b_format)
    for f, what in ((a_fmt, "a_format"), (b_fmt, "b_format")):
        _check_choice(f.name, mxq.MX_FORMATS, what)
    _check_choice(a_layout, A_LAYOUTS, "a_layout")
    _check_choice(b_layout, B_LAYOUTS, "b_layout")
    ac, asc = _as_code_bytes(a_codes, a_fmt, "a_codes"), _as_scale_bytes(a_scales, "a_scales")
    bc, bsc = _as_code_bytes(b_codes, b_fmt, "b_codes"), _as_scale_bytes(b_scales, "b_scales")
    mnk = _check_mnk(ac, bc, a_layout, b_layout, what=("a_codes", "b_codes"))
    a_bs = _block_size_of(ac, asc, a_layout, "a_scales")
    b_bs = _block_size_of(bc, bsc, b_layout, "b_scales")
    return a_fmt, b_fmt, ac, asc, bc, bsc, a_bs, b_bs, mnk


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
      a_format, b_format: element format names (see ``mx_proxy.pallas.quantize.MX_FORMATS``).
      out_dtype, block_sizes, config, interpret: as for :func:`mx_matmul`.

    Returns:
      (M, N) ``sum_k dequant(a)[m, k] * dequant(b)[k, n]``; the dequantized
      values are exactly those of ``mx_proxy.pallas.quantize.dequantize``. The codes
      are converted to GEMM operands with XLA first (FP6 to E4M3 codes by a
      64-entry table, FP4 packed, K-major); prequantized
      :class:`~mx_proxy.pallas.operand.MXOperand` s skip that (:func:`mx_gemm`).
    """
    a_fmt, b_fmt, ac, asc, bc, bsc, a_bs, b_bs, (m, n, k) = _check_scaled(
        a_codes, a_scales, b_codes, b_scales, a_format, b_format, a_layout, b_layout)
    out_name = _check_out_dtype(out_dtype)
    interp = backend.resolve_interpret(interpret)
    mode = tuning_mode(GEMM_DTYPES[a_fmt.name], a_bs, GEMM_DTYPES[b_fmt.name], b_bs)
    cfg = resolve_config(m, n, k, mode, interp, block_sizes, config)
    k_multiple = max(cfg.bk, 2 * CHUNK, a_bs, b_bs)
    qa = operand_from_codes(ac, asc, a_fmt.name, a_bs, _k_axis(a_layout), row_multiple=cfg.bm, k_multiple=k_multiple)
    qb = operand_from_codes(bc, bsc, b_fmt.name, b_bs, _k_axis(b_layout), row_multiple=cfg.bn,
                            k_multiple=k_multiple)
    return gemm(qa, qb, cfg, out_name, interp)


def mx_scaled_matmul_reference(a_codes, a_scales, b_codes, b_scales, a_format: str, b_format: str, *,
                               out_dtype=jnp.float32, a_layout: str = "mk", b_layout: str = "kn") -> jax.Array:
    """Reference for :func:`mx_scaled_matmul`: exact host dequantization
    (:func:`mx_proxy.pallas.quantize.dequantize_reference`, ml_dtypes) then
    ``jnp.dot`` at HIGHEST. (The tests also compare FP8/FP4 operands with
    ``jax.lax.scaled_dot``, which cannot take FP6 or MXINT8 codes.)"""
    a_fmt, b_fmt, ac, asc, bc, bsc, a_bs, b_bs, _ = _check_scaled(
        a_codes, a_scales, b_codes, b_scales, a_format, b_format, a_layout, b_layout)
    ka, kb = _k_axis(a_layout), _k_axis(b_layout)
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
    _check_choice(method, METHODS, "method")
    _check_choice(a_contract_axis, (-1, 0), "a_contract_axis")
    _check_choice(b_contract_axis, (0, 1), "b_contract_axis")
    a = jnp.asarray(a)
    if a_contract_axis == 0:
        a2, lead, a_layout = _check_matrix(a, "a (with a_contract_axis=0)"), (), "km"
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
        b = _check_matrix(b, "b")
        _check_mnk(a2, b, a_layout, b_layout)
        ta = mxq.quantize_packed(a2, mxq.check_spec(a_spec, "a_spec"), _k_axis(a_layout), interpret=interpret)
        tb = mxq.quantize_packed(b, mxq.check_spec(b_spec, "b_spec"), _k_axis(b_layout), interpret=interpret)
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
