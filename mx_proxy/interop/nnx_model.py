"""Quantize an unmodified NNX model in one call: :func:`quantize_nnx`.

An NNX model is a graph of Python objects, so the rules act on the
objects: every ``nnx.Linear``, ``nnx.LayerNorm`` and ``nnx.RMSNorm`` a rule
matches is replaced, in its parent, by an MX counterpart (:class:`MXLinear`,
:class:`MXNorm`) that holds the *same* ``nnx.Param`` objects under the same
attribute names (``kernel``, ``bias``, ``scale``), so ``nnx.state(model)``
keeps its paths and values, and an optimizer or checkpoint made for the
model still fits; an ``nnx.LinearGeneral`` gets its ``dot_general`` and an
``nnx.Einsum`` its ``einsum_op`` set to the recipe's
(:class:`~mx_proxy.interop.layers.LayerDot`, :class:`~mx_proxy.interop.layers.LayerEinsum`).
Module paths are NNX's own (attribute names and list indices joined by
``/``: ``"blocks/0/mlp/up"``). Everything is checked before the model is
changed: the rules against the layers found, each matched layer's options.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from mx_proxy.interop import layers
from mx_proxy.interop import rules as _rules

__all__ = ["quantize_nnx", "MXLinear", "MXNorm", "KINDS"]

KINDS = {nnx.Linear: "Dense", nnx.LinearGeneral: "DenseGeneral", nnx.Einsum: "Einsum", nnx.LayerNorm: "LayerNorm",
         nnx.RMSNorm: "RMSNorm"}
"""The NNX layer classes a rule can match, by the kind name the rules and tables share with Linen."""


class MXLinear(nnx.Module):
    """An ``nnx.Linear`` under a recipe: the proxy's dense layer (:func:`mx_proxy.interop.layers.dense`) on the
    original layer's own ``kernel`` and ``bias`` Params."""

    def __init__(self, linear: nnx.Linear, recipe, path: str):
        self.kernel, self.bias = linear.kernel, linear.bias
        self.in_features, self.out_features, self.use_bias = linear.in_features, linear.out_features, linear.use_bias
        self.recipe, self.path = recipe, path

    def __call__(self, inputs, out_sharding=None):
        bias = self.bias[...] if self.bias is not None else None
        return layers.dense(inputs, self.kernel[...], bias, self.recipe, self.path)


class MXNorm(nnx.Module):
    """An ``nnx.LayerNorm`` or ``nnx.RMSNorm`` under a recipe (:func:`mx_proxy.interop.layers.norm`), on the
    original layer's own ``scale`` and ``bias`` Params."""

    def __init__(self, norm, kind: str, recipe, path: str):
        self.scale = norm.scale
        if kind == "LayerNorm":
            self.bias = norm.bias
        self.kind, self.epsilon, self.num_features = kind, norm.epsilon, norm.num_features
        self.recipe, self.path = recipe, path

    def __call__(self, x, mask=None):
        if mask is not None:
            raise ValueError(f"layer {self.path} ({self.kind}): the MX normalization takes no mask")
        scale = self.scale[...] if self.scale is not None else None
        bias = getattr(self, "bias", None)
        bias = bias[...] if bias is not None else None
        return layers.norm(self.kind, x, scale, bias, self.recipe, self.epsilon, self.path)


def _check(m, kind: str, path: str) -> None:
    layers.check_float32(path, kind, dtype=m.dtype, param_dtype=m.param_dtype)
    own = (getattr(m, "dot_general", None) not in (None, jax.lax.dot_general)
           or getattr(m, "dot_general_cls", None) is not None or getattr(m, "einsum_op", jnp.einsum) is not jnp.einsum)
    if own:
        raise ValueError(f"layer {path} ({kind}) already has its own dot_general or einsum_op; a rule would replace "
                         "it: leave the layer out of the rules or drop it")
    if kind in ("LayerNorm", "RMSNorm"):
        for field in ("reduction_axes", "feature_axes"):
            axes = getattr(m, field)
            if (tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)) != (-1,):
                raise ValueError(f"layer {path} ({kind}) has {field}={axes!r}; the MX LayerNorm and RMSNorm normalize "
                                 "over the last axis only (-1)")
        if m.axis_name is not None:
            raise ValueError(f"layer {path} ({kind}) has axis_name={m.axis_name!r}: not supported by the MX norm")


def _set(root, path: tuple, value) -> None:
    parent = root
    for p in path[:-1]:
        parent = parent[p] if isinstance(p, int) or not hasattr(parent, str(p)) else getattr(parent, p)
    last = path[-1]
    if isinstance(last, int) or not hasattr(parent, str(last)):
        parent[last] = value
    else:
        setattr(parent, last, value)


def quantize_nnx(model: nnx.Module, rules):
    """``model`` with its matched layers under their recipes (module docstring), changed in place and returned
    (a new object only when the root itself is a matched ``Linear`` or norm).

    Raises:
      ValueError: an unknown recipe, a rule that matches no layer, a matched layer the MX emulation cannot
        run (each naming the value and what is valid); the model is left unchanged.
      TypeError: ``model`` is not an NNX module.
    """
    if not isinstance(model, nnx.Module):
        raise TypeError(f"quantize_nnx takes a flax.nnx Module (for a Linen model: quantize), got "
                        f"{type(model).__name__}")
    rules = _rules.as_rules(rules)
    found = [(path, m, KINDS[type(m)]) for path, m in nnx.iter_modules(model) if type(m) in KINDS]
    _rules.check(rules, {"/".join(map(str, p)): k for p, _, k in found})
    plan = []
    for path, m, kind in found:
        name = "/".join(map(str, path))
        rule = _rules.match(rules, name)
        if rule is not None:
            _check(m, kind, name)
            plan.append((path, m, kind, name, _rules.layer_recipe(rule, name, kind)))
    for path, m, kind, name, recipe in plan:
        if kind == "DenseGeneral":
            m.dot_general = layers.LayerDot(recipe, name)
            continue
        if kind == "Einsum":
            m.einsum_op = layers.LayerEinsum(recipe, name)
            continue
        new = MXLinear(m, recipe, name) if kind == "Dense" else MXNorm(m, kind, recipe, name)
        if not path:
            return new
        _set(model, path, new)
    return model
