"""Block-scaled (MX) matmuls as Pallas kernels, each beside its plain-JAX reference.

``mx_matmul(a, b, a_spec, b_spec)`` -- fused: ``a (M, K) @ b (K, N)`` where
every program of the (M/bm, N/bn) grid walks K in steps of ``bk``, loads a
``(bm, bk)`` tile of ``a`` and a ``(bk, bn)`` tile of ``b`` in their input
dtype, MX-quantizes both along K in-register exactly as ``proxy.quantize``
does (the shared bit arithmetic of :mod:`kernels.mx_quantize`), and
accumulates ``dot(qa, qb)`` in float32. No fake-quantized copy of either
operand is written to memory.

``mx_scaled_matmul(a_codes, a_scales, b_codes, b_scales, ...)`` -- the
prequantized variant: element codes + E8M0 scale bytes in the layout of
``jax.lax.scaled_dot`` (``a (M, K)`` with scales ``(M, K/bs)``; ``b (K, N)``
with ``(K/bs, N)``, or with ``b_layout="nk"`` the K-major ``(N, K)`` /
``(N, K/bs)`` of ``jax.nn.scaled_matmul``), dequantized tile by tile in the
kernel.

``mx_dot(a, b, a_spec, b_spec)`` -- the entry point for ``proxy.layers``:
contracts a's last axis with b's first (or, ``b_contract_axis=1``, b's
second), flattening the other axes; not differentiable by itself.

Tile products. A quantized tile holds values ``element * 2**e``; every MX
element has at most 8 significant bits (MXINT8: 7, FP8: <= 4), so the tile is
exact in bfloat16 (same exponent range as float32), and a bf16 x bf16 dot
with float32 accumulation -- the Hopper tensor-core path -- forms every
product exactly. Only float32-subnormal tile values (block amax below about
2**-118) can lose bits in the bf16 tile; XLA CPU flushes those anyway. When
an operand is unquantized (spec ``None``) the tile dot runs in float32 with
``precision=HIGHEST`` (no TF32), i.e. the reference's numerics.

Agreement with the reference: quantized values bit for bit; the products
differ only by float32 summation order, ``|kernel - ref| <= 2 * K * 2**-24 *
(|qa| @ |qb|)`` elementwise (both sums carry at most ``K * u * sum|p|`` error,
``u = 2**-24``), which the tests check.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from kernels import backend
from kernels import mx_quantize as mxq
from proxy import formats as _formats
from proxy.quantize import MXSpec

__all__ = [
    "mx_matmul", "mx_matmul_reference", "mx_scaled_matmul", "mx_scaled_matmul_reference", "mx_dot",
    "B_LAYOUTS", "OUT_DTYPES", "METHODS", "default_block_sizes", "accumulation_tolerance",
]

B_LAYOUTS = ("kn", "nk")  # b as (K, N) [lax.scaled_dot] or K-major (N, K) [jax.nn.scaled_matmul]
OUT_DTYPES = ("float32", "bfloat16", "float16")
METHODS = ("fused", "two_pass")
MIN_DOT_DIM = 16  # Triton/tensor-core minimum for every dot dimension


# ----------------------------------------------------------------------------
# validation shared by both kernels


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


def default_block_sizes(m: int, n: int, k: int, k_multiple: int, interpret: bool) -> tuple[int, int, int]:
    """(bm, bn, bk) when the caller gives none: powers of two, each >= 16.

    Compiled: 64 x 64 x max(32, block size) (untuned on a GPU so far, see
    README). Interpreted: tiles as large as the problem allows (up to 256 x
    256 x 512), because the interpreter pays per grid step, not per FLOP.
    """
    if interpret:
        bm = min(256, max(MIN_DOT_DIM, backend.next_pow2(m)))
        bn = min(256, max(MIN_DOT_DIM, backend.next_pow2(n)))
        bk = max(k_multiple, MIN_DOT_DIM, min(512, backend.next_pow2(k)))
        return bm, bn, bk
    return 64, 64, max(32, k_multiple)


def _check_block_sizes(block_sizes, k_multiple: int) -> tuple[int, int, int]:
    if not (isinstance(block_sizes, (tuple, list)) and len(block_sizes) == 3):
        raise ValueError(f"block_sizes must be (bm, bn, bk) or None, got {block_sizes!r}")
    for name, v in zip(("bm", "bn", "bk"), block_sizes):
        if not backend.is_pow2(v) or v < MIN_DOT_DIM:
            raise ValueError(
                f"block_sizes {name}={v!r} is invalid; valid: a power of two >= {MIN_DOT_DIM} "
                "(16, 32, 64, 128, ...)"
            )
    bk = block_sizes[2]
    if bk % k_multiple:
        raise ValueError(
            f"block_sizes bk={bk} must be a multiple of the operands' MX block size {k_multiple}; "
            f"valid: {k_multiple}, {2 * k_multiple}, {4 * k_multiple}, ..."
        )
    return tuple(int(v) for v in block_sizes)


def _pad2(x, rows: int, cols: int):
    pr, pc = -x.shape[0] % rows, -x.shape[1] % cols
    return jnp.pad(x, ((0, pr), (0, pc))) if pr or pc else x


def _launch(num_tiles: int) -> dict:
    """Triton launch parameters by tile size (untuned defaults)."""
    return dict(num_warps=8 if num_tiles >= 128 * 128 else 4, num_stages=2)


def _tile_dot(a, b, *, exact_bf16: bool, b_kmajor: bool):
    """float32 (bm, bn) product of an (bm, bk) tile and a (bk, bn) / (bn, bk) tile."""
    dims = (((1,), (1 if b_kmajor else 0,)), ((), ()))
    if exact_bf16:
        return jax.lax.dot_general(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16), dims,
                                   preferred_element_type=jnp.float32)
    return jax.lax.dot_general(a.astype(jnp.float32), b.astype(jnp.float32), dims,
                               precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)


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


# ----------------------------------------------------------------------------
# fused kernel: quantize tiles along K, then dot


def _quantized_tile(x, spec: MXSpec | None, axis: int):
    if spec is None:
        return x.astype(jnp.float32)
    return mxq.fake_quantize_tile(x, spec, axis)


def _fused_kernel(a_ref, b_ref, o_ref, *, a_spec, b_spec, bk: int, b_kmajor: bool):
    bm, bn = o_ref.shape
    nk = a_ref.shape[1] // bk
    exact_bf16 = a_spec is not None and b_spec is not None

    def body(kk, acc):
        k0 = pl.multiple_of(kk * bk, bk)
        a = _quantized_tile(a_ref[:, pl.ds(k0, bk)], a_spec, 1)
        if b_kmajor:
            b = _quantized_tile(b_ref[:, pl.ds(k0, bk)], b_spec, 1)
        else:
            b = _quantized_tile(b_ref[pl.ds(k0, bk), :], b_spec, 0)
        return acc + _tile_dot(a, b, exact_bf16=exact_bf16, b_kmajor=b_kmajor)

    acc = jax.lax.fori_loop(0, nk, body, jnp.zeros((bm, bn), jnp.float32))
    o_ref[...] = acc.astype(o_ref.dtype)


def mx_matmul(a, b, a_spec: MXSpec | None, b_spec: MXSpec | None, *, out_dtype=jnp.float32,
              block_sizes: tuple[int, int, int] | None = None, interpret: bool | None = None,
              b_layout: str = "kn") -> jax.Array:
    """Fused MX matmul ``quantize(a, a_spec, 1) @ quantize(b, b_spec, 0)``.

    Args:
      a: (M, K) float array (any float dtype; cast to float32 in the kernel).
      b: (K, N) float array, or (N, K) with ``b_layout="nk"`` (then quantized
        along its axis 1, still the contraction axis).
      a_spec, b_spec: :class:`proxy.MXSpec` (rounding "even" or "away",
        power-of-two block size) or None for an unquantized operand.
      out_dtype: float32 (default), bfloat16 or float16; accumulation is float32.
      block_sizes: (bm, bn, bk), powers of two >= 16, bk a multiple of the MX
        block sizes; None picks :func:`default_block_sizes`.
      interpret: None (auto: interpreted on CPU), True or False.
      b_layout: "kn" or "nk".

    Returns:
      (M, N) array of ``out_dtype``.

    Raises:
      ValueError: mismatched K, bad specs/block sizes/layout/dtype, naming the
        valid choices.
    """
    a, b = _check_matrix(a, "a"), _check_matrix(b, "b")
    a_spec, b_spec = mxq.check_spec(a_spec, "a_spec"), mxq.check_spec(b_spec, "b_spec")
    _check_choice(b_layout, B_LAYOUTS, "b_layout")
    out_name = _check_out_dtype(out_dtype)
    m, k = a.shape
    n, kb = (b.shape[1], b.shape[0]) if b_layout == "kn" else b.shape
    if k != kb:
        raise ValueError(f"contraction sizes differ: a is {tuple(a.shape)} (K={k}), b is {tuple(b.shape)} "
                         f"(K={kb} with b_layout={b_layout!r})")
    for x, what in ((a, "a"), (b, "b")):
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"{what} must be a float array (float32, bfloat16, float16), got {x.dtype}")
    interp = backend.resolve_interpret(interpret)
    k_multiple = max([s.block_size for s in (a_spec, b_spec) if s is not None] + [1])
    if block_sizes is None:
        block_sizes = default_block_sizes(m, n, k, max(k_multiple, MIN_DOT_DIM), interp)
    block_sizes = _check_block_sizes(block_sizes, k_multiple)
    return _mx_matmul(a, b, a_spec, b_spec, out_name, block_sizes, interp, b_layout == "nk")


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5, 6, 7))
def _mx_matmul(a, b, a_spec, b_spec, out_name, block_sizes, interpret, b_kmajor):
    bm, bn, bk = block_sizes
    m, n = a.shape[0], (b.shape[0] if b_kmajor else b.shape[1])
    a = _pad2(a, bm, bk)
    b = _pad2(b, bn, bk) if b_kmajor else _pad2(b, bk, bn)
    mp, kp = a.shape
    np_ = b.shape[0] if b_kmajor else b.shape[1]
    b_spec_block = (pl.BlockSpec((bn, kp), lambda i, j: (j, 0)) if b_kmajor
                    else pl.BlockSpec((kp, bn), lambda i, j: (0, j)))
    out = backend.pallas_call(
        functools.partial(_fused_kernel, a_spec=a_spec, b_spec=b_spec, bk=bk, b_kmajor=b_kmajor),
        out_shape=jax.ShapeDtypeStruct((mp, np_), jnp.dtype(out_name)),
        grid=(mp // bm, np_ // bn),
        in_specs=[pl.BlockSpec((bm, kp), lambda i, j: (i, 0)), b_spec_block],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        interpret=interpret, name="mx_matmul", **_launch(bm * bn),
    )(a, b)
    return out[:m, :n]


@functools.partial(jax.jit, static_argnames=("a_spec", "b_spec", "out_dtype", "b_layout"))
def mx_matmul_reference(a, b, a_spec: MXSpec | None, b_spec: MXSpec | None, *, out_dtype=jnp.float32,
                        b_layout: str = "kn") -> jax.Array:
    """Plain JAX: ``proxy.quantize`` both operands along K, ``jnp.dot`` at HIGHEST, float32."""
    import proxy

    qa = a.astype(jnp.float32) if a_spec is None else proxy.quantize(a, a_spec, 1)
    qb = b.astype(jnp.float32) if b_spec is None else proxy.quantize(b, b_spec, 1 if b_layout == "nk" else 0)
    if b_layout == "nk":
        qb = qb.T
    return jnp.dot(qa, qb, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32).astype(out_dtype)


# ----------------------------------------------------------------------------
# prequantized kernel: codes + E8M0 scales, dequantized per tile


def _scaled_kernel(ac_ref, as_ref, bc_ref, bs_ref, o_ref, *, a_fmt, b_fmt, a_bs: int, b_bs: int, bk: int,
                   b_kmajor: bool):
    bm, bn = o_ref.shape
    nk = ac_ref.shape[1] // bk

    def body(kk, acc):
        k0 = pl.multiple_of(kk * bk, bk)
        sa0 = pl.multiple_of(kk * (bk // a_bs), bk // a_bs)
        sb0 = pl.multiple_of(kk * (bk // b_bs), bk // b_bs)
        a = mxq.decode_tile(ac_ref[:, pl.ds(k0, bk)], as_ref[:, pl.ds(sa0, bk // a_bs)], a_fmt, 1, a_bs)
        if b_kmajor:
            b = mxq.decode_tile(bc_ref[:, pl.ds(k0, bk)], bs_ref[:, pl.ds(sb0, bk // b_bs)], b_fmt, 1, b_bs)
        else:
            b = mxq.decode_tile(bc_ref[pl.ds(k0, bk), :], bs_ref[pl.ds(sb0, bk // b_bs), :], b_fmt, 0, b_bs)
        return acc + _tile_dot(a, b, exact_bf16=True, b_kmajor=b_kmajor)

    acc = jax.lax.fori_loop(0, nk, body, jnp.zeros((bm, bn), jnp.float32))
    o_ref[...] = acc.astype(o_ref.dtype)


_CODE_DTYPES = {"fp8_e4m3": jnp.float8_e4m3fn, "fp8_e5m2": jnp.float8_e5m2}


def _as_code_bytes(codes, fmt, what):
    codes = _check_matrix(codes, what)
    if codes.dtype == jnp.uint8:
        return codes
    if fmt.name in _CODE_DTYPES and codes.dtype == _CODE_DTYPES[fmt.name]:
        return jax.lax.bitcast_convert_type(codes, jnp.uint8)
    valid = ["uint8"] + ([jnp.dtype(_CODE_DTYPES[fmt.name]).name] if fmt.name in _CODE_DTYPES else [])
    raise ValueError(f"{what} for {fmt.name} must have dtype {' or '.join(valid)} (codes one per byte, see "
                     f"kernels.mx_quantize), got {codes.dtype}")


def _as_scale_bytes(scales, what):
    scales = _check_matrix(scales, what)
    if scales.dtype == jnp.uint8:
        return scales
    if scales.dtype == jnp.float8_e8m0fnu:
        return jax.lax.bitcast_convert_type(scales, jnp.uint8)
    raise ValueError(f"{what} must be E8M0 bytes: dtype uint8 or float8_e8m0fnu, got {scales.dtype}")


def _block_size_of(k: int, k_scales: int, what: str) -> int:
    if k_scales == 0 or k % k_scales or not backend.is_pow2(k // k_scales):
        raise ValueError(f"{what}: K={k} codes with {k_scales} scales per row/column; K must be a "
                         "power-of-two multiple of the scale count (block sizes 1, 2, 4, ..., 32, ...)")
    return k // k_scales


def _check_scaled(a_codes, a_scales, b_codes, b_scales, a_format, b_format, b_layout):
    a_fmt = _formats.get(a_format)
    b_fmt = _formats.get(b_format)
    for f, what in ((a_fmt, "a_format"), (b_fmt, "b_format")):
        _check_choice(f.name, mxq.MX_FORMATS, what)
    _check_choice(b_layout, B_LAYOUTS, "b_layout")
    ac, asc = _as_code_bytes(a_codes, a_fmt, "a_codes"), _as_scale_bytes(a_scales, "a_scales")
    bc, bsc = _as_code_bytes(b_codes, b_fmt, "b_codes"), _as_scale_bytes(b_scales, "b_scales")
    kmajor = b_layout == "nk"
    m, k = ac.shape
    n, kb = bc.shape if kmajor else bc.shape[::-1]
    if k != kb:
        raise ValueError(f"contraction sizes differ: a_codes {tuple(ac.shape)}, b_codes {tuple(bc.shape)} "
                         f"(b_layout={b_layout!r})")
    if asc.shape[0] != m:
        raise ValueError(f"a_scales must be (M, K/block) = ({m}, ...), got {tuple(asc.shape)}")
    a_bs = _block_size_of(k, asc.shape[1], "a_scales")
    if kmajor:
        if bsc.shape[0] != n:
            raise ValueError(f"b_scales must be (N, K/block) = ({n}, ...) for b_layout='nk', got {tuple(bsc.shape)}")
        b_bs = _block_size_of(k, bsc.shape[1], "b_scales")
    else:
        if bsc.shape[1] != n:
            raise ValueError(f"b_scales must be (K/block, N) = (..., {n}) for b_layout='kn', got {tuple(bsc.shape)}")
        b_bs = _block_size_of(k, bsc.shape[0], "b_scales")
    return a_fmt, b_fmt, ac, asc, bc, bsc, a_bs, b_bs, (m, n, k)


def mx_scaled_matmul(a_codes, a_scales, b_codes, b_scales, a_format: str, b_format: str, *,
                     out_dtype=jnp.float32, block_sizes: tuple[int, int, int] | None = None,
                     interpret: bool | None = None, b_layout: str = "kn") -> jax.Array:
    """Matmul of prequantized MX operands (codes + E8M0 scales), float32 accumulation.

    Args:
      a_codes: (M, K) uint8 codes (or float8 of a_format); K whole blocks.
      a_scales: (M, K/bs_a) uint8 or float8_e8m0fnu.
      b_codes: (K, N) codes, or (N, K) with ``b_layout="nk"``.
      b_scales: (K/bs_b, N), or (N, K/bs_b) with ``b_layout="nk"``.
      a_format, b_format: element format names (see ``kernels.mx_quantize.MX_FORMATS``).
      out_dtype, block_sizes, interpret, b_layout: as for :func:`mx_matmul`.

    Returns:
      (M, N) ``sum_k dequant(a)[m, k] * dequant(b)[k, n]``; the dequantized
      values are exactly those of ``kernels.mx_quantize.dequantize``.
    """
    a_fmt, b_fmt, ac, asc, bc, bsc, a_bs, b_bs, (m, n, k) = _check_scaled(
        a_codes, a_scales, b_codes, b_scales, a_format, b_format, b_layout)
    out_name = _check_out_dtype(out_dtype)
    interp = backend.resolve_interpret(interpret)
    k_multiple = max(a_bs, b_bs)
    if block_sizes is None:
        block_sizes = default_block_sizes(m, n, k, max(k_multiple, MIN_DOT_DIM), interp)
    block_sizes = _check_block_sizes(block_sizes, k_multiple)
    return _mx_scaled_matmul(ac, asc, bc, bsc, a_fmt, b_fmt, a_bs, b_bs, out_name, block_sizes, interp,
                             b_layout == "nk")


@functools.partial(jax.jit, static_argnums=tuple(range(4, 12)))
def _mx_scaled_matmul(ac, asc, bc, bsc, a_fmt, b_fmt, a_bs, b_bs, out_name, block_sizes, interpret, b_kmajor):
    bm, bn, bk = block_sizes
    m, n = ac.shape[0], (bc.shape[0] if b_kmajor else bc.shape[1])
    ac, asc = _pad2(ac, bm, bk), _pad2(asc, bm, bk // a_bs)
    if b_kmajor:
        bc, bsc = _pad2(bc, bn, bk), _pad2(bsc, bn, bk // b_bs)
    else:
        bc, bsc = _pad2(bc, bk, bn), _pad2(bsc, bk // b_bs, bn)
    mp, kp = ac.shape
    np_ = bc.shape[0] if b_kmajor else bc.shape[1]
    if b_kmajor:
        b_specs = [pl.BlockSpec((bn, kp), lambda i, j: (j, 0)), pl.BlockSpec((bn, kp // b_bs), lambda i, j: (j, 0))]
    else:
        b_specs = [pl.BlockSpec((kp, bn), lambda i, j: (0, j)), pl.BlockSpec((kp // b_bs, bn), lambda i, j: (0, j))]
    out = backend.pallas_call(
        functools.partial(_scaled_kernel, a_fmt=a_fmt, b_fmt=b_fmt, a_bs=a_bs, b_bs=b_bs, bk=bk, b_kmajor=b_kmajor),
        out_shape=jax.ShapeDtypeStruct((mp, np_), jnp.dtype(out_name)),
        grid=(mp // bm, np_ // bn),
        in_specs=[pl.BlockSpec((bm, kp), lambda i, j: (i, 0)),
                  pl.BlockSpec((bm, kp // a_bs), lambda i, j: (i, 0))] + b_specs,
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        interpret=interpret, name="mx_scaled_matmul", **_launch(bm * bn),
    )(ac, asc, bc, bsc)
    return out[:m, :n]


def mx_scaled_matmul_reference(a_codes, a_scales, b_codes, b_scales, a_format: str, b_format: str, *,
                               out_dtype=jnp.float32, b_layout: str = "kn") -> jax.Array:
    """Reference for :func:`mx_scaled_matmul`: exact host dequantization
    (:func:`kernels.mx_quantize.dequantize_reference`, ml_dtypes) then
    ``jnp.dot`` at HIGHEST. (The tests also compare FP8/FP4 operands with
    ``jax.lax.scaled_dot``, which cannot take FP6 or MXINT8 codes.)"""
    a_fmt, b_fmt, ac, asc, bc, bsc, a_bs, b_bs, _ = _check_scaled(
        a_codes, a_scales, b_codes, b_scales, a_format, b_format, b_layout)
    b_axis = 1 if b_layout == "nk" else 0
    qa = mxq.dequantize_reference(mxq.MXTensor(ac, asc, a_fmt.name, a_bs, 1, ac.shape[1]))
    qb = mxq.dequantize_reference(mxq.MXTensor(bc, bsc, b_fmt.name, b_bs, b_axis, bc.shape[b_axis]))
    if b_axis == 1:
        qb = qb.T
    out = jnp.dot(jnp.asarray(qa), jnp.asarray(qb), precision=jax.lax.Precision.HIGHEST,
                  preferred_element_type=jnp.float32)
    return out.astype(out_dtype)


# ----------------------------------------------------------------------------
# the entry point for proxy.layers


def _pad_k(t: mxq.MXTensor, kp: int):
    """Codes and scales of a packed matrix zero-padded along its block axis to kp elements."""
    extra = kp - t.codes.shape[t.axis]
    if not extra:
        return t.codes, t.scales
    widths = [(0, 0), (0, 0)]
    widths[t.axis] = (0, extra)
    swidths = [(0, 0), (0, 0)]
    swidths[t.axis] = (0, extra // t.block_size)
    return jnp.pad(t.codes, widths), jnp.pad(t.scales, swidths)


def mx_dot(a, b, a_spec: MXSpec | None, b_spec: MXSpec | None, *, b_contract_axis: int = 0,
           out_dtype=jnp.float32, method: str = "fused", block_sizes=None, interpret: bool | None = None):
    """One MX GEMM for the dense layer: contract a's last axis with b's axis
    ``b_contract_axis`` (0 or 1), each operand MX-quantized along it.

    Args:
      a: (..., K) float array; leading axes are flattened into M.
      b: (K, N) with ``b_contract_axis=0``, or (N, K) with 1 (e.g. a weight
        ``W (out, in)`` in ``x @ W.T`` without materializing ``W.T``).
      a_spec, b_spec: MXSpec or None (unquantized operand).
      out_dtype: float32, bfloat16 or float16.
      method: ``"fused"`` (quantize inside the matmul tiles; any spec may be
        None) or ``"two_pass"`` (``quantize_packed`` both operands with the
        quantize kernel, then :func:`mx_scaled_matmul`; needs both specs).
        Both give the same numbers up to float32 summation order.
      block_sizes, interpret: passed on.

    Returns:
      (..., N) array. Not differentiable on its own: the layer's custom_vjp
      calls it once per GEMM (forward, dgrad, wgrad).
    """
    _check_choice(method, METHODS, "method")
    _check_choice(b_contract_axis, (0, 1), "b_contract_axis")
    a = jnp.asarray(a)
    if a.ndim < 1:
        raise ValueError(f"a must have rank >= 1, got shape {tuple(a.shape)}")
    lead = a.shape[:-1]
    a2 = a.reshape(-1, a.shape[-1])
    layout = "kn" if b_contract_axis == 0 else "nk"
    if method == "fused":
        out = mx_matmul(a2, b, a_spec, b_spec, out_dtype=out_dtype, block_sizes=block_sizes,
                        interpret=interpret, b_layout=layout)
    else:
        if a_spec is None or b_spec is None:
            raise ValueError("method='two_pass' needs both a_spec and b_spec; for an unquantized operand use "
                             "method='fused'")
        b = _check_matrix(b, "b")
        if a2.shape[1] != b.shape[b_contract_axis]:
            raise ValueError(f"contraction sizes differ: a {tuple(a.shape)}, b {tuple(b.shape)} "
                             f"(b_contract_axis={b_contract_axis})")
        qa = mxq.quantize_packed(a2, mxq.check_spec(a_spec, "a_spec"), 1, interpret=interpret)
        qb = mxq.quantize_packed(b, mxq.check_spec(b_spec, "b_spec"), b_contract_axis, interpret=interpret)
        kp = max(qa.codes.shape[1], qb.codes.shape[b_contract_axis])  # whole blocks of both block sizes
        ac, asc = _pad_k(qa, kp)
        bc, bsc = _pad_k(qb, kp)
        out = mx_scaled_matmul(ac, asc, bc, bsc, qa.element, qb.element,
                               out_dtype=out_dtype, block_sizes=block_sizes, interpret=interpret,
                               b_layout=layout)
    return out.reshape(lead + out.shape[-1:])
