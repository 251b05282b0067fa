"""The argument checks of the MX matmul entry points (:mod:`mx_proxy.pallas.matmul`): operand layouts, output
dtypes, matrix shapes and contraction sizes, the GEMM configuration a call runs with, and prequantized codes and
scales (their dtypes, their block size read off the shapes). Each raises a ValueError naming the valid choices."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mx_proxy.numerics import formats as _formats
from mx_proxy.pallas import backend
from mx_proxy.pallas.supported import MX_FORMATS
from mx_proxy.pallas.tuning import GemmConfig, config_for

__all__ = ["A_LAYOUTS", "B_LAYOUTS", "OUT_DTYPES", "check_choice", "check_out_dtype", "check_matrix", "k_axis",
           "sizes", "check_mnk", "resolve_config", "as_code_bytes", "as_scale_bytes", "block_size_of", "check_scaled"]

A_LAYOUTS = ("mk", "km")  # a as (M, K) [lax.scaled_dot] or (K, M)
B_LAYOUTS = ("kn", "nk")  # b as (K, N) [lax.scaled_dot] or K-major (N, K) [jax.nn.scaled_matmul]
OUT_DTYPES = ("float32", "bfloat16", "float16")


def check_choice(value, valid, what):
    if value not in valid:
        raise ValueError(f"{what} {value!r} is not supported; valid: {', '.join(map(repr, valid))}")
    return value


def check_out_dtype(out_dtype) -> str:
    try:
        name = jnp.dtype(out_dtype).name
    except TypeError:
        name = repr(out_dtype)
    return check_choice(name, OUT_DTYPES, "out_dtype")


def check_matrix(x, what):
    x = jnp.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"{what} must be a matrix (rank 2), got shape {tuple(x.shape)}")
    return x


def k_axis(layout: str) -> int:
    """Axis of K in an operand stored in ``layout`` ("mk", "km", "kn", "nk")."""
    return layout.index("k")


def sizes(x, layout: str) -> tuple[int, int]:
    """(non-contracted size, K) of an operand stored in ``layout``."""
    ka = k_axis(layout)
    return x.shape[1 - ka], x.shape[ka]


def check_mnk(a, b, a_layout, b_layout, what=("a", "b")) -> tuple[int, int, int]:
    (m, k), (n, kb) = sizes(a, a_layout), sizes(b, b_layout)
    if k != kb:
        raise ValueError(f"contraction sizes differ: {what[0]} {tuple(a.shape)} (a_layout={a_layout!r}, K={k}), "
                         f"{what[1]} {tuple(b.shape)} (b_layout={b_layout!r}, K={kb})")
    return m, n, k


def resolve_config(m: int, n: int, k: int, mode: str, interpret: bool, block_sizes=None,
                   config: GemmConfig | None = None) -> GemmConfig:
    """The GEMM configuration: ``config`` as given, else the tuned one for the
    shape (:func:`mx_proxy.pallas.tuning.config_for`) with ``block_sizes=(bm, bn, bk)``
    replacing its tiles if given.

    Raises:
      ValueError: bad ``block_sizes`` / ``config`` (naming the valid choices).
    """
    if config is not None:
        if not isinstance(config, GemmConfig):
            raise ValueError(f"config must be an mx_proxy.pallas.tuning.GemmConfig or None, got "
                             f"{type(config).__name__}")
        return config
    cfg = config_for(m, n, k, mode, interpret)
    if block_sizes is None:
        return cfg
    if not (isinstance(block_sizes, (tuple, list)) and len(block_sizes) == 3):
        raise ValueError(f"block_sizes must be (bm, bn, bk) or None, got {block_sizes!r}")
    return cfg.replace(bm=block_sizes[0], bn=block_sizes[1], bk=block_sizes[2])


_CODE_DTYPES = {"fp8_e4m3": jnp.float8_e4m3fn, "fp8_e5m2": jnp.float8_e5m2}


def as_code_bytes(codes, fmt, what):
    codes = check_matrix(codes, what)
    if codes.dtype == jnp.uint8:
        return codes
    if fmt.name in _CODE_DTYPES and codes.dtype == _CODE_DTYPES[fmt.name]:
        return jax.lax.bitcast_convert_type(codes, jnp.uint8)
    valid = ["uint8"] + ([jnp.dtype(_CODE_DTYPES[fmt.name]).name] if fmt.name in _CODE_DTYPES else [])
    raise ValueError(f"{what} for {fmt.name} must have dtype {' or '.join(valid)} (codes one per byte, see "
                     f"mx_proxy.pallas.quantize), got {codes.dtype}")


def as_scale_bytes(scales, what):
    scales = check_matrix(scales, what)
    if scales.dtype == jnp.uint8:
        return scales
    if scales.dtype == jnp.float8_e8m0fnu:
        return jax.lax.bitcast_convert_type(scales, jnp.uint8)
    raise ValueError(f"{what} must be E8M0 bytes: dtype uint8 or float8_e8m0fnu, got {scales.dtype}")


def block_size_of(codes, scales, layout: str, what: str) -> int:
    """Block size of a packed operand from its code and scale shapes (same layout, K divided)."""
    other, k = sizes(codes, layout)
    s_other, k_scales = sizes(scales, layout)
    expect = "(K/block, {0})" if k_axis(layout) == 0 else "({0}, K/block)"
    if s_other != other:
        raise ValueError(f"{what} must be {expect.format(other)} for layout {layout!r}, got {tuple(scales.shape)}")
    if k_scales == 0 or k % k_scales or not backend.is_pow2(k // k_scales):
        raise ValueError(f"{what}: K={k} codes with {k_scales} scales per row/column; K must be a "
                         "power-of-two multiple of the scale count (block sizes 1, 2, 4, ..., 32, ...)")
    return k // k_scales


def check_scaled(a_codes, a_scales, b_codes, b_scales, a_format, b_format, a_layout, b_layout):
    a_fmt = _formats.get(a_format)
    b_fmt = _formats.get(b_format)
    for f, what in ((a_fmt, "a_format"), (b_fmt, "b_format")):
        check_choice(f.name, MX_FORMATS, what)
    check_choice(a_layout, A_LAYOUTS, "a_layout")
    check_choice(b_layout, B_LAYOUTS, "b_layout")
    ac, asc = as_code_bytes(a_codes, a_fmt, "a_codes"), as_scale_bytes(a_scales, "a_scales")
    bc, bsc = as_code_bytes(b_codes, b_fmt, "b_codes"), as_scale_bytes(b_scales, "b_scales")
    mnk = check_mnk(ac, bc, a_layout, b_layout, what=("a_codes", "b_codes"))
    a_bs = block_size_of(ac, asc, a_layout, "a_scales")
    b_bs = block_size_of(bc, bsc, b_layout, "b_scales")
    return a_fmt, b_fmt, ac, asc, bc, bsc, a_bs, b_bs, mnk
