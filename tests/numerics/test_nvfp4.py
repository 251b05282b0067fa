"""NVFP4 (``MXSpec(scale_format="e4m3")``): E2M1 elements, E4M3 block scales, one
float32 scale per tensor -- against the exact numpy reference, a float32 port
of Transformer Engine's recipe, and JAX's own NVFP4 quantizer.

As in test_quantize, compilation dominates: ``_run`` quantizes with every spec
of ``SPECS`` (and computes the statistics) in one compilation per shape, and
the tests share the shape (48, 80) wherever they can.
"""

import functools

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from test_quantize import assert_same_bits, assert_same_stats

from mx_proxy.numerics.formats import positive_codes
from mx_proxy.numerics.quantize import (
    E4M3_SCALE_RULES,
    NAN_SCALE_EXP,
    NVFP4,
    NVFP4_2D,
    SCALE_FORMATS,
    ZERO_SCALE_EXP,
    MXSpec,
    quantize,
    quantize_stats,
)
from mx_proxy.numerics.reference import reference_quantize, reference_stats, round24

KEY = jax.random.key(5, impl="rbg")  # see test_quantize: rbg keys compile faster
SPECS = tuple(s.replace(rounding=o) for s in (NVFP4, NVFP4_2D) for o in ("even", "away", "stochastic"))
PROPERTY = settings(deadline=None, derandomize=True)
F32_MAX = np.finfo(np.float32).max


@functools.partial(jax.jit, static_argnames=("specs",))
def _run_jit(x, specs, key):
    keys = [key if s.rounding == "stochastic" else None for s in specs]
    return [(quantize(x, s, key=k), quantize_stats(x, s, key=k)) for s, k in zip(specs, keys)]


def _run(x, spec=None, key=KEY):
    """[(quantize(x, s), quantize_stats(x, s)) for s in SPECS] (stochastic specs
    with ``key``) in one compilation per shape; with ``spec`` only its pair."""
    out = _run_jit(x, SPECS, key)
    return out if spec is None else out[SPECS.index(spec)]


def _rbits(spec, shape, key=KEY):
    return np.asarray(jax.random.bits(key, shape, jnp.uint32)) if spec.rounding == "stochastic" else None


def _signs(rng, shape):
    return np.where(rng.random(shape) < 0.5, -1.0, 1.0)


def _inputs(shape=(48, 80), seed=0):
    """Named float32 test tensors of one shape (each has its own global scale)."""
    rng = np.random.default_rng(seed)
    normal = rng.standard_normal(shape)
    out = {
        "normal": normal,
        "wide": normal * np.exp(rng.uniform(-12, 12, shape)),  # many blocks with a zero E4M3 scale
        "layernorm": np.exp(0.02 * rng.standard_normal(shape)),  # values near 1.0
        "dyadic": rng.integers(-48, 49, shape) * 2.0 ** rng.integers(-4, 0, shape),  # exact E2M1 ties
        "row_scales": normal * 2.0 ** rng.integers(-8, 8, (shape[0], 1)),
        "tiny": normal * 2.0**-133,  # amax ~ 2**-131: G ~ 2**-143, subnormal outputs
        "subnormal": _signs(rng, shape) * rng.integers(1, 2**23, shape).astype(np.uint32).view(np.float32),
        "top": _signs(rng, shape) * 2.0**127 * rng.uniform(1, 2, shape),  # amax near float32 max
    }
    z = normal.copy()
    z[:, 16:32] = 0.0  # zero blocks (and zero tiles) inside a non-zero tensor
    z[:16, 48:64] *= 2.0**-30  # blocks whose E4M3 scale rounds to 0: quantized to 0
    z[0, 0], z[1, 1] = -0.0, 0.0
    out["zero_blocks"] = z
    out["top"].flat[0] = F32_MAX
    return {k: np.asarray(v, np.float32) for k, v in out.items()}


INPUTS = _inputs()
RAGGED = _inputs((37, 50), seed=1)


# ----------------------------------------------------------------------------
# the reference, bit for bit


