"""The MX GEMM as a Mosaic GPU kernel for Hopper: ``a (M, K) @ b (N, K).T`` of two prequantized :class:`MXOperand` s.

Same inputs and output as :func:`mx_proxy.pallas.matmul.mx_gemm` (element codes
plus one E8M0 scale per block of K), strategy (a) of issue 61: codes and
scales are fed by TMA through a ``max_concurrent_steps``-deep
``plgpu.emit_pipeline`` over K, dequantized to bfloat16 in registers
(``code * 2**(scale - 127)``), and multiplied by bf16 ``wgmma`` into a float32
accumulator. Per pipeline step of ``bk`` K-elements and per 32-element chunk
``c`` of it (one E8M0 block; OCP block size 32):

* A's chunk ``(bm, 32)`` codes and B's ``(bn, 32)`` codes arrive in shared
  memory (one TMA each; 32-byte swizzle), and the step's scale bytes as
  ``(bk / 32, bm)`` / ``(bk / 32, bn)`` tiles of the scales stored transposed
  (``(K / 32, rows)``: a TMA box's inner extent must be >= 16 bytes, a
  ``(rows, 1)`` box of the natural layout is not).
* A's chunk is dequantized into registers (the ``wgmma`` A operand); B's is
  dequantized and stored to a bf16 shared-memory chunk ``(bn, 32)`` (the
  ``wgmma`` B operand must be in shared memory), handed to ``wgmma`` as a
  transposed ref -- Hopper transposes only 16-bit operands, so B stays
  K-major like the operand.

Exactness: every element value of the GEMM dtypes (E4M3 -- also FP6 E2M3/E3M2
and FP4 E2M1, whose values are E4M3 values --, E5M2) has at most 4 significant
bits, so ``code * 2**e`` is exact in float32 and then in bf16 while it stays a
*normal* number: scale bytes in :data:`EXACT_SCALES` (E4M3 codes: [10, 245];
E5M2: [17, 239]). Outside that range (subnormal or overflowing products, NaN
scales, byte 0) the dequantized value would round, so :func:`mosaic_mx_gemm`
routes the whole GEMM to the exact Pallas Triton kernel
(:func:`mx_proxy.pallas.gemm.gemm`, which splits every scale into two normal
powers of two) whenever any scale byte of either operand is outside it. The
bf16 products are exact; the float32 accumulation order differs from the
reference, hence ``accumulation_tolerance`` (:mod:`mx_proxy.pallas.tolerance`).

Registers: with A from registers, a step holds A's ``bk / 32`` dequantized
chunks (``2 bm bk / 128`` bytes per thread) beside the float32 accumulator
(``4 bm bn / 128``) until its ``wgmma`` s are issued; at bm = bn = bk = 128
that is 192 of the 255 registers a thread may have, so spills are possible
and only the card can say (the autotuner also tries ``bm = 64`` and
``a_smem=True``).

Element formats: E4M3 and E5M2 codes as stored; FP6 operands are stored as
E4M3 codes already; FP4 (E2M1, packed two per byte) is expanded to E4M3 codes
by XLA before the kernel (one extra pass over the codes: the kernel's
register-side nibble decode is not written yet). MXINT8 (7-bit magnitudes,
not E4M3 values) is refused; use :func:`mx_proxy.pallas.matmul.mx_gemm`.

Layout constraints (checked before any work, :func:`check_mosaic_config`):
``bm`` and ``bn`` multiples of 64 (one warpgroup ``wgmma`` is 64 rows; B's
chunks are dequantized in that register layout too), ``bn`` <= 256 (the
``wgmma`` N range), ``bk`` a multiple of 128 (:class:`MosaicConfig`). M, N and K are padded to
whole tiles (zero codes, scale byte 127) and the result sliced back.

Without a GPU the kernel lowers to MLIR for CUDA (:func:`lower_mosaic_gemm`:
Mosaic GPU runs its own lowering, layout checks and shared-memory budget in
Python at that point; machine code comes only from the CUDA plugin on a GPU)
and runs in Mosaic GPU's interpreter (``interpret=True``; jax 0.10.2's plain
Pallas interpreter stops at the TMA copy with ``NotImplementedError: No state
discharge rule implemented for primitive: copy_gmem_to_smem``). The
interpreter takes ``wgmma`` operands from shared memory only and no
transposed ref, so the interpreted kernel stores A's dequantized chunks in
shared memory (``a_smem=True``) and B's as ``(32, bn)``; the pipeline, the
TMA indexing, the scales and the dequantization are the compiled kernel's.
:func:`tile_reference` mirrors the arithmetic per tile in plain jnp.
Written against jax 0.10.2's ``jax.experimental.pallas.mosaic_gpu``
(``kernel``, ``emit_pipeline``, ``wgmma``, ``layout_cast``,
``Layout.WGMMA.reduce``, ``SwizzleTransform``/``TilingTransform``, and
``ref.transpose``, which replaces ``plgpu.transpose_ref`` -- deprecated in
0.11); it also lowers and runs interpreted with jax 0.11.2 (the GPU image's
version, checked on a CPU). The interpreter's parameters are private in both
(``jax._src...InterpretGPUParams``). Untested and unmeasured on a GPU so far.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from mx_proxy.numerics.mx import element
from mx_proxy.pallas.matmul import mx_gemm
from mx_proxy.pallas.operand import CHUNK, MXOperand, pad_operand, round_up

__all__ = ["MosaicConfig", "EXACT_SCALES", "MOSAIC_DTYPES", "check_mosaic_config", "check_mosaic_operands",
           "padded_inputs", "scales_exact", "SMEM_LIMIT", "smem_bytes", "check_smem", "mosaic_gemm", "mosaic_mx_gemm",
           "lower_mosaic_gemm", "tile_reference", "dequantize_chunk"]

MOSAIC_DTYPES = ("e4m3", "e5m2", "e2m1")  # GEMM dtypes (operand.GEMM_DTYPES) the kernel takes
EXACT_SCALES = {"e4m3": (10, 245), "e5m2": (17, 239)}  # scale bytes with normal code * 2**e (module docstring)


@dataclasses.dataclass(frozen=True)
class MosaicConfig:
    """Tiles and pipeline depth of the Mosaic GPU MX GEMM (autotuned on a GPU by ``scripts/gpu_kernels.py``).

    Attributes:
      bm: output rows per program (a multiple of 64: one ``wgmma`` is 64 rows per warpgroup).
      bn: output columns per program: a multiple of 64 (B's chunks are dequantized in the 64-row ``wgmma``
        register layout; lowering refuses 32 with "Tiling ... does not apply to shape (32, 32)") and at most
        256 (the ``wgmma`` N range).
      bk: K-elements per pipeline step: a multiple of 128, the FP8 ``wgmma`` tile with a 128-byte swizzle
        (issue 61), kept so that an FP8-``wgmma`` variant can share these tiles. This kernel's own limit is
        lower: its step's scale tile, ``(bk / 32) * rows`` bytes, must be a multiple of the 128 threads that
        copy it, so bk = 64 lowers and bk = 32 does not ("Only copies transferring a number of bytes
        divisible by the warpgroup size").
      stages: TMA pipeline depth (``max_concurrent_steps``, 1..8).
      a_smem: feed ``wgmma`` the dequantized A from shared memory (a bf16 scratch, like B) instead of from
        registers; costs ``2 bm bk`` bytes of shared memory and a round trip, and is the form the GPU
        interpreter runs (it takes ``wgmma`` operands from shared memory only).
    """

    bm: int = 128
    bn: int = 128
    bk: int = 128
    stages: int = 3
    a_smem: bool = False

    def __post_init__(self):
        check_mosaic_config(self)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_mosaic_config(cfg) -> None:
    """Raise ValueError naming the bad field and its valid choices (docstring of :class:`MosaicConfig`)."""
    rules = (("bm", lambda v: v >= 64 and v % 64 == 0, "a multiple of 64 (64, 128, 192, 256, ...)"),
             ("bn", lambda v: 64 <= v <= 256 and v % 64 == 0, "64, 128, 192 or 256"),
             ("bk", lambda v: v >= 128 and v % 128 == 0, "a multiple of 128 (128, 256, ...)"),
             ("stages", lambda v: 1 <= v <= 8, "1..8"))
    for name, ok, valid in rules:
        v = getattr(cfg, name)
        if not (_is_int(v) and ok(v)):
            raise ValueError(f"MosaicConfig {name}={v!r} is invalid; valid: {valid}")
    if not isinstance(cfg.a_smem, bool):
        raise ValueError(f"MosaicConfig a_smem={cfg.a_smem!r} is invalid; valid: True, False")


SMEM_LIMIT = 232448  # bytes of shared memory per block on Hopper (sm_90: 227 KiB)


def smem_bytes(cfg: MosaicConfig, k_steps: int) -> int:
    """Shared memory of one program: min(stages, k_steps) buffers of both operands' code chunks and scale
    tiles and an 8-byte barrier each, the bf16 B chunks, the float32 output tile (the figure Mosaic GPU
    reports when it refuses a kernel)."""
    buffers = min(cfg.stages, k_steps)
    per_step = (cfg.bm + cfg.bn) * cfg.bk + (cfg.bk // CHUNK) * (cfg.bm + cfg.bn)
    return buffers * (per_step + 8) + 2 * cfg.bk * (cfg.bn + cfg.bm * cfg.a_smem) + 4 * cfg.bm * cfg.bn


def check_smem(cfg: MosaicConfig, k_steps: int) -> None:
    """Raise ValueError if ``cfg`` needs more shared memory than Hopper has (:func:`smem_bytes`)."""
    need = smem_bytes(cfg, k_steps)
    if need > SMEM_LIMIT:
        raise ValueError(f"{cfg} needs {need} bytes of shared memory over {k_steps} K steps; valid: at most "
                         f"{SMEM_LIMIT} (smaller bm, bn, bk or stages)")


def check_mosaic_operands(a, b) -> None:
    """Raise ValueError unless ``a`` and ``b`` are MXOperands the kernel takes (same K, formats, block size 32)."""
    for op, what in ((a, "a"), (b, "b")):
        if not isinstance(op, MXOperand):
            raise ValueError(f"{what} must be an mx_proxy.pallas.operand.MXOperand, got {type(op).__name__}")
        if op.gemm_dtype not in MOSAIC_DTYPES:
            raise ValueError(f"{what}: element {op.element!r} (GEMM dtype {op.gemm_dtype!r}) is not taken by the "
                             f"Mosaic GPU kernel; valid GEMM dtypes: {', '.join(MOSAIC_DTYPES)} (for MXINT8 use "
                             "mx_proxy.pallas.matmul.mx_gemm)")
        if op.block_size != CHUNK:
            raise ValueError(f"{what}: block_size {op.block_size} is not taken by the Mosaic GPU kernel; valid: "
                             f"{CHUNK} (other block sizes: mx_proxy.pallas.matmul.mx_gemm)")
    if a.k != b.k:
        raise ValueError(f"contraction sizes differ: a has K={a.k}, b has K={b.k}")


# ----------------------------------------------------------------------------
# host side (XLA): codes as float8, scales transposed, everything padded


def _codes(data, gemm_dtype: str):
    """(R, Kp) float8 codes of an operand's data: E4M3/E5M2 as stored, E2M1 nibbles ((R, Kp / 2) bytes) expanded
    to E4M3 codes."""
    if gemm_dtype != "e2m1":
        return data
    r, half = data.shape
    pairs = data.astype(jnp.uint32).reshape(r, half // CHUNK, 1, CHUNK)
    nib = jnp.concatenate([pairs & np.uint32(0xF), pairs >> np.uint32(4)], axis=2).reshape(r, 2 * half)
    return jax.lax.bitcast_convert_type(element.e2m1_to_e4m3(nib).astype(jnp.uint8), jnp.float8_e4m3fn)


def padded_inputs(a: MXOperand, b: MXOperand, cfg: MosaicConfig):
    """(a codes (Mp, Kp), a scales (Kp/32, Mp), b codes (Np, Kp), b scales (Kp/32, Np)): float8 codes and uint8
    scales transposed, zero-padded (scales: 127) to whole ``cfg`` tiles
    (:func:`~mx_proxy.pallas.operand.pad_operand`)."""
    kp = round_up(max(a.padded_k, b.padded_k), cfg.bk)
    out = []
    for op, tile in ((a, cfg.bm), (b, cfg.bn)):
        data, sc = pad_operand(op, round_up(op.data.shape[0], tile), kp)
        out += [_codes(data, op.gemm_dtype), sc.T]
    return tuple(out)


def _code_dtype(op: MXOperand) -> str:
    return "e5m2" if op.gemm_dtype == "e5m2" else "e4m3"


def scales_exact(op: MXOperand):
    """bool scalar: every scale byte of ``op`` lies in :data:`EXACT_SCALES` (the kernel is exact for it)."""
    lo, hi = EXACT_SCALES[_code_dtype(op)]
    return jnp.all((op.scales >= lo) & (op.scales <= hi))


# ----------------------------------------------------------------------------
# the kernel


def _factor(sbytes):
    """float32 2**(byte - 127) of int32 scale bytes in [1, 254] (an exponent field; exact)."""
    return jax.lax.bitcast_convert_type(sbytes << 23, jnp.float32)


def dequantize_chunk(codes, sbytes):
    """bf16 values (rows, 32) of float8 codes (rows, 32) and their uint8 scale bytes (rows,), exact for bytes
    in :data:`EXACT_SCALES` -- the kernel's dequantization, written once for the kernel and :func:`tile_reference`."""
    f = jax.lax.broadcast_in_dim(_factor(sbytes.astype(jnp.int32)), codes.shape, (0,))  # no (rows, 1) step
    return (codes.astype(jnp.float32) * f).astype(jnp.bfloat16)


def _kernel(a_gmem, as_gmem, b_gmem, bs_gmem, o_gmem, o_smem, b16_smem, *a16, cfg: MosaicConfig, kp: int,
            interpret: bool):
    from jax.experimental.pallas import mosaic_gpu as plgpu

    nc = cfg.bk // CHUNK
    def row(x):  # a (rows,) vector in the layout of a row of the wgmma tile (a no-op the interpreter lacks)
        return x if interpret else plgpu.layout_cast(x, plgpu.Layout.WGMMA.reduce(1))

    m0 = pl.multiple_of(jax.lax.axis_index("m") * cfg.bm, cfg.bm)
    n0 = pl.multiple_of(jax.lax.axis_index("n") * cfg.bn, cfg.bn)

    def scope(acc_ref):
        def body(_, *refs):
            a_chunks, b_chunks = refs[:nc], refs[nc + 1:2 * nc + 1]
            as_smem, bs_smem = refs[nc], refs[2 * nc + 1]
            for c in range(nc):  # the interpreter's wgmma takes no transposed ref: it gets B (K, N) instead
                vb = dequantize_chunk(b_chunks[c][...], row(bs_smem[c]))
                b16_smem[c] = vb.T if interpret else vb
            plgpu.commit_smem()
            a = [dequantize_chunk(a_chunks[c][...], row(as_smem[c])) for c in range(nc)]
            if cfg.a_smem:
                for c in range(nc):
                    a16[0][c] = a[c]
                plgpu.commit_smem()
                a = [a16[0].at[c] for c in range(nc)]
            for c in range(nc):
                b16 = b16_smem.at[c] if interpret else b16_smem.at[c].transpose((1, 0))
                plgpu.wgmma(acc_ref, a[c], b16)
            plgpu.wgmma_wait(0)

        t8 = (plgpu.TilingTransform((8, CHUNK)), plgpu.SwizzleTransform(CHUNK))  # 32 one-byte codes per row

        def chunk_spec(rows, c):
            return plgpu.BlockSpec((rows, CHUNK), lambda k, c=c: (0, k * nc + c), transforms=t8)

        in_specs = [*[chunk_spec(cfg.bm, c) for c in range(nc)], plgpu.BlockSpec((nc, cfg.bm), lambda k: (k, 0)),
                    *[chunk_spec(cfg.bn, c) for c in range(nc)], plgpu.BlockSpec((nc, cfg.bn), lambda k: (k, 0))]
        a_rows, b_rows = a_gmem.at[pl.ds(m0, cfg.bm)], b_gmem.at[pl.ds(n0, cfg.bn)]
        a_sc, b_sc = as_gmem.at[:, pl.ds(m0, cfg.bm)], bs_gmem.at[:, pl.ds(n0, cfg.bn)]
        plgpu.emit_pipeline(body, grid=(kp // cfg.bk,), in_specs=in_specs, max_concurrent_steps=cfg.stages)(
            *[a_rows] * nc, a_sc, *[b_rows] * nc, b_sc)
        o_smem[...] = acc_ref[...]
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, o_gmem.at[pl.ds(m0, cfg.bm), pl.ds(n0, cfg.bn)])
        plgpu.wait_smem_to_gmem(0)

    pl.run_scoped(scope, plgpu.ACC((cfg.bm, cfg.bn), jnp.float32))


def _interpret_params():
    """Mosaic GPU's interpreter parameters: jax 0.10.2 has them only under ``jax._src`` (no public name yet)."""
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

    return InterpretGPUParams()


def _mosaic_call(ac, asc, bc, bsc, cfg: MosaicConfig, interpret: bool = False):
    from jax.experimental.pallas import mosaic_gpu as plgpu

    (mp, kp), np_ = ac.shape, bc.shape[0]
    t16 = (plgpu.TilingTransform((8, CHUNK)), plgpu.SwizzleTransform(2 * CHUNK))  # 32 bf16 per row: 64 bytes
    b16_chunk = (CHUNK, cfg.bn) if interpret else (cfg.bn, CHUNK)
    return plgpu.kernel(
        functools.partial(_kernel, cfg=cfg, kp=kp, interpret=bool(interpret)),
        out_type=jax.ShapeDtypeStruct((mp, np_), jnp.float32),
        scratch_types=[plgpu.SMEM((cfg.bm, cfg.bn), jnp.float32),  # the output tile
                       plgpu.SMEM((cfg.bk // CHUNK, *b16_chunk), jnp.bfloat16, transforms=t16),  # B, dequantized
                       *[plgpu.SMEM((cfg.bk // CHUNK, cfg.bm, CHUNK), jnp.bfloat16, transforms=t16)] * cfg.a_smem],
        grid=(mp // cfg.bm, np_ // cfg.bn), grid_names=("m", "n"),
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane),
        interpret=_interpret_params() if interpret else None, kernel_name="mx_gemm_mosaic",
    )(ac, asc, bc, bsc)


@functools.partial(jax.jit, static_argnames=("config", "out_dtype", "interpret"))
def mosaic_gemm(a: MXOperand, b: MXOperand, config: MosaicConfig = MosaicConfig(), out_dtype: str = "float32",
                interpret: bool = False):
    """``values(a) @ values(b).T`` (M, N) in ``out_dtype`` by the Mosaic GPU kernel, float32 accumulation.

    Exact only where :func:`scales_exact` holds for both operands (module
    docstring); :func:`mosaic_mx_gemm` checks that and falls back. Compiles
    on an NVIDIA Hopper GPU only; ``interpret=True`` runs it in Mosaic GPU's
    interpreter on any backend (needs ``config.a_smem``; the interpreter's
    ``wgmma`` takes no register operand and no transposed ref, so B's bf16
    chunks are stored (32, bn) there).
    """
    check_mosaic_operands(a, b)
    if interpret and not config.a_smem:
        raise ValueError(f"interpret=True needs a config with a_smem=True (got {config}); valid: "
                         "dataclasses.replace(config, a_smem=True)")
    inputs = padded_inputs(a, b, config)
    check_smem(config, inputs[0].shape[1] // config.bk)
    out = _mosaic_call(*inputs, config, interpret)
    return out[: a.rows, : b.rows].astype(out_dtype)


def mosaic_mx_gemm(a: MXOperand, b: MXOperand, config: MosaicConfig = MosaicConfig(), out_dtype: str = "float32",
                   fallback_config=None):
    """:func:`mosaic_gemm` where every scale byte is in :data:`EXACT_SCALES`, else the exact Pallas Triton
    kernel (:func:`mx_proxy.pallas.matmul.mx_gemm` with ``fallback_config``), chosen on the device by
    ``lax.cond``. An explicit opt-in: ``backend="pallas"`` does not use it (unmeasured)."""
    check_mosaic_operands(a, b)
    ok = scales_exact(a) & scales_exact(b)
    return jax.lax.cond(ok, lambda: mosaic_gemm(a, b, config, out_dtype),
                        lambda: mx_gemm(a, b, out_dtype=out_dtype, config=fallback_config, interpret=False))


def lower_mosaic_gemm(a: MXOperand, b: MXOperand, config: MosaicConfig = MosaicConfig()) -> str:
    """:func:`mosaic_gemm` lowered for CUDA (works without a GPU); returns the StableHLO text."""
    return mosaic_gemm.trace(a, b, config).lower(lowering_platforms=("cuda",)).as_text()


# ----------------------------------------------------------------------------
# the kernel's per-tile computation in pure jnp (CPU)


def tile_reference(a: MXOperand, b: MXOperand, config: MosaicConfig = MosaicConfig()) -> jax.Array:
    """float32 (M, N): the kernel's computation in jnp -- the same padding, the same per-chunk bf16
    dequantization (:func:`dequantize_chunk`), a float32 sum of each (bm, bn) tile's chunk products in the
    kernel's K order. Runs anywhere; equals the reference GEMM within ``accumulation_tolerance``."""
    check_mosaic_operands(a, b)
    ac, asc, bc, bsc = padded_inputs(a, b, config)
    mp, kp = ac.shape
    np_ = bc.shape[0]
    acc = jnp.zeros((mp, np_), jnp.float32)
    for c in range(kp // CHUNK):
        ks = slice(c * CHUNK, (c + 1) * CHUNK)
        va, vb = dequantize_chunk(ac[:, ks], asc[c]), dequantize_chunk(bc[:, ks], bsc[c])
        acc = acc + jnp.dot(va.astype(jnp.float32), vb.astype(jnp.float32).T, precision=jax.lax.Precision.HIGHEST)
    return acc[: a.rows, : b.rows]
