"""Activations of the student's (and teacher's) MLP blocks, one module per entry.

Each activation is one :class:`Activation` in a module of this package (the
package imports them all: a new file is a new activation); :data:`ACTIVATIONS`
is the registry (``mx-proxy list acts``, Config's ``act`` and ``teacher_act``
choices, the explorer's dropdown). :func:`apply` runs one in the recipe's
activation precision: the input is rounded to it first, and the entry's
function rounds its result (one rounding after the whole function, as GELU
does; ReLU, whose outputs are its inputs, needs none). A gated activation
(SwiGLU) reads two halves of fc1's output, which sets the block's widths
(:meth:`Activation.hidden_width`, :meth:`Activation.fc1_width`).

Adding an activation: a new module here holding ``ACT = register(Activation(
name=..., doc=..., fn=lambda x, r: r(f(x))))`` (docs/architecture.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from mx_proxy.nn.rounding import rounder
from mx_proxy.numerics.recipe import Recipe
from mx_proxy.numerics.registry import Registry, load_entries

__all__ = ["Activation", "ACTIVATIONS", "register", "get", "apply"]


@dataclasses.dataclass(frozen=True)
class Activation:
    """One activation (frozen).

    Attributes:
      name: what ``Config.act`` and ``--act`` call it.
      doc: one line on what it computes (``mx-proxy list acts``, the docs).
      fn: ``fn(x, r) -> array``: the activation of ``x`` (already rounded to
        the activation precision), ``r`` the rounding to that precision (the
        identity in float32): round what the function computes, as the MX
        library rounds each vector op.
      gated: the function splits its input's last axis in two halves (a gate
        and a value, SwiGLU): fc1 then has twice the hidden width, and the
        hidden width is ``round(2/3 * expansion * width)`` so that the
        parameter count matches the ungated block's.
      order: its place in listings (lower first; the first is the default).
    """

    name: str
    doc: str
    fn: Callable = dataclasses.field(compare=False)
    gated: bool = False
    order: int = 100

    def hidden_width(self, width: int, expansion: int = 4) -> int:
        """Hidden units of a block of ``width``: ``expansion * width``, or round(2/3 of it) when gated."""
        return int(round(expansion * 2 * width / 3)) if self.gated else expansion * width

    def fc1_width(self, hidden: int) -> int:
        """Outputs of fc1 for ``hidden`` units: twice as many when gated (the gate and the value halves)."""
        return 2 * hidden if self.gated else hidden


ACTIVATIONS: Registry[Activation] = Registry("activation", "activations of the MLP blocks", Activation)
"""Every activation, by name (``gelu`` first: the default)."""

register = ACTIVATIONS.register  # a module of this package adds its activation with it, once
get = ACTIVATIONS.get  # the activation called ``name``; a ValueError names the valid ones


def apply(name: str, x, recipe: Recipe):
    """Activation ``name`` of ``x`` in the recipe's activation precision.

    Raises:
      ValueError: an unknown ``name`` (naming the valid ones).
    """
    act = get(name)
    prec = "fp32" if recipe.act_precision == "fp32" else recipe.vector
    r = rounder(prec, recipe.vector_rounding, None if prec == "fp32" else recipe.backward_vector)
    return act.fn(r(x), r)


load_entries(__name__, __path__)
