"""A drop-in ``jax.lax.dot_general`` for a recipe: the proxy's dense layer on any dimension numbers.

``mx_dot_general(lhs, rhs, dimension_numbers, recipe)`` computes what
``jax.lax.dot_general`` computes, with the recipe's three quantized GEMMs:
``lhs`` plays the dense layer's input x, ``rhs`` its kernel W
(:mod:`mx_proxy.numerics.operands`). Both operands are brought to the
canonical form of a batched matrix product (a transpose and a reshape, both
differentiated by JAX as themselves):

* ``lhs`` → ``a`` of shape (B, M, K): its batch axes, then its free axes, then its contracting axes;
* ``rhs`` → ``b`` of shape (B, K, N): its batch axes, its contracting axes (in the order the
  dimension numbers pair them with the lhs's), then its free axes;

so K is the flattened contraction (the MX blocks run along it), M the
flattened free axes of the lhs (the wgrad GEMM contracts over them: "the
batch" of a dense layer) and N those of the rhs (the dgrad GEMM's
contraction: "out-features"). Each of the B products is
:func:`mx_proxy.nn.dense.mx_dense` itself (its ``custom_vjp``: forward
``fwd_x``/``fwd_w`` along K, dgrad ``dgrad_g``/``dgrad_w`` along N, wgrad
``wgrad_x``/``wgrad_g`` along M, vector rounding of every GEMM input and
output), so a 2-D product ``x (M, K) · W (K, N)`` is the dense layer's bit
for bit, and a batched one (B > 1) is ``jax.vmap`` of it, with the
stochastic-rounding key of product i ``fold_in(key, i)``. The result has
``jax.lax.dot_general``'s layout (batch, lhs free, rhs free), float32.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from mx_proxy.nn.dense import mx_dense
from mx_proxy.numerics.recipe import Recipe

__all__ = ["Canonical", "canonical", "mx_dot_general", "to_canonical", "from_canonical", "core"]


class Canonical(NamedTuple):
    """How one ``dot_general`` maps onto (B, M, K) × (B, K, N): the permutations of both operands and the shapes
    of the batch, lhs-free, rhs-free and contracting axes (the lhs's order)."""

    lhs_perm: tuple[int, ...]
    rhs_perm: tuple[int, ...]
    batch: tuple[int, ...]
    lhs_free: tuple[int, ...]
    rhs_free: tuple[int, ...]
    contract: tuple[int, ...]

    @property
    def sizes(self) -> tuple[int, int, int, int]:
        """(B, M, K, N)."""
        return tuple(math.prod(s) for s in (self.batch, self.lhs_free, self.contract, self.rhs_free))


def _axes(value, ndim: int, what: str, dn) -> tuple[int, ...]:
    try:
        axes = tuple(int(a) for a in value)
    except TypeError:
        raise ValueError(f"dimension numbers {dn!r}: {what} must be a sequence of axes, got {value!r}") from None
    for a in axes:
        if not -ndim <= a < ndim:
            raise ValueError(f"dimension numbers {dn!r}: {what} axis {a} is out of range for an operand of rank "
                             f"{ndim} (valid: {-ndim} … {ndim - 1})")
    axes = tuple(a % ndim for a in axes)
    if len(set(axes)) != len(axes):
        raise ValueError(f"dimension numbers {dn!r}: {what} names an axis twice ({axes})")
    return axes


def canonical(dimension_numbers, lhs_shape, rhs_shape) -> Canonical:
    """The :class:`Canonical` form of a ``dot_general`` of operands of these shapes.

    Raises:
      ValueError: malformed dimension numbers (naming the bad value and what is
        valid), paired axes of different sizes, or no contracting axis at all
        (an outer product: MX blocks run along a contracting axis, and there is none).
    """
    dn = dimension_numbers
    try:
        (lc, rc), (lb, rb) = dn
    except (TypeError, ValueError):
        raise ValueError(f"dimension numbers must be ((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch)), "
                         f"got {dn!r}") from None
    nl, nr = len(lhs_shape), len(rhs_shape)
    lc, lb = _axes(lc, nl, "lhs contracting", dn), _axes(lb, nl, "lhs batch", dn)
    rc, rb = _axes(rc, nr, "rhs contracting", dn), _axes(rb, nr, "rhs batch", dn)
    for side, c, b in (("lhs", lc, lb), ("rhs", rc, rb)):
        if set(c) & set(b):
            raise ValueError(f"dimension numbers {dn!r}: {side} axes {sorted(set(c) & set(b))} are both contracting "
                             "and batch axes")
    for what, a, b in (("contracting", lc, rc), ("batch", lb, rb)):
        if len(a) != len(b):
            raise ValueError(f"dimension numbers {dn!r}: {len(a)} lhs {what} axes against {len(b)} rhs ones")
        for i, j in zip(a, b):
            if lhs_shape[i] != rhs_shape[j]:
                raise ValueError(f"dimension numbers {dn!r}: lhs {what} axis {i} has size {lhs_shape[i]}, the rhs "
                                 f"axis {j} it pairs with {rhs_shape[j]}")
    if not lc:
        raise ValueError(f"dimension numbers {dn!r} contract no axis (an outer product): MX blocks run along a "
                         "contracting axis, so this product cannot be quantized; leave it out of the rules")
    lf = tuple(i for i in range(nl) if i not in lc + lb)
    rf = tuple(i for i in range(nr) if i not in rc + rb)
    return Canonical(lb + lf + lc, rb + rc + rf, tuple(lhs_shape[i] for i in lb), tuple(lhs_shape[i] for i in lf),
                     tuple(rhs_shape[i] for i in rf), tuple(lhs_shape[i] for i in lc))


def to_canonical(lhs, rhs, c: Canonical):
    """(a (B, M, K), b (B, K, N)) float32."""
    b_, m, k, n = c.sizes
    a = jnp.transpose(jnp.asarray(lhs, jnp.float32), c.lhs_perm).reshape(b_, m, k)
    b = jnp.transpose(jnp.asarray(rhs, jnp.float32), c.rhs_perm).reshape(b_, k, n)
    return a, b


def from_canonical(y, c: Canonical):
    """The (B, M, N) product in ``dot_general``'s layout: batch, lhs free, rhs free."""
    return y.reshape(c.batch + c.lhs_free + c.rhs_free)


def core(a, b, recipe: Recipe, key=None):
    """(B, M, N) = the B products ``a[i] @ b[i]``, each :func:`~mx_proxy.nn.dense.mx_dense` (no bias)."""
    if a.shape[0] == 1:
        return mx_dense(a[0], b[0], None, recipe, key)[None]
    if key is None:
        return jax.vmap(lambda x, w: mx_dense(x, w, None, recipe))(a, b)
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(a.shape[0], dtype=jnp.uint32))
    return jax.vmap(lambda x, w, k: mx_dense(x, w, None, recipe, k))(a, b, keys)


