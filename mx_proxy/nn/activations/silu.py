"""``silu``: x·sigmoid(x) (swish)."""

import jax

from mx_proxy.nn.activations import Activation, register

ACT = register(Activation(name="silu", doc="SiLU (swish), x·sigmoid(x)", fn=lambda x, r: r(jax.nn.silu(x)),
                          order=6))
