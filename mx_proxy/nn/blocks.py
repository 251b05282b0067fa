"""What both students' blocks share: the names a dense layer answers to and the recipes it runs, the widths,
and the per-block PRNG folds and promotion flags. (The fields every student and block reads are one
:class:`~mx_proxy.nn.model_spec.ModelSpec`; the initializers are :mod:`mx_proxy.nn.inits`.)"""

from __future__ import annotations

import jax

from mx_proxy.nn import activations
from mx_proxy.numerics.recipe import Recipe

__all__ = ["layer_names", "layer_recipes", "hidden_width", "fc1_width", "block_widths", "fold", "flag"]


def layer_names(index: int, depth: int, fc: str) -> tuple[str, ...]:
    """The names a dense layer answers to in :meth:`Recipe.for_layer`."""
    names = [f"block_{index}/{fc}"]
    if index == 0:
        names.append(f"first/{fc}")
    if index == depth - 1:
        names.append(f"last/{fc}")
    return tuple(names)


def layer_recipes(recipe: Recipe, index: int, depth: int) -> tuple[Recipe, Recipe]:
    """The recipes of fc1 and fc2 of block ``index`` of ``depth`` (the recipe's overrides applied)."""
    return (recipe.for_layer(*layer_names(index, depth, "fc1")), recipe.for_layer(*layer_names(index, depth, "fc2")))


def fold(key, i: int):
    """``key`` with ``i`` folded in (block i's key, or dense layer i's); ``None`` (no stochastic rounding) stays."""
    return None if key is None else jax.random.fold_in(key, i)


def flag(promote, j: int):
    """Entry ``j`` of ``promote`` (a block's row of the controller's (depth, 2) mask, or the mask's row j);
    ``None`` (no controller) stays."""
    return None if promote is None else promote[j]


def hidden_width(width: int, act, expansion: int = 4) -> int:
    """Width of the hidden layer: 4d, or round(8d/3) for a gated activation (SwiGLU); ``act`` a name or entry."""
    return activations.get(act).hidden_width(width, expansion)


def fc1_width(hidden: int, act) -> int:
    """Outputs of fc1 for a hidden layer of ``hidden`` units: a gated activation's two halves, 2·hidden."""
    return activations.get(act).fc1_width(hidden)


def block_widths(width: int, act) -> tuple[int, int, int]:
    """(width, hidden units, fc1 outputs) of a block."""
    hidden = hidden_width(width, act)
    return width, hidden, fc1_width(hidden, act)
