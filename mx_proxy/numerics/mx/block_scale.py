"""Scale choice: from a block's amax to its shared E8M0 exponent and the
per-block quantities the element rounding needs.

The rules themselves (``floor``, ``rceil``, ``ceil``, ``even``,
``paper_bump``) are data, one module each in :mod:`mx_proxy.numerics.scale_rules`:
which blocks get an exponent one above the OCP floor exponent
``floor(log2 amax) - emax``. This module evaluates them. ``e`` is clamped
below at -127 (an all-zero block gets the smallest scale); above 127 the
E8M0 scale is NaN and so is the whole block; a NaN or Inf in a block makes it
NaN. A rule whose exponent differs within a block (``paper_bump``) bumps
each element on top of the floor exponent of its block (:func:`element_bump`).

Both paths compute the quantities with the same functions, :func:`block_exponent`
and :func:`block_quantities` (plain integer ops per block): kernel tiles call
them directly, and the XLA path (:func:`per_block_quantities`) also stores
the results once per block, in a small loop of their own. Fused into the element
loop, they would be evaluated again for every vector of elements. :func:`block_table`
holds them for every possible block (amax exponent field x the rule's bump), as
the tests' reference and the check that a format's bounds fit a word.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from mx_proxy.numerics.formats import ElementFormat
from mx_proxy.numerics.mx import bits as B
from mx_proxy.numerics.scale_rules import ScaleRule

__all__ = [
    "SCALE_EXP_MIN", "SCALE_EXP_MAX", "NAN_SCALE_EXP", "E8M0_BIAS", "E8M0_NAN", "Block",
    "floor_exponent", "block_exponent", "block_quantities", "block_table",
    "table_row", "word_table", "per_block_quantities", "e8m0_bytes", "e8m0_pow2", "element_bump",
]

SCALE_EXP_MIN, SCALE_EXP_MAX = -127, 127  # E8M0 range
NAN_SCALE_EXP = 128  # marks a NaN scale in exponent arrays
E8M0_BIAS = 127  # E8M0 byte = e + 127
E8M0_NAN = 0xFF
_NAN_V = -(1 << 14)  # Block.v of a NaN block (far below any real v in either word: the NaN flag)
_NAN_BELOW = -(1 << 13)  # v below this: a NaN block


class Block(NamedTuple):
    """Per-block quantities (arrays broadcastable against the block's elements).

    e: scale exponent (int32). nan: the block is NaN (Inf/NaN inside, or e > 127).
    sat: bits of ``max_normal * 2**e``, the saturation bound; ``INF`` where that
      exceeds float32 (nothing saturates; a value rounding to 2**128 is Inf).
    v: ``s0 + 150`` with ``s0 = emin + e - m`` the exponent of the smallest grid
      step: an element with exponent field f >= 1 has ``max(23 - m, v - f)``
      bits below its grid step. ``_NAN_V`` in NaN blocks.
    step, half: bits of ``2**s0`` and ``2**(s0 - 1)``.

    In bfloat16 words (:func:`per_block_quantities` with ``word=BF16``)
    sat, step and half are bf16 bit patterns and v counts bf16 ulps
    (``s0 + 134``, as small as -9); step and half there are exact wherever
    the rounding reads them (steps from 2**-125 up).
    """

    e: jax.Array
    nan: jax.Array
    sat: jax.Array
    v: jax.Array
    step: jax.Array
    half: jax.Array


def floor_exponent(field, fmt: ElementFormat):
    """The ``"floor"`` exponent ``max(floor(log2 amax) - emax, -127)`` from the
    amax exponent field (int32; field 0, a zero or subnormal amax, gives -127)."""
    return jnp.maximum(jnp.where(field > 0, field - 127, SCALE_EXP_MIN) - fmt.emax, SCALE_EXP_MIN)


def _nan(field, e, up, rule: ScaleRule):
    """NaN blocks: amax Inf or NaN, an exponent above 127, or (a rule that
    rounds amax) a carry out of the largest float32 binade."""
    nan = (field == 255) | (e > SCALE_EXP_MAX)
    return nan | (up & (field == 254)) if rule.carries_amax else nan


def block_exponent(amax, fmt: ElementFormat, rule: ScaleRule):
    """Shared exponent ``e`` (int32) and NaN-block flag of blocks with amax
    bits ``amax`` under ``rule`` (a spec's ``scale_rule``; a per-element rule
    gives its blocks' floor exponent, see :func:`element_bump`)."""
    field = (amax >> 23).astype(jnp.int32)
    e = floor_exponent(field, fmt)
    if rule.bump is None:
        return e, (amax >= B.INF) | (e > SCALE_EXP_MAX)
    up = rule.bump(amax, field, e, fmt)
    e = e + up.astype(jnp.int32)
    nan = (amax >= B.INF) | (e > SCALE_EXP_MAX)
    return e, (nan | (up & (field == 254))) if rule.carries_amax else nan


def block_quantities(e, nan, fmt: ElementFormat) -> Block:
    """The :class:`Block` of exponents ``e`` (int32) and NaN flags ``nan``."""
    s0 = e + (fmt.emin - fmt.mantissa_bits)
    return Block(e=e, nan=nan, sat=B.max_normal_bits(fmt, e), v=jnp.where(nan, _NAN_V, s0 + 150),
                 step=B.pow2_bits(s0), half=B.pow2_bits(s0 - 1))


@functools.cache
def block_table(fmt: ElementFormat, rule: ScaleRule) -> np.ndarray:
    """:func:`block_quantities` of every possible block: an int64 table with
    columns (e, nan, sat, v, step, half), one row per amax exponent field F
    (0..255), and for a rule with a bump 256 more rows with e bumped by one.
    A block depends on its amax only through its row (:func:`table_row`)."""
    # The compiled program, called: concrete even when first asked for inside a trace. (Calling the jitted
    # function under ``ensure_compile_time_eval`` instead would evaluate it op by op, a dozen compilations.)
    cols = _block_table_columns.lower(fmt, rule).compile()()
    return np.stack([np.asarray(c).astype(np.int64) for c in cols], axis=-1)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _block_table_columns(fmt: ElementFormat, rule: ScaleRule) -> Block:
    """The columns of :func:`block_table`, computed as one small compiled
    program (op-by-op evaluation would compile a dozen)."""
    field = jnp.arange(256, dtype=jnp.int32)
    e = floor_exponent(field, fmt)
    up = jnp.zeros(256, bool)
    if rule.bump is not None:
        field, e, up = jnp.tile(field, 2), jnp.concatenate([e, e + 1]), jnp.arange(512) >= 256
    return block_quantities(e, _nan(field, e, up, rule), fmt)


def table_row(amax, fmt: ElementFormat, rule: ScaleRule):
    """Row of :func:`block_table` per block of float32 amax bits ``amax``: the
    amax exponent field, plus 256 where the rule bumps e (the same test as
    :func:`block_exponent`)."""
    field = (amax >> 23).astype(jnp.int32)
    if rule.bump is None:
        return field
    bump = rule.bump(amax, field, floor_exponent(field, fmt), fmt)
    return field + jnp.where(bump, 256, 0)


@functools.cache
def word_table(fmt: ElementFormat, rule: ScaleRule, word: B.Word) -> np.ndarray:
    """:func:`block_table` in the bit patterns of ``word`` (float32: itself;
    bfloat16: sat, step and half cut to their top 16 bits, v in bf16 ulps).

    Raises:
      ValueError: a saturation bound of ``fmt`` that is not a bfloat16 value.
    """
    table = block_table(fmt, rule)
    if word == B.F32:
        return table
    cut = 32 - word.bits
    nan = table[:, 3] < 0
    if np.any((table[~nan, 2] & ((1 << cut) - 1)) != 0):
        raise ValueError(f"{fmt.name}'s max_normal * 2**e is not a {word.float_dtype.__name__} value")
    out = table.copy()
    out[:, 3], out[:, 2], out[:, 4], out[:, 5] = _in_word(table[:, 3], table[:, 2], table[:, 4], table[:, 5], nan,
                                                          word, np.where)
    return out


def _in_word(v, sat, step, half, nan, word: B.Word, where):
    """(v, sat, step, half) of float32 block quantities in the bit patterns of
    ``word``: the bounds cut to its top bits, v counted in its ulps (``_NAN_V``
    in NaN blocks). ``where``: ``np.where`` or ``jnp.where``, for tables and
    traced arrays alike."""
    cut = 32 - word.bits
    return where(nan, _NAN_V, v - (23 - word.fraction)), sat >> cut, step >> cut, half >> cut


def per_block_quantities(amax, fmt: ElementFormat, rule: ScaleRule, word: B.Word = B.F32) -> Block:
    """:func:`block_quantities` of :func:`block_exponent`, in the bit patterns
    of ``word`` (as :func:`word_table` writes them), computed once per block.
    ``amax``: block magnitude bits of ``word`` (float32 by default), one per
    block, broadcastable against the elements.

    The results go through a max-reduction over a pair (each value and the
    smallest of its type), which leaves them unchanged: XLA:CPU computes a
    reduction in a loop of its own and stores its output, so the element loop
    reads each quantity from memory once per block instead of fusing the
    arithmetic in and evaluating it again for every vector of elements (a
    whole paper_e4m3 step at width 512 took 4 % longer that way). The gather
    from :func:`word_table` that this replaces is slower still on XLA:CPU.

    Raises:
      ValueError: (``word`` narrower than float32) a format whose saturation
        bound is not a value of the word (:func:`word_table`).
    """
    if word != B.F32:
        word_table(fmt, rule, word)  # raises for a format too fine for the word (cached per format and rule)
    e, nan = block_exponent(amax.astype(np.uint32) << (32 - word.bits) if word != B.F32 else amax, fmt, rule)
    q = block_quantities(e, nan, fmt)
    v, *bounds = _in_word(q.v, q.sat, q.step, q.half, nan, word, jnp.where)
    vals = (v.astype(word.sint), *(x.astype(word.uint) for x in bounds))
    lows = tuple(np.array(np.iinfo(x.dtype).min, x.dtype) for x in vals)
    pairs = tuple(jnp.stack([x, jnp.full_like(x, low)], axis=-1) for x, low in zip(vals, lows))
    v, sat, step, half = jax.lax.reduce(pairs, lows, lambda a, b: tuple(map(jnp.maximum, a, b)), (vals[0].ndim,))
    return Block(e=e, nan=v < _NAN_BELOW, sat=sat, v=v, step=step, half=half)


def element_bump(a, axis: int, rule: ScaleRule):
    """The per-element bump (int32 0/1) of a rule whose exponent varies within
    a block (``paper_bump``), for the split view ``a`` of magnitude bits
    (blocks along ``axis``, elements along ``axis + 1``); ``None`` for a
    rule with one exponent per block."""
    return None if rule.element_bump is None else rule.element_bump(a, axis)


def e8m0_bytes(e, nan):
    """E8M0 scale bytes (uint8) of block exponents: ``e + 127``, or 255 for a NaN block."""
    return jnp.where(nan, E8M0_NAN, e + E8M0_BIAS).astype(jnp.uint8)


def e8m0_pow2(scales):
    """float32 ``2**(byte - 127)`` of E8M0 bytes in [1, 254] (normal powers of
    two, exact), NaN for 255. Byte 0 (2**-127, a float32 subnormal) gives 0:
    callers that may see it scale in two steps instead."""
    b = jnp.asarray(scales).astype(jnp.uint32)
    return B.f32(jnp.where(b == E8M0_NAN, B.QNAN, b << 23))
