"""What a matched layer computes, shared by the Linen and NNX interceptions, and the drop-in callables.

* :func:`dense`: a ``Dense``/``Linear`` layer is the proxy's dense layer
  itself, :func:`mx_proxy.nn.dense.mx_dense`, bias included (rounded and
  added inside its custom VJP, its gradient the rounded row sum), so a
  model built of plain Dense layers computes what the proxy's student does;
* :class:`LayerDot` / :class:`LayerEinsum`: a ``DenseGeneral``/``LinearGeneral``
  layer's ``dot_general`` and an ``Einsum`` layer's einsum,
  :func:`~mx_proxy.interop.dot_general.mx_dot_general` (the bias, if any, is
  added by the layer's own code, unrounded);
* :func:`norm`: a ``LayerNorm`` (``scale``, ``bias``) is the proxy's
  :func:`~mx_proxy.nn.norms.layernorm.layer_norm` (the MX library's op
  order where it rounds; the gain and bias through
  :func:`~mx_proxy.nn.norms.quantize_affine`: MX-quantized with the recipe's
  ``ln_affine`` spec, the paper's clamping; the bias frozen where the recipe
  does not train it), an ``RMSNorm`` its :func:`~mx_proxy.nn.norms.rmsnorm.rms_norm`;
* :class:`MXDotGeneral`, :class:`MXEinsum`: drop-ins for a model's source,
  ``nn.Dense(dot_general=MXDotGeneral("mxfp8_e4m3"))``,
  ``nnx.Einsum(..., einsum_op=MXEinsum("mxfp8_e4m3"))``.

Every GEMM reads its stochastic-rounding key from :mod:`mx_proxy.interop.rounding`
and reports its operands to :mod:`mx_proxy.interop.capture`.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from mx_proxy.interop import capture
from mx_proxy.interop.dot_general import mx_dot_general
from mx_proxy.interop.einsum import mx_einsum
from mx_proxy.interop.rounding import key_for
from mx_proxy.nn.dense import mx_dense
from mx_proxy.nn.norms.layernorm import layer_norm
from mx_proxy.nn.norms.rmsnorm import rms_norm
from mx_proxy.numerics import recipe as recipes
from mx_proxy.numerics.recipe import Recipe

__all__ = ["dense", "norm", "LayerDot", "LayerEinsum", "MXDotGeneral", "MXEinsum", "check_float32"]


def check_float32(path: str, kind: str, **dtypes) -> None:
    """Refuse a layer whose computation or parameters are not float32 (the MX emulation computes in float32).

    Raises:
      ValueError: naming the layer and the field.
    """
    for field, dtype in dtypes.items():
        if dtype is not None and jnp.dtype(dtype) != jnp.float32:
            raise ValueError(f"layer {path or '<root>'} ({kind}) has {field}={jnp.dtype(dtype).name}; MX recipes "
                             "run in float32 (the MX grid is emulated on float32 values): leave it None/float32")


def dense(x, kernel, bias, recipe: Recipe, path: str):
    """``x @ kernel + bias`` (bias ``None``: none) as the proxy's dense layer, over the last axis of ``x``."""
    x = jnp.asarray(x, jnp.float32)
    key = key_for(recipe, path)
    observe = capture.observer(path, recipe)
    y = mx_dense(x, kernel, bias, recipe, key)
    if observe is None:
        return y
    lead = y.shape[:-1]
    y2 = observe(x.reshape(1, -1, x.shape[-1]), kernel[None], y.reshape(1, -1, y.shape[-1]))
    return y2.reshape(*lead, y.shape[-1])


def _extras(preferred_element_type, kwargs, where: str):
    if preferred_element_type is not None and jnp.dtype(preferred_element_type) != jnp.float32:
        raise ValueError(f"{where}: preferred_element_type={preferred_element_type!r}; the MX product is float32")
    unknown = {k: v for k, v in kwargs.items() if not (k == "out_sharding" and v is None)}
    if unknown:
        raise ValueError(f"{where}: unsupported arguments {sorted(unknown)} (valid: precision, "
                         "preferred_element_type, out_sharding=None)")


@dataclasses.dataclass(frozen=True)
class LayerDot:
    """The ``dot_general`` of the layer at ``path`` under ``recipe`` (``precision`` is ignored: the recipe decides)."""

    recipe: Recipe
    path: str | None = None

    def __call__(self, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **kwargs):
        _extras(preferred_element_type, kwargs, f"dot_general of {self.path or 'a drop-in'}")
        return mx_dot_general(lhs, rhs, dimension_numbers, self.recipe, key_for(self.recipe, self.path),
                              observe=capture.observer(self.path or "dot_general", self.recipe))


@dataclasses.dataclass(frozen=True)
class LayerEinsum:
    """The two-operand einsum of the layer at ``path`` under ``recipe`` (the signature of ``jnp.einsum``)."""

    recipe: Recipe
    path: str | None = None

    def __call__(self, equation, *operands, precision=None, preferred_element_type=None, **kwargs):
        _extras(preferred_element_type, kwargs, f"einsum of {self.path or 'a drop-in'}")
        if len(operands) != 2:
            raise ValueError(f"einsum {equation!r}: MX einsum takes two operands (x, W), got {len(operands)}")
        lhs, rhs = operands
        return mx_einsum(equation, lhs, rhs, self.recipe, key_for(self.recipe, self.path),
                         observe=capture.observer(self.path or "einsum", self.recipe))


def _drop_in(cls):
    """A drop-in made from a recipe name or Recipe (resolved at once: an unknown name is a ValueError)."""

    def make(recipe: Recipe | str, path: str | None = None):
        return cls(recipes.get(recipe), path)

    make.__name__ = make.__qualname__ = "MX" + cls.__name__.removeprefix("Layer")
    make.__doc__ = f"``{cls.__name__}`` of a recipe (name or Recipe); see :class:`{cls.__name__}`."
    return make


MXDotGeneral = _drop_in(LayerDot)
MXEinsum = _drop_in(LayerEinsum)


def norm(kind: str, x, scale, bias, recipe: Recipe, eps: float, path: str):
    """A ``LayerNorm`` (``kind="LayerNorm"``: gain ``scale`` and ``bias``, either ``None``) or ``RMSNorm``
    (gain ``scale``) over the last axis in the recipe's LN treatment."""
    capture.observe_norm(path, recipe, scale)
    x = jnp.asarray(x, jnp.float32)
    if kind == "RMSNorm":
        return rms_norm(x, scale, recipe, eps)
    return layer_norm(x, scale, bias, recipe, eps)
