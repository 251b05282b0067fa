"""The recoverable units a stability controller watches (:mod:`mx_proxy.training.controllers`): two per residual
block, its normalization before its GEMMs, ``("block_0/ln", "block_0/gemm", "block_1/ln", ...)``
(:func:`unit_names`), and the gradient norm of each, from the student's gradient pytree through
:data:`PARAM_UNITS` (:func:`unit_norms`)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["UNIT_KINDS", "PARAM_UNITS", "unit_names", "unit_norms"]

UNIT_KINDS = ("ln", "gemm")
PARAM_UNITS = {"ln_gain": "ln", "ln_bias": "ln", "alpha": "ln",
               "fc1": "gemm", "fc2": "gemm", "fc2_bias": "gemm", "s_u": "gemm"}

_BLOCK = re.compile(r"^block_(\d+)$")


def unit_names(depth: int) -> tuple[str, ...]:
    """("block_0/ln", "block_0/gemm", "block_1/ln", …): U = 2·depth units."""
    if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or depth < 1:
        raise ValueError(f"depth must be a positive integer, got {depth!r}")
    return tuple(f"block_{i}/{kind}" for i in range(depth) for kind in UNIT_KINDS)


def _blocks(grads) -> list[str]:
    found = sorted((int(m.group(1)), k) for k in grads if (m := _BLOCK.match(str(k))))
    if not found:
        raise ValueError(f"no 'block_<i>' entries in the gradient tree (keys: {sorted(map(str, grads))})")
    if [i for i, _ in found] != list(range(len(found))):
        raise ValueError(f"blocks must be numbered 0 … depth-1, got {[k for _, k in found]}")
    return [k for _, k in found]


def unit_norms(grads) -> jax.Array:
    """(U,) float32 gradient norms per unit, in :func:`unit_names` order, from
    the student's ``{"block_i": {param: array}}`` gradients. Other top-level
    keys (e.g. "head") are ignored; a parameter name outside
    :data:`PARAM_UNITS` raises a ValueError. A unit without parameters has
    norm 0."""
    out = []
    for key in _blocks(grads):
        sq = {kind: jnp.float32(0) for kind in UNIT_KINDS}
        for name, sub in grads[key].items():
            if name not in PARAM_UNITS:
                raise ValueError(f"unknown parameter {name!r} in {key}; valid: {', '.join(PARAM_UNITS)}")
            kind = PARAM_UNITS[name]
            for leaf in jax.tree.leaves(sub):
                sq[kind] = sq[kind] + jnp.sum(jnp.square(jnp.asarray(leaf, jnp.float32)))
        out.extend(jnp.sqrt(sq[kind]) for kind in UNIT_KINDS)
    return jnp.stack(out)
