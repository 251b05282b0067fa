"""``--scale-rule`` (``Config.scale_rule``): a scale rule's own flag and field, beside the ``recipe+rule`` suffix.

A bad name exits with status 2 naming the registry's rules before any work; the flag and the suffix give the same
recipe; both given and disagreeing is refused with a message naming both; the run-store key of a config that does
not set the field is the one it had before the field existed."""

import pytest

from mx_proxy.cli.main import main
from mx_proxy.numerics import recipe as recipes
from mx_proxy.numerics import scale_rules
from mx_proxy.training.config import CHOICES, Config


def _exit(args, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main(args))
    return exc.value.code, capsys.readouterr().err


def test_a_bad_rule_exits_2_naming_the_registrys_rules_before_any_work(tmp_path, capsys):
    store = tmp_path / "runs"
    code, err = _exit(["train", "--scale-rule", "nearest", "--out", str(store), "--quiet"], capsys)
    assert code == 2
    assert "'nearest'" in err and f"valid: {', '.join(scale_rules.names())}" in err, err
    assert not store.exists() or not any(store.iterdir())  # nothing trained, nothing written


def test_the_flag_names_the_registrys_choices():
    assert tuple(CHOICES["scale_rule"]) == scale_rules.names()
    with scale_rules.RULES.added(scale_rules.ScaleRule("one_up", "every block one binade up",
                                                       bump=lambda amax, field, e0, fmt: field >= fmt.emax)):
        assert "one_up" in CHOICES["scale_rule"]  # read live: a rule registered later is a valid value at once
        assert Config(recipe="mxfp8_e4m3", scale_rule="one_up").recipe.name == "mxfp8_e4m3+one_up"


@pytest.mark.parametrize("recipe, rule", [("mxfp8_e4m3", "ceil"), ("mxfp4", "even"), ("paper_e4m3", "paper_bump"),
                                          ("mxfp4_2d", "floor")])
def test_the_flag_and_the_suffix_give_the_same_recipe(recipe, rule):
    by_flag = Config(recipe=recipe, scale_rule=rule)
    by_suffix = Config(recipe=f"{recipe}+{rule}")
    assert by_flag.recipe == by_suffix.recipe == recipes.get(f"{recipe}+{rule}")
    assert by_flag.recipe.name == f"{recipe}+{rule}" and by_flag.scale_rule == rule
    both = Config(recipe=f"{recipe}+{rule}", scale_rule=rule)  # both given, agreeing: applied once
    assert both.recipe == by_suffix.recipe and both.recipe.name == f"{recipe}+{rule}"
    assert Config.from_dict(by_flag.to_dict()) == by_flag and by_flag.replace(lr=1e-3).recipe == by_flag.recipe


def test_the_flag_and_the_suffix_agree_on_the_command_line(tmp_path, capsys):
    from mx_proxy.cli.config_options import config_from_args
    from mx_proxy.cli.main import build_parser

    parser = build_parser()
    flag = parser.parse_args(["train", "--recipe", "mxfp8_e4m3", "--scale-rule", "ceil"])
    suffix = parser.parse_args(["train", "--recipe", "mxfp8_e4m3+ceil"])
    assert config_from_args(parser, flag).recipe == config_from_args(parser, suffix).recipe


def test_a_disagreeing_suffix_and_flag_are_refused_naming_both(capsys):
    with pytest.raises(ValueError, match="scale_rule 'ceil' disagrees with recipe 'mxfp8_e4m3\\+rceil'.*'rceil'"):
        Config(recipe="mxfp8_e4m3+rceil", scale_rule="ceil")
    with pytest.raises(ValueError, match="disagrees"):  # the last rule of the name counts, as it is the one applied
        Config(recipe="mxfp8_e4m3+ceil+ln_exempt+even", scale_rule="ceil")
    code, err = _exit(["train", "--recipe", "mxfp8_e4m3+rceil", "--scale-rule", "ceil", "--store", "off"], capsys)
    assert code == 2 and "disagrees" in err and "'mxfp8_e4m3+rceil'" in err and "'ceil'" in err, err


def test_a_rule_not_defined_for_the_recipes_formats_names_the_field():
    with pytest.raises(ValueError, match="scale_rule 'paper_bump'.*fp8_e5m2"):
        Config(recipe="mxfp8_mixed", scale_rule="paper_bump")


def test_the_rule_follows_the_recipe_a_sweep_sets():
    base = Config(scale_rule="ceil")  # fp32 has no E8M0 operand: nothing to change yet
    assert base.recipe == recipes.get("fp32")
    assert [base.replace(recipe=r).recipe.name for r in ("mxfp8_e4m3", "mxfp4")] == ["mxfp8_e4m3+ceil", "mxfp4+ceil"]


def test_a_config_without_the_field_keeps_its_key():
    config = Config(recipe="mxfp8_e4m3+ceil")
    assert config.scale_rule is None and "scale_rule" not in config.to_dict()
    assert config.hash() == "fac61cfbce7ba7b2"  # its key before the field existed and specs held the rule object
    spec = config.to_dict()["recipe"]["fwd_x"]
    assert spec["scale_rule"] == "ceil" and spec["element"] == "fp8_e4m3"  # names, as the store always hashed them
    assert "scale_rule" in Config(recipe="mxfp8_e4m3", scale_rule="ceil").to_dict()


def test_an_intervention_on_a_run_with_the_field_changes_its_rule_with_the_recipe():
    import mx_proxy as mxp

    parent = mxp.train(Config(width=16, depth=1, batch=16, steps=20, diagnostics_every=10, val_every=0,
                              recipe="mxfp8_e4m3", scale_rule="ceil", checkpoint_at=(10,)), store=False,
                       progress=False)
    child = mxp.intervene(parent, 10, apply="rceil", store=False, progress=False)
    assert child.config.recipe.name == "mxfp8_e4m3+ceil+rceil" and child.config.scale_rule is None
    assert child.config.recipe.fwd_x.scale_rule is scale_rules.get("rceil")
    same = mxp.intervene(parent, 10, store=False, progress=False)  # no change: the parent's recipe, whole
    assert same.config.recipe == parent.config.recipe and same.config.scale_rule is None
