"""Element encoding: rounding scaled magnitudes onto an element grid (with
saturation), and the element codes of the rounded values.

Rounding modes: ``"even"`` (ties to even, what hardware and ml_dtypes casts
do), ``"away"`` (ties away from zero, the reference library's default) and
``"stochastic"``: with 32 random bits r per element, round up in magnitude
iff ``frac + r / 2**32 >= 1``, frac the fractional part of |x| in grid steps
(unbiased up to 2**-32 of a step). Values beyond ``max_normal * 2**e``
saturate to it; element subnormals are kept.

Codes (:func:`encode`, :func:`decode`): one code per uint32/uint8 in the low
bits, exactly as ml_dtypes stores sub-byte floats (so a code byte viewed as
``ml_dtypes.float6_e2m3fn`` is the element value); MXINT8 codes are
sign-magnitude bytes (bit 7 sign, bits 0-6 the k of k/64), which keeps -0
exact. NaN blocks get the format's NaN code (0x7F for E4M3 and E5M2) or 0
where the format has none; the scale carries the NaN. :func:`encode` can also
write an element as the code of a wider format whose grid contains it (every
FP6 and FP4 value is an E4M3 value): the FP8 "container" that the FP8
tensor-core GEMM reads.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from mx_proxy.numerics.formats import ElementFormat
from mx_proxy.numerics.mx import bits as B
from mx_proxy.numerics.mx.block_scale import E8M0_BIAS, E8M0_NAN, SCALE_EXP_MIN, Block

__all__ = ["ROUNDINGS", "round_magnitude", "quantize_magnitudes", "nan_code", "encode", "decode", "e2m1_to_e4m3"]

ROUNDINGS = ("even", "away", "stochastic")


def round_magnitude(a, blk: Block, fmt: ElementFormat, rounding: str, rbits=None, word: B.Word = B.F32):
    """Round magnitudes ``a`` (unsigned bit patterns of ``word``, float32 by
    default, already saturated) to the grid of ``fmt`` scaled by 2**e (block
    quantities ``blk`` in the same word, broadcastable to ``a``). Returns bit
    patterns of ``word``. ``rbits``: uint32 random bits shaped like ``a``, for
    ``rounding="stochastic"`` only (float32 words only).

    With p the word's fraction bits (23; bfloat16: 7) and d the number of bits
    of a below its grid step (the step is 2**d ulps of a; float32: d >= 6 for
    every format; bfloat16: d <= 0 for a subnormal on a grid finer than the
    word's, which is left as it is):

    * d <= p: the rounding is an integer add-and-mask on the bit pattern
      (bits are linear within a binade, a carry into the exponent field is the
      next binade's first value, and subnormal bits are linear too).
    * d > p: a is below the smallest grid step 2**s0, and the result is 0 or
      2**s0: up from 2**(s0-1) on (ties: "even" rounds down to 0).
    """
    m, p, n, U = fmt.mantissa_bits, word.fraction, word.bits, word.uint
    field = (a >> p).astype(word.sint)
    f1 = jnp.maximum(field, 1)
    # normal a: max(p - m, v - field); subnormal a: max(n - 1 - m - clz(a), v - 1)
    lz = jnp.maximum(word.clz(a), n - 1 - p)
    d = jnp.maximum((n - 1 - m) - lz, blk.v - f1)
    one = jnp.asarray(1, U)
    # the smallest d of any block (float32: >= 6); below 1 a grid step can be finer than the word's ulp
    exact_possible = _min_grid_bits(fmt, word) < 1
    if exact_possible:
        d = jnp.maximum(d, 0)
    low = word.shl_mod(one, d) - U(1)  # d <= p wherever low is used
    up = (low & U(1)) if exact_possible else U(1)  # no half-ulp to add where d = 0 (low = 0)
    if rounding == "even":
        # parity of floor(a / step): bit d of the significand (at d = p a normal a's implicit bit, not the
        # low bit of its exponent field)
        sig = a | (jnp.minimum(a, U(1 << p)) & U(1 << p))
        big = (a + (low >> 1) + (word.shr_mod(sig, d) & up)) & ~low
        small = jnp.where(a > blk.half, blk.step, U(0))
        return jnp.where(d > p, small, big)
    if rounding == "away":
        big = (a + (low >> 1) + up) & ~low
        small = jnp.where(a >= blk.half, blk.step, U(0))
        return jnp.where(d > p, small, big)
    if rounding != "stochastic":
        raise ValueError(f"unknown rounding {rounding!r}; valid: {', '.join(ROUNDINGS)}")
    if word != B.F32:
        raise ValueError("rounding='stochastic' rounds float32 words (its random bits are 32 per element)")
    if rbits is None:
        raise ValueError("rounding='stochastic' needs random bits (one uint32 per element)")
    # round up iff frac + r / 2**32 >= 1, i.e. on a carry out of the 32-bit
    # fixed-point sum; for a >= step (d <= 23) that is a plain add into the bits
    big = (a + B.shr_mod32(rbits, 32 - d)) & ~low
    sig = a - ((f1 - 1).astype(jnp.uint32) << 23)  # 24-bit significand (subnormal: a)
    frac = B.shl(sig, 32 - d) | B.shr(sig, d - 32)  # a / step with 32 fraction bits
    small = jnp.where((frac + rbits) < rbits, blk.step, np.uint32(0))
    return jnp.where(a < blk.step, small, big)


def _min_grid_bits(fmt: ElementFormat, word: B.Word) -> int:
    """The smallest d of :func:`round_magnitude` over every block and
    element: p - m (a normal element), or v - 1 at the smallest scale
    exponent (a subnormal one), in the word's ulps."""
    v_min = fmt.emin + SCALE_EXP_MIN - fmt.mantissa_bits + 150 - (23 - word.fraction)
    return min(word.fraction - fmt.mantissa_bits, v_min - 1)


def quantize_magnitudes(bits, a, blk: Block, fmt: ElementFormat, rounding: str, rbits=None, word: B.Word = B.F32):
    """Quantized bit patterns (of ``word``, float32 by default) of elements
    with bits ``bits`` (magnitudes ``a``) in blocks ``blk``: saturate, round,
    restore the sign; NaN blocks become the canonical quiet NaN."""
    q = round_magnitude(jnp.minimum(a, blk.sat), blk, fmt, rounding, rbits, word)
    return jnp.where(blk.nan, word.qnan, q | (bits & word.sign))


def nan_code(fmt: ElementFormat) -> int:
    """The code written into NaN blocks: the format's NaN (0x7F) or 0 without one."""
    return 0x7F if fmt.has_nan else 0


def encode(q, e, nan, fmt: ElementFormat):
    """Element codes (uint32, one per element) of quantized float32 bits ``q``
    in blocks with exponents ``e`` and NaN flags ``nan`` (both broadcastable).

    Every finite q is ``k * 2**s`` with an integer k on the grid of ``fmt``
    scaled by 2**e; the code is built from k and s. ``fmt`` may be a format
    whose grid contains the one q was rounded to (an FP8 container).
    """
    a = q & B.ABS
    sign = q >> 31
    sig, ulp = B.significand(a)
    m = fmt.mantissa_bits
    s = e - m if fmt.is_integer else jnp.maximum(B.floor_log2(a), fmt.emin + e) - m
    k = B.shr_mod32(sig, s - ulp)  # exact: q is a multiple of 2**s; 0 stays 0
    if fmt.is_integer:
        code = (sign << 7) | k
    else:
        field = (s + m - e - fmt.emin + 1).astype(jnp.uint32)  # biased element exponent of a normal k
        normal = k >= (1 << m)
        code = jnp.where(normal, (field << m) | (k & np.uint32((1 << m) - 1)), k)
        code = code | (sign << (fmt.exponent_bits + m))
    return jnp.where(nan, np.uint32(nan_code(fmt)), code)


def decode(codes, scales, fmt: ElementFormat):
    """Exact float32 bits (uint32) of element codes and their E8M0 scale bytes.

    Args:
      codes: integer codes (any shape).
      scales: E8M0 bytes broadcastable to ``codes`` (255: NaN).
      fmt: element format of the codes.

    Subnormal float32 results are exact too (integer composition, no float op).
    """
    c = codes.astype(jnp.uint32)
    sc = jnp.asarray(scales).astype(jnp.int32)
    m = fmt.mantissa_bits
    special = None
    if fmt.is_integer:
        sign = c >> 7
        k = c & np.uint32(0x7F)
        lsb = jnp.full(c.shape, -m, jnp.int32)
    else:
        ebits = fmt.exponent_bits
        sign = (c >> (ebits + m)) & np.uint32(1)
        field = ((c >> m) & np.uint32((1 << ebits) - 1)).astype(jnp.int32)
        mant = c & np.uint32((1 << m) - 1)
        k = jnp.where(field > 0, mant | np.uint32(1 << m), mant)
        lsb = jnp.maximum(field, 1) + (fmt.emin - 1 - m)
        top_field = (1 << ebits) - 1
        if fmt.has_inf:  # IEEE-like (E5M2): all-ones exponent is Inf (mant 0) or NaN
            special = jnp.where(field == top_field, jnp.where(mant == 0, B.INF, B.QNAN), np.uint32(0))
        elif fmt.has_nan:  # E4M3 "fn": only S.1111.111 is NaN
            special = jnp.where((field == top_field) & (mant == np.uint32((1 << m) - 1)), B.QNAN, np.uint32(0))
    out = B.compose_bits(k, lsb + (sc - E8M0_BIAS))
    if special is not None:
        out = jnp.where(special != 0, special, out)
    out = out | (sign << 31)
    return jnp.where(sc == E8M0_NAN, B.QNAN, out)


# E4M3 bytes of the E2M1 magnitudes 0, 0.5, 1, 1.5 and 2, 3, 4, 6, four to a word (byte i = magnitude code i)
_E2M1_TO_E4M3 = (np.uint32(0x3C383000), np.uint32(0x4C484440))


def e2m1_to_e4m3(nibbles):
    """E4M3 codes (uint32) of E2M1 codes (uint32, low 4 bits; higher bits ignored).

    Every E2M1 value is an E4M3 value, so FP4 operands can feed FP8 tensor
    cores. A lookup table in registers: the eight E4M3 magnitude bytes packed
    into two 32-bit words, selected by one shift (a handful of ALU ops per
    element, no memory gather).
    """
    mag = nibbles & np.uint32(7)
    word = jnp.where(mag < 4, _E2M1_TO_E4M3[0], _E2M1_TO_E4M3[1])
    byte = (word >> ((mag & np.uint32(3)) << 3)) & np.uint32(0xFF)
    return byte | ((nibbles & np.uint32(8)) << 4)
