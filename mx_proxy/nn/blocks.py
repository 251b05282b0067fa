"""The pieces both students are built from: the fields every student and
every block has (:class:`StudentFields`, :class:`BlockFields`), widths, initializers, the names a dense layer answers
to and the recipes it runs, and the per-block PRNG folds and promotion flags."""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from mx_proxy.nn import activations
from mx_proxy.numerics.recipe import PRESETS, Recipe

__all__ = ["INITS", "StudentFields", "BlockFields", "layer_names", "layer_recipes", "hidden_width", "fc1_width",
           "block_widths"]

INITS = ("pytorch", "xavier_normal")


def layer_names(index: int, depth: int, fc: str) -> tuple[str, ...]:
    """The names a dense layer answers to in :meth:`Recipe.for_layer`."""
    names = [f"block_{index}/{fc}"]
    if index == 0:
        names.append(f"first/{fc}")
    if index == depth - 1:
        names.append(f"last/{fc}")
    return tuple(names)


class StudentFields(nn.Module):
    """The fields of every student: ``depth`` blocks of ``width``, their
    activation, how their weights are initialized, the ``recipe`` they run and
    ``high_recipe``, the one a promoted unit switches to (``None`` when no
    controller runs)."""

    width: int
    depth: int
    act: str = "gelu"
    init_scheme: str = "pytorch"
    init_gain: float = 0.5
    recipe: Recipe = PRESETS["fp32"]
    high_recipe: Recipe | None = None


class BlockFields(nn.Module):
    """The fields of every student block: block ``index`` of ``depth``, its
    ``width`` and activation, how its weights are initialized, the ``recipe``
    it runs and ``high_recipe``, the one a promoted unit switches to (``None``
    when no controller runs)."""

    width: int
    act: str
    init_scheme: str
    init_gain: float
    recipe: Recipe
    index: int = 0
    depth: int = 1
    high_recipe: Recipe | None = None


def layer_recipes(recipe: Recipe, index: int, depth: int) -> tuple[Recipe, Recipe]:
    """The recipes of fc1 and fc2 of block ``index`` of ``depth`` (the recipe's overrides applied)."""
    return (recipe.for_layer(*layer_names(index, depth, "fc1")), recipe.for_layer(*layer_names(index, depth, "fc2")))


def _fold(key, i):
    return None if key is None else jax.random.fold_in(key, i)


def _flag(promote, j):
    return None if promote is None else promote[j]


def hidden_width(width: int, act: str, expansion: int = 4) -> int:
    """Width of the hidden layer: 4d, or round(8d/3) for a gated activation (SwiGLU)."""
    return activations.get(act).hidden_width(width, expansion)


def fc1_width(hidden: int, act: str) -> int:
    """Outputs of fc1 for a hidden layer of ``hidden`` units: a gated activation's two halves, 2·hidden."""
    return activations.get(act).fc1_width(hidden)


def block_widths(width: int, act: str) -> tuple[int, int, int]:
    """(width, hidden units, fc1 outputs) of a block."""
    hidden = hidden_width(width, act)
    return width, hidden, fc1_width(hidden, act)


def _kernel_init(init: str, gain: float):
    """Kernel (in, out) initializer.

    ``pytorch``: U(±1/sqrt(fan_in)) (torch.nn.Linear's default);
    ``xavier_normal``: N(0, gain²·2/(fan_in+fan_out)).
    """

    def f(key, shape, dtype=jnp.float32):
        fan_in, fan_out = shape
        if init == "pytorch":
            bound = 1.0 / math.sqrt(fan_in)
            return jax.random.uniform(key, shape, dtype, -bound, bound)
        std = gain * math.sqrt(2.0 / (fan_in + fan_out))
        return std * jax.random.normal(key, shape, dtype)

    return f


def _bias_init(init: str, fan_in: int):
    def f(key, shape, dtype=jnp.float32):
        if init == "pytorch":
            bound = 1.0 / math.sqrt(fan_in)
            return jax.random.uniform(key, shape, dtype, -bound, bound)
        return jnp.zeros(shape, dtype)

    return f
