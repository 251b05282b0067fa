"""``tanh``: the hyperbolic tangent."""

import jax.numpy as jnp

from mx_proxy.nn.activations import Activation, register

ACT = register(Activation(name="tanh", doc="tanh", fn=lambda x, r: r(jnp.tanh(x)), order=3))
