"""``linear``: no activation (the identity): the paper's linear ablation."""

from mx_proxy.nn.activations import Activation, register

ACT = register(Activation(name="linear", doc="none: the identity (the linear ablation)", fn=lambda x, r: x,
                          order=4))
