"""``relu2``: the squared ReLU, max(x, 0)²."""

import jax
import jax.numpy as jnp

from mx_proxy.nn.activations import Activation, register

ACT = register(Activation(name="relu2", doc="squared ReLU, max(x, 0)²",
                          fn=lambda x, r: r(jnp.square(jax.nn.relu(x))), order=5))
