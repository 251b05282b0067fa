"""Stochastic-rounding keys of a quantized model's layers: ``with rounding_key(key): ...``.

A recipe that rounds some GEMM operand stochastically needs a PRNG key per
layer and step. The model's source is not changed to pass one, so the key of
the step is set around the call (:func:`rounding_key`, or the ``rounding_key=``
argument of :meth:`mx_proxy.interop.linen.QuantizedModel.apply`) and each
layer derives its own from it and its module path: ``layer_key(key, path)``,
by default ``fold_in(key, crc32(path))``; the n-th further call of the same
layer within one context folds in n as well. Inside the layer the proxy's
dense layer folds in each operand's index
(:func:`mx_proxy.nn.dense.operand_key`). A bare drop-in
(:class:`~mx_proxy.interop.layers.MXDotGeneral` with no path) folds in the
count of such calls instead. Deterministic recipes read no key.

The context is read when the model is traced: open it inside the jitted
function, around the call, with the step's (traced) key.
"""

from __future__ import annotations

import contextlib
import threading
import zlib
from collections import Counter
from collections.abc import Callable

import jax

from mx_proxy.numerics.recipe import Recipe

__all__ = ["rounding_key", "key_for", "default_layer_key"]

_BARE = 0x0D07  # folded in before the call count of drop-ins that have no path
_local = threading.local()


def default_layer_key(key, path: str):
    """``fold_in(key, crc32(path))``: a layer's key, the same in every process."""
    return jax.random.fold_in(key, zlib.crc32(path.encode()) & 0x7FFFFFFF)


class _Keys:
    def __init__(self, key, layer_key: Callable | None):
        self.key, self.layer_key = key, layer_key or default_layer_key
        self.calls: Counter = Counter()


def _stack() -> list:
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


@contextlib.contextmanager
def rounding_key(key, layer_key: Callable | None = None):
    """Within the block, stochastic layers take their keys from ``key`` (module docstring); ``layer_key(key,
    path) -> key`` replaces the default derivation (e.g. to reproduce another model's folds)."""
    _stack().append(_Keys(key, layer_key))
    try:
        yield
    finally:
        _stack().pop()


def key_for(recipe: Recipe, path: str | None):
    """The key of one call of the layer at ``path`` (``None``: a bare drop-in), or ``None`` when the recipe rounds
    nothing stochastically.

    Raises:
      ValueError: a stochastic recipe outside any :func:`rounding_key` block.
    """
    if not recipe.stochastic:
        return None
    if not _stack():
        raise ValueError(f"recipe {recipe.name!r} rounds stochastically: run the model inside "
                         "`with mx_proxy.interop.rounding_key(key):` (or pass rounding_key= to apply) with the "
                         "step's PRNG key")
    ctx = _stack()[-1]
    name = path if path is not None else None
    n = ctx.calls[name]
    ctx.calls[name] += 1
    if path is None:
        return jax.random.fold_in(jax.random.fold_in(ctx.key, _BARE), n)
    key = ctx.layer_key(ctx.key, path)
    return jax.random.fold_in(key, n) if n else key