@pytest.mark.parametrize("inputs", [INPUTS, RAGGED], ids=["48x80", "ragged37x50"])
def test_equals_reference_bit_for_bit(inputs):
    """NVFP4 and NVFP4 2-D (16x16 tiles), even / away / stochastic (same key),
    every input kind; values and all statistics."""
    for _name, x in inputs.items():
        for spec, (q, stats) in zip(SPECS, _run(x)):
            rb = _rbits(spec, x.shape)
            assert_same_bits(q, reference_quantize(x, spec, -1, rb))
            ref = reference_stats(x, spec, -1, rb)
            assert_same_stats(stats, ref, x.size)
            assert_same_bits(stats.block_scale, ref.block_scale)
            assert_same_bits(stats.global_scale, np.float32(ref.global_scale))


def test_reference_cast_and_arithmetic_rounding_agree():
    for x in INPUTS.values():
        for spec in (NVFP4, NVFP4_2D):
            assert_same_bits(reference_quantize(x, spec), reference_quantize(x, spec, use_cast=False))


def test_2d_tiles_commute_with_transposition():
    transposed = jax.jit(lambda a: quantize(a.T, NVFP4_2D))
    for x in RAGGED.values():
        q, _ = _run(x, NVFP4_2D)
        assert_same_bits(transposed(x), np.asarray(q).T)


# ----------------------------------------------------------------------------
# Transformer Engine's recipe, ported to numpy float32


