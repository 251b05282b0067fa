"""Recipes to and from JSON: a preset by its name, anything else field by field."""

from __future__ import annotations

import dataclasses

from mx_proxy.numerics.quantize import MXSpec
from mx_proxy.numerics.recipe import PRESETS, Recipe, get
from mx_proxy.numerics.recipe_type import OPERANDS
from mx_proxy.numerics.scale_rules import ScaleRule

__all__ = ["to_json", "from_json"]


def _spec_to_json(spec: MXSpec | None):
    """A spec's fields, its element format and scale rule by name (the form run-store keys have always hashed)."""
    if spec is None:
        return None
    out = {}
    for f in dataclasses.fields(spec):
        v = getattr(spec, f.name)
        out[f.name] = v.name if f.name == "element" or isinstance(v, ScaleRule) else v
    return out


def to_json(recipe: Recipe):
    """The preset name if ``recipe`` is an unmodified preset, else a dict."""
    if PRESETS.get(recipe.name) == recipe:
        return recipe.name
    out = {}
    for f in dataclasses.fields(recipe):
        v = getattr(recipe, f.name)
        if f.name == "overrides":
            if v:
                out[f.name] = [[p, to_json(r)] for p, r in v]
        else:
            out[f.name] = _spec_to_json(v) if isinstance(v, MXSpec) or f.name in OPERANDS + ("ln_affine",) else v
    return out


def from_json(obj) -> Recipe:
    """Inverse of :func:`to_json`."""
    if isinstance(obj, (str, Recipe)):
        return get(obj)
    if not isinstance(obj, dict):
        raise ValueError(f"cannot read a recipe from {obj!r}")
    kw = dict(obj)
    for f in OPERANDS + ("ln_affine",):
        if kw.get(f) is not None:
            kw[f] = MXSpec(**kw[f])
    if "overrides" in kw:
        kw["overrides"] = tuple((p, from_json(r)) for p, r in kw["overrides"])
    return Recipe(**kw)
