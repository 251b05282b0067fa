"""Packed MX tensors: a Pallas kernel that quantizes to element codes + E8M0
scales, the matching dequantize kernel, and the tile-level bit arithmetic that
every kernel in this package shares.

Semantics are exactly those of :func:`proxy.quantize` (read its module
docstring): per block of ``spec.block_size`` elements along the block axis,
``e`` from the block's amax (scale rule ``"floor"`` or ``"rceil"``), clamped
below at -127, NaN block when ``e > 127`` or the block holds a NaN/Inf;
elements saturated to ``max_normal * 2**e`` and rounded (``"even"`` or
``"away"``; stochastic rounding is not offered here). Like proxy's fast path,
everything is integer arithmetic on float32 bit patterns, so it is exact on
XLA CPU (which flushes float32 subnormals and cannot compile FP6 casts) and
lowers to Triton (bitcasts, ``clz``, variable shifts, unsigned compares).
This module deliberately does not import proxy's private helpers (they are
being reworked); it is tested bit for bit against ``proxy.quantize`` and an
independent ml_dtypes oracle instead.

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
``proxy.quantize(x)`` bit for bit.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from kernels import backend
from proxy import formats as _formats
from proxy.formats import ElementFormat
from proxy.quantize import MXSpec

__all__ = [
    "MXTensor", "MX_FORMATS", "ROUNDINGS", "check_spec", "quantize_packed", "dequantize",
    "quantize_packed_reference", "dequantize_reference", "quantize_tile", "decode_tile",
    "encode_tile", "NAN_SCALE",
]

MX_FORMATS = tuple(n for n in _formats.names() if not _formats.get(n).is_vector)
ROUNDINGS = ("even", "away")  # deterministic roundings the kernels implement
NAN_SCALE = 0xFF  # E8M0 NaN
SCALE_BIAS = 127

_ABS = np.uint32(0x7FFFFFFF)
_SIGN = np.uint32(0x80000000)
_INF = np.uint32(0x7F800000)
_QNAN = np.uint32(0x7FC00000)  # the NaN proxy.quantize writes (bit-identical)
_MANT = np.uint32(0x007FFFFF)
_HIDDEN = np.uint32(0x00800000)
_HALF = np.uint32(0x80000000)  # 1/2 as a 32-bit fixed-point fraction


# ----------------------------------------------------------------------------
# validation


def check_spec(spec, what: str = "spec") -> MXSpec | None:
    """Validate an operand spec for the kernels; ``None`` (unquantized) passes.

    Raises:
      ValueError: not an MXSpec, 2-D tiles (``block_dims=2``), E4M3 (NVFP4)
        scales, stochastic rounding, or a block size that is not a power of
        two -- naming the valid choices.
    """
    if spec is None:
        return None
    if not isinstance(spec, MXSpec):
        raise ValueError(f"{what} must be a proxy.MXSpec or None, got {type(spec).__name__}")
    if getattr(spec, "block_dims", 1) != 1:
        raise ValueError(
            f"{what}: block_dims={spec.block_dims} (2-D tiles) is not available in the Pallas kernels; valid: 1 "
            "(for 2-D tiles use proxy.quantize, the XLA backend)"
        )
    if getattr(spec, "scale_format", "e8m0") != "e8m0":
        raise ValueError(
            f"{what}: scale_format={spec.scale_format!r} (NVFP4) is not available in the Pallas kernels; valid: "
            "'e8m0' (for E4M3 scales use proxy.quantize, the XLA backend)"
        )
    if spec.rounding not in ROUNDINGS:
        raise ValueError(
            f"{what}: rounding {spec.rounding!r} is not available in the Pallas kernels; valid: "
            f"{', '.join(ROUNDINGS)} (stochastic rounding: use proxy.quantize on the XLA path)"
        )
    if spec.element.name not in MX_FORMATS:  # MXSpec already refuses vector formats; keep the guard local
        raise ValueError(f"{what}: element {spec.element.name!r} unsupported; valid: {', '.join(MX_FORMATS)}")
    if not backend.is_pow2(spec.block_size):
        raise ValueError(
            f"{what}: block_size {spec.block_size} is not a power of two; the kernels need a power of "
            "two (OCP MX: 32)"
        )
    return spec


# ----------------------------------------------------------------------------
# tile-level bit arithmetic (pure jnp; runs inside kernel bodies and outside)


def _u32(v):
    return jnp.asarray(v, jnp.uint32)


def _shift_amount(k):
    """int32 shift count -> uint32 clipped to [0, 31] (wider shifts are undefined in Triton/PTX)."""
    return jnp.clip(k, 0, 31).astype(jnp.uint32)


def _floor_log2(a):
    """Exact floor(log2) of nonzero float32 magnitude bits ``a`` (subnormals too); int32."""
    field = (a >> 23).astype(jnp.int32)
    return jnp.where(field > 0, field - 127, -118 - jax.lax.clz(a).astype(jnp.int32))


def _significand(a):
    """(integer significand < 2**24, exponent of its last bit) of float32 magnitude bits."""
    field = (a >> 23).astype(jnp.int32)
    sig = jnp.where(field > 0, (a & _MANT) | _HIDDEN, a)
    return sig, jnp.maximum(field, 1) - 150


def _pow2_bits(k):
    """float32 bits of 2**k for int32 k in [-149, 127] (subnormal below -126)."""
    normal = jnp.clip(k + 127, 1, 254).astype(jnp.uint32) << 23
    sub = _u32(1) << _shift_amount(k + 149)
    return jnp.where(k >= -126, normal, sub)


def _max_normal_bits(fmt: ElementFormat, e):
    """float32 bits of ``max_normal * 2**e`` (exact, also when subnormal); +Inf
    when it exceeds float32 (rceil scales near float32 max: nothing saturates)."""
    m = fmt.mantissa_bits
    top = e + fmt.emax
    frac = np.uint32((fmt.max_significand - (1 << m)) << (23 - m))
    normal = (jnp.clip(top + 127, 1, 254).astype(jnp.uint32) << 23) | frac
    sub = _u32(fmt.max_significand) << _shift_amount(top - m + 149)
    return jnp.where(top > 127, _INF, jnp.where(top >= -126, normal, sub))


def _scale_exponent(amax, fmt: ElementFormat, scale_rule: str):
    """Shared exponent e (int32) and NaN-block flag from a block's amax bits."""
    field = (amax >> 23).astype(jnp.int32)
    e = jnp.maximum(jnp.where(field > 0, field - 127, -127) - fmt.emax, -127)
    if scale_rule == "rceil":
        e = e + (amax > _max_normal_bits(fmt, e)).astype(jnp.int32)
    return e, (amax >= _INF) | (e > 127)


