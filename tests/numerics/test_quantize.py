"""mxp.quantize: the fast bit-level path against the numpy reference, and the
properties the MX grid must have.

Compilation dominates the run time (one XLA compile per spec, shape and axis),
so the tests reuse few shapes: the bit-for-bit test runs every input kind at
once, and the small tests share one (9, 32) array (``_quantize_rows``).
"""

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

from mx_proxy.numerics.formats import positive_codes
from mx_proxy.numerics.quantize import MXSpec, quantize, quantize_stats
from mx_proxy.numerics.reference import reference_quantize, reference_scale_exponent, reference_stats

FORMATS = ("fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1", "int8")
RULES = ("floor", "rceil")
ROUNDINGS = ("even", "away", "stochastic")
ALL_SPECS = [MXSpec(f, scale_rule=r, rounding=o) for f in FORMATS for r in RULES for o in ROUNDINGS]
DETERMINISTIC = [s for s in ALL_SPECS if s.rounding != "stochastic"]
# quantize only promises bits = jax.random.bits(key, x.shape, uint32); "rbg" keys
# compile about 3x faster than the default threefry (which has its own test)
KEY = jax.random.key(7, impl="rbg")
PROPERTY = settings(deadline=None, derandomize=True)  # jit compiles are slow; CI must not flake


def _ids(spec):
    return spec.name


def _key_for(spec):
    return KEY if spec.rounding == "stochastic" else None


def _rbits(spec, shape, key=KEY):
    """The random bits quantize draws for ``key`` (None unless stochastic)."""
    if spec.rounding != "stochastic":
        return None
    return np.asarray(jax.random.bits(key, shape, jnp.uint32))


def _bits(a) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


