"""mxp.quantize with 2-D tiles (``MXSpec(block_dims=2)``): one E8M0 scale per
``block_size x block_size`` tile of the last two axes.

Compilation dominates: tests that cover many specs quantize with all of them
inside one jitted function (``_quantize_many``), which compiles about five
times faster than one jit per spec.
"""

import functools

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from test_quantize import KINDS, _kind, assert_same_bits, assert_same_stats

from mx_proxy.numerics.formats import positive_codes
from mx_proxy.numerics.quantize import BLOCK_DIMS, MXSpec, quantize, quantize_stats
from mx_proxy.numerics.reference import reference_quantize, reference_scale_exponent, reference_stats

FORMATS = ("fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1", "int8")
RULES = ("floor", "rceil")
ROUNDINGS = ("even", "away", "stochastic")
ALL_2D = tuple(MXSpec(f, scale_rule=r, rounding=o, block_dims=2) for f in FORMATS for r in RULES for o in ROUNDINGS)
DETERMINISTIC_2D = tuple(s for s in ALL_2D if s.rounding != "stochastic")
KEY = jax.random.key(11, impl="rbg")  # see test_quantize: rbg keys compile faster
PROPERTY = settings(deadline=None, derandomize=True)


@functools.partial(jax.jit, static_argnames=("specs",))
def _quantize_many(x, specs, key=KEY):
    """[quantize(x, s) for s in specs] in one compilation (stochastic specs use ``key``)."""
    return [quantize(x, s, key=key if s.rounding == "stochastic" else None) for s in specs]


def _rbits(spec, shape, key=KEY):
    return np.asarray(jax.random.bits(key, shape, jnp.uint32)) if spec.rounding == "stochastic" else None


