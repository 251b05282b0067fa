"""``paper_bump``: what the authors' fork of the MX library does with ``bump_up_overflow_exponent``.

The floor exponent, plus one for every element whose *position in its
block* holds, in some block of the tensor, a maximum whose significand
exceeds 1.75: their code takes the maximum over the blocks axis instead of
within each block, so each position of a block, not each block, gets its own
exponent (``tests/integration/test_library_vectors.py`` checks it against
their code). E4M3 only, as theirs; no E8M0 byte can store it, so it runs on
the XLA path of 1-D blocks only. An intervention to compare with ``rceil``.
"""

import jax.numpy as jnp

from mx_proxy.numerics.mx import bits as B
from mx_proxy.numerics.scale_rules import ScaleRule, register


def paper_bump(a, axis: int):
    """The authors' exponent bump (int32 0/1) for the split view ``a`` of
    magnitude bits (block elements along ``axis + 1``): ``m > 1.75 *
    2**floor(log2 m)`` with ``m`` the maximum over the *blocks* axis ``axis``
    at each position within a block, shaped ``(.., 1, block_size, ..)`` to
    broadcast over the blocks (subnormal maxima never bump)."""
    m = jnp.max(a, axis=axis, keepdims=True, initial=0)  # no blocks (an empty array): nothing bumps
    return (((m >> 23) > 0) & ((m & B.MANT) > 0x600000)).astype(jnp.int32)


RULE = register(ScaleRule(
    name="paper_bump",
    doc="the authors' bump_up_overflow_exponent (E4M3, 1-D blocks): floor, +1 for each position of a block whose "
        "maximum over the tensor's blocks exceeds 1.75*2^k (the wrong axis; compare rceil)",
    element_bump=paper_bump,
    elements=("fp8_e4m3",),
    scope="the authors' E4M3-only exponent bump",
    order=4,
))
