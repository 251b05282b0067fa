"""``layernorm_noaffine``: LayerNorm without gain or bias (no parameters, nothing to clamp)."""

from mx_proxy.nn.norms import Norm, register
from mx_proxy.nn.norms.layernorm import layer_norm

NORM = register(Norm(
    name="layernorm_noaffine",
    doc="LayerNorm without gain and bias (no parameters: nothing for the MX scale to clamp)",
    label="LayerNorm, no affine",
    apply=lambda z, p, recipe: layer_norm(z, None, None, recipe),
    order=3,
))
