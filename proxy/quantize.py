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

2-D tiles (``MXSpec(block_dims=2)``): one scale per ``block_size x
block_size`` square tile over the LAST TWO axes (rank >= 2; leading axes are
batch axes), everything else as above, per tile. ``axis`` is then ignored
(any valid axis is accepted). The tiling is symmetric, so for deterministic
roundings ``quantize(w.T) == quantize(w).T`` exactly: a weight quantized once
serves both the forward GEMM and its transpose in the backward pass. Ragged
shapes are zero-padded on both axes to whole tiles and cut back.

NVFP4 (``MXSpec(scale_format="e4m3")``, e.g. :data:`NVFP4`): element
``fp4_e2m1`` only; each block (16 elements in :data:`NVFP4` -- MXSpec's own
default block_size stays 32 -- or a 16x16 tile in :data:`NVFP4_2D`, with
``block_dims=2``) has an FP8 E4M3 scale s (not a power of two), and
the whole array one float32 decode scale G derived from its amax A. The
recipe is NVIDIA Transformer Engine's (``quantization_ref_nvfp4.py``, bit
exact with its CUDA kernels), with every step a correctly rounded float32
operation fl(.), in this order::

    S_enc = fl(2688 / A)                    # global encode scale, 2688 = 448 * 6
    G     = fl(1 / S_enc)                   # global decode scale, ~ A / 2688
    d     = fl(bmax * fl(S_enc * fl(1/6)))  # bmax: the block's max |x|
    s     = E4M3(min(d, 448))               # round to nearest even
    enc   = fl(1 / fl(s * G))               # 0 where s == 0
    v     = fl(|x| * enc)                   # the scaled magnitude
    q     = E2M1(min(v, 6))                 # spec.rounding; saturates at 6
    out   = sign(x) * fl((q * s) * G)       # q * s is exact; one rounding

The intermediate values S_enc, G, d, enc, v are held with float32's 24-bit
significand but an unbounded exponent (no overflow, no subnormals, no
flush-to-zero); only ``out`` is rounded to float32, once, with subnormals (it
cannot overflow: G grows with A, and 2688 * G at A = float32 max rounds to
float32 max). The codes q, s and G are then TE's float32 ones bit for bit
whenever A >= 2**-105 (no TE intermediate leaves the normal range there; TE's
standalone dequantize rounds ``q * fl(fl(s * A) / 2688)`` instead, which can
differ from ``out`` in the last bit), and the recipe stays
exactly invariant under scaling by powers of two (``q(x * 2**j) = q(x) *
2**j`` away from the float32 ends of ``out``) also below, where TE's own
global scale saturates at float32 max. The implementation works on A
normalized to [1, 2) (exact power-of-two shifts on the bit patterns), where
all intermediates are normal floats, so XLA's flushing of subnormals never
matters. ``scale_rule`` is ``"amax"`` (the only rule; it is the default).
Special cases: any NaN or Inf in the array makes the WHOLE array NaN (its
amax, hence every block scale, is undefined); an all-zero array gives zeros;
a block whose E4M3 scale is 0 (all zero, or d <= 2**-10, i.e. bmax below
about A * 2**-18.8) gives zeros (TE writes code +-6 there with a zero scale:
the same values). ``"stochastic"`` rounds the elements only (up iff
``frac + r / 2**32 >= 1``, frac the fractional part of v in E2M1 grid steps),
as TE does; the block scales always round to nearest even. Zeros keep x's
sign. JAX's own NVFP4 quantizer (``jax.nn.get_scaled_dot_general_config(
"nvfp4", global_scale)``) takes G from the caller; as XLA compiles it, it gives
the same values when G is a power of two (see ``tests/test_nvfp4.py`` for
where and why the two differ otherwise).
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

__all__ = ["MXSpec", "QuantStats", "quantize", "quantize_stats", "NVFP4", "NVFP4_2D", "SCALE_RULES",
           "E4M3_SCALE_RULES", "SCALE_FORMATS", "BLOCK_DIMS", "ROUNDINGS"]