def _mixed(shape=(2, 80, 75), rows_per_kind=18, seed=0):
    """Every input kind of test_quantize in bands of ``rows_per_kind`` rows (so a
    32-row tile mixes two kinds: subnormal next to huge, NaN next to zero...),
    ragged on both tiled axes (80 = 2 * 32 + 16, 75 = 2 * 32 + 11)."""
    rng = np.random.default_rng(seed)
    rows = int(np.prod(shape[:-1]))
    bands = [_kind(KINDS[i % len(KINDS)], rng, (rows_per_kind, shape[-1])) for i in range(-(-rows // rows_per_kind))]
    return np.concatenate(bands)[:rows].reshape(shape)


X3 = _mixed()


# ----------------------------------------------------------------------------
# the reference, bit for bit


def test_every_spec_equals_the_reference_bit_for_bit():
    """All formats x floor/rceil x even/away/stochastic (same key), on a rank-3
    array (batched tiles), ragged on both tiled axes, every input kind."""
    got = _quantize_many(X3, ALL_2D)
    for spec, q in zip(ALL_2D, got):
        assert_same_bits(q, reference_quantize(X3, spec, -1, _rbits(spec, X3.shape)))


@pytest.mark.parametrize("spec", [MXSpec("fp8_e4m3", block_dims=2), MXSpec("fp6_e3m2", scale_rule="rceil", block_dims=2,
                                                                         block_size=16, rounding="stochastic")],
                         ids=lambda s: s.name)
def test_stats_equal_the_reference(spec):
    x = X3[1]  # holds the subnormal, huge and nan_inf kinds
    key = KEY if spec.rounding == "stochastic" else None
    fast = quantize_stats(x, spec, key=key)
    ref = reference_stats(x, spec, -1, _rbits(spec, x.shape))
    assert_same_stats(fast, ref, x.size)
    assert fast.scale_exponent.shape == (-(-80 // spec.block_size), -(-75 // spec.block_size))
    assert ref.nan_frac > 0 and ref.flushed_frac > 0
    np.testing.assert_array_equal(np.asarray(fast.block_scale), ref.block_scale)
    assert float(fast.global_scale) == 1.0


# ----------------------------------------------------------------------------
# one scale per tile


@pytest.mark.parametrize("rule", RULES)
def test_one_scale_per_tile(rule):
    """Each tile's values are element * 2**e with e from that tile's amax, and
    scale_exponent has one entry per tile, shape (rows / bs, cols / bs)."""
    spec = MXSpec("fp4_e2m1", scale_rule=rule, block_dims=2)
    rng = np.random.default_rng(1)
    # tiles of very different magnitudes: per-tile scales are visible
    x = (rng.standard_normal((70, 45)) * 2.0 ** rng.integers(-20, 20, (3, 2)).repeat(32, 0)[:70].repeat(32, 1)[:, :45])
    x = x.astype(np.float32)
    stats = quantize_stats(x, spec)
    e = np.asarray(stats.scale_exponent)
    assert e.shape == (3, 2)
    fmt = spec.element
    q = np.asarray(quantize(x, spec)).astype(np.float64)
    codes = np.concatenate([-positive_codes(fmt), [0.0], positive_codes(fmt)])
    for i in range(3):
        for j in range(2):
            tile = np.abs(x[32 * i: 32 * i + 32, 32 * j: 32 * j + 32].astype(np.float64))
            amax = tile.max()
            want = int(np.floor(np.log2(amax))) - fmt.emax
            if rule == "rceil" and amax / 2.0**want > fmt.max_normal:
                want += 1
            assert e[i, j] == want
            elements = q[32 * i: 32 * i + 32, 32 * j: 32 * j + 32] / 2.0 ** e[i, j]
            assert np.all(np.isin(elements, codes))
    np.testing.assert_array_equal(e, reference_scale_exponent(x, spec))


def test_tiles_differ_from_row_blocks():
    """A tile shares its scale across rows: a row of small values next to a row
    holding a large one loses precision that 1-D blocks would keep."""
    x = np.full((32, 32), 1.1, np.float32)
    x[0, 0] = 1000.0
    q1 = np.asarray(quantize(x, MXSpec("fp4_e2m1")))
    q2 = np.asarray(quantize(x, MXSpec("fp4_e2m1", block_dims=2)))
    assert q1[1, 0] == 1.0 and q2[1, 0] == 0.0  # 2**e = 128 for the whole tile: 1.1 / 128 rounds to 0


# ----------------------------------------------------------------------------
# transposition


TRANSPOSE_SPECS = tuple(MXSpec(f, scale_rule=r, rounding=o, block_dims=2, block_size=bs)
                        for f, r, o, bs in [("fp8_e4m3", "floor", "even", 32), ("fp8_e5m2", "rceil", "away", 32),
                                            ("fp6_e3m2", "floor", "away", 16), ("fp6_e2m3", "rceil", "even", 32),
                                            ("fp4_e2m1", "rceil", "even", 32), ("fp4_e2m1", "floor", "away", 8),
                                            ("int8", "floor", "even", 32)])


def test_transpose_commutes_exactly():
    """quantize(w.T) == quantize(w).T (also batched: swapping the last two axes)."""
    w = X3
    qs = _quantize_many(w, TRANSPOSE_SPECS)
    qts = _quantize_many(np.swapaxes(w, -1, -2), TRANSPOSE_SPECS)
    for q, qt in zip(qs, qts):
        assert_same_bits(qt, np.swapaxes(np.asarray(q), -1, -2))


def test_axis_is_ignored():
    spec = MXSpec("fp8_e4m3", scale_rule="rceil", block_dims=2)
    w = X3[1]
    q0, q1 = quantize(w, spec, axis=0), quantize(w, spec, axis=1)
    assert_same_bits(q0, np.asarray(q1))
    assert_same_bits(quantize(w, spec, axis=-2), np.asarray(q1))
    with pytest.raises(ValueError, match="axis"):  # still checked
        quantize(w, spec, axis=2)


_FINITE = st.floats(-(2.0**100), 2.0**100, width=32, allow_nan=False)
HYP_SPECS = (MXSpec("fp8_e4m3", block_dims=2, block_size=8), MXSpec("fp6_e2m3", scale_rule="rceil", rounding="away",
                                                                     block_dims=2, block_size=8),
             MXSpec("fp4_e2m1", block_dims=2, block_size=8))


@settings(PROPERTY, max_examples=6)
@given(x=hnp.arrays(np.float32, hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=21), elements=_FINITE))
def test_transpose_commutes_for_any_shape(x):
    """Ragged shapes included (block size 8, sides 1..21); and the reference agrees."""
    qs = _quantize_many(x, HYP_SPECS)
    qts = _quantize_many(np.ascontiguousarray(x.T), HYP_SPECS)
    for spec, q, qt in zip(HYP_SPECS, qs, qts):
        assert_same_bits(qt, np.asarray(q).T)
        assert_same_bits(q, reference_quantize(x, spec))


# ----------------------------------------------------------------------------
# shapes


def test_ragged_shape_is_zero_padded_and_cut_back():
    spec = MXSpec("fp6_e3m2", block_dims=2)
    x = X3[0, :37, :50]
    padded = np.zeros((64, 64), np.float32)
    padded[:37, :50] = x
    assert_same_bits(quantize(x, spec), np.asarray(quantize(padded, spec))[:37, :50])


def test_batched_arrays_tile_the_last_two_axes():
    """Rank 3: tiles never cross the leading (batch) axis."""
    spec = MXSpec("fp8_e5m2", block_dims=2, rounding="away")
    q = np.asarray(quantize(X3, spec))
    for i in range(X3.shape[0]):
        assert_same_bits(q[i], np.asarray(quantize(X3[i], spec)))
    assert quantize_stats(X3, spec).scale_exponent.shape == (2, 3, 3)


def test_stochastic_with_tiles_uses_the_elements_bits():
    """32 random bits per element from jax.random.bits(key, x.shape): the same
    key gives the same result, and a different key a different one."""
    spec = MXSpec("fp4_e2m1", block_dims=2, rounding="stochastic")
    x = X3[0]
    a, b = quantize(x, spec, key=KEY), quantize(x, spec, key=KEY)
    assert_same_bits(a, np.asarray(b))
    c = np.asarray(quantize(x, spec, key=jax.random.key(12, impl="rbg")))
    assert np.sum(np.asarray(a) != c) > 100


def test_grad_is_straight_through():
    spec = MXSpec("fp8_e4m3", block_dims=2)
    x = X3[0, :40, :40]
    w = np.random.default_rng(2).standard_normal(x.shape).astype(np.float32)
    grad = jax.grad(lambda a: jnp.sum(quantize(a, spec) * w))(np.nan_to_num(x, posinf=0, neginf=0))
    np.testing.assert_array_equal(np.asarray(grad), w)


# ----------------------------------------------------------------------------
# names and bad input


def test_names():
    assert MXSpec("fp4_e2m1", scale_rule="rceil", block_dims=2).name == "mxfp4_e2m1/32x32/rceil/even"
    assert MXSpec("fp8_e4m3", block_size=16, block_dims=2).name == "mxfp8_e4m3/16x16/floor/even"
    assert MXSpec("fp8_e4m3").name == "mxfp8_e4m3/32/floor/even"  # 1-D names unchanged
    assert MXSpec("fp8_e4m3") == MXSpec("fp8_e4m3", scale_rule="floor", block_dims=1, scale_format="e8m0")


def test_rank_1_input_is_refused():
    with pytest.raises(ValueError, match="rank >= 2"):
        quantize(np.ones(64, np.float32), MXSpec("fp8_e4m3", block_dims=2))
    with pytest.raises(ValueError, match="rank >= 2"):
        quantize_stats(np.ones(64, np.float32), MXSpec("fp8_e4m3", block_dims=2))


@pytest.mark.parametrize("block_dims", [0, 3, -1, True, "2", 1.5, None])
def test_bad_block_dims_names_the_value_and_the_choices(block_dims):
    with pytest.raises(ValueError, match="block_dims") as err:
        MXSpec("fp8_e4m3", block_dims=block_dims)
    assert repr(block_dims) in str(err.value) and all(str(v) in str(err.value) for v in BLOCK_DIMS)


def test_pallas_kernels_refuse_tiles():
    from mx_proxy.pallas import quantize as mx_quantize

    with pytest.raises(ValueError, match="block_dims=2.*valid: 1.*mxp.quantize"):
        mx_quantize.check_spec(MXSpec("fp8_e4m3", block_dims=2), "a_spec")
    assert mx_quantize.check_spec(MXSpec("fp8_e4m3")) == MXSpec("fp8_e4m3")
