"""Packed MX tensors: a Pallas kernel that quantizes to element codes + E8M0
scales and the matching dequantize kernel, each beside its host reference.
The tile-level wrappers through which every kernel body calls the shared MX
arithmetic of :mod:`mx_proxy.numerics.mx` are :mod:`mx_proxy.pallas.tile`; the
specs the kernels accept, :mod:`mx_proxy.pallas.supported` (both re-exported here).

Semantics are exactly those of :func:`mxp.quantize` (read its module
docstring): per block of ``spec.block_size`` elements along the block axis,
``e`` from the block's amax (any scale rule with one exponent per block:
``"floor"``, ``"rceil"``, ``"ceil"``, ``"even"``; not ``"paper_bump"``), clamped
below at -127, NaN block when ``e > 127`` or the block holds a NaN/Inf;
elements saturated to ``max_normal * 2**e`` and rounded (``"even"`` or
``"away"``; stochastic rounding is not offered here). The arithmetic is not
re-implemented here: :func:`~mx_proxy.pallas.tile.quantize_tile` calls the very functions that
``mxp.quantize`` runs under XLA (:mod:`mx_proxy.numerics.mx.block_scale` for the scale,
:mod:`mx_proxy.numerics.mx.element` for rounding and codes) on a kernel tile. They are
integer operations on float32 bit patterns, exact on XLA CPU and lowerable
to Triton; the tests still compare every kernel bit for bit with
``mxp.quantize`` and with an independent ml_dtypes oracle.

Packed layout (:class:`MXTensor`), for an input of shape ``S`` blocked along
``axis``:

* ``codes``: uint8, shape ``S`` with ``S[axis]`` padded up to whole blocks.
  One code per byte, in the low bits, exactly as ml_dtypes stores sub-byte
  floats, so ``np.asarray(codes).view(ml_dtypes.float6_e2m3fn)`` etc. gives
  element values. FP8 codes are the float8 bit patterns. MXINT8 codes are
  sign-magnitude bytes (bit 7 sign, bits 0-6 the integer k of k/64), which
  keeps -0 exact. In a NaN block the codes are the format's NaN code (E4M3
  0x7F, E5M2 0x7F) or 0 for formats without NaN; the scale carries the NaN.
* ``scales``: uint8 E8M0 bytes ``e + 127`` (0 means 2**-127, 254 means
  2**127, 255 = NaN), shape ``S`` with ``S[axis]`` replaced by the number of
  blocks. For a 2-D ``a (M, K)`` blocked along 1 and ``b (K, N)`` blocked
  along 0 these are the operand layouts of ``jax.lax.scaled_dot``; ``b.T``
  blocked along 1 gives the K-major layout of ``jax.nn.scaled_matmul``.
  ``jax.lax.bitcast_convert_type(scales, jnp.float8_e8m0fnu)`` reinterprets
  them.

The dequantized value of a code is ``element * 2**(scale - 127)`` as the
exact float32 bit pattern (subnormal float32 results included), computed
with integer ops; so ``dequantize(quantize_packed(x))`` equals
``mxp.quantize(x)`` bit for bit. (The GEMM operand form, K-major with FP8
containers and packed FP4, is :mod:`mx_proxy.pallas.operand`.)
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from mx_proxy.numerics import formats as _formats
from mx_proxy.numerics.formats import ElementFormat
from mx_proxy.numerics.mx import block_scale as scale
from mx_proxy.numerics.mx import element
from mx_proxy.numerics.mx.layout import normalize_axis
from mx_proxy.numerics.quantize import MXSpec, quantize, quantize_stats
from mx_proxy.pallas import backend
from mx_proxy.pallas.records import array_record
from mx_proxy.pallas.supported import MX_FORMATS, ROUNDINGS, check_spec, kernel_rules
from mx_proxy.pallas.tile import decode_tile, encode_tile, fake_quantize_tile, quantize_tile, scale_bytes

__all__ = [
    "MXTensor", "MX_FORMATS", "ROUNDINGS", "check_spec", "kernel_rules", "quantize_packed", "dequantize",
    "quantize_packed_reference", "dequantize_reference", "quantize_tile", "fake_quantize_tile", "decode_tile",
    "encode_tile", "scale_bytes", "NAN_SCALE",
]

NAN_SCALE = scale.E8M0_NAN
SCALE_BIAS = scale.E8M0_BIAS


# ----------------------------------------------------------------------------
# the packed tensor


@array_record(data=("codes", "scales"), meta=("element", "block_size", "axis", "length"))
class MXTensor:
    """An MX tensor in its packed form (see the module docstring for layout).

    Attributes:
      codes: uint8 element codes; ``codes.shape[axis]`` is a whole number of blocks.
      scales: uint8 E8M0 scale bytes, one per block.
      element: element format name (``"fp8_e4m3"``, ...).
      block_size: elements per scale.
      axis: the block axis (non-negative).
      length: the unpadded length along ``axis``.
    """

    codes: jax.Array
    scales: jax.Array
    element: str
    block_size: int
    axis: int
    length: int

    @property
    def format(self) -> ElementFormat:
        return _formats.get(self.element)

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the tensor it stands for (unpadded)."""
        s = list(self.codes.shape)
        s[self.axis] = self.length
        return tuple(s)

    def codes_as_ml_dtype(self) -> np.ndarray:
        """Host copy of the codes as element values of the ml_dtypes type
        (``float8_e4m3fn``, ..., ``float4_e2m1fn``; int8 k for MXINT8, where the
        sign of a zero is lost). Unscaled; padded like ``codes``."""
        c = np.asarray(self.codes)
        fmt = self.format
        if fmt.is_integer:
            mag = (c & 0x7F).astype(np.int8)
            return np.where(c & 0x80, -mag, mag).astype(np.int8)
        return c.view(fmt.dtype)

    def scales_as_e8m0(self) -> jax.Array:
        """The scales as ``jnp.float8_e8m0fnu`` (same bytes)."""
        return jax.lax.bitcast_convert_type(self.scales, jnp.float8_e8m0fnu)


