"""mxp.formats: each ElementFormat checked against ml_dtypes and the OCP MX tables."""

import dataclasses

import ml_dtypes
import numpy as np
import pytest

from mx_proxy.numerics import formats

FLOAT_MX = ("fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1")
MX = FLOAT_MX + ("int8",)


def _all_code_values(fmt) -> np.ndarray:
    """Every code of a float format (both signs, NaN/Inf included) as float64."""
    raw = np.arange(2**fmt.bits, dtype=np.uint8)  # ml_dtypes keeps sub-byte codes in the low bits
    return raw.view(fmt.dtype).astype(np.float64)


@pytest.mark.parametrize("name", FLOAT_MX + ("bf16", "fp32"))
def test_float_format_fields_match_ml_dtypes_finfo(name):
    f = formats.get(name)
    fi = ml_dtypes.finfo(f.dtype)
    assert f.bits == fi.bits
    assert f.exponent_bits == fi.nexp
    assert f.mantissa_bits == fi.nmant
    assert f.emin == fi.minexp
    assert f.emax == fi.maxexp - 1
    assert f.max_normal == float(fi.max)
    assert f.min_normal == float(fi.smallest_normal)
    assert f.min_subnormal == float(fi.smallest_subnormal)
    assert f.eps == float(fi.eps)
    assert not f.is_integer
    assert f.max_significand * 2.0 ** (f.emax - f.mantissa_bits) == f.max_normal


@pytest.mark.parametrize("name", FLOAT_MX)
def test_inf_and_nan_flags_match_the_codes(name):
    f = formats.get(name)
    values = _all_code_values(f)
    assert f.has_inf == bool(np.isinf(values).any())
    assert f.has_nan == bool(np.isnan(values).any())


@pytest.mark.parametrize(
    "name, emax, max_normal",
    [("fp8_e4m3", 8, 448.0), ("fp8_e5m2", 15, 57344.0), ("fp6_e3m2", 4, 28.0),
     ("fp6_e2m3", 2, 7.5), ("fp4_e2m1", 2, 6.0), ("int8", 0, 127 / 64)],
)
def test_ocp_table(name, emax, max_normal):
    f = formats.get(name)
    assert (f.emax, f.max_normal) == (emax, max_normal)
    assert not f.is_vector


def test_int8_is_sign_magnitude_fixed_point_with_step_one_64th():
    f = formats.get("int8")
    assert f.is_integer and f.dtype == np.dtype(np.int8) and f.bits == 8
    assert f.min_subnormal == f.min_normal == f.eps == 1 / 64
    assert f.max_significand == 127
    assert not (f.has_inf or f.has_nan)
    np.testing.assert_array_equal(formats.positive_codes(f), np.arange(1, 128) / 64)


def test_vector_formats():
    assert formats.get("bf16").is_vector and formats.get("fp32").is_vector
    assert formats.get("bf16").dtype == np.dtype(ml_dtypes.bfloat16)
    assert formats.get("fp32").dtype == np.dtype(np.float32)


@pytest.mark.parametrize(
    "alias, name",
    [("e4m3", "fp8_e4m3"), ("MXFP8_E4M3", "fp8_e4m3"), (" float8_e4m3fn ", "fp8_e4m3"),
     ("e5m2", "fp8_e5m2"), ("mxfp6_e3m2", "fp6_e3m2"), ("float6_e2m3fn", "fp6_e2m3"),
     ("mxfp4", "fp4_e2m1"), ("mxint8", "int8"), ("bfloat16", "bf16"), ("float32", "fp32"),
     ("FP8_E4M3", "fp8_e4m3")],
)
def test_get_aliases(alias, name):
    assert formats.get(alias) is formats.FORMATS[name]


def test_get_passes_a_format_through_and_formats_are_frozen_and_hashable():
    f = formats.get("fp8_e4m3")
    assert formats.get(f) is f
    assert {f: 1}[formats.get("e4m3")] == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.emax = 9


@pytest.mark.parametrize("bad", ["fp8", "e4m4", "", 3, None])
def test_get_unknown_names_the_value_and_every_valid_name(bad):
    with pytest.raises(ValueError) as err:
        formats.get(bad)
    msg = str(err.value)
    assert repr(bad) in msg
    for name in formats.names():
        assert name in msg


def test_names_is_the_catalogue():
    assert set(formats.names()) == set(MX) | {"bf16", "fp32"}


@pytest.mark.parametrize("name, count", [("fp8_e4m3", 126), ("fp8_e5m2", 123), ("fp6_e3m2", 31),
                                         ("fp6_e2m3", 31), ("fp4_e2m1", 7), ("int8", 127)])
def test_positive_codes_are_every_positive_finite_code(name, count):
    f = formats.get(name)
    codes = formats.positive_codes(f)
    assert codes.dtype == np.float64 and codes.shape == (count,)
    assert np.all(np.diff(codes) > 0)
    assert codes[0] == f.min_subnormal and codes[-1] == f.max_normal
    if not f.is_integer:
        values = _all_code_values(f)
        expected = np.unique(values[np.isfinite(values) & (values > 0)])
        np.testing.assert_array_equal(codes, expected)


def test_e4m3_sawtooth():
    codes, gaps = formats.relative_gaps("fp8_e4m3")
    all_codes = formats.positive_codes("fp8_e4m3")
    np.testing.assert_array_equal(codes, all_codes[:-1])
    assert all_codes[-1] == 448.0
    np.testing.assert_allclose(gaps, np.diff(all_codes) / codes, rtol=0)
    normal = codes >= 2.0**-6
    assert gaps[normal].max() == 0.125 and gaps[normal].min() == pytest.approx(1 / 15, abs=1e-15)
    for k in range(-6, 8):  # every full normal binade [2**k, 2**(k+1))
        in_binade = (codes >= 2.0**k) & (codes < 2.0 ** (k + 1))
        g = gaps[in_binade]
        assert len(g) == 8 and g[0] == 0.125 and g[-1] == pytest.approx(1 / 15, abs=1e-15)
        assert np.all(np.diff(g) < 0)  # falls steadily across the binade
    top = gaps[codes >= 256]  # last binade stops at 448: 256..416
    assert top[0] == 0.125 and top[-1] == pytest.approx(32 / 416, abs=1e-15)
    assert gaps[0] == 1.0  # subnormals: 2**-9 -> 2**-8


def test_positive_codes_refuses_vector_formats():
    with pytest.raises(ValueError, match="bf16"):
        formats.positive_codes("bf16")
