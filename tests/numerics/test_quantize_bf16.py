"""quantize of bfloat16 arrays: the element stage on 16-bit words gives the
float32 path's values bit for bit, for every element format, every
per-block scale rule and both deterministic roundings, on every bf16 bit
pattern and on blocks whose scales sweep the whole E8M0 range."""

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from test_quantize import assert_same_bits

from mx_proxy.numerics import scale_rules
from mx_proxy.numerics.formats import ElementFormat
from mx_proxy.numerics.mx import bits as B
from mx_proxy.numerics.mx.block_scale import word_table
from mx_proxy.numerics.quantize import NVFP4, MXSpec, quantize
from mx_proxy.numerics.reference import reference_quantize

FORMATS = ("fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1", "int8")
BLOCK_RULES = tuple(r for r in scale_rules.names() if not scale_rules.get(r).per_element)
SPECS = [MXSpec(f, scale_rule=r, rounding=o) for f in FORMATS for r in BLOCK_RULES for o in ("even", "away")]
PROPERTY = settings(deadline=None, derandomize=True)


def _ids(spec):
    return spec.name


def _bf16(bits: np.ndarray) -> np.ndarray:
    return bits.astype(np.uint16).view(ml_dtypes.bfloat16)


def _every_pattern() -> np.ndarray:
    """All 65536 bf16 bit patterns twice, (4096, 32): sorted by magnitude (each
    block's elements within a few binades of its amax) and shuffled (most
    elements far below their amax: flushed and subnormal roundings)."""
    bits = np.arange(1 << 16, dtype=np.uint32)
    order = np.argsort(bits & 0x7FFF, kind="stable")
    shuffled = np.random.default_rng(0).permutation(bits)
    return _bf16(np.concatenate([bits[order], shuffled]).reshape(-1, 32))


def _scale_sweep(draws: int = 8) -> np.ndarray:
    """Blocks (draws * 255, 32) whose amax exponent field F runs over 0..254:
    a leader with field F and 31 elements with fields F-12..F (random
    fractions and signs), so every block scale of every rule is met, with
    element subnormals and bf16 subnormals in the smallest blocks."""
    rng = np.random.default_rng(1)
    field = np.tile(np.arange(255), draws)[:, None]
    fields = np.concatenate([field, np.clip(field - rng.integers(0, 13, (field.size, 31)), 0, None)], axis=1)
    bits = (fields << 7) | rng.integers(0, 128, fields.shape) | (rng.integers(0, 2, fields.shape) << 15)
    return _bf16(bits)


X = np.concatenate([_every_pattern(), _scale_sweep()])


@pytest.mark.parametrize("spec", SPECS, ids=_ids)
def test_bf16_words_equal_the_float32_path(spec):
    x = jnp.asarray(X)
    for axis, arr in ((-1, x), (0, x.T)):
        assert_same_bits(quantize(arr, spec, axis=axis), quantize(arr.astype(jnp.float32), spec, axis=axis))


@pytest.mark.parametrize("spec", [MXSpec("fp8_e4m3", rounding="away"), MXSpec("fp4_e2m1", scale_rule="rceil"),
                                  MXSpec("fp6_e3m2", block_dims=2)], ids=_ids)
def test_bf16_words_on_ragged_and_tiled_layouts_match_the_reference(spec):
    x = np.asarray(X[:40, :23].astype(np.float32))  # 23 columns: a padded block
    x = np.where(np.isfinite(x), x, 1.0).astype(ml_dtypes.bfloat16)  # the reference takes finite arrays here
    got = quantize(jnp.asarray(x), spec, axis=-1)
    assert_same_bits(got, quantize(jnp.asarray(x, jnp.float32), spec, axis=-1))
    assert_same_bits(got, np.asarray(reference_quantize(x.astype(np.float32), spec, axis=-1), np.float32))


@settings(PROPERTY, max_examples=60)
@given(spec=st.sampled_from(SPECS),
       bits=hnp.arrays(np.uint16, (3, 64), elements=st.integers(0, (1 << 16) - 1)),
       shift=st.integers(0, 120))
def test_bf16_words_equal_the_float32_path_on_random_blocks(spec, bits, shift):
    # shifting the exponent fields down crowds values into the small and subnormal binades
    a = bits.astype(np.int32)
    field = np.clip(((a >> 7) & 0xFF) - shift, 0, 255)
    x = jnp.asarray(_bf16((a & 0x807F) | (field << 7)))
    assert_same_bits(quantize(x, spec), quantize(x.astype(jnp.float32), spec))


WORD_CASES = [(MXSpec("fp8_e4m3"), True), (MXSpec("fp8_e4m3", rounding="stochastic"), False),
              (MXSpec("fp8_e4m3", scale_rule="paper_bump"), False), (NVFP4, False)]


@pytest.mark.parametrize("spec, bf16_words", WORD_CASES, ids=str)
def test_which_specs_round_bf16_words(spec, bf16_words):
    """Deterministic per-block E8M0 specs take the 16-bit words; stochastic
    rounding (32 random bits per element), per-element rules and E4M3 scales
    stay on float32 words. Either way the result is float32."""
    x = jnp.ones((4, 32), jnp.bfloat16)
    key = jax.random.key(0) if spec.rounding == "stochastic" else None
    text = jax.jit(lambda x: quantize(x, spec, key=key)).lower(x).as_text()
    assert ("ui16" in text) == bf16_words
    assert quantize(x, spec, key=key).dtype == jnp.float32


def test_a_format_finer_than_bf16_stays_on_float32_words():
    fine = ElementFormat("fine10", np.dtype(np.uint16), 5, 10, 15, -14, 65504.0, False, False)
    with pytest.raises(ValueError, match="fine10's max_normal \\* 2\\*\\*e is not a bfloat16 value"):
        word_table(fine, scale_rules.get("floor"), B.BF16)
    assert word_table(fine, scale_rules.get("floor"), B.F32) is not None


def test_grad_of_a_bf16_input_is_straight_through_in_float32():
    x = jnp.linspace(-3, 3, 64, dtype=jnp.float32).astype(jnp.bfloat16).reshape(2, 32)
    g = jax.grad(lambda x: jnp.sum(quantize(x, MXSpec("fp8_e4m3")) * 2.0))(x)
    assert g.dtype == jnp.bfloat16 and np.all(np.asarray(g, np.float32) == 2.0)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("axis", [0, 1])
def test_quantize_under_vmap_equals_each_slice_alone(axis, dtype):
    # the member axis of a vmapped sweep: the per-block quantities' reduction and the element loop batched
    spec = MXSpec("fp8_e4m3", rounding="away")
    x = jax.random.normal(jax.random.key(2), (3, 64, 96), jnp.float32)
    x = (x * jnp.exp2(jnp.arange(3, dtype=jnp.float32) * 40 - 40)[:, None, None]).astype(dtype)
    got = jax.jit(jax.vmap(lambda v: quantize(v, spec, axis=axis)))(x)
    for i in range(x.shape[0]):
        assert_same_bits(got[i], quantize(x[i], spec, axis=axis))
