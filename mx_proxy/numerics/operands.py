"""The six GEMM operands of a dense layer, declared once.

A dense layer ``y = x @ W + b`` (x of shape (batch, in), W of shape (in,
out)) runs three GEMMs, each of two operands; a :class:`~mx_proxy.numerics.recipe_type.Recipe`
gives each operand an :class:`~mx_proxy.numerics.quantize.MXSpec` (its field
of the same name), and each operand is quantized in blocks along its GEMM's
contraction axis, as in the reference library's MX linear layer:

=========  ======================  ==================================  ===================================
GEMM       product                 operand A (block axis)              operand B (block axis)
=========  ======================  ==================================  ===================================
forward    y  = x @ W              ``fwd_x``: x along in-features      ``fwd_w``: W along in (axis 0)
dgrad      dx = g @ Wᵀ             ``dgrad_g``: g along out-features   ``dgrad_w``: W along out (axis 1)
wgrad      dW = xᵀ @ g             ``wgrad_x``: x along the batch      ``wgrad_g``: g along the batch
=========  ======================  ==================================  ===================================

(g is the gradient of the layer's output.) :data:`OPERANDS` is their names in
this order (the recipe fields, the stochastic-rounding key index of each,
the quantization statistics' columns); :data:`OPERAND_INFO` the registry of
:class:`Operand` entries (``mx-proxy list operands``).
"""

from __future__ import annotations

import dataclasses

from mx_proxy.numerics.registry import Registry

__all__ = ["Operand", "OPERAND_INFO", "OPERANDS", "get"]


@dataclasses.dataclass(frozen=True)
class Operand:
    """One GEMM operand.

    Attributes:
      name: the recipe field (``fwd_x`` …).
      doc: one line on what it is.
      gemm: ``"forward"``, ``"dgrad"`` or ``"wgrad"``.
      tensor: ``"x"`` (the layer's input, (batch, in)), ``"w"`` (its kernel,
        (in, out)) or ``"g"`` (the gradient of its output, (batch, out)).
      axis: the block axis of that 2-D tensor (the GEMM's contraction axis).
      order: its place in listings and its index (``fold_in`` of stochastic rounding).
    """

    name: str
    doc: str
    gemm: str
    tensor: str
    axis: int
    order: int


OPERAND_INFO: Registry[Operand] = Registry("operand", "GEMM operands of a dense layer (the recipe's six specs)")
for _op in (
    Operand("fwd_x", "forward GEMM y = x @ W: the input x, blocks along in-features", "forward", "x", 1, 0),
    Operand("fwd_w", "forward GEMM: the weight W, blocks along in-features (axis 0)", "forward", "w", 0, 1),
    Operand("dgrad_g", "dgrad GEMM dx = g @ Wᵀ: the output gradient g, blocks along out-features", "dgrad", "g", 1,
            2),
    Operand("dgrad_w", "dgrad GEMM: the weight W, blocks along out-features (axis 1)", "dgrad", "w", 1, 3),
    Operand("wgrad_x", "wgrad GEMM dW = xᵀ @ g: the input x, blocks along the batch", "wgrad", "x", 0, 4),
    Operand("wgrad_g", "wgrad GEMM: the output gradient g, blocks along the batch", "wgrad", "g", 0, 5),
):
    OPERAND_INFO.register(_op)

OPERANDS: tuple[str, ...] = OPERAND_INFO.names()
"""The operands' names, in the table's order: the recipe fields."""


def get(name: str) -> Operand:
    """The operand called ``name``. Raises ValueError naming the valid ones."""
    return OPERAND_INFO.get(name)
