"""The scale rules, each bit for bit against an independent computation written out here.

Every rule of ``mx_proxy.numerics.scale_rules`` is checked on a sweep of block
maxima (every float32 exponent field with the mantissas where rules differ,
random ones, zero, subnormals, Inf, NaN), through both ways the quantizer
evaluates it (``block_exponent`` in kernel tiles, the table the XLA path
reads), against definitions transcribed from their sources:

* ``floor``: the MX library (microsoft/microxcaling ``mx_ops._shared_exponents``
  and ``_quantize_mx``: ``floor(log2(amax))`` minus emax, NaN above 127,
  clamped at -127; evaluated in float64 here) and torchao
  (``mx_formats.mx_tensor.to_mx``, ``ScaleCalculationMode.FLOOR``: the amax's
  exponent field);
* ``rceil``: the exact smallest ``e`` with ``amax <= max_normal * 2**e``, and
  torchao's ``_to_mx_rceil`` (``amax * (1 / max_pos)`` in float32, rounded up
  to a power of two on its bit pattern) wherever that quotient is a float32
  normal;
* ``ceil``, ``even``: torchao's CEIL and EVEN on the bit pattern of amax;
* ``paper_bump``: floor per block plus one per position whose maximum over
  the blocks exceeds 1.75 * 2**k, end to end through ``quantize``.

``ceil`` and ``even`` also go end to end through ``quantize`` and
``quantize_stats`` against the float64 reference.
"""

import pickle

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from mx_proxy.numerics import formats, scale_rules
from mx_proxy.numerics.mx import block_scale
from mx_proxy.numerics.quantize import MXSpec, quantize, quantize_stats
from mx_proxy.numerics.reference import reference_quantize, reference_stats

FORMATS = ("fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1", "int8")
# torchao's constants (mx_formats/constants.py): F*_MAX_POW2 and MBITS_*; int8 is not a torchao element
# format, for it the same formulas read emax 0 and the 6 fraction bits of MXINT8
MAX_POW2 = {"fp8_e4m3": 8, "fp8_e5m2": 15, "fp6_e3m2": 4, "fp6_e2m3": 2, "fp4_e2m1": 2, "int8": 0}
MBITS = {"fp8_e4m3": 3, "fp8_e5m2": 2, "fp6_e3m2": 2, "fp6_e2m3": 3, "fp4_e2m1": 1, "int8": 6}
NAN = 999  # a NaN block, in the exponent arrays below


def _amax_bits() -> np.ndarray:
    """uint32 patterns of block maxima: every exponent field x mantissas where the rules turn, random ones."""
    fields = np.arange(256, dtype=np.uint32) << 23
    mants = [0, 1, 0x7FFFFF, 0x400000, 0x400001, 0x600000, 0x600001, 0x700000, 0x700001, 0x780000, 0x7C0000,
             0x7E0000, 0x7F0000, 0x77FFFF, 0x7BFFFF, 0x7DFFFF, 0x7EFFFF, 0x5FFFFF, 0x6FFFFF, 0x3FFFFF]
    rng = np.random.default_rng(3)
    return np.unique(np.concatenate([fields | m for m in mants]
                                    + [rng.integers(0, 0x7FFFFFFF, 2048, dtype=np.int64).astype(np.uint32)]))


AMAX = _amax_bits()


def _with_nan(e, nan) -> np.ndarray:
    return np.where(nan, NAN, np.asarray(e, np.int64))


def _torchao_clamp(e, nonfinite) -> np.ndarray:
    """torchao: clamp the unbiased exponent to [-127, 128] (128 is byte 255, NaN); a non-finite amax is NaN."""
    e = np.clip(e, -127, 128)
    return np.where(nonfinite | (e == 128), NAN, e)


def torchao_floor(bits, fmt) -> np.ndarray:
    field = ((bits >> 23) & 0xFF).astype(np.int64)
    return _torchao_clamp(field - 127 - MAX_POW2[fmt], field == 255)


def torchao_ceil(bits, fmt) -> np.ndarray:
    field = ((bits >> 23) & 0xFF).astype(np.int64)
    return _torchao_clamp(field - 127 + ((bits & 0x7FFFFF) > 0) - MAX_POW2[fmt], field == 255)