SCALE_RULES = ("floor", "rceil")  # E8M0 (power-of-two) scale rules
E4M3_SCALE_RULES = ("amax",)  # E4M3 (NVFP4) block scales: block amax / 6, see the module docstring
SCALE_FORMATS = ("e8m0", "e4m3")
BLOCK_DIMS = (1, 2)
E4M3_ELEMENTS = ("fp4_e2m1",)  # element formats with E4M3 scales (NVFP4)
ROUNDINGS = ("even", "away", "stochastic")
SCALE_EXP_MIN, SCALE_EXP_MAX = -127, 127  # E8M0 range; 128 marks a NaN scale
NAN_SCALE_EXP = 128
ZERO_SCALE_EXP = -256  # E4M3 scales: marks a zero block scale (every real one is > -171)
E4M3_MAX, E2M1_MAX = 448.0, 6.0  # NVFP4: largest block scale and element


@dataclasses.dataclass(frozen=True)
class MXSpec:
    """How one tensor is block-quantized (frozen, hashable, validated).

    Attributes:
      element: element format (an :class:`ElementFormat` or its name).
      block_size: elements per shared scale along the block axis (OCP: 32;
        NVFP4: 16); with ``block_dims=2`` the side of the square tile.
      scale_rule: E8M0 scales: ``"floor"`` (OCP v1.0) or ``"rceil"`` (round the
        scale up so nothing saturates). E4M3 scales: ``"amax"`` (the NVFP4
        recipe; the only one). ``None`` (the default) picks ``"floor"`` for
        E8M0 and ``"amax"`` for E4M3; the stored value is always the resolved one.
      rounding: ``"even"``, ``"away"`` or ``"stochastic"`` (needs a PRNG key);
        of the elements only (E4M3 block scales always round to nearest even).
      block_dims: 1 (blocks along the ``axis`` of :func:`quantize`) or 2
        (``block_size x block_size`` tiles over the last two axes, ``axis``
        ignored).
      scale_format: ``"e8m0"`` (OCP MX: power-of-two block scales) or
        ``"e4m3"`` (NVFP4: FP8 E4M3 block scales times one float32 scale per
        tensor; element ``fp4_e2m1`` only). See the module docstring.
    """

    element: ElementFormat | str
    block_size: int = 32
    scale_rule: str | None = None
    rounding: str = "even"
    block_dims: int = 1
    scale_format: str = "e8m0"

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
        if self.scale_format not in SCALE_FORMATS:
            raise ValueError(f"unknown scale_format {self.scale_format!r}; valid: {', '.join(SCALE_FORMATS)}")
        bd = self.block_dims
        if isinstance(bd, bool) or not isinstance(bd, (int, np.integer)) or bd not in BLOCK_DIMS:
            raise ValueError(f"block_dims must be one of {', '.join(map(str, BLOCK_DIMS))} (1: blocks along an "
                             f"axis, 2: square tiles over the last two axes), got {bd!r}")
        object.__setattr__(self, "block_dims", int(bd))
        rules = SCALE_RULES if self.scale_format == "e8m0" else E4M3_SCALE_RULES
        if self.scale_rule is None:
            object.__setattr__(self, "scale_rule", rules[0])
        if self.scale_rule not in rules:
            raise ValueError(f"unknown scale_rule {self.scale_rule!r} for scale_format={self.scale_format!r}; "
                             f"valid: {', '.join(rules)} (or None for {rules[0]!r})")
        if self.scale_format == "e4m3" and self.element.name not in E4M3_ELEMENTS:
            raise ValueError(f"scale_format='e4m3' (NVFP4) needs element {' or '.join(E4M3_ELEMENTS)}, "
                             f"got {self.element.name!r}; for other elements use scale_format='e8m0'")
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"unknown rounding {self.rounding!r}; valid: {', '.join(ROUNDINGS)}")

    @property
    def name(self) -> str:
        """Short label, e.g. ``mxfp8_e4m3/32/floor/even``, ``mxfp4_e2m1/32x32/rceil/even``
        (2-D tiles) or ``nvfp4_e2m1/16/amax/even`` (E4M3 scales)."""
        prefix = "nv" if self.scale_format == "e4m3" else "mx"
        tile = f"{self.block_size}x{self.block_size}" if self.block_dims == 2 else f"{self.block_size}"
        return f"{prefix}{self.element.name}/{tile}/{self.scale_rule}/{self.rounding}"

    def replace(self, **changes) -> "MXSpec":
        return dataclasses.replace(self, **changes)