def _round_magnitude(a, e, fmt: ElementFormat, rounding: str):
    """Round float32 magnitude bits ``a`` (already saturated) onto the grid of
    ``fmt`` scaled by ``2**e``; returns uint32 bits.

    With ``s`` the exponent of the grid step at ``a`` and ``d = s - ulp(a)``
    (>= 6 for every MX format), the kept part is ``sig >> d`` and the dropped
    part a 32-bit fixed-point fraction; ties-to-even looks at the parity of
    ``sig >> d``, the kept integer itself (hidden bit included).
    """
    m = fmt.mantissa_bits
    sig, ulp = _significand(a)
    ex = _floor_log2(a)  # a == 0 gives -150: harmless, sig is 0
    s = jnp.maximum(ex, fmt.emin + e) - m
    d = s - ulp
    dd = _shift_amount(d)
    low_mask = (_u32(1) << dd) - np.uint32(1)
    frac = jnp.where(d <= 32, (sig & low_mask) << _shift_amount(32 - d), sig >> _shift_amount(d - 32))
    if rounding == "even":
        odd = ((sig >> dd) & np.uint32(1)) == 1
        up = (frac > _HALF) | ((frac == _HALF) & odd)
    elif rounding == "away":
        up = frac >= _HALF
    else:  # pragma: no cover - check_spec refuses it
        raise ValueError(f"rounding {rounding!r}; valid: {', '.join(ROUNDINGS)}")
    small = d <= 23  # the step lies inside a's mantissa field: round in the bit domain
    floor_bits = jnp.where(small, a & ~low_mask, np.uint32(0))
    step_bits = jnp.where(small, _u32(1) << dd, _pow2_bits(s))
    return floor_bits + jnp.where(up, step_bits, np.uint32(0))


