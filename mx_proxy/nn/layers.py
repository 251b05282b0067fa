"""The layers that honour a :class:`~mx_proxy.numerics.recipe.Recipe`, by one name each.

Each lives in the module of its job; this module gathers them for callers
that want them together (``from mx_proxy.nn import layers``):

* :mod:`mx_proxy.nn.dense`: ``mx_dense`` (custom VJP, three quantized GEMMs),
  ``quantized_matmul`` (one GEMM: operands quantized along K, float32
  accumulation, rounded output), ``operand_key``, ``switch``;
* :mod:`mx_proxy.nn.norms`: ``layer_norm`` (the MX library's op order),
  ``rms_norm``, ``quantize_affine`` and the normalization registry;
* :mod:`mx_proxy.nn.activations`: ``activation`` and the activation registry;
* :mod:`mx_proxy.nn.rounding`: ``vround``, ``bf16_round``.

The recipe-honouring GEMM is ``quantized_matmul`` only: ``mx_matmul`` is the
Pallas GEMM, :func:`mx_proxy.pallas.matmul.mx_matmul`, a different function
(this module once also called ``quantized_matmul`` so).
The six GEMM operands are :data:`mx_proxy.numerics.operands.OPERANDS`.
"""

from __future__ import annotations

from mx_proxy.nn.activations import ACTIVATIONS
from mx_proxy.nn.activations import apply as activation
from mx_proxy.nn.dense import bf16_exact, mx_dense, operand_key, quantize_operand, quantized_matmul, switch
from mx_proxy.nn.norms import ln_precisions, quantize_affine
from mx_proxy.nn.norms.layernorm import layer_norm
from mx_proxy.nn.norms.rmsnorm import rms_norm
from mx_proxy.nn.rounding import bf16_round, vround
from mx_proxy.numerics.operands import OPERANDS

__all__ = ["mx_dense", "quantized_matmul", "layer_norm", "rms_norm", "activation", "ACTIVATIONS", "vround",
           "bf16_round", "quantize_affine", "OPERANDS", "operand_key", "switch",
           "quantize_operand", "bf16_exact", "ln_precisions"]
