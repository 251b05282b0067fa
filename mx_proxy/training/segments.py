"""A segment of training steps: one compiled loop over one step body, whatever its length."""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["run_steps", "nan_like"]


def run_steps(step, state, start, n, size: int):
    """``n`` steps of ``step(state, t) -> (state, metrics)`` from step
    ``start`` (both traced int32, 0 ≤ ``n`` ≤ ``size``), one after another in
    a loop whose trip count is traced: the segments of every length a run
    needs (to the next validation step, a checkpoint, the end) share one
    compiled program per ``size`` (the config's ``chunk``), and with it one
    compiled step body. Returns the new state and each metric stacked over
    ``size`` rows, the first ``n`` of them the steps' (the rest NaN, or 0
    for integer metrics)."""
    shapes = jax.eval_shape(step, state, start)[1]
    rows = jax.tree.map(lambda a: jnp.full((size, *a.shape), jnp.nan if jnp.issubdtype(a.dtype, jnp.floating) else 0,
                                           a.dtype), shapes)

    def body(i, carry):
        s, rows = carry
        s, m = step(s, start + i)
        return s, jax.tree.map(lambda r, v: jax.lax.dynamic_update_index_in_dim(r, v, i, 0), rows, m)

    return jax.lax.fori_loop(0, n, body, (state, rows))


def nan_like(shapes):
    """NaN arrays of the shapes and dtypes ``shapes`` (a pytree of ``ShapeDtypeStruct``):
    the diagnostic metrics of a non-diagnostic step."""
    return jax.tree.map(lambda a: jnp.full(a.shape, jnp.nan, a.dtype), shapes)
