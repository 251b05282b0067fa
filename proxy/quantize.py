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


def _shl(x, n):
    """x << n for uint32 x and int32 n; 0 where n is outside [0, 31] (XLA semantics)."""
    return jax.lax.shift_left(x, n.astype(jnp.uint32))


def _shr(x, n):
    """x >> n (logical) for uint32 x and int32 n; 0 where n is outside [0, 31]."""
    return jax.lax.shift_right_logical(x, n.astype(jnp.uint32))


def _pow2_bits(k: int) -> int:
    """float32 bit pattern of 2**k for k in [-149, 127] (subnormal below -126)."""
    k = min(max(k, -149), 127)
    return (k + 127) << 23 if k >= -126 else 1 << (k + 149)


def _max_normal_bits(fmt: ElementFormat, e: int) -> int:
    """float32 bits of ``max_normal * 2**e`` (exact, also when subnormal), for
    ``e + emax <= 127``."""
    m = fmt.mantissa_bits
    top = e + fmt.emax  # exponent of max_normal * 2**e
    # max_normal = max_significand * 2**(emax - m), max_significand in [2**m, 2**(m+1))
    if top >= -126:
        return ((top + 127) << 23) | ((fmt.max_significand - (1 << m)) << (23 - m))
    return fmt.max_significand << max(top - m + 149, 0)


def _pad_blocks(x, axis: int, block_size: int):
    """Zero-pad ``axis`` to whole blocks; returns (padded x, pad)."""
    n = x.shape[axis]
    pad = -n % block_size
    if pad:
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, pad)
        x = jnp.pad(x, widths)
    return x, pad


