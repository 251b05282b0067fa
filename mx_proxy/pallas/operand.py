"""GEMM operands: an MX-quantized matrix in the form the MX GEMM kernel reads.

An :class:`MXOperand` holds a matrix of R rows (M of ``a``, N of ``b``)
contracted over K, always **K-major** -- ``(R, K)``, the layout Hopper's FP8
``wgmma`` needs for both operands -- whatever the layout of the input:

* ``data``: by the element format's GEMM dtype (:data:`GEMM_DTYPES`):
  ``"e4m3"`` -- ``float8_e4m3fn``, one E4M3 code per byte (FP8 E4M3 itself, and the FP6 formats
  E3M2 and E2M3 written as the E4M3 code of the same value: every FP6 value
  is an E4M3 value, so they reach the FP8 tensor cores with no decode);
  ``"e5m2"`` -- ``float8_e5m2``; ``"int8"`` -- uint8 MXINT8 sign-magnitude
  bytes (bit 7 sign, bits 0-6 the k of k/64); ``"e2m1"`` -- uint8, two E2M1
  codes per byte, shape ``(R, Kp / 2)``: for each pair of 32-element K chunks
  ``[64 p, 64 p + 32)`` and ``[64 p + 32, 64 p + 64)``, byte ``32 p + j`` holds
  element ``64 p + j`` in its low nibble and ``64 p + 32 + j`` in its high
  nibble, so the GEMM gets a whole 32-chunk from one nibble of 32 bytes (no
  interleave); a register lookup table turns each nibble into an E4M3 code.
  NaN blocks hold the NaN code (0x7F) or 0 (E2M1, MXINT8). FP8 data is typed
  float8 (not uint8) so that the GEMM's loads feed the FP8 ``dot`` directly:
  Triton places a dot operand that comes straight from a load in shared
  memory, which Hopper's FP8 ``wgmma`` needs; one computed in registers (a
  bitcast is enough) sends it to the older ``mma.sync`` path with an f16
  upcast.
* ``scales``: uint8 E8M0 bytes, ``(R, Kp / block_size)``, ``e + 127`` as in
  :mod:`mx_proxy.pallas.quantize` (255: NaN) -- except that a block whose codes
  are all zero carries 127 (``2**0``): its values are zero under any scale,
  and the GEMM's fast path then never sees the tiny ``2**-127`` scale of an
  all-zero block.
* rows are zero-padded to ``Rp`` and K to ``Kp`` (whole tiles of the GEMM
  that will read them); ``rows`` and ``k`` keep the unpadded sizes.

:func:`quantize_operand` makes one with a Pallas kernel (each operand is
quantized once, then read by every GEMM tile); :func:`operand_from_codes`
converts ml_dtypes-layout codes and scales (:class:`mx_proxy.pallas.quantize.MXTensor`,
``jax.lax.scaled_dot`` operands) with XLA; :func:`operand_values` decodes
one back to float32 (host, for tests).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.experimental import pallas as pl

from mx_proxy.numerics import formats as _formats
from mx_proxy.numerics.mx import bits as B
from mx_proxy.numerics.mx import block_scale as scale
from mx_proxy.numerics.mx import element
from mx_proxy.numerics.mx.layout import split_blocks
from mx_proxy.numerics.quantize import MXSpec
from mx_proxy.pallas import backend
from mx_proxy.pallas.records import array_record
from mx_proxy.pallas.supported import check_spec
from mx_proxy.pallas.tile import quantize_tile

__all__ = ["MXOperand", "GEMM_DTYPES", "CONTAINERS", "DATA_DTYPES", "CHUNK", "quantize_operand", "operand_from_codes",
           "operand_values", "pad_operand", "round_up"]

CHUNK = 32  # K elements per scaled MMA step; E2M1 pairs two chunks per 32 bytes
GEMM_DTYPES = {"fp8_e4m3": "e4m3", "fp6_e3m2": "e4m3", "fp6_e2m3": "e4m3", "fp8_e5m2": "e5m2",
               "fp4_e2m1": "e2m1", "int8": "int8"}
CONTAINERS = {"e4m3": "fp8_e4m3", "e5m2": "fp8_e5m2", "e2m1": "fp4_e2m1", "int8": "int8"}  # code format per dtype
DATA_DTYPES = {"e4m3": jnp.float8_e4m3fn, "e5m2": jnp.float8_e5m2, "e2m1": jnp.uint8, "int8": jnp.uint8}
ZERO_BLOCK_SCALE = scale.E8M0_BIAS  # 2**0 for all-zero blocks


def round_up(n: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= n (and >= multiple)."""
    return max(-(-n // multiple), 1) * multiple


@array_record(data=("data", "scales"), meta=("element", "block_size", "rows", "k"))
class MXOperand:
    """A K-major MX GEMM operand (module docstring for the byte layout).

    Attributes:
      data: ``(Rp, Kp)`` float8 (E4M3/E5M2) or uint8 (MXINT8), or uint8
        ``(Rp, Kp / 2)`` for E2M1.
      scales: uint8 ``(Rp, Kp / block_size)``.
      element: element format name of the quantized values.
      block_size: elements per scale along K.
      rows, k: unpadded sizes (R, K).
    """

    data: jax.Array
    scales: jax.Array
    element: str
    block_size: int
    rows: int
    k: int

    @property
    def gemm_dtype(self) -> str:
        """How the data bytes are read: "e4m3", "e5m2", "e2m1" (packed) or "int8"."""
        return GEMM_DTYPES[self.element]

    @property
    def padded_k(self) -> int:
        return self.scales.shape[1] * self.block_size

    @property
    def padded_rows(self) -> int:
        return self.data.shape[0]


def pad_operand(op: MXOperand, rows_p: int, kp: int):
    """data and scales of ``op`` zero-padded (scales: ``ZERO_BLOCK_SCALE``, 127) to ``rows_p`` rows and ``kp``
    K-elements (packed E2M1 data: ``kp / 2`` bytes a row)."""
    data, scales = op.data, op.scales
    kd = kp // 2 if op.gemm_dtype == "e2m1" else kp
    r = rows_p - data.shape[0]
    if r or kd - data.shape[1]:
        data = jnp.pad(data, [(0, r), (0, kd - data.shape[1])])
    ks = kp // op.block_size - scales.shape[1]
    if r or ks:
        scales = jnp.pad(scales, [(0, r), (0, ks)], constant_values=ZERO_BLOCK_SCALE)
    return data, scales


# ----------------------------------------------------------------------------
# the quantize kernel


def _pack_e2m1(codes):
    """(r, L) E2M1 codes (uint32), L a multiple of 64 -> (r, L / 2) uint32 bytes in the pair layout."""
    r, n = codes.shape
    c4 = codes.reshape(r, n // 64, 2, CHUNK)
    shift = jax.lax.broadcasted_iota(jnp.uint32, c4.shape, 2) * np.uint32(4)
    return jnp.sum(c4 << shift, axis=2, dtype=jnp.uint32).reshape(r, n // 2)


def _operand_kernel(x_ref, data_ref, scales_ref, *, spec: MXSpec, k_axis: int):
    x = x_ref[...]
    bs = spec.block_size
    q, e, nan = quantize_tile(x, spec, k_axis)
    qb = split_blocks(q, k_axis, bs)
    container = _formats.get(CONTAINERS[GEMM_DTYPES[spec.element.name]])
    codes = element.encode(qb, e, nan, container).reshape(x.shape)
    zero = jnp.max(qb & B.ABS, axis=k_axis + 1, keepdims=True) == 0  # every code of the block is +-0
    sc = jnp.where(zero & ~nan, ZERO_BLOCK_SCALE, scale.e8m0_bytes(e, nan).astype(jnp.int32))
    sc = jnp.squeeze(sc, k_axis + 1)
    if k_axis == 0:  # tile (K, rows): write it K-major
        codes, sc = codes.T, sc.T
    if container.name == "fp4_e2m1":
        codes = _pack_e2m1(codes)
    data_ref[...] = jax.lax.bitcast_convert_type(codes.astype(jnp.uint8), data_ref.dtype)
    scales_ref[...] = sc.astype(jnp.uint8)


def _operand_tiles(rows_p: int, kp: int, interpret: bool) -> tuple[int, int]:
    """(row tile, K tile) of the quantize kernel: powers of two dividing (rows_p, kp).

    Compiled: 16 x 128 elements per program (checked free of register spills
    by ``mx_proxy/pallas/compile_check.py``); interpreted: large tiles (the interpreter
    pays per grid step).
    """
    cap_r, cap_k = (128, 1024) if interpret else (16, 128)
    return min(cap_r, rows_p & -rows_p), min(cap_k, kp & -kp)


@functools.partial(jax.jit, static_argnames=("spec", "k_axis", "row_multiple", "k_multiple", "interpret"))
def _quantize_operand(x, spec, k_axis, row_multiple, k_multiple, interpret):
    rows, k = (x.shape[1], x.shape[0]) if k_axis == 0 else x.shape
    rows_p, kp = round_up(rows, row_multiple), round_up(k, k_multiple)
    pads = [(0, rows_p - rows), (0, kp - k)]
    if k_axis == 0:
        pads = pads[::-1]
    if any(p for _, p in pads):
        x = jnp.pad(x, pads)
    br, bl = _operand_tiles(rows_p, kp, interpret)
    bs = spec.block_size
    packed = GEMM_DTYPES[spec.element.name] == "e2m1"
    bl_data = bl // 2 if packed else bl
    if k_axis == 1:
        in_spec = pl.BlockSpec((br, bl), lambda i, j: (i, j))
    else:
        in_spec = pl.BlockSpec((bl, br), lambda i, j: (j, i))
    data, scales = backend.pallas_call(
        functools.partial(_operand_kernel, spec=spec, k_axis=k_axis),
        out_shape=[jax.ShapeDtypeStruct((rows_p, kp // 2 if packed else kp),
                                        DATA_DTYPES[GEMM_DTYPES[spec.element.name]]),
                   jax.ShapeDtypeStruct((rows_p, kp // bs), jnp.uint8)],
        grid=(rows_p // br, kp // bl), in_specs=[in_spec],
        out_specs=[pl.BlockSpec((br, bl_data), lambda i, j: (i, j)), pl.BlockSpec((br, bl // bs), lambda i, j: (i, j))],
        interpret=interpret, num_warps=4, num_stages=2, name="mx_quantize_operand",
    )(x)
    return MXOperand(data, scales, spec.element.name, bs, rows, k)


def quantize_operand(x, spec: MXSpec, k_axis: int, *, row_multiple: int = 16, k_multiple: int = 64,
                     interpret: bool | None = None) -> MXOperand:
    """MX-quantize a matrix along K into the GEMM operand form (Pallas kernel).

    Args:
      x: (R, K) with ``k_axis=1`` or (K, R) with ``k_axis=0``; any float dtype
        (cast to float32 in the kernel).
      spec: :class:`mxp.MXSpec` accepted by :func:`mx_proxy.pallas.supported.check_spec`.
      k_axis: the axis of x that is contracted (and blocked).
      row_multiple, k_multiple: pad R and K to multiples of these (powers of
        two; ``k_multiple`` is raised to a multiple of 64 and of the block size).
      interpret: None (auto), True or False.

    Returns:
      :class:`MXOperand` whose values are ``mxp.quantize(x, spec, k_axis)``
      bit for bit (:func:`operand_values`), transposed to (R, K).
    """
    spec = check_spec(spec)
    x = jnp.asarray(x)
    if x.ndim != 2 or not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"quantize_operand needs a float matrix, got {x.dtype}{list(x.shape)}")
    if k_axis not in (0, 1):
        raise ValueError(f"k_axis must be 0 or 1, got {k_axis!r}")
    for name, v in (("row_multiple", row_multiple), ("k_multiple", k_multiple)):
        if not backend.is_pow2(v):
            raise ValueError(f"{name} must be a power of two, got {v!r}")
    k_multiple = max(k_multiple, 2 * CHUNK, spec.block_size)
    return _quantize_operand(x, spec, k_axis, row_multiple, k_multiple, backend.resolve_interpret(interpret))


# ----------------------------------------------------------------------------
# from ml_dtypes-layout codes (XLA), and back to values (host)


@functools.cache
def _container_table(fmt_name: str) -> np.ndarray:
    """uint8 E4M3 code of each of the 256 byte values read as ``fmt_name`` codes (FP6 only)."""
    fmt = _formats.get(fmt_name)
    codes = np.arange(256, dtype=np.uint32) & ((1 << fmt.bits) - 1)
    values = codes.astype(np.uint8).view(fmt.dtype).astype(np.float32)
    return values.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def _pack_pairs_host(codes):
    """(r, Kp) E2M1 codes (uint8) -> (r, Kp / 2) bytes in the pair layout (XLA)."""
    r, kp = codes.shape
    c = codes.reshape(r, kp // 64, 2, CHUNK)
    return (c[:, :, 0, :] | (c[:, :, 1, :] << 4)).reshape(r, kp // 2)


def operand_from_codes(codes, scales, element_name: str, block_size: int, k_axis: int, *, k: int | None = None,
                       row_multiple: int = 16, k_multiple: int = 64) -> MXOperand:
    """The GEMM operand form of ml_dtypes-layout codes and E8M0 scales (XLA ops).

    Args:
      codes: uint8 (R, K) with ``k_axis=1`` or (K, R) with ``k_axis=0``; K a
        whole number of blocks.
      scales: uint8 (R, K / block_size) or (K / block_size, R) likewise.
      element_name: the codes' element format.
      block_size: elements per scale.
      k: the unpadded K (default: all of the codes' K).
      k_axis, row_multiple, k_multiple: as for :func:`quantize_operand`.
    """
    if k_axis == 0:
        codes, scales = codes.T, scales.T
    rows, k_codes = codes.shape
    k = k_codes if k is None else k
    dtype = GEMM_DTYPES[element_name]
    if dtype == "e4m3" and element_name != "fp8_e4m3":  # FP6: E4M3 codes of the same values; NaN blocks 0x7F
        codes = jnp.asarray(_container_table(element_name))[codes.astype(jnp.int32)]
        nan = jnp.repeat(scales == scale.E8M0_NAN, block_size, axis=1)
        codes = jnp.where(nan, np.uint8(element.nan_code(_formats.get("fp8_e4m3"))), codes)
    k_multiple = max(k_multiple, 2 * CHUNK, block_size)
    rows_p, kp = round_up(rows, row_multiple), round_up(k_codes, k_multiple)
    codes = jnp.pad(codes, [(0, rows_p - rows), (0, kp - k_codes)])
    scales = jnp.pad(scales, [(0, rows_p - rows), (0, kp // block_size - scales.shape[1])],
                     constant_values=ZERO_BLOCK_SCALE)
    if dtype == "e2m1":
        codes = _pack_pairs_host(codes)
    data = jax.lax.bitcast_convert_type(codes.astype(jnp.uint8), DATA_DTYPES[dtype])
    return MXOperand(data, scales.astype(jnp.uint8), element_name, block_size, rows, k)


def operand_values(op: MXOperand) -> np.ndarray:
    """float32 (R, K) values of an operand, decoded on the host with ml_dtypes (for tests)."""
    data = np.asarray(op.data).view(np.uint8)
    dtype = op.gemm_dtype
    if dtype == "e2m1":
        r, half = data.shape
        pairs = data.reshape(r, half // CHUNK, 1, CHUNK)
        nib = np.concatenate([pairs & 0xF, pairs >> 4], axis=2).reshape(r, 2 * half)
        elem = nib.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    elif dtype == "int8":
        elem = np.where(data & 0x80, -1.0, 1.0) * (data & 0x7F).astype(np.float64) / 64.0
    else:
        elem = data.view(ml_dtypes.float8_e4m3fn if dtype == "e4m3" else ml_dtypes.float8_e5m2).astype(np.float64)
    s = np.repeat(np.asarray(op.scales).astype(np.int64), op.block_size, axis=1)
    with np.errstate(over="ignore", invalid="ignore"):
        out = (elem * np.exp2((s - scale.E8M0_BIAS).astype(np.float64))).astype(np.float32)
    out = np.where(s == scale.E8M0_NAN, np.float32(np.nan), out)
    return out[: op.rows, : op.k]
