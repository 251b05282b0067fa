"""``even``: torchao's ``ScaleCalculationMode.EVEN``: amax rounded to the element's precision first.

torchao adds half a unit of the element's last mantissa bit to the float32
bit pattern of amax and truncates the mantissa (round half up in magnitude),
then takes the ``floor`` exponent of the result: the exponent moves up one
where that rounding carries into the next binade. A carry out of the largest
float32 binade gives an Inf amax, and torchao a NaN scale: here the block is
NaN too.
"""

import numpy as np

from mx_proxy.numerics.mx import bits as B
from mx_proxy.numerics.scale_rules import ScaleRule, register


def _bump(amax, field, e0, fmt):
    """Where rounding amax to ``fmt.mantissa_bits`` carries into the next binade."""
    carry_from = np.uint32((1 << 23) - (1 << (22 - fmt.mantissa_bits)))  # mantissa + half a unit >= 2**23
    return ((amax & B.MANT) >= carry_from) & (field >= fmt.emax)


RULE = register(ScaleRule(
    name="even",
    doc="torchao EVEN: amax rounded (half up) to the element's mantissa bits, then floor; one binade up where "
        "that carries",
    bump=_bump,
    carries_amax=True,
    order=3,
))
