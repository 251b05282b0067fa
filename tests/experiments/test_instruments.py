"""The instruments on a user's model against independent computations: ζ and the cosine from two jax.grad
calls by hand, an operand's clamp and last-bin fractions from the MX scale computed in numpy, the blow-up rule
as the ensembles apply it to a Run, its rate against scipy's exact interval."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from mx_proxy.experiments import analysis, instruments
from mx_proxy.interop.linen import quantize
from mx_proxy.interop.nnx_model import quantize_nnx
from mx_proxy.training.config import Config
from mx_proxy.training.result import Run


class Mlp(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(8, name="out")(jax.nn.relu(nn.Dense(32, name="fc")(x)))


def _setup(recipe="mxfp8_e4m3"):
    x = jax.random.normal(jax.random.key(0), (16, 64))
    y = jax.random.normal(jax.random.key(1), (16, 8))
    q = quantize(Mlp(), recipe, x)
    params = Mlp().init(jax.random.key(2), x)

    def loss(p, x, y):
        return jnp.mean((q.apply(p, x) - y) ** 2)

    def ref_loss(p, x, y):
        return jnp.mean((Mlp().apply(p, x) - y) ** 2)

    return loss, ref_loss, params, x, y


def test_gradient_bias_is_zeta_and_cosine_of_two_grads_by_hand():
    loss, ref_loss, params, x, y = _setup()
    flat = lambda t: np.concatenate([np.asarray(a, np.float64).ravel() for a in jax.tree.leaves(t)])  # noqa: E731
    g, g_ref = flat(jax.grad(loss)(params, x, y)), flat(jax.grad(ref_loss)(params, x, y))
    got = jax.jit(lambda p, x, y: instruments.gradient_bias(loss, ref_loss, p, x, y))(params, x, y)
    err = np.linalg.norm(g - g_ref)
    assert err > 0  # the recipe changes the gradient: the test can tell a bias from none
    np.testing.assert_allclose(float(got.error_norm), err, rtol=1e-5)
    np.testing.assert_allclose(float(got.zeta), err / np.linalg.norm(g_ref), rtol=1e-5)
    np.testing.assert_allclose(float(got.zeta_paper), (err / np.linalg.norm(g_ref)) ** 2, rtol=1e-5)
    cos = g @ g_ref / (np.linalg.norm(g) * np.linalg.norm(g_ref))
    np.testing.assert_allclose(float(got.cosine), cos, rtol=1e-5)
    np.testing.assert_allclose(float(got.loss), float(loss(params, x, y)), rtol=1e-6)


def test_gradient_bias_of_the_fp32_model_against_itself_is_zero():
    _, ref_loss, params, x, y = _setup()
    got = instruments.gradient_bias(ref_loss, ref_loss, params, x, y)
    assert float(got.zeta) == 0.0 and float(got.cosine) == 1.0


def test_compare_gradients_refuses_different_trees():
    with pytest.raises(ValueError, match="different structures"):
        instruments.compare_gradients({"a": jnp.ones(2)}, {"b": jnp.ones(2)})


def _e4m3_fractions(w):
    """Clamp and last-bin fractions of W (K, N) quantized to E4M3 in blocks of 32 along K, floor scale rule,
    after rounding W to bfloat16 (the recipe's vector precision), computed in numpy."""
    w = np.asarray(jnp.asarray(w).astype(jnp.bfloat16).astype(jnp.float32), np.float64)
    k, n = w.shape
    blocks = w.reshape(k // 32, 32, n)
    amax = np.abs(blocks).max(axis=1, keepdims=True)
    scaled = np.abs(blocks) / 2.0 ** (np.floor(np.log2(amax)) - 8)  # E4M3's emax is 8
    return float((scaled > 448).mean()), float((scaled >= 432).mean())  # 432: halfway to 448, a tie to even


def test_quant_table_fractions_match_numpy():
    loss, _, params, x, y = _setup()
    table = instruments.quant_table(loss, params, x, y)
    assert set(table["layer"]) == {"fc", "out"}
    assert set(table[table["layer"] == "fc"]["operand"]) == {"fwd_x", "fwd_w", "dgrad_g", "dgrad_w", "wgrad_x",
                                                             "wgrad_g"}
    row = table[(table["layer"] == "fc") & (table["operand"] == "fwd_w")].iloc[0]
    clamp, last_bin = _e4m3_fractions(params["params"]["fc"]["kernel"])
    assert clamp > 0
    np.testing.assert_allclose(row["clamp_frac"], clamp, rtol=1e-6)
    np.testing.assert_allclose(row["last_bin_frac"], last_bin, rtol=1e-6)
    summary = instruments.quant_summary(table)
    assert summary["max_clamp_frac"] == pytest.approx(table["clamp_frac"].max())
    assert set(summary) == {"max_clamp_frac", "max_underflow_frac", "max_last_bin_frac"}


def _run(loss):
    metrics = pd.DataFrame({"step": np.arange(len(loss)), "loss": np.asarray(loss, float)})
    return Run(Config(steps=len(loss)), metrics, None)


@pytest.mark.parametrize("seed", range(4))
def test_blowup_at_is_the_ensembles_rule(seed):
    rng = np.random.default_rng(seed)
    loss = np.exp(-np.linspace(0, 2, 300)) + 0.01 * rng.random(300)
    at = int(rng.integers(40, 290))
    loss[at:] *= float(rng.choice([3.0, 30.0]))  # below or above the rule's 10×
    want = analysis.unstable_after(_run(loss), 0)
    assert instruments.blowup_at(loss, spike_factor=None) == want
    assert (want is not None) == (loss[at] / loss[at - 1] > 10)


def test_blowup_at_non_finite_and_spikes():
    assert instruments.blowup_at(np.ones(50)) is None
    assert instruments.blowup_at([1.0, 1.0, np.nan, 1.0]) == 2
    spike = np.ones(20)
    spike[3] = 500.0  # inside the first window the 10× rule skips, but a 100× one-step divergence
    assert instruments.blowup_at(spike) == 3
    assert instruments.blowup_at(spike, spike_factor=None) is None


@pytest.mark.parametrize("bad, match", [({"factor": 1.0}, "factor"), ({"window": 0}, "window"),
                                        ({"spike_factor": 0.5}, "spike_factor")])
def test_blowup_at_refuses_a_bad_rule(bad, match):
    with pytest.raises(ValueError, match=match):
        instruments.blowup_at(np.ones(10), **bad)
    with pytest.raises(ValueError, match="1-D"):
        instruments.blowup_at(np.ones((2, 10)))


def test_blowup_rates_counts_and_clopper_pearson():
    stable, blown = np.ones(100), np.r_[np.ones(60), np.full(40, 50.0)]
    table = instruments.blowup_rates({"fp32": [stable] * 4, "mx": [blown, blown, stable]})
    assert list(table["blowups"]) == [0, 2] and list(table["members"]) == [4, 3]
    ci = sps.binomtest(2, 3).proportion_ci(method="exact")
    np.testing.assert_allclose(table.iloc[1][["rate", "low", "high"]].to_numpy(float), [2 / 3, ci.low, ci.high])
    with pytest.raises(ValueError, match="'empty'"):
        instruments.blowup_rates({"empty": []})


def test_the_instruments_read_an_nnx_model_against_its_unquantized_clone():
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.norm = nnx.RMSNorm(32, rngs=rngs)
            self.fc = nnx.Linear(32, 8, rngs=rngs)

        def __call__(self, x):
            return self.fc(self.norm(x))

    model = Net(nnx.Rngs(0))
    ref = nnx.clone(model)
    quantize_nnx(model, "mxfp8_e4m3")
    graph, params = nnx.split(model, nnx.Param)
    ref_graph, ref_params = nnx.split(ref, nnx.Param)
    x = jax.random.normal(jax.random.key(1), (16, 32))

    def loss(p, x):
        return jnp.mean(nnx.merge(graph, p)(x) ** 2)

    def ref_loss(p, x):
        return jnp.mean(nnx.merge(ref_graph, p)(x) ** 2)

    bias = instruments.gradient_bias(loss, ref_loss, params, x)  # the same Params fit both graphs
    g, g_ref = jax.grad(loss)(params, x), jax.grad(ref_loss)(ref_params, x)
    diff = np.sqrt(sum(float(jnp.sum((a - b) ** 2)) for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref))))
    np.testing.assert_allclose(float(bias.error_norm), diff, rtol=1e-5)
    assert float(bias.zeta) > 0
