"""MX recipes on any Flax model: the proxy's numerics as a drop-in for a researcher's own network.

Between ``nn`` (the proxy's layers, which it reuses as they are) and
``training``. Its modules:

* :mod:`~mx_proxy.interop.dot_general`, :mod:`~mx_proxy.interop.einsum`: ``mx_dot_general`` (any
  dimension numbers, the dense layer's custom VJP per product) and ``mx_einsum``;
* :mod:`~mx_proxy.interop.layers`: what a matched layer computes, and the drop-ins
  ``MXDotGeneral`` / ``MXEinsum`` for ``nn.Dense(dot_general=...)``, ``nnx.Einsum(einsum_op=...)``;
* :mod:`~mx_proxy.interop.rules`: module-path globs → recipes, first match wins;
* :mod:`~mx_proxy.interop.linen` (``quantize``), :mod:`~mx_proxy.interop.nnx_model`
  (``quantize_nnx``): one call on an unmodified model;
* :mod:`~mx_proxy.interop.rounding`: stochastic-rounding keys (``rounding_key``);
* :mod:`~mx_proxy.interop.capture`: per-operand quantization statistics (``operand_statistics``).

The instruments that read such a model (the gradient bias against the
same model in FP32, the blow-up rule on a loss history) sit above
``training``, in :mod:`mx_proxy.experiments.instruments`; a worked example
is :mod:`mx_proxy.experiments.transformer`. docs/interop.md is the guide.
"""
