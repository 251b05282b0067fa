"""The MX GEMM kernel: ``a (M, K) @ b (N, K).T`` of two K-major :class:`MXOperand`s.

Grid: one program per (bm, bn) output tile, in grouped order
(:mod:`mx_proxy.pallas.tuning`). Each program walks K in steps of ``bk``; a step is
``bk / 32`` chunks of 32 K-elements, the unit of one E8M0 block (OCP block
size 32) and of one FP8 ``wgmma`` K-depth. Per chunk, by the configuration's
path (``GemmConfig.mma``; :func:`mma_mode` says which paths a pair allows):

* ``"fp8"`` (both operands E4M3 codes -- E4M3, FP6, and E2M1 expanded from its
  packed nibbles by a register lookup table -- or both E5M2; block sizes
  multiples of 32): the chunk's codes go straight into an FP8 ``dot`` with
  float32 accumulation, and that partial product is rescaled by the two
  blocks' E8M0 scales in float32 registers before it is added:
  ``acc += (partial * 2**sa[m]) * 2**sb[n]`` -- the fine-grained scaled-FP8
  GEMM pattern. The two multiplications by powers of two are exact as long
  as ``partial * 2**sa`` stays a normal float32: every nonzero partial lies
  in ``[2**-18, 2**23)`` (E4M3; ``[2**-32, 2**37)`` E5M2), so the A scale
  bytes must lie in [19, 231] ([33, 217]) and the B scale bytes be nonzero
  (byte 0 is the subnormal 2**-127). Per output tile, a flag computed from
  the scales before the launch says whether that holds for every chunk; if
  not, the tile takes the bf16 path below, which is exact for every scale
  (only tiles whose blocks have extreme scales pay for it).
* ``"bf16"`` (any other pair -- mixed E4M3 x E5M2, MXINT8, block sizes < 32 --
  and fp8-mode tiles with extreme scales):
  codes are converted in hardware (FP8 -> float32; MXINT8 via int -> float)
  and multiplied by their block's scale as two normal powers of two, which is
  exact (MX values have at most 8 significant bits: bf16 holds them); a bf16
  ``dot`` accumulates in float32.

Either way every product is exact and only the float32 summation order
differs from ``mxp.quantize`` + ``jnp.dot`` (in interpret mode; Hopper's FP8
tensor cores accumulate a chunk with fewer bits, see
``mx_proxy.pallas.matmul.mma_tolerance``). NaN scales (255) make their block's
products NaN, as NaN blocks do in the reference.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from mx_proxy.numerics.mx import bits as B
from mx_proxy.numerics.mx import block_scale as scale
from mx_proxy.numerics.mx import element
from mx_proxy.pallas import backend
from mx_proxy.pallas.operand import CHUNK, MXOperand, pad_operand, round_up
from mx_proxy.pallas.tuning import GemmConfig

__all__ = ["mma_mode", "tuning_mode", "FAST_A_SCALES", "gemm", "tile_order"]

FAST_A_SCALES = {"e4m3": (19, 231), "e5m2": (33, 217)}  # A scale bytes of the fast fp8 rescale (module docstring)


def mma_mode(a_dtype: str, a_bs: int, b_dtype: str, b_bs: int) -> str:
    """"fp8" or "bf16" for operands of GEMM dtypes ``a_dtype``/``b_dtype`` and
    block sizes ``a_bs``/``b_bs`` (module docstring)."""
    fp8 = {"e4m3": "e4m3", "e2m1": "e4m3", "e5m2": "e5m2"}
    same = fp8.get(a_dtype) is not None and fp8.get(a_dtype) == fp8.get(b_dtype)
    return "fp8" if same and a_bs % CHUNK == 0 and b_bs % CHUNK == 0 else "bf16"


def tuning_mode(a_dtype: str, a_bs: int, b_dtype: str, b_bs: int) -> str:
    """The :mod:`mx_proxy.pallas.tuning` mode: "fp8", "fp8_fp4" (fp8 with a packed FP4 operand) or "bf16"."""
    mode = mma_mode(a_dtype, a_bs, b_dtype, b_bs)
    return "fp8_fp4" if mode == "fp8" and "e2m1" in (a_dtype, b_dtype) else mode


def tile_order(p, gm: int, gn: int, group: int):
    """(row tile, column tile) of program ``p`` (int32 scalar) in grouped order:
    ``group`` row tiles sweep every column tile before the next group starts."""
    per_group = group * gn
    gid = p // per_group
    first = gid * group
    rows = jnp.minimum(gm - first, group)
    return first + (p % per_group) % rows, (p % per_group) // rows


class _Statics(NamedTuple):
    mode: str
    a_dtype: str
    b_dtype: str
    a_bs: int
    b_bs: int
    bk: int
    kp: int


# ----------------------------------------------------------------------------
# one 32-element K chunk of an operand


def _chunk_codes(ref, kk, c: int, bk: int, dtype: str):
    """(rows, 32) GEMM codes of chunk ``c`` of K step ``kk``: float8 straight
    from the load (E4M3/E5M2), float8 E4M3 from E2M1 nibbles (register lookup
    table), or uint8 (MXINT8)."""
    per_step = bk // CHUNK
    if dtype != "e2m1":
        start = pl.multiple_of((kk * per_step + c) * CHUNK, CHUNK)
        return ref[:, pl.ds(start, CHUNK)]
    if per_step % 2 == 0:  # the pair and the nibble are static within the step
        pair, shift = kk * (per_step // 2) + c // 2, np.uint32(4 * (c % 2))
    else:
        g = kk * per_step + c  # >= 0: halve and take parity with shifts (Pallas Triton mis-lowers int %)
        pair, shift = g >> 1, ((g & 1) * 4).astype(jnp.uint32)
    packed = ref[:, pl.ds(pl.multiple_of(pair * CHUNK, CHUNK), CHUNK)].astype(jnp.uint32)
    codes = element.e2m1_to_e4m3((packed >> shift) & np.uint32(0xF)).astype(jnp.uint8)
    return jax.lax.bitcast_convert_type(codes, jnp.float8_e4m3fn)


def _chunk_scales(ref, kk, c: int, bk: int, bs: int):
    """(rows, n) int32 E8M0 bytes of chunk ``c`` of step ``kk``: n = 1 for block
    sizes >= 32, else the 32 / bs blocks inside the chunk."""
    g = kk * (bk // CHUNK) + c
    if bs >= CHUNK:
        return ref[:, pl.ds(g // (bs // CHUNK), 1)].astype(jnp.int32)
    per = CHUNK // bs
    return ref[:, pl.ds(pl.multiple_of(g * per, per), per)].astype(jnp.int32)


def _values_bf16(codes, sbytes, dtype: str, bs: int):
    """bfloat16 values (rows, 32) of GEMM codes and their scale bytes (rows, n), exactly."""
    if dtype == "int8":
        c = codes.astype(jnp.uint32)
        v = (c & np.uint32(0x7F)).astype(jnp.float32) * np.float32(1 / 64)
        v = jnp.where(c >= 128, -v, v)
    else:
        v = codes.astype(jnp.float32)  # float8 -> float32: a hardware conversion
    e = sbytes - scale.E8M0_BIAS
    hi = e >> 1  # e = hi + lo with both in [-64, 64]: normal powers of two
    f_hi = jnp.where(sbytes == scale.E8M0_NAN, np.float32(np.nan), B.pow2_f32(hi))
    f_lo = B.pow2_f32(e - hi)
    rows, n = sbytes.shape
    if n == 1:
        v = v * f_hi * f_lo
    else:
        v = (v.reshape(rows, n, bs) * f_hi[:, :, None] * f_lo[:, :, None]).reshape(rows, CHUNK)
    return v.astype(jnp.bfloat16)


def _nt_dot(a, b):
    """float32 (rows_a, rows_b) = a @ b.T for K-major tiles."""
    return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


# ----------------------------------------------------------------------------
# the kernel


def _fp8_step(kk, acc, a_ref, as_ref, b_ref, bs_ref, *, s: _Statics):
    for c in range(s.bk // CHUNK):
        partial = _nt_dot(_chunk_codes(a_ref, kk, c, s.bk, s.a_dtype), _chunk_codes(b_ref, kk, c, s.bk, s.b_dtype))
        fa = scale.e8m0_pow2(_chunk_scales(as_ref, kk, c, s.bk, s.a_bs))  # (bm, 1)
        fb = scale.e8m0_pow2(_chunk_scales(bs_ref, kk, c, s.bk, s.b_bs)).reshape(1, -1)  # (1, bn)
        acc = acc + (partial * fa) * fb
    return acc


def _bf16_step(kk, acc, a_ref, as_ref, b_ref, bs_ref, *, s: _Statics):
    for c in range(s.bk // CHUNK):
        a = _values_bf16(_chunk_codes(a_ref, kk, c, s.bk, s.a_dtype), _chunk_scales(as_ref, kk, c, s.bk, s.a_bs),
                         s.a_dtype, s.a_bs)
        b = _values_bf16(_chunk_codes(b_ref, kk, c, s.bk, s.b_dtype), _chunk_scales(bs_ref, kk, c, s.bk, s.b_bs),
                         s.b_dtype, s.b_bs)
        acc = acc + _nt_dot(a, b)
    return acc


def _gemm_kernel(fa_ref, fb_ref, a_ref, as_ref, b_ref, bs_ref, o_ref, *, s: _Statics):
    refs = (a_ref, as_ref, b_ref, bs_ref)
    steps = s.kp // s.bk
    zero = jnp.zeros(o_ref.shape, jnp.float32)
    def bf16():
        return jax.lax.fori_loop(0, steps, lambda kk, acc: _bf16_step(kk, acc, *refs, s=s), zero)

    def fp8():
        return jax.lax.fori_loop(0, steps, lambda kk, acc: _fp8_step(kk, acc, *refs, s=s), zero)

    if s.mode == "bf16":
        acc = bf16()
    else:  # tiles with extreme scales take the bf16 path, exact there (module docstring)
        acc = jax.lax.cond((fa_ref[0] != 0) & (fb_ref[0] != 0), fp8, bf16)
    o_ref[...] = acc.astype(o_ref.dtype)


def _fast_flags(scales, tile: int, lo: int, hi: int):
    """int32 per row tile: 1 where every scale byte lies in [lo, hi] or is 255 (NaN)."""
    ok = ((scales >= lo) & (scales <= hi)) | (scales == scale.E8M0_NAN)
    return jnp.all(ok.reshape(scales.shape[0] // tile, -1), axis=1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("config", "out_dtype", "interpret"))
def gemm(a: MXOperand, b: MXOperand, config: GemmConfig, out_dtype: str = "float32", interpret: bool = False):
    """``values(a) @ values(b).T`` (M, N) in ``out_dtype``, float32 accumulation.

    Args:
      a, b: K-major operands (:class:`MXOperand`) with the same K.
      config: tiles, warps, stages, program order (:class:`GemmConfig`).
      out_dtype: "float32", "bfloat16" or "float16".
      interpret: run the kernel in the Pallas interpreter.

    Operands are padded (zeros, scale 127) to whole tiles if they are not
    already (:func:`mx_proxy.pallas.operand.quantize_operand` can write them so).
    """
    if a.k != b.k:
        raise ValueError(f"contraction sizes differ: a has K={a.k}, b has K={b.k}")
    cfg = config
    mode = cfg.mma
    if mode == "fp8" and mma_mode(a.gemm_dtype, a.block_size, b.gemm_dtype, b.block_size) != "fp8":
        raise ValueError(f"mma='fp8' needs both operands as E4M3 codes (E4M3, FP6, FP4) or both E5M2, with block "
                         f"sizes that are multiples of 32; got {a.element}/{a.block_size} x {b.element}/{b.block_size};"
                         " valid for this pair: mma='bf16'")
    kp = round_up(max(a.padded_k, b.padded_k), max(cfg.bk, 2 * CHUNK, a.block_size, b.block_size))
    mp, np_ = round_up(a.padded_rows, cfg.bm), round_up(b.padded_rows, cfg.bn)
    ad, asc = pad_operand(a, mp, kp)
    bd, bsc = pad_operand(b, np_, kp)
    gm, gn = mp // cfg.bm, np_ // cfg.bn
    if mode == "fp8":
        lo, hi = FAST_A_SCALES["e5m2" if a.gemm_dtype == "e5m2" else "e4m3"]
        fa, fb = _fast_flags(asc, cfg.bm, lo, hi), _fast_flags(bsc, cfg.bn, 1, 254)
    else:
        fa, fb = jnp.ones((gm,), jnp.int32), jnp.ones((gn,), jnp.int32)
    statics = _Statics(mode, a.gemm_dtype, b.gemm_dtype, a.block_size, b.block_size, cfg.bk, kp)

    def i_of(p):
        return tile_order(p, gm, gn, cfg.group_m)[0]

    def j_of(p):
        return tile_order(p, gm, gn, cfg.group_m)[1]

    in_specs = [
        pl.BlockSpec((1,), lambda p: (i_of(p),)),
        pl.BlockSpec((1,), lambda p: (j_of(p),)),
        pl.BlockSpec((cfg.bm, ad.shape[1]), lambda p: (i_of(p), 0)),
        pl.BlockSpec((cfg.bm, asc.shape[1]), lambda p: (i_of(p), 0)),
        pl.BlockSpec((cfg.bn, bd.shape[1]), lambda p: (j_of(p), 0)),
        pl.BlockSpec((cfg.bn, bsc.shape[1]), lambda p: (j_of(p), 0)),
    ]
    out = backend.pallas_call(
        functools.partial(_gemm_kernel, s=statics),
        out_shape=jax.ShapeDtypeStruct((mp, np_), jnp.dtype(out_dtype)),
        grid=(gm * gn,), in_specs=in_specs,
        out_specs=pl.BlockSpec((cfg.bm, cfg.bn), lambda p: tile_order(p, gm, gn, cfg.group_m)),
        interpret=interpret, num_warps=cfg.num_warps, num_stages=cfg.num_stages, name="mx_gemm",
    )(fa, fb, ad, asc, bd, bsc)
    return out[: a.rows, : b.rows]
