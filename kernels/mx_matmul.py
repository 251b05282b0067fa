"""Block-scaled (MX) matmuls as Pallas kernels, each beside its plain-JAX reference.

``mx_matmul(a, b, a_spec, b_spec)`` -- fused: ``a (M, K) @ b (K, N)`` where
every program of the (M/bm, N/bn) grid walks K in steps of ``bk``, loads a
``(bm, bk)`` tile of ``a`` and a ``(bk, bn)`` tile of ``b`` in their input
dtype, MX-quantizes both along K in-register exactly as ``proxy.quantize``
does (the shared bit arithmetic of :mod:`kernels.mx_quantize`), and
accumulates ``dot(qa, qb)`` in float32. No fake-quantized copy of either
operand is written to memory. Either operand may also be stored the other
way round (``a_layout="km"``: a is (K, M); ``b_layout="nk"``: b is (N, K),
K-major), so no caller needs to materialize a transpose.

``mx_scaled_matmul(a_codes, a_scales, b_codes, b_scales, ...)`` -- the
prequantized variant: element codes + E8M0 scale bytes in the layout of
``jax.lax.scaled_dot`` (``a (M, K)`` with scales ``(M, K/bs)``; ``b (K, N)``
with ``(K/bs, N)``, or with ``b_layout="nk"`` the K-major ``(N, K)`` /
``(N, K/bs)`` of ``jax.nn.scaled_matmul``), dequantized tile by tile in the
kernel.

``mx_dot(a, b, a_spec, b_spec)`` -- the entry point for ``proxy.layers``:
contracts a's last axis (or, 2-D ``a`` with ``a_contract_axis=0``, its first)
with b's first (or, ``b_contract_axis=1``, its second); not differentiable by
itself.

Tile products. A quantized tile holds values ``element * 2**e``; every MX
element has at most 8 significant bits (MXINT8: 7, FP8: <= 4), so the tile is
exact in bfloat16 (same exponent range as float32), and a bf16 x bf16 dot
with float32 accumulation -- the Hopper tensor-core path -- forms every
product exactly. Only float32-subnormal tile values (block amax below about
2**-118) can lose bits in the bf16 tile; XLA CPU flushes those anyway. When
an operand is unquantized (spec ``None``) the tile dot runs in float32 with
``precision=HIGHEST`` (no TF32), i.e. the reference's numerics.

Agreement with the reference: quantized values bit for bit; the products
differ only by float32 summation order, elementwise within
:func:`accumulation_tolerance` ``= 2 K 2**-24 (|qa| @ |qb|) + K 2**-126``
(each float32 sum is within ``K u sum|p|`` of the exact one, ``u = 2**-24``;
the last term covers products flushed to zero as float32 subnormals).
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
    "A_LAYOUTS", "B_LAYOUTS", "OUT_DTYPES", "METHODS", "default_block_sizes", "accumulation_tolerance",
]

A_LAYOUTS = ("mk", "km")  # a as (M, K) [lax.scaled_dot] or (K, M)
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


def default_block_sizes(m: int, n: int, k: int, k_multiple: int, interpret: bool) -> tuple[int, int, int]:
    """(bm, bn, bk) when the caller gives none: powers of two, each >= 16.

    Compiled: 128 x 128 x max(32, block size), 8 warps -- untuned (no GPU was
    lent for this work; README "GPU numbers"): larger bm, bn mean fewer
    re-quantizations of each operand tile (every a tile is quantized N/bn
    times). Interpreted: tiles as large as the problem allows (up to 256 x
    256 x 512), because the interpreter pays per grid step, not per FLOP.
    """
    if interpret:
        bm = min(256, max(MIN_DOT_DIM, backend.next_pow2(m)))
        bn = min(256, max(MIN_DOT_DIM, backend.next_pow2(n)))
        bk = max(k_multiple, MIN_DOT_DIM, min(512, backend.next_pow2(k)))
        return bm, bn, bk
    bm = min(128, max(MIN_DOT_DIM, backend.next_pow2(m)))
    bn = min(128, max(MIN_DOT_DIM, backend.next_pow2(n)))
    return bm, bn, max(32, k_multiple)


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


def _resolve_blocks(block_sizes, m, n, k, k_multiple, interpret):
    if block_sizes is None:
        block_sizes = default_block_sizes(m, n, k, max(k_multiple, MIN_DOT_DIM), interpret)
    return _check_block_sizes(block_sizes, k_multiple)


# ----------------------------------------------------------------------------
# tiling shared by both kernels


def _pad_operand(x, layout: str, other_tile: int, k_tile: int):
    """Zero-pad an operand so its K axis is a multiple of k_tile and its other axis of other_tile."""
    ka = _k_axis(layout)
    mult = [other_tile, other_tile]
    mult[ka] = k_tile
    pads = [(0, -x.shape[d] % mult[d]) for d in range(2)]
    return jnp.pad(x, pads) if any(p for _, p in pads) else x


def _operand_spec(x_shape, layout: str, other_tile: int, grid_axis: int):
    """BlockSpec giving each program all of K and one other_tile slice (grid axis 0: i, 1: j)."""
    ka = _k_axis(layout)
    block = [other_tile, other_tile]
    block[ka] = x_shape[ka]
    pick = (lambda i, j: i) if grid_axis == 0 else (lambda i, j: j)
    if ka == 0:
        return pl.BlockSpec(tuple(block), lambda i, j: (0, pick(i, j)))
    return pl.BlockSpec(tuple(block), lambda i, j: (pick(i, j), 0))


def _load_k_slice(ref, layout: str, start, size: int):
    """The ``size`` entries of K from ``start`` of a tile ref stored in ``layout``."""
    return ref[pl.ds(start, size), :] if _k_axis(layout) == 0 else ref[:, pl.ds(start, size)]


def _launch(num_tiles: int) -> dict:
    """Triton launch parameters by tile size (untuned defaults)."""
    return dict(num_warps=8 if num_tiles >= 128 * 128 else 4, num_stages=2)


def _tile_dot(a, b, a_layout: str, b_layout: str, *, exact_bf16: bool):
    """float32 (bm, bn) product of an a tile and a b tile stored in their layouts."""
    dims = (((_k_axis(a_layout),), (_k_axis(b_layout),)), ((), ()))
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


def _run(kernel, operands, layouts, others, m, n, block_sizes, out_name, interpret, name):
    """Pad, tile and launch a matmul kernel over the (M/bm, N/bn) grid; cut the result back.

    ``operands`` are (a arrays..., b arrays...) with ``layouts`` and the tile
    of their non-K axis in ``others`` (bm for a's, bn for b's); every array's
    K axis is padded to bk (codes) or bk / block (scales) as ``others`` says.
    """
    bm, bn = block_sizes[:2]
    padded = [_pad_operand(x, lay, ot, kt) for x, lay, (ot, kt) in zip(operands, layouts, others)]
    mp = _sizes(padded[0], layouts[0])[0]
    np_ = _sizes(padded[-1], layouts[-1])[0]
    half = len(operands) // 2  # a's arrays tile with grid axis 0 (i), b's with axis 1 (j)
    in_specs = [_operand_spec(x.shape, lay, ot, 0 if idx < half else 1)
                for idx, (x, lay, (ot, _)) in enumerate(zip(padded, layouts, others))]
    out = backend.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((mp, np_), jnp.dtype(out_name)),
        grid=(mp // bm, np_ // bn),
        in_specs=in_specs,
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        interpret=interpret, name=name, **_launch(bm * bn),
    )(*padded)
    return out[:m, :n]


# ----------------------------------------------------------------------------
# fused kernel: quantize tiles along K, then dot


def _quantized_tile(x, spec: MXSpec | None, axis: int):
    if spec is None:
        return x.astype(jnp.float32)
    return mxq.fake_quantize_tile(x, spec, axis)


def _fused_kernel(a_ref, b_ref, o_ref, *, a_spec, b_spec, bk: int, a_layout: str, b_layout: str):
    bm, bn = o_ref.shape
    nk = a_ref.shape[_k_axis(a_layout)] // bk
    exact_bf16 = a_spec is not None and b_spec is not None

    def body(kk, acc):
        k0 = pl.multiple_of(kk * bk, bk)
        a = _quantized_tile(_load_k_slice(a_ref, a_layout, k0, bk), a_spec, _k_axis(a_layout))
        b = _quantized_tile(_load_k_slice(b_ref, b_layout, k0, bk), b_spec, _k_axis(b_layout))
        return acc + _tile_dot(a, b, a_layout, b_layout, exact_bf16=exact_bf16)

    acc = jax.lax.fori_loop(0, nk, body, jnp.zeros((bm, bn), jnp.float32))
    o_ref[...] = acc.astype(o_ref.dtype)


def mx_matmul(a, b, a_spec: MXSpec | None, b_spec: MXSpec | None, *, out_dtype=jnp.float32,
              block_sizes: tuple[int, int, int] | None = None, interpret: bool | None = None,
              a_layout: str = "mk", b_layout: str = "kn") -> jax.Array:
    """Fused MX matmul ``quantize(a, a_spec, K axis) @ quantize(b, b_spec, K axis)``.

    Args:
      a: (M, K) float array (any float dtype; cast to float32 in the kernel),
        or (K, M) with ``a_layout="km"``.
      b: (K, N) float array, or (N, K) with ``b_layout="nk"``.
      a_spec, b_spec: :class:`proxy.MXSpec` (rounding "even" or "away",
        power-of-two block size) or None for an unquantized operand. Each
        operand is quantized along K, whichever its layout.
      out_dtype: float32 (default), bfloat16 or float16; accumulation is float32.
      block_sizes: (bm, bn, bk), powers of two >= 16, bk a multiple of the MX
        block sizes; None picks :func:`default_block_sizes`.
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
    k_multiple = max([s.block_size for s in (a_spec, b_spec) if s is not None] + [1])
    block_sizes = _resolve_blocks(block_sizes, m, n, k, k_multiple, interp)
    return _mx_matmul(a, b, a_spec, b_spec, out_name, block_sizes, interp, a_layout, b_layout)


