"""mx_proxy.pallas.mosaic_gemm without a GPU: the Mosaic GPU MX GEMM lowers for CUDA for every element format it
takes and a few tile configurations, refuses bad tiles, formats and shared-memory budgets naming the valid
choices, its per-tile arithmetic (padding, transposed scales, bf16 dequantization, chunked float32 sums; run in
jnp by ``tile_reference``) equals the reference GEMM -- exactly on integer-valued operands, within
``accumulation_tolerance`` on Gaussian ones --, and the kernel itself, run by Mosaic GPU's interpreter, meets the
same tolerance. The compiled kernel is checked on a GPU by scripts/gpu_kernels.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import mx_proxy as mxp
from mx_proxy.pallas import mosaic_gemm as mg
from mx_proxy.pallas import operand as mop
from mx_proxy.pallas.matmul import mx_gemm
from mx_proxy.pallas.tolerance import accumulation_tolerance

FORMATS = ("fp8_e4m3", "fp8_e5m2", "fp6_e2m3", "fp6_e3m2", "fp4_e2m1")


def _operands(fa, fb, m=200, n=136, k=300, seed=0, integers=False):
    rng = np.random.default_rng(seed)
    draw = (lambda s: rng.integers(-6, 7, s).astype(np.float32)) if integers else (
        lambda s: rng.standard_normal(s).astype(np.float32))
    a = mop.quantize_operand(draw((m, k)), mxp.MXSpec(fa), 1, interpret=True)
    b = mop.quantize_operand(draw((k, n)), mxp.MXSpec(fb), 0, interpret=True)
    return a, b


def _reference(a, b):
    """float64 values(a) @ values(b).T and its accumulation tolerance."""
    va, vb = mop.operand_values(a).astype(np.float64), mop.operand_values(b).astype(np.float64)
    return va @ vb.T, accumulation_tolerance(va, vb.T)


# ----------------------------------------------------------------------------
# lowering


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_kernel_lowers_for_cuda_to_one_mosaic_gpu_call_with_wgmma(fmt):
    a, b = _operands(fmt, fmt, m=64, n=64, k=256)
    text = mg.lower_mosaic_gemm(a, b)
    calls = re.findall(r"stablehlo.custom_call @(\w+)", text)
    assert calls == ["mosaic_gpu_v2"] or (len(calls) == 1 and calls[0].startswith("mosaic_gpu")), calls
    assert "wgmma" in text


@pytest.mark.parametrize("cfg", [mg.MosaicConfig(64, 64, 128, 1), mg.MosaicConfig(256, 64, 128, 2),
                                 mg.MosaicConfig(64, 256, 128, 2), mg.MosaicConfig(128, 64, 256, 2),
                                 mg.MosaicConfig(128, 64, 128, 3, a_smem=True), mg.MosaicConfig(64, 192, 128, 2)],
                         ids=lambda c: f"{c.bm}x{c.bn}x{c.bk}s{c.stages}{'-a_smem' if c.a_smem else ''}")
def test_tile_configurations_lower_with_mixed_formats(cfg):
    a, b = _operands("fp8_e4m3", "fp8_e5m2", m=100, n=90, k=300)
    assert "wgmma" in mg.lower_mosaic_gemm(a, b, cfg)


def test_the_checked_entry_point_lowers_to_the_mosaic_kernel_and_the_exact_triton_fallback():
    a, b = _operands("fp8_e4m3", "fp8_e4m3", m=64, n=64, k=128)
    try:
        text = jax.jit(mg.mosaic_mx_gemm).trace(a, b).lower(lowering_platforms=("cuda",)).as_text()
    except Exception as err:  # jaxlib >= 0.10.3 without its CUDA plugin cannot lower the Triton fallback
        if "No supported GPU devices found" in str(err):
            pytest.skip(f"the Triton fallback needs a GPU to lower with jax {jax.__version__}")
        raise
    assert "stablehlo.case" in text  # lax.cond on the device: are all scale bytes in EXACT_SCALES?
    calls = sorted(re.findall(r"stablehlo.custom_call @([\w$.]+)", text))
    assert calls == ["__gpu$xla.gpu.triton", "mosaic_gpu_v2"], calls  # the Triton kernel beside the Mosaic GPU one


# ----------------------------------------------------------------------------
# checks


@pytest.mark.parametrize("field, value, valid", [
    ("bm", 96, "multiple of 64"), ("bm", 32, "multiple of 64"), ("bn", 512, "64, 128, 192 or 256"),
    ("bn", 32, "64, 128, 192 or 256"), ("bn", 100, "64, 128, 192 or 256"),
    ("bk", 64, "multiple of 128"), ("bk", 192, "multiple of 128"), ("stages", 0, "1..8"), ("bm", True, "multiple"),
])
def test_bad_tiles_are_refused_naming_the_value_and_the_valid_choices(field, value, valid):
    with pytest.raises(ValueError, match=re.escape(f"{field}={value!r}")) as err:
        mg.MosaicConfig(**{field: value})
    assert valid in str(err.value)


def test_a_config_over_the_shared_memory_budget_is_refused_before_lowering():
    cfg = mg.MosaicConfig(64, 256, 256, 4)
    assert mg.smem_bytes(cfg, 2) == 365584  # what Mosaic GPU's own check reported for it when lowering
    a, b = _operands("fp8_e4m3", "fp8_e4m3", m=64, n=256, k=512)
    with pytest.raises(ValueError, match=r"needs 365584 bytes .* valid: at most 232448"):
        mg.mosaic_gemm(a, b, cfg)
    assert mg.smem_bytes(mg.MosaicConfig(), 64) <= mg.SMEM_LIMIT  # the default fits


@pytest.mark.parametrize("fmt, block, match", [("int8", 32, "valid GEMM dtypes: e4m3, e5m2, e2m1"),
                                               ("fp8_e4m3", 16, "block_size 16 .* valid: 32")])
def test_formats_the_kernel_does_not_take_are_refused(fmt, block, match):
    x = np.ones((64, 128), np.float32)
    op = mop.quantize_operand(x, mxp.MXSpec(fmt, block_size=block), 1, interpret=True)
    ok = mop.quantize_operand(x, mxp.MXSpec("fp8_e4m3"), 1, interpret=True)
    with pytest.raises(ValueError, match=match):
        mg.check_mosaic_operands(op, ok)
    with pytest.raises(ValueError, match="must be an mx_proxy.pallas.operand.MXOperand, got ndarray"):
        mg.check_mosaic_operands(ok, x)


def test_operands_of_different_k_are_refused():
    a, _ = _operands("fp8_e4m3", "fp8_e4m3", k=256)
    _, b = _operands("fp8_e4m3", "fp8_e4m3", k=288)
    with pytest.raises(ValueError, match="a has K=256, b has K=288"):
        mg.mosaic_gemm(a, b)


# ----------------------------------------------------------------------------
# padding and dequantization


def test_padding_fills_whole_tiles_with_zero_codes_and_unit_scales_and_transposes_the_scales():
    a, b = _operands("fp4_e2m1", "fp8_e5m2", m=100, n=90, k=300)
    cfg = mg.MosaicConfig(128, 64, 256, 2)
    ac, asc, bc, bsc = mg.padded_inputs(a, b, cfg)
    assert ac.shape == (128, 512) and asc.shape == (16, 128) and ac.dtype == jnp.float8_e4m3fn
    assert bc.shape == (128, 512) and bsc.shape == (16, 128) and bc.dtype == jnp.float8_e5m2
    for codes, sc, op in ((ac, asc, a), (bc, bsc, b)):
        codes, sc = np.asarray(codes).astype(np.float32), np.asarray(sc)
        vals = codes * np.exp2(np.repeat(sc.T.astype(np.float64) - 127, 32, axis=1))
        np.testing.assert_array_equal(vals[: op.rows, : op.k], mop.operand_values(op))  # E2M1 expanded exactly
        assert not vals[op.rows:].any() and not vals[:, op.k:].any()
        assert (sc[op.padded_k // 32:] == 127).all() and (sc[:, op.padded_rows:] == 127).all()


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantized_chunks_equal_the_operand_values_bit_for_bit_at_the_ends_of_the_exact_range(fmt):
    code_dtype = mg.EXACT_SCALES["e5m2" if fmt == "fp8_e5m2" else "e4m3"]
    lo, hi = code_dtype
    a, _ = _operands(fmt, fmt, m=64, n=64, k=128, seed=3)
    sbytes = np.asarray(a.scales).copy()
    sbytes[:32, 0], sbytes[32:, 0], sbytes[:, 1] = lo, hi, (lo + hi) // 2  # extreme and middle scales
    op = mop.MXOperand(a.data, jnp.asarray(sbytes), a.element, a.block_size, a.rows, a.k)
    ac, asc, _, _ = mg.padded_inputs(op, op, mg.MosaicConfig(64, 64, 128, 1))
    for c in range(4):
        got = np.asarray(mg.dequantize_chunk(ac[:, 32 * c:32 * (c + 1)], asc[c]).astype(jnp.float32))
        np.testing.assert_array_equal(got, mop.operand_values(op)[:, 32 * c:32 * (c + 1)])
    assert bool(mg.scales_exact(op))
    for byte in (lo - 1, hi + 1, 255):
        sbytes[0, 0] = byte
        assert not bool(mg.scales_exact(mop.MXOperand(a.data, jnp.asarray(sbytes), a.element, 32, a.rows, a.k)))


def test_the_exact_range_is_where_every_code_times_its_scale_stays_a_normal_bf16():
    for dtype, (lo, hi) in mg.EXACT_SCALES.items():
        info = ml_dtypes.finfo(ml_dtypes.float8_e4m3fn if dtype == "e4m3" else ml_dtypes.float8_e5m2)
        tiny, big = float(info.smallest_subnormal), float(info.max)
        bf = ml_dtypes.finfo(ml_dtypes.bfloat16)
        assert tiny * 2.0 ** (lo - 127) >= float(bf.smallest_normal) > tiny * 2.0 ** (lo - 128)
        assert big * 2.0 ** (hi - 127) <= float(bf.max)


# ----------------------------------------------------------------------------
# the kernel's arithmetic in jnp against the reference GEMM


@pytest.mark.parametrize("fa, fb", [("fp8_e4m3", "fp8_e4m3"), ("fp4_e2m1", "fp4_e2m1"), ("fp8_e5m2", "fp6_e3m2")])
def test_the_tile_computation_equals_the_reference_exactly_on_integer_operands(fa, fb):
    a, b = _operands(fa, fb, m=70, n=72, k=200, integers=True)
    want, _ = _reference(a, b)
    got = np.asarray(mg.tile_reference(a, b, mg.MosaicConfig(64, 64, 128, 2)))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("fa, fb, cfg", [("fp8_e4m3", "fp8_e4m3", mg.MosaicConfig()),
                                         ("fp4_e2m1", "fp6_e2m3", mg.MosaicConfig(64, 128, 256, 2))])
def test_the_tile_computation_meets_the_accumulation_tolerance_and_the_triton_kernel(fa, fb, cfg):
    a, b = _operands(fa, fb, m=96, n=80, k=320, seed=1)
    want, tol = _reference(a, b)
    got = np.asarray(mg.tile_reference(a, b, cfg), np.float64)
    assert np.all(np.abs(got - want) <= tol)
    triton = np.asarray(mx_gemm(a, b, interpret=True), np.float64)  # the existing kernel, interpreted
    assert np.all(np.abs(got - triton) <= tol)


@pytest.mark.parametrize("fa, fb, shape, cfg", [
    ("fp8_e4m3", "fp8_e4m3", (130, 70, 300), mg.MosaicConfig(64, 64, 128, 2, True)),
    ("fp4_e2m1", "fp8_e5m2", (64, 72, 256), mg.MosaicConfig(64, 128, 256, 1, True)),
], ids=["e4m3-ragged-6-programs", "e2m1xe5m2"])
def test_the_kernel_interpreted_meets_the_accumulation_tolerance(fa, fb, shape, cfg):
    m, n, k = shape
    a, b = _operands(fa, fb, m=m, n=n, k=k, seed=2)
    want, tol = _reference(a, b)
    got = np.asarray(mg.mosaic_gemm(a, b, cfg, interpret=True), np.float64)
    assert got.shape == (m, n)
    assert np.all(np.abs(got - want) <= tol), np.max(np.abs(got - want) - tol)


def test_interpreting_needs_a_through_shared_memory():
    a, b = _operands("fp8_e4m3", "fp8_e4m3", m=64, n=64, k=128)
    with pytest.raises(ValueError, match="interpret=True needs a config with a_smem=True"):
        mg.mosaic_gemm(a, b, mg.MosaicConfig(64, 64, 128, 1), interpret=True)


# ----------------------------------------------------------------------------
# the GPU slot on a CPU


@pytest.mark.e2e  # the real scripts, in subprocesses
@pytest.mark.skipif(jax.default_backend() == "gpu", reason="on a GPU the script measures the kernel")
def test_the_gpu_scripts_skip_the_mosaic_step_without_a_gpu_saying_why(tmp_path):
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    alone = subprocess.run([sys.executable, "scripts/gpu_mosaic.py", "--out", str(tmp_path)], cwd=root, env=env,
                           capture_output=True, text=True, timeout=300)
    assert alone.returncode == 0, alone.stderr[-2000:]
    assert "# mosaic: skipped: jax backend is 'cpu'" in alone.stdout
    kernels = subprocess.run([sys.executable, "scripts/gpu_kernels.py", "--out", str(tmp_path), "--skip", "probe",
                              "tests", "bench", "autotune", "cpu_tests"], cwd=root, env=env, capture_output=True,
                             text=True, timeout=300)
    summary = kernels.stdout.strip().splitlines()[-1]
    assert "## mosaic: skipped in" in kernels.stdout and "'mosaic'" in summary.split("skipped:")[1], kernels.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu_kernels.log"]  # no mosaic_gemm.json


def test_the_autotune_grid_fits_shared_memory_and_starts_with_the_default():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import gpu_mosaic

    grid = gpu_mosaic.tune_grid()
    assert grid[0] == mg.MosaicConfig() and len(set(grid)) == len(grid) >= 8
    assert all(mg.smem_bytes(c, 4096 // c.bk) <= mg.SMEM_LIMIT for c in grid)
    assert {c.a_smem for c in grid} == {False, True} and {c.bn for c in grid} == {128, 256}


@pytest.mark.e2e  # the real script's phases, about a minute of interpreted kernels
def test_the_gpu_script_phases_run_on_the_cpu_with_the_interpreted_kernel(monkeypatch, tmp_path):
    """scripts/gpu_mosaic.py's three phases, with the compiled kernel swapped for the interpreted
    one at small sizes: what the GPU run will write, minus the speed."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import gpu_mosaic

    compiled = mg.mosaic_gemm
    small = mg.MosaicConfig(64, 64, 128, 2, a_smem=True)
    monkeypatch.setattr(mg, "mosaic_gemm", lambda a, b, config=None, out_dtype="float32":
                        compiled(a, b, small, out_dtype, interpret=True))
    monkeypatch.setattr(gpu_mosaic, "EXACT_CASES", ((("fp4_e2m1", "fp8_e5m2"), (70, 72, 200)),))
    monkeypatch.setattr(gpu_mosaic, "TIMED", ((128, "fp8_e4m3"),))
    far = time.perf_counter() + 600
    exact = gpu_mosaic.exactness(far)
    assert exact[0]["ok"] and exact[0]["err_over_bound"] <= 1.0, exact
    assert exact[-1]["route"] == "fallback" and not exact[-1]["ok"]  # the Triton fallback is compiled: GPU only
    monkeypatch.setattr(gpu_mosaic, "tune_grid", lambda: [mg.MosaicConfig(), small])
    tuned = gpu_mosaic.autotune(far, iters=1, n=128)
    assert len(tuned) == 2 and tuned[0]["seconds"] <= tuned[1]["seconds"] and tuned[0]["tflops"] >= 0
    rows = gpu_mosaic.timings(far, small, iters=1)
    assert rows[0]["err_over_bound"] <= 1.0 and {"bf16_dot_s", "mosaic_s", "triton_s", "scaled_dot_s"} <= set(rows[0])
    path = tmp_path / "mosaic_gemm.json"
    gpu_mosaic.write_json(str(path), {"exactness": exact, "autotune": tuned, "timings": rows})
    row = json.loads(path.read_text())["timings"][0]
    assert row["speed_vs_bf16_dot"] == round(row["bf16_dot_s"] / row["mosaic_s"], 3)  # > 1: faster than bf16
    assert [p.name for p in tmp_path.iterdir()] == ["mosaic_gemm.json"]  # written atomically: no temporary left
