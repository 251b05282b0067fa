"""Does Mosaic GPU compile and run an FP8 ``wgmma`` here? The first check of the GPU script.

Mosaic GPU is the supported Pallas GPU backend from jax 0.11 on (Triton is
deprecated there). Unlike Triton kernels, Mosaic GPU kernels compile to
machine code only inside the CUDA plugin, when the program runs on a GPU:
without one they can be lowered to MLIR (:func:`lower_probe`, tested on CPU)
and no further. This probe is the smallest kernel a Mosaic GPU port of the MX
GEMM would stand on: one ``wgmma`` of a (64, 128) E4M3 tile by a K-major
(64, 128) E4M3 tile into a float32 accumulator, with the 128-byte swizzle
TMA layout (the operands come in by one ``emit_pipeline`` step). On small
integers the product is exact, so :func:`run_probe` compares for equality.

The bare ``AssertionError`` the probe raised on an H200 with jax 0.11.2
(2026-12-04) came from writing it with ``pl.pallas_call`` and Mosaic GPU
``CompilerParams``: that form is deprecated in jax 0.10.2 (a
``DeprecationWarning``) and gone in 0.11, where no ``pallas_call`` lowering
rule is registered for Mosaic GPU's ``CompilerParams``, so
``jax/_src/pallas/pallas_call.py`` stops at ``assert rule is not None``
before any Mosaic GPU code runs -- reproduced on a CPU with jax 0.11.2 by
:func:`lower_probe`. The probe is now a ``plgpu.kernel``, which lowers on
the CPU with jax 0.10.2 and 0.11.2 alike; whether FP8 ``wgmma`` then
compiles and runs on the card is still to be seen.
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


def _kernel(a_gmem, b_gmem, o_gmem, o_smem):
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def body(_, a_smem, b_smem):
        def scope(acc_ref):
            plgpu.wgmma(acc_ref, a_smem, b_smem.transpose((1, 0)))
            plgpu.wgmma_wait(0)
            return acc_ref[...]

        o_smem[...] = pl.run_scoped(scope, plgpu.ACC((M, N), jnp.float32))

    transforms = (plgpu.TilingTransform((8, 128)), plgpu.SwizzleTransform(128))  # 128 one-byte elements per row
    specs = [plgpu.BlockSpec((M, K), lambda i: (0, 0), transforms=transforms),
             plgpu.BlockSpec((N, K), lambda i: (0, 0), transforms=transforms)]
    plgpu.emit_pipeline(body, grid=(1,), in_specs=specs)(a_gmem, b_gmem)  # one TMA step per operand
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_smem, o_gmem)
    plgpu.wait_smem_to_gmem(0)


def probe(a, b):
    """``a (M, K) @ b (N, K).T`` of float8_e4m3fn tiles by one Mosaic GPU wgmma (float32)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    return plgpu.kernel(
        _kernel,
        out_type=jax.ShapeDtypeStruct((M, N), jnp.float32),
        scratch_types=[plgpu.SMEM((M, N), jnp.float32)],
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane),
        kernel_name="mosaic_fp8_wgmma_probe",
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
