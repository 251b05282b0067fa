"""MX block quantization: the OCP Microscaling grid, emulated exactly.

``quantize(x, spec, axis)`` returns float32 values on the MX grid: blocks of
``spec.block_size`` consecutive elements along ``axis`` share one power-of-two
scale 2**e (stored in hardware as E8M0), and each element is rounded to the
element format after division by that scale.

The fast path works on the IEEE-754 bit patterns of float32 with integer
arithmetic. That makes it exact where float arithmetic is not: XLA on CPU
flushes float32 subnormals to zero, and cannot compile casts to the FP6
types. Every step has a float64 twin in :mod:`proxy.reference`, which the
tests compare bit for bit.

Semantics (OCP MX v1.0 and the reference library, see REFERENCE_NOTES):

* scale rule ``"floor"``: ``e = floor(log2 amax) - emax``. With E4M3 the scaled
  block maximum lies in [256, 512) and every scaled value above 448 saturates:
  tightly clustered blocks collapse onto one code.
* scale rule ``"rceil"``: the smallest e with ``amax / 2**e <= max_normal``
  (NVIDIA Transformer Engine, cuBLAS, ``jax.nn.scaled_matmul``; the paper's
  "bump the shared exponent"). It never saturates.
* ``e`` is clamped below at -127 (so an all-zero block gets the smallest
  scale); above 127 the E8M0 scale is NaN and so is the whole block; a NaN or
  Inf anywhere in a block makes the whole block NaN.
* rounding ``"even"`` (ties to even, what hardware and ml_dtypes casts do),
  ``"away"`` (ties away from zero, the reference library's default) or
  ``"stochastic"``: with 32 random bits r per element (``jax.random.bits(key,
  x.shape)``), round up in magnitude iff ``frac + r / 2**32 >= 1``, where frac
  is the fractional part of |x| in units of the grid step. Unbiased up to
  2**-32 of a step.
* Values beyond ``max_normal`` saturate to it; element subnormals are kept.
* A length that is not a multiple of the block size is zero-padded to whole
  blocks and cut back (zeros never change a block's amax).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from proxy import formats as _formats
from proxy.formats import ElementFormat

__all__ = ["MXSpec", "QuantStats", "quantize", "quantize_stats", "SCALE_RULES", "ROUNDINGS"]

SCALE_RULES = ("floor", "rceil")
ROUNDINGS = ("even", "away", "stochastic")
SCALE_EXP_MIN, SCALE_EXP_MAX = -127, 127  # E8M0 range; 128 marks a NaN scale
NAN_SCALE_EXP = 128


@dataclasses.dataclass(frozen=True)
class MXSpec:
    """How one tensor is MX-quantized (frozen, hashable, validated).

    Attributes:
      element: element format (an :class:`ElementFormat` or its name).
      block_size: elements per shared scale along the block axis (OCP: 32).
      scale_rule: ``"floor"`` (OCP v1.0) or ``"rceil"`` (round the scale up so
        nothing saturates).
      rounding: ``"even"``, ``"away"`` or ``"stochastic"`` (needs a PRNG key).
    """

    element: ElementFormat | str
    block_size: int = 32
    scale_rule: str = "floor"
    rounding: str = "even"

    def __post_init__(self):
        object.__setattr__(self, "element", _formats.get(self.element))
        if self.element.is_vector:
            raise ValueError(
                f"MXSpec element must be an MX element format, not {self.element.name!r}; "
                f"valid: {', '.join(n for n in _formats.names() if not _formats.get(n).is_vector)}"
            )
        bs = self.block_size
        if isinstance(bs, bool) or not isinstance(bs, (int, np.integer)) or bs <= 0:
            raise ValueError(f"block_size must be a positive integer, got {bs!r}")
        object.__setattr__(self, "block_size", int(bs))
        if self.scale_rule not in SCALE_RULES:
            raise ValueError(f"unknown scale_rule {self.scale_rule!r}; valid: {', '.join(SCALE_RULES)}")
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"unknown rounding {self.rounding!r}; valid: {', '.join(ROUNDINGS)}")

    @property
    def name(self) -> str:
        """Short label, e.g. ``mxfp8_e4m3/32/floor/even``."""
        return f"mx{self.element.name}/{self.block_size}/{self.scale_rule}/{self.rounding}"

    def replace(self, **changes) -> "MXSpec":
        return dataclasses.replace(self, **changes)


class QuantStats(NamedTuple):
    """What one quantization did (the paper's overflow diagnostics).

    Fractions are over the real (unpadded) elements, in [0, 1].

    Attributes:
      clamped_frac: scaled magnitude strictly above ``max_normal`` (saturated).
      last_bin_frac: landed on the format's top code ``max_normal * 2**e``
        (clamped or rounded there) -- the paper's "last bin".
      flushed_frac: non-zero inputs that quantized to zero.
      nan_frac: elements in blocks that became NaN.
      scale_exponent: int32 per-block exponents e (scale 2**e), shaped like
        the input with the block axis replaced by its number of blocks;
        128 marks a NaN scale.
    """

    clamped_frac: jax.Array
    last_bin_frac: jax.Array
    flushed_frac: jax.Array
    nan_frac: jax.Array
    scale_exponent: jax.Array


# ----------------------------------------------------------------------------
# bit-level helpers (uint32 views of float32)

_ABS = np.uint32(0x7FFFFFFF)
_SIGN = np.uint32(0x80000000)
_INF = np.uint32(0x7F800000)
_QNAN = np.uint32(0x7FC00000)


def _u32(v):
    return jnp.asarray(v, jnp.uint32)


def _pow2_bits(k):
    """float32 bit pattern of 2**k for int32 k in [-149, 127] (subnormal below -126)."""
    normal = (jnp.clip(k + 127, 1, 254).astype(jnp.uint32)) << 23
    sub = jnp.left_shift(_u32(1), jnp.clip(k + 149, 0, 31).astype(jnp.uint32))
    return jnp.where(k >= -126, normal, sub)


def _max_normal_bits(fmt: ElementFormat, e):
    """float32 bits of ``max_normal * 2**e`` (exact, also when subnormal)."""
    m = fmt.mantissa_bits
    top = e + fmt.emax  # exponent of max_normal * 2**e
    # max_normal = max_significand * 2**(emax - m), max_significand in [2**m, 2**(m+1))
    frac = np.uint32((fmt.max_significand - (1 << m)) << (23 - m))
    normal = (jnp.clip(top + 127, 1, 254).astype(jnp.uint32) << 23) | frac
    shift = jnp.clip(top - m + 149, 0, 31).astype(jnp.uint32)
    sub = jnp.left_shift(_u32(fmt.max_significand), shift)
    return jnp.where(top >= -126, normal, sub)


def _block_view(x, axis: int, block_size: int):
    """Pad ``axis`` to whole blocks and split it into (blocks, block_size)."""
    n = x.shape[axis]
    nb = -(-n // block_size)
    pad = nb * block_size - n
    if pad:
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, pad)
        x = jnp.pad(x, widths)
    shape = x.shape[:axis] + (nb, block_size) + x.shape[axis + 1:]
    return x.reshape(shape), pad


def _unblock(xb, axis: int, pad: int):
    shape = xb.shape[:axis] + (xb.shape[axis] * xb.shape[axis + 1],) + xb.shape[axis + 2:]
    x = xb.reshape(shape)
    if pad:
        x = jax.lax.slice_in_dim(x, 0, x.shape[axis] - pad, axis=axis)
    return x


def _normalize_axis(axis, ndim: int) -> int:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise ValueError(f"axis must be an integer, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for an array of rank {ndim} (valid: {-ndim}..{ndim - 1})")
    return int(axis) % ndim


def _scale_exponent(amax_bits, spec: MXSpec):
    """Shared exponent e per block from the bits of the block's amax (int32)."""
    fmt = spec.element
    field = (amax_bits >> 23).astype(jnp.int32)
    # floor(log2 amax); a subnormal or zero amax lands at -127 after clamping anyway
    log2_floor = jnp.where(field > 0, field - 127, -127)
    e = jnp.maximum(log2_floor - fmt.emax, SCALE_EXP_MIN)
    if spec.scale_rule == "rceil":
        e = e + (amax_bits > _max_normal_bits(fmt, e)).astype(jnp.int32)
    nan_block = (amax_bits >= _INF) | (e > SCALE_EXP_MAX)
    return e, nan_block


def _block_amax(a, axis: int):
    """Max of the magnitude bits ``a`` over the block-element axis ``axis + 1``
    (kept, size 1). When that axis is the minor one, reducing it in two stages
    (.., bs/4, 4) lets XLA:CPU vectorize the reduction (about 4x faster)."""
    bs = a.shape[axis + 1]
    if axis + 2 == a.ndim and bs % 4 == 0 and bs >= 8:
        a4 = a.reshape(a.shape[:-1] + (bs // 4, 4))
        return jnp.max(jnp.max(a4, axis=-1), axis=-1, keepdims=True)
    return jnp.max(a, axis=axis + 1, keepdims=True)


def _block_params(amax, spec: MXSpec):
    """Everything the element rounding needs from a block, computed once per
    block: (e, nan_block, sat, v, step, half).

    * ``sat``: bits of ``max_normal * 2**e`` (saturation bound).
    * ``step``/``half``: bits of the smallest grid step ``2**s0`` and of its
      half, with ``s0 = emin + e - m`` (the element subnormal step).
    * ``v = s0 + 150``: with it the number of bits of an element below its grid
      step is ``max(23 - m, v - field)`` for a normal float32 element.
    """
    fmt = spec.element
    e, nan_block = _scale_exponent(amax, spec)
    sat = _max_normal_bits(fmt, e)
    s0 = e + (fmt.emin - fmt.mantissa_bits)
    step = _pow2_bits(s0)
    half = _pow2_bits(s0 - 1)
    v = s0 + 150
    return e, nan_block, sat, v, step, half


def _shl(x, n):
    """x << n for uint32 x and int32 n; 0 where n is outside [0, 31] (XLA semantics)."""
    return jax.lax.shift_left(x, n.astype(jnp.uint32))


def _shr(x, n):
    return jax.lax.shift_right_logical(x, n.astype(jnp.uint32))


def _round_bits(a, v, step, half, fmt: ElementFormat, rounding: str, rbits):
    """Round magnitudes ``a`` (uint32 float32 bits, already saturated) to the
    grid of ``fmt`` scaled by 2**e (block parameters from :func:`_block_params`,
    broadcastable to ``a``). Returns uint32 bits.

    Two exact cases:

    * ``a >= step`` (at least one grid step): the step is ``2**d`` float32 ulps
      of the element with ``d`` in [6, 23], so the rounding is an integer
      add-and-mask on the bit pattern (bits are linear within a binade, a carry
      into the exponent field is the next binade's first value; subnormal
      float32 bits are linear too).
    * ``a < step``: the result is 0 or ``step``, decided against ``half`` (or,
      for stochastic rounding, from the 32-bit fixed-point fraction a/step).
    """
    m = fmt.mantissa_bits
    field = (a >> 23).astype(jnp.int32)
    f1 = jnp.maximum(field, 1)
    # bits of a below its grid step: max(exponent of a's step - exponent of a's ulp)
    # normal a: max(23 - m, v - field); subnormal a: max(31 - m - clz(a), v - 1)
    lz = jnp.maximum(jax.lax.clz(a).astype(jnp.int32), 8)
    d = jnp.maximum((31 - m) - lz, v - f1)
    low = _shl(_u32(1), d) - np.uint32(1)  # d <= 23 wherever this is used
    if rounding == "even":
        big = (a + (low >> 1) + (_shr(a, d) & np.uint32(1))) & ~low
        up_small = a > half
    elif rounding == "away":
        big = (a + (low >> 1) + np.uint32(1)) & ~low
        up_small = a >= half
    else:  # stochastic: round up iff frac + r / 2**32 >= 1
        big = (a + _shr(rbits, 32 - d)) & ~low
        # 24-bit significand (subnormal: a itself), and a/step as 32-bit fixed point
        sig = a - ((f1 - 1).astype(jnp.uint32) << 23)
        frac = _shl(sig, 32 - d) | _shr(sig, d - 32)
        up_small = (frac + rbits) < rbits
    small = jnp.where(up_small, step, np.uint32(0))
    return jnp.where(a < step, small, big)


def _quantize_blocks(xb, spec: MXSpec, axis: int, rbits):
    """Core on a blocked view (block elements along ``axis + 1``).

    Returns (q bits, |x| bits, e, nan_block, saturation bits); the last three
    keep a size-1 block-element axis."""
    fmt = spec.element
    bits = jax.lax.bitcast_convert_type(xb, jnp.uint32)
    a = bits & _ABS
    amax = _block_amax(a, axis)
    e, nan_block, sat, v, step, half = _block_params(amax, spec)
    q = _round_bits(jnp.minimum(a, sat), v, step, half, fmt, spec.rounding, rbits)
    q = jnp.where(nan_block, _QNAN, q | (bits & _SIGN))
    return q, a, e, nan_block, sat


def _prepare(x, spec: MXSpec, axis, key):
    if not isinstance(spec, MXSpec):
        raise ValueError(f"spec must be an MXSpec, got {type(spec).__name__}")
    x = jnp.asarray(x)
    if not (jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer)):
        raise ValueError(f"quantize needs a real array, got dtype {x.dtype}")
    x = x.astype(jnp.float32)
    if x.ndim == 0:
        raise ValueError("quantize needs an array of rank >= 1, got a scalar")
    ax = _normalize_axis(axis, x.ndim)
    if spec.rounding == "stochastic" and key is None:
        raise ValueError("rounding='stochastic' needs a PRNG key: quantize(x, spec, key=jax.random.key(0))")
    return x, ax


def _random_bits(key, shape):
    """The 32 random bits per element that stochastic rounding consumes."""
    return jax.random.bits(key, shape, jnp.uint32)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def _quantize_ste(x, spec, axis, rbits):
    xb, pad = _block_view(x, axis, spec.block_size)
    rb = None
    if rbits is not None:
        rb, _ = _block_view(rbits, axis, spec.block_size)
    q, *_ = _quantize_blocks(xb, spec, axis, rb)
    return _unblock(jax.lax.bitcast_convert_type(q, jnp.float32), axis, pad)


@_quantize_ste.defjvp
def _quantize_ste_jvp(spec, axis, primals, tangents):
    x, rbits = primals
    tx, _ = tangents
    return _quantize_ste(x, spec, axis, rbits), tx  # straight-through estimator


@functools.partial(jax.jit, static_argnames=("spec", "axis"))
def quantize(x, spec: MXSpec, axis: int = -1, key=None) -> jax.Array:
    """Fake-quantize ``x`` onto the MX grid of ``spec`` (blocks along ``axis``).

    Args:
      x: real array of any rank >= 1 (cast to float32).
      spec: :class:`MXSpec`.
      axis: the block axis (the contraction axis of the GEMM it feeds).
      key: PRNG key, required for ``rounding="stochastic"``.

    Returns:
      float32 array of ``x``'s shape, each value exactly representable as
      element * 2**e. Differentiable as the identity (straight-through).
    """
    x, ax = _prepare(x, spec, axis, key)
    rbits = _random_bits(key, x.shape) if spec.rounding == "stochastic" else None
    return _quantize_ste(x, spec, ax, rbits)


@functools.partial(jax.jit, static_argnames=("spec", "axis"))
def quantize_stats(x, spec: MXSpec, axis: int = -1, key=None) -> QuantStats:
    """The overflow diagnostics of ``quantize(x, spec, axis, key)``.

    Uses the same code path as :func:`quantize`, so the counts agree with
    what it did. See :class:`QuantStats`.
    """
    x, ax = _prepare(x, spec, axis, key)
    rbits = _random_bits(key, x.shape) if spec.rounding == "stochastic" else None
    xb, pad = _block_view(x, ax, spec.block_size)
    rb = _block_view(rbits, ax, spec.block_size)[0] if rbits is not None else None
    q, a, e, nan_block, sat = _quantize_blocks(xb, spec, ax, rb)
    valid = jnp.ones(x.shape, bool)
    valid = _block_view(valid, ax, spec.block_size)[0]
    n = max(int(np.prod(x.shape)), 1)
    finite = valid & ~nan_block
    qa = q & _ABS

    def frac(mask):
        return jnp.sum(mask & valid, dtype=jnp.float32) / n

    e_out = jnp.where(nan_block, NAN_SCALE_EXP, e)
    e_out = jnp.squeeze(e_out, axis=ax + 1)
    return QuantStats(
        clamped_frac=frac(finite & (a > sat)),
        last_bin_frac=frac(finite & (qa == sat)),
        flushed_frac=frac(finite & (a != 0) & (qa == 0)),
        nan_frac=frac(valid & nan_block),
        scale_exponent=e_out,
    )
