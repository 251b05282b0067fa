"""NVFP4: E2M1 elements, E4M3 block scales and one float32 scale per tensor.

Each block (16 elements, or a 16x16 tile) has an FP8 E4M3 scale s (not a
power of two), and the whole array one float32 decode scale G derived from its
amax A. The recipe is NVIDIA Transformer Engine's (``quantization_ref_nvfp4.py``,
bit exact with its CUDA kernels), with every step a correctly rounded float32
operation fl(.), in this order::

    S_enc = fl(2688 / A)                    # global encode scale, 2688 = 448 * 6
    G     = fl(1 / S_enc)                   # global decode scale, ~ A / 2688
    d     = fl(bmax * fl(S_enc * fl(1/6)))  # bmax: the block's max |x|
    s     = E4M3(min(d, 448))               # round to nearest even
    enc   = fl(1 / fl(s * G))               # 0 where s == 0
    v     = fl(|x| * enc)                   # the scaled magnitude
    q     = E2M1(min(v, 6))                 # the spec's rounding; saturates at 6
    out   = sign(x) * fl((q * s) * G)       # q * s is exact; one rounding

The intermediate values S_enc, G, d, enc, v are held with float32's 24-bit
significand but an unbounded exponent (no overflow, no subnormals, no
flush-to-zero); only ``out`` is rounded to float32, once, with subnormals.
The codes q, s and G are TE's float32 ones bit for bit whenever A >= 2**-105,
and the recipe stays exactly invariant under scaling by powers of two
(``q(x * 2**j) = q(x) * 2**j`` away from the float32 ends of ``out``).

Implementation: everything is computed on the array scaled by 2**-k,
k = floor(log2 amax), with exact power-of-two shifts of the bit patterns:
there every float32 intermediate is a normal number, so the float ops are
correctly rounded and XLA's flush-to-zero never changes a result. Ops that
XLA's algebraic simplifier would rewrite (``1 / (c / a) -> a * (1 / c)`` and
the like) are fenced with optimization barriers. Special cases: any NaN or
Inf makes the WHOLE array NaN (its amax, hence every block scale, is
undefined); an all-zero array gives zeros; a block whose E4M3 scale is 0
gives zeros. Stochastic rounding applies to the elements only (the block
scales always round to nearest even).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from mx_proxy.numerics import formats as _formats
from mx_proxy.numerics.formats import ElementFormat
from mx_proxy.numerics.mx import bits as B
from mx_proxy.numerics.mx.block_scale import NAN_SCALE_EXP, Block
from mx_proxy.numerics.mx.element import round_magnitude

__all__ = ["E4M3_MAX", "E2M1_MAX", "ZERO_SCALE_EXP", "E2M1_MAX_BITS", "NV", "quantize_view", "scale_exponent",
           "global_scale"]

E4M3_MAX, E2M1_MAX = 448.0, 6.0  # largest block scale and element
ZERO_SCALE_EXP = -256  # marks a zero block scale (every real one is > -171)
_C6 = np.float32(1) / np.float32(E2M1_MAX)  # fl(1/6), TE's fp4_max_inv
_NV_ENC = np.float32(E4M3_MAX * E2M1_MAX)  # 2688, exact
_E4M3 = _formats.get("fp8_e4m3")
_E2M1 = _formats.get("fp4_e2m1")
_E4M3_MAX_BITS = np.uint32(B.max_normal_bits_int(_E4M3, 0))
E2M1_MAX_BITS = np.uint32(B.max_normal_bits_int(_E2M1, 0))


def _unit_block(fmt: ElementFormat) -> Block:
    """Block quantities of the unscaled grid of ``fmt`` (e = 0)."""
    s0 = fmt.emin - fmt.mantissa_bits
    return Block(e=np.int32(0), nan=np.bool_(False), sat=np.uint32(B.max_normal_bits_int(fmt, 0)),
                 v=np.int32(s0 + 150), step=np.uint32(B.pow2_bits_int(s0)),
                 half=np.uint32(B.pow2_bits_int(s0 - 1)))


class NV(NamedTuple):
    """One NVFP4 quantization worked through (arrays on the view).

    q: output bits (sign included; NaN everywhere for a non-finite array).
    a: |x| bits. v: bits of the scaled magnitude ``|x| * enc * 2**k`` before
    saturation (0 in zero-scale blocks). code: bits of the rounded element
    magnitude (0 .. 6). s: bits of the E4M3 block scale (per block).
    nan: scalar, the array holds a NaN or Inf. zero: scalar, the array is all
    zero. k: scalar floor(log2 amax). g: scalar bits of G * 2**-k in [2**-12, 2**-10).
    """

    q: jax.Array
    a: jax.Array
    v: jax.Array
    code: jax.Array
    s: jax.Array
    nan: jax.Array
    zero: jax.Array
    k: jax.Array
    g: jax.Array


def quantize_view(xv, red: tuple[int, ...], rounding: str, rbits=None) -> NV:
    """NVFP4 on a block view ``xv`` (float32) whose block elements lie along
    the axes ``red``; ``rbits``: random bits on the view, or None.

    With amax = 2**k * A', A' in [1, 2): S' = 2688 / A' in (1344, 2688],
    G' = 1 / S' in [2**-11.4, 2**-10.4), the multiplier S' / 6 in (224, 448];
    the block maxima scaled by 2**-k are below 2, so d < 896, s in
    {0} u [2**-9, 448], s * G' in [2**-20.4, 1/3], enc' = 1 / (s * G') in
    [3, 2**20.4] and v below 2**21.4: all normal. A scaled |x| below 2**-126
    reads as 0: then v < 2**-105, which rounds to 0 in every mode.
    """
    bits = B.b32(xv)
    a = bits & B.ABS
    amax = jnp.max(a, initial=0)  # an empty array's amax is 0, as an all-zero one's
    nan, zero = amax >= B.INF, amax == 0
    k = jnp.where(nan | zero, 0, B.exponent_fraction(amax)[0])
    a_norm = B.f32(jnp.where(nan | zero, B.ONE, B.scale_pow2(amax, -k)))
    barrier = jax.lax.optimization_barrier
    s_enc = barrier(_NV_ENC / a_norm)
    g = barrier(np.float32(1) / s_enc)
    mult = barrier(s_enc * _C6)

    bmax = B.f32(B.scale_pow2(jnp.max(a, axis=red, keepdims=True), -k))
    d = barrier(bmax * mult)
    s = round_magnitude(jnp.minimum(B.b32(d), _E4M3_MAX_BITS), _unit_block(_E4M3), _E4M3, "even")
    sg = barrier(B.f32(s) * g)
    enc = barrier(jnp.where(s == 0, np.float32(0), np.float32(1) / sg))

    v = B.b32(B.f32(B.scale_pow2(a, -k)) * enc)
    code = round_magnitude(jnp.minimum(v, E2M1_MAX_BITS), _unit_block(_E2M1), _E2M1, rounding, rbits)

    # out = fl((q * s) * G): q * s is exact with at most 6 significant bits
    qs = B.b32(B.f32(code) * B.f32(s))
    g_bits = B.b32(g)
    p = (((qs & B.MANT) | B.HIDDEN) >> 18) * ((g_bits & B.MANT) | B.HIDDEN)  # < 2**30
    exp2 = ((qs >> 23).astype(jnp.int32) - 127 - 5) + ((g_bits >> 23).astype(jnp.int32) - 127 - 23) + k
    out = jnp.where(qs == 0, np.uint32(0), B.round_to_f32(p, exp2))
    q = jnp.where(nan, B.QNAN, out | (bits & B.SIGN))
    return NV(q=q, a=a, v=v, code=code, s=s, nan=nan, zero=zero, k=k, g=g_bits)


def scale_exponent(nv: NV):
    """floor(log2(s * G)) per block, exactly (int32), with the markers
    ``ZERO_SCALE_EXP`` (zero block scale) and ``NAN_SCALE_EXP`` (NaN array)."""
    s, g = nv.s, nv.g
    carry = ((((s & B.MANT) | B.HIDDEN) >> 20) * ((g & B.MANT) | B.HIDDEN)) >= np.uint32(1 << 27)
    e = ((s >> 23).astype(jnp.int32) - 127) + ((g >> 23).astype(jnp.int32) - 127) + nv.k + carry.astype(jnp.int32)
    e = jnp.where(s == 0, ZERO_SCALE_EXP, e)
    return jnp.where(nv.nan, NAN_SCALE_EXP, e)


def global_scale(nv: NV):
    """G as a float32 scalar (1.0 for an all-zero array, NaN for a NaN one)."""
    g = B.round_to_f32((nv.g & B.MANT) | B.HIDDEN, (nv.g >> 23).astype(jnp.int32) - 127 - 23 + nv.k)
    g = jnp.where(nv.zero, B.ONE, g)
    return B.f32(jnp.where(nv.nan, B.QNAN, g))