def assert_same_bits(got, want):
    """Equal as float32 bit patterns (so NaN == NaN and -0.0 != +0.0)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == np.float32 and got.shape == want.shape, (got.dtype, got.shape, want.shape)
    diff = _bits(got) != _bits(want)
    if diff.any():
        first = [(tuple(int(i) for i in ix), got[tuple(ix)], want[tuple(ix)]) for ix in np.argwhere(diff)[:4]]
        raise AssertionError(f"{diff.sum()} of {diff.size} values differ; (index, got, want): {first}")


def assert_same_stats(fast, ref, n):
    """QuantStats equal to ReferenceStats: the same counts out of n, the same exponents."""
    for field in ("clamped_frac", "last_bin_frac", "flushed_frac", "nan_frac"):
        assert float(getattr(fast, field)) * n == pytest.approx(getattr(ref, field) * n, abs=1e-3), field
    np.testing.assert_array_equal(np.asarray(fast.scale_exponent), ref.scale_exponent)


def _grid_step(mag, fmt, e):
    """Element grid step (float64) at magnitude ``mag`` in a block with scale 2**e."""
    mag = np.asarray(mag, np.float64)
    if fmt.is_integer:
        return np.ldexp(np.ones_like(mag), e - fmt.mantissa_bits)
    _, ex = np.frexp(mag)
    binade = np.where(mag > 0, ex - 1, -100_000)
    return np.ldexp(1.0, np.maximum(binade, fmt.emin + e) - fmt.mantissa_bits)


# ----------------------------------------------------------------------------
# input kinds; each fills whole blocks, so a kind never shares a block with another

KINDS = ("normal", "wide", "layernorm", "clamp", "dyadic", "zero", "subnormal", "huge", "nan_inf")


def _kind(name, rng, shape):
    """float32 array of one input kind."""
    sign = np.where(rng.random(shape) < 0.5, -1.0, 1.0)
    if name == "normal":
        x = rng.standard_normal(shape)
    elif name == "wide":
        x = rng.standard_normal(shape) * np.exp(rng.uniform(-100, 80, shape))
    elif name == "layernorm":
        x = np.exp(0.02 * rng.standard_normal(shape))
    elif name == "clamp":  # just below 1: under "floor" E4M3 clamps everything above 0.875
        x = 1.0 - 2.0 ** -rng.uniform(2, 12, shape)
    elif name == "dyadic":  # few significant bits: many exact ties on every grid
        x = rng.integers(-255, 256, shape) * 2.0 ** -rng.integers(0, 10, shape)
    elif name == "zero":
        x = sign * 0.0
    elif name == "subnormal":
        x = sign * rng.integers(1, 2**23, shape).astype(np.uint32).view(np.float32)
    elif name == "huge":  # up to 1.5 * 2**127; the rceil corner above it has its own test
        x = sign * np.where(rng.random(shape) < 0.5, 2.0**127 * rng.uniform(1, 1.5, shape),
                            2.0 ** rng.uniform(100, 127, shape))
    elif name == "nan_inf":
        x = rng.standard_normal(shape)
        flat = x.reshape(-1)
        flat[rng.choice(flat.size, 3, replace=False)] = [np.nan, np.inf, -np.inf]
    else:
        raise ValueError(name)
    return np.asarray(x, np.float32)


def _mixed_2d(length=167, rows_per_kind=3, seed=0):
    """(len(KINDS) * rows_per_kind, length): every kind in its own rows; 167 = 5 blocks + 7."""
    rng = np.random.default_rng(seed)
    return np.concatenate([_kind(k, rng, (rows_per_kind, length)) for k in KINDS])


def _mixed_3d(seed=1):
    """(len(KINDS), 20, 3), blocks along the middle axis, shorter than one block."""
    rng = np.random.default_rng(seed)
    return np.stack([_kind(k, rng, (20, 3)) for k in KINDS])


X2 = _mixed_2d()
X3 = _mixed_3d()
LAYOUTS = ((X2, -1), (X2.T, 0), (X3, 1))


# ----------------------------------------------------------------------------
# the fast path against the reference


@pytest.mark.parametrize("spec", ALL_SPECS, ids=_ids)
def test_fast_path_equals_reference_bit_for_bit(spec):
    for x, axis in LAYOUTS:
        got = quantize(x, spec, axis=axis, key=_key_for(spec))
        assert_same_bits(got, reference_quantize(x, spec, axis, _rbits(spec, x.shape)))


def test_default_threefry_key():
    spec, key = MXSpec("fp8_e4m3", rounding="stochastic"), jax.random.key(3)
    got = quantize(X2, spec, key=key)
    assert_same_bits(got, reference_quantize(X2, spec, -1, _rbits(spec, X2.shape, key)))


@pytest.mark.parametrize("fmt", FORMATS[:5])
@pytest.mark.parametrize("rule", RULES)
def test_reference_cast_and_arithmetic_rounding_agree(fmt, rule):
    spec = MXSpec(fmt, scale_rule=rule)
    for x, axis in LAYOUTS:
        assert_same_bits(reference_quantize(x, spec, axis), reference_quantize(x, spec, axis, use_cast=False))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rule", RULES)
def test_top_float32_binade_matches_reference(fmt, rule):
    """Blocks with amax in [1.5 * 2**127, float32 max].

    Under "rceil" such a block can need e = 128 - emax (a valid E8M0 scale),
    where max_normal * 2**e no longer fits in float32: values must still round
    to the element grid, and only a result of 2**128 becomes Inf (int8 needs
    e = 128 here: NaN block).
    """
    rng = np.random.default_rng(3)
    x = np.float32(2.0**127) * rng.uniform(1.5, 2.0, (9, 32)).astype(np.float32)
    x[0, 0] = np.finfo(np.float32).max
    x[1] = np.float32(3.1132667e38)
    x *= np.where(rng.random(x.shape) < 0.5, -1, 1).astype(np.float32)
    spec = MXSpec(fmt, scale_rule=rule)
    assert_same_bits(_quantize_rows(x, spec), reference_quantize(x, spec))
    assert_same_stats(quantize_stats(x, spec), reference_stats(x, spec), x.size)


# ----------------------------------------------------------------------------
# codes and midpoints, on a block whose amax makes the scale exactly 2**k


def _quantize_rows(x, spec, key=None):
    """quantize(x, spec) along the last axis for x of shape (rows <= 9, 32).

    Runs on a zero-padded (9, 32) array so that every small test shares one
    compilation per spec (zero rows are whole blocks of their own).
    """
    padded = np.zeros((9, 32), np.float32)
    padded[: x.shape[0]] = x
    return np.asarray(quantize(padded, spec, key=key))[: x.shape[0]]


def _on_unit_scale(values, fmt, k):
    """Lay ``values`` out 31 per row after a ±max_normal column: every block's
    amax is max_normal, so both scale rules pick e = 0; then multiply by 2**k."""
    rows = -(-len(values) // 31)
    grid = np.zeros((rows, 32))
    grid[:, 0] = fmt.max_normal * np.where(np.arange(rows) % 2, -1, 1)
    grid[:, 1:].flat[: len(values)] = values
    assert np.all(np.abs(grid) <= fmt.max_normal)
    x = np.asarray(grid * 2.0**k, np.float32)
    assert np.all(x == grid * 2.0**k)  # exact in float32, also at 2**-127
    return x


@pytest.mark.parametrize("spec", ALL_SPECS, ids=_ids)
def test_every_code_round_trips(spec):
    fmt = spec.element
    pos = positive_codes(fmt)
    codes = np.concatenate([-pos[::-1], [0.0], pos])
    for k in (0, -127, 127 - fmt.emax):  # ordinary, smallest and largest scale
        x = _on_unit_scale(codes, fmt, k)
        assert_same_bits(_quantize_rows(x, spec, _key_for(spec)), x)


def _is_even_code(values, fmt):
    """True where a non-negative code has an even bit pattern (last mantissa bit 0)."""
    if fmt.is_integer:
        return np.rint(values * 64).astype(int) % 2 == 0
    return values.astype(fmt.dtype).view(np.uint8) % 2 == 0


@pytest.mark.parametrize("spec", DETERMINISTIC, ids=_ids)
def test_midpoints_round_as_the_mode_says(spec):
    fmt = spec.element
    grid = np.concatenate([[0.0], positive_codes(fmt)])
    lo, hi = grid[:-1], grid[1:]
    mid = (lo + hi) / 2
    want = np.where(_is_even_code(lo, fmt), lo, hi) if spec.rounding == "even" else hi
    for k in (0, 1, -127):  # both parities of the float32 exponent; float32 subnormals
        x = _on_unit_scale(np.concatenate([mid, -mid]), fmt, k)
        expected = _on_unit_scale(np.concatenate([want, -want]), fmt, k)
        expected[x < 0] = -np.abs(expected[x < 0])  # a negative midpoint rounding to zero gives -0.0
        assert_same_bits(_quantize_rows(x, spec), expected)


# ----------------------------------------------------------------------------
# hypothesis properties


def _signed(magnitudes):
    return st.tuples(st.booleans(), magnitudes).map(lambda t: -t[1] if t[0] else t[1])


_MODERATE = _signed(st.one_of(st.just(0.0), st.floats(2.0**-20, 2.0**20, width=32)))
_FINITE = st.floats(-(2.0**127), 2.0**127, width=32, allow_nan=False)


@settings(PROPERTY, max_examples=80)
@given(spec=st.sampled_from(ALL_SPECS), x=hnp.arrays(np.float32, (2, 32), elements=_MODERATE),
       k=st.integers(-60, 60))
def test_scaling_by_a_power_of_two_scales_the_output(spec, x, k):
    # |x| in [2**-20, 2**20], |k| <= 60: scales stay far from the E8M0 ends
    # and every value and grid point stays a normal float32
    q = _quantize_rows(x, spec, _key_for(spec)).astype(np.float64)
    q_scaled = _quantize_rows(np.asarray(x * 2.0**k, np.float32), spec, _key_for(spec))
    assert_same_bits(q_scaled, np.asarray(q * 2.0**k, np.float32))


@settings(PROPERTY, max_examples=80)
@given(spec=st.sampled_from(DETERMINISTIC), x=hnp.arrays(np.float32, (2, 32), elements=_FINITE))
def test_error_is_at_most_half_a_grid_step_or_the_clamp(spec, x):
    fmt = spec.element
    q = _quantize_rows(x, spec).astype(np.float64)
    x = x.astype(np.float64)
    e = reference_scale_exponent(x, spec)  # (2, 1)
    sat = fmt.max_normal * np.ldexp(1.0, e)
    clamped = np.abs(x) > sat
    err = np.abs(q - x)
    assert np.all(err[~clamped] <= (_grid_step(np.abs(x), fmt, e) / 2)[~clamped])
    np.testing.assert_array_equal(q[clamped], np.copysign(np.broadcast_to(sat, x.shape), x)[clamped])


N_DRAWS = 4000


@pytest.mark.parametrize("spec", [MXSpec(f, scale_rule=r, rounding="stochastic") for f, r in zip(FORMATS, RULES * 3)],
                         ids=_ids)
@settings(PROPERTY, max_examples=15)
@given(x=hnp.arrays(np.float32, (32,),
                   elements=_signed(st.one_of(st.just(0.0), st.floats(2.0**-30, 2.0**30, width=32)))))
def test_stochastic_rounding_is_unbiased(spec, x):
    """Over N_DRAWS draws each q(x) is one of x's two neighbouring grid points,
    and the number of round-ups is Binomial(N, p), p = x's fractional position
    between them: it must lie within 5 sigma of N p (sigma floored at one
    count, so that p near 0 or 1 is not held to a Gaussian tail).

    The draws are N_DRAWS copies of the block quantized in one call: each
    element gets its own 32 random bits."""
    qs = np.asarray(quantize(np.tile(x, (N_DRAWS, 1)), spec, key=KEY)).astype(np.float64)  # (N_DRAWS, 32)
    e = reference_scale_exponent(x, spec)[0]
    v = np.minimum(np.abs(x.astype(np.float64)), spec.element.max_normal * 2.0**e)  # saturated
    step = _grid_step(v, spec.element, e)
    lo = np.floor(v / step) * step
    p = (v - lo) / step
    hi = np.where(p > 0, lo + step, lo)
    mag = np.abs(qs)
    assert np.all((mag == lo) | (mag == hi))
    assert np.all(np.signbit(qs) == np.signbit(x))
    ups = np.sum((mag == hi) & (hi != lo), axis=0)
    sigma = np.sqrt(np.maximum(p * (1 - p), 1 / N_DRAWS) / N_DRAWS)
    assert np.all(np.abs(ups / N_DRAWS - p) <= 5 * sigma), (ups / N_DRAWS, p)


# ----------------------------------------------------------------------------
# JAX's own MXFP8 quantizer


def test_rceil_matches_jax_mxfp8_quantizer():
    """jax.nn.scaled_matmul's quantizer (jax._src.cudnn.scaled_matmul_stablehlo
    .quantize) takes scale = 2**ceil(log2(amax / 448)) and casts x / scale to
    E4M3 after clipping to ±448: our "rceil" rule with ties-to-even.

    Corners, from its source (jax 0.10.2):
    * amax / 448 is rounded to float32 there; that never crosses a power of
      two (amax > 448 * 2**k implies amax / 448 >= 2**k * (1 + 2**-23 / 1.75),
      which rounds up), so on normal floats the scales agree;
    * XLA:CPU flushes float32 subnormals to zero: when amax <= 448 * 2**-126
      its quotient is flushed, the scale falls back to code 0 = 2**-127 (itself
      subnormal, so x / scale becomes Inf/NaN), and subnormal inputs read as
      zero. The rules differ there, so every block here has amax > 448 * 2**-126
      and no float32 subnormal element;
    * above 1.75 * 2**127 a dequantized value can be 2**128, beyond float32
      (see test_top_float32_binade_matches_reference): inputs stay below.
    """
    from jax._src.cudnn.scaled_matmul_stablehlo import quantize as jax_mx_quantize

    rng = np.random.default_rng(5)
    shape = (4, 128)
    rows = [
        rng.standard_normal(shape),
        rng.standard_normal(shape) * np.exp(rng.uniform(-40, 40, shape)) * np.exp(rng.uniform(-30, 30, (4, 1))),
        np.exp(0.02 * rng.standard_normal(shape)),
        1.0 - 2.0 ** -rng.uniform(2, 12, shape),
        2.0**127 * rng.uniform(1, 1.7, shape),
        rng.uniform(-1, 1, shape) * 448.0 * 2.0 ** rng.integers(-100, 100, (4, 1)),
    ]
    x = np.concatenate(rows).astype(np.float32)
    x[-4:, ::32] = 448.0 * 2.0 ** rng.integers(-100, 100, (4, 4))  # amax exactly 448 * 2**k: no bump
    x[-2:, 1::32] = np.nextafter(x[-2:, ::32], np.float32(np.inf))  # just above it: bump
    x *= np.where(rng.random(x.shape) < 0.5, -1, 1).astype(np.float32)
    amax = np.abs(x).reshape(x.shape[0], -1, 32).max(-1)
    assert np.all(amax > 448 * 2.0**-126) and not np.any((x != 0) & (np.abs(x) < 2.0**-126))

    config = jax.nn.get_scaled_dot_general_config("mxfp8")
    elements, scales = jax.jit(lambda a: jax_mx_quantize(a, config))(x)
    scales = np.asarray(scales).astype(np.float64)  # E8M0, shape (rows, blocks)
    theirs = np.asarray(elements).astype(np.float64) * np.repeat(scales, 32, axis=-1)

    spec = MXSpec("fp8_e4m3", scale_rule="rceil")
    np.testing.assert_array_equal(np.asarray(quantize_stats(x, spec).scale_exponent), np.log2(scales))
    np.testing.assert_array_equal(np.asarray(quantize(x, spec)).astype(np.float64), theirs)


# ----------------------------------------------------------------------------
# statistics


def test_floor_clamps_exactly_the_values_the_notes_predict():
    """E4M3 "floor": with E = floor(log2 amax), values above 1.75 * 2**E go to
    448 * 2**(E - 8) = 1.75 * 2**E; with ties to even everything from 1.6875 *
    2**E up lands there too (the last bin)."""
    rng = np.random.default_rng(8)
    x = np.concatenate([
        1.0 - 2.0 ** -rng.uniform(2, 12, (4, 64)),  # clusters just below 1.0
        np.exp(0.02 * rng.standard_normal((4, 64))),  # LayerNorm-like gains
        rng.standard_normal((4, 64)),
    ]).astype(np.float32)
    x[0, 0], x[0, 1], x[0, 2] = 0.875, np.nextafter(np.float32(0.875), np.float32(1)), 0.84375  # edges
    x *= np.where(rng.random(x.shape) < 0.5, -1, 1).astype(np.float32)
    spec = MXSpec("fp8_e4m3")
    blocks = np.abs(x.astype(np.float64)).reshape(12, 2, 32)
    E = np.frexp(blocks.max(-1, keepdims=True))[1] - 1
    top = np.broadcast_to(1.75 * 2.0**E, blocks.shape).reshape(x.shape)
    clamp = np.abs(x) > top
    last_bin = np.abs(x) >= 1.6875 / 1.75 * top

    q = np.asarray(quantize(x, spec)).astype(np.float64)
    np.testing.assert_array_equal(q[clamp], np.copysign(top, x)[clamp])
    np.testing.assert_array_equal(np.abs(q) == top, last_bin)
    assert clamp[:4].mean() > 0.8 and not clamp[0, 0] and clamp[0, 1]

    stats = quantize_stats(x, spec)
    assert float(stats.clamped_frac) * x.size == pytest.approx(clamp.sum(), abs=1e-3)
    assert float(stats.last_bin_frac) * x.size == pytest.approx(last_bin.sum(), abs=1e-3)
    np.testing.assert_array_equal(np.asarray(stats.scale_exponent), (E - 8)[..., 0])


STATS_CASES = [(MXSpec(f, scale_rule=r), -1) for f in FORMATS for r in RULES] + [
    (MXSpec("fp8_e4m3"), 0), (MXSpec("int8", scale_rule="rceil"), 0),
    (MXSpec("fp8_e4m3", rounding="stochastic"), -1), (MXSpec("fp4_e2m1", scale_rule="rceil", rounding="away"), 0)]


@pytest.mark.parametrize("spec, axis", STATS_CASES, ids=lambda c: _ids(c) if isinstance(c, MXSpec) else f"axis{c}")
def test_stats_agree_with_reference_and_with_quantize(spec, axis):
    fmt = spec.element
    x = X2 if axis == -1 else X2.T
    key = _key_for(spec)
    fast = quantize_stats(x, spec, axis=axis, key=key)
    ref = reference_stats(x, spec, axis, _rbits(spec, x.shape))
    assert_same_stats(fast, ref, x.size)
    assert ref.nan_frac > 0 and ref.flushed_frac > 0  # the inputs exercise them
    assert ref.clamped_frac > 0 or spec.scale_rule.name == "rceil"

    # and with what quantize did, element by element
    q = np.asarray(quantize(x, spec, axis=axis, key=key)).astype(np.float64)
    e = np.asarray(fast.scale_exponent)
    e_elem = np.repeat(e, spec.block_size, axis=axis).take(np.arange(x.shape[axis]), axis=axis)
    nan = e_elem == 128
    np.testing.assert_array_equal(np.isnan(q), nan)
    sat = fmt.max_normal * np.ldexp(1.0, np.where(nan, 0, e_elem))
    did = {
        "clamped_frac": ~nan & (np.abs(x) > sat),
        "last_bin_frac": ~nan & (np.abs(q) == sat),
        "flushed_frac": ~nan & (x != 0) & (q == 0),
        "nan_frac": nan,
    }
    for field, mask in did.items():
        assert float(getattr(fast, field)) * x.size == pytest.approx(mask.sum(), abs=1e-3), field


# ----------------------------------------------------------------------------
# bad input


def test_unknown_format_lists_the_valid_names():
    with pytest.raises(ValueError, match="fp7") as err:
        MXSpec("fp7")
    for name in FORMATS:
        assert name in str(err.value)


def test_vector_format_is_not_an_mx_element():
    with pytest.raises(ValueError, match="bf16"):
        MXSpec("bf16")


@pytest.mark.parametrize("block_size", [0, -1, 2.5, True, "32", None])
def test_bad_block_size(block_size):
    with pytest.raises(ValueError, match="block_size"):
        MXSpec("fp8_e4m3", block_size=block_size)


@pytest.mark.parametrize("field, value", [("scale_rule", "nearest_pow2"), ("rounding", "nearest")])
def test_unknown_scale_rule_or_rounding_lists_the_valid_ones(field, value):
    with pytest.raises(ValueError, match=field) as err:
        MXSpec("fp8_e4m3", **{field: value})
    valid = RULES if field == "scale_rule" else ROUNDINGS
    assert value in str(err.value) and all(v in str(err.value) for v in valid)


@pytest.mark.parametrize("axis", [2, -3, 1.0])
def test_axis_out_of_range(axis):
    with pytest.raises(ValueError, match="axis"):
        quantize(np.ones((2, 32), np.float32), MXSpec("fp8_e4m3"), axis=axis)


def test_stochastic_without_key():
    with pytest.raises(ValueError, match="key"):
        quantize(np.ones((2, 32), np.float32), MXSpec("fp8_e4m3", rounding="stochastic"))


def test_spec_must_be_an_mxspec_and_input_an_array():
    with pytest.raises(ValueError, match="MXSpec"):
        quantize(np.ones((2, 32), np.float32), "fp8_e4m3")
    with pytest.raises(ValueError, match="scalar"):
        quantize(np.float32(1.0), MXSpec("fp8_e4m3"))


def test_block_size_other_than_32():
    x = _mixed_2d(length=50, rows_per_kind=1, seed=4)
    spec = MXSpec("fp6_e3m2", block_size=16, rounding="away")
    assert_same_bits(quantize(x, spec), reference_quantize(x, spec))


# ----------------------------------------------------------------------------
# jit and grad


@pytest.mark.parametrize("fmt", ["fp6_e2m3", "fp6_e3m2", "fp4_e2m1"])
def test_quantize_composes_under_jit(fmt):
    spec = MXSpec(fmt, scale_rule="rceil")
    x = np.random.default_rng(9).standard_normal((4, 64)).astype(np.float32)
    f = jax.jit(lambda a: quantize(a * 2.0, spec, axis=0) * 0.5)  # exact: powers of two, normal range
    want = reference_quantize(x * 2.0, spec, axis=0) * np.float32(0.5)
    assert_same_bits(f(x), want)


@pytest.mark.parametrize("spec", [MXSpec("fp8_e4m3"), MXSpec("fp6_e2m3", scale_rule="rceil", rounding="stochastic")],
                         ids=_ids)
def test_grad_is_straight_through(spec):
    x = X2[: 4 * 3]  # normal, wide, layernorm and clamped rows
    w = np.random.default_rng(10).standard_normal(x.shape).astype(np.float32)
    grad = jax.grad(lambda a: jnp.sum(quantize(a, spec, axis=0, key=_key_for(spec)) * w))(x)
    np.testing.assert_array_equal(np.asarray(grad), w)