NVFP4 = MXSpec("fp4_e2m1", block_size=16, scale_format="e4m3")
"""NVIDIA NVFP4: E2M1 elements, 16-element blocks with E4M3 scales, one float32 scale per tensor."""
NVFP4_2D = NVFP4.replace(block_dims=2)
"""NVFP4 with 16x16 tiles (TE's recipe for weights)."""


class QuantStats(NamedTuple):
    """What one quantization did (the paper's overflow diagnostics).

    Fractions are over the real (unpadded) elements, in [0, 1].

    Attributes:
      clamped_frac: scaled magnitude strictly above ``max_normal`` (saturated).
      last_bin_frac: landed on the format's top code ``max_normal * 2**e``
        (clamped or rounded there) -- the paper's "last bin".
      flushed_frac: non-zero inputs that quantized to zero.
      nan_frac: elements in blocks that became NaN (E4M3 scales: the whole
        array is NaN or nothing is).
      scale_exponent: int32 per-block exponents, shaped like the input with
        the block axis replaced by its number of blocks; with 2-D tiles
        ``(..., ceil(rows / bs), ceil(cols / bs))``. E8M0: e of the scale 2**e,
        128 marks a NaN scale. E4M3: ``floor(log2(s * G))``, the binade of the
        block's decoded scale (exact), 128 for a NaN array and
        ``ZERO_SCALE_EXP`` (-256) for a zero block scale.
      block_scale: float32 per-block scale, shaped like ``scale_exponent``:
        2**e (E8M0) or the E4M3 value s; NaN for NaN blocks.
      global_scale: float32 scalar decode scale per tensor: 1.0 for E8M0; G
        for E4M3 (1.0 for an all-zero array, NaN for a NaN array), rounded to
        float32 (exact for amax >= 2**-114).
    """

    clamped_frac: jax.Array
    last_bin_frac: jax.Array
    flushed_frac: jax.Array
    nan_frac: jax.Array
    scale_exponent: jax.Array
    block_scale: jax.Array | None = None
    global_scale: jax.Array | None = None


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


def _finish(bits, a, blk: _Block, spec: MXSpec, rb):
    """Round |x| bits ``a`` (sign bits ``bits``) on the grid of the block
    quantities ``blk``; NaN blocks become the canonical quiet NaN."""
    q = _round_bits(jnp.minimum(a, blk.sat), blk, spec.element, spec.rounding, rb)
    return jnp.where(blk.nan, _QNAN, q | (bits & _SIGN))


def _quantize_blocks(xp, spec: MXSpec, axis: int, rbits):
    """Core of the 1-D E8M0 path on ``xp``, padded to whole blocks along
    ``axis`` (and ``rbits`` likewise, or None).

    Returns the split view (block elements along ``axis + 1``) of the q bits
    and |x| bits, and the :class:`_Block` quantities."""
    bs = spec.block_size
    blk = _block_params(_block_amax(jax.lax.bitcast_convert_type(xp, jnp.uint32) & _ABS, axis, bs), spec)
    bits = jax.lax.bitcast_convert_type(_split_blocks(xp, axis, bs), jnp.uint32)
    a = bits & _ABS
    rb = None if rbits is None else _split_blocks(rbits, axis, bs)
    return _finish(bits, a, blk, spec, rb), a, blk


# ----------------------------------------------------------------------------
# block layouts other than the 1-D fast path: a "view" splits the padded array
# so that each block's elements lie along the ``red`` axes


