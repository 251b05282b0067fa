"""mx_proxy.pallas.quantize: the in-kernel MX bit arithmetic, the packed quantize
kernel and the dequantize kernel, bit for bit against ``mxp.quantize`` and
an independent float64 / ml_dtypes oracle. Kernels run interpreted on CPU."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import mx_proxy as mxp
from mx_proxy.pallas import quantize as mxq

FORMATS = mxq.MX_FORMATS
FLOAT_FORMATS = tuple(f for f in FORMATS if not mxp.formats.get(f).is_integer)


# ----------------------------------------------------------------------------
# an independent oracle: float64 arithmetic and ml_dtypes casts


def oracle_quantize(x, spec: mxp.MXSpec, axis: int = 1) -> np.ndarray:
    """float32 MX fake-quantization of a 2-D array blocked along ``axis`` (whole blocks)."""
    fmt, bs = spec.element, spec.block_size
    x = np.moveaxis(np.asarray(x, np.float32), axis, 1)
    r, n = x.shape
    xb = x.reshape(r, n // bs, bs).astype(np.float64)
    with np.errstate(invalid="ignore"):
        amax = np.max(np.abs(xb), axis=2, keepdims=True)
    nan = ~np.isfinite(amax)
    amax = np.where(nan, 1.0, amax)
    _, ex = np.frexp(amax)  # amax = f * 2**ex, f in [0.5, 1)
    floor_log2 = np.where(amax > 0, ex - 1, -1000)
    e = np.maximum(floor_log2 - fmt.emax, -127)
    if spec.scale_rule.name == "rceil":
        e = e + (amax > fmt.max_normal * np.exp2(e.astype(np.float64)))
    nan |= e > 127
    e = np.minimum(e, 127)
    # rceil never saturates, also where max_normal * 2**e exceeds float32 (a value rounding past
    # float32 max then becomes Inf, as in mx_proxy.numerics.reference)
    sat = fmt.max_normal
    y = np.clip(xb / np.exp2(e.astype(np.float64)), -sat, sat)
    y = np.where(np.isfinite(y), y, 0.0)
    if spec.rounding == "even":
        if fmt.is_integer:
            v = np.round(y * 64) / 64  # numpy rounds half to even
        else:
            v = y.astype(fmt.dtype).astype(np.float64)
    else:  # away
        ay = np.abs(y)
        if fmt.is_integer:
            step = np.full_like(ay, 2.0**-6)
        else:
            _, ey = np.frexp(np.where(ay > 0, ay, 1.0))
            step = np.exp2(np.maximum(ey - 1, fmt.emin) - fmt.mantissa_bits).astype(np.float64)
        v = np.floor(ay / step + 0.5) * step
    v = np.copysign(v, y)
    with np.errstate(over="ignore"):  # rceil can round past float32 max: +Inf
        q = (v * np.exp2(e.astype(np.float64))).astype(np.float32)
    q = np.where(nan, np.float32(np.nan), q).reshape(r, n)
    return np.moveaxis(q, 1, axis)


def same_bits(a, b) -> bool:
    """Bitwise equality, all NaNs counted equal (proxy writes one canonical NaN)."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    na, nb = np.isnan(a), np.isnan(b)
    return bool(np.array_equal(na, nb) and np.array_equal(a.view(np.uint32)[~na], b.view(np.uint32)[~nb]))


# ----------------------------------------------------------------------------
# test data: one row per kind of block, blocks of 32 along axis 1


def edge_case_matrix(seed: int = 0, width: int = 128) -> np.ndarray:
    """Rows covering: wide dynamic range, tiny (subnormal float32) and huge
    magnitudes, clustered values (LayerNorm-like), zero blocks, NaN and Inf
    blocks, a lone subnormal, float32 max."""
    rng = np.random.default_rng(seed)
    g = lambda: rng.standard_normal(width)  # noqa: E731
    rows = [
        g(),
        g() * np.exp2(rng.integers(-30, 30, width)),
        g() * 1e-39,  # float32 subnormals
        g() * 1e-30,
        g() * 3e37,
        1.0 + 0.01 * g(),  # clustered near 1: E4M3 floor scale clamps most
        np.where(np.arange(width) < 64, 0.0, g()),  # zero blocks
        np.where(np.arange(width) == 3, np.nan, g()),  # NaN block
        np.where(np.arange(width) == 40, -np.inf, g()),  # Inf block
        np.where(np.arange(width) % 32 == 0, 1e-45, 0.0),  # smallest subnormal alone
        np.full(width, np.float32(3.4028235e38)) * np.sign(g()),
        np.round(g() * 8) / 8,  # many exact grid points and ties
    ]
    return np.stack(rows).astype(np.float32)