# ----------------------------------------------------------------------------
# layout helpers shared by the quantize and dequantize kernels


def _as_3d(shape, axis):
    """(rows before axis, axis length, columns after axis)."""
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


def _tiles(rows: int, length: int, cols: int, block_size: int, interpret: bool):
    """Tile (rows, length, cols) for the elementwise kernels; powers of two.

    The block axis tile holds whole blocks; interpreted runs take big tiles
    (fewer grid steps), compiled ones modest tiles (registers).
    """
    cap_len, cap_other = (1024, 256) if interpret else (max(128, block_size), 32)
    bl = max(block_size, min(backend.next_pow2(length), max(cap_len, block_size)))
    if cols > 1:
        return 1, bl, min(backend.next_pow2(cols), cap_other if interpret else 64)
    return min(backend.next_pow2(rows), cap_other), bl, 1


def _pad_to(x, multiples):
    widths = [(0, -n % mlt) for n, mlt in zip(x.shape, multiples)]
    return jnp.pad(x, widths) if any(w for _, w in widths) else x


# ----------------------------------------------------------------------------
# quantize kernel


def _quantize_kernel(x_ref, codes_ref, scales_ref, *, spec: MXSpec, axis: int):
    q, e, nan = quantize_tile(x_ref[...], spec, axis)
    codes_ref[...] = encode_tile(q, e, nan, spec.element, axis, spec.block_size)
    scales_ref[...] = jnp.squeeze(scale_bytes(e, nan), axis + 1)


