"""mx_proxy.pallas.matmul: fused and prequantized MX matmuls (interpreted on CPU)
against mxp.quantize + jnp.dot, jax.lax.scaled_dot and each other.

Tolerance: quantized values must be exact; products may differ from the
reference only by float32 summation order, bounded elementwise by
``accumulation_tolerance`` = 2 K 2**-24 (|qa| @ |qb|) + K 2**-126.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mx_proxy as mxp
from mx_proxy.pallas import backend, tuning
from mx_proxy.pallas import gemm as mx_gemm
from mx_proxy.pallas import matmul as mm
from mx_proxy.pallas import operand as mop
from mx_proxy.pallas import quantize as mxq

E4M3, E5M2, E2M1 = mxp.MXSpec("fp8_e4m3"), mxp.MXSpec("fp8_e5m2"), mxp.MXSpec("fp4_e2m1")
SMALL_TILES = (16, 16, 32)  # several grid programs and K steps on small problems


def _quantized(x, spec, axis):
    x = jnp.asarray(x)
    return np.asarray(x, np.float32) if spec is None else np.asarray(mxp.quantize(x, spec, axis))


def _compiled_fp8(a_spec, b_spec) -> bool:
    """Compiled on a GPU in fp8 MMA mode: the tensor cores sum a 32-chunk with fewer bits (mma_tolerance)."""
    if jax.default_backend() != "gpu" or a_spec is None or b_spec is None:
        return False
    da, db = mop.GEMM_DTYPES[a_spec.element.name], mop.GEMM_DTYPES[b_spec.element.name]
    return mx_gemm.mma_mode(da, a_spec.block_size, db, b_spec.block_size) == "fp8"


def assert_close_to_reference(out, a, b, a_spec, b_spec):
    """NaN exactly where the reference has NaN; elsewhere within the accumulation bound."""
    out = np.asarray(out, np.float32)
    ref = np.asarray(mm.mx_matmul_reference(jnp.asarray(a), jnp.asarray(b), a_spec, b_spec))
    qa, qb = _quantized(a, a_spec, 1), _quantized(b, b_spec, 0)
    exact = np.nan_to_num(qa.astype(np.float64)) @ np.nan_to_num(qb.astype(np.float64))
    assert np.array_equal(np.isnan(out), np.isnan(ref)), "NaN pattern differs from the reference"
    ok = ~np.isnan(ref)
    tol = (mm.mma_tolerance if _compiled_fp8(a_spec, b_spec) else mm.accumulation_tolerance)(qa, qb)
    assert np.all(np.abs(out - ref)[ok] <= tol[ok]), np.max((np.abs(out - ref) / tol)[ok])
    assert np.all(np.abs(out - exact)[ok] <= tol[ok])


def rand(shape, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


# ----------------------------------------------------------------------------
# fused kernel vs reference


FORMAT_PAIRS = [  # every format once, same and mixed pairs, and unquantized operands
    (E4M3, E4M3),
    (E5M2, E5M2),
    (E4M3, E5M2),  # the paper's "mixed" recipe pairs E4M3 activations with E5M2 gradients
    (mxp.MXSpec("fp6_e3m2"), mxp.MXSpec("fp6_e2m3")),
    (mxp.MXSpec("int8"), E2M1),
    (E4M3, None),
    (None, mxp.MXSpec("fp6_e2m3")),
]


@pytest.mark.parametrize("a_spec,b_spec", FORMAT_PAIRS, ids=lambda s: s.name if s else "none")
def test_fused_formats_ragged(a_spec, b_spec):
    a, b = rand((20, 70), 0, 3.0), rand((70, 33), 1, 0.5)  # ragged M, K, N
    assert_close_to_reference(mm.mx_matmul(a, b, a_spec, b_spec), a, b, a_spec, b_spec)


@pytest.mark.parametrize("scale_rule", ["floor", "rceil"])
@pytest.mark.parametrize("rounding", ["even", "away"])
def test_fused_scale_rules_and_roundings_multi_tile(scale_rule, rounding):
    spec = mxp.MXSpec("fp8_e4m3", scale_rule=scale_rule, rounding=rounding)
    a, b = rand((40, 100), 2), rand((100, 50), 3) * np.exp2(np.arange(50) % 7).astype(np.float32)
    out = mm.mx_matmul(a, b, spec, spec.replace(element="fp4_e2m1"), block_sizes=SMALL_TILES)
    assert_close_to_reference(out, a, b, spec, spec.replace(element="fp4_e2m1"))


def magnitude_cases():
    rng = np.random.default_rng(4)
    a = rng.standard_normal((32, 128)).astype(np.float32)
    b = rng.standard_normal((128, 24)).astype(np.float32)
    a[0] *= 1e-30  # tiny rows (normal float32, scale 2**-108)
    a[1] *= 1e30  # huge rows; b column 0 tiny keeps products finite
    b[:, 0] *= 1e-30
    a[2, :64] = 0.0  # zero blocks
    a[3] = 0.0  # a zero row
    a[4, 70] = np.nan  # NaN block -> whole output row NaN
    a[5, 10] = np.inf  # Inf -> NaN block
    b[40, 7] = -np.inf  # b NaN block -> output column NaN
    a[6] = 1.0 + 0.01 * rng.standard_normal(128)  # clustered: E4M3 floor-scale clamping
    a[7] *= np.exp2(rng.integers(-40, 40, 128))  # wide range within blocks
    return a, b


@pytest.mark.parametrize("spec", [E4M3, mxp.MXSpec("fp8_e4m3", scale_rule="rceil"), E2M1,
                                  mxp.MXSpec("int8", rounding="away")], ids=lambda s: s.name)
def test_fused_tiny_huge_zero_nan(spec):
    a, b = magnitude_cases()
    out = np.asarray(mm.mx_matmul(a, b, spec, E5M2, block_sizes=(16, 16, 64)))
    assert np.all(np.isnan(out[4])) and np.all(np.isnan(out[5])) and np.all(np.isnan(out[:, 7]))
    assert np.all(out[3][~np.isnan(out[3])] == 0)
    assert_close_to_reference(out, a, b, spec, E5M2)


@pytest.mark.parametrize("spec", [E4M3, mxp.MXSpec("fp6_e3m2", scale_rule="rceil", rounding="away"),
                                  mxp.MXSpec("int8")], ids=lambda s: s.name)
def test_fused_quantized_values_exact(spec):
    # a @ I returns the kernel's quantized a itself: exact, bit for bit up to the sign of zero
    a, _ = magnitude_cases()
    a = a[:, :70]  # ragged K
    eye = np.eye(70, dtype=np.float32)
    q = np.asarray(mxp.quantize(jnp.asarray(a), spec, 1))
    for b_spec in (None, E4M3):  # the identity survives MX quantization unchanged
        out = np.asarray(mm.mx_matmul(a, eye, spec, b_spec, block_sizes=(16, 32, 32)))
        nan_rows = np.isnan(q).any(axis=1)  # NaN * 0 spreads a NaN block over its whole output row
        assert np.all(np.isnan(out[nan_rows]))
        assert np.array_equal(out[~nan_rows], q[~nan_rows])


def test_fused_b_layout_nk_and_out_dtypes():
    a, b = rand((24, 96), 5), rand((96, 40), 6)
    kn = np.asarray(mm.mx_matmul(a, b, E4M3, E5M2, block_sizes=SMALL_TILES))
    nk = np.asarray(mm.mx_matmul(a, np.ascontiguousarray(b.T), E4M3, E5M2, block_sizes=SMALL_TILES, b_layout="nk"))
    assert np.array_equal(kn, nk)
    ref_nk = mm.mx_matmul_reference(jnp.asarray(a), jnp.asarray(b.T), E4M3, E5M2, b_layout="nk")
    assert_close_to_reference(ref_nk, a, b, E4M3, E5M2)
    bf = mm.mx_matmul(a, b, E4M3, E5M2, block_sizes=SMALL_TILES, out_dtype=jnp.bfloat16)
    assert bf.dtype == jnp.bfloat16
    assert np.array_equal(np.asarray(bf), np.asarray(jnp.asarray(kn).astype(jnp.bfloat16)))
    # bf16 operands are read as they are (cast to float32 in the kernel)
    a16 = jnp.asarray(a).astype(jnp.bfloat16)
    assert_close_to_reference(mm.mx_matmul(a16, b, E4M3, E5M2), np.asarray(a16.astype(jnp.float32)), b, E4M3, E5M2)


# ----------------------------------------------------------------------------
# prequantized kernel


def _packed(x, spec, axis):
    return mxq.quantize_packed(jnp.asarray(x), spec, axis)


@pytest.mark.parametrize("a_spec,b_spec", [(E4M3, E4M3), (E4M3, E5M2), (E2M1, E2M1)], ids=["e4m3", "mixed", "e2m1"])
def test_scaled_matches_lax_scaled_dot(a_spec, b_spec):
    a, b = rand((24, 96), 7, 4.0), rand((96, 40), 8)
    pa, pb = _packed(a, a_spec, 1), _packed(b, b_spec, 0)
    out = np.asarray(mm.mx_scaled_matmul(pa.codes, pa.scales, pb.codes, pb.scales, pa.element, pb.element,
                                         block_sizes=SMALL_TILES))
    dtypes = {"fp8_e4m3": jnp.float8_e4m3fn, "fp8_e5m2": jnp.float8_e5m2, "fp4_e2m1": jnp.float4_e2m1fn}
    la = jnp.asarray(pa.codes_as_ml_dtype()).astype(dtypes[pa.element]) if pa.element == "fp4_e2m1" else \
        jax.lax.bitcast_convert_type(pa.codes, dtypes[pa.element])
    lb = jnp.asarray(pb.codes_as_ml_dtype()).astype(dtypes[pb.element]) if pb.element == "fp4_e2m1" else \
        jax.lax.bitcast_convert_type(pb.codes, dtypes[pb.element])
    ref = np.asarray(jax.lax.scaled_dot(la, lb, lhs_scale=pa.scales_as_e8m0(), rhs_scale=pb.scales_as_e8m0(),
                                        preferred_element_type=jnp.float32))
    tolerance = mm.mma_tolerance if _compiled_fp8(a_spec, b_spec) else mm.accumulation_tolerance
    tol = tolerance(mxq.dequantize_reference(pa), mxq.dequantize_reference(pb))
    assert np.all(np.abs(out - ref) <= tol)
    # float8 codes and E8M0 scales are accepted as they come
    if pa.element.startswith("fp8") and pb.element.startswith("fp8"):
        out8 = mm.mx_scaled_matmul(la, pa.scales_as_e8m0(), lb, pb.scales_as_e8m0(), pa.element, pb.element,
                                   block_sizes=SMALL_TILES)
        assert np.array_equal(np.asarray(out8), out)


@pytest.mark.parametrize("fmt", ["fp8_e5m2", "fp6_e3m2", "fp4_e2m1", "int8"])
def test_scaled_equals_fused_bit_for_bit(fmt):
    # same tiles, same dequantized values, same dot order: identical float32 results
    spec = mxp.MXSpec(fmt, scale_rule="rceil")
    a, b = magnitude_cases()
    a, b = a[:, :100], b[:100]
    pa, pb = _packed(a, spec, 1), _packed(b, E4M3, 0)
    out = np.asarray(mm.mx_scaled_matmul(pa.codes, pa.scales, pb.codes, pb.scales, fmt, "fp8_e4m3",
                                         block_sizes=(16, 16, 64)))
    fused = np.asarray(mm.mx_matmul(a, b, spec, E4M3, block_sizes=(16, 16, 64)))
    assert np.array_equal(out, fused, equal_nan=True)
    ref = np.asarray(mm.mx_scaled_matmul_reference(pa.codes, pa.scales, pb.codes, pb.scales, fmt, "fp8_e4m3"))
    assert np.array_equal(np.isnan(out), np.isnan(ref))


def test_scaled_kmajor_b_and_block_size_16():
    spec = mxp.MXSpec("fp6_e2m3", block_size=16)
    a, b = rand((20, 64), 9), rand((33, 64), 10)  # b given as (N, K): the jax.nn.scaled_matmul layout
    pa, pb = _packed(a, spec, 1), _packed(b, E5M2, 1)
    out = np.asarray(mm.mx_scaled_matmul(pa.codes, pa.scales, pb.codes, pb.scales, pa.element, pb.element,
                                         b_layout="nk", block_sizes=(16, 16, 32)))
    ref = np.asarray(mm.mx_scaled_matmul_reference(pa.codes, pa.scales, pb.codes, pb.scales, pa.element,
                                                   pb.element, b_layout="nk"))
    tol = mm.accumulation_tolerance(mxq.dequantize_reference(pa), mxq.dequantize_reference(pb).T)
    assert np.all(np.abs(out - ref) <= tol)


# ----------------------------------------------------------------------------
# mx_dot, the layer's entry point


def test_mx_dot_batch_axes_layouts_and_methods():
    x, w = rand((2, 5, 72), 11), rand((40, 72), 12)  # y = x @ w.T: w (out, in) contracted on its axis 1
    y = np.asarray(mm.mx_dot(x, w, E4M3, E4M3, b_contract_axis=1, block_sizes=SMALL_TILES))
    assert y.shape == (2, 5, 40)
    assert_close_to_reference(y.reshape(10, 40), x.reshape(10, 72), w.T, E4M3, E4M3)
    # two_pass with different block sizes per operand: both padded to whole blocks of each
    w64 = mxp.MXSpec("fp8_e5m2", block_size=64)
    y2 = np.asarray(mm.mx_dot(x, w, E4M3, w64, b_contract_axis=1, method="two_pass", block_sizes=(16, 16, 64)))
    y3 = np.asarray(mm.mx_dot(x, w, E4M3, w64, b_contract_axis=1, block_sizes=(16, 16, 64)))
    assert np.array_equal(y2, y3)
    assert_close_to_reference(y3.reshape(10, 40), x.reshape(10, 72), w.T, E4M3, w64)


def test_mx_dot_inside_jit_with_unquantized_operand():
    g, x = rand((64, 48), 13), rand((64, 36), 14)  # wgrad dW = g.T @ x, quantized along the batch axis
    f = jax.jit(lambda g, x: mm.mx_dot(g.T, x, E5M2, None))
    assert_close_to_reference(f(g, x), g.T, x, E5M2, None)


def test_a_stored_k_first_without_transposes():
    # the layer's wgrad x.T @ g with x (batch, in), g (batch, out): contract both on their axis 0
    x, g = rand((72, 24), 15), rand((72, 40), 16)
    ref_in = (np.ascontiguousarray(x.T), g)
    fused = np.asarray(mm.mx_dot(x, g, E4M3, E5M2, a_contract_axis=0, block_sizes=SMALL_TILES))
    assert fused.shape == (24, 40)
    assert_close_to_reference(fused, *ref_in, E4M3, E5M2)
    kn = np.asarray(mm.mx_matmul(*ref_in, E4M3, E5M2, block_sizes=SMALL_TILES))
    assert np.array_equal(fused, kn)  # same tiles, same order: the layout changes nothing numerically
    two = np.asarray(mm.mx_dot(x, g, E4M3, E5M2, a_contract_axis=0, method="two_pass", block_sizes=SMALL_TILES))
    assert np.array_equal(fused, two)
    ref = mm.mx_matmul_reference(jnp.asarray(x), jnp.asarray(g), E4M3, E5M2, a_layout="km")
    assert_close_to_reference(ref, *ref_in, E4M3, E5M2)


# ----------------------------------------------------------------------------
# bad input: clear errors, no fallback


def test_bad_input_is_refused():
    a, b = jnp.ones((32, 64)), jnp.ones((64, 32))
    with pytest.raises(ValueError, match="contraction sizes differ"):
        mm.mx_matmul(a, jnp.ones((65, 32)), E4M3, E4M3)
    with pytest.raises(ValueError, match="stochastic"):
        mm.mx_matmul(a, b, mxp.MXSpec("fp8_e4m3", rounding="stochastic"), E4M3)
    with pytest.raises(ValueError, match="power of two"):
        mm.mx_matmul(a, b, E4M3, E4M3, block_sizes=(48, 16, 32))
    with pytest.raises(ValueError, match=">= 16"):
        mm.mx_matmul(a, b, E4M3, E4M3, block_sizes=(8, 16, 32))
    with pytest.raises(ValueError, match="bk=16 must be a multiple of 32"):
        mm.mx_matmul(a, b, E4M3, E4M3, block_sizes=(16, 16, 16))
    with pytest.raises(ValueError, match="power of two"):
        mm.mx_matmul(a, b, mxp.MXSpec("fp8_e4m3", block_size=48), E4M3)
    with pytest.raises(ValueError, match="b_layout"):
        mm.mx_matmul(a, b, E4M3, E4M3, b_layout="t")
    with pytest.raises(ValueError, match="a_layout"):
        mm.mx_matmul(a, b, E4M3, E4M3, a_layout="nk")
    with pytest.raises(ValueError, match="contraction sizes differ"):
        mm.mx_matmul(a, b, E4M3, E4M3, a_layout="km")  # a (32, 64) read as (K=32, M=64)
    with pytest.raises(ValueError, match="a_contract_axis"):
        mm.mx_dot(a, b, E4M3, E4M3, a_contract_axis=1)
    with pytest.raises(ValueError, match="out_dtype"):
        mm.mx_matmul(a, b, E4M3, E4M3, out_dtype=jnp.int32)
    with pytest.raises(ValueError, match="float array"):
        mm.mx_matmul(jnp.ones((32, 64), jnp.int32), b, E4M3, E4M3)
    with pytest.raises(ValueError, match="rank 2"):
        mm.mx_matmul(jnp.ones((2, 32, 64)), b, E4M3, E4M3)
    with pytest.raises(ValueError, match="MXSpec"):
        mm.mx_matmul(a, b, "fp8_e4m3", E4M3)
    pa = mxq.quantize_packed(a, E4M3, 1)
    pb = mxq.quantize_packed(b, E4M3, 0)
    with pytest.raises(ValueError, match="unknown element format"):
        mm.mx_scaled_matmul(pa.codes, pa.scales, pb.codes, pb.scales, "fp8", "fp8_e4m3")
    with pytest.raises(ValueError, match="valid"):
        mm.mx_scaled_matmul(pa.codes, pa.scales, pb.codes, pb.scales, "bf16", "fp8_e4m3")
    with pytest.raises(ValueError, match="uint8"):
        mm.mx_scaled_matmul(pa.codes.astype(jnp.int32), pa.scales, pb.codes, pb.scales, "fp8_e4m3", "fp8_e4m3")
    with pytest.raises(ValueError, match="E8M0"):
        mm.mx_scaled_matmul(pa.codes, pa.scales.astype(jnp.float32), pb.codes, pb.scales, "fp8_e4m3", "fp8_e4m3")
    with pytest.raises(ValueError, match="a_scales must be"):
        mm.mx_scaled_matmul(pa.codes, pa.scales[:5], pb.codes, pb.scales, "fp8_e4m3", "fp8_e4m3")
    with pytest.raises(ValueError, match="power-of-two multiple"):
        mm.mx_scaled_matmul(pa.codes[:, :48], pa.scales, pb.codes[:48], pb.scales, "fp8_e4m3", "fp8_e4m3")
    with pytest.raises(ValueError, match="two_pass"):
        mm.mx_dot(a, b, E4M3, None, method="two_pass")
    with pytest.raises(ValueError, match="method"):
        mm.mx_dot(a, b, E4M3, E4M3, method="xla")
    with pytest.raises(ValueError, match="b_contract_axis"):
        mm.mx_dot(a, b, E4M3, E4M3, b_contract_axis=2)


def test_backend_choice():
    assert backend.resolve_interpret(None) is (jax.default_backend() == "cpu")
    assert backend.resolve_interpret(True) is True
    with pytest.raises(ValueError, match="interpret"):
        backend.resolve_interpret(1)
    assert backend.BACKEND == "triton"
    if jax.default_backend() == "cpu":  # compiled kernels cannot run here: an error, never a fallback
        with pytest.raises(Exception, match="interpret"):
            jax.block_until_ready(mm.mx_matmul(jnp.ones((16, 32)), jnp.ones((32, 16)), E4M3, E4M3, interpret=False))


# ----------------------------------------------------------------------------
# the GEMM kernel: FP8 MMA mode, extreme scales, program order, configuration


@pytest.mark.parametrize("a_spec,b_spec,mode", [
    (E4M3, E4M3, "fp8"), (E5M2, E5M2, "fp8"), (E2M1, E2M1, "fp8_fp4"), (mxp.MXSpec("fp6_e2m3"), E2M1, "fp8_fp4"),
    (mxp.MXSpec("fp6_e3m2"), E4M3, "fp8"), (E4M3, E5M2, "bf16"), (mxp.MXSpec("int8"), mxp.MXSpec("int8"), "bf16"),
    (mxp.MXSpec("fp8_e4m3", block_size=16), E4M3, "bf16"), (mxp.MXSpec("fp8_e4m3", block_size=64), E4M3, "fp8"),
], ids=lambda v: v if isinstance(v, str) else v.name)
def test_mma_modes(a_spec, b_spec, mode):
    da, db = mop.GEMM_DTYPES[a_spec.element.name], mop.GEMM_DTYPES[b_spec.element.name]
    assert mx_gemm.tuning_mode(da, a_spec.block_size, db, b_spec.block_size) == mode
    a, b = rand((24, 128), 20, 2.0), rand((128, 40), 21)
    assert_close_to_reference(mm.mx_matmul(a, b, a_spec, b_spec, block_sizes=(16, 16, 64)), a, b, a_spec, b_spec)


@pytest.mark.parametrize("spec", [E4M3, E5M2, E2M1], ids=lambda s: s.name)
def test_fp8_mode_tiles_with_extreme_scales_stay_exact(spec):
    # rows 0-15: ordinary; rows 16-31: scales outside the fast window (tiny and huge blocks, a NaN
    # block, zero blocks): their tile takes the bf16 path, exact for every scale
    a, b = magnitude_cases()
    a = np.concatenate([rand((16, 128), 22), a[:16]], axis=0)
    a[16] *= 1e-8  # amax ~ 2**-126: scale byte 0 (2**-127)
    a[17, :32] = 3e36  # scale above the window (byte 240)
    a[17, 32:] = rand((96,), 27) * np.float32(1e35)
    out = np.asarray(mm.mx_matmul(a, b, spec, spec, block_sizes=(16, 16, 64)))
    assert_close_to_reference(out, a, b, spec, spec)
    qa = mop.quantize_operand(jnp.asarray(a), spec, 1, row_multiple=16)
    lo, hi = mx_gemm.FAST_A_SCALES["e5m2" if spec is E5M2 else "e4m3"]
    s = np.asarray(qa.scales)[:32].reshape(2, -1)
    fast = np.all(((s >= lo) & (s <= hi)) | (s == 255), axis=1)
    assert fast[0] and not fast[1]  # both paths ran


def test_prequantized_operands_fused_and_codes_paths_agree_bit_for_bit():
    a, b = rand((40, 160), 23, 3.0), rand((160, 24), 24)
    for sa, sb in ((E4M3, E4M3), (E2M1, E5M2)):
        cfg = tuning.GemmConfig(16, 16, 64, num_warps=4, num_stages=2, group_m=2)
        fused = np.asarray(mm.mx_matmul(a, b, sa, sb, config=cfg))
        qa = mop.quantize_operand(jnp.asarray(a), sa, 1, row_multiple=16, k_multiple=64)
        qb = mop.quantize_operand(jnp.asarray(b), sb, 0, row_multiple=16, k_multiple=64)
        assert np.array_equal(np.asarray(mm.mx_gemm(qa, qb, config=cfg)), fused)
        ta, tb = _packed(a, sa, 1), _packed(b, sb, 0)
        codes = mm.mx_scaled_matmul(ta.codes, ta.scales, tb.codes, tb.scales, ta.element, tb.element, config=cfg)
        assert np.array_equal(np.asarray(codes), fused)


@pytest.mark.parametrize("gm,gn,group", [(1, 1, 8), (5, 3, 2), (4, 7, 8), (9, 2, 4), (3, 3, 1)])
def test_grouped_program_order_visits_every_tile_once(gm, gn, group):
    p = jnp.arange(gm * gn, dtype=jnp.int32)
    i, j = mx_gemm.tile_order(p, gm, gn, group)
    pairs = sorted(zip(np.asarray(i).tolist(), np.asarray(j).tolist()))
    assert pairs == [(r, c) for r in range(gm) for c in range(gn)]
    if group < gm:  # the first programs sweep the columns of the first group of rows
        assert set(np.asarray(i)[: group * gn].tolist()) == set(range(group))


def test_tuning_table_and_configs(tmp_path):
    with pytest.raises(ValueError, match="power of two >= 16"):
        tuning.GemmConfig(48, 64, 64)
    with pytest.raises(ValueError, match="multiple of 32"):
        tuning.GemmConfig(64, 64, 16)
    with pytest.raises(ValueError, match="num_warps"):
        tuning.GemmConfig(64, 64, 64, num_warps=3)
    with pytest.raises(ValueError, match="MMA mode"):
        tuning.config_for(64, 64, 64, "fp16", interpret=False)
    small = tuning.config_for(20, 1000, 64, "fp8", interpret=False, table={})
    assert (small.bm, small.bk) == (32, 64) and small == small.replace()
    large = tuning.config_for(4096, 4096, 4096, "fp8_fp4", interpret=False, table={})
    assert large == tuning.DEFAULTS["fp8_fp4", "large"] and large.mma == "bf16"  # compiled default: the bf16 path
    measured = tuning.GemmConfig(64, 64, 32, num_warps=4, num_stages=4, group_m=16)
    path = tmp_path / "gemm_tuning.json"
    path.write_text(json.dumps({"entries": [{"mode": "fp8", "size_class": "large", "tflops": 1.0,
                                             "config": dataclasses.asdict(measured)}]}))
    assert tuning.config_for(8192, 8192, 8192, "fp8", interpret=False, table=tuning.load_table(str(path))) == measured
    path.write_text(json.dumps({"entries": [{"mode": "fp9", "size_class": "large", "config": {}}]}))
    with pytest.raises(ValueError, match="mode in"):
        tuning.load_table(str(path))
    assert all(mode in tuning.MODES for mode, _ in tuning.DEFAULTS)
    for mode in tuning.MODES:
        assert tuning.candidates(mode)


def test_backend_choice_per_jax_version():
    assert backend.gpu_backend((0, 10, 2), triton_available=True) == "triton"
    assert backend.gpu_backend((0, 11, 2), triton_available=True) == "triton"
    with pytest.raises(ValueError, match="support jax 0.10.x, 0.11.x"):
        backend.gpu_backend((0, 12, 0), triton_available=True)
    with pytest.raises(ValueError, match="no Pallas Triton lowering"):
        backend.gpu_backend((0, 11, 0), triton_available=False)
    assert backend.jax_version("0.11.2.dev20260101") == (0, 11, 2)
    assert backend.BACKEND in backend.BACKENDS


def test_unquantized_operands_run_in_xla():
    a, b = rand((24, 64), 25), rand((64, 16), 26)
    jaxpr = str(jax.make_jaxpr(lambda x, y: mm.mx_matmul(x, y, E4M3, None))(a, b))
    assert "pallas_call" not in jaxpr
    assert "pallas_call" in str(jax.make_jaxpr(lambda x, y: mm.mx_matmul(x, y, E4M3, E4M3))(a, b))
    out = mm.mx_matmul(a, b, None, None)
    ref = mm.mx_matmul_reference(jnp.asarray(a), jnp.asarray(b), None, None)
    assert np.array_equal(np.asarray(out), np.asarray(ref))
