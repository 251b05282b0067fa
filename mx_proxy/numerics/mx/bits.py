"""float32 bit patterns as uint32: the integer vocabulary of the MX arithmetic.

Every array function here is elementwise ``jax.numpy`` (broadcasting as
usual) and lowers to XLA and to Pallas Triton alike:

* Shifts. XLA defines ``x << n`` as 0 for ``n`` outside [0, 31]; PTX/LLVM
  leave it undefined. :func:`shl` / :func:`shr` give XLA's result on every
  backend (a select around a shift by ``n mod 32``); :func:`shl_mod32` /
  :func:`shr_mod32` shift by ``n mod 32`` only, for call sites where the
  amount is in [0, 31] wherever the result is used (one op cheaper).
* Leading zeros are counted on int32 (:func:`clz`): Pallas Triton lowers an
  int32 ``clz`` to the ``__nv_clz`` intrinsic, while on uint32 it emits
  ``math.ctlz``, which Triton's own compiler rejects.

The ``*_int`` functions are their Python-integer twins, for tables and
constants built at trace time.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from mx_proxy.numerics.formats import ElementFormat

__all__ = [
    "ABS", "SIGN", "INF", "QNAN", "MANT", "HIDDEN", "ONE", "u32", "f32", "b32", "clz", "shl", "shr",
    "shl_mod32", "shr_mod32", "pow2_bits_int", "max_normal_bits_int", "pow2_bits", "max_normal_bits",
    "floor_log2", "exponent_fraction", "significand", "scale_pow2", "compose_bits", "round_to_f32",
    "pow2_f32", "Word", "F32", "BF16",
]

ABS = np.uint32(0x7FFFFFFF)  # magnitude bits
SIGN = np.uint32(0x80000000)
INF = np.uint32(0x7F800000)
QNAN = np.uint32(0x7FC00000)  # the one NaN every quantizer here writes
MANT = np.uint32(0x007FFFFF)
HIDDEN = np.uint32(0x00800000)
ONE = np.uint32(0x3F800000)


class Word(NamedTuple):
    """The bit layout of a float container whose patterns the element
    rounding works on: float32 (the general path) or bfloat16 (16-bit words,
    twice the SIMD lanes, no conversions, for operands that hold bf16 values).

    bits: word width; fraction: stored fraction bits (23, 7); float_dtype,
    uint, sint: the float, unsigned and signed dtypes of that width.
    """

    bits: int
    fraction: int
    float_dtype: type
    uint: type
    sint: type

    @property
    def abs_mask(self):
        return self.uint((1 << (self.bits - 1)) - 1)

    @property
    def sign(self):
        return self.uint(1 << (self.bits - 1))

    @property
    def qnan(self):
        """The canonical quiet NaN (float32 ``QNAN`` cut to the width)."""
        return self.uint(int(QNAN) >> (32 - self.bits))

    def view(self, x):
        """Bit patterns of float values of this width."""
        return jax.lax.bitcast_convert_type(x, self.uint)

    def float(self, bits):
        """Float values of bit patterns of this width."""
        return jax.lax.bitcast_convert_type(bits, self.float_dtype)

    def clz(self, a):
        """Leading zeros (signed, 0..bits) of unsigned ``a``, counted on its signed view."""
        return jax.lax.clz(jax.lax.bitcast_convert_type(a, self.sint))

    def shl_mod(self, x, n):
        """``x << (n mod bits)``: for amounts in [0, bits) wherever the result is used."""
        return jax.lax.shift_left(x, jnp.asarray(n).astype(self.uint) & self.uint(self.bits - 1))

    def shr_mod(self, x, n):
        """Logical ``x >> (n mod bits)``: for amounts in [0, bits) wherever the result is used."""
        return jax.lax.shift_right_logical(x, jnp.asarray(n).astype(self.uint) & self.uint(self.bits - 1))


F32 = Word(32, 23, jnp.float32, np.uint32, np.int32)
BF16 = Word(16, 7, jnp.bfloat16, np.uint16, np.int16)


def u32(v):
    """``v`` as a uint32 array."""
    return jnp.asarray(v, jnp.uint32)


def f32(bits):
    """float32 values of uint32 bit patterns."""
    return F32.float(bits)


def b32(x):
    """uint32 bit patterns of float32 values."""
    return F32.view(x)


def clz(a):
    """Leading zeros (int32, 0..32) of uint32 ``a``, counted on its int32 view."""
    return F32.clz(a)


def _amount(n):
    return jnp.asarray(n).astype(jnp.uint32)


def shl(x, n):
    """``x << n`` for uint32 ``x`` and integer ``n``; 0 where ``n`` is outside [0, 31] (XLA's semantics)."""
    k = _amount(n)
    return jnp.where(k < 32, jax.lax.shift_left(x, k & np.uint32(31)), np.uint32(0))


def shr(x, n):
    """Logical ``x >> n``; 0 where ``n`` is outside [0, 31] (XLA's semantics)."""
    k = _amount(n)
    return jnp.where(k < 32, jax.lax.shift_right_logical(x, k & np.uint32(31)), np.uint32(0))


def shl_mod32(x, n):
    """``x << (n mod 32)``: for amounts in [0, 31] wherever the result is used."""
    return F32.shl_mod(x, n)


def shr_mod32(x, n):
    """Logical ``x >> (n mod 32)``: for amounts in [0, 31] wherever the result is used."""
    return F32.shr_mod(x, n)


# ----------------------------------------------------------------------------
# powers of two and the top code of a format


def pow2_bits_int(k: int) -> int:
    """float32 bit pattern of 2**k for an integer k, clamped to [-149, 127] (subnormal below -126)."""
    k = min(max(int(k), -149), 127)
    return (k + 127) << 23 if k >= -126 else 1 << (k + 149)


def max_normal_bits_int(fmt: ElementFormat, e: int) -> int:
    """float32 bits of ``max_normal * 2**e`` (exact, also when subnormal); ``INF``
    when it exceeds float32 (``e + emax > 127``)."""
    m = fmt.mantissa_bits
    top = int(e) + fmt.emax  # exponent of max_normal * 2**e
    if top > 127:
        return int(INF)
    # max_normal = max_significand * 2**(emax - m), max_significand in [2**m, 2**(m+1))
    if top >= -126:
        return ((top + 127) << 23) | ((fmt.max_significand - (1 << m)) << (23 - m))
    return fmt.max_significand << max(top - m + 149, 0)


def pow2_bits(k):
    """float32 bits of 2**k for int32 ``k`` in [-149, 127] (subnormal below -126)."""
    k = jnp.asarray(k, jnp.int32)
    normal = jnp.clip(k + 127, 1, 254).astype(jnp.uint32) << 23
    return jnp.where(k >= -126, normal, shl_mod32(u32(1), jnp.clip(k + 149, 0, 31)))


def max_normal_bits(fmt: ElementFormat, e):
    """float32 bits of ``max_normal * 2**e`` for int32 ``e`` (exact, also when
    subnormal); ``INF`` when it exceeds float32: with the round-up scale near
    float32 max nothing saturates."""
    e = jnp.asarray(e, jnp.int32)
    m = fmt.mantissa_bits
    top = e + fmt.emax
    frac = np.uint32((fmt.max_significand - (1 << m)) << (23 - m))
    normal = (jnp.clip(top + 127, 1, 254).astype(jnp.uint32) << 23) | frac
    sub = shl_mod32(u32(fmt.max_significand), jnp.clip(top - m + 149, 0, 31))
    return jnp.where(top > 127, INF, jnp.where(top >= -126, normal, sub))


def pow2_f32(e):
    """float32 2**e for int32 ``e`` in [-127, 127] (2**-127 is subnormal), exactly."""
    return f32(pow2_bits(e))


# ----------------------------------------------------------------------------
# exponents and significands


def floor_log2(a):
    """Exact floor(log2 |v|) (int32) of non-zero float32 magnitude bits ``a``,
    subnormals included (``a = 0`` gives -150)."""
    field = (a >> 23).astype(jnp.int32)
    return jnp.where(field > 0, field - 127, -118 - clz(a))


def exponent_fraction(a):
    """``(floor(log2 |v|), the 23 fraction bits after the leading one)`` for
    finite non-zero magnitude bits ``a`` (normal or subnormal)."""
    field = (a >> 23).astype(jnp.int32)
    lead = 31 - clz(a)  # leading bit of a subnormal
    e = jnp.where(field > 0, field - 127, lead - 149)
    frac = jnp.where(field > 0, a & MANT, shl_mod32(a, 23 - lead) & MANT)
    return e, frac


def significand(a):
    """``(integer significand < 2**24, exponent of its last bit)`` (uint32,
    int32) of float32 magnitude bits ``a``: ``|v| = sig * 2**lsb``."""
    field = (a >> 23).astype(jnp.int32)
    sig = jnp.where(field > 0, (a & MANT) | HIDDEN, a)
    return sig, jnp.maximum(field, 1) - 150


def scale_pow2(a, j):
    """Bits of ``|v| * 2**j`` for magnitude bits ``a`` where that is at least
    2**-126 (exact); 0 below (and for ``a = 0``). The caller keeps it below 2**128."""
    e, frac = exponent_fraction(a)
    e = e + j
    return jnp.where((a != 0) & (e >= -126), ((e + 127).astype(jnp.uint32) << 23) | frac, np.uint32(0))


def compose_bits(k, exp):
    """float32 bits of ``k * 2**exp`` for integers 0 <= k < 2**24 (uint32) and int32 ``exp``.

    Exact whenever the value is representable (subnormals included); above
    float32: ``INF``; below 2**-149: truncated (never reached from MX codes,
    whose smallest value is 2**-143).
    """
    nb = 32 - clz(k)  # bit length of k
    top = exp + nb - 1  # floor(log2 value)
    normal = (jnp.clip(top + 127, 1, 254).astype(jnp.uint32) << 23) | (shl_mod32(k, jnp.clip(24 - nb, 0, 31)) & MANT)
    sub = jnp.where(exp >= -149, shl_mod32(k, jnp.clip(exp + 149, 0, 31)), shr_mod32(k, jnp.clip(-149 - exp, 0, 31)))
    bits = jnp.where(top >= -126, normal, sub)
    bits = jnp.where(top > 127, INF, bits)
    return jnp.where(k == 0, np.uint32(0), bits)


def round_to_f32(p, exp2):
    """float32 bits of ``p * 2**exp2`` (uint32 p > 0, int32 exp2), rounded to
    nearest even once: subnormal results on the subnormal grid, Inf above."""
    e = exp2 + (31 - clz(p))  # floor(log2) of the value
    lsb = jnp.maximum(e - 23, -149)  # exponent of the result's last bit
    sh = lsb - exp2
    r = shr(p, sh)
    rem = p & (shl(u32(1), sh) - np.uint32(1))
    half = shl(u32(1), sh - 1)
    r = r + ((rem > half) | ((rem == half) & ((r & np.uint32(1)) == 1))).astype(jnp.uint32)
    r = jnp.where(sh <= 0, shl(p, -sh), jnp.where(sh > 32, np.uint32(0), r))
    bits = ((lsb + 149).astype(jnp.uint32) << 23) + r  # a carry into the exponent is right
    return jnp.where(e > 127, INF, jnp.minimum(bits, INF))
