"""The model spec: one frozen record of what a student is, its names resolved to objects once.

:func:`model_spec` builds a :class:`ModelSpec` from names (what ``Config`` and the flags hold); the training layer
builds one per run from its Config (:func:`mx_proxy.training.engine.model_spec_of`) and hands it whole to the
student (:mod:`mx_proxy.nn.architectures`), which hands it whole to each block; every block reads the field it
needs where it uses it (``spec.act`` in its activation, ``spec.norm`` in its normalization, ``spec.init`` in its
parameters), as nanodo's layers read one ``DoConfig``. Nothing below looks a name up again.
"""

from __future__ import annotations

import dataclasses

from mx_proxy.nn import activations, norms
from mx_proxy.nn.activations import Activation
from mx_proxy.nn.inits import InitScheme
from mx_proxy.nn.norms import Norm
from mx_proxy.numerics.recipe import PRESETS, Recipe

__all__ = ["ModelSpec", "model_spec"]


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """What a student is (frozen; hashable).

    Attributes:
      width: d, the residual stream's width (features).
      depth: how many residual blocks.
      act: the blocks' activation (an entry of :data:`~mx_proxy.nn.activations.ACTIVATIONS`); a gated one
        sets the widths (:attr:`hidden`, :attr:`fc1_out`).
      norm: the normalization before each block's MLP (an entry of :data:`~mx_proxy.nn.norms.NORMS`); the
        nGPT student has none and ignores it.
      init: how the weights are initialized (scheme and gain).
      recipe: the precision recipe every dense layer runs (its per-layer overrides applied per block).
      high_recipe: the recipe a promoted unit switches to; ``None`` when no controller runs.
    """

    width: int
    depth: int
    act: Activation
    norm: Norm
    init: InitScheme = InitScheme()
    recipe: Recipe = PRESETS["fp32"]
    high_recipe: Recipe | None = None

    @property
    def hidden(self) -> int:
        """Hidden units of a block: 4d, or round(8d/3) for a gated activation (SwiGLU)."""
        return self.act.hidden_width(self.width)

    @property
    def fc1_out(self) -> int:
        """Outputs of fc1: the hidden units, twice as many for a gated activation (its two halves)."""
        return self.act.fc1_width(self.hidden)

    def replace(self, **changes) -> ModelSpec:
        """A copy with ``changes`` (field -> value), e.g. another ``recipe``."""
        return dataclasses.replace(self, **changes)


def model_spec(width: int, depth: int, act: str | Activation = "gelu", norm: str | Norm = "layernorm",
               init: str = "pytorch", init_gain: float = 0.5, recipe: Recipe = PRESETS["fp32"],
               high_recipe: Recipe | None = None) -> ModelSpec:
    """The :class:`ModelSpec` of these names: ``act`` and ``norm`` looked up in their registries (an entry
    passes as it is), ``init`` and ``init_gain`` as an :class:`~mx_proxy.nn.inits.InitScheme`.

    Raises:
      ValueError: an unknown ``act``, ``norm`` or ``init`` (naming the valid ones).
    """
    return ModelSpec(width, depth, activations.get(act), norms.get(norm), InitScheme(init, init_gain), recipe,
                     high_recipe)
