"""Elementwise rounding of vector math to bfloat16, ties to even or away from
zero, with the backward rounding of the cotangent that the reference library
does (:func:`vround`), and the rounding of parameter gradients
(:func:`bf16_round`'s ``convert``). :mod:`mx_proxy.nn.layers` builds every
layer from these.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

__all__ = ["bf16_round", "vround", "round_to", "round_grad", "rounder"]


def bf16_round(x, rounding: str = "even", *, convert: bool = True):
    """float32 → nearest bfloat16 value (as float32), ties to ``"even"`` or ``"away"`` from zero.

    ``"away"`` is the reference library's ``round="nearest"`` (its
    ``_quantize_bfloat``): magnitudes past the largest bf16 become ±inf,
    bf16 subnormals are kept, NaN stays NaN (a quiet bf16 NaN, as with
    ``"even"``: float32 payload bits below bf16 are not kept).

    ``"away"`` works on the float32 bit pattern (add half an ulp of bf16 to
    the magnitude, truncate), so it is exact; its result, a bf16 value, then
    goes through a float32 → bfloat16 → float32 convert, which changes no
    value (NaN aside: a quiet NaN) but is how XLA:CPU keeps it: it stores
    a convert's result as a bf16 array that every consumer reads, while it
    fuses a bare integer round into each consumer (the MX block maxima, the
    quantizers, the transposed wgrad operands) and recomputes there the
    whole chain of vector ops before it. Without the convert,
    ``paper_e4m3``'s training step was ~1.5x the same recipe's with ties to
    even (``docs/benchmarks.md``).

    ``convert=False`` (``"away"`` only) leaves out that convert: for
    parameter gradients, which only the optimizer and the diagnostics read.
    Their fused float32 arithmetic (Adam's ``(1 - b1) g + b1 m``) is then
    compiled from the same operands as before the convert existed: LLVM
    contracts one product of a multiply-add into an FMA, and which one
    depends on the operands it reads (a bf16 array or a float32 one), which
    moves the last bit of the moments, and so every later step.
    """
    if rounding == "even":
        return x.astype(jnp.bfloat16).astype(jnp.float32)
    if rounding != "away":
        raise ValueError(f"unknown rounding {rounding!r}; valid: even, away")
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    up = jax.lax.bitcast_convert_type((bits + jnp.uint32(0x8000)) & jnp.uint32(0xFFFF0000), jnp.float32)
    up = jnp.where(jnp.isnan(x), x, up)
    return up.astype(jnp.bfloat16).astype(jnp.float32) if convert else up


def round_to(x, precision: str, rounding: str, convert: bool = True):
    """``x`` rounded to ``precision`` (``"fp32"``: unchanged; ``"bf16"``: :func:`bf16_round`, ties ``rounding``),
    without a rounded cotangent (compare :func:`vround`)."""
    return x if precision == "fp32" else bf16_round(x, rounding, convert=convert)


def round_grad(g, precision: str, rounding: str):
    """A parameter gradient rounded to ``precision`` (see ``convert`` of :func:`bf16_round`)."""
    return round_to(g, precision, rounding, convert=False)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4))
def _rounded(x, rounding: str, bwd_precision: str, bwd_rounding: str, param: bool):
    return bf16_round(x, rounding)


def _rounded_fwd(x, rounding, bwd_precision, bwd_rounding, param):
    return bf16_round(x, rounding), None


def _rounded_bwd(rounding, bwd_precision, bwd_rounding, param, _, g):
    return (round_to(g, bwd_precision, bwd_rounding, convert=not param),)


_rounded.defvjp(_rounded_fwd, _rounded_bwd)


def vround(x, precision: str, rounding: str = "even", backward: str | None = None, *, param: bool = False):
    """Round elementwise to a vector precision (``"bf16"``) or pass (``"fp32"``).

    ``rounding``: ``"even"`` or ``"away"`` (see :func:`bf16_round`).
    ``backward``: the precision its cotangent is rounded to (``None``: the
    same as the forward, with the same rounding; ``"fp32"``: untouched).
    ``param``: ``x`` is a parameter, so the rounded cotangent is its
    gradient (rounded with ``convert=False``, see :func:`bf16_round`; the
    same values).
    """
    if precision == "fp32":
        return x
    if rounding == "even" and backward in (None, precision):
        return bf16_round(x)  # the convert's own transpose rounds the cotangent the same way
    bwd = precision if backward is None else backward
    return _rounded(x, rounding, bwd, rounding, param)


def rounder(precision: str, rounding: str, backward: str | None = None):
    """:func:`vround` to ``precision`` as a one-argument function ``r(x)`` (the identity for ``"fp32"``)."""
    return functools.partial(vround, precision=precision, rounding=rounding, backward=backward)
