"""mx_dense, LayerNorm and activations against direct compositions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mx_proxy.nn.layers import activation, layer_norm, mx_dense, vround
from mx_proxy.numerics import recipe as recipes
from mx_proxy.numerics.quantize import MXSpec, quantize

import exactness

HI = jax.lax.Precision.HIGHEST


def _operands(seed=0, b=40, i=64, o=96):
    k = jax.random.split(jax.random.key(seed), 4)
    x = jax.random.normal(k[0], (b, i))
    w = jax.random.normal(k[1], (i, o)) * 0.1
    bias = jax.random.normal(k[2], (o,)) * 0.1
    g = jax.random.normal(k[3], (b, o))
    return x, w, bias, g


def _q(x, spec, axis, vec, rnd="even"):
    x = vround(x, vec, rnd)
    return x if spec is None else quantize(x, spec, axis=axis)


def _expected(x, w, b, g, r):
    """The recipe table, written out: each GEMM's operands along its contraction
    axis; the backward's vector math in the backward precision."""
    v, rnd = r.vector, r.vector_rounding
    y = vround(jnp.dot(_q(x, r.fwd_x, 1, v, rnd), _q(w, r.fwd_w, 0, v, rnd), precision=HI), v, rnd)
    y = vround(y + vround(b, v, rnd), v, rnd)
    v = "fp32" if r.backward_precision == "fp32" else v
    gv = vround(g, v, rnd)
    dx = vround(jax.lax.dot_general(_q(gv, r.dgrad_g, 1, v, rnd), _q(w, r.dgrad_w, 1, v, rnd),
                                    (((1,), (1,)), ((), ())), precision=HI), v, rnd)
    dw = vround(jax.lax.dot_general(_q(x, r.wgrad_x, 0, v, rnd), _q(gv, r.wgrad_g, 0, v, rnd),
                                    (((0,), (0,)), ((), ())), precision=HI), v, rnd)
    db = vround(jnp.sum(gv, axis=0), v, rnd)
    return y, dx, dw, db


E4M3, E5M2 = MXSpec("fp8_e4m3"), MXSpec("fp8_e5m2")
CASES = [
    recipes.get("fp32"), recipes.get("bf16"), recipes.get("mxfp8_e4m3"), recipes.get("mxfp8_mixed"),
    recipes.get("forward_only"), recipes.get("bf16_activations"), recipes.get("mxfp6_e2m3"),
    recipes.get("reference_mixed"), recipes.get("mxint8"), recipes.get("paper_e4m3"), recipes.get("paper_mix"),
    recipes.get("paper_fp6"), recipes.get("paper_forward_only"),
    recipes.Recipe("backward_only", dgrad_g=E5M2, dgrad_w=E4M3, wgrad_x=E4M3, wgrad_g=E5M2),
]


@pytest.mark.parametrize("r", CASES, ids=lambda r: r.name)
def test_mx_dense_forward_and_gradients_equal_the_table(r):
    """Bit for bit where order-independent; the two programs' float32 dots may
    sum in different orders (XLA compiles them apart), so an accumulation the
    rounding leaves undecided within the float32 summation-order bound
    (``tests/exactness.py``)."""
    x, w, b, g = _operands()

    def f(x, w, b, g):
        y, vjp = jax.vjp(lambda x, w, b: mx_dense(x, w, b, r), x, w, b)
        return (y, *vjp(g))

    cert = exactness.certify(f, x, w, b, g)
    for i, (got, want) in enumerate(zip(f(x, w, b, g), _expected(x, w, b, g, r))):
        bf16 = (r.vector if i == 0 else r.backward_vector) == "bf16"
        exactness.check(got, want, cert[i], f"{r.name}: {('y', 'dx', 'dw', 'db')[i]}", bf16=bf16,
                        unknown_atol=2.0**-8)


def test_fp32_recipe_gradient_is_the_plain_float32_gradient():
    x, w, b, g = _operands(1)
    r = recipes.get("fp32")
    f_mx = lambda x, w, b: jnp.sum(jnp.sin(mx_dense(x, w, b, r)))
    f = lambda x, w, b: jnp.sum(jnp.sin(jnp.dot(x, w, precision=HI) + b))
    for a, e in zip(jax.grad(f_mx, (0, 1, 2))(x, w, b), jax.grad(f, (0, 1, 2))(x, w, b)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(e))


