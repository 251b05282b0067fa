"""A stable hash of registry entries: their names, data and code.

A compiled program depends on the entries it was traced with (an
activation's function, a scale rule's bump, an element format's numbers),
and an entry registered at run time (a notebook's activation) can change
its code under the same name, which the package's source hash
(:mod:`mx_proxy.training.code_version`) does not see. :func:`fingerprint`
hashes what an entry is made of, the same way in every process that holds
the same entries: dataclass fields in order, numbers and strings by
``repr``, functions by their bytecode, names and constants, the values
they close over and the functions of their own module that they call by
name.
Anything else counts by its type's name only (an opaque object cannot be
hashed stably across processes).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import types

import numpy as np

__all__ = ["fingerprint"]

_MAX_DEPTH = 8


def fingerprint(*registries) -> str:
    """16 hex digits over every entry of ``registries`` (each a
    :class:`~mx_proxy.numerics.registry.Registry`), in listing order."""
    h = hashlib.sha256()
    for registry in registries:
        for name, entry in registry.items():
            h.update(f"{registry.kind}\0{name}\0".encode())
            _feed(h, entry, 0, set())
    return h.hexdigest()[:16]


def _feed(h, v, depth: int, seen: set) -> None:
    if depth > _MAX_DEPTH or id(v) in seen:
        h.update(b"\0...")
        return
    if isinstance(v, (str, int, float, bool, bytes, type(None))):
        h.update(f"{type(v).__name__}:{v!r}\0".encode())
    elif isinstance(v, (np.dtype, type)):
        h.update(f"type:{v}\0".encode())
    elif isinstance(v, types.FunctionType):
        seen = seen | {id(v)}
        _feed_code(h, v.__code__)
        for cell in v.__closure__ or ():
            try:
                _feed(h, cell.cell_contents, depth + 1, seen)
            except ValueError:  # an empty cell
                h.update(b"\0empty")
        _feed(h, v.__defaults__, depth + 1, seen)
        for name in _called_names(v.__code__):  # helpers of its own module, looked up by name
            g = v.__globals__.get(name)
            if isinstance(g, types.FunctionType) and g.__module__ == v.__module__:
                _feed(h, g, depth + 1, seen)
    elif isinstance(v, functools.partial):
        for part in (v.func, v.args, v.keywords):
            _feed(h, part, depth + 1, seen)
    elif dataclasses.is_dataclass(v):
        h.update(f"{type(v).__qualname__}(\0".encode())
        for f in dataclasses.fields(v):
            h.update(f.name.encode())
            _feed(h, getattr(v, f.name), depth + 1, seen)
    elif isinstance(v, (tuple, list)):
        h.update(f"{type(v).__name__}[\0".encode())
        for x in v:
            _feed(h, x, depth + 1, seen)
    elif isinstance(v, dict):
        h.update(b"dict{\0")
        for k in sorted(v, key=repr):
            _feed(h, k, depth + 1, seen)
            _feed(h, v[k], depth + 1, seen)
    else:
        h.update(f"opaque:{type(v).__qualname__}\0".encode())


def _feed_code(h, code: types.CodeType) -> None:
    """A code object's bytecode, names and constants (not its file or line
    numbers, and not ``marshal``, whose output depends on reference counts)."""
    h.update(code.co_code)
    h.update(repr((code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars, code.co_argcount,
                   code.co_kwonlyargcount, code.co_flags)).encode())
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            _feed_code(h, c)
        else:
            h.update(_const(c).encode() + b"\0")


def _const(c) -> str:
    """A constant's text, the same in every process (a frozenset's order follows string hashing, which differs)."""
    if isinstance(c, tuple):
        return "(" + ",".join(_const(x) for x in c) + ")"
    if isinstance(c, frozenset):
        return "frozenset(" + ",".join(sorted(_const(x) for x in c)) + ")"
    return repr(c)


def _called_names(code: types.CodeType) -> set[str]:
    """The global names a code object (and the code objects nested in it) reads."""
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _called_names(c)
    return names