class _Layout(NamedTuple):
    """Where the blocks are: ``dims`` 1 (``bs`` elements along ``axis``) or 2
    (``bs x bs`` tiles over the last two axes)."""

    dims: int
    axis: int
    bs: int

    @property
    def red(self) -> tuple[int, ...]:
        """The block-element axes of the view."""
        return (self.axis + 1,) if self.dims == 1 else (-3, -1)

    def view(self, x):
        """Zero-pad to whole blocks and split (1-D: (.., blocks, bs, ..); 2-D:
        (.., row tiles, bs, column tiles, bs))."""
        if self.dims == 1:
            return _block_view(x, self.axis, self.bs)[0]
        widths = [(0, 0)] * (x.ndim - 2) + [(0, -n % self.bs) for n in x.shape[-2:]]
        if any(w[1] for w in widths):
            x = jnp.pad(x, widths)
        r, c = x.shape[-2:]
        return x.reshape(x.shape[:-2] + (r // self.bs, self.bs, c // self.bs, self.bs))

    def unview(self, v, shape):
        """Inverse of :meth:`view` for an array of the original ``shape``."""
        if self.dims == 1:
            padded = shape[:self.axis] + (v.shape[self.axis] * self.bs,) + shape[self.axis + 1:]
        else:
            padded = shape[:-2] + (v.shape[-4] * self.bs, v.shape[-2] * self.bs)
        x = v.reshape(padded)
        if padded != tuple(shape):
            x = jax.lax.slice(x, (0,) * len(shape), tuple(shape))
        return x

    def squeeze(self, per_block):
        """A per-block array of the view (size-1 ``red`` axes) without those axes."""
        return jnp.squeeze(per_block, axis=self.red)


def _layout(spec: MXSpec, axis: int) -> _Layout:
    return _Layout(spec.block_dims, axis, spec.block_size)


def _quantize_e8m0_view(xv, spec: MXSpec, lay: _Layout, rb):
    """E8M0 scales on a view (2-D tiles): (q bits, |x| bits, :class:`_Block`)."""
    bits = jax.lax.bitcast_convert_type(xv, jnp.uint32)
    a = bits & _ABS
    blk = _block_params(jnp.max(a, axis=lay.red, keepdims=True), spec)
    return _finish(bits, a, blk, spec, rb), a, blk


# ----------------------------------------------------------------------------
# NVFP4: E4M3 block scales and one float32 scale per tensor
#
# Everything is computed on the array scaled by 2**-k, k = floor(log2 amax),
# with exact power-of-two shifts of the bit patterns: there every float32
# intermediate is a normal number (see the ranges below), so the float ops are
# correctly rounded and XLA's flush-to-zero never changes a result, and the
# unbounded-exponent semantics of the module docstring hold by construction.
# Ops that XLA's algebraic simplifier would rewrite (1 / (c / a) -> a * (1 / c)
# and the like) are fenced with optimization barriers.

_MANT = np.uint32(0x007FFFFF)
_HIDDEN = np.uint32(0x00800000)
_ONE = np.uint32(0x3F800000)
_C6 = np.float32(1) / np.float32(E2M1_MAX)  # fl(1/6), TE's fp4_max_inv
_NV_ENC = np.float32(E4M3_MAX * E2M1_MAX)  # 2688, exact


def _exponent_fraction(a):
    """floor(log2 |v|) (int32) and the 23 fraction bits after the leading one,
    for finite non-zero magnitude bits ``a`` (normal or subnormal)."""
    field = (a >> 23).astype(jnp.int32)
    lead = 31 - jax.lax.clz(a).astype(jnp.int32)  # leading bit of a subnormal
    e = jnp.where(field > 0, field - 127, lead - 149)
    frac = jnp.where(field > 0, a & _MANT, _shl(a, 23 - lead) & _MANT)
    return e, frac


def _scale_pow2(a, j):
    """Bits of ``|v| * 2**j`` for magnitude bits ``a`` where that is at least
    2**-126 (exact); 0 below (and for a = 0). The caller keeps it below 2**128."""
    e, frac = _exponent_fraction(a)
    e = e + j
    return jnp.where((a != 0) & (e >= -126), ((e + 127).astype(jnp.uint32) << 23) | frac, np.uint32(0))


def _round_to_f32(p, exp2):
    """float32 bits of ``p * 2**exp2`` (uint32 p > 0, int32 exp2), rounded to
    nearest even once: subnormal results on the subnormal grid, Inf above."""
    e = exp2 + (31 - jax.lax.clz(p).astype(jnp.int32))  # floor(log2) of the value
    lsb = jnp.maximum(e - 23, -149)  # exponent of the result's last bit
    sh = lsb - exp2
    r = _shr(p, sh)
    rem = p & (_shl(_u32(1), sh) - np.uint32(1))
    half = _shl(_u32(1), sh - 1)
    r = r + ((rem > half) | ((rem == half) & ((r & np.uint32(1)) == 1))).astype(jnp.uint32)
    r = jnp.where(sh <= 0, _shl(p, -sh), jnp.where(sh > 32, np.uint32(0), r))
    bits = ((lsb + 149).astype(jnp.uint32) << 23) + r  # a carry into the exponent is right
    return jnp.where(e > 127, _INF, jnp.minimum(bits, _INF))


def _unit_block(fmt: ElementFormat) -> _Block:
    """Block quantities of the unscaled grid of ``fmt`` (e = 0)."""
    s0 = fmt.emin - fmt.mantissa_bits
    return _Block(e=np.int32(0), nan=np.bool_(False), sat=np.uint32(_max_normal_bits(fmt, 0)),
                  v=np.int32(s0 + 150), step=np.uint32(_pow2_bits(s0)), half=np.uint32(_pow2_bits(s0 - 1)))


_E4M3 = _formats.get("fp8_e4m3")
_E2M1 = _formats.get("fp4_e2m1")
_E4M3_MAX_BITS = np.uint32(_max_normal_bits(_E4M3, 0))
_E2M1_MAX_BITS = np.uint32(_max_normal_bits(_E2M1, 0))


class _NV(NamedTuple):
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


def _f32(bits):
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def _b32(x):
    return jax.lax.bitcast_convert_type(x, jnp.uint32)


def _quantize_nvfp4_view(xv, spec: MXSpec, lay: _Layout, rb) -> _NV:
    """NVFP4 (module docstring) on a view; rb: random bits on the view, or None.

    With amax = 2**k * A', A' in [1, 2): S' = 2688 / A' in (1344, 2688],
    G' = 1 / S' in [2**-11.4, 2**-10.4), the multiplier S' / 6 in (224, 448];
    the block maxima scaled by 2**-k are below 2, so d < 896, s in
    {0} u [2**-9, 448], s * G' in [2**-20.4, 1/3], enc' = 1 / (s * G') in
    [3, 2**20.4] and v below 2**21.4: all normal. A scaled |x| below 2**-126
    reads as 0: then v < 2**-105, which rounds to 0 in every mode.
    """
    bits = jax.lax.bitcast_convert_type(xv, jnp.uint32)
    a = bits & _ABS
    amax = jnp.max(a)
    nan, zero = amax >= _INF, amax == 0
    k = jnp.where(nan | zero, 0, _exponent_fraction(amax)[0])
    a_norm = _f32(jnp.where(nan | zero, _ONE, _scale_pow2(amax, -k)))
    barrier = jax.lax.optimization_barrier
    s_enc = barrier(_NV_ENC / a_norm)
    g = barrier(np.float32(1) / s_enc)
    mult = barrier(s_enc * _C6)

    bmax = _f32(_scale_pow2(jnp.max(a, axis=lay.red, keepdims=True), -k))
    d = barrier(bmax * mult)
    s = _round_bits(jnp.minimum(_b32(d), _E4M3_MAX_BITS), _unit_block(_E4M3), _E4M3, "even", None)
    sg = barrier(_f32(s) * g)
    enc = barrier(jnp.where(s == 0, np.float32(0), np.float32(1) / sg))

    v = _b32(_f32(_scale_pow2(a, -k)) * enc)
    code = _round_bits(jnp.minimum(v, _E2M1_MAX_BITS), _unit_block(_E2M1), _E2M1, spec.rounding, rb)

    # out = fl((q * s) * G): q * s is exact with at most 6 significant bits
    qs = _b32(_f32(code) * _f32(s))
    g_bits = _b32(g)
    p = (((qs & _MANT) | _HIDDEN) >> 18) * ((g_bits & _MANT) | _HIDDEN)  # < 2**30
    exp2 = ((qs >> 23).astype(jnp.int32) - 127 - 5) + ((g_bits >> 23).astype(jnp.int32) - 127 - 23) + k
    out = jnp.where(qs == 0, np.uint32(0), _round_to_f32(p, exp2))
    q = jnp.where(nan, _QNAN, out | (bits & _SIGN))
    return _NV(q=q, a=a, v=v, code=code, s=s, nan=nan, zero=zero, k=k, g=g_bits)


def _nv_scale_exponent(nv: _NV):
    """floor(log2(s * G)) per block, exactly (int32), with the markers."""
    s, g = nv.s, nv.g
    carry = ((((s & _MANT) | _HIDDEN) >> 20) * ((g & _MANT) | _HIDDEN)) >= np.uint32(1 << 27)
    e = ((s >> 23).astype(jnp.int32) - 127) + ((g >> 23).astype(jnp.int32) - 127) + nv.k + carry.astype(jnp.int32)
    e = jnp.where(s == 0, ZERO_SCALE_EXP, e)
    return jnp.where(nv.nan, NAN_SCALE_EXP, e)


def _nv_global_scale(nv: _NV):
    """G as a float32 scalar (1.0 for an all-zero array, NaN for a NaN one)."""
    g = _round_to_f32((nv.g & _MANT) | _HIDDEN, (nv.g >> 23).astype(jnp.int32) - 127 - 23 + nv.k)
    g = jnp.where(nv.zero, _ONE, g)
    return _f32(jnp.where(nv.nan, _QNAN, g))


# ----------------------------------------------------------------------------
# entry points


def _prepare(x, spec: MXSpec, axis, key):
    if not isinstance(spec, MXSpec):
        raise ValueError(f"spec must be an MXSpec, got {type(spec).__name__}")
    x = jnp.asarray(x)
    if not (jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer)):
        raise ValueError(f"quantize needs a real array, got dtype {x.dtype}")
    x = x.astype(jnp.float32)
    if x.ndim == 0:
        raise ValueError("quantize needs an array of rank >= 1, got a scalar")
    if spec.block_dims == 2 and x.ndim < 2:
        raise ValueError(f"block_dims=2 tiles the last two axes and needs an array of rank >= 2, got shape "
                         f"{tuple(x.shape)}; use block_dims=1 for vectors")
    ax = _normalize_axis(axis, x.ndim)
    if spec.rounding == "stochastic" and key is None:
        raise ValueError("rounding='stochastic' needs a PRNG key: quantize(x, spec, key=jax.random.key(0))")
    return x, ax


def _random_bits(key, shape):
    """The 32 random bits per element that stochastic rounding consumes."""
    return jax.random.bits(key, shape, jnp.uint32)


def _is_fast_path(spec: MXSpec) -> bool:
    return spec.block_dims == 1 and spec.scale_format == "e8m0"


def _quantize_view(x, spec: MXSpec, axis: int, rbits):
    """Every path but the 1-D E8M0 one: (layout, q bits on the view, details)."""
    lay = _layout(spec, axis)
    rb = None if rbits is None else lay.view(rbits)
    if spec.scale_format == "e4m3":
        nv = _quantize_nvfp4_view(lay.view(x), spec, lay, rb)
        return lay, nv.q, nv
    q, a, blk = _quantize_e8m0_view(lay.view(x), spec, lay, rb)
    return lay, q, (a, blk)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def _quantize_ste(x, spec, axis, rbits):
    if not _is_fast_path(spec):
        lay, q, _ = _quantize_view(x, spec, axis, rbits)
        return lay.unview(jax.lax.bitcast_convert_type(q, jnp.float32), x.shape)
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
    """Fake-quantize ``x`` onto the grid of ``spec`` (see the module docstring).

    Args:
      x: real array of any rank >= 1 (cast to float32); rank >= 2 for
        ``block_dims=2``.
      spec: :class:`MXSpec`.
      axis: the block axis (the contraction axis of the GEMM it feeds). Ignored
        with ``block_dims=2`` (tiles over the last two axes), but still checked.
      key: PRNG key, required for ``rounding="stochastic"``; the random bits
        are ``jax.random.bits(key, x.shape, uint32)``, one word per element.

    Returns:
      float32 array of ``x``'s shape: each value exactly representable as
      element * 2**e (E8M0), or ``fl((element * s) * G)`` (E4M3, NVFP4).
      Differentiable as the identity (straight-through).
    """
    x, ax = _prepare(x, spec, axis, key)
    rbits = _random_bits(key, x.shape) if spec.rounding == "stochastic" else None
    return _quantize_ste(x, spec, ax, rbits)


def _pow2_f32(e):
    """float32 2**e for int32 e in [-127, 127] (2**-127 is subnormal), exactly."""
    bits = jnp.where(e >= -126, (e + 127).astype(jnp.uint32) << 23, _shl(_u32(1), e + 149))
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


@functools.partial(jax.jit, static_argnames=("spec", "axis"))
def quantize_stats(x, spec: MXSpec, axis: int = -1, key=None) -> QuantStats:
    """The overflow diagnostics of ``quantize(x, spec, axis, key)``.

    Uses the same code path as :func:`quantize`, so the counts agree with
    what it did. See :class:`QuantStats` (for E4M3 scales: clamped means
    ``v > 6``, last bin ``q == 6``, flushed includes zero-scale blocks).
    """
    x, ax = _prepare(x, spec, axis, key)
    rbits = _random_bits(key, x.shape) if spec.rounding == "stochastic" else None
    n = max(int(np.prod(x.shape)), 1)

    if spec.scale_format == "e4m3":
        lay, _, nv = _quantize_view(x, spec, ax, rbits)
        valid = lay.view(jnp.ones(x.shape, bool))
        live = valid & ~nv.nan

        def frac(mask):
            return jnp.sum(mask, dtype=jnp.float32) / n

        return QuantStats(
            clamped_frac=frac(live & (nv.v > _E2M1_MAX_BITS)),
            last_bin_frac=frac(live & (nv.code == _E2M1_MAX_BITS)),
            flushed_frac=frac(live & (nv.a != 0) & (nv.code == 0)),
            nan_frac=frac(valid & nv.nan),
            scale_exponent=lay.squeeze(_nv_scale_exponent(nv)),
            block_scale=lay.squeeze(jnp.where(nv.nan, jnp.float32(jnp.nan), _f32(nv.s))),
            global_scale=_nv_global_scale(nv),
        )

    if _is_fast_path(spec):
        xp, _ = _pad_blocks(x, ax, spec.block_size)
        rbp = _pad_blocks(rbits, ax, spec.block_size)[0] if rbits is not None else None
        q, a, blk = _quantize_blocks(xp, spec, ax, rbp)
        valid = _block_view(jnp.ones(x.shape, bool), ax, spec.block_size)[0]
        squeeze = functools.partial(jnp.squeeze, axis=ax + 1)
    else:
        lay, q, (a, blk) = _quantize_view(x, spec, ax, rbits)
        valid = lay.view(jnp.ones(x.shape, bool))
        squeeze = lay.squeeze
    e, nan_block, sat = blk.e, blk.nan, blk.sat
    finite = valid & ~nan_block
    qa = q & _ABS

    def frac(mask):
        return jnp.sum(mask & valid, dtype=jnp.float32) / n

    e_out = squeeze(jnp.where(nan_block, NAN_SCALE_EXP, e))
    return QuantStats(
        clamped_frac=frac(finite & (a > sat)),
        last_bin_frac=frac(finite & (qa == sat) & (sat != _INF)),  # Inf is 2**128, not the top code
        flushed_frac=frac(finite & (a != 0) & (qa == 0)),
        nan_frac=frac(valid & nan_block),
        scale_exponent=e_out,
        block_scale=jnp.where(e_out == NAN_SCALE_EXP, jnp.float32(jnp.nan), _pow2_f32(jnp.minimum(e_out, 127))),
        global_scale=jnp.float32(1.0),
    )
