"""MX block quantization: the OCP Microscaling grid, emulated exactly.

``quantize(x, spec, axis)`` returns float32 values on the MX grid: blocks of
``spec.block_size`` consecutive elements along ``axis`` share one power-of-two
scale 2**e (stored in hardware as E8M0), and each element is rounded to the
element format after division by that scale.

This module holds the entry points (:func:`quantize`, :func:`quantize_stats`)
and what they report (:class:`QuantStats`); the spec they take,
:class:`MXSpec`, is :mod:`mx_proxy.numerics.spec` (re-exported here); the how is the bit
arithmetic of :mod:`mx_proxy.numerics.mx`, written once and shared with the Pallas
kernels in ``mx_proxy/pallas/``:

* scale choice (from the block amax: the exponent per rule, saturation bounds):
  :mod:`mx_proxy.numerics.mx.block_scale`;
* element rounding and codes: :mod:`mx_proxy.numerics.mx.element`;
* 1-D blocks and 2-D tiles, and each block's amax: :mod:`mx_proxy.numerics.mx.layout`;
* NVFP4 (E4M3 block scales and a float32 tensor scale): :mod:`mx_proxy.numerics.mx.nvfp4`;
* float32 bit patterns: :mod:`mx_proxy.numerics.mx.bits`.

It works on the IEEE-754 bit patterns of float32 with integer arithmetic.
That makes it exact where float arithmetic is not: XLA on CPU flushes float32
subnormals to zero, and cannot compile casts to the FP6 types. Every step has
a float64 twin in :mod:`mx_proxy.numerics.reference`, which the tests compare bit for bit.

Semantics (OCP MX v1.0 and the MX library, microsoft/microxcaling; docs/quantization.md):

* scale rule ``"floor"``: ``e = floor(log2 amax) - emax``. With E4M3 the scaled
  block maximum lies in [256, 512) and every scaled value above 448 saturates:
  tightly clustered blocks collapse onto one code.
* scale rule ``"rceil"``: the smallest e with ``amax / 2**e <= max_normal``
  (NVIDIA Transformer Engine, cuBLAS, ``jax.nn.scaled_matmul``; the paper's
  "bump the shared exponent"). It never saturates. torchao's ``"ceil"`` and
  ``"even"`` and the authors' ``"paper_bump"`` are the other rules; each is
  one module of :mod:`mx_proxy.numerics.scale_rules`.
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
default block_size stays 32 -- or a 16x16 tile in :data:`NVFP4_2D`) has an FP8
E4M3 scale (not a power of two), and the whole array one float32 decode
scale derived from its amax, in NVIDIA Transformer Engine's order of float32
operations (the recipe, its exactness and special cases:
:mod:`mx_proxy.numerics.mx.nvfp4`). ``scale_rule`` is ``"amax"``
(:data:`~mx_proxy.numerics.spec.AMAX`, the only rule; it is the default).
Any NaN or Inf makes the WHOLE array NaN. JAX's own NVFP4 quantizer
(``jax.nn.get_scaled_dot_general_config("nvfp4", global_scale)``)
takes the global scale from the caller; as XLA compiles it, it gives the same
values when that scale is a power of two (see ``tests/numerics/test_nvfp4.py`` for
where and why the two differ otherwise).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from mx_proxy.numerics.mx import bits as B
from mx_proxy.numerics.mx import nvfp4 as _nv
from mx_proxy.numerics.mx.block_scale import (
    NAN_SCALE_EXP,
    SCALE_EXP_MAX,
    SCALE_EXP_MIN,
    Block,
    block_quantities,
    element_bump,
    per_block_quantities,
)
from mx_proxy.numerics.mx.element import ROUNDINGS, quantize_magnitudes
from mx_proxy.numerics.mx.layout import Layout, normalize_axis
from mx_proxy.numerics.mx.nvfp4 import E2M1_MAX, E4M3_MAX, ZERO_SCALE_EXP
from mx_proxy.numerics.spec import BLOCK_DIMS, E4M3_ELEMENTS, E4M3_SCALE_RULES, NVFP4, NVFP4_2D, SCALE_FORMATS, MXSpec

__all__ = ["MXSpec", "QuantStats", "quantize", "quantize_stats", "NVFP4", "NVFP4_2D",
           "E4M3_SCALE_RULES", "SCALE_FORMATS", "BLOCK_DIMS", "ROUNDINGS", "E4M3_ELEMENTS", "SCALE_EXP_MIN",
           "SCALE_EXP_MAX", "NAN_SCALE_EXP", "ZERO_SCALE_EXP", "E4M3_MAX", "E2M1_MAX"]

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
# the path, one way for every spec: layout view -> block scale -> element rounding -> back


def _word(x, spec: MXSpec) -> B.Word:
    """The words the element stage works on: bfloat16 for a bfloat16 ``x``
    under a spec that can round it there (E8M0 scales, one exponent per
    block, deterministic rounding, an element grid coarser than bf16's: the
    same values, half the bytes and twice the SIMD lanes), float32 otherwise."""
    bf16 = (x.dtype == jnp.bfloat16 and spec.scale_format == "e8m0" and not spec.rule.per_element
            and spec.rounding != "stochastic" and spec.element.mantissa_bits <= B.BF16.fraction)
    return B.BF16 if bf16 else B.F32


def _e8m0_block(xp, a, spec: MXSpec, lay: Layout, word: B.Word) -> Block:
    """E8M0 block quantities of the padded array ``xp`` (``a``: its magnitude
    bits on the view of ``lay``, in ``word``): from the block amax, through
    :func:`per_block_quantities`.

    A per-element rule (``"paper_bump"``) gives each element its own
    exponent, the block's floor exponent plus :func:`element_bump` (0 or 1),
    so its Block is per element (float32 words only).
    """
    blk = per_block_quantities(lay.block_max(word.view(xp) & word.abs_mask), spec.element, spec.scale_rule, word)
    bump = element_bump(a, lay.axis, spec.scale_rule)
    if bump is None:
        return blk
    e = blk.e + bump  # one exponent per element: the block's, bumped by its position
    return block_quantities(e, blk.nan | (e > SCALE_EXP_MAX), spec.element)


def _scale_and_round(xp, spec: MXSpec, lay: Layout, rbv):
    """Block scales and element rounding of a padded array ``xp`` (float32 or
    bfloat16 as :func:`_word` takes it, as ``lay.pad`` gives; ``rbv`` the
    random bits on the view, or None): (q bits on the view, details), the
    details being the :class:`NV` record for E4M3 scales and (|x| bits,
    :class:`Block`) for E8M0 ones; the bits are ``xp``'s width."""
    if spec.scale_format == "e4m3":
        nv = _nv.quantize_view(lay.split(xp), lay.red, spec.rounding, rbv)
        return nv.q, nv
    word = _word(xp, spec)
    bits = word.view(lay.split(xp))
    a = bits & word.abs_mask
    blk = _e8m0_block(xp, a, spec, lay, word)
    return quantize_magnitudes(bits, a, blk, spec.element, spec.rounding, rbv, word), (a, blk)