def _te_nvfp4(x, tile=(1, 16)):
    """TE's NVFP4QuantizerRef._quantize_blockwise_reference (pow_2_scales=False,
    no RHT, no 4over6), line by line in numpy float32 (IEEE, with subnormals):
    returns (signed E2M1 codes, E4M3 scales per element, G = 1 / S_enc)."""
    f32 = np.float32
    x = np.asarray(x, f32)
    ty, tx = tile
    m, n = x.shape
    tiles = np.abs(x).reshape(m // ty, ty, n // tx, tx).max(axis=(1, 3))
    vec_max = np.repeat(np.repeat(tiles, ty, 0), tx, 1)  # each element's block amax
    amax = np.max(np.abs(x))
    with np.errstate(divide="ignore", over="ignore"):
        s_enc = min(f32(448.0) * f32(6.0) / amax, F32_MAX)
        s_enc = f32(1.0) if s_enc == 0 else s_enc
        g = f32(1.0) / s_enc
        mult = s_enc * (f32(1.0) / f32(6.0))  # torch.reciprocal(FLOAT4_E2M1_MAX)
        d = np.clip(np.minimum(vec_max * mult, F32_MAX), -448, 448).astype(ml_dtypes.float8_e4m3fn)
        s = d.astype(f32)
        enc = np.minimum(f32(1.0) / (s * g), F32_MAX)
        v = np.clip(x * enc, -6, 6)  # x * float32 max in zero-scale blocks
    return v.astype(ml_dtypes.float4_e2m1fn).astype(f32), s, g


def _dequantize(q, s, g):
    """fl((q * s) * G): exact in float64, one rounding to float32."""
    return (q.astype(np.float64) * s * np.float64(g)).astype(np.float32)


@pytest.mark.parametrize("spec", [NVFP4, NVFP4_2D], ids=lambda s: s.name)
def test_codes_and_scales_are_transformer_engines(spec):
    """Where TE's float32 arithmetic stays in the normal range (amax >= 2**-105)
    our block scales, global scale and elements are TE's bit for bit (we
    dequantize both as fl((q * s) * G)). Below, TE's S_enc = 2688 / amax
    saturates at float32 max and G = 1 / S_enc goes subnormal: its results
    lose accuracy, ours stay exactly scaled copies (see
    test_scaling_by_a_power_of_two_scales_the_output)."""
    tile = (16, 16) if spec.block_dims == 2 else (1, 16)
    for name, x in INPUTS.items():
        if name in ("tiny", "subnormal"):
            continue
        q_te, s_te, g_te = _te_nvfp4(x, tile)
        q, stats = _run(x, spec)
        assert_same_bits(q, _dequantize(q_te, s_te, g_te))
        assert float(stats.global_scale) == g_te
        np.testing.assert_array_equal(np.repeat(np.repeat(np.asarray(stats.block_scale), tile[0], 0), tile[1], 1), s_te)

    x = INPUTS["layernorm"] * np.float32(2.0**-120)  # TE: 2688 / amax overflows, G = 1 / float32 max = 2**-128
    q_te, s_te, g_te = _te_nvfp4(x, tile)
    assert g_te == 2.0**-128
    q, _ = _run(x, spec)
    assert np.mean(np.asarray(q) == _dequantize(q_te, s_te, g_te)) < 0.5
    assert_same_bits(q, reference_quantize(x, spec))


# ----------------------------------------------------------------------------
# JAX's NVFP4 quantizer


@jax.jit
def _jax_nvfp4_codes(x, g):  # g traced: a constant global scale would be folded into the code
    from jax._src.cudnn.scaled_matmul_stablehlo import quantize as jax_quantize

    return jax_quantize(x, jax.nn.get_scaled_dot_general_config("nvfp4", global_scale=g))


def _jax_nvfp4(x, g):
    """jax._src.cudnn.scaled_matmul_stablehlo.quantize in "nvfp4" mode (the
    quantizer of jax.nn.scaled_dot_general with get_scaled_dot_general_config
    ('nvfp4', global_scale=g)), dequantized exactly as fl((q * s) * g)."""
    q, s = _jax_nvfp4_codes(x, jnp.float32(g))
    s = np.repeat(np.asarray(s).astype(np.float32), 16, axis=-1)
    return _dequantize(np.asarray(q).astype(np.float32), s, g), s


@pytest.mark.parametrize("j", [-9, 0, 6])
def test_matches_jax_nvfp4_quantizer_with_a_power_of_two_global_scale(j):
    """JAX takes the global decode scale G from the caller and computes
    x' = x / G, s = E4M3(clip(max|x'| / 6, 0, 448)), q = E2M1(clip(x' / s, +-6))
    (jax 0.10.2). XLA compiles every one of those divisions (by a broadcast
    scalar, by the constant 6, by the per-block s) into a multiplication by the
    float32-rounded reciprocal, which is TE's order of operations; so with
    G = 2**j (amax = 2688 * 2**j, then G = fl(1 / fl(2688 / amax)) = 2**j exactly
    and x' = x * 2**-j is exact) JAX's values and scales equal ours bit for bit,
    exact E2M1 ties ("dyadic") included.

    Where they differ, and why (so the inputs here avoid it):
    * G not a power of two: JAX rounds x' = fl(x * fl(1 / G)) first, we never
      form x' (d = fl(max|x| * fl(S_enc / 6)), v = fl(|x| * fl(1 / fl(s * G))));
      both round twice, differently, so rare scales and elements differ.
    * As written (true divisions, e.g. on a backend without those rewrites):
      max|x'| / 6 and x' / s are rounded once, so an E4M3 or E2M1 tie can
      resolve differently from fl(max|x'| * fl(1/6)) and fl(x' * fl(1/s)).
    * A zero block scale: JAX computes 0 * (1 / 0) = NaN; we return zeros.
      Inputs here have no zero or negligible blocks.
    * Subnormal float32 inputs and scales: XLA:CPU flushes them in JAX's
      float ops; we keep them. Inputs here stay normal.
    """
    for name in ("normal", "layernorm", "dyadic", "row_scales"):
        x = INPUTS[name].copy()
        x *= np.float32(2688.0 * 2.0**j) / np.max(np.abs(x))  # exact: power-of-two ratios only for dyadic
        x.flat[7] = np.float32(2688.0 * 2.0**j)  # amax exactly 2688 * 2**j
        q, stats = _run(x, NVFP4)
        assert np.all(np.asarray(stats.block_scale) > 0)  # no zero scales
        assert float(stats.global_scale) == 2.0**j
        theirs, s = _jax_nvfp4(x, 2.0**j)
        np.testing.assert_array_equal(np.repeat(np.asarray(stats.block_scale), 16, axis=-1), s)
        assert_same_bits(q, theirs)
        if name == "dyadic":  # ties really occurred
            v = np.abs(x) / np.float32(2.0**j) / s
            assert np.sum(np.isin(v, [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])) > 50


# ----------------------------------------------------------------------------
# the global scale


_MODERATE = st.tuples(st.booleans(), st.one_of(st.just(0.0), st.floats(2.0**-10, 2.0**10, width=32))).map(
    lambda t: -t[1] if t[0] else t[1])


@settings(PROPERTY, max_examples=40)
@given(x=hnp.arrays(np.float32, (2, 32), elements=_MODERATE), j=st.integers(-90, 90))
def test_scaling_by_a_power_of_two_scales_the_output(x, j):
    """q(x * 2**j) = q(x) * 2**j exactly while every output stays a normal
    float32 (|x| in [2**-10, 2**10], |j| <= 90: the smallest non-zero output,
    >= 2**-10 * 2**-9 * G * 2**-1, stays above 2**-126), also where TE's own
    float32 global scale would saturate (amax * 2**j < 2**-105)."""
    q = np.asarray(quantize(x, NVFP4)).astype(np.float64)
    q_scaled = quantize(np.asarray(x * 2.0**j, np.float32), NVFP4)
    assert_same_bits(q_scaled, np.asarray(q * 2.0**j, np.float32))


def test_tiny_amax_keeps_block_scales_and_shifts_the_global_one():
    """amax 2**-140 (subnormal input, G ~ 2**-151 below float32): the E4M3 block
    scales are those of the unscaled tensor and floor(log2(s * G)) moves by
    exactly -140; the values are the reference's (subnormal outputs)."""
    x = INPUTS["normal"].astype(np.float64)
    x = np.asarray(np.rint(x / np.max(np.abs(x)) * 2**9) / 2**9, np.float32)  # multiples of 2**-9, amax 1
    tiny = np.asarray(x.astype(np.float64) * 2.0**-140, np.float32)
    assert np.all(tiny.astype(np.float64) == x.astype(np.float64) * 2.0**-140)  # exact (subnormal) inputs
    q, stats = _run(tiny, NVFP4)
    _, stats0 = _run(x, NVFP4)
    assert_same_bits(stats.block_scale, np.asarray(stats0.block_scale))
    e, e0 = np.asarray(stats.scale_exponent), np.asarray(stats0.scale_exponent)
    np.testing.assert_array_equal(e[e0 != ZERO_SCALE_EXP], e0[e0 != ZERO_SCALE_EXP] - 140)
    assert_same_bits(q, reference_quantize(tiny, NVFP4))
    assert np.count_nonzero(np.asarray(q)) > 0.8 * x.size


# ----------------------------------------------------------------------------
# zeros, NaN, zero blocks


def test_all_zero_tensor_gives_zeros():
    x = np.zeros((48, 80), np.float32)
    x[1] = -0.0
    for _spec, (q, stats) in zip(SPECS, _run(x)):
        assert_same_bits(q, x)  # signs kept
        assert float(stats.flushed_frac) == 0 and float(stats.nan_frac) == 0 and float(stats.global_scale) == 1.0
        assert np.all(np.asarray(stats.scale_exponent) == ZERO_SCALE_EXP)
        assert np.all(np.asarray(stats.block_scale) == 0)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_or_inf_anywhere_makes_the_whole_tensor_nan(bad):
    x = INPUTS["normal"].copy()
    x[47, 79] = bad
    for spec, (q, stats) in zip(SPECS, _run(x)):
        assert np.all(np.isnan(np.asarray(q))), spec.name
        assert float(stats.nan_frac) == 1.0 and float(stats.clamped_frac) == 0
        assert np.all(np.asarray(stats.scale_exponent) == NAN_SCALE_EXP)
        assert np.all(np.isnan(np.asarray(stats.block_scale))) and np.isnan(float(stats.global_scale))


def test_zero_and_negligible_blocks_quantize_to_signed_zeros():
    x = INPUTS["zero_blocks"]
    q, stats = _run(x, NVFP4)
    q = np.asarray(q)
    assert_same_bits(q[:, 16:32], x[:, 16:32])
    assert_same_bits(q[:16, 48:64], np.copysign(np.float32(0), x[:16, 48:64]))
    e = np.asarray(stats.scale_exponent)
    assert np.all(e[:, 1] == ZERO_SCALE_EXP) and np.all(e[:16, 3] == ZERO_SCALE_EXP)
    assert np.all(e[:, 0] > ZERO_SCALE_EXP)
    negligible = 16 * 16 / x.size
    assert float(stats.flushed_frac) >= negligible  # the 2**-30 blocks are flushed
    assert q[0, 0] == 0 and np.signbit(q[0, 0]) and not np.signbit(q[1, 1])


# ----------------------------------------------------------------------------
# stochastic rounding


N_DRAWS = 2000


def test_stochastic_rounding_is_unbiased():
    """Each value is quantized N_DRAWS times (N_DRAWS copies of one row, every
    element with its own 32 random bits). Each result is fl(lo * s * G) or
    fl(hi * s * G), lo <= v <= hi the E2M1 neighbours of the scaled magnitude
    v = fl(|x| * enc), and the number of round-ups is Binomial(N, p), p = (v - lo)
    / (hi - lo): it must lie within 5 sigma of N p, sigma = sqrt(p (1 - p) / N)
    floored at one count (p near 0 or 1), a two-sided false-alarm chance of
    about 6e-7 per element. The two blocks have different E4M3 scales
    (448 and about 448 * 0.3)."""
    rng = np.random.default_rng(9)
    row = np.concatenate([rng.uniform(-1, 1, 16), 0.3 * rng.uniform(-1, 1, 16)]).astype(np.float32)
    row[0] = 1.0
    spec = NVFP4.replace(rounding="stochastic")
    qs = np.asarray(quantize(np.tile(row, (N_DRAWS, 1)), spec, key=KEY))
    ref = reference_stats(row[None], spec, -1, np.zeros((1, 32), np.uint32))
    s = np.repeat(ref.block_scale[0].astype(np.float64), 16)
    g = np.float64(ref.global_scale)
    assert len(set(s)) == 2
    v = np.minimum(round24(np.abs(row) * round24(1.0 / round24(s * g))), 6.0)
    grid = np.concatenate([[0.0], positive_codes("fp4_e2m1")])
    lo = grid[np.searchsorted(grid, v, side="right") - 1]
    hi = grid[np.searchsorted(grid, v, side="left")]
    p = np.where(hi > lo, (v - lo) / np.where(hi > lo, hi - lo, 1), 0.0)
    out_lo = np.copysign((lo * s * g).astype(np.float32), row)
    out_hi = np.copysign((hi * s * g).astype(np.float32), row)
    assert np.all((qs == out_lo) | (qs == out_hi))
    ups = np.sum((qs == out_hi) & (hi != lo), axis=0)
    sigma = np.sqrt(np.maximum(p * (1 - p), 1 / N_DRAWS) / N_DRAWS)
    assert np.all(np.abs(ups / N_DRAWS - p) <= 5 * sigma), (ups / N_DRAWS, p)
    assert np.sum((p > 0.05) & (p < 0.95)) > 10  # the row exercises real coin flips


def test_stochastic_rounding_is_deterministic_for_a_key():
    spec = NVFP4_2D.replace(rounding="stochastic")
    x = INPUTS["normal"]
    a, b = _run(x, spec)[0], _run(x, spec)[0]
    assert_same_bits(a, np.asarray(b))
    c = _run(x, spec, jax.random.key(6, impl="rbg"))[0]
    assert np.sum(np.asarray(a) != np.asarray(c)) > 100


# ----------------------------------------------------------------------------
# statistics


def test_stats_describe_what_quantize_did():
    """Clamped: v > 6, so the element saturates at 6 (the last bin, with
    s * 6 * G the top value of its block); flushed: non-zero inputs that became
    0; scale_exponent = floor(log2(s * G)); global_scale ~ amax / 2688."""
    x = INPUTS["normal"]
    q, stats = _run(x, NVFP4)
    q = np.asarray(q).astype(np.float64)
    s = np.repeat(np.asarray(stats.block_scale).astype(np.float64), 16, axis=-1)
    g = float(stats.global_scale)
    assert g == pytest.approx(np.max(np.abs(x)) / 2688, rel=2**-22)
    top = (6 * s * g).astype(np.float32)
    last_bin = np.abs(q).astype(np.float32) == top
    assert float(stats.last_bin_frac) * x.size == pytest.approx(last_bin.sum(), abs=1e-3)
    assert 0 < float(stats.clamped_frac) <= float(stats.last_bin_frac) < 0.2
    assert float(stats.flushed_frac) * x.size == pytest.approx(np.sum((x != 0) & (q == 0)), abs=1e-3)
    assert float(stats.nan_frac) == 0
    e = np.asarray(stats.scale_exponent)
    np.testing.assert_array_equal(e, np.floor(np.log2(np.asarray(stats.block_scale, np.float64) * g)))
    assert e.shape == (48, 5)


# ----------------------------------------------------------------------------
# the spec, bad input, kernels


def test_constants_and_names():
    assert NVFP4 == MXSpec("fp4_e2m1", block_size=16, scale_format="e4m3", scale_rule="amax")
    assert NVFP4.scale_rule.name == "amax" and NVFP4.block_size == 16 and NVFP4.block_dims == 1
    assert NVFP4_2D == NVFP4.replace(block_dims=2)
    assert NVFP4.name == "nvfp4_e2m1/16/amax/even"
    assert NVFP4_2D.replace(rounding="stochastic").name == "nvfp4_e2m1/16x16/amax/stochastic"
    assert MXSpec("fp4_e2m1").scale_rule.name == "floor"  # None resolves per scale format


def test_grad_is_straight_through():
    x = INPUTS["normal"]
    w = np.random.default_rng(3).standard_normal(x.shape).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(jax.grad(lambda a: jnp.sum(quantize(a, NVFP4) * w))(x)), w)


