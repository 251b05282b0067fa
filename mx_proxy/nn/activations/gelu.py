"""``gelu``: the exact (erf) GELU, PyTorch's default."""

import jax

from mx_proxy.nn.activations import Activation, register

ACT = register(Activation(name="gelu", doc="GELU, exact erf form (PyTorch's default)",
                          fn=lambda x, r: r(jax.nn.gelu(x, approximate=False)), order=0))