def _quantize_on_view(x, spec: MXSpec, axis: int, rbits):
    """(layout, q bits on its view, details) of ``x`` (float32, or bfloat16
    where :func:`_word` allows; ``axis`` normalized): every stage entered
    once, for every spec.

    Performance (XLA:CPU), 1-D E8M0 blocks: three loops, the amax reduction,
    the per-block quantities (a small reduction) and the element loop.
    """
    lay = Layout(spec.block_dims, axis, spec.block_size)
    rbv = None if rbits is None else lay.view(rbits)
    q, details = _scale_and_round(lay.pad(x), spec, lay, rbv)
    return lay, q, details


def _prepare(x, spec: MXSpec, axis, key, keep_bf16: bool = False):
    """``x`` as the quantizer takes it (float32; bfloat16 kept where
    ``keep_bf16`` and :func:`_word` allows) and its normalized axis, after
    the checks."""
    if not isinstance(spec, MXSpec):
        raise ValueError(f"spec must be an MXSpec, got {type(spec).__name__}")
    x = jnp.asarray(x)
    if not (jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer)):
        raise ValueError(f"quantize needs a real array, got dtype {x.dtype}")
    if not (keep_bf16 and _word(x, spec) == B.BF16):
        x = x.astype(jnp.float32)
    if x.ndim == 0:
        raise ValueError("quantize needs an array of rank >= 1, got a scalar")
    if spec.block_dims == 2 and x.ndim < 2:
        raise ValueError(f"block_dims=2 tiles the last two axes and needs an array of rank >= 2, got shape "
                         f"{tuple(x.shape)}; use block_dims=1 for vectors")
    ax = normalize_axis(axis, x.ndim)
    if spec.rounding == "stochastic" and key is None:
        raise ValueError("rounding='stochastic' needs a PRNG key: quantize(x, spec, key=jax.random.key(0))")
    return x, ax


def _random_bits(key, shape):
    """The 32 random bits per element that stochastic rounding consumes."""
    return jax.random.bits(key, shape, jnp.uint32)


# ----------------------------------------------------------------------------
# entry points


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def _quantize_ste(x, spec, axis, rbits):
    lay, q, _ = _quantize_on_view(x, spec, axis, rbits)
    return lay.unview(_word(x, spec).float(q), x.shape).astype(jnp.float32)


@_quantize_ste.defjvp
def _quantize_ste_jvp(spec, axis, primals, tangents):
    x, rbits = primals
    tx, _ = tangents
    return _quantize_ste(x, spec, axis, rbits), tx.astype(jnp.float32)  # straight-through estimator


_EXACT_INT = 2 ** 24  # every integer of at most this magnitude is a float32


