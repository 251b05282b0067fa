"""Per-tensor quantization statistics (``operand_stats``) against counts made by hand and an independent
numpy / ml_dtypes quantizer: underflow, saturation, last bin, scale exponents, relative MSE, SNR."""

import ml_dtypes
import numpy as np
import pytest

from mx_proxy.numerics import reference
from mx_proxy.numerics.operand_stats import STATS, operand_stats
from mx_proxy.numerics.quantize import NVFP4, NVFP4_2D, MXSpec


def _stats(x, spec, axis=-1) -> dict:
    return {k: float(v) for k, v in operand_stats(x, spec, axis)._asdict().items()}


def test_hand_made_e4m3_blocks():
    """Three 32-element E4M3 blocks (floor scales, ties to even), every count worked out by hand."""
    x = np.zeros((3, 32), np.float32)
    # block 0: amax 1.9 -> e = floor(log2 1.9) - emax = 0 - 8 = -8, scale 2**-8; scaled values:
    x[0, :6] = [1.9, 1.8, 1.749, 1.0, 1e-7, -0.5]  # 486.4, 460.8 (> 448: clipped), 447.7 (rounds to 448), 256,
    #                                                 2.6e-5 (below half E4M3's least subnormal 2**-9: flushed), -128
    # block 1: 3 * 2**-20 and 2**-20 -> e = -19 - 8 = -27; both exact
    x[1, :2] = [3 * 2.0 ** -20, 2.0 ** -20]
    # block 2: all zero (no scale exponent of its own to report)
    s = _stats(x, MXSpec("fp8_e4m3"))
    assert s["underflow_frac"] == np.float32(1 / 8)          # 1e-7 of the 8 non-zero values
    assert s["clamp_frac"] == np.float32(2 / 96)             # 1.9 and 1.8 of all 96 elements (float32 fractions)
    assert s["last_bin_frac"] == np.float32(3 / 96)          # ... and 1.749, all three on 448 * 2**-8 = 1.75
    assert (s["scale_exp_min"], s["scale_exp_max"]) == (-27.0, -8.0)  # the zero block's -127 is left out
    q = np.zeros_like(x, dtype=np.float64)
    q[0, :6] = [1.75, 1.75, 1.75, 1.0, 0.0, -0.5]
    q[1, :2] = x[1, :2]
    rel = np.sum((q - x.astype(np.float64)) ** 2) / np.sum(x.astype(np.float64) ** 2)
    assert s["rel_mse"] == pytest.approx(rel, rel=1e-5)
    assert s["snr_db"] == pytest.approx(-10 * np.log10(rel), rel=1e-5)


def test_rceil_saturates_nothing_and_raises_the_scale():
    x = np.zeros((1, 32), np.float32)
    x[0, :2] = [1.9, 1.0]  # floor would clip 1.9; rceil picks e = -7 (1.9 * 128 = 243.2 <= 448)
    s = _stats(x, MXSpec("fp8_e4m3", scale_rule="rceil"))
    assert s["clamp_frac"] == 0 and s["last_bin_frac"] == 0
    assert s["scale_exp_min"] == s["scale_exp_max"] == -7


def test_all_zero_and_exact_tensors():
    zero = _stats(np.zeros((2, 64), np.float32), MXSpec("fp8_e4m3"))
    assert zero["underflow_frac"] == zero["clamp_frac"] == zero["rel_mse"] == 0
    assert np.isnan(zero["scale_exp_min"]) and np.isnan(zero["scale_exp_max"]) and zero["snr_db"] == np.inf
    exact = _stats(np.full((2, 32), 0.25, np.float32), MXSpec("fp8_e4m3"))
    assert exact["rel_mse"] == 0 and exact["snr_db"] == np.inf and exact["scale_exp_min"] == -10  # -2 - 8


_ML = {"fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp4_e2m1": ml_dtypes.float4_e2m1fn,
       "fp6_e2m3": ml_dtypes.float6_e2m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2}