def test_quantized_gradients_differ_from_fp32():
    x, w, b, g = _operands(2)
    _, vjp = jax.vjp(lambda w: mx_dense(x, w, b, recipes.get("mxfp4")), w)
    _, vjp32 = jax.vjp(lambda w: mx_dense(x, w, b, recipes.get("fp32")), w)
    assert not np.array_equal(np.asarray(vjp(g)[0]), np.asarray(vjp32(g)[0]))


def test_mx_dense_flattens_leading_axes():
    x, w, b, _ = _operands(3)
    r = recipes.get("mxfp8_e4m3")
    y3 = mx_dense(x.reshape(4, 10, -1), w, b, r)
    np.testing.assert_array_equal(np.asarray(y3).reshape(40, -1), np.asarray(mx_dense(x, w, b, r)))


def test_layer_norm_matches_torch_semantics_in_fp32():
    x = jax.random.normal(jax.random.key(4), (8, 64)) * 3 + 1
    gain = jnp.linspace(0.5, 1.5, 64)
    bias = jnp.linspace(-0.1, 0.1, 64)
    y = layer_norm(x, gain, bias, recipes.get("fp32"))
    xn = np.asarray(x, np.float64)
    ref = ((xn - xn.mean(-1, keepdims=True)) / np.sqrt(xn.var(-1, keepdims=True) + 1e-5) * np.asarray(gain)
           + np.asarray(bias))
    np.testing.assert_allclose(np.asarray(y), ref, rtol=1e-5, atol=1e-5)


def test_layer_norm_quantizes_affine_and_rounds_to_bf16():
    x = jax.random.normal(jax.random.key(5), (4, 64))
    gain = jnp.full((64,), 0.95)  # clustered just below 1: E4M3's floor scale clamps it to 0.875
    r = recipes.get("mxfp8_e4m3")
    y = layer_norm(x, gain, None, r)
    y_exempt = layer_norm(x, gain, None, r.replace(ln_affine=None))
    np.testing.assert_array_equal(np.asarray(quantize(gain, r.ln_affine)), np.full(64, 0.875, np.float32))
    assert not np.array_equal(np.asarray(y), np.asarray(y_exempt))
    assert np.all(np.asarray(y) == np.asarray(vround(y, "bf16")))  # every value is a bf16
    # the gain's gradient passes straight through the quantizer
    gq = jax.grad(lambda g: jnp.sum(layer_norm(x, g, None, r)))(gain)
    assert np.all(np.isfinite(np.asarray(gq))) and np.any(np.asarray(gq) != 0)


@pytest.mark.parametrize("name", ["gelu", "relu", "tanh", "linear", "swiglu"])
def test_activations_in_fp32(name):
    x = jnp.linspace(-3, 3, 64).reshape(2, 32)
    y = np.asarray(activation(name, x, recipes.get("fp32")))
    xn = np.asarray(x, np.float64)
    from scipy.special import erf
    expect = {
        "gelu": 0.5 * xn * (1 + erf(xn / np.sqrt(2))),
        "relu": np.maximum(xn, 0),
        "tanh": np.tanh(xn),
        "linear": xn,
        "swiglu": (xn[:, :16] / (1 + np.exp(-xn[:, :16]))) * xn[:, 16:],
    }[name]
    np.testing.assert_allclose(y, expect, rtol=2e-6, atol=2e-6)


def test_unknown_activation_is_a_value_error():
    with pytest.raises(ValueError, match="valid: gelu"):
        activation("softplus", jnp.ones(3), recipes.get("fp32"))


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "mxfp8_mixed", "forward_only"])
def test_pallas_backend_matches_xla(name):
    """The fused kernels (interpret mode on CPU) give the XLA path's results up
    to float32 summation order; the quantized operands are bit-identical."""
    x, w, b, g = _operands(6, b=48, i=64, o=32)
    r = recipes.get(name)
    outs = {}
    for backend in ("xla", "pallas"):
        rb = r.replace(backend=backend)
        y, vjp = jax.vjp(lambda x, w, b, rb=rb: mx_dense(x, w, b, rb), x, w, b)
        outs[backend] = (y, *vjp(g))
    for a, e in zip(outs["pallas"], outs["xla"]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=1e-2, atol=1e-5)  # bf16 outputs: 1 ulp


def test_pallas_backend_refuses_stochastic_rounding():
    s = MXSpec("fp8_e4m3", rounding="stochastic")
    with pytest.raises(ValueError, match="stochastic"):
        recipes.Recipe(fwd_x=s, backend="pallas")
