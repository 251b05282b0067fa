"""What a compiled program takes per run: the traced values of a config, derived from its field declarations.

A config's ``kind=DYNAMIC`` fields (learning rate, seeds, noise, spike
factor, number of steps) are the values a sweep varies inside one compiled
program; :class:`Dynamic` has one slot per such field, in declaration order,
named after it, and :func:`dynamic_for` fills them from the declarations: a
seed (``knob(seed=True)``) becomes the key data of ``jax.random.key(seed)``,
every other value a float32 scalar, and an optional field left ``None``
takes the value of the field its ``none_means`` names. A new dynamic field
is one ``knob`` line: its slot follows. Everything else is static: part of
the program, which :func:`static_key` keys.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import numpy as np

from mx_proxy.training.config import DYNAMIC, HOST, Config, fields_of_kind

__all__ = ["Dynamic", "dynamic_for", "static_key", "DYNAMIC_FIELDS", "HOST_FIELDS"]

# Config fields a sweep varies inside one compiled program, and those only the host loop reads
# (checkpointing; they never change the compiled program): the kinds their knob() declarations give.
DYNAMIC_FIELDS = fields_of_kind(DYNAMIC)
HOST_FIELDS = fields_of_kind(HOST)
_FIELDS = {f.name: f for f in dataclasses.fields(Config)}
for _name in DYNAMIC_FIELDS:  # a traced slot needs a value: an optional field says what None stands for
    if _FIELDS[_name].default is None and _FIELDS[_name].metadata["none_means"] is None:
        raise TypeError(f"dynamic Config field {_name!r} defaults to None: declare knob(..., none_means=FIELD)")

Dynamic = NamedTuple("Dynamic", [(name, jax.Array) for name in DYNAMIC_FIELDS])
Dynamic.__doc__ = (
    "Per-run traced values, one slot per dynamic Config field (named after it): float32 scalars, and for "
    "a seed its PRNG key data (uint32 (2,) with the default threefry implementation). A sweep stacks them "
    "along axis 0.")


def _key_data(seed: int):
    """``jax.random.key_data(jax.random.key(seed))`` for a seed in [0, 2**32):
    with the default threefry implementation that is ``[0, seed]`` (uint32),
    built on the host instead of by a tiny compiled program."""
    if jax.config.jax_default_prng_impl == "threefry2x32":
        return np.array([0, seed], np.uint32)
    return jax.random.key_data(jax.random.key(seed))


def _traced(config: Config, name: str):
    """The slot of dynamic field ``name`` (a host array: nothing is compiled to make it)."""
    meta = _FIELDS[name].metadata
    value = getattr(config, name)
    if value is None:
        value = getattr(config, meta["none_means"])
    return _key_data(value) if meta["seed"] else np.asarray(value, dtype=np.float32)


def dynamic_for(config: Config) -> Dynamic:
    """The traced values of ``config`` (host arrays: nothing is compiled to make them)."""
    return Dynamic(*(_traced(config, name) for name in DYNAMIC_FIELDS))


def static_key(config: Config) -> Config:
    """The config with every dynamic field at its default: equal keys share a Program."""
    defaults = Config()
    key = config.replace(**{f: getattr(defaults, f) for f in DYNAMIC_FIELDS + HOST_FIELDS})
    if config.reference_data_seed is not None:  # the paired run draws its own batches: a different program
        key = key.replace(reference_data_seed=0)
    return key
