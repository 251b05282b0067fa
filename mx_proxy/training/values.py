"""Checks of one value at the API's boundary: a Config field's on its own,
and the flags and callbacks the runner takes.

:func:`check_value` checks a value against its field's declaration (its
type from the annotation, its ``bounds=``, a name never empty); Config runs
it on every field, and a caller (``intervene``) on the fields it changes
before it does any work. A value of the wrong type is an
:class:`ArgumentTypeError`, which is a TypeError (what it is) and a
ValueError (what every other bad input of the API raises, so one ``except
ValueError`` catches all of them).
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["ArgumentTypeError", "check_value", "check_flags"]


class ArgumentTypeError(TypeError, ValueError):
    """A value of the wrong type (naming the argument and the types it
    takes): a TypeError, and a ValueError as every other bad input."""


def _wrong(name: str, what: str, v) -> ArgumentTypeError:
    return ArgumentTypeError(f"{name} must be {what}, got {v!r} ({type(v).__name__})")


def check_value(f: dataclasses.Field, v):
    """``v`` as a value of the Config field ``f``, checked on its own: its
    type, its range (``bounds=`` of its declaration) and, for a name, not
    empty; float fields normalized to a Python float (``1`` → ``1.0``, ``-0.0`` → ``0.0``)."""
    kind = str(f.type)
    if v is None and kind.endswith("| None"):
        return v
    if isinstance(v, str) and not v.strip():
        valid = f"; valid: {', '.join(f.metadata['choices'])}" if f.metadata["choices"] else ""
        raise ValueError(f"{f.name} must not be an empty string{valid}")
    if kind == "float":
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _wrong(f.name, "a number", v)
        return float(v) + 0.0
    if kind in ("str", "str | None") and not isinstance(v, str):
        raise _wrong(f.name, "a name (a string)", v)
    if kind in ("int", "int | None") and (isinstance(v, bool) or not isinstance(v, int)):
        raise _wrong(f.name, "an integer", v)
    if kind == "bool" and not isinstance(v, bool):
        raise _wrong(f.name, "True or False", v)
    bounds = f.metadata["bounds"]
    if bounds is not None and not bounds[0] <= v <= bounds[1]:
        need = "a positive" if bounds[0] == 1 else "a non-negative" if bounds[0] == 0 else "an"
        raise ValueError(f"{f.name} must be {need} integer in [{bounds[0]}, {bounds[1]}], got {v!r}")
    return v


def check_flags(on_segment=None, **flags) -> None:
    """An :class:`ArgumentTypeError` naming the first of ``flags``
    (``force=``, ``progress=``, …) that is not True or False, or an
    ``on_segment`` that is not callable."""
    for name, v in flags.items():
        if not isinstance(v, (bool, np.bool_)):
            raise _wrong(name, "True or False", v)
    if on_segment is not None and not callable(on_segment):
        raise _wrong("on_segment", "a function or None", on_segment)