def _split_blocks(x, axis: int, block_size: int):
    shape = x.shape
    return x.reshape(shape[:axis] + (shape[axis] // block_size, block_size) + shape[axis + 1:])


def quantize_tile(x, spec: MXSpec, axis: int):
    """MX-quantize a tile whose ``axis`` holds whole blocks.

    Args:
      x: float array (cast to float32), ``x.shape[axis] % spec.block_size == 0``.
      spec: deterministic :class:`MXSpec`.
      axis: block axis (non-negative).

    Returns:
      ``(q, e, nan)``: q the uint32 bits of the fake-quantized float32 values
      (x's shape; exactly ``proxy.quantize``'s bits), and per block the int32
      exponent e and the bool NaN flag, both shaped like the blocked view
      ``x.shape[:axis] + (blocks, 1) + x.shape[axis+1:]``.
    """
    fmt = spec.element
    bits = _split_blocks(jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32), axis, spec.block_size)
    a = bits & _ABS
    amax = jnp.max(a, axis=axis + 1, keepdims=True)
    e, nan = _scale_exponent(amax, fmt, spec.scale_rule)
    q = _round_magnitude(jnp.minimum(a, _max_normal_bits(fmt, e)), e, fmt, spec.rounding)
    q = jnp.where(nan, _QNAN, q | (bits & _SIGN))
    return q.reshape(x.shape), e, nan


def fake_quantize_tile(x, spec: MXSpec, axis: int):
    """float32 values of :func:`quantize_tile` (what ``proxy.quantize`` returns)."""
    return jax.lax.bitcast_convert_type(quantize_tile(x, spec, axis)[0], jnp.float32)


def _nan_code(fmt: ElementFormat) -> int:
    return 0x7F if fmt.has_nan else 0


def encode_tile(q, e, nan, fmt: ElementFormat, axis: int, block_size: int):
    """Element codes (uint8) of quantized bits ``q`` with block exponents ``e``.

    ``q, e, nan`` as returned by :func:`quantize_tile`. Every finite q is
    ``k * 2**s`` with an integer k on the element grid; the code is built
    from k and s (see the module docstring for the byte layout).
    """
    qb = _split_blocks(q, axis, block_size)
    a = qb & _ABS
    sign = qb >> 31
    sig, ulp = _significand(a)
    m = fmt.mantissa_bits
    if fmt.is_integer:
        s = e - m
    else:
        s = jnp.maximum(_floor_log2(a), fmt.emin + e) - m
    k = sig >> _shift_amount(s - ulp)  # exact: q is a multiple of 2**s; 0 stays 0
    if fmt.is_integer:
        code = (sign << 7) | k
    else:
        field = (s + m - e - fmt.emin + 1).astype(jnp.uint32)  # biased element exponent of a normal k
        normal = k >= (1 << m)
        code = jnp.where(normal, (field << m) | (k & np.uint32((1 << m) - 1)), k)
        code = code | (sign << (fmt.exponent_bits + m))
    code = jnp.where(nan, np.uint32(_nan_code(fmt)), code)
    return code.astype(jnp.uint8).reshape(q.shape)


def scale_bytes(e, nan):
    """E8M0 bytes (uint8) of block exponents: ``e + 127``, or 255 for a NaN block."""
    return jnp.where(nan, NAN_SCALE, e + SCALE_BIAS).astype(jnp.uint8)


def _compose_bits(k, exp):
    """float32 bits of ``k * 2**exp`` for integers 0 <= k < 2**24 (uint32), int32 exp.

    Exact whenever the value is representable (subnormals included); above
    the float32 range: Inf; below 2**-149: truncated (never reached from
    MX codes, whose smallest value is 2**-143).
    """
    nb = 32 - jax.lax.clz(k).astype(jnp.int32)  # bit length of k
    top = exp + nb - 1  # floor(log2 value)
    normal = (jnp.clip(top + 127, 1, 254).astype(jnp.uint32) << 23) | ((k << _shift_amount(24 - nb)) & _MANT)
    sub = jnp.where(exp >= -149, k << _shift_amount(exp + 149), k >> _shift_amount(-149 - exp))
    bits = jnp.where(top >= -126, normal, sub)
    bits = jnp.where(top > 127, _INF, bits)
    return jnp.where(k == 0, np.uint32(0), bits)


def decode_tile(codes, scales, fmt: ElementFormat, axis: int, block_size: int):
    """Exact float32 values of packed codes (any uint8 tile) and their scales.

    Args:
      codes: uint8 tile, ``codes.shape[axis] % block_size == 0``.
      scales: uint8 E8M0 bytes, codes' shape with ``axis`` divided by block_size.
      fmt: element format of the codes.

    Returns:
      float32 array of codes' shape.
    """
    c = _split_blocks(codes.astype(jnp.uint32), axis, block_size)
    sc = jnp.expand_dims(scales.astype(jnp.int32), axis + 1)
    m = fmt.mantissa_bits
    if fmt.is_integer:
        sign = c >> 7
        k = c & np.uint32(0x7F)
        lsb = jnp.full(c.shape, -m, jnp.int32)
        special = None
    else:
        ebits = fmt.exponent_bits
        sign = (c >> (ebits + m)) & np.uint32(1)
        field = ((c >> m) & np.uint32((1 << ebits) - 1)).astype(jnp.int32)
        mant = c & np.uint32((1 << m) - 1)
        k = jnp.where(field > 0, mant | np.uint32(1 << m), mant)
        lsb = jnp.maximum(field, 1) + (fmt.emin - 1 - m)
        top_field = (1 << ebits) - 1
        if fmt.has_inf:  # IEEE-like (E5M2): all-ones exponent is Inf (mant 0) or NaN
            special = jnp.where(field == top_field, jnp.where(mant == 0, _INF, _QNAN), np.uint32(0))
        elif fmt.has_nan:  # E4M3 "fn": only S.1111.111 is NaN
            special = jnp.where((field == top_field) & (mant == np.uint32((1 << m) - 1)), _QNAN, np.uint32(0))
        else:
            special = None
    bits = _compose_bits(k, lsb + (sc - SCALE_BIAS))
    if special is not None:
        bits = jnp.where(special != 0, special, bits)
    bits = bits | (sign << 31)
    bits = jnp.where(sc == NAN_SCALE, _QNAN, bits)
    return jax.lax.bitcast_convert_type(bits, jnp.float32).reshape(codes.shape)


# ----------------------------------------------------------------------------
# the packed tensor


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["codes", "scales"],
    meta_fields=["element", "block_size", "axis", "length"],
)
@dataclasses.dataclass(frozen=True)
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


