"""``floor``: the OCP MX v1.0 scale, ``2**(floor(log2 amax) - emax)``."""

from mx_proxy.numerics.scale_rules import ScaleRule, register

RULE = register(ScaleRule(
    name="floor",
    doc="OCP MX v1.0: 2**(floor(log2 amax) - emax); with E4M3 a scaled value above 448 (87.5 % of the block's "
        "binade top) saturates",
    order=0,
))
