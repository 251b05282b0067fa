"""Rules: which layers of a model run which recipe, matched on module paths (first match wins).

A :class:`Rule` pairs an ``fnmatch`` glob over a layer's module path (its
names from the root joined by ``/``: ``"blocks/0/attn/query"`` in NNX,
``"block_0/fc1"`` in Linen) with a recipe (a preset name, ``PRESET+CHANGE``,
or a :class:`~mx_proxy.numerics.recipe.Recipe`). A model's layers are
matched in order against the rules; the first rule that matches gives the
layer its recipe and a layer no rule matches stays as the model wrote it
(full precision). Within a rule, the recipe's own overrides (``Recipe.overrides``,
globs too) are matched against the same path, so ``mxfp4_2d``'s sensitive
GEMMs can be named by their paths. Normalization layers take the rule's
recipe itself, as the proxy's LayerNorm follows the outer recipe.

Everything is checked before any work: an unknown recipe when the rule is
made, and by :func:`check` (at quantization, over the layers found) a rule
that matched no layer.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Iterable, Mapping

from mx_proxy.numerics import recipe as recipes
from mx_proxy.numerics.recipe import Recipe

__all__ = ["Rule", "as_rules", "match", "layer_recipe", "check"]


@dataclasses.dataclass(frozen=True)
class Rule:
    """``pattern`` (an ``fnmatch`` glob over module paths) → ``recipe`` (a name or a Recipe; stored resolved).

    Raises:
      ValueError: an empty or non-string pattern, an unknown recipe (naming the valid ones).
    """

    pattern: str
    recipe: Recipe | str

    def __post_init__(self):
        if not isinstance(self.pattern, str) or not self.pattern:
            raise ValueError(f"a rule's pattern must be a non-empty glob over module paths ('*', 'block_*/fc1', "
                             f"...), got {self.pattern!r}")
        if not isinstance(self.recipe, (str, Recipe)):
            raise ValueError(f"rule {self.pattern!r}: the recipe must be a preset name or a Recipe, got "
                             f"{self.recipe!r}")
        object.__setattr__(self, "recipe", recipes.get(self.recipe))

    def matches(self, path: str) -> bool:
        return fnmatch.fnmatchcase(path, self.pattern)


def as_rules(rules) -> tuple[Rule, ...]:
    """Rules from a :class:`Rule`, a recipe alone (every layer: ``("*", recipe)``), a mapping ``{pattern:
    recipe}`` (in its order), or a sequence of Rules and ``(pattern, recipe)`` pairs.

    Raises:
      ValueError: no rule, or an entry that is none of these (naming it).
    """
    if isinstance(rules, (str, Recipe)):
        rules = [Rule("*", rules)]
    elif isinstance(rules, Rule):
        rules = [rules]
    elif isinstance(rules, Mapping):
        rules = [Rule(p, r) for p, r in rules.items()]
    elif isinstance(rules, Iterable):
        out = []
        for entry in rules:
            if isinstance(entry, Rule):
                out.append(entry)
            elif isinstance(entry, (tuple, list)) and len(entry) == 2:
                out.append(Rule(*entry))
            else:
                raise ValueError(f"a rule is a Rule or a (pattern, recipe) pair, got {entry!r}")
        rules = out
    else:
        raise ValueError(f"rules must be a recipe, a Rule, {{pattern: recipe}} or a list of rules, got {rules!r}")
    if not rules:
        raise ValueError("no rules: give at least one, e.g. [('*', 'mxfp8_e4m3')]")
    return tuple(rules)


def match(rules: tuple[Rule, ...], path: str) -> Rule | None:
    """The first rule whose pattern matches ``path``, or ``None``."""
    return next((r for r in rules if r.matches(path)), None)


def layer_recipe(rule: Rule, path: str, kind: str) -> Recipe:
    """The recipe of the layer at ``path``: the rule's recipe's first override matching the path for a GEMM
    layer (``kind`` not a normalization), else the rule's recipe."""
    return rule.recipe if kind in ("LayerNorm", "RMSNorm") else rule.recipe.for_layer(path)


def check(rules: tuple[Rule, ...], layers: Mapping[str, str]) -> None:
    """Refuse rules that matched no layer. ``layers``: path → kind of every supported layer the model has.

    Raises:
      ValueError: naming each such rule and listing the layers there are.
    """
    unmatched = [r for r in rules if not any(r.matches(p) for p in layers)]
    if not unmatched:
        return
    found = ", ".join(f"{p or '<root>'} ({k})" for p, k in layers.items()) or "none"
    names = "; ".join(f"{r.pattern!r} → {r.recipe.name}" for r in unmatched)
    raise ValueError(f"rules that match no layer: {names}. The model's quantizable layers (Dense, DenseGeneral, "
                     f"Einsum, LayerNorm, RMSNorm; Linear, LinearGeneral in NNX): {found}")
