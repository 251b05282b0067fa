"""mx_proxy.pallas.operand: the K-major GEMM operand form (FP8 codes, FP6 as E4M3
codes, FP4 packed two per byte), made by the quantize kernel (interpreted on
CPU) and from ml_dtypes-layout codes, bit for bit against mxp.quantize."""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from test_kernels_quantize import edge_case_matrix, same_bits

import mx_proxy as mxp
from mx_proxy.numerics.mx import element
from mx_proxy.pallas import operand as mop
from mx_proxy.pallas import quantize as mxq


def _data():
    return np.resize(edge_case_matrix().ravel(), (40, 200)).astype(np.float32)  # ragged rows and K


@pytest.mark.parametrize("fmt,rule,rounding", [(f, *(("floor", "even"), ("rceil", "away"))[i % 2])
                                               for i, f in enumerate(mxq.MX_FORMATS)] + [("fp8_e4m3", "rceil", "away")])
def test_operand_values_are_proxy_quantize(fmt, rule, rounding):
    spec = mxp.MXSpec(fmt, scale_rule=rule, rounding=rounding)
    x = _data()
    for k_axis, xx in ((1, x), (0, np.ascontiguousarray(x.T))):
        op = mop.quantize_operand(jnp.asarray(xx), spec, k_axis, row_multiple=16, k_multiple=64)
        ref = np.asarray(mxp.quantize(jnp.asarray(xx), spec, k_axis))
        assert same_bits(mop.operand_values(op), ref if k_axis == 1 else ref.T)
        assert (op.rows, op.k, op.block_size, op.element) == (40, 200, 32, fmt)
        kp = 256  # 200 padded to a multiple of 64
        assert op.data.shape == (48, kp // 2 if fmt == "fp4_e2m1" else kp) and op.scales.shape == (48, kp // 32)


@pytest.mark.parametrize("fmt", mxq.MX_FORMATS)
def test_operand_from_codes_matches_the_kernel(fmt):
    spec = mxp.MXSpec(fmt)
    x = _data()
    t = mxq.quantize_packed(jnp.asarray(x), spec, 1)
    from_codes = mop.operand_from_codes(t.codes, t.scales, fmt, 32, 1, k=t.length)
    kernel = mop.quantize_operand(jnp.asarray(x), spec, 1)
    assert np.array_equal(np.asarray(from_codes.data).view(np.uint8), np.asarray(kernel.data).view(np.uint8))
    assert same_bits(mop.operand_values(from_codes), mop.operand_values(kernel))
    tt = mxq.quantize_packed(jnp.asarray(x.T), spec, 0)  # K along axis 0: transposed to K-major
    assert same_bits(mop.operand_values(mop.operand_from_codes(tt.codes, tt.scales, fmt, 32, 0, k=tt.length)),
                     mop.operand_values(kernel))


def test_fp6_and_fp4_reach_the_gemm_as_e4m3_codes():
    x = _data()[:8, :128]
    for fmt in ("fp6_e3m2", "fp6_e2m3"):
        op = mop.quantize_operand(jnp.asarray(x), mxp.MXSpec(fmt), 1)
        t = mxq.quantize_packed(jnp.asarray(x), mxp.MXSpec(fmt), 1)
        elem = t.codes_as_ml_dtype().astype(np.float32)  # the element values, unscaled
        want = elem.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        nan_blocks = np.repeat(np.asarray(t.scales) == mxq.NAN_SCALE, 32, axis=1)
        assert op.data.dtype == jnp.float8_e4m3fn
        got = np.asarray(op.data).view(np.uint8)[:8, :128]
        assert np.array_equal(got[~nan_blocks], want[~nan_blocks])


def test_fp4_pair_layout():
    # element 64 p + j sits in the low nibble of byte 32 p + j, element 64 p + 32 + j in its high nibble
    codes = np.arange(128) % 16
    vals = codes.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    vals[::32] = 6.0  # every block's amax is 6: scale 2**0, elements unchanged
    x = np.tile(vals, (16, 1))
    op = mop.quantize_operand(jnp.asarray(x), mxp.MXSpec("fp4_e2m1"), 1)
    want_codes = vals.astype(ml_dtypes.float4_e2m1fn).view(np.uint8).reshape(2, 2, 32)
    want = want_codes[:, 0, :] | (want_codes[:, 1, :] << 4)
    assert op.data.dtype == jnp.uint8
    assert np.array_equal(np.asarray(op.data)[0], want.reshape(64))
    assert np.all(np.asarray(op.scales) == 127)


def test_zero_blocks_carry_scale_one_nan_and_tiny_blocks_keep_theirs():
    x = np.ones((16, 128), np.float32)
    x[0, :32] = 0.0  # zero block
    x[1, 32:64] = -0.0
    x[2, 64] = np.nan  # NaN block
    x[3, 96:] = 1e-38  # tiny but nonzero: its scale (byte 0) stays
    op = mop.quantize_operand(jnp.asarray(x), mxp.MXSpec("fp8_e4m3"), 1)
    s = np.asarray(op.scales)
    assert s[0, 0] == 127 and s[1, 1] == 127 and s[2, 2] == 255 and s[3, 3] == 0
    t = mxq.quantize_packed(jnp.asarray(x), mxp.MXSpec("fp8_e4m3"), 1)
    assert np.asarray(t.scales)[0, 0] == 0  # the packed (public) form keeps the E8M0 semantics
    assert same_bits(mop.operand_values(op), mxp.quantize(jnp.asarray(x), mxp.MXSpec("fp8_e4m3"), 1))


def test_e2m1_to_e4m3_every_code():
    n = np.arange(16, dtype=np.uint32)
    got = np.asarray(element.e2m1_to_e4m3(jnp.asarray(n | 0xF0))).astype(np.uint8)  # high bits ignored
    want = n.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
    assert np.array_equal(got, want.view(np.uint8))


def test_bad_input_is_refused():
    x = jnp.ones((16, 64))
    with pytest.raises(ValueError, match="float matrix"):
        mop.quantize_operand(jnp.ones((2, 16, 64)), mxp.MXSpec("fp8_e4m3"), 1)
    with pytest.raises(ValueError, match="k_axis must be 0 or 1"):
        mop.quantize_operand(x, mxp.MXSpec("fp8_e4m3"), 2)
    with pytest.raises(ValueError, match="row_multiple must be a power of two"):
        mop.quantize_operand(x, mxp.MXSpec("fp8_e4m3"), 1, row_multiple=24)
    with pytest.raises(ValueError, match="stochastic"):
        mop.quantize_operand(x, mxp.MXSpec("fp8_e4m3", rounding="stochastic"), 1)