def _numpy_stats(x, element: str, rule: str, axis: int) -> dict:
    """The statistics of 1-D E8M0 MX quantization (32-element blocks along ``axis``, ties to even) in float64
    numpy, the elements rounded by an ml_dtypes cast: written from the OCP MX definition, sharing no code."""
    info = ml_dtypes.finfo(_ML[element])
    emax, top = int(np.log2(float(info.max))), float(info.max)
    b = np.moveaxis(x.astype(np.float64), axis, -1)
    b = np.concatenate([b, np.zeros(b.shape[:-1] + (-b.shape[-1] % 32,))], -1).reshape(b.shape[:-1] + (-1, 32))
    amax = np.max(np.abs(b), -1, keepdims=True)
    e = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1))) - emax, -127).clip(-127)
    if rule == "rceil":
        e = e + (amax / 2.0 ** e > top)
    scaled = np.abs(b) / 2.0 ** e
    elem = np.minimum(scaled, top).astype(np.float32).astype(_ML[element]).astype(np.float64)
    q = np.sign(b) * elem * 2.0 ** e
    n, nonzero = x.size, b != 0
    rel = np.sum((q - b) ** 2) / np.sum(b ** 2)
    live = amax[..., 0] > 0
    return dict(underflow_frac=np.sum(nonzero & (q == 0)) / np.sum(nonzero), clamp_frac=np.sum(scaled > top) / n,
                last_bin_frac=np.sum(elem == top) / n, scale_exp_min=e[..., 0][live].min(),
                scale_exp_max=e[..., 0][live].max(), rel_mse=rel, snr_db=-10 * np.log10(rel))


def _spread(shape, seed=0):
    """Gaussian values over many binades, some exact zeros and some far below their block's maximum."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape) * np.exp2(rng.integers(-30, 4, size=shape[:-1] + (1,)))
    x = np.where(rng.random(shape) < 0.1, 0.0, x) * np.where(rng.random(shape) < 0.05, 1e-6, 1.0)
    return x.astype(np.float32)


@pytest.mark.parametrize("element,rule", [("fp8_e4m3", "floor"), ("fp8_e4m3", "rceil"), ("fp4_e2m1", "floor"),
                                          ("fp6_e2m3", "floor"), ("fp8_e5m2", "floor")])
@pytest.mark.parametrize("axis", [0, 1])
def test_one_d_blocks_match_an_ml_dtypes_quantizer(element, rule, axis):
    x = _spread((96, 80), seed=axis)  # 80 and 96: ragged blocks along either axis
    got = _stats(x, MXSpec(element, scale_rule=rule), axis)
    want = _numpy_stats(x, element, rule, axis)
    for k in STATS:
        assert got[k] == pytest.approx(want[k], rel=2e-5, abs=1e-7), k


@pytest.mark.parametrize("spec", [MXSpec("fp8_e4m3", block_dims=2), MXSpec("fp4_e2m1", block_dims=2), NVFP4, NVFP4_2D,
                                  MXSpec("fp8_e4m3", scale_rule="even"), MXSpec("fp4_e2m1", scale_rule="ceil")],
                         ids=lambda s: s.name)
def test_tiles_nvfp4_and_torchao_rules_match_the_float64_reference(spec):
    """2-D tiles, NVFP4's E4M3 block scales and torchao's scale rules, against ``numerics.reference``
    (float64 numpy written from the spec, never calling the quantizer) and numpy sums."""
    x = _spread((64, 48), seed=3)
    got = _stats(x, spec, 1)
    q = reference.reference_quantize(x, spec, 1).astype(np.float64)
    ref = reference.reference_stats(x, spec, 1)
    e = reference.reference_scale_exponent(x, spec, 1)
    xd = x.astype(np.float64)
    rel = np.sum((q - xd) ** 2) / np.sum(xd ** 2)
    live = (e != reference.NAN_SCALE_EXP) & (e != reference.ZERO_SCALE_EXP) & (_block_amax(xd, spec) > 0)
    nonzero = xd != 0
    assert got["underflow_frac"] == pytest.approx(np.sum(nonzero & (q == 0)) / np.sum(nonzero), abs=1e-7)
    assert got["clamp_frac"] == pytest.approx(ref.clamped_frac, abs=1e-7)
    assert got["last_bin_frac"] == pytest.approx(ref.last_bin_frac, abs=1e-7)
    assert (got["scale_exp_min"], got["scale_exp_max"]) == (e[live].min(), e[live].max())
    assert got["rel_mse"] == pytest.approx(rel, rel=2e-5)
    assert got["snr_db"] == pytest.approx(-10 * np.log10(rel), rel=2e-5)


def _block_amax(x, spec):
    """Per block of ``spec`` along axis 1 (or per tile), the largest |x|: shaped like the scale exponents."""
    a = np.abs(x)
    bs = spec.block_size
    a = np.pad(a, [(0, -a.shape[0] % bs if spec.block_dims == 2 else 0), (0, -a.shape[1] % bs)])
    if spec.block_dims == 2:
        return a.reshape(a.shape[0] // bs, bs, a.shape[1] // bs, bs).max(axis=(1, 3))
    return a.reshape(a.shape[0], -1, bs).max(axis=2)


def test_stochastic_specs_are_measured_at_round_to_nearest_even():
    x = _spread((32, 64))
    sr = MXSpec("fp8_e4m3", rounding="stochastic")
    assert _stats(x, sr) == _stats(x, sr.replace(rounding="even"))
