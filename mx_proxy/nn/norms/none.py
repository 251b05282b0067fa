"""``none``: no normalization (the identity)."""

from mx_proxy.nn.norms import Norm, register

NORM = register(Norm(name="none", doc="no normalization: the block's MLP reads the residual stream itself",
                     label="no norm", order=1))
