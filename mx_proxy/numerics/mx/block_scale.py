"""Scale choice: from a block's amax to its shared E8M0 exponent and the
per-block quantities the element rounding needs.

Rules (OCP MX v1.0 and the reference library):

* ``"floor"``: ``e = floor(log2 amax) - emax`` (with E4M3 the scaled block
  maximum lies in [256, 512): every scaled value above 448 saturates).
* ``"rceil"``: the smallest e with ``amax / 2**e <= max_normal`` (NVIDIA
  Transformer Engine, cuBLAS, ``jax.nn.scaled_matmul``): never saturates.
* ``"paper_bump"``: what the authors' fork of the MX library does with
  ``bump_up_overflow_exponent`` (E4M3 only): the floor exponent, plus one
  for every element whose *position in its block* holds, in some block of
  the tensor, a maximum whose significand exceeds 1.75 (their code takes the
  maximum over the blocks axis instead of within each block, so each
  position of a block, not each block, gets its own exponent; see
  :func:`paper_bump`). Not a scale a hardware format can store: an
  intervention to compare with ``"rceil"``.
* ``e`` is clamped below at -127 (an all-zero block gets the smallest scale);
  above 127 the E8M0 scale is NaN and so is the whole block; a NaN or Inf in
  a block makes it NaN.

Two ways to the same quantities, from the same functions: kernel tiles call
:func:`block_exponent` and :func:`block_quantities` directly (plain integer
ops per block); the XLA path (:func:`lookup_block_quantities`) reads them
from a table that is :func:`block_quantities` evaluated once for every row
(amax exponent field x rceil bump), because on XLA:CPU a gather is not fused
into the element loop, so each quantity is materialized once per block
instead of being re-evaluated for every vector of elements.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from mx_proxy.numerics.formats import ElementFormat
from mx_proxy.numerics.mx import bits as B

__all__ = [
    "SCALE_RULES", "SCALE_EXP_MIN", "SCALE_EXP_MAX", "NAN_SCALE_EXP", "E8M0_BIAS", "E8M0_NAN", "Block",
    "floor_exponent", "block_exponent", "block_quantities", "block_table",
    "lookup_block_quantities", "e8m0_bytes", "e8m0_pow2", "paper_bump", "PER_ELEMENT_RULES",
]

SCALE_RULES = ("floor", "rceil", "paper_bump")  # E8M0 (power-of-two) scale rules
PER_ELEMENT_RULES = ("paper_bump",)  # rules whose exponent varies within a block (1-D XLA path only)
SCALE_EXP_MIN, SCALE_EXP_MAX = -127, 127  # E8M0 range
NAN_SCALE_EXP = 128  # marks a NaN scale in exponent arrays
E8M0_BIAS = 127  # E8M0 byte = e + 127
E8M0_NAN = 0xFF
_NAN_V = -(1 << 20)  # Block.v of a NaN block (negative: the NaN flag)


class Block(NamedTuple):
    """Per-block quantities (arrays broadcastable against the block's elements).

    e: scale exponent (int32). nan: the block is NaN (Inf/NaN inside, or e > 127).
    sat: bits of ``max_normal * 2**e``, the saturation bound; ``INF`` where that
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


def floor_exponent(field, fmt: ElementFormat):
    """The ``"floor"`` exponent ``max(floor(log2 amax) - emax, -127)`` from the
    amax exponent field (int32; field 0, a zero or subnormal amax, gives -127)."""
    return jnp.maximum(jnp.where(field > 0, field - 127, SCALE_EXP_MIN) - fmt.emax, SCALE_EXP_MIN)


def block_exponent(amax, fmt: ElementFormat, scale_rule: str):
    """Shared exponent ``e`` (int32) and NaN-block flag of blocks with amax bits ``amax``."""
    if scale_rule not in SCALE_RULES:
        raise ValueError(f"unknown scale_rule {scale_rule!r}; valid: {', '.join(SCALE_RULES)}")
    e = floor_exponent((amax >> 23).astype(jnp.int32), fmt)
    if scale_rule == "rceil":  # bump where the floor scale would saturate
        e = e + (amax > B.max_normal_bits(fmt, e)).astype(jnp.int32)
    return e, (amax >= B.INF) | (e > SCALE_EXP_MAX)


def block_quantities(e, nan, fmt: ElementFormat) -> Block:
    """The :class:`Block` of exponents ``e`` (int32) and NaN flags ``nan``."""
    s0 = e + (fmt.emin - fmt.mantissa_bits)
    return Block(e=e, nan=nan, sat=B.max_normal_bits(fmt, e), v=jnp.where(nan, _NAN_V, s0 + 150),
                 step=B.pow2_bits(s0), half=B.pow2_bits(s0 - 1))


@functools.lru_cache(maxsize=None)
def block_table(fmt: ElementFormat, scale_rule: str) -> np.ndarray:
    """:func:`block_quantities` of every possible block: an int64 table with
    columns (e, nan, sat, v, step, half), one row per amax exponent field F
    (0..255), and under "rceil" 256 more rows with e bumped by one. A block
    depends on its amax only through its row (:func:`_table_index`)."""
    with jax.ensure_compile_time_eval():  # concrete even when first asked for inside a trace
        cols = _block_table_columns(fmt, scale_rule == "rceil")
    return np.stack([np.asarray(c).astype(np.int64) for c in cols], axis=-1)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _block_table_columns(fmt: ElementFormat, bumped_rows: bool) -> Block:
    """The columns of :func:`block_table`, computed as one small compiled
    program (op-by-op evaluation would compile a dozen)."""
    field = jnp.arange(256, dtype=jnp.int32)
    e = floor_exponent(field, fmt)
    if bumped_rows:
        field, e = jnp.tile(field, 2), jnp.concatenate([e, e + 1])
    nan = (field == 255) | (e > SCALE_EXP_MAX)
    return block_quantities(e, nan, fmt)


def _table_index(amax, fmt: ElementFormat, scale_rule: str):
    """Row of :func:`block_table` per block: the amax exponent field, plus 256
    where "rceil" bumps e (the same test as :func:`block_exponent`)."""
    field = (amax >> 23).astype(jnp.int32)
    if scale_rule != "rceil":
        return field
    bump = amax > B.max_normal_bits(fmt, floor_exponent(field, fmt))
    return field + jnp.where(bump, 256, 0)


def lookup_block_quantities(amax, fmt: ElementFormat, scale_rule: str) -> Block:
    """:func:`block_quantities` of :func:`block_exponent`, read from
    :func:`block_table`: one gather per quantity, so that each comes out
    contiguous whatever the block layout (the NaN flag is ``v < 0``, one
    gather fewer; ``e`` is only gathered where used)."""
    table = block_table(fmt, scale_rule)
    idx = _table_index(amax, fmt, scale_rule)

    def column(k, dtype):
        return jnp.asarray(table[:, k].astype(dtype)).at[idx].get(mode="promise_in_bounds")

    v = column(3, np.int32)
    return Block(e=column(0, np.int32), nan=v < 0, sat=column(2, np.uint32), v=v,
                 step=column(4, np.uint32), half=column(5, np.uint32))


def paper_bump(a, axis: int):
    """The authors' exponent bump (int32 0/1) for the split view ``a`` of
    magnitude bits (block elements along ``axis + 1``): ``m > 1.75 *
    2**floor(log2 m)`` with ``m`` the maximum over the *blocks* axis ``axis``
    at each position within a block, shaped ``(.., 1, block_size, ..)`` to
    broadcast over the blocks (subnormal maxima never bump)."""
    m = jnp.max(a, axis=axis, keepdims=True, initial=0)  # no blocks (an empty array): nothing bumps
    return (((m >> 23) > 0) & ((m & B.MANT) > 0x600000)).astype(jnp.int32)


def e8m0_bytes(e, nan):
    """E8M0 scale bytes (uint8) of block exponents: ``e + 127``, or 255 for a NaN block."""
    return jnp.where(nan, E8M0_NAN, e + E8M0_BIAS).astype(jnp.uint8)


def e8m0_pow2(scales):
    """float32 ``2**(byte - 127)`` of E8M0 bytes in [1, 254] (normal powers of
    two, exact), NaN for 255. Byte 0 (2**-127, a float32 subnormal) gives 0:
    callers that may see it scale in two steps instead."""
    b = jnp.asarray(scales).astype(jnp.uint32)
    return B.f32(jnp.where(b == E8M0_NAN, B.QNAN, b << 23))