def tie_matrix(fmt_name: str) -> np.ndarray:
    """Every code, every midpoint between neighbouring codes, and their float32
    neighbours, in blocks whose scale exponent is e = 0 - j for several j
    (rows scaled by 2**-j), so ties fall on every grid position."""
    fmt = mxp.formats.get(fmt_name)
    codes = mxp.formats.positive_codes(fmt)
    pts = np.concatenate([[codes[0] / 2], codes, (codes[:-1] + codes[1:]) / 2]).astype(np.float32)
    pts = np.concatenate([pts, np.nextafter(pts, np.float32(0)), np.nextafter(pts, np.float32(np.inf))])
    per_block = 31
    nb = -(-len(pts) // per_block)
    base = np.zeros((nb, 32), np.float32)
    base[:, 0] = fmt.max_normal  # fixes e = 0 for the floor and the rceil rule
    base[:, 1:].flat[: len(pts)] = pts
    base[:, 1:].flat[len(pts):] = 0
    base[1::2] *= -1
    rows = [base.reshape(1, -1) * np.float32(2.0**-j) for j in (0, 1, 7, 60, 120, 127, 133)]
    return np.concatenate(rows).astype(np.float32)


SPECS = [mxp.MXSpec(f, scale_rule=r, rounding=m)
         for f in FORMATS for r in ("floor", "rceil") for m in ("even", "away")]


@functools.partial(jax.jit, static_argnames=("spec", "axis"))
def _tile(x, spec, axis):
    return mxq.fake_quantize_tile(x, spec, axis)


# ----------------------------------------------------------------------------
# the tile arithmetic (shared by every kernel)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_tile_matches_proxy_and_oracle(spec):
    x = edge_case_matrix()
    got = np.asarray(_tile(jnp.asarray(x), spec, 1))
    assert same_bits(got, mxp.quantize(jnp.asarray(x), spec, 1))
    assert same_bits(got, oracle_quantize(x, spec, 1))
    if spec.rounding == "away" and spec.scale_rule.name == "rceil":  # the same along axis 0 (a subset: compile time)
        assert same_bits(_tile(jnp.asarray(x.T), spec, 0), got.T)


@pytest.mark.parametrize("rounding", ["even", "away"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_tile_matches_oracle_on_every_code_and_tie(fmt, rounding):
    spec = mxp.MXSpec(fmt, rounding=rounding)
    x = tie_matrix(fmt) if fmt != "int8" else np.concatenate(
        [np.full((4, 1), 127 / 64, np.float32), (np.arange(4 * 31).reshape(4, 31) / 128).astype(np.float32)], axis=1)
    got = np.asarray(_tile(jnp.asarray(x), spec, 1))
    assert same_bits(got, oracle_quantize(x, spec, 1))


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp6_e2m3", "fp4_e2m1"])
def test_proxy_agrees_with_kernel_at_subnormal_ties(fmt):
    spec = mxp.MXSpec(fmt)
    x = tie_matrix(fmt)
    kernel = np.asarray(_tile(jnp.asarray(x), spec, 1))
    assert same_bits(mxp.quantize(jnp.asarray(x), spec, 1), kernel)


def test_subnormal_tie_example():
    # 1.5 * 2**-9 lies halfway between E4M3's two smallest codes (2**-9, 2**-8) in a block with e = 0
    x = np.zeros((1, 32), np.float32)
    x[0, 0], x[0, 1] = 448.0, 1.5 * 2.0**-9
    got = np.asarray(_tile(jnp.asarray(x), mxp.MXSpec("fp8_e4m3"), 1))
    assert got[0, 1] == np.float32(1.5 * 2.0**-9).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) == 2.0**-8


# ----------------------------------------------------------------------------
# decode: all 256 byte values x many scales vs ml_dtypes


@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_every_code_and_scale(fmt):
    f = mxp.formats.get(fmt)
    width = 256
    codes = np.tile(np.arange(width) % (1 << f.bits), (8, 1)).astype(np.uint8)
    scales = np.array([0, 1, 20, 127, 128, 200, 254, 255], np.uint8)[:, None].repeat(width // 32, axis=1)
    t = mxq.MXTensor(jnp.asarray(codes), jnp.asarray(scales), fmt, 32, 1, width)
    got = np.asarray(jax.jit(mxq.decode_tile, static_argnums=(2, 3, 4))(t.codes, t.scales, f, 1, 32))
    assert same_bits(got, mxq.dequantize_reference(t))


# ----------------------------------------------------------------------------
# the quantize and dequantize kernels (interpreted)

KERNEL_CASES = [
    # (spec, shape, axis): ragged lengths, both axes, rank 3, all formats and rules
    (mxp.MXSpec("fp8_e4m3"), (12, 100), 1),
    (mxp.MXSpec("fp8_e4m3", scale_rule="rceil", rounding="away"), (100, 12), 0),
    (mxp.MXSpec("fp8_e5m2", rounding="away"), (12, 70), -1),
    (mxp.MXSpec("fp6_e3m2", scale_rule="rceil"), (3, 40, 5), 1),
    (mxp.MXSpec("fp6_e2m3"), (12, 128), 1),
    (mxp.MXSpec("fp4_e2m1", scale_rule="rceil"), (33, 12), 0),
    (mxp.MXSpec("int8"), (12, 96), 1),
    (mxp.MXSpec("int8", rounding="away", block_size=16), (5, 2, 40), 2),
]


@pytest.mark.parametrize("spec,shape,axis", KERNEL_CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_quantize_packed_kernel(spec, shape, axis):
    x = np.resize(edge_case_matrix().ravel(), shape).astype(np.float32)  # blocks of every kind, mixed at edges
    t = mxq.quantize_packed(jnp.asarray(x), spec, axis)
    ref = mxq.quantize_packed_reference(x, spec, axis)
    ax = axis % len(shape)
    assert (t.axis, t.length, t.block_size, t.element) == (ax, shape[ax], spec.block_size, spec.element.name)
    assert t.codes.dtype == jnp.uint8 and t.scales.dtype == jnp.uint8
    assert np.array_equal(np.asarray(t.codes), np.asarray(ref.codes))
    assert np.array_equal(np.asarray(t.scales), np.asarray(ref.scales))
    fq = mxp.quantize(jnp.asarray(x), spec, axis)
    assert same_bits(mxq.dequantize(t), fq)  # the dequantize kernel
    assert same_bits(mxq.dequantize_reference(t), fq)
    assert t.shape == x.shape


def test_quantize_packed_bf16_input_and_codes_views():
    x = (np.random.default_rng(1).standard_normal((8, 64)) * 3).astype(ml_dtypes.bfloat16)
    spec = mxp.MXSpec("fp8_e4m3")
    t = mxq.quantize_packed(jnp.asarray(x), spec, 1)
    assert same_bits(mxq.dequantize(t), mxp.quantize(jnp.asarray(x), spec, 1))
    elem = t.codes_as_ml_dtype()
    assert elem.dtype == ml_dtypes.float8_e4m3fn
    scale = np.exp2(np.repeat(np.asarray(t.scales).astype(np.float64) - 127, 32, axis=1))
    assert same_bits((elem.astype(np.float64) * scale).astype(np.float32), mxq.dequantize(t))
    assert t.scales_as_e8m0().dtype == jnp.float8_e8m0fnu


def test_nan_block_layout():
    x = np.ones((2, 64), np.float32)
    x[0, 3] = np.nan
    for fmt, nan_code in (("fp8_e4m3", 0x7F), ("fp8_e5m2", 0x7F), ("fp4_e2m1", 0), ("int8", 0)):
        t = mxq.quantize_packed(jnp.asarray(x), mxp.MXSpec(fmt), 1)
        assert np.asarray(t.scales)[0, 0] == mxq.NAN_SCALE and np.asarray(t.scales)[0, 1] != mxq.NAN_SCALE
        assert np.all(np.asarray(t.codes)[0, :32] == nan_code)
        assert np.all(np.isnan(np.asarray(mxq.dequantize(t))[0, :32]))


def test_int8_keeps_negative_zero():
    x = np.zeros((1, 32), np.float32)
    x[0, 0], x[0, 1] = 1.0, -1e-6  # rounds to -0
    spec = mxp.MXSpec("int8")
    t = mxq.quantize_packed(jnp.asarray(x), spec, 1)
    assert np.asarray(t.codes)[0, 1] == 0x80
    assert same_bits(mxq.dequantize(t), mxp.quantize(jnp.asarray(x), spec, 1))


# ----------------------------------------------------------------------------
# bad input


def test_bad_input_is_refused():
    x = jnp.ones((4, 64))
    with pytest.raises(ValueError, match="stochastic"):
        mxq.quantize_packed(x, mxp.MXSpec("fp8_e4m3", rounding="stochastic"), 1)
    with pytest.raises(ValueError, match="power of two"):
        mxq.quantize_packed(x, mxp.MXSpec("fp8_e4m3", block_size=24), 1)
    with pytest.raises(ValueError, match="MXSpec"):
        mxq.quantize_packed(x, "fp8_e4m3", 1)
    with pytest.raises(ValueError, match="out of range"):
        mxq.quantize_packed(x, mxp.MXSpec("fp8_e4m3"), 2)
    with pytest.raises(ValueError, match="rank"):
        mxq.quantize_packed(jnp.float32(1.0), mxp.MXSpec("fp8_e4m3"), 0)
    with pytest.raises(ValueError, match="MXTensor"):
        mxq.dequantize(x)
    with pytest.raises(ValueError, match="interpret"):
        mxq.quantize_packed(x, mxp.MXSpec("fp8_e4m3"), 1, interpret="yes")
