"""``ceil``: torchao's ``ScaleCalculationMode.CEIL``, ``2**(ceil(log2 amax) - emax)``.

The amax's float32 exponent, plus one where any mantissa bit is set (so a
block whose amax is a power of two keeps the floor exponent); the block max
then scales into ``(2**(emax-1), 2**emax]`` and nothing saturates, at the cost
of up to one binade of range at the bottom of the block.
"""

from mx_proxy.numerics.mx import bits as B
from mx_proxy.numerics.scale_rules import ScaleRule, register


def _bump(amax, field, e0, fmt):
    """Where amax is not a power of two (and the floor exponent is not clamped at -127)."""
    return ((amax & B.MANT) != 0) & (field >= fmt.emax)


RULE = register(ScaleRule(
    name="ceil",
    doc="torchao CEIL: 2**(ceil(log2 amax) - emax), one binade above floor unless amax is a power of two; "
        "nothing saturates",
    bump=_bump,
    order=2,
))
