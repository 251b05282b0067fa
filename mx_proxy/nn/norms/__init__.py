"""Normalizations: what each residual block applies before its MLP, one module per entry.

Each normalization is one :class:`Norm` in a module of this package (the
package imports them all: a new file is a new normalization); :data:`NORMS`
is the registry (``mx-proxy list norms``, Config's ``norm`` choices, the
explorer's dropdown). :func:`normalize` declares an entry's parameters on a
block and applies it under the recipe (or under the controller's high
recipe where the block's normalization unit is promoted).

Shared here: the precisions LayerNorm-like math runs in
(:func:`ln_precisions`: stats, rest, backward), the library's rounded mean,
and :func:`quantize_affine`, which every gain and bias passes (rounded to the
LN precision, MX-quantized with ``recipe.ln_affine`` when set: the paper's
clamping mechanism). The diagnostics read the parameters by name: a gain
is ``ln_gain`` (its clamping is counted), a bias ``ln_bias``.

Adding a normalization: a new module here holding ``NORM = register(Norm(
name=..., doc=..., label=..., params=(("ln_gain", ones),), apply=f))``
with ``f(z, params, recipe)`` (docs/architecture.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import flax.linen as nn
import jax.numpy as jnp

from mx_proxy.nn.dense import switch
from mx_proxy.nn.rounding import vround
from mx_proxy.numerics.quantize import quantize
from mx_proxy.numerics.recipe import Recipe
from mx_proxy.numerics.registry import Registry, load_entries

__all__ = ["Norm", "NORMS", "register", "get", "normalize", "quantize_affine", "ones", "zeros",
           "ln_precisions", "rounded_mean"]

ones, zeros = nn.initializers.ones, nn.initializers.zeros


@dataclasses.dataclass(frozen=True)
class Norm:
    """One normalization (frozen).

    Attributes:
      name: what ``Config.norm`` and ``--norm`` call it.
      doc: one line on what it computes (``mx-proxy list norms``, the docs).
      label: how figures name it (``"LayerNorm, no affine"``).
      params: ``((name, initializer), ...)``: the per-feature parameters it
        declares on its block, in this order (the order fixes the PRNG
        stream of every later parameter); ``ln_gain`` is a gain whose
        clamping the diagnostics count, ``ln_bias`` a bias.
      apply: ``apply(z, params, recipe) -> array``: the normalization of ``z``
        (..., width) with ``params`` (name -> array) under ``recipe``;
        ``None``: the identity.
      order: its place in listings (lower first; the first is the default).
    """

    name: str
    doc: str
    label: str
    params: tuple[tuple[str, Callable], ...] = dataclasses.field(default=(), compare=False)
    apply: Callable | None = dataclasses.field(default=None, compare=False)
    order: int = 100

    @property
    def param_names(self) -> tuple[str, ...]:
        """The names of its parameters, in declaration order."""
        return tuple(n for n, _ in self.params)


NORMS: Registry[Norm] = Registry("norm", "normalizations before each residual block's MLP", Norm)
"""Every normalization, by name (``layernorm`` first: the default)."""

register = NORMS.register  # a module of this package adds its normalization with it, once
get = NORMS.get  # the normalization called ``name``; a ValueError names the valid ones


def normalize(module: nn.Module, norm: str, z, width: int, flag, recipe: Recipe, high: Recipe | None):
    """The block's normalization ``norm`` of ``z`` (..., width), declaring
    its parameters on ``module``. ``flag``: the controller's promotion of
    this normalization unit to ``high`` (see :func:`mx_proxy.nn.dense.switch`).

    Raises:
      ValueError: an unknown ``norm`` (naming the valid ones).
    """
    entry = get(norm)
    params = {name: module.param(name, init, (width,)) for name, init in entry.params}
    if entry.apply is None:
        return z
    return switch(flag, lambda rc: entry.apply(z, params, rc), recipe, high)


def quantize_affine(p, recipe: Recipe):
    """A LayerNorm gain or bias as the recipe's LN treatment sees it:
    MX-quantized in blocks along the feature axis (straight-through gradient)
    when ``recipe.ln_affine`` is set, else rounded to the LN precision
    (unrounded with ``ln_precision`` ``"fp32"`` or ``"stats_fp32"``)."""
    prec = recipe.vector if recipe.ln_precision == "vector" else "fp32"
    p = vround(p, prec, recipe.vector_rounding, recipe.backward_vector, param=True)
    if recipe.ln_affine is None:
        return p
    return quantize(p, recipe.ln_affine, axis=-1)


def ln_precisions(recipe: Recipe) -> tuple[str, str, str]:
    """(stats, rest, backward) precisions of LayerNorm: the input, mean and
    variance; the rest of the forward (eps, sqrt, reciprocal, normalize,
    scale, shift); the backward."""
    if recipe.ln_precision == "fp32":
        return "fp32", "fp32", "fp32"
    if recipe.ln_precision == "stats_fp32":
        return "fp32", recipe.vector, "fp32"
    return recipe.vector, recipe.vector, recipe.backward_vector


def rounded_mean(x, r):
    """The library's ``vec_reduce_mean`` over the last axis: sum, round, divide, round."""
    return r(r(jnp.sum(x, axis=-1, keepdims=True)) / x.shape[-1])


load_entries(__name__, __path__)
