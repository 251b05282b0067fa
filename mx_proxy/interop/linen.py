"""Quantize an unmodified Linen model in one call: :func:`quantize` → :class:`QuantizedModel`.

The model's source is not touched: its ``init`` and ``apply`` run inside
``flax.linen.intercept_methods`` with an interceptor that takes over the
``__call__`` of every ``nn.Dense``, ``nn.DenseGeneral``, ``nn.Einsum``,
``nn.LayerNorm`` and ``nn.RMSNorm`` (the classes themselves, not
subclasses, whose ``__call__`` may differ) that a rule matches
(:mod:`mx_proxy.interop.rules`), and lets every other call through. A
matched layer declares its parameters exactly as Flax's does (same names,
shapes, initializers, so the same PRNG streams and parameter tree: an
unquantized model's parameters load as they are), then computes as
:mod:`mx_proxy.interop.layers` says.

:func:`quantize` first traces ``model.init`` on example inputs
(``jax.eval_shape``: nothing is computed) to find the model's layers and
checks the rules and every matched layer's options there, so a rule that
matches nothing, a layer the emulation cannot run (a bfloat16 ``dtype``, a
LayerNorm over other axes, its own ``dot_general``) or a product with no
contracting axis is refused before any work.

Why not qwix (``google/qwix``, read at 0.1.8)? Its interception is the
pattern followed here (rules on module paths, first match), but what it
intercepts is ``jax.lax.dot_general`` and ``jnp.einsum`` calls, one op at a
time: the vector math around a layer's GEMMs (the bias add and its
rounding, the norm's op order and its affine quantization) lies outside
what it sees, so a plain Dense layer could not compute what the proxy's
dense layer does. Its six per-GEMM formats (``DotGeneralQtConfig``: lhs,
rhs, ``dlhs_grad``, ``drhs_grad`` and the two residuals) take its own
qtypes only, whose ``mxfp8`` scale is ``2**ceil(log2(amax / max))`` with no
choice of scale rule, element rounding (ties away, stochastic, the
authors' per-element bump), 2-D tiles or NVFP4; a provider that carried a
recipe would replace its ``dot_general`` whole, keeping only the path
matching, which Flax's own interception gives without a dependency.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import pandas as pd

from mx_proxy.interop import layers
from mx_proxy.interop import rules as _rules
from mx_proxy.interop.einsum import parse
from mx_proxy.interop.rounding import rounding_key

__all__ = ["quantize", "QuantizedModel", "KINDS"]

KINDS = {nn.Dense: "Dense", nn.DenseGeneral: "DenseGeneral", nn.Einsum: "Einsum", nn.LayerNorm: "LayerNorm",
         nn.RMSNorm: "RMSNorm"}
"""The Linen layer classes a rule can match, by the kind name the rules and tables use."""


def _path(module: nn.Module) -> str:
    return "/".join(str(p) for p in module.path)


def _last_axis(m, path: str, kind: str, ndim: int) -> None:
    for field in ("reduction_axes", "feature_axes"):
        axes = getattr(m, field)
        axes = tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)
        if tuple(a % ndim for a in axes) != (ndim - 1,):
            raise ValueError(f"layer {path} ({kind}) has {field}={getattr(m, field)!r}; the MX LayerNorm and RMSNorm "
                             "normalize over the last axis only (-1)")
    if getattr(m, "axis_name", None) is not None:
        raise ValueError(f"layer {path} ({kind}) has axis_name={m.axis_name!r} (statistics across devices): not "
                         "supported by the MX normalization")


def _own_dot(m, path: str, kind: str) -> None:
    if getattr(m, "dot_general", None) is not None or getattr(m, "dot_general_cls", None) is not None:
        raise ValueError(f"layer {path} ({kind}) already has its own dot_general; a rule would replace it: leave "
                         "the layer out of the rules or drop its dot_general")


def _dense(m: nn.Dense, recipe, path, inputs):
    _own_dot(m, path, "Dense")
    layers.check_float32(path, "Dense", dtype=m.dtype, param_dtype=m.param_dtype)
    kernel = m.param("kernel", m.kernel_init, (inputs.shape[-1], m.features), m.param_dtype)
    bias = m.param("bias", m.bias_init, (m.features,), m.param_dtype) if m.use_bias else None
    return layers.dense(inputs, kernel, bias, recipe, path)


def _dense_general(m: nn.DenseGeneral, recipe, path, next_fun, args, kwargs):
    _own_dot(m, path, "DenseGeneral")
    layers.check_float32(path, "DenseGeneral", dtype=m.dtype, param_dtype=m.param_dtype)
    # Flax's own __call__ with the layer's dot_general set for the call (a bound module is this call's own copy)
    object.__setattr__(m, "dot_general", layers.LayerDot(recipe, path))
    try:
        return next_fun(*args, **kwargs)
    finally:
        object.__setattr__(m, "dot_general", None)


def _einsum(m: nn.Einsum, recipe, path, inputs, einsum_str=None):
    layers.check_float32(path, "Einsum", dtype=m.dtype, param_dtype=m.param_dtype)
    equation = nn.module.merge_param("einsum_str", m.einsum_str, einsum_str).replace(" ", "")
    kernel = m.param("kernel", m.kernel_init, m.shape, m.param_dtype)
    parse(equation, inputs.ndim, len(m.shape))  # an unsupported equation is refused before the bias is declared
    bias = None
    if m.use_bias:
        bias_shape, broadcast = m._get_bias_shape(equation, inputs, kernel)
        bias = m.param("bias", m.bias_init, bias_shape, m.param_dtype)
    y = layers.LayerEinsum(recipe, path)(equation, inputs, kernel)
    return y if bias is None else y + bias.reshape(broadcast)


def _norm(kind):
    def run(m, recipe, path, x):
        layers.check_float32(path, kind, dtype=m.dtype, param_dtype=m.param_dtype)
        _last_axis(m, path, kind, x.ndim)
        d = x.shape[-1]
        scale = m.param("scale", m.scale_init, (d,), m.param_dtype) if m.use_scale else None
        bias = m.param("bias", m.bias_init, (d,), m.param_dtype) if kind == "LayerNorm" and m.use_bias else None
        return layers.norm(kind, x, scale, bias, recipe, m.epsilon, path)

    return run


_RUN = {"Dense": _dense, "Einsum": _einsum, "LayerNorm": _norm("LayerNorm"), "RMSNorm": _norm("RMSNorm")}


class _Interceptor:
    """Takes over the ``__call__`` of matched layers; records every supported layer in ``found`` (path → kind)."""

    def __init__(self, rules, found: dict | None = None):
        self.rules, self.found = rules, found

    def __call__(self, next_fun, args, kwargs, context):
        m = context.module
        kind = KINDS.get(type(m))
        if kind is None or context.method_name != "__call__":
            return next_fun(*args, **kwargs)
        path = _path(m)
        if self.found is not None:
            self.found.setdefault(path, kind)
        rule = _rules.match(self.rules, path)
        if rule is None:
            return next_fun(*args, **kwargs)
        recipe = _rules.layer_recipe(rule, path, kind)
        if kind == "DenseGeneral":
            return _dense_general(m, recipe, path, next_fun, args, kwargs)
        return _RUN[kind](m, recipe, path, *args, **kwargs)


@dataclasses.dataclass(frozen=True)
class QuantizedModel:
    """A Linen ``model`` under ``rules``: :meth:`init` and :meth:`apply` are the model's own, intercepted.

    ``layers``: path → kind of every supported layer the model has; :meth:`table` shows each with its recipe.
    """

    model: nn.Module
    rules: tuple
    layers: tuple[tuple[str, str], ...]

    def _intercept(self):
        return nn.intercept_methods(_Interceptor(self.rules))

    def init(self, rngs, *args, rounding_key=None, layer_key=None, **kwargs):
        """``model.init(rngs, *args, **kwargs)`` (the same parameters as the unquantized model's)."""
        return self.apply_fn("init", rngs, *args, rounding_key=rounding_key, layer_key=layer_key, **kwargs)

    def apply(self, variables, *args, rounding_key=None, layer_key=None, **kwargs):
        """``model.apply(variables, *args, **kwargs)`` under the rules. ``rounding_key``: the step's PRNG key
        when some recipe rounds stochastically (:mod:`mx_proxy.interop.rounding`; ``layer_key`` replaces how
        each layer derives its own)."""
        return self.apply_fn("apply", variables, *args, rounding_key=rounding_key, layer_key=layer_key, **kwargs)

    def apply_fn(self, method: str, first, *args, rounding_key=None, layer_key=None, **kwargs) -> Any:
        fn = getattr(self.model, method)
        with self._intercept():
            if rounding_key is None:
                return fn(first, *args, **kwargs)
            with _rounding(rounding_key, layer_key):
                return fn(first, *args, **kwargs)

    def recipe_of(self, path: str):
        """The recipe the layer at ``path`` runs, or ``None`` (full precision)."""
        kind = dict(self.layers)[path]
        rule = _rules.match(self.rules, path)
        return None if rule is None else _rules.layer_recipe(rule, path, kind)

    def table(self) -> pd.DataFrame:
        """One row per supported layer: path, kind, recipe (``None``: left in full precision)."""
        rows = [{"layer": p, "kind": k, "recipe": getattr(self.recipe_of(p), "name", None)} for p, k in self.layers]
        return pd.DataFrame(rows, columns=["layer", "kind", "recipe"])


_rounding = rounding_key


def quantize(model: nn.Module, rules, *example_args, **example_kwargs) -> QuantizedModel:
    """``model`` under ``rules`` (:func:`mx_proxy.interop.rules.as_rules`: a recipe, ``{pattern: recipe}``, a
    list of rules). ``example_args``/``example_kwargs``: inputs ``model.init`` takes (arrays or
    ``jax.ShapeDtypeStruct``), traced once to find the layers and check everything.

    Raises:
      ValueError: an unknown recipe, a rule that matches no layer, a matched layer the MX emulation cannot
        run, a product with no contracting axis (each naming the value and what is valid).
      TypeError: ``model`` is not a Linen module.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"quantize takes a flax.linen Module (for an NNX model: quantize_nnx), got "
                        f"{type(model).__name__}")
    rules = _rules.as_rules(rules)
    found: dict[str, str] = {}
    with nn.intercept_methods(_Interceptor(rules, found)), _rounding(jax.random.key(0)):
        jax.eval_shape(lambda *a: model.init(jax.random.key(0), *a, **example_kwargs), *example_args)
    _rules.check(rules, found)
    return QuantizedModel(model, rules, tuple(found.items()))