@functools.partial(jax.jit, static_argnames=("spec", "axis", "interpret"))
def quantize_packed(x, spec: MXSpec, axis: int = -1, *, interpret: bool | None = None) -> MXTensor:
    """Quantize ``x`` to the packed MX form with a Pallas kernel.

    Args:
      x: real array of rank >= 1 (cast to float32 inside the kernel).
      spec: :class:`MXSpec` with rounding ``"even"`` or ``"away"`` and a
        power-of-two block size.
      axis: block axis.
      interpret: None (auto), True (host interpreter) or False (compiled).

    Returns:
      :class:`MXTensor` whose dequantized values are ``mxp.quantize(x, spec,
      axis)`` bit for bit.
    """
    spec = check_spec(spec)
    x = jnp.asarray(x)
    if x.ndim == 0 or not (jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer)):
        raise ValueError(f"quantize_packed needs a real array of rank >= 1, got {x.dtype}{list(x.shape)}")
    if not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype.itemsize > 4:
        x = x.astype(jnp.float32)
    ax = normalize_axis(axis, x.ndim)
    interp = backend.resolve_interpret(interpret)
    bs = spec.block_size
    rows, length, cols = _as_3d(x.shape, ax)
    nb = -(-length // bs)
    br, bl, bc = _tiles(rows, length, cols, bs, interp)
    if cols == 1:  # block axis last: a (rows, length) matrix blocked along 1
        x2 = _pad_to(x.reshape(rows, length), (br, bl))
        grid = (x2.shape[0] // br, x2.shape[1] // bl)
        in_spec = pl.BlockSpec((br, bl), lambda i, j: (i, j))
        out_specs = [pl.BlockSpec((br, bl), lambda i, j: (i, j)), pl.BlockSpec((br, bl // bs), lambda i, j: (i, j))]
        out_shape = [jax.ShapeDtypeStruct(x2.shape, jnp.uint8),
                     jax.ShapeDtypeStruct((x2.shape[0], x2.shape[1] // bs), jnp.uint8)]
        kern_axis = 1
    else:  # (rows, length, cols) blocked along 1; the row dim is squeezed out of each tile
        x2 = _pad_to(x.reshape(rows, length, cols), (1, bl, bc))
        grid = (rows, x2.shape[1] // bl, x2.shape[2] // bc)
        in_spec = pl.BlockSpec((None, bl, bc), lambda r, i, j: (r, i, j))
        out_specs = [pl.BlockSpec((None, bl, bc), lambda r, i, j: (r, i, j)),
                     pl.BlockSpec((None, bl // bs, bc), lambda r, i, j: (r, i, j))]
        out_shape = [jax.ShapeDtypeStruct(x2.shape, jnp.uint8),
                     jax.ShapeDtypeStruct((rows, x2.shape[1] // bs, x2.shape[2]), jnp.uint8)]
        kern_axis = 0
    codes, scales = backend.pallas_call(
        functools.partial(_quantize_kernel, spec=spec, axis=kern_axis),
        out_shape=out_shape, grid=grid, in_specs=[in_spec], out_specs=out_specs,
        interpret=interp, name="mx_quantize",
    )(x2)
    shape = list(x.shape)
    shape[ax] = nb * bs
    codes = codes[:rows, : nb * bs, :cols] if cols > 1 else codes[:rows, : nb * bs]
    scales = scales[:rows, :nb, :cols] if cols > 1 else scales[:rows, :nb]
    sshape = list(x.shape)
    sshape[ax] = nb
    return MXTensor(codes.reshape(shape), scales.reshape(sshape), spec.element.name, bs, ax, length)


# ----------------------------------------------------------------------------
# dequantize kernel


def _dequantize_kernel(codes_ref, scales_ref, out_ref, *, fmt: ElementFormat, axis: int, block_size: int):
    out_ref[...] = decode_tile(codes_ref[...], scales_ref[...], fmt, axis, block_size)


@functools.partial(jax.jit, static_argnames=("interpret",))
def dequantize(t: MXTensor, *, interpret: bool | None = None) -> jax.Array:
    """float32 values of a packed tensor (Pallas kernel), cut back to ``t.shape``.

    Equals ``mxp.quantize`` of the original input bit for bit.
    """
    if not isinstance(t, MXTensor):
        raise ValueError(f"dequantize needs an MXTensor, got {type(t).__name__}")
    interp = backend.resolve_interpret(interpret)
    fmt, bs, ax = t.format, t.block_size, t.axis
    codes, scales = t.codes.astype(jnp.uint8), t.scales.astype(jnp.uint8)
    rows, plen, cols = _as_3d(codes.shape, ax)
    br, bl, bc = _tiles(rows, plen, cols, bs, interp)
    if cols == 1:
        c2 = _pad_to(codes.reshape(rows, plen), (br, bl))
        s2 = _pad_to(scales.reshape(rows, plen // bs), (br, bl // bs))
        grid = (c2.shape[0] // br, c2.shape[1] // bl)
        in_specs = [pl.BlockSpec((br, bl), lambda i, j: (i, j)), pl.BlockSpec((br, bl // bs), lambda i, j: (i, j))]
        out_spec = pl.BlockSpec((br, bl), lambda i, j: (i, j))
        kern_axis = 1
    else:
        c2 = _pad_to(codes.reshape(rows, plen, cols), (1, bl, bc))
        s2 = _pad_to(scales.reshape(rows, plen // bs, cols), (1, bl // bs, bc))
        grid = (rows, c2.shape[1] // bl, c2.shape[2] // bc)
        in_specs = [pl.BlockSpec((None, bl, bc), lambda r, i, j: (r, i, j)),
                    pl.BlockSpec((None, bl // bs, bc), lambda r, i, j: (r, i, j))]
        out_spec = pl.BlockSpec((None, bl, bc), lambda r, i, j: (r, i, j))
        kern_axis = 0
    out = backend.pallas_call(
        functools.partial(_dequantize_kernel, fmt=fmt, axis=kern_axis, block_size=bs),
        out_shape=jax.ShapeDtypeStruct(c2.shape, jnp.float32), grid=grid, in_specs=in_specs,
        out_specs=out_spec, interpret=interp, name="mx_dequantize",
    )(c2, s2)
    out = out[:rows, : t.length, :cols] if cols > 1 else out[:rows, : t.length]
    return out.reshape(t.shape)


# ----------------------------------------------------------------------------
# plain references (host side, independent of the bit arithmetic above)


def quantize_packed_reference(x, spec: MXSpec, axis: int = -1) -> MXTensor:
    """The packed form derived from ``mxp.quantize`` / ``mxp.quantize_stats``
    and ml_dtypes casts on the host (not jittable; for tests).

    Codes: element values ``q / 2**e`` cast to the ml_dtypes type (exact: they
    lie on the element grid) and viewed as bytes.
    """
    spec = check_spec(spec)
    x = np.asarray(x, np.float32)
    ax = normalize_axis(axis, x.ndim)
    q = np.asarray(quantize(jnp.asarray(x), spec, ax)).astype(np.float64)
    e = np.asarray(quantize_stats(jnp.asarray(x), spec, ax).scale_exponent)
    bs, n = spec.block_size, x.shape[ax]
    nb = -(-n // bs)
    pad = [(0, 0)] * x.ndim
    pad[ax] = (0, nb * bs - n)
    q = np.pad(q, pad)
    nan = np.repeat(e == 128, bs, axis=ax)
    scale = np.repeat(np.where(e == 128, 0, e), bs, axis=ax).astype(np.float64)
    elem = np.where(nan, 0.0, q) / np.exp2(scale)
    fmt = spec.element
    if fmt.is_integer:
        k = np.abs(elem) * 64
        assert np.all(k == np.round(k)) and np.all(k <= 127)
        codes = (np.signbit(elem).astype(np.uint8) << 7) | k.astype(np.uint8)
    else:
        codes = elem.astype(fmt.dtype).view(np.uint8)
    codes = np.where(nan, np.uint8(element.nan_code(fmt)), codes).astype(np.uint8)
    scales = np.where(e == 128, NAN_SCALE, e + SCALE_BIAS).astype(np.uint8)
    return MXTensor(jnp.asarray(codes), jnp.asarray(scales), fmt.name, bs, ax, n)


def dequantize_reference(t: MXTensor) -> np.ndarray:
    """float32 values of a packed tensor via ml_dtypes on the host (for tests)."""
    fmt = t.format
    elem = t.codes_as_ml_dtype().astype(np.float64)
    if fmt.is_integer:
        elem = elem / 64.0
        elem = np.where(np.asarray(t.codes) == 0x80, -0.0, elem)
    s = np.asarray(t.scales).astype(np.int64)
    s = np.repeat(s, t.block_size, axis=t.axis)
    with np.errstate(over="ignore", invalid="ignore"):
        out = (elem * np.exp2((s - SCALE_BIAS).astype(np.float64))).astype(np.float32)
    out = np.where(s == NAN_SCALE, np.float32(np.nan), out)
    idx = [slice(None)] * out.ndim
    idx[t.axis] = slice(0, t.length)
    return out[tuple(idx)]

