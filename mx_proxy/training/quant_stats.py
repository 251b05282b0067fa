"""Quantization statistics of every GEMM operand at a diagnostic step (``Config.quant_stats``).

Every dense layer of each block (``fc1``, ``fc2``) runs three GEMMs of two
operands each (:mod:`mx_proxy.numerics.operands`). For each operand the
recipe quantizes (its spec in that layer, overrides included), this takes
the tensor exactly as that GEMM's quantizer receives it, rounded to the
vector precision of its pass (the forward's, or the backward's), and records
its :class:`~mx_proxy.numerics.operand_stats.OperandStats`:

* ``fwd_x``, ``wgrad_x``: the layer's input, from the model's intermediates
  (``fc1_in``, ``fc2_in``);
* ``fwd_w``, ``dgrad_w``: its kernel, from the parameters;
* ``dgrad_g``, ``wgrad_g``: the gradient of the loss with respect to the
  layer's output, the cotangent its backward receives. The model marks each
  GEMM output with ``flax``'s ``perturb`` (``fc1_out``, ``fc2_out``; a no-op
  unless a ``perturbations`` collection is passed), and the diagnostic step
  differentiates the same loss, at the same weights, batch, rounding key and
  promotion mask as the training step, with respect to zero perturbations.

Metrics, for each (layer, operand) that some block quantizes and each
statistic of :data:`~mx_proxy.numerics.operand_stats.STATS`:
``quant/<layer>/<operand>/<stat>/block`` (one value per block, NaN where
that block's layer leaves the operand unquantized) and
``quant/<layer>/<operand>/<stat>`` over the blocks (the mean; for
``scale_exp_min`` / ``scale_exp_max`` the minimum / maximum). Under a
stability controller the statistics are those of the recipe's own specs,
also for a promoted unit.
"""

from __future__ import annotations

import jax.numpy as jnp

from mx_proxy.nn.blocks import layer_names
from mx_proxy.nn.rounding import vround
from mx_proxy.numerics import operands
from mx_proxy.numerics.operand_stats import STATS, operand_stats
from mx_proxy.numerics.recipe import Recipe
from mx_proxy.training.diagnostics import block_keys

__all__ = ["LAYERS", "STATS", "operand_columns", "needs_output_grads", "output_perturbations", "metrics",
           "column_names"]

LAYERS = ("fc1", "fc2")
_REDUCE = {"scale_exp_min": jnp.nanmin, "scale_exp_max": jnp.nanmax}  # every other statistic: the mean over blocks


def _layer_recipe(recipe: Recipe, index: int, depth: int, layer: str) -> Recipe:
    return recipe.for_layer(*layer_names(index, depth, layer))


def operand_columns(recipe: Recipe, depth: int) -> tuple[tuple[str, str], ...]:
    """The (layer, operand) pairs some block's layer quantizes, layers in
    :data:`LAYERS` order, operands in :data:`~mx_proxy.numerics.operands.OPERANDS` order."""
    return tuple((layer, op) for layer in LAYERS for op in operands.OPERANDS
                 if any(getattr(_layer_recipe(recipe, i, depth, layer), op) is not None for i in range(depth)))


def column_names(columns) -> list[str]:
    """The metrics columns of ``columns`` (from :func:`operand_columns`), without the per-block ones."""
    return [f"quant/{layer}/{op}/{stat}" for layer, op in columns for stat in STATS]


def needs_output_grads(columns) -> bool:
    """Whether some operand of ``columns`` is a layer's output gradient (its statistics need the extra pass)."""
    return any(operands.get(op).tensor == "g" for _, op in columns)


def output_perturbations(params, rows: int) -> dict:
    """Zero perturbations of every GEMM output of the student ``params``:
    ``{block_i: {"fc1_out": (rows, fc1 outputs), "fc2_out": (rows, fc2 outputs)}}`` float32."""
    return {b: {f"{layer}_out": jnp.zeros((rows, params[b][layer].shape[1]), jnp.float32) for layer in LAYERS}
            for b in block_keys(params)}


def _operand(recipe: Recipe, op: str, x, w, g):
    """The tensor operand ``op`` of one layer as its GEMM's quantizer receives it (2-D: leading axes flattened)."""
    info = operands.get(op)
    tensor = {"x": x, "w": w, "g": g}[info.tensor]
    precision = recipe.vector if info.gemm == "forward" else recipe.backward_vector
    return vround(tensor.reshape(-1, tensor.shape[-1]), precision, recipe.vector_rounding), info.axis


def metrics(recipe: Recipe, columns, params, intermediates, output_grads=None) -> dict:
    """The ``quant/…`` metrics of one diagnostic step.

    Args:
      recipe: the student's recipe (with its ``dot``).
      columns: :func:`operand_columns` of it.
      params: the student's parameters at this step (``block_i/fc1``, ``fc2``: (in, out) kernels).
      intermediates: the training step's intermediates (``block_i/fc1_in``, ``fc2_in``).
      output_grads: the gradients of the loss with respect to
        :func:`output_perturbations` (needed when :func:`needs_output_grads`).

    Returns:
      ``{name: float32 array}``: (depth,) per-block arrays and scalars.
    """
    blocks = block_keys(params)
    depth = len(blocks)
    nan = {s: jnp.float32(jnp.nan) for s in STATS}
    out = {}
    for layer, op in columns:
        per_block = []
        for i, b in enumerate(blocks):
            r = _layer_recipe(recipe, i, depth, layer)
            spec = getattr(r, op)
            if spec is None:
                per_block.append(nan)
                continue
            g = None if output_grads is None else output_grads[b][f"{layer}_out"]
            tensor, axis = _operand(r, op, intermediates[b][f"{layer}_in"][0], params[b][layer], g)
            per_block.append(operand_stats(tensor, spec, axis)._asdict())
        for stat in STATS:
            values = jnp.stack([s[stat] for s in per_block])
            out[f"quant/{layer}/{op}/{stat}/block"] = values
            out[f"quant/{layer}/{op}/{stat}"] = _REDUCE.get(stat, jnp.nanmean)(values)
    return out
