"""How a :class:`~mx_proxy.training.config.Config` field is declared: :func:`knob` and the field kinds.

A field's declaration is the one place that says what it is; the engine's
static key and traced values (:mod:`mx_proxy.training.dynamic`), the
interventions, the CLI's options, the serialization
(:mod:`mx_proxy.training.config_json`) and the docs read it from the field's
``metadata``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["knob", "STATIC", "DYNAMIC", "HOST", "KINDS"]

STATIC = "static"    # part of the compiled program: runs that differ in it compile apart
DYNAMIC = "dynamic"  # a traced value: a sweep varies it inside one compiled program
HOST = "host"        # read by the host loop only (checkpointing): never changes the program or the numbers
KINDS = (STATIC, DYNAMIC, HOST)


def knob(default: Any, doc: str, *, kind: str = STATIC, choices: tuple[str, ...] | None = None,
         intervene: bool = False, bounds: tuple[int, int] | None = None, seed: bool = False,
         none_means: str | None = None, keyed_when_set: bool = False) -> Any:
    """Declare one Config field: everything else about it is derived from this.

    Args:
      default: its value when not given.
      doc: one line on what it sets (``--help``, ``FIELD_DOCS``, Config's docstring).
      kind: :data:`STATIC`, :data:`DYNAMIC` or :data:`HOST` (the engine's static key and
        traced values, ``fields_of_kind``).
      choices: its valid names, where it is one of a list (checked by Config,
        listed by the CLI); a recipe field also takes a ``Recipe``.
      intervene: whether :func:`mx_proxy.intervene` may change it when it
        continues a run from a checkpoint (model, data and seeds may not).
      bounds: ``(lowest, highest)`` valid value of an integer field (checked
        by Config, printed by ``--help``): a value beyond them is refused
        before any work, never traced, allocated or trained for ever.
      seed: a PRNG seed: a dynamic one enters the compiled program as the
        key data of ``jax.random.key(seed)`` (other dynamic fields as float32 scalars).
      none_means: for an optional field, the field whose value ``None``
        stands for (the paired run's seeds default to the student's).
      keyed_when_set: the field was added after schema 2 (every field added
        since must say so): the config's dict, and with it its hash and run-store
        key, holds it only when it is set away from ``default``, so adding it
        changed no existing config's key (:data:`mx_proxy.training.config_json.SCHEMA`).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown field kind {kind!r}; valid: {', '.join(KINDS)}")
    return dataclasses.field(default=default, metadata={
        "doc": doc, "kind": kind, "choices": choices, "intervene": intervene, "bounds": bounds, "seed": seed,
        "none_means": none_means, "keyed_when_set": keyed_when_set})
