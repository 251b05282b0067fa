"""``rceil``: round the scale up where the floor scale would saturate.

The smallest exponent with ``amax <= max_normal * 2**e``: NVIDIA's MXFP8
recipe, cuBLAS, Transformer Engine, ``jax.nn.scaled_matmul`` and torchao's
``ScaleCalculationMode.RCEIL`` (which rounds ``amax * (1 / max_normal)`` up
to a power of two in float32: the same exponent wherever that quotient is a
float32 normal, i.e. amax above about ``max_normal * 2**-126``; below, its
float32 product rounds and this rule stays exact). Nothing saturates.
"""

from mx_proxy.numerics.mx import bits as B
from mx_proxy.numerics.scale_rules import ScaleRule, register


def _bump(amax, field, e0, fmt):
    """Where the floor scale would saturate the block maximum."""
    return amax > B.max_normal_bits(fmt, e0)


RULE = register(ScaleRule(
    name="rceil",
    doc="round the scale up where the floor scale would saturate: the smallest 2**e with amax <= max_normal * "
        "2**e (NVIDIA's MXFP8 recipe, TE, cuBLAS, torchao RCEIL); nothing saturates",
    bump=_bump,
    order=1,
))
