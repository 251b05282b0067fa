"""Recipe presets, validation and serialization."""

import dataclasses

import pytest

from mx_proxy.numerics import recipe as recipes
from mx_proxy.numerics import recipe_json
from mx_proxy.numerics.quantize import MXSpec


def test_every_preset_named_in_the_issue_exists_and_is_hashable():
    wanted = ["fp32", "bf16", "mxfp8_e4m3", "mxfp8_e5m2", "mxfp8_mixed", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4",
              "mxint8", "forward_only", "bf16_activations", "ln_exempt", "rceil", "reference_mixed"]
    for name in wanted:
        r = recipes.get(name)
        assert r.name == name
        hash(r)
    assert set(wanted) <= set(recipes.names())


def test_presets_follow_the_paper():
    mixed = recipes.get("mxfp8_mixed")
    assert mixed.fwd_x.element.name == mixed.fwd_w.element.name == "fp8_e4m3"
    assert {getattr(mixed, f).element.name for f in ("dgrad_g", "dgrad_w", "wgrad_x", "wgrad_g")} == {"fp8_e5m2"}
    ref = recipes.get("reference_mixed")
    assert ref.ln_affine is None and ref.vector == "bf16"
    assert {getattr(ref, f).rounding
            for f in ("fwd_x", "fwd_w", "dgrad_g", "dgrad_w", "wgrad_x", "wgrad_g")} == {"away"}
    assert not recipes.get("forward_only").quantizes_backward
    assert recipes.get("ln_exempt").ln_precision == "fp32" and recipes.get("ln_exempt").ln_affine is None
    assert recipes.get("rceil").fwd_w.scale_rule.name == "rceil"
    bfa = recipes.get("bf16_activations")
    assert bfa.fwd_x is None and bfa.fwd_w is not None and bfa.wgrad_x is None
    assert recipes.get("fp32").is_full_precision and not recipes.get("bf16").is_full_precision


def test_variants_by_replace_and_json_round_trip():
    r = recipes.get("mxfp8_e4m3").replace(name="e4m3_no_ln", ln_affine=None)
    assert dataclasses.replace(r) == r
    assert recipe_json.from_json(recipe_json.to_json(r)) == r
    assert recipe_json.to_json(recipes.get("mxfp4")) == "mxfp4"
    stoch = r.map_specs(lambda s: s.replace(rounding="away"))
    assert stoch.fwd_x.rounding == "away" and stoch.ln_affine is None


@pytest.mark.parametrize("fields, match", [
    (dict(vector="fp16"), "vector precision"),
    (dict(fwd_x="fp8_e4m3"), "MXSpec or None"),
    (dict(backend="cuda"), "backend"),
    (dict(vector_rounding="odd"), "vector_rounding 'odd'; valid: even, away"),
    (dict(ln_precision="half"), "ln_precision 'half'; valid: vector, fp32, stats_fp32"),
    (dict(backward_precision="bf8"), "backward_precision 'bf8'"),
    (dict(train_ln_bias="no"), "train_ln_bias"),
])
def test_a_bad_recipe_field_is_a_value_error_naming_it(fields, match):
    with pytest.raises(ValueError, match=match):
        recipes.Recipe(**fields)


def test_bad_recipes_are_value_errors():
    with pytest.raises(ValueError, match="valid: fp32, bf16"):
        recipes.get("mxfp9")
    assert "| `mxfp8_mixed` |" in recipes.table()
    assert isinstance(recipes.get("mxfp4").fwd_x, MXSpec)
