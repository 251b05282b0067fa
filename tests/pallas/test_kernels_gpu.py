"""Compiled kernels on a real NVIDIA GPU (skipped cleanly elsewhere).

Run on a GPU machine: ``python -m pytest tests/pallas/test_kernels_gpu.py -v`` (or
``python scripts/gpu_kernels.py``, which runs this file first). Same checks as
the interpreted tests, at sizes that span many tiles: quantized values bit
for bit; products within :func:`mx_proxy.pallas.matmul.accumulation_tolerance`,
or :func:`~mx_proxy.pallas.matmul.mma_tolerance` where the FP8 tensor cores
accumulate a 32-deep chunk; a benchmark smoke run.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mx_proxy as mxp
from mx_proxy.cli.bench import kernels as bench
from mx_proxy.pallas import gemm as mx_gemm
from mx_proxy.pallas import matmul as mm
from mx_proxy.pallas import mosaic_probe, tuning
from mx_proxy.pallas import operand as mop
from mx_proxy.pallas import quantize as mxq

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs an NVIDIA GPU (jax.default_backend() == 'gpu')"),
]

E4M3, E5M2, E2M1 = mxp.MXSpec("fp8_e4m3"), mxp.MXSpec("fp8_e5m2"), mxp.MXSpec("fp4_e2m1")


def _rand(shape, seed, scale=1.0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * scale)


def _fp8_mma(a_spec, b_spec) -> bool:
    """Whether the pair allows the FP8 path (then the looser mma_tolerance applies, whichever path ran)."""
    if a_spec is None or b_spec is None:
        return False
    da, db = mop.GEMM_DTYPES[a_spec.element.name], mop.GEMM_DTYPES[b_spec.element.name]
    return mx_gemm.mma_mode(da, a_spec.block_size, db, b_spec.block_size) == "fp8"


def _check(out, a, b, a_spec, b_spec):
    out = np.asarray(out, np.float32)
    ref = np.asarray(mm.mx_matmul_reference(a, b, a_spec, b_spec))
    qa = np.asarray(a if a_spec is None else mxp.quantize(a, a_spec, 1))
    qb = np.asarray(b if b_spec is None else mxp.quantize(b, b_spec, 0))
    tol = (mm.mma_tolerance if _fp8_mma(a_spec, b_spec) else mm.accumulation_tolerance)(qa, qb)
    assert np.array_equal(np.isnan(out), np.isnan(ref))
    ok = ~np.isnan(ref)
    assert np.all(np.abs(out - ref)[ok] <= tol[ok]), float(np.max((np.abs(out - ref) / tol)[ok]))


def test_mosaic_gpu_probe():
    ok, message = mosaic_probe.run_probe()
    assert ok, message


@pytest.mark.parametrize("a_spec,b_spec", [
    (E4M3, E4M3), (E5M2, E5M2), (E2M1, E2M1), (mxp.MXSpec("fp6_e2m3"), E2M1), (E4M3, E5M2),
    (mxp.MXSpec("fp6_e3m2", scale_rule="rceil"), mxp.MXSpec("int8", rounding="away")), (E4M3, None),
], ids=["e4m3", "e5m2", "e2m1", "fp6_fp4", "mixed", "fp6_int8", "e4m3_none"])
def test_fused_compiled(a_spec, b_spec):
    a, b = _rand((300, 520), 0, 3.0), _rand((520, 200), 1)
    a = a.at[3, 40].set(jnp.nan)
    _check(mm.mx_matmul(a, b, a_spec, b_spec), a, b, a_spec, b_spec)


@pytest.mark.parametrize("mode", tuning.MODES)
def test_every_default_config_compiled(mode):
    a_spec, b_spec = {"fp8": (E4M3, E4M3), "fp8_fp4": (E2M1, E4M3), "bf16": (E4M3, E5M2)}[mode]
    a, b = _rand((384, 512), 2), _rand((512, 320), 3)
    for (m, _), cfg in tuning.DEFAULTS.items():
        if m == mode:
            _check(mm.mx_matmul(a, b, a_spec, b_spec, config=cfg), a, b, a_spec, b_spec)
            if mode != "bf16":  # the FP8 path too (not the default on Pallas Triton: mx_proxy/pallas/tuning.py)
                _check(mm.mx_matmul(a, b, a_spec, b_spec, config=cfg.replace(mma="fp8")), a, b, a_spec, b_spec)
    nk = mm.mx_matmul(a, b.T, a_spec, b_spec, b_layout="nk")
    assert np.array_equal(np.asarray(nk), np.asarray(mm.mx_matmul(a, b, a_spec, b_spec)))


def test_extreme_scales_compiled():
    a, b = _rand((256, 256), 4), _rand((256, 256), 5)
    a = a.at[130].multiply(1e-37).at[131].multiply(1e35)  # tile 1 leaves the fast fp8 window
    b = b.at[:, 7].multiply(1e-30)
    for spec in (E4M3, E5M2, E2M1):
        for mma in ("fp8", "bf16"):
            cfg = tuning.GemmConfig(128, 128, 64 if spec is not E2M1 else 32, mma=mma)
            _check(mm.mx_matmul(a, b, spec, spec, config=cfg), a, b, spec, spec)


@pytest.mark.parametrize("fmt", mxq.MX_FORMATS)
def test_quantize_kernels_compiled(fmt):
    spec = mxp.MXSpec(fmt)
    x = _rand((130, 300), 6) * jnp.exp2(jnp.arange(300) % 40 - 20.0)
    t = mxq.quantize_packed(x, spec, 1)
    ref = mxq.quantize_packed_reference(np.asarray(x), spec, 1)
    assert np.array_equal(np.asarray(t.codes), np.asarray(ref.codes))
    assert np.array_equal(np.asarray(t.scales), np.asarray(ref.scales))
    fq = np.asarray(mxp.quantize(x, spec, 1))
    assert np.array_equal(np.asarray(mxq.dequantize(t)).view(np.uint32), fq.view(np.uint32))
    for k_axis, xx, want in ((1, x, fq), (0, x.T, fq)):
        op = mop.quantize_operand(xx, spec, k_axis)
        got = mop.operand_values(op)
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan) and np.array_equal(got.view(np.uint32)[~nan],
                                                                     want.view(np.uint32)[~nan])


def test_prequantized_matches_lax_scaled_dot():
    a, b = _rand((256, 512), 7), _rand((512, 128), 8)
    pa, pb = mxq.quantize_packed(a, E4M3, 1), mxq.quantize_packed(b, E4M3, 0)
    out = mm.mx_scaled_matmul(pa.codes, pa.scales, pb.codes, pb.scales, "fp8_e4m3", "fp8_e4m3")
    f8 = lambda c: jax.lax.bitcast_convert_type(c, jnp.float8_e4m3fn)  # noqa: E731
    ref = jax.lax.scaled_dot(f8(pa.codes), f8(pb.codes), lhs_scale=pa.scales_as_e8m0(),
                             rhs_scale=pb.scales_as_e8m0(), preferred_element_type=jnp.float32)
    tol = mm.mma_tolerance(mxq.dequantize(pa), mxq.dequantize(pb))
    assert np.all(np.abs(np.asarray(out) - np.asarray(ref)) <= tol)
    _check(out, a, b, E4M3, E4M3)


def test_bench_smoke(capsys):
    assert bench.main(["--sizes", "512", "--formats", "fp8_e4m3", "--iters", "2", "--no-step"]) == 0
    assert "fp8_e4m3" in capsys.readouterr().out