@functools.partial(jax.jit, static_argnums=tuple(range(2, 9)))
def _mx_matmul(a, b, a_spec, b_spec, out_name, block_sizes, interpret, a_layout, b_layout):
    bm, bn, bk = block_sizes
    m, n = _sizes(a, a_layout)[0], _sizes(b, b_layout)[0]
    kernel = functools.partial(_fused_kernel, a_spec=a_spec, b_spec=b_spec, bk=bk, a_layout=a_layout,
                               b_layout=b_layout)
    return _run(kernel, (a, b), (a_layout, b_layout), ((bm, bk), (bn, bk)), m, n, block_sizes, out_name,
                interpret, "mx_matmul")


@functools.partial(jax.jit, static_argnames=("a_spec", "b_spec", "out_dtype", "a_layout", "b_layout"))
def mx_matmul_reference(a, b, a_spec: MXSpec | None, b_spec: MXSpec | None, *, out_dtype=jnp.float32,
                        a_layout: str = "mk", b_layout: str = "kn") -> jax.Array:
    """Plain JAX: ``proxy.quantize`` both operands along K, ``jnp.dot`` at HIGHEST, float32."""
    import proxy

    qa = a.astype(jnp.float32) if a_spec is None else proxy.quantize(a, a_spec, _k_axis(a_layout))
    qb = b.astype(jnp.float32) if b_spec is None else proxy.quantize(b, b_spec, _k_axis(b_layout))
    qa = qa.T if a_layout == "km" else qa
    qb = qb.T if b_layout == "nk" else qb
    return jnp.dot(qa, qb, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32).astype(out_dtype)


