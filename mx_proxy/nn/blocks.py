"""The pieces both students are built from: widths, initializers, the names
a dense layer answers to, and the per-block PRNG folds and promotion flags."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from mx_proxy.nn import activations

__all__ = ["INITS", "layer_names", "hidden_width", "fc1_width"]

INITS = ("pytorch", "xavier_normal")


def layer_names(index: int, depth: int, fc: str) -> tuple[str, ...]:
    """The names a dense layer answers to in :meth:`Recipe.for_layer`."""
    names = [f"block_{index}/{fc}"]
    if index == 0:
        names.append(f"first/{fc}")
    if index == depth - 1:
        names.append(f"last/{fc}")
    return tuple(names)


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
