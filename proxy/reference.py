"""Exact, slow numpy reference of MX quantization, written to read like the spec.

Everything here is float64 numpy, vectorized over blocks but otherwise a
direct transcription of the semantics in :mod:`proxy.quantize` (OCP MX v1.0
and the reference library):

1. split the block axis into blocks of ``block_size`` (zero-padding the last);
2. amax = max |x| per block; a NaN or Inf makes the whole block NaN;
3. ``e = floor(log2 amax) - emax`` (from ``np.frexp``), raised by one under
   ``"rceil"`` when ``amax / 2**e > max_normal``; clamped below at -127 (an
   all-zero block gets 2**-127); above 127 the scale, hence the block, is NaN;
4. ``v = |x| / 2**e``, saturated to ``max_normal``, rounded to the element
   grid (``"even"``, ``"away"`` or ``"stochastic"`` with the caller's random
   bits), then multiplied back by ``2**e`` with x's sign and cast to float32.

Float32 is exact for every result but one: under ``"rceil"`` a block whose
amax lies within half a grid step of 2**128 can round to the grid point
2**128, which float32 can only write as Inf.

It is meant for tests: it never calls :mod:`proxy.quantize`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from proxy import formats as _formats

__all__ = [
    "ReferenceStats",
    "reference_quantize",
    "reference_stats",
    "reference_scale_exponent",
    "round_to_element",
]

SCALE_EXP_MIN, SCALE_EXP_MAX = -127, 127  # E8M0 range
NAN_SCALE_EXP = 128  # marks a NaN scale in the statistics


class ReferenceStats(NamedTuple):
    """The overflow diagnostics, computed independently (see ``QuantStats``).

    Fractions are float64 over the real (unpadded) elements; ``scale_exponent``
    is int32 shaped like x with the block axis replaced by its block count,
    128 for NaN scales.
    """

    clamped_frac: float
    last_bin_frac: float
    flushed_frac: float
    nan_frac: float
    scale_exponent: np.ndarray


class _Blocks(NamedTuple):
    """One quantization worked through, every array shaped (..., blocks, block_size)."""

    x: np.ndarray  # float64 input (padding is zero)
    valid: np.ndarray  # bool, False on padding
    e: np.ndarray  # int64 scale exponent, shape (..., blocks, 1)
    nan_block: np.ndarray  # bool, shape (..., blocks, 1)
    scaled: np.ndarray  # |x| / 2**e before saturation
    element: np.ndarray  # rounded element magnitude (after saturation)


def _to_blocks(a: np.ndarray, axis: int, block_size: int) -> np.ndarray:
    """Move ``axis`` last, zero-pad it to whole blocks, split it into (blocks, block_size)."""
    a = np.moveaxis(a, axis, -1)
    n = a.shape[-1]
    nb = -(-n // block_size)
    pad = [(0, 0)] * (a.ndim - 1) + [(0, nb * block_size - n)]
    return np.pad(a, pad).reshape(a.shape[:-1] + (nb, block_size))


def _from_blocks(b: np.ndarray, axis: int, n: int) -> np.ndarray:
    """Inverse of :func:`_to_blocks`: merge the blocks, cut to length ``n``, move the axis back."""
    a = b.reshape(b.shape[:-2] + (-1,))[..., :n]
    return np.moveaxis(a, -1, axis)


def _floor_log2(a: np.ndarray) -> np.ndarray:
    """floor(log2 a) for finite a > 0 (int64); -1000 stands in for zero."""
    _, exp = np.frexp(a)  # a = mant * 2**exp, mant in [0.5, 1)
    return np.where(a > 0, exp.astype(np.int64) - 1, -1000)


def _block_exponent(amax: np.ndarray, spec) -> tuple[np.ndarray, np.ndarray]:
    """Scale exponent e and NaN flag per block, from float64 amax."""
    fmt = spec.element
    finite = np.isfinite(amax)
    amax = np.where(finite, amax, 0.0)
    e = np.maximum(_floor_log2(amax) - fmt.emax, SCALE_EXP_MIN)
    if spec.scale_rule == "rceil":
        e = e + (amax / np.ldexp(1.0, e) > fmt.max_normal)
    return e, ~finite | (e > SCALE_EXP_MAX)


def round_to_element(v, fmt, rounding: str, rbits=None, *, use_cast: bool = True) -> np.ndarray:
    """Round scaled magnitudes ``v`` (float64, 0 <= v <= max_normal) to the
    element grid of ``fmt``; returns float64 magnitudes on that grid.

    ``rbits`` (uint32, v's shape) drives ``"stochastic"``: round up iff
    ``frac + r / 2**32 >= 1``, frac the fractional part of v in grid steps.
    With ``use_cast`` (float formats, ``"even"`` only) the rounding is an
    ml_dtypes cast; otherwise it is arithmetic on the grid step.
    """
    fmt = _formats.get(fmt)
    v = np.asarray(v, np.float64)
    if rounding == "even" and use_cast and not fmt.is_integer:
        return v.astype(fmt.dtype).astype(np.float64)
    if fmt.is_integer:
        step = np.full_like(v, fmt.eps)  # fixed point: one step everywhere
    else:  # the step of v's binade; below the normal range the subnormal step
        binade = np.maximum(_floor_log2(v), fmt.emin)
        step = np.ldexp(1.0, binade - fmt.mantissa_bits)
    k = v / step  # exact: step is a power of two
    lo = np.floor(k)
    frac = k - lo  # exact
    if rounding == "even":
        up = (frac > 0.5) | ((frac == 0.5) & (lo % 2 == 1))
    elif rounding == "away":
        up = frac >= 0.5
    elif rounding == "stochastic":
        if rbits is None:
            raise ValueError("stochastic rounding needs rbits")
        r = np.asarray(rbits, np.uint32).astype(np.float64) / 2.0**32
        up = frac >= 1.0 - r  # both sides exact in float64
    else:
        raise ValueError(f"unknown rounding {rounding!r}")
    return (lo + up) * step


def _work(x, spec, axis: int, rbits, use_cast: bool) -> tuple[_Blocks, int]:
    x = np.asarray(x).astype(np.float32)
    n = x.shape[axis]
    xb = _to_blocks(x.astype(np.float64), axis, spec.block_size)
    valid = _to_blocks(np.ones(x.shape, bool), axis, spec.block_size)
    ax = np.abs(xb)
    amax = np.max(ax, axis=-1, keepdims=True)  # NaN propagates
    e, nan_block = _block_exponent(amax, spec)
    e = np.where(nan_block, 0, e)
    scaled = ax / np.ldexp(1.0, e)
    scaled = np.where(nan_block, 0.0, scaled)
    rb = None
    if spec.rounding == "stochastic":
        if rbits is None:
            raise ValueError("rounding='stochastic' needs rbits (uint32, x's shape)")
        rbits = np.asarray(rbits, np.uint32)
        if rbits.shape != x.shape:
            raise ValueError(f"rbits shape {rbits.shape} != x shape {x.shape}")
        rb = _to_blocks(rbits, axis, spec.block_size)
    element = round_to_element(
        np.minimum(scaled, spec.element.max_normal), spec.element, spec.rounding, rb, use_cast=use_cast
    )
    return _Blocks(xb, valid, e, nan_block, scaled, element), n


def reference_quantize(x, spec, axis: int = -1, rbits=None, *, use_cast: bool = True) -> np.ndarray:
    """MX fake-quantization of ``x`` (any rank, float32 result, x's shape).

    Args:
      x: real array; cast to float32 first, like the fast path.
      spec: a :class:`proxy.MXSpec`.
      axis: the block axis.
      rbits: uint32 random bits of x's shape (``jax.random.bits(key,
        x.shape, jnp.uint32)``), required for ``"stochastic"``.
      use_cast: round ``"even"`` float formats with an ml_dtypes cast (True)
        or arithmetically (False); both must agree.

    NaN blocks are the canonical quiet NaN (bits 0x7FC00000); a value that
    rounds to zero keeps x's sign.
    """
    b, n = _work(x, spec, axis, rbits, use_cast)
    q = np.copysign(np.ldexp(b.element, b.e), b.x)
    q = np.where(b.nan_block, np.nan, q)
    with np.errstate(over="ignore"):  # the rceil 2**128 corner, see module docstring
        q = q.astype(np.float32)
    return _from_blocks(q, axis, n)


def reference_scale_exponent(x, spec, axis: int = -1) -> np.ndarray:
    """Per-block scale exponents (int32), block axis at ``axis``; 128 = NaN scale."""
    b, _ = _work(x, spec.replace(rounding="even"), axis, None, True)
    e = np.where(b.nan_block, NAN_SCALE_EXP, b.e)[..., 0]
    return np.moveaxis(e, -1, axis).astype(np.int32)


def reference_stats(x, spec, axis: int = -1, rbits=None) -> ReferenceStats:
    """Clamped / last-bin / flushed / NaN fractions and scale exponents of
    ``reference_quantize(x, spec, axis, rbits)``."""
    b, _ = _work(x, spec, axis, rbits, True)
    total = max(int(np.size(x)), 1)
    live = b.valid & ~b.nan_block

    def frac(mask):
        return float(np.sum(mask & b.valid)) / total

    return ReferenceStats(
        clamped_frac=frac(live & (b.scaled > spec.element.max_normal)),
        last_bin_frac=frac(live & (b.element == spec.element.max_normal)),
        flushed_frac=frac(live & (b.x != 0) & (b.element == 0)),
        nan_frac=frac(b.nan_block),
        scale_exponent=reference_scale_exponent(x, spec, axis),
    )
