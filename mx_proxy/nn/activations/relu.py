"""``relu``: max(x, 0) (its outputs are its inputs: nothing to round)."""

import jax

from mx_proxy.nn.activations import Activation, register

ACT = register(Activation(name="relu", doc="ReLU, max(x, 0)", fn=lambda x, r: jax.nn.relu(x), order=1))
