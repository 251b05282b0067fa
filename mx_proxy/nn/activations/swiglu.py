"""``swiglu``: silu(a) * b of the two halves (a, b) of fc1's output; a gated activation."""

import jax
import jax.numpy as jnp

from mx_proxy.nn.activations import Activation, register


def _swiglu(x, r):
    a, b = jnp.split(x, 2, axis=-1)
    return r(r(jax.nn.silu(a)) * b)


ACT = register(Activation(name="swiglu", doc="SwiGLU, silu(a)·b of fc1's two halves (hidden width round(8d/3))",
                          fn=_swiglu, gated=True, order=2))
