"""The authors' computation as recipes, ties-away vector math, the paired
reference run and the paper's squared ζ."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import mx_proxy as mxp
import mx_proxy.training.config
from mx_proxy.nn import layers
from mx_proxy.numerics import recipe as recipes
from mx_proxy.numerics import recipe_json
from mx_proxy.numerics.quantize import MXSpec

SMALL = mxp.Config(width=32, depth=2, batch=64, steps=30, diagnostics_every=10, val_every=10, val_batches=1,
                     lr=3e-3)


# --------------------------------------------------------------------------- bf16 rounding


def _bf16_reference(x: np.ndarray, rounding: str) -> np.ndarray:
    """Nearest bf16 by float64 distance between the two bf16 neighbours."""
    out = np.empty_like(x)
    for i, v in enumerate(x):
        if not np.isfinite(v):
            out[i] = v
            continue
        bits = np.array([v], np.float32).view(np.uint32)[0]
        lo = np.array([bits & 0xFFFF0000], np.uint32).view(np.float32)[0]
        hi = np.array([(bits & 0xFFFF0000) + 0x10000], np.uint32).view(np.float32)[0]  # next away from zero
        d_lo, d_hi = abs(float(v) - float(lo)), abs(float(hi) - float(v))
        if d_lo < d_hi:
            out[i] = lo
        elif d_hi < d_lo:
            out[i] = hi
        elif rounding == "away":
            out[i] = hi
        else:
            out[i] = lo if (np.array([lo], np.float32).view(np.uint32)[0] >> 16) % 2 == 0 else hi
    return out


def _rounding_cases():
    rng = np.random.default_rng(0)
    base = rng.standard_normal(2000).astype(np.float32) * np.exp2(rng.integers(-60, 60, 2000)).astype(np.float32)
    grid = base.astype(ml_dtypes.bfloat16).astype(np.float32)
    ulp_half = np.abs(grid) * np.float32(2.0 ** -8)  # half a bf16 ulp for values with mantissa bits 0
    ties = (grid.view(np.uint32) & 0xFFFF0000 | 0x8000).view(np.float32)  # exactly halfway between two bf16s
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3.3895314e38, -3.3895314e38,
                         np.float32(ml_dtypes.finfo(ml_dtypes.bfloat16).max)], np.float32)
    return np.concatenate([base, ties, -ties, grid + ulp_half / 3, specials]).astype(np.float32)


@pytest.mark.parametrize("rounding", ["even", "away"])
def test_bf16_round_equals_the_nearest_bf16_with_its_tie_rule(rounding):
    x = _rounding_cases()
    got = np.asarray(layers.bf16_round(jnp.asarray(x), rounding))
    want = _bf16_reference(x, rounding)
    np.testing.assert_array_equal(got, want)


def test_ties_away_and_ties_even_differ_exactly_on_ties():
    x = _rounding_cases()
    even = np.asarray(layers.bf16_round(jnp.asarray(x), "even"))
    away = np.asarray(layers.bf16_round(jnp.asarray(x), "away"))
    tie = (x.view(np.uint32) & 0xFFFF) == 0x8000
    differ = (even != away) & ~np.isnan(x)
    assert differ.any() and not (differ & ~tie).any()


def test_bf16_round_away_is_the_same_with_and_without_its_convert():
    """``bf16_round(x, "away")`` ends with a convert through bfloat16 (so that
    XLA:CPU keeps its result as a bf16 array); it changes no value: every
    upper half of a float32 bit pattern with the lower halves that decide a
    rounding (0, 1, just below, at and above the tie, all ones), subnormals
    and Inf included, against the integer round alone (``convert=False``);
    NaN stays NaN. Subnormal samples also against the float64 reference."""
    hi = np.arange(1 << 16, dtype=np.uint32) << 16
    lo = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32)
    x = (hi[:, None] | lo[None, :]).ravel().view(np.float32)
    with_convert = np.asarray(jax.jit(lambda v: layers.bf16_round(v, "away"))(x))
    without = np.asarray(jax.jit(lambda v: layers.bf16_round(v, "away", convert=False))(x))
    nan = np.isnan(x)
    np.testing.assert_array_equal(with_convert.view(np.uint32)[~nan], without.view(np.uint32)[~nan])
    assert np.isnan(with_convert[nan]).all() and np.isnan(without[nan]).all()
    sub = x[(np.abs(x) < np.float32(2.0**-126)) & (x != 0)][::37]
    np.testing.assert_array_equal(np.asarray(layers.bf16_round(jnp.asarray(sub), "away")),
                                  _bf16_reference(sub, "away"))


def test_vround_backward_rounds_the_cotangent_unless_fp32():
    x = jnp.linspace(-3, 3, 97, dtype=jnp.float32)
    g = jnp.full_like(x, 1.0 + 2.0 ** -9)  # rounds to 1.0 in bf16 (ties: no; below half an ulp)
    for rounding, backward, want in (("even", None, 1.0), ("away", None, 1.0), ("away", "fp32", 1.0 + 2.0 ** -9)):
        _, vjp = jax.vjp(
            lambda v, rounding=rounding, backward=backward: layers.vround(v, "bf16", rounding, backward), x)
        np.testing.assert_array_equal(np.asarray(vjp(g)[0]), np.full(97, want, np.float32))


# --------------------------------------------------------------------------- recipes


def test_paper_recipes_compute_what_the_authors_code_computes():
    e4, e5 = MXSpec("fp8_e4m3", rounding="away"), MXSpec("fp8_e5m2", rounding="away")
    for name in ("paper_e4m3", "paper_mix", "paper_fp6", "paper_forward_only"):
        r = recipes.get(name)
        assert r.vector == "bf16" and r.vector_rounding == "away"
        assert r.ln_affine is None and r.ln_precision == "vector"  # gains bf16, never MX-quantized
        assert r.act_precision == "fp32" and r.train_ln_bias is False
    mix = recipes.get("paper_mix")
    assert (mix.fwd_x, mix.fwd_w, mix.dgrad_g, mix.dgrad_w, mix.wgrad_x, mix.wgrad_g) == (e4, e4, e5, e5, e4, e5)
    fo = recipes.get("paper_forward_only")
    assert fo.backward_precision == "fp32" and not fo.quantizes_backward
    assert recipes.get("paper_fp6").fwd_x == MXSpec("fp6_e2m3", rounding="away")
    ref = recipes.get("reference_mixed")
    assert ref.wgrad_x == e4 and ref.vector_rounding == "away" and ref.train_ln_bias
    for family in recipes.FAMILIES.values():
        assert all(n in recipes.PRESETS for n in family)
    assert sorted(n for f in recipes.FAMILIES.values() for n in f) == sorted(recipes.PRESETS)


def test_recipes_and_configs_serialize_every_field_under_a_schema_version():
    r = recipes.get("paper_e4m3").replace(name="custom", ln_precision="stats_fp32")
    assert recipe_json.from_json(recipe_json.to_json(r)) == r
    plain = recipe_json.to_json(recipes.get("mxfp8_e4m3").replace(name="x"))
    assert plain["vector_rounding"] == "even" and plain["train_ln_bias"] is True
    d = mxp.Config().to_dict()
    assert (d["schema"] == mx_proxy.training.config.SCHEMA and d["paired_run"] is False
            and d["reference_recipe"] == "fp32")
    older = {k: v for k, v in d.items() if k not in ("schema", "paired_run", "reference_seed")}
    assert mxp.Config.from_dict(older) == mxp.Config()  # fields missing from an older dict take defaults


def test_ln_bias_stays_exactly_zero_in_paper_e4m3_and_trains_in_fp32():
    mx = mxp.train(SMALL.replace(recipe="paper_e4m3"), store=False, progress=False)
    fp = mxp.train(SMALL.replace(recipe="fp32"), store=False, progress=False)
    for k in mx.params:
        assert np.all(mx.params[k]["ln_bias"] == 0.0)
        assert np.any(fp.params[k]["ln_bias"] != 0.0)
        assert np.any(mx.params[k]["ln_gain"] != 1.0)  # the gain does train


def test_stats_fp32_layernorm_is_the_authors_dont_quantize_layernorm():
    """Input, gain and bias unrounded; mean/variance fp32; the normalized and
    scaled output still bf16; the backward in fp32."""
    x = jax.random.normal(jax.random.key(0), (8, 64)) * 3 + 0.5
    gain = 1 + 0.02 * jax.random.normal(jax.random.key(1), (64,))
    r = recipes.get("paper_e4m3").replace(ln_precision="stats_fp32")
    y, vjp = jax.vjp(lambda x, g: layers.layer_norm(x, g, None, r), x, gain)
    assert np.array_equal(np.asarray(y), np.asarray(layers.bf16_round(y)))  # outputs are bf16 values
    dx, dg = vjp(jnp.full_like(y, 1.0 + 2.0 ** -10))
    assert not np.array_equal(np.asarray(dx), np.asarray(layers.bf16_round(dx)))  # backward not rounded


# --------------------------------------------------------------------------- the paired run and the paper's ζ


def test_paired_reference_with_another_seed_is_that_seeds_fp32_run():
    cfg = SMALL.replace(recipe="fp32", paired_run=True, reference_seed=1)
    pair = mxp.train(cfg, store=False, progress=False)
    other = mxp.train(SMALL.replace(recipe="fp32", seed=1), store=False, progress=False)
    np.testing.assert_array_equal(pair.metrics["ref_loss"].to_numpy(), other.metrics["loss"].to_numpy())
    np.testing.assert_array_equal(pair.metrics["ref_grad_norm"].to_numpy(), other.metrics["grad_norm"].to_numpy())
    assert pair.metrics["zeta_paper"].notna().all()  # every step
    d = pair.metrics.dropna(subset=["zeta_bound"])
    assert len(d) and (d["zeta_bound"] == 0).all()  # its own same-point reference
    assert pair.metrics["zeta_paper"].iloc[-1] > 1.0  # two decorrelated FP32 runs


def test_paired_reference_on_other_data_is_that_data_seeds_run():
    cfg = SMALL.replace(recipe="fp32", paired_run=True, reference_data_seed=5)
    pair = mxp.train(cfg, store=False, progress=False)
    other = mxp.train(SMALL.replace(recipe="fp32", data_seed=5), store=False, progress=False)
    np.testing.assert_array_equal(pair.metrics["ref_loss"].to_numpy(), other.metrics["loss"].to_numpy())


def test_zeta_paper_is_the_squared_relative_error_against_the_paired_run():
    run = mxp.train(SMALL.replace(recipe="paper_mix", paired_run=True), store=False, progress=False)
    d = run.metrics.dropna(subset=["zeta_paper"])
    g, r, cos = d["grad_norm"].to_numpy(float), d["ref_grad_norm"].to_numpy(float), d["cosine_paper"].to_numpy(float)
    # ‖g̃ − g‖² = ‖g̃‖² + ‖g‖² − 2‖g̃‖‖g‖cos
    np.testing.assert_allclose(d["zeta_paper"].to_numpy(float), (g * g + r * r - 2 * g * r * cos) / (r * r),
                               rtol=2e-3, atol=1e-6)
    diag = d.dropna(subset=["zeta_bound"])  # the same-point bound on diagnostic steps
    assert len(diag) and (diag["zeta_bound"] > 0).all() and np.isfinite(diag["cosine"]).all()
    # the paired FP32 run is the separate FP32 run, bit for bit
    fp = mxp.train(SMALL.replace(recipe="fp32"), store=False, progress=False)
    np.testing.assert_array_equal(run.metrics["ref_loss"].to_numpy(), fp.metrics["loss"].to_numpy())
    paired_only = mxp.train(SMALL.replace(recipe="paper_mix", gradient_reference="paired_run"), store=False,
                              progress=False)
    p = paired_only.metrics.dropna(subset=["zeta_bound"])
    np.testing.assert_allclose(p["zeta_paper"], p["zeta_bound"] ** 2, rtol=1e-4)


def test_reference_fields_are_validated_at_the_boundary():
    with pytest.raises(ValueError, match="reference_seed only change the paired reference run"):
        mxp.Config(reference_seed=1)
    with pytest.raises(ValueError, match="must be deterministic"):
        mxp.Config(paired_run=True, reference_recipe="mxfp4_2d")
    with pytest.raises(ValueError, match="needs diagnostics_every > 0"):
        mxp.Config(paired_run=True, diagnostics_every=0, val_every=0)
    with pytest.raises(ValueError, match="unknown recipe 'nope'"):
        mxp.Config(paired_run=True, reference_recipe="nope")
    c = mxp.Config(paired_run=True, reference_recipe="bf16", reference_seed=3)
    assert mxp.Config.from_dict(c.to_dict()) == c and c.hash() != mxp.Config(paired_run=True).hash()


def test_bf16_against_fp32_control_runs_in_one_config():
    run = mxp.train(SMALL.replace(recipe="bf16", paired_run=True), store=False, progress=False)
    d = run.metrics.dropna(subset=["zeta_paper"])
    assert (d["zeta_paper"] > 0).all() and (d["zeta_paper"] < 1).all()


# --------------------------------------------------------------------------- GPU lowering


def _dots(f, *args, platform):
    text = jax.jit(f).trace(*args).lower(lowering_platforms=(platform,)).as_text()
    return [("bf16" if "bf16" in line.split("->")[0] else "f32", "HIGHEST" in line)
            for line in text.splitlines() if "stablehlo.dot_general" in line]


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "paper_mix", "paper_fp6", "bf16"])
def test_gpu_lowering_runs_bf16_exact_gemms_as_bf16_dots(name):
    x, w = jnp.ones((64, 64)), jnp.ones((64, 32))
    r = recipes.get(name)
    f = jax.grad(lambda x, w: jnp.sum(layers.mx_dense(x, w, None, r)), (0, 1))
    assert _dots(f, x, w, platform="cuda") == [("bf16", False)] * 2
    assert _dots(f, x, w, platform="cpu") == [("f32", True)] * 2  # the CPU never changes


@pytest.mark.parametrize("name", ["fp32", "paper_forward_only", "nvfp4"])
def test_gpu_lowering_keeps_float32_gemms_at_highest_precision(name):
    x, w = jnp.ones((64, 64)), jnp.ones((64, 32))
    r = recipes.get(name)
    f = jax.grad(lambda x, w: jnp.sum(layers.mx_dense(x, w, None, r)), (0, 1))
    assert _dots(f, x, w, platform="cuda") == [("f32", True)] * 2
