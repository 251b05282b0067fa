"""mx_dot_general against an independent quantize-then-dot on random dimension numbers, and its VJP against
the proxy's dense layer's three gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mx_proxy.interop.dot_general import mx_dot_general
from mx_proxy.nn.dense import mx_dense
from mx_proxy.numerics import recipe as recipes
from mx_proxy.numerics.quantize import quantize

FP32_VECTOR = recipes.get("mxfp8_e4m3").replace(vector="fp32")


@st.composite
def problems(draw):
    """Random (lhs shape, rhs shape, dimension numbers) with one batch axis at most and K a multiple of 32."""
    nb = draw(st.integers(0, 1))
    batch = [draw(st.integers(1, 2)) for _ in range(nb)]
    contract = draw(st.sampled_from([[32], [2, 16], [64]]))
    lfree = [draw(st.integers(1, 3)) for _ in range(draw(st.integers(0, 2)))]
    rfree = [draw(st.integers(1, 3)) for _ in range(draw(st.integers(1, 2)))]
    shared = [("b", i) for i in range(nb)] + [("c", i) for i in range(len(contract))]
    lroles = shared + [("f", i) for i in range(len(lfree))]
    rroles = shared + [("f", i) for i in range(len(rfree))]
    lroles = draw(st.permutations(lroles))
    rroles = draw(st.permutations(rroles))
    size = {"b": batch, "c": contract}
    lshape = tuple((size | {"f": lfree})[k][i] for k, i in lroles)
    rshape = tuple((size | {"f": rfree})[k][i] for k, i in rroles)
    pos = lambda roles, k: tuple(roles.index((k, i)) for i in range(len(size[k])))  # noqa: E731
    dims = ((pos(lroles, "c"), pos(rroles, "c")), (pos(lroles, "b"), pos(rroles, "b")))
    seed = draw(st.integers(0, 2**16))
    return lshape, rshape, dims, seed


def _reference(lhs, rhs, dims, recipe):
    """Quantize each operand along its (flattened) contracting axes with the forward specs, then dot_general."""
    (lc, rc), (lb, rb) = dims
    lf = [i for i in range(lhs.ndim) if i not in lc + lb]
    rf = [i for i in range(rhs.ndim) if i not in rc + rb]
    a = jnp.transpose(lhs, lb + tuple(lf) + lc)
    b = jnp.transpose(rhs, rb + rc + tuple(rf))
    k = int(np.prod([lhs.shape[i] for i in lc]))
    qa = quantize(a.reshape(*a.shape[:a.ndim - len(lc)], k), recipe.fwd_x, axis=-1).reshape(a.shape)
    qb_flat = b.reshape(*b.shape[:len(rb)], k, -1)
    qb = quantize(qb_flat, recipe.fwd_w, axis=len(rb)).reshape(b.shape)
    nbat, nc = len(lb), len(lc)
    return jax.lax.dot_general(qa, qb, ((tuple(range(a.ndim - nc, a.ndim)), tuple(range(nbat, nbat + nc))),
                                        (tuple(range(nbat)), tuple(range(nbat)))),
                               precision=jax.lax.Precision.HIGHEST)


@settings(max_examples=25, deadline=None)
@given(problems())
def test_forward_is_quantize_then_dot(problem):
    lshape, rshape, dims, seed = problem
    k1, k2 = jax.random.split(jax.random.key(seed))
    lhs, rhs = jax.random.normal(k1, lshape), jax.random.normal(k2, rshape)
    got = mx_dot_general(lhs, rhs, dims, FP32_VECTOR)
    want = _reference(lhs, rhs, dims, FP32_VECTOR)
    assert got.shape == jax.lax.dot_general(lhs, rhs, dims).shape
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "paper_e4m3"])
def test_vjp_is_the_dense_layers(name):
    """A transposed, 3-D lhs contracted on its first axis: the three gradients are mx_dense's bit for bit."""
    recipe = recipes.get(name)
    x = jax.random.normal(jax.random.key(1), (64, 3, 4))   # (K, m1, m2)
    w = jax.random.normal(jax.random.key(2), (5, 64))       # (N, K)
    dims = (((0,), (1,)), ((), ()))
    g = jax.random.normal(jax.random.key(3), (3, 4, 5))
    y, vjp = jax.vjp(lambda a, b: mx_dot_general(a, b, dims, recipe), x, w)
    x2, w2 = jnp.transpose(x, (1, 2, 0)).reshape(12, 64), w.T
    y2, vjp2 = jax.vjp(lambda a, b: mx_dense(a, b, None, recipe), x2, w2)
    dx, dw = vjp(g)
    dx2, dw2 = vjp2(g.reshape(12, 5))
    np.testing.assert_array_equal(np.asarray(y).reshape(12, 5), np.asarray(y2))
    np.testing.assert_array_equal(np.asarray(jnp.transpose(dx, (1, 2, 0)).reshape(12, 64)), np.asarray(dx2))
    np.testing.assert_array_equal(np.asarray(dw.T), np.asarray(dw2))
    assert not np.array_equal(np.asarray(dw2), np.asarray(jax.vjp(lambda b: x2 @ b, w2)[1](g.reshape(12, 5))[0]))


def test_no_contracting_axis_is_refused():
    with pytest.raises(ValueError, match="contract no axis"):
        mx_dot_general(jnp.ones((2, 3)), jnp.ones((4,)), (((), ()), ((), ())), FP32_VECTOR)
