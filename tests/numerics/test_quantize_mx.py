"""mx_proxy.numerics.mx: the MX arithmetic written once, shared by mxp.quantize (XLA) and
the Pallas kernel bodies. The per-block quantities as the XLA path stores them
(in float32 and bfloat16 words) must equal the table of every possible block,
and the Triton-safe bit helpers must give XLA's results."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import mx_proxy as mxp
from mx_proxy.numerics import scale_rules
from mx_proxy.numerics.mx import bits as B
from mx_proxy.numerics.mx import block_scale as scale
from mx_proxy.numerics.mx import element
from mx_proxy.pallas import quantize as mxq

FORMATS = tuple(n for n in mxp.formats.names() if not mxp.formats.get(n).is_vector)


def _amax_sweep() -> np.ndarray:
    """Block amax bit patterns: every exponent field with mantissas 0, 1, max, the max-normal
    pattern of each format's binade (rceil's threshold) and its neighbours, random ones."""
    f = np.arange(256, dtype=np.uint32) << 23
    mants = [0, 1, 0x7FFFFF, 0x400000, 0x600000, 0x700000, 0x780000, 0x5FFFFF, 0x600001, 0x6FFFFF, 0x700001]
    rng = np.random.default_rng(0)
    return np.unique(np.concatenate([f | m for m in mants] + [rng.integers(0, 0x7FFFFFFF, 4096).astype(np.uint32)]))


@pytest.mark.parametrize("word", [B.F32, B.BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name", scale_rules.names())
@pytest.mark.parametrize("fmt", FORMATS)
def test_per_block_quantities_equal_their_rows_of_the_table(fmt, name, word):
    f, rule = mxp.formats.get(fmt), scale_rules.get(name)
    if word == B.BF16 and f.mantissa_bits > B.BF16.fraction:
        pytest.skip(f"{fmt} is not rounded on bf16 words")
    amax = _amax_sweep() >> (32 - word.bits)  # bf16: the top half of each pattern (its bf16 truncation)
    got = jax.jit(lambda a: scale.per_block_quantities(a, f, rule, word))(jnp.asarray(amax.astype(word.uint)))
    rows = scale.word_table(f, rule, word)[np.asarray(scale.table_row(jnp.asarray(amax.astype(np.uint32)
                                                                                 << (32 - word.bits)), f, rule))]
    nan = rows[:, 1] != 0
    assert np.array_equal(np.asarray(got.nan), nan)
    for k, name in enumerate(("e", "nan", "sat", "v", "step", "half")):
        if name != "nan":
            assert np.array_equal(np.asarray(getattr(got, name)).astype(np.int64)[~nan], rows[~nan, k]), name
            assert getattr(got, name).dtype == (jnp.int32 if name == "e" else word.sint if name == "v" else word.uint)


def test_shifts_give_xla_results_for_every_amount():
    x = jnp.asarray(np.array([0x80000001, 0xFFFFFFFF, 1, 0x12345678], np.uint32))[:, None]
    n = jnp.arange(-40, 41, dtype=jnp.int32)[None, :]
    assert np.array_equal(np.asarray(B.shl(x, n)), np.asarray(jax.lax.shift_left(x, n.astype(jnp.uint32))))
    assert np.array_equal(np.asarray(B.shr(x, n)), np.asarray(jax.lax.shift_right_logical(x, n.astype(jnp.uint32))))
    k = jnp.arange(0, 32, dtype=jnp.int32)[None, :]
    assert np.array_equal(np.asarray(B.shl_mod32(x, k)), np.asarray(jax.lax.shift_left(x, k.astype(jnp.uint32))))


def test_clz_on_the_int32_view():
    a = jnp.asarray(np.array([0, 1, 2, 0x7FFFFF, 0x800000, 0x7F800000, 0x80000000, 0xFFFFFFFF], np.uint32))
    assert np.asarray(B.clz(a)).tolist() == [32, 31, 30, 9, 8, 1, 0, 0]
    assert B.clz(a).dtype == jnp.int32


def test_compose_bits_is_exact():
    rng = np.random.default_rng(1)
    k = rng.integers(0, 1 << 24, 2000).astype(np.uint32)
    e = rng.integers(-180, 120, 2000).astype(np.int32)
    got = np.asarray(B.f32(B.compose_bits(jnp.asarray(k), jnp.asarray(e))))
    want = (k.astype(np.float64) * np.exp2(e.astype(np.float64)))
    with np.errstate(over="ignore"):
        fits = (want == 0) | ((want >= 2.0**-149) & (want < 2.0**128) & (want == want.astype(np.float32)))
    assert np.array_equal(got[fits], want[fits].astype(np.float32))


@pytest.mark.parametrize("fmt", FORMATS)
def test_encode_decode_round_trip_every_code(fmt):
    f = mxp.formats.get(fmt)
    codes = np.arange(1 << f.bits, dtype=np.uint32)
    bits = np.asarray(element.decode(jnp.asarray(codes), np.uint8(127 - 3), f))  # scale 2**-3
    finite = np.isfinite(B.f32(jnp.asarray(bits)))
    e = jnp.int32(-3)
    back = np.asarray(element.encode(jnp.asarray(bits), e, jnp.bool_(False), f))
    if f.is_integer:  # -0 keeps its sign bit: sign-magnitude round trip is exact
        assert np.array_equal(back, codes)
    else:
        assert np.array_equal(back[np.asarray(finite)], codes[np.asarray(finite)])
        values = codes.astype(np.uint8).view(f.dtype).astype(np.float64) * 2.0**-3
        got = np.asarray(B.f32(jnp.asarray(bits)), np.float64)
        assert np.array_equal(got[np.asarray(finite)], values[np.asarray(finite)])


def test_fp6_and_fp4_values_are_e4m3_values():
    # why FP6/FP4 operands can reach FP8 tensor cores with no loss: each of their values is an E4M3 value
    for fmt in ("fp6_e3m2", "fp6_e2m3", "fp4_e2m1"):
        vals = mxp.formats.positive_codes(fmt).astype(np.float32)
        assert np.array_equal(vals.astype(ml_dtypes.float8_e4m3fn).astype(np.float32), vals)


def test_the_kernels_and_proxy_quantize_share_the_arithmetic():
    # the kernel wrappers hold no bit arithmetic of their own: they call mx_proxy.numerics.mx
    arithmetic = ("round", "scale_exponent", "max_normal", "pow2", "floor_log2", "significand", "compose")
    own = [n for n in vars(mxq) if n.startswith("_") and any(a in n for a in arithmetic)]
    assert own == []
    x = jnp.asarray(np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32))
    spec = mxp.MXSpec("fp6_e2m3", scale_rule="rceil")
    assert np.array_equal(np.asarray(mxq.fake_quantize_tile(x, spec, 1)), np.asarray(mxp.quantize(x, spec, 1)))
