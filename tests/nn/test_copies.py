"""transposed_copy: the bits of ``jnp.swapaxes``, under jit, vmap and
differentiation, computed as a loop of its own on XLA:CPU."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mx_proxy.nn.copies import transposed_copy
from mx_proxy.numerics import recipe as recipes
from mx_proxy.numerics.quantize import quantize

_BITS = {np.dtype(np.float32): np.uint32, np.dtype(ml_dtypes.bfloat16): np.uint16}


def _bits(a):
    a = np.asarray(a)
    return a.view(_BITS[a.dtype])


def _from_bits(bits, dtype):
    return np.asarray(bits).view(dtype)


@settings(max_examples=25, deadline=None)
@given(data=st.data(), dtype=st.sampled_from([np.float32, ml_dtypes.bfloat16]))
def test_bits_equal_swapaxes_for_any_pattern(data, dtype):
    """Every bit pattern, NaN payloads, -0 and subnormals included, comes out
    where XLA's own ``jnp.swapaxes`` puts it; a NaN first element takes the
    other branch. Every non-NaN pattern is numpy's transpose of the bits. (A
    NaN's payload is XLA's to keep: compiled without backend optimizations, as
    the suite compiles, on a CPU without bf16 arithmetic (AVX2 only), XLA:CPU
    moves bf16 through float32 and a plain ``jnp.swapaxes`` returns every bf16
    NaN as the quiet 0x7FC0; the copy does exactly the same.)"""
    ubits = _BITS[np.dtype(dtype)]
    shape = data.draw(hnp.array_shapes(min_dims=2, max_dims=3, min_side=1, max_side=9))
    bits = data.draw(hnp.arrays(ubits, shape))
    x = _from_bits(bits, dtype)
    got = _bits(jax.jit(transposed_copy)(x))
    np.testing.assert_array_equal(got, _bits(jax.jit(lambda a: jnp.swapaxes(a, -1, -2))(x)))
    numbers = ~np.isnan(np.swapaxes(x, -1, -2).astype(np.float32))
    np.testing.assert_array_equal(got[numbers], np.swapaxes(bits, -1, -2)[numbers])
    assert np.isnan(_from_bits(got, dtype).astype(np.float32)[~numbers]).all()


def test_nan_first_element_and_empty():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    x[0, 0] = np.nan
    np.testing.assert_array_equal(_bits(transposed_copy(x)), _bits(x.T))
    e = np.zeros((0, 5), np.float32)
    assert transposed_copy(e).shape == (5, 0)


@pytest.mark.parametrize("in_axes", [0, 1, 2])
def test_vmap_any_axis_and_nested(in_axes):
    x = jax.random.normal(jax.random.key(0), (3, 4, 5))
    got = jax.jit(jax.vmap(transposed_copy, in_axes=in_axes))(x)
    np.testing.assert_array_equal(got, jax.vmap(lambda v: v.T, in_axes=in_axes)(x))
    y = jax.random.normal(jax.random.key(1), (2, 3, 4, 5))
    np.testing.assert_array_equal(jax.vmap(jax.vmap(transposed_copy))(y), jnp.swapaxes(y, -1, -2))


def test_derivatives_are_the_transpose():
    x = jax.random.normal(jax.random.key(0), (4, 6))
    t = jax.random.normal(jax.random.key(1), (4, 6))
    c = jax.random.normal(jax.random.key(2), (6, 4))
    y, ty = jax.jvp(transposed_copy, (x,), (t,))
    np.testing.assert_array_equal(y, x.T)
    np.testing.assert_array_equal(ty, t.T)
    g = jax.grad(lambda v: jnp.sum(transposed_copy(v) * c))(x)
    np.testing.assert_array_equal(g, c.T)
    gb = jax.grad(lambda v: jnp.sum(jax.vmap(transposed_copy)(v) * c))(jnp.stack([x, x]))
    np.testing.assert_array_equal(gb, jnp.stack([c.T, c.T]))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="what XLA:CPU compiles")
@pytest.mark.parametrize("batched", [False, True])
def test_the_copy_is_a_loop_of_its_own(batched):
    """The quantizer's element loop stays outside the transposing copy: the
    copy sits in a conditional, also under vmap (whose predicate stays a
    scalar), and the quantized values reach it unchanged."""
    spec = recipes.get("paper_e4m3").wgrad_x

    def f(x):
        return transposed_copy(quantize(x, spec, axis=0).astype(jnp.bfloat16))

    x = jax.random.normal(jax.random.key(0), (64, 96))
    fn, arg = (jax.vmap(f), jnp.stack([x, 2 * x])) if batched else (f, x)
    text = jax.jit(fn).lower(arg).compile().as_text()
    assert "conditional(" in text
    want = jnp.swapaxes(jax.vmap(lambda v: quantize(v, spec, axis=0))(arg) if batched
                        else quantize(arg, spec, axis=0), -1, -2).astype(jnp.bfloat16)
    np.testing.assert_array_equal(_bits(jax.jit(fn)(arg)), _bits(want))