# ----------------------------------------------------------------------------
# prequantized kernel: codes + E8M0 scales, dequantized per tile


def _scaled_kernel(ac_ref, as_ref, bc_ref, bs_ref, o_ref, *, a_fmt, b_fmt, a_bs: int, b_bs: int, bk: int,
                   a_layout: str, b_layout: str):
    bm, bn = o_ref.shape
    nk = ac_ref.shape[_k_axis(a_layout)] // bk

    def operand(codes_ref, scales_ref, fmt, bs, layout, kk):
        k0 = pl.multiple_of(kk * bk, bk)
        s0 = pl.multiple_of(kk * (bk // bs), bk // bs)
        codes = _load_k_slice(codes_ref, layout, k0, bk)
        scales = _load_k_slice(scales_ref, layout, s0, bk // bs)
        return mxq.decode_tile(codes, scales, fmt, _k_axis(layout), bs)

    def body(kk, acc):
        a = operand(ac_ref, as_ref, a_fmt, a_bs, a_layout, kk)
        b = operand(bc_ref, bs_ref, b_fmt, b_bs, b_layout, kk)
        return acc + _tile_dot(a, b, a_layout, b_layout, exact_bf16=True)

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
                     interpret: bool | None = None, a_layout: str = "mk", b_layout: str = "kn") -> jax.Array:
    """Matmul of prequantized MX operands (codes + E8M0 scales), float32 accumulation.

    Args:
      a_codes: (M, K) uint8 codes (or float8 of a_format), K whole blocks;
        (K, M) with ``a_layout="km"``.
      a_scales: (M, K/bs_a) uint8 or float8_e8m0fnu; (K/bs_a, M) with "km".
      b_codes: (K, N) codes, or (N, K) with ``b_layout="nk"``.
      b_scales: (K/bs_b, N), or (N, K/bs_b) with ``b_layout="nk"``.
      a_format, b_format: element format names (see ``kernels.mx_quantize.MX_FORMATS``).
      out_dtype, block_sizes, interpret: as for :func:`mx_matmul`.

    Returns:
      (M, N) ``sum_k dequant(a)[m, k] * dequant(b)[k, n]``; the dequantized
      values are exactly those of ``kernels.mx_quantize.dequantize``.
    """
    a_fmt, b_fmt, ac, asc, bc, bsc, a_bs, b_bs, (m, n, k) = _check_scaled(
        a_codes, a_scales, b_codes, b_scales, a_format, b_format, a_layout, b_layout)
    out_name = _check_out_dtype(out_dtype)
    interp = backend.resolve_interpret(interpret)
    block_sizes = _resolve_blocks(block_sizes, m, n, k, max(a_bs, b_bs), interp)
    return _mx_scaled_matmul(ac, asc, bc, bsc, a_fmt, b_fmt, a_bs, b_bs, out_name, block_sizes, interp,
                             a_layout, b_layout)


@functools.partial(jax.jit, static_argnums=tuple(range(4, 13)))
def _mx_scaled_matmul(ac, asc, bc, bsc, a_fmt, b_fmt, a_bs, b_bs, out_name, block_sizes, interpret, a_layout,
                      b_layout):
    bm, bn, bk = block_sizes
    m, n = _sizes(ac, a_layout)[0], _sizes(bc, b_layout)[0]
    kernel = functools.partial(_scaled_kernel, a_fmt=a_fmt, b_fmt=b_fmt, a_bs=a_bs, b_bs=b_bs, bk=bk,
                               a_layout=a_layout, b_layout=b_layout)
    return _run(kernel, (ac, asc, bc, bsc), (a_layout, a_layout, b_layout, b_layout),
                ((bm, bk), (bm, bk // a_bs), (bn, bk), (bn, bk // b_bs)), m, n, block_sizes, out_name,
                interpret, "mx_scaled_matmul")


def mx_scaled_matmul_reference(a_codes, a_scales, b_codes, b_scales, a_format: str, b_format: str, *,
                               out_dtype=jnp.float32, a_layout: str = "mk", b_layout: str = "kn") -> jax.Array:
    """Reference for :func:`mx_scaled_matmul`: exact host dequantization
    (:func:`kernels.mx_quantize.dequantize_reference`, ml_dtypes) then
    ``jnp.dot`` at HIGHEST. (The tests also compare FP8/FP4 operands with
    ``jax.lax.scaled_dot``, which cannot take FP6 or MXINT8 codes.)"""
    a_fmt, b_fmt, ac, asc, bc, bsc, a_bs, b_bs, _ = _check_scaled(
        a_codes, a_scales, b_codes, b_scales, a_format, b_format, a_layout, b_layout)
    ka, kb = _k_axis(a_layout), _k_axis(b_layout)
    qa = mxq.dequantize_reference(mxq.MXTensor(ac, asc, a_fmt.name, a_bs, ka, ac.shape[ka]))
    qb = mxq.dequantize_reference(mxq.MXTensor(bc, bsc, b_fmt.name, b_bs, kb, bc.shape[kb]))
    qa = qa.T if a_layout == "km" else qa
    qb = qb.T if b_layout == "nk" else qb
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


def mx_dot(a, b, a_spec: MXSpec | None, b_spec: MXSpec | None, *, a_contract_axis: int = -1,
           b_contract_axis: int = 0, out_dtype=jnp.float32, method: str = "fused", block_sizes=None,
           interpret: bool | None = None):
    """One MX GEMM for the dense layer, each operand MX-quantized along K.

    Args:
      a: (..., K) float array with ``a_contract_axis=-1`` (leading axes are
        flattened into M), or a 2-D (K, M) array with ``a_contract_axis=0``
        (e.g. activations ``x (batch, in)`` in the wgrad ``x.T @ g``).
      b: (K, N) with ``b_contract_axis=0``, or (N, K) with 1 (e.g. a weight
        ``w (in, out)`` in the dgrad ``g @ w.T``).
      a_spec, b_spec: MXSpec or None (unquantized operand).
      out_dtype: float32, bfloat16 or float16.
      method: ``"fused"`` (quantize inside the matmul tiles; any spec may be
        None) or ``"two_pass"`` (``quantize_packed`` both operands with the
        quantize kernel, then :func:`mx_scaled_matmul`; needs both specs).
        Both give the same numbers up to float32 summation order.
      block_sizes, interpret: passed on.

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
        out = mx_matmul(a2, b, a_spec, b_spec, out_dtype=out_dtype, block_sizes=block_sizes,
                        interpret=interpret, a_layout=a_layout, b_layout=b_layout)
    else:
        if a_spec is None or b_spec is None:
            raise ValueError("method='two_pass' needs both a_spec and b_spec; for an unquantized operand use "
                             "method='fused'")
        b = _check_matrix(b, "b")
        _check_mnk(a2, b, a_layout, b_layout)
        qa = mxq.quantize_packed(a2, mxq.check_spec(a_spec, "a_spec"), _k_axis(a_layout), interpret=interpret)
        qb = mxq.quantize_packed(b, mxq.check_spec(b_spec, "b_spec"), _k_axis(b_layout), interpret=interpret)
        kp = max(qa.codes.shape[qa.axis], qb.codes.shape[qb.axis])  # whole blocks of both block sizes
        ac, asc = _pad_k(qa, kp)
        bc, bsc = _pad_k(qb, kp)
        out = mx_scaled_matmul(ac, asc, bc, bsc, qa.element, qb.element, out_dtype=out_dtype,
                               block_sizes=block_sizes, interpret=interpret, a_layout=a_layout, b_layout=b_layout)
    return out if a_contract_axis == 0 else out.reshape(tuple(lead) + out.shape[-1:])
