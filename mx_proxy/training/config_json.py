"""A :class:`~mx_proxy.training.config.Config` as JSON, and its hash (the run store's key).

The dict holds every field (recipes as their preset name when unmodified
presets, :func:`mx_proxy.numerics.recipe_json.to_json`), plus the
:data:`SCHEMA` version; the hash is the first 16 hex digits of the SHA-256 of
its JSON with sorted keys.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from mx_proxy.numerics import recipe_json

__all__ = ["SCHEMA", "to_dict", "from_dict", "to_json", "config_hash"]

SCHEMA = 2
"""Part of every config's hash: bump it when a field's meaning changes.

New fields keep every existing key: a field added after schema 2 is declared
``knob(..., keyed_when_set=True)`` and enters :func:`to_dict` (and so the
JSON, the hash and the run store's key) only when set away from its default.
A config that leaves it at its default has the dict, hash and key it had
before the field existed, and :func:`from_dict` gives a missing field its
default. (Fields of schema 2 are always in the dict.)"""


def to_dict(config) -> dict[str, Any]:
    """JSON-safe dict of every field (a ``keyed_when_set`` field only when
    set away from its default) plus the ``schema`` version; recipes are their
    preset name when unmodified presets."""
    d = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
         if not (f.metadata["keyed_when_set"] and getattr(config, f.name) == f.default)}
    d["recipe"] = recipe_json.to_json(config.recipe)
    d["reference_recipe"] = recipe_json.to_json(config.reference_recipe)
    d["controller"] = None if config.controller is None else config.controller.to_dict()
    d["checkpoint_at"] = list(config.checkpoint_at)
    d["schema"] = SCHEMA
    return d


def from_dict(cls, d: dict[str, Any]):
    """The ``cls`` (Config) of a :func:`to_dict` dict; fields missing from an older dict take their defaults."""
    d = dict(d)
    d.pop("schema", None)
    if "checkpoint_at" in d:
        d["checkpoint_at"] = tuple(d["checkpoint_at"])
    for name in ("recipe", "reference_recipe"):
        if name in d:
            d[name] = recipe_json.from_json(d[name])
    return cls(**d)


def to_json(config) -> str:
    """:func:`to_dict` as JSON with sorted keys."""
    return json.dumps(to_dict(config), sort_keys=True)


def config_hash(config) -> str:
    """A stable 16-hex-digit key of the full config (and the schema version)."""
    return hashlib.sha256(to_json(config).encode()).hexdigest()[:16]
