"""A transposed copy that XLA:CPU computes as its own loop.

The bf16 wgrad GEMM needs its first operand transposed in memory, or, for
a layer that narrows, its second operand and its float32 product (see
:func:`mx_proxy.nn.dense.quantized_matmul`). XLA:CPU fuses the operand's
producer, here the MX quantizer's element loop, into that transposing
copy, and a loop whose output is transposed is not vectorized: the whole
quantizer then runs one element at a time. On an Intel Xeon with AMX, a
(2048, 2048) bf16 operand took 12.4 ms that way, against 2.6 ms for the
quantizer's own vectorized loop followed by a plain transposed copy.

:func:`transposed_copy` keeps the two loops apart. XLA cannot fuse across a
conditional, and the value the copy reads must be materialized as the
conditional's operand, so the copy is a ``lax.cond`` whose two branches
are the same copy, taken on a predicate XLA cannot fold (the first element
equals itself: false only for a NaN, where the other, identical, branch
runs). ``jax.lax.optimization_barrier`` does not do this on XLA:CPU, which
removes the barriers before it fuses. Under ``vmap`` a cond with a batched
predicate would become a select of both branches, fused again, so the
batching rule (``custom_vmap``) copies the whole batched array with one
unbatched predicate. It is linear, and differentiates as a transpose.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.layout import Layout, with_layout_constraint

__all__ = ["transposed_copy"]


def _copy(x):
    """``x`` with its last two axes swapped, stored row-major."""
    return with_layout_constraint(jnp.swapaxes(x, -1, -2), Layout(major_to_minor=tuple(range(x.ndim))))


@jax.custom_batching.custom_vmap
def _separate_copy(x):
    first = x.reshape(-1)[0]
    return jax.lax.cond(first == first, _copy, _copy, x)


@_separate_copy.def_vmap
def _separate_copy_vmap(axis_size, in_batched, x):
    return _separate_copy(x), in_batched[0]


@jax.custom_jvp
def transposed_copy(x):
    """``x`` (rank >= 2) with its last two axes
    swapped, as a row-major array computed by a loop of its own (the module
    docstring says why). Values and bits are exactly ``jnp.swapaxes(x, -1, -2)``."""
    return _separate_copy(x) if x.size else _copy(x)


@transposed_copy.defjvp
def _transposed_copy_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return transposed_copy(x), jnp.swapaxes(t, -1, -2)
