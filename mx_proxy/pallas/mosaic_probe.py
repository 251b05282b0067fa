"""Does Mosaic GPU compile and run an FP8 ``wgmma`` here? The first check of the GPU script.

Mosaic GPU is the supported Pallas GPU backend from jax 0.11 on (Triton is
deprecated there). Unlike Triton kernels, Mosaic GPU kernels compile to
machine code only inside the CUDA plugin, when the program runs on a GPU:
without one they can be lowered to MLIR (:func:`lower_probe`, tested on CPU)
and no further. This probe is the smallest kernel a Mosaic GPU port of the MX
GEMM would stand on: one ``wgmma`` of a (64, 128) E4M3 tile by a K-major
(64, 128) E4M3 tile into a float32 accumulator, with the 128-byte swizzle
TMA layout. On small integers the product is exact, so :func:`run_probe`
compares for equality.
"""

from __future__ import annotations

import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

__all__ = ["M", "N", "K", "probe", "lower_probe", "run_probe"]

M, N, K = 64, 64, 128


def _kernel(a_ref, b_ref, o_ref):
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def scope(acc_ref):
        plgpu.wgmma(acc_ref, a_ref, plgpu.transpose_ref(b_ref, (1, 0)))
        return acc_ref[...]

    o_ref[...] = pl.run_scoped(scope, plgpu.ACC((M, N), jnp.float32))


def probe(a, b):
    """``a (M, K) @ b (N, K).T`` of float8_e4m3fn tiles by one Mosaic GPU wgmma (float32)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    transforms = (plgpu.TilingTransform((8, 128)), plgpu.SwizzleTransform(128))  # 128 one-byte elements per row
    return pl.pallas_call(
        _kernel,
        in_specs=[plgpu.BlockSpec((M, K), lambda i, j: (i, j), transforms=transforms),
                  plgpu.BlockSpec((N, K), lambda i, j: (i, j), transforms=transforms)],
        out_specs=plgpu.BlockSpec((M, N), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((M, N), jnp.float32),
        grid=(1, 1),
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane),
        name="mosaic_fp8_wgmma_probe",
    )(a, b)


def _operands():
    a = jax.random.randint(jax.random.key(0), (M, K), -8, 8).astype(jnp.float8_e4m3fn)
    b = jax.random.randint(jax.random.key(1), (N, K), -8, 8).astype(jnp.float8_e4m3fn)
    return a, b


def lower_probe() -> str:
    """The probe lowered for CUDA (works without a GPU); returns the StableHLO text."""
    a, b = _operands()
    return jax.jit(probe).trace(a, b).lower(lowering_platforms=("cuda",)).as_text()


def run_probe() -> tuple[bool, str]:
    """(passed, message): compile and run the probe on this machine's GPU and check it exactly."""
    a, b = _operands()
    try:
        out = np.asarray(jax.block_until_ready(jax.jit(probe)(a, b)))
    except Exception as err:  # noqa: BLE001 - the probe's job is to report what fails
        frames = traceback.extract_tb(err.__traceback__)[-3:]  # a bare assert inside the compiler says only where
        where = "; ".join(f"{Path(f.filename).name}:{f.lineno} {f.line}" for f in frames)
        return False, (f"Mosaic GPU FP8 wgmma did not compile/run: {type(err).__name__}: {str(err)[:400]} "
                       f"(at {where})")
    want = np.asarray(a, np.float32) @ np.asarray(b, np.float32).T
    if not np.array_equal(out, want):
        return False, f"Mosaic GPU FP8 wgmma ran but is wrong (max error {np.max(np.abs(out - want))})"
    return True, "Mosaic GPU compiles and runs an E4M3 wgmma (64x64x128, swizzle 128) exactly"