@pytest.mark.parametrize("element", ["fp8_e4m3", "fp6_e2m3", "int8"])
def test_e4m3_scales_need_fp4_elements(element):
    with pytest.raises(ValueError, match="fp4_e2m1") as err:
        MXSpec(element, scale_format="e4m3")
    assert element in str(err.value)


def test_unknown_scale_format_lists_the_valid_ones():
    with pytest.raises(ValueError, match="scale_format") as err:
        MXSpec("fp4_e2m1", scale_format="ue4m3")
    assert "ue4m3" in str(err.value) and all(f in str(err.value) for f in SCALE_FORMATS)


@pytest.mark.parametrize("rule", ["floor", "rceil"])
def test_e8m0_scale_rules_do_not_apply_to_e4m3_scales(rule):
    with pytest.raises(ValueError, match="scale_rule") as err:
        NVFP4.replace(scale_rule=rule)
    assert rule in str(err.value) and all(r in str(err.value) for r in E4M3_SCALE_RULES)
    with pytest.raises(ValueError, match="amax.*valid: floor, rceil"):
        MXSpec("fp4_e2m1", scale_rule="amax")


def test_nvfp4_needs_a_key_for_stochastic_and_rank_2_for_tiles():
    with pytest.raises(ValueError, match="key"):
        quantize(INPUTS["normal"], NVFP4.replace(rounding="stochastic"))
    with pytest.raises(ValueError, match="rank >= 2"):
        quantize(np.ones(32, np.float32), NVFP4_2D)


def test_pallas_kernels_refuse_e4m3_scales():
    from mx_proxy.pallas import quantize as mx_quantize

    with pytest.raises(ValueError, match="scale_format='e4m3'.*valid: 'e8m0'.*mxp.quantize"):
        mx_quantize.check_spec(NVFP4, "b_spec")