def torchao_even(bits, fmt) -> np.ndarray:
    """Round half up at the element's last mantissa bit, keep sign and exponent; NaN stays NaN (its mask)."""
    rounded = (bits.astype(np.int64) + (1 << (23 - MBITS[fmt] - 1))) & 0xFF800000
    field = np.where((bits & 0x7FFFFFFF) > 0x7F800000, 255, (rounded >> 23) & 0xFF)
    return _torchao_clamp(field - 127 - MAX_POW2[fmt], field == 255)


def torchao_rceil(bits, fmt) -> tuple[np.ndarray, np.ndarray]:
    """(exponent, where the float32 quotient amax * (1 / max_pos) is a normal number)."""
    amax = bits.view(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        descale = amax * (np.float32(1.0) / np.float32(formats.get(fmt).max_normal))
    d = descale.view(np.uint32)
    dexp, dmant = ((d >> 23) & 0xFF).astype(np.int64), d & 0x7FFFFF
    up = np.where(dexp == 0, dmant > 0x400000, dmant != 0)
    byte = np.where(np.isfinite(descale), dexp + up, 255)
    return np.where(byte >= 255, NAN, byte - 127), (dexp > 0) & np.isfinite(descale)


def exact_rceil(bits, fmt) -> np.ndarray:
    """The smallest e >= -127 with amax <= max_normal * 2**e (float64, exact for float32 amax)."""
    f = formats.get(fmt)
    with np.errstate(invalid="ignore"):
        amax = bits.view(np.float32).astype(np.float64)
    finite = np.isfinite(amax)
    a = np.where(finite, amax, 1.0)
    e = np.full(a.shape, -127, np.int64)
    for _ in range(300):  # raise e until max_normal * 2**e holds amax
        e = np.where(a > f.max_normal * np.ldexp(1.0, e), e + 1, e)
    return np.where(~finite | (e > 127), NAN, e)


def mx_library_floor(bits, fmt, dtype=np.float64) -> np.ndarray:
    """microxcaling: floor(log2(amax + FP32_MIN_NORMAL * (amax == 0))) - emax; NaN above 127, clamped at -127."""
    with np.errstate(invalid="ignore", divide="ignore"):
        a = bits.view(np.float32).astype(dtype)
        shared = np.floor(np.log2(a + dtype(2.0 ** -126) * (a == 0))) - MAX_POW2[fmt]
    e = np.where(shared < -127, -127, shared)
    return np.where(~np.isfinite(a) | (shared > 127), NAN, np.nan_to_num(e)).astype(np.int64)


def ours(bits, fmt, rule) -> tuple[np.ndarray, np.ndarray]:
    """(direct, per block as the quantizer computes them) exponents of the block scale."""
    f, a, rule = formats.get(fmt), jnp.asarray(bits), scale_rules.get(rule)
    direct = _with_nan(*block_scale.block_exponent(a, f, rule))
    blk = block_scale.per_block_quantities(a, f, rule)
    return direct, _with_nan(blk.e, blk.nan)


def test_every_rule_is_registered_and_listed_in_order():
    assert scale_rules.names()[:5] == ("floor", "rceil", "ceil", "even", "paper_bump")
    assert MXSpec("fp8_e4m3").scale_rule.name == "floor"
    with pytest.raises(ValueError, match="unknown scale_rule 'nearest_pow2'.*floor, rceil, ceil, even, paper_bump"):
        scale_rules.get("nearest_pow2")


@pytest.mark.parametrize("fmt", FORMATS)
def test_floor_is_the_mx_librarys_and_torchaos(fmt):
    direct, table = ours(AMAX, fmt, "floor")
    assert np.array_equal(direct, table)
    assert np.array_equal(direct, torchao_floor(AMAX, fmt))
    library = mx_library_floor(AMAX, fmt)
    zero = AMAX == 0  # the library gives a zero block 2**-126 / 2**emax: -126 for MXINT8 (values 0 either way)
    assert np.array_equal(direct[~zero], library[~zero]) and np.all(direct[zero] == -127)
    # the library takes log2 in float32: it rounds up within ~2**-18 below a power of two, and only there
    f32 = mx_library_floor(AMAX, fmt, np.float32)
    with np.errstate(invalid="ignore"):
        a = AMAX.view(np.float32).astype(np.float64)
    off = (f32 != library) & np.isfinite(a)
    gap = np.exp2(np.ceil(np.log2(a[off]))) - a[off]
    assert np.all(gap < 2.0 ** -17 * a[off]) and np.all((f32[off] == library[off] + 1) | (f32[off] == NAN))


@pytest.mark.parametrize("fmt", FORMATS)
def test_rceil_is_the_exact_round_up_and_torchaos(fmt):
    direct, table = ours(AMAX, fmt, "rceil")
    assert np.array_equal(direct, table)
    assert np.array_equal(direct, exact_rceil(AMAX, fmt))
    theirs, normal = torchao_rceil(AMAX, fmt)
    assert np.array_equal(direct[normal], theirs[normal])
    # below, torchao's float32 quotient is subnormal and rounds: at most the one exponent, never more
    assert np.all(np.abs(direct[~normal & (theirs != NAN)] - theirs[~normal & (theirs != NAN)]) <= 1)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rule, theirs", [("ceil", torchao_ceil), ("even", torchao_even)])
def test_ceil_and_even_are_torchaos(fmt, rule, theirs):
    direct, table = ours(AMAX, fmt, rule)
    assert np.array_equal(direct, table)
    assert np.array_equal(direct, theirs(AMAX, fmt))


def _blocks_with_maxima(bits: np.ndarray, seed=0) -> np.ndarray:
    """(n, 32) float32 blocks, block i's largest magnitude the float32 of ``bits[i]`` (finite ones)."""
    amax = bits.view(np.float32)
    rng = np.random.default_rng(seed)
    x = (amax[:, None] * rng.uniform(-1, 1, (len(bits), 32))).astype(np.float32)
    x[:, rng.integers(0, 32)] = amax * np.where(rng.random(len(bits)) < 0.5, -1, 1)
    return x


@pytest.mark.parametrize("rule, theirs", [("ceil", torchao_ceil), ("even", torchao_even)])
@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp4_e2m1"])
def test_ceil_and_even_quantize_end_to_end(fmt, rule, theirs):
    bits = AMAX[np.isfinite(AMAX.view(np.float32))]
    x = _blocks_with_maxima(bits)
    spec = MXSpec(fmt, scale_rule=rule)
    got, stats = np.asarray(quantize(x, spec)), quantize_stats(x, spec)
    want = reference_quantize(x, spec)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    e = np.asarray(stats.scale_exponent)[:, 0]
    assert np.array_equal(np.where(e == 128, NAN, e), theirs(bits, fmt))
    ref = reference_stats(x, spec)
    for name in ("clamped_frac", "last_bin_frac", "flushed_frac", "nan_frac"):  # the counts
        assert round(float(getattr(stats, name)) * x.size) == round(getattr(ref, name) * x.size), name


def test_paper_bump_end_to_end():
    """Per block the floor exponent; one more for every position whose maximum over the blocks has a
    significand above 1.75 (the authors' maximum over the wrong axis); elements cast with ties to even."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((6, 64)) * np.exp2(rng.integers(-6, 6, (6, 1)))).astype(np.float32)
    x[2, 5] = np.float32(1.9 * 2.0 ** 3)  # a position that bumps
    got = np.asarray(quantize(x, MXSpec("fp8_e4m3", scale_rule="paper_bump")))
    blocks = x.reshape(6, 2, 32)
    a = np.abs(blocks).astype(np.float64)
    e_block = np.floor(np.log2(a.max(axis=2, keepdims=True))) - 8
    m = a.max(axis=(0, 1), keepdims=True)  # per position within a block, over every block of the tensor
    bump = m / np.exp2(np.floor(np.log2(m))) > 1.75
    e = e_block + bump
    v = np.minimum(a / np.exp2(e), 448.0).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    want = (np.sign(blocks) * v * np.exp2(e)).astype(np.float32).reshape(6, 64)
    assert bump.any() and not bump.all()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_rules_refuse_what_they_are_not_defined_for():
    with pytest.raises(ValueError, match="fp8_e4m3 elements in 1-D blocks only"):
        MXSpec("fp8_e4m3", scale_rule="paper_bump", block_dims=2)
    for rule in ("ceil", "even"):  # defined for every MX format and block shape
        assert MXSpec("int8", scale_rule=rule, block_dims=2).rule.name == rule


def test_rules_apply_per_operand_in_a_recipe():
    """fwd_x floor, fwd_w ceil: the forward GEMM is the product of the two operands each quantized by its own
    rule (the float64 reference), not of both under one rule; the recipe keeps the rules through JSON and Config."""
    import dataclasses

    from mx_proxy.nn.dense import mx_dense
    from mx_proxy.numerics import recipe_json
    from mx_proxy.numerics.recipe import Recipe, get
    from mx_proxy.training.config import Config

    rng = np.random.default_rng(5)
    x = (rng.standard_normal((16, 64)) * 3).astype(np.float32)
    w = (rng.standard_normal((64, 32)) * 0.1).astype(np.float32)
    r = Recipe("per_operand", fwd_x=MXSpec("fp8_e4m3"), fwd_w=MXSpec("fp8_e4m3", scale_rule="ceil"), vector="fp32")
    y = np.asarray(mx_dense(jnp.asarray(x), jnp.asarray(w), None, r), np.float64)

    def product(rx, rw):
        qx = reference_quantize(x, MXSpec("fp8_e4m3", scale_rule=rx), axis=1).astype(np.float64)
        qw = reference_quantize(w, MXSpec("fp8_e4m3", scale_rule=rw), axis=0).astype(np.float64)
        return qx @ qw

    scale = np.abs(product("floor", "ceil")).max()
    assert np.abs(y - product("floor", "ceil")).max() < 1e-5 * scale
    for other in (("floor", "floor"), ("ceil", "ceil"), ("ceil", "floor")):
        assert np.abs(y - product(*other)).max() > 1e-3 * scale, other

    back = recipe_json.from_json(recipe_json.to_json(r))
    assert (back.fwd_x.scale_rule.name, back.fwd_w.scale_rule.name) == ("floor", "ceil")
    cfg = Config(recipe=r)
    assert (cfg.recipe.fwd_x.scale_rule.name, cfg.recipe.fwd_w.scale_rule.name) == ("floor", "ceil")
    # a preset with one operand changed, and every rule by name on a whole preset
    e4m3 = get("mxfp8_e4m3")
    one = e4m3.replace(wgrad_g=e4m3.wgrad_g.replace(scale_rule="even"))
    assert [getattr(one, op).scale_rule.name for op in ("fwd_x", "wgrad_g")] == ["floor", "even"]
    for rule in scale_rules.names():
        assert {s.scale_rule.name for s in (getattr(get(f"mxfp8_e4m3+{rule}"), f.name) for f in dataclasses.fields(r)
                                       if f.name in ("fwd_x", "fwd_w", "dgrad_g", "dgrad_w", "wgrad_x", "wgrad_g"))} \
            == {rule}
    with pytest.raises(ValueError, match="unknown recipe 'mxfp8_e4m3\\+nearest'.*valid: fp32"):
        get("mxfp8_e4m3+nearest")


def test_a_spec_holds_its_rule_object_resolved_once():
    from mx_proxy.numerics import recipe_json
    from mx_proxy.numerics.quantize import NVFP4
    from mx_proxy.numerics.recipe import get
    from mx_proxy.numerics.spec import AMAX

    ceil = scale_rules.get("ceil")
    spec = MXSpec("fp8_e4m3", scale_rule="ceil")
    assert spec.scale_rule is ceil and spec.rule is ceil and "ScaleRule(ceil)" in repr(spec)
    by_object = MXSpec("fp8_e4m3", scale_rule=ceil)
    assert by_object == spec and hash(by_object) == hash(spec) and spec.name == "mxfp8_e4m3/32/ceil/even"
    assert NVFP4.scale_rule is AMAX and NVFP4.rule is None
    back = pickle.loads(pickle.dumps(spec))  # an equal rule, not the registry's object: resolves to it again
    assert back == spec and hash(back) == hash(spec) and back.replace(rounding="away").scale_rule is ceil
    with pytest.raises(ValueError, match="not registered"):
        MXSpec("fp8_e4m3", scale_rule=scale_rules.ScaleRule("ceil", "another rule of the same name"))
    fn = jax.jit(lambda x, s: quantize(x, s), static_argnums=1)  # a static argument: one program for both
    x = jnp.linspace(-3.0, 3.0, 64, dtype=jnp.float32)
    assert np.array_equal(np.asarray(fn(x, spec)), np.asarray(fn(x, by_object))) and fn._cache_size() == 1
    recipe = get("mxfp8_e4m3+ceil")
    assert recipe_json.to_json(recipe)["fwd_x"]["scale_rule"] == "ceil"  # stored (and hashed) by name
    assert recipe_json.from_json(recipe_json.to_json(recipe)) == recipe

