"""Tile-level wrappers through which every kernel body (and the host side) calls the shared MX arithmetic of
:mod:`mx_proxy.numerics.mx`: quantize a tile whose block axis holds whole blocks, encode its elements and scales as
bytes, decode bytes back to float32. Nothing is re-implemented here: these are the very functions ``mxp.quantize``
runs under XLA (:mod:`mx_proxy.numerics.mx.block_scale` for the scale, :mod:`mx_proxy.numerics.mx.element` for
rounding and codes), applied to one tile."""

from __future__ import annotations

import jax.numpy as jnp

from mx_proxy.numerics.formats import ElementFormat
from mx_proxy.numerics.mx import bits as B
from mx_proxy.numerics.mx import block_scale as scale
from mx_proxy.numerics.mx import element
from mx_proxy.numerics.mx.layout import split_blocks
from mx_proxy.numerics.quantize import MXSpec

__all__ = ["quantize_tile", "fake_quantize_tile", "encode_tile", "scale_bytes", "decode_tile"]


def quantize_tile(x, spec: MXSpec, axis: int):
    """MX-quantize a tile whose ``axis`` holds whole blocks.

    Args:
      x: float array (cast to float32), ``x.shape[axis] % spec.block_size == 0``.
      spec: deterministic :class:`MXSpec`.
      axis: block axis (non-negative).

    Returns:
      ``(q, e, nan)``: q the uint32 bits of the fake-quantized float32 values
      (x's shape; exactly ``mxp.quantize``'s bits), and per block the int32
      exponent e and the bool NaN flag, both shaped like the blocked view
      ``x.shape[:axis] + (blocks, 1) + x.shape[axis+1:]``.
    """
    fmt = spec.element
    bits = split_blocks(B.b32(x.astype(jnp.float32)), axis, spec.block_size)
    a = bits & B.ABS
    e, nan = scale.block_exponent(jnp.max(a, axis=axis + 1, keepdims=True), fmt, spec.scale_rule)
    blk = scale.block_quantities(e, nan, fmt)
    q = element.quantize_magnitudes(bits, a, blk, fmt, spec.rounding)
    return q.reshape(x.shape), e, nan


def fake_quantize_tile(x, spec: MXSpec, axis: int):
    """float32 values of :func:`quantize_tile` (what ``mxp.quantize`` returns)."""
    return B.f32(quantize_tile(x, spec, axis)[0])


def encode_tile(q, e, nan, fmt: ElementFormat, axis: int, block_size: int):
    """Element codes (uint8, ml_dtypes layout) of quantized bits ``q`` with
    block exponents ``e`` and NaN flags ``nan`` as returned by :func:`quantize_tile`."""
    code = element.encode(split_blocks(q, axis, block_size), e, nan, fmt)
    return code.astype(jnp.uint8).reshape(q.shape)


def scale_bytes(e, nan):
    """E8M0 bytes (uint8) of block exponents: ``e + 127``, or 255 for a NaN block."""
    return scale.e8m0_bytes(e, nan)


def decode_tile(codes, scales, fmt: ElementFormat, axis: int, block_size: int):
    """Exact float32 values of packed codes (any uint8 tile) and their scales.

    Args:
      codes: uint8 tile, ``codes.shape[axis] % block_size == 0``.
      scales: uint8 E8M0 bytes, codes' shape with ``axis`` divided by block_size.
      fmt: element format of the codes.

    Returns:
      float32 array of codes' shape.
    """
    c = split_blocks(codes, axis, block_size)
    bits = element.decode(c, jnp.expand_dims(scales, axis + 1), fmt)
    return B.f32(bits).reshape(codes.shape)