def _split_blocks(x, axis: int, block_size: int):
    """Split a whole number of blocks along ``axis`` into (blocks, block_size)."""
    shape = x.shape[:axis] + (x.shape[axis] // block_size, block_size) + x.shape[axis + 1:]
    return x.reshape(shape)


def _block_view(x, axis: int, block_size: int):
    """Pad ``axis`` to whole blocks and split it into (blocks, block_size)."""
    x, pad = _pad_blocks(x, axis, block_size)
    return _split_blocks(x, axis, block_size), pad


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


# ----------------------------------------------------------------------------
# the fast path: block amax -> per-block table lookup -> integer rounding
#
# Performance notes (XLA:CPU): it compiles to three kinds of loops, the amax
# reduction, one small gather per block quantity, and the element loop. Block
# quantities computed from amax with ordinary operations would be fused into
# the element loop and re-evaluated for every vector of elements (that doubled
# its cost); a gather is not fused into its consumers, so the table lookup
# also materializes them, once per block.


def _block_amax(a, axis: int, block_size: int):
    """Per-block max of the magnitude bits ``a`` (padded, not yet split), shaped
    like the split view with a size-1 block-element axis.

    With the block axis last, the reduction is written over (.., blocks,
    block_size / 2, 2) straight from the unsplit array: XLA:CPU then emits a
    vectorized reduction, 2-4x faster than over (.., blocks, block_size).
    """
    if axis == a.ndim - 1 and block_size % 2 == 0 and block_size >= 4:
        a4 = a.reshape(a.shape[:-1] + (a.shape[-1] // block_size, block_size // 2, 2))
        return jnp.max(a4, axis=(-2, -1))[..., None]
    return jnp.max(_split_blocks(a, axis, block_size), axis=axis + 1, keepdims=True)


class _Block(NamedTuple):
    """Per-block quantities (arrays with a size-1 block-element axis).

    e: scale exponent (int32). nan: the block is NaN (Inf/NaN inside, or e > 127).
    sat: bits of ``max_normal * 2**e``, the saturation bound; Inf where that
      exceeds float32 (nothing saturates; a value rounding to 2**128 is Inf).
    v: ``s0 + 150`` with ``s0 = emin + e - m`` the exponent of the smallest grid
      step: an element with exponent field f >= 1 has ``max(23 - m, v - f)``
      bits below its grid step. Negative in NaN blocks.
    step, half: bits of ``2**s0`` and ``2**(s0 - 1)``.
    """

    e: jax.Array
    nan: jax.Array
    sat: jax.Array
    v: jax.Array
    step: jax.Array
    half: jax.Array


@functools.lru_cache(maxsize=None)
def _block_table(fmt: ElementFormat, scale_rule: str) -> np.ndarray:
    """The block quantities of every possible block: an int64 table with
    columns (e, nan, sat, v, step, half) of :class:`_Block`, one row per amax
    exponent field F (0..255), and under "rceil" 256 more rows for a bumped e
    (see :func:`_block_index`). A block depends on its amax only through them.
    """
    F = np.arange(256)
    # floor(log2 amax) - emax, clamped at -127 (F = 0: zero or subnormal amax)
    e = np.maximum(F - 127 - fmt.emax, SCALE_EXP_MIN)
    if scale_rule == "rceil":
        F, e = np.tile(F, 2), np.concatenate([e, e + 1])
    nan = (F == 255) | (e > SCALE_EXP_MAX)
    # max_normal * 2**e >= 2**128 (rceil, amax near float32 max): nothing saturates,
    # and a value that rounds to the grid point 2**128 becomes Inf, as in float64
    sat = [int(_INF) if k + fmt.emax > 127 else _max_normal_bits(fmt, k) for k in e.tolist()]
    s0 = e + (fmt.emin - fmt.mantissa_bits)
    v = np.where(nan, -(1 << 20), s0 + 150)
    step = [_pow2_bits(k) for k in s0.tolist()]
    half = [_pow2_bits(k - 1) for k in s0.tolist()]
    return np.stack([e, nan, sat, v, step, half], axis=-1).astype(np.int64)


def _block_index(amax, spec: MXSpec):
    """Row of :func:`_block_table` for each block: the amax exponent field F,
    plus 256 where "rceil" bumps e (amax above ``max_normal * 2**e``)."""
    fmt = spec.element
    F = (amax >> 23).astype(jnp.int32)
    if spec.scale_rule != "rceil":
        return F
    # max_normal * 2**e before the bump: F's binade with max_normal's mantissa
    # bits; below F = max(emax, 1), e is clamped at -127: a constant
    frac = np.uint32((fmt.max_significand - (1 << fmt.mantissa_bits)) << (23 - fmt.mantissa_bits))
    low_scale = np.uint32(_max_normal_bits(fmt, SCALE_EXP_MIN))
    thr = jnp.where(F >= max(fmt.emax, 1), (amax & _INF) | frac, low_scale)
    return F + jnp.where(amax > thr, 256, 0)


def _block_params(amax, spec: MXSpec) -> _Block:
    """The block quantities, looked up in :func:`_block_table`: one gather per
    quantity, so that each comes out contiguous whatever the block layout (the
    NaN flag is v < 0, one gather fewer; e is only gathered where used)."""
    table = _block_table(spec.element, spec.scale_rule)
    idx = _block_index(amax, spec)

    def column(k, dtype):
        return jnp.asarray(table[:, k].astype(dtype)).at[idx].get(mode="promise_in_bounds")

    v = column(3, np.int32)
    return _Block(e=column(0, np.int32), nan=v < 0, sat=column(2, np.uint32), v=v,
                  step=column(4, np.uint32), half=column(5, np.uint32))


def _round_bits(a, blk: _Block, fmt: ElementFormat, rounding: str, rbits):
    """Round magnitudes ``a`` (uint32 float32 bits, already saturated) to the
    grid of ``fmt`` scaled by 2**e (block quantities ``blk``, broadcastable to
    ``a``). Returns uint32 bits.

    With d the number of bits of a below its grid step (the step is 2**d
    float32 ulps of a; d >= 6 for every format):

    * d <= 23: the rounding is an integer add-and-mask on the bit pattern
      (bits are linear within a binade, a carry into the exponent field is the
      next binade's first value, and subnormal float32 bits are linear too).
    * d >= 24: a is below the smallest grid step 2**s0, and the result is 0 or
      2**s0: up from 2**(s0-1) on (ties: "even" rounds down to 0).
    """
    m = fmt.mantissa_bits
    field = (a >> 23).astype(jnp.int32)
    f1 = jnp.maximum(field, 1)
    # normal a: max(23 - m, v - field); subnormal a: max(31 - m - clz(a), v - 1)
    lz = jnp.maximum(jax.lax.clz(a).astype(jnp.int32), 8)
    d = jnp.maximum((31 - m) - lz, blk.v - f1)
    low = _shl(_u32(1), d) - np.uint32(1)  # d <= 23 wherever this is used
    if rounding == "even":
        # parity of floor(a / step): bit d of the 24-bit significand (at d = 23
        # a normal a's implicit bit, not the low bit of its exponent field)
        sig = a | (jnp.minimum(a, np.uint32(0x800000)) & np.uint32(0x800000))
        big = (a + (low >> 1) + (_shr(sig, d) & np.uint32(1))) & ~low
        small = jnp.where(a > blk.half, blk.step, np.uint32(0))
        return jnp.where(d >= 24, small, big)
    if rounding == "away":
        big = (a + (low >> 1) + np.uint32(1)) & ~low
        small = jnp.where(a >= blk.half, blk.step, np.uint32(0))
        return jnp.where(d >= 24, small, big)
    # stochastic: round up iff frac + r / 2**32 >= 1, i.e. on a carry out of the
    # 32-bit fixed-point sum; for d <= 23 that is a plain add into the bits
    big = (a + _shr(rbits, 32 - d)) & ~low
    sig = a - ((f1 - 1).astype(jnp.uint32) << 23)  # 24-bit significand (subnormal: a)
    frac = _shl(sig, 32 - d) | _shr(sig, d - 32)  # a / step with 32 fraction bits
    small = jnp.where((frac + rbits) < rbits, blk.step, np.uint32(0))
    return jnp.where(a < blk.step, small, big)


def _quantize_blocks(xp, spec: MXSpec, axis: int, rbits):
    """Core on ``xp``, padded to whole blocks along ``axis`` (and ``rbits``
    likewise, or None).

    Returns the split view (block elements along ``axis + 1``) of the q bits
    and |x| bits, and the :class:`_Block` quantities."""
    bs = spec.block_size
    blk = _block_params(_block_amax(jax.lax.bitcast_convert_type(xp, jnp.uint32) & _ABS, axis, bs), spec)
    bits = jax.lax.bitcast_convert_type(_split_blocks(xp, axis, bs), jnp.uint32)
    a = bits & _ABS
    rb = None if rbits is None else _split_blocks(rbits, axis, bs)
    q = _round_bits(jnp.minimum(a, blk.sat), blk, spec.element, spec.rounding, rb)
    q = jnp.where(blk.nan, _QNAN, q | (bits & _SIGN))
    return q, a, blk


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
    xp, pad = _pad_blocks(x, axis, spec.block_size)
    if rbits is not None:
        rbits, _ = _pad_blocks(rbits, axis, spec.block_size)
    q, *_ = _quantize_blocks(xp, spec, axis, rbits)
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
    xp, _ = _pad_blocks(x, ax, spec.block_size)
    rbp = _pad_blocks(rbits, ax, spec.block_size)[0] if rbits is not None else None
    q, a, blk = _quantize_blocks(xp, spec, ax, rbp)
    e, nan_block, sat = blk.e, blk.nan, blk.sat
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
        last_bin_frac=frac(finite & (qa == sat) & (sat != _INF)),  # Inf is 2**128, not the top code
        flushed_frac=frac(finite & (a != 0) & (qa == 0)),
        nan_frac=frac(valid & nan_block),
        scale_exponent=e_out,
    )