def _exact_input(x):
    """``x`` ready for the float32 bit arithmetic, never silently changed
    beyond what the docstring of :func:`quantize` says: bool and integers
    become float32 exactly, or are refused (a ValueError) when some value is
    not a float32 (magnitude above 2**24) -- before JAX could wrap an int64
    into int32; floats pass (float64 rounds to float32, to nearest even)."""
    if isinstance(x, jax.core.Tracer):
        dt = np.dtype(x.dtype)
        if dt.kind in "iu" and dt.itemsize > 2:
            raise ValueError(f"quantize of a traced {dt} array: its values cannot be checked to be exact in "
                             f"float32 (|x| <= 2**24); cast it to float32 first")
        return x
    a = np.asarray(x)
    if a.dtype.kind == "b":
        return a.astype(np.float32)
    if a.dtype.kind in "iu":
        if a.size and (int(a.max()) > _EXACT_INT or int(a.min()) < -_EXACT_INT):
            big = a.flat[int(np.argmax(np.abs(a.astype(np.float64))))]
            raise ValueError(f"quantize of {a.dtype} values up to {big}: integers above 2**24 in magnitude are not "
                             f"exact in float32 (the grid's input); scale them or cast to float32 yourself")
        return a.astype(np.float32)
    if not jnp.issubdtype(a.dtype, jnp.floating):
        raise ValueError(f"quantize needs a real array, got dtype {a.dtype}")
    return x


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

    Input dtypes: float32, float16 and bfloat16 are exact; float64 rounds to
    float32 first (to nearest even); bool and integer arrays convert exactly,
    and an integer beyond 2**24 in magnitude (not a float32) is a ValueError,
    as is a traced integer array wider than 16 bits (its values cannot be
    checked). A bfloat16 ``x`` under a spec with E8M0 scales, one exponent
    per block and deterministic rounding is rounded on its 16-bit patterns:
    the same values as from ``x.astype(float32)``; where the float32 result
    is cast back to bf16 inside one ``jit`` (a bf16 GEMM operand) the casts
    fold away and the whole quantization takes ~0.65x the time of the
    float32 path on a CPU.
    """
    return _quantize_jit(_exact_input(x), spec, axis, key)


@functools.partial(jax.jit, static_argnames=("spec", "axis"))
def _quantize_jit(x, spec: MXSpec, axis: int = -1, key=None) -> jax.Array:
    x, ax = _prepare(x, spec, axis, key, keep_bf16=True)
    rbits = _random_bits(key, x.shape) if spec.rounding == "stochastic" else None
    return _quantize_ste(x, spec, ax, rbits)


def quantize_stats(x, spec: MXSpec, axis: int = -1, key=None) -> QuantStats:
    """The overflow diagnostics of ``quantize(x, spec, axis, key)``.

    Uses the same code path as :func:`quantize`, so the counts agree with
    what it did. See :class:`QuantStats` (for E4M3 scales: clamped means
    ``v > 6``, last bin ``q == 6``, flushed includes zero-scale blocks).
    Input dtypes as :func:`quantize`.
    """
    return _quantize_stats_jit(_exact_input(x), spec, axis, key)


@functools.partial(jax.jit, static_argnames=("spec", "axis"))
def _quantize_stats_jit(x, spec: MXSpec, axis: int = -1, key=None) -> QuantStats:
    x, ax = _prepare(x, spec, axis, key)
    rbits = _random_bits(key, x.shape) if spec.rounding == "stochastic" else None
    n = max(int(np.prod(x.shape)), 1)

    lay, q, details = _quantize_on_view(x, spec, ax, rbits)
    valid = lay.view(jnp.ones(x.shape, bool))

    def frac(mask):
        return jnp.sum(mask & valid, dtype=jnp.float32) / n

    if spec.scale_format == "e4m3":
        nv = details
        live = ~nv.nan
        return QuantStats(
            clamped_frac=frac(live & (nv.v > _nv.E2M1_MAX_BITS)),
            last_bin_frac=frac(live & (nv.code == _nv.E2M1_MAX_BITS)),
            flushed_frac=frac(live & (nv.a != 0) & (nv.code == 0)),
            nan_frac=frac(nv.nan),
            scale_exponent=lay.squeeze(_nv.scale_exponent(nv)),
            block_scale=lay.squeeze(jnp.where(nv.nan, jnp.float32(jnp.nan), B.f32(nv.s))),
            global_scale=_nv.global_scale(nv),
        )

    a, blk = details
    e, nan_block, sat = blk.e, blk.nan, blk.sat
    finite = ~nan_block
    qa = q & B.ABS
    if spec.rule.per_element:  # report the block's own (floor) exponent
        e, nan_block = jnp.min(e, axis=lay.red, keepdims=True), jnp.all(nan_block, axis=lay.red, keepdims=True)
    e_out = lay.squeeze(jnp.where(nan_block, NAN_SCALE_EXP, e))
    return QuantStats(
        clamped_frac=frac(finite & (a > sat)),
        last_bin_frac=frac(finite & (qa == sat) & (sat != B.INF)),  # Inf is 2**128, not the top code
        flushed_frac=frac(finite & (a != 0) & (qa == 0)),
        nan_frac=frac(nan_block),
        scale_exponent=e_out,
        block_scale=jnp.where(e_out == NAN_SCALE_EXP, jnp.float32(jnp.nan), B.pow2_f32(jnp.minimum(e_out, 127))),
        global_scale=jnp.float32(1.0),
    )
