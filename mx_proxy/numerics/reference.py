"""Exact, slow numpy reference of MX quantization, written to read like the spec.

Everything here is float64 numpy, vectorized over blocks but otherwise a
direct transcription of the semantics in :mod:`mx_proxy.numerics.quantize` (OCP MX v1.0
and the reference library):

1. split the block axis into blocks of ``block_size`` (zero-padding the last);
2. amax = max |x| per block; a NaN or Inf makes the whole block NaN;
3. ``e = floor(log2 amax) - emax`` (from ``np.frexp``), raised by one under
   ``"rceil"`` when ``amax / 2**e > max_normal``, under ``"ceil"`` when amax
   is not a power of two, under ``"even"`` when amax rounded half up to the
   element's mantissa bits reaches the next power of two (the last two as
   torchao defines them on float32 amax, a float32 subnormal amax counting in
   the binade of 2**-127); clamped below at -127 (an all-zero block gets
   2**-127); above 127 the scale, hence the block, is NaN (and under
   ``"even"`` where the rounded amax reaches 2**128);
4. ``v = |x| / 2**e``, saturated to ``max_normal``, rounded to the element
   grid (``"even"``, ``"away"`` or ``"stochastic"`` with the caller's random
   bits), then multiplied back by ``2**e`` with x's sign and cast to float32.

Float32 is exact for every result but one: under ``"rceil"`` a block whose
amax lies within half a grid step of 2**128 can round to the grid point
2**128, which float32 can only write as Inf.

2-D tiles (``block_dims=2``): the blocks are the ``block_size x block_size``
tiles of the last two axes (both zero-padded), flattened; the rest is the same.

NVFP4 (``scale_format="e4m3"``) follows the recipe of the :mod:`mx_proxy.numerics.quantize`
docstring literally, in float64 on the unscaled values: each float32
operation fl(a op b) is computed in float64 and then rounded to a 24-bit
significand with an unbounded exponent (:func:`round24`). For +, *, / that is
the correctly rounded float32 result (float64 has 53 >= 2 * 24 + 2 bits, so
the double rounding is innocuous) without float32's exponent limits, which
is the specified semantics. The final ``(q * s) * G`` is exact in float64
(at most 6 + 24 significant bits) and rounded once by the cast to float32.

It is meant for tests: it never calls :mod:`mx_proxy.numerics.quantize`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from mx_proxy.numerics import formats as _formats

__all__ = [
    "ReferenceStats",
    "reference_quantize",
    "reference_stats",
    "reference_scale_exponent",
    "round_to_element",
    "round24",
]

SCALE_EXP_MIN, SCALE_EXP_MAX = -127, 127  # E8M0 range
NAN_SCALE_EXP = 128  # marks a NaN scale in the statistics
ZERO_SCALE_EXP = -256  # marks a zero E4M3 block scale in the statistics


class ReferenceStats(NamedTuple):
    """The overflow diagnostics, computed independently (see ``QuantStats``).

    Fractions are float64 over the real (unpadded) elements; ``scale_exponent``
    is int32 shaped like x with the block axis replaced by its block count
    (2-D tiles: the last two axes by their tile counts), 128 for NaN scales;
    for E4M3 scales floor(log2(s * G)), -256 for a zero scale. ``block_scale``
    (float32, same shape) is 2**e or s; ``global_scale`` is 1.0 or G.
    """

    clamped_frac: float
    last_bin_frac: float
    flushed_frac: float
    nan_frac: float
    scale_exponent: np.ndarray
    block_scale: np.ndarray | None = None
    global_scale: float | None = None


class _Blocks(NamedTuple):
    """One quantization worked through, every array shaped (..., blocks, block
    elements) (2-D tiles: (..., row tiles, column tiles, block_size**2))."""

    x: np.ndarray  # float64 input (padding is zero)
    valid: np.ndarray  # bool, False on padding
    e: np.ndarray  # int64 scale exponent, shape (..., blocks, 1); E4M3: 0
    nan_block: np.ndarray  # bool, shape (..., blocks, 1)
    scaled: np.ndarray  # |x| / 2**e (E4M3: fl(|x| * enc)) before saturation
    element: np.ndarray  # rounded element magnitude (after saturation)
    scale: np.ndarray | None = None  # E4M3: the block scale s, shape (..., blocks, 1)
    global_scale: float | None = None  # E4M3: G (float64 holding a 24-bit value)


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


def _to_tiles(a: np.ndarray, bs: int) -> np.ndarray:
    """Zero-pad the last two axes to whole ``bs x bs`` tiles and flatten each
    tile: (..., R, C) -> (..., R/bs, C/bs, bs * bs)."""
    r, c = a.shape[-2:]
    rt, ct = -(-r // bs), -(-c // bs)
    pad = [(0, 0)] * (a.ndim - 2) + [(0, rt * bs - r), (0, ct * bs - c)]
    a = np.pad(a, pad).reshape(a.shape[:-2] + (rt, bs, ct, bs))
    return np.swapaxes(a, -3, -2).reshape(a.shape[:-4] + (rt, ct, bs * bs))


def _from_tiles(b: np.ndarray, bs: int, shape) -> np.ndarray:
    """Inverse of :func:`_to_tiles` for an array of the original ``shape``."""
    rt, ct = b.shape[-3:-1]
    a = np.swapaxes(b.reshape(b.shape[:-3] + (rt, ct, bs, bs)), -3, -2)
    a = a.reshape(b.shape[:-3] + (rt * bs, ct * bs))
    return a[..., : shape[-2], : shape[-1]]


def _blocks_of(a, spec, axis):
    if spec.block_dims == 2:
        if np.ndim(a) < 2:
            raise ValueError(f"block_dims=2 needs rank >= 2, got shape {np.shape(a)}")
        return _to_tiles(a, spec.block_size)
    return _to_blocks(a, axis, spec.block_size)


def _unblocks(b, spec, axis, shape):
    if spec.block_dims == 2:
        return _from_tiles(b, spec.block_size, shape)
    return _from_blocks(b, axis, shape[axis])


def round24(v) -> np.ndarray:
    """Round float64 ``v`` to a 24-bit significand (float32's precision),
    nearest even, with an unbounded exponent (no overflow, no subnormals)."""
    v = np.asarray(v, np.float64)
    mant, exp = np.frexp(v)  # v = mant * 2**exp, |mant| in [0.5, 1)
    return np.ldexp(np.rint(np.ldexp(mant, 24)), exp - 24)  # np.rint: ties to even


def _floor_log2(a: np.ndarray) -> np.ndarray:
    """floor(log2 a) for finite a > 0 (int64); -1000 stands in for zero."""
    _, exp = np.frexp(a)  # a = mant * 2**exp, mant in [0.5, 1)
    return np.where(a > 0, exp.astype(np.int64) - 1, -1000)


_TINY = 2.0 ** -126  # the smallest float32 normal


def _not_pow2(amax, fl, fmt):
    """``"ceil"``: amax is not a power of two (a float32 subnormal amax never counts as one, as in torchao)."""
    return np.where(amax >= _TINY, amax != np.ldexp(1.0, fl), amax > 0)


def _rounds_up(amax, fl, fmt):
    """``"even"``: amax rounded half up to ``fmt.mantissa_bits`` reaches the next
    power of two: amax >= (2 - 2**-(m+1)) * 2**fl, or for a float32 subnormal
    amax (the binade below 2**-126) amax >= (1 - 2**-(m+1)) * 2**-126."""
    m = fmt.mantissa_bits
    normal = amax >= np.ldexp(2.0 - 2.0 ** -(m + 1), fl)
    return np.where(amax >= _TINY, normal, amax >= _TINY * (1.0 - 2.0 ** -(m + 1)))


def _above_max_normal(amax, fl, fmt):
    """``"rceil"``: the floor scale would saturate amax (``amax / 2**e > max_normal``, e clamped)."""
    e = np.maximum(fl - fmt.emax, SCALE_EXP_MIN)
    return amax / np.ldexp(1.0, e) > fmt.max_normal


# rule -> (where e is one above the floor exponent, whether that is a carry of amax's rounding: Inf past 2**127)
_BUMPS = {"floor": (None, False), "rceil": (_above_max_normal, False), "ceil": (_not_pow2, False),
          "even": (_rounds_up, True)}


def _block_exponent(amax: np.ndarray, spec) -> tuple[np.ndarray, np.ndarray]:
    """Scale exponent e and NaN flag per block, from float64 amax."""
    fmt = spec.element
    if spec.scale_rule.name not in _BUMPS:  # its own written-out definitions, by name (not the registry's)
        raise ValueError(f"the float64 reference defines the scale rules {', '.join(_BUMPS)}, not "
                         f"{spec.scale_rule.name!r} (check a new rule against its own written-out definition)")
    finite = np.isfinite(amax)
    amax = np.where(finite, amax, 0.0)
    fl = _floor_log2(amax)
    bump, carries = _BUMPS[spec.scale_rule.name]
    up = np.zeros(np.shape(amax), bool) if bump is None else bump(amax, fl, fmt)
    # (a float32 subnormal amax counts as 2**-127 here, as in the bit layout; the clamp hides it but for emax 0)
    e = np.maximum(np.maximum(fl, -127) + up - fmt.emax, SCALE_EXP_MIN)
    return e, ~finite | (e > SCALE_EXP_MAX) | (carries & up & (fl == 127))


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


def _rbits_blocks(x, spec, axis, rbits):
    if spec.rounding != "stochastic":
        return None
    if rbits is None:
        raise ValueError("rounding='stochastic' needs rbits (uint32, x's shape)")
    rbits = np.asarray(rbits, np.uint32)
    if rbits.shape != x.shape:
        raise ValueError(f"rbits shape {rbits.shape} != x shape {x.shape}")
    return _blocks_of(rbits, spec, axis)


def _work(x, spec, axis: int, rbits, use_cast: bool) -> _Blocks:
    x = np.asarray(x).astype(np.float32)
    if spec.scale_format == "e4m3":
        return _work_nvfp4(x, spec, axis, rbits, use_cast)
    xb = _blocks_of(x.astype(np.float64), spec, axis)
    valid = _blocks_of(np.ones(x.shape, bool), spec, axis)
    ax = np.abs(xb)
    amax = np.max(ax, axis=-1, keepdims=True)  # NaN propagates
    e, nan_block = _block_exponent(amax, spec)
    e = np.where(nan_block, 0, e)
    scaled = ax / np.ldexp(1.0, e)
    scaled = np.where(nan_block, 0.0, scaled)
    rb = _rbits_blocks(x, spec, axis, rbits)
    element = round_to_element(
        np.minimum(scaled, spec.element.max_normal), spec.element, spec.rounding, rb, use_cast=use_cast
    )
    return _Blocks(xb, valid, e, nan_block, scaled, element)


E4M3_MAX, E2M1_MAX = 448.0, 6.0


def _work_nvfp4(x, spec, axis: int, rbits, use_cast: bool) -> _Blocks:
    """NVFP4, the recipe of the :mod:`mx_proxy.numerics.quantize` docstring step by step."""
    xb = _blocks_of(x.astype(np.float64), spec, axis)
    valid = _blocks_of(np.ones(x.shape, bool), spec, axis)
    ax = np.abs(xb)
    amax = float(np.max(np.abs(x.astype(np.float64)))) if x.size else 0.0
    nan = not np.isfinite(amax)
    zero_blocks = np.zeros(ax.shape[:-1] + (1,))
    if nan or amax == 0.0:  # the whole array is NaN, or zeros (x's sign, below)
        flag = np.full(zero_blocks.shape, nan)
        return _Blocks(xb, valid, zero_blocks.astype(np.int64), flag, np.zeros_like(ax), np.zeros_like(ax),
                       zero_blocks, np.nan if nan else 1.0)
    s_enc = round24(E4M3_MAX * E2M1_MAX / amax)  # global encode scale
    g = round24(1.0 / s_enc)  # global decode scale
    mult = round24(s_enc * round24(1.0 / E2M1_MAX))
    d = round24(np.max(ax, axis=-1, keepdims=True) * mult)
    s = round_to_element(np.minimum(d, E4M3_MAX), "fp8_e4m3", "even", use_cast=False)
    with np.errstate(divide="ignore"):
        enc = np.where(s > 0, round24(1.0 / round24(s * g)), 0.0)
    scaled = round24(ax * enc)
    rb = _rbits_blocks(x, spec, axis, rbits)
    element = round_to_element(np.minimum(scaled, E2M1_MAX), spec.element, spec.rounding, rb, use_cast=use_cast)
    return _Blocks(xb, valid, zero_blocks.astype(np.int64), np.zeros(zero_blocks.shape, bool), scaled, element,
                   s, g)


def reference_quantize(x, spec, axis: int = -1, rbits=None, *, use_cast: bool = True) -> np.ndarray:
    """MX (or NVFP4) fake-quantization of ``x`` (any rank, float32 result, x's shape).

    Args:
      x: real array; cast to float32 first, like :func:`mx_proxy.numerics.quantize.quantize`.
      spec: a :class:`mxp.MXSpec` (any block_dims and scale_format).
      axis: the block axis (ignored for ``block_dims=2``: tiles of the last two axes).
      rbits: uint32 random bits of x's shape (``jax.random.bits(key,
        x.shape, jnp.uint32)``), required for ``"stochastic"``.
      use_cast: round ``"even"`` float formats with an ml_dtypes cast (True)
        or arithmetically (False); both must agree.

    NaN blocks (NVFP4: the whole array, if it holds a NaN or Inf) are the
    canonical quiet NaN (bits 0x7FC00000); a value that rounds to zero keeps
    x's sign.
    """
    b = _work(x, spec, axis, rbits, use_cast)
    if spec.scale_format == "e4m3":
        # (q * s) * G, exact in float64 (at most 6 + 24 significant bits), rounded once below
        mag = b.element * b.scale * b.global_scale if np.isfinite(b.global_scale) else 0.0
        q = np.copysign(mag, b.x)
    else:
        q = np.copysign(np.ldexp(b.element, b.e), b.x)
    q = np.where(b.nan_block, np.nan, q)
    with np.errstate(over="ignore"):  # the rceil 2**128 corner, see module docstring
        q = q.astype(np.float32)
    return _unblocks(q, spec, axis, np.shape(x))


def _scale_exponents(b: _Blocks, spec) -> np.ndarray:
    """Per-block exponent (int32, blocks axis last) of :class:`ReferenceStats`."""
    if spec.scale_format == "e4m3":
        sg = b.scale * (b.global_scale if np.isfinite(b.global_scale) else 0.0)  # exact
        e = np.where(sg > 0, _floor_log2(np.where(sg > 0, sg, 1.0)), ZERO_SCALE_EXP)
    else:
        e = b.e
    return np.where(b.nan_block, NAN_SCALE_EXP, e)[..., 0].astype(np.int32)


def _place_blocks(e, spec, axis):
    """A per-block array from the block layout to its place in x (1-D: the
    block axis back at ``axis``; 2-D tiles: already (..., row tiles, column tiles))."""
    return e if spec.block_dims == 2 else np.moveaxis(e, -1, axis)


def reference_scale_exponent(x, spec, axis: int = -1) -> np.ndarray:
    """Per-block scale exponents (int32), block axis at ``axis`` (2-D tiles:
    shape (..., row tiles, column tiles)); 128 = NaN scale. For E4M3 scales
    floor(log2(s * G)), -256 for a zero scale."""
    b = _work(x, spec.replace(rounding="even"), axis, None, True)
    return _place_blocks(_scale_exponents(b, spec), spec, axis)


def reference_stats(x, spec, axis: int = -1, rbits=None) -> ReferenceStats:
    """Clamped / last-bin / flushed / NaN fractions and scale exponents of
    ``reference_quantize(x, spec, axis, rbits)``."""
    b = _work(x, spec, axis, rbits, True)
    total = max(int(np.size(x)), 1)
    live = b.valid & ~b.nan_block
    top = E2M1_MAX if spec.scale_format == "e4m3" else spec.element.max_normal

    def frac(mask):
        return float(np.sum(mask & b.valid)) / total

    if spec.scale_format == "e4m3":
        block_scale = np.where(b.nan_block, np.nan, b.scale)[..., 0].astype(np.float32)
        global_scale = float(np.float32(b.global_scale))
    else:
        block_scale = np.where(b.nan_block, np.nan, np.ldexp(1.0, b.e))[..., 0].astype(np.float32)
        global_scale = 1.0
    return ReferenceStats(
        clamped_frac=frac(live & (b.scaled > top)),
        last_bin_frac=frac(live & (b.element == top)),
        flushed_frac=frac(live & (b.x != 0) & (b.element == 0)),
        nan_frac=frac(b.nan_block),
        scale_exponent=_place_blocks(_scale_exponents(b, spec), spec, axis),
        block_scale=_place_blocks(block_scale, spec, axis),
        global_scale=global_scale,
    )