def _normalize_axis(axis, ndim: int) -> int:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise ValueError(f"axis must be an integer, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for rank {ndim} (valid: {-ndim}..{ndim - 1})")
    return int(axis) % ndim


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
      :class:`MXTensor` whose dequantized values are ``proxy.quantize(x, spec,
      axis)`` bit for bit.
    """
    spec = check_spec(spec)
    x = jnp.asarray(x)
    if x.ndim == 0 or not (jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer)):
        raise ValueError(f"quantize_packed needs a real array of rank >= 1, got {x.dtype}{list(x.shape)}")
    if not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype.itemsize > 4:
        x = x.astype(jnp.float32)
    ax = _normalize_axis(axis, x.ndim)
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

    Equals ``proxy.quantize`` of the original input bit for bit.
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
    """The packed form derived from ``proxy.quantize`` / ``proxy.quantize_stats``
    and ml_dtypes casts on the host (not jittable; for tests).

    Codes: element values ``q / 2**e`` cast to the ml_dtypes type (exact: they
    lie on the element grid) and viewed as bytes.
    """
    import proxy

    spec = check_spec(spec)
    x = np.asarray(x, np.float32)
    ax = _normalize_axis(axis, x.ndim)
    q = np.asarray(proxy.quantize(jnp.asarray(x), spec, ax)).astype(np.float64)
    e = np.asarray(proxy.quantize_stats(jnp.asarray(x), spec, ax).scale_exponent)
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
    codes = np.where(nan, np.uint8(_nan_code(fmt)), codes).astype(np.uint8)
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
