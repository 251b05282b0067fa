"""A two-operand ``einsum`` for a recipe, as one :func:`~mx_proxy.interop.dot_general.mx_dot_general`.

``jnp.einsum`` may swap its operands when it calls ``dot_general`` (it
tries both orders to save a transpose), which would give the kernel the
recipe's activation specs. :func:`mx_einsum` keeps the order the equation
writes: the first operand is x, the second W. An index in both operands and
in the output is a batch axis, one in both but not in the output is
contracted (the MX blocks run along the contracted indices, flattened in
the first operand's order), the rest are free axes. ``...`` stands for the
same leading or trailing axes in each place it appears (as NumPy's einsum).
"""

from __future__ import annotations

import string

import jax.numpy as jnp

from mx_proxy.interop.dot_general import mx_dot_general
from mx_proxy.numerics.recipe import Recipe

__all__ = ["parse", "mx_einsum"]


def _expand(term: str, ndim: int, fill: str, equation: str) -> str:
    if "..." not in term:
        if len(term) != ndim:
            raise ValueError(f"einsum {equation!r}: term {term!r} names {len(term)} axes for an operand of rank {ndim}")
        return term
    head, tail = term.split("...", 1)
    if "..." in tail:
        raise ValueError(f"einsum {equation!r}: term {term!r} has more than one '...'")
    n = ndim - len(head) - len(tail)
    if n < 0:
        raise ValueError(f"einsum {equation!r}: term {term!r} names more axes than its operand's {ndim}")
    return head + fill[len(fill) - n:] + tail if n else head + tail


def parse(equation: str, lhs_ndim: int, rhs_ndim: int):
    """(dimension numbers, output permutation) of a two-operand einsum: ``jnp.transpose(dot_general(lhs, rhs,
    dims), perm)`` is the einsum. Raises ValueError (naming the equation) for what it does not support: not two
    operands, an implicit output, an index repeated within a term, an index only one operand has that the output
    drops (a sum outside the GEMM), or an output index neither operand has."""
    eq = equation.replace(" ", "")
    if "->" not in eq or eq.count(",") != 1:
        raise ValueError(f"einsum {equation!r}: mx_einsum takes an explicit two-operand equation 'ab,bc->ac'")
    ins, out = eq.split("->")
    left, right = ins.split(",")
    used = set(eq) - set(".,->")
    bad = sorted(ch for ch in used if ch not in string.ascii_letters)
    if bad:
        raise ValueError(f"einsum {equation!r}: indices must be letters, got {bad}")
    fill = "".join(ch for ch in string.ascii_letters if ch not in used)
    lhs, rhs = _expand(left, lhs_ndim, fill, equation), _expand(right, rhs_ndim, fill, equation)
    n_out = max(len(lhs) - len(left.replace("...", "")), len(rhs) - len(right.replace("...", "")))
    out = _expand(out, len(out.replace("...", "")) + n_out, fill, equation) if "..." in out else out
    for term in (lhs, rhs, out):
        if len(set(term)) != len(term):
            raise ValueError(f"einsum {equation!r}: an index repeats within {term!r} (a trace or a diagonal)")
    for ch in out:
        if ch not in lhs and ch not in rhs:
            raise ValueError(f"einsum {equation!r}: output index {ch!r} is in neither operand")
    for term, other in ((lhs, rhs), (rhs, lhs)):
        dropped = [ch for ch in term if ch not in other and ch not in out]
        if dropped:
            raise ValueError(f"einsum {equation!r}: indices {dropped} of one operand are summed out before the "
                             "product (not a GEMM's contraction); sum them first")
    batch = [ch for ch in lhs if ch in rhs and ch in out]
    contract = [ch for ch in lhs if ch in rhs and ch not in out]
    dims = ((tuple(lhs.index(c) for c in contract), tuple(rhs.index(c) for c in contract)),
            (tuple(lhs.index(c) for c in batch), tuple(rhs.index(c) for c in batch)))
    produced = batch + [ch for ch in lhs if ch not in rhs] + [ch for ch in rhs if ch not in lhs]
    return dims, tuple(produced.index(ch) for ch in out)


def mx_einsum(equation: str, lhs, rhs, recipe: Recipe, key=None, *, observe=None):
    """``jnp.einsum(equation, lhs, rhs)`` with the recipe's MX GEMMs (lhs: x, rhs: W; module docstring).
    ``key``, ``observe``: as :func:`~mx_proxy.interop.dot_general.mx_dot_general`."""
    dims, perm = parse(equation, jnp.ndim(lhs), jnp.ndim(rhs))
    return jnp.transpose(mx_dot_general(lhs, rhs, dims, recipe, key, observe=observe), perm)