def _floating(x, name: str):
    dtype = jnp.result_type(x)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"mx_dot_general: {name} must be a floating-point array, got dtype {dtype}")


def mx_dot_general(lhs, rhs, dimension_numbers, recipe: Recipe, key=None, *, observe=None):
    """``jax.lax.dot_general(lhs, rhs, dimension_numbers)`` with the recipe's MX GEMMs (module docstring).

    Args:
      lhs, rhs: floating-point arrays (computed in float32; lhs takes the
        recipe's x specs, rhs its W specs).
      dimension_numbers: ``((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch))``.
      recipe: a :class:`~mx_proxy.numerics.recipe.Recipe` (its overrides are not
        consulted here: :mod:`mx_proxy.interop.rules` picks a layer's recipe).
      key: PRNG key of this product, required when the recipe rounds stochastically.
      observe: ``observe(a, b, y) -> y`` on the canonical operands and product,
        or ``None`` (:mod:`mx_proxy.interop.capture` records and perturbs there).

    Returns:
      float32 array of ``dot_general``'s shape.
    """
    _floating(lhs, "lhs")
    _floating(rhs, "rhs")
    c = canonical(dimension_numbers, jnp.shape(lhs), jnp.shape(rhs))
    a, b = to_canonical(lhs, rhs, c)
    y = core(a, b, recipe, key)
    if observe is not None:
        y = observe(a, b, y)
    return from_canonical(y, c)
