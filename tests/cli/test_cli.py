"""The ``mx-proxy`` command line: real runs, exit status 2 with a clear message on bad input."""

import dataclasses
import json
import subprocess
import sys

import pytest

from mx_proxy.cli.bench import BENCHMARKS
from mx_proxy.cli.main import build_parser, main
from mx_proxy.training.config import CHOICES, DYNAMIC, FIELD_DOCS, HOST, STATIC, Config, fields_of_kind


def _cli(*args, tmp_path=None):
    env_store = ["--out", str(tmp_path)] if tmp_path is not None else []
    return subprocess.run([sys.executable, "-m", "mx_proxy.cli", *args, *env_store], capture_output=True, text=True,
                          timeout=600)


def test_train_writes_the_run_and_reloads_it(tmp_path):
    args = ("train", "--width", "32", "--depth", "2", "--batch", "32", "--steps", "20", "--val-every", "10",
            "--recipe", "mxfp8_mixed", "--quiet")
    first = _cli(*args, tmp_path=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "mxfp8_mixed" in first.stdout and "20 steps" in first.stdout
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith(".")]
    config = json.loads((folder / "config.json").read_text())
    assert config["recipe"] == "mxfp8_mixed" and config["width"] == 32
    assert (folder / "metrics.parquet").exists()
    again = _cli(*args, tmp_path=tmp_path)
    assert again.returncode == 0 and again.stdout == first.stdout


@pytest.mark.parametrize("args, message", [
    (["train", "--recipe", "mxfp9"], "unknown recipe 'mxfp9'; valid: fp32, bf16"),
    (["train", "--width", "0"], "width must be a positive integer"),
    (["train", "--lr", "fast"], "invalid float value"),
    (["train", "--act", "elu"], "valid: gelu, relu"),
    (["train", "--norm", "batchnorm"], "unknown norm 'batchnorm'; valid: layernorm, none, rmsnorm"),
    (["train", "--recipe", "mxfp8_e4m3+nearest"], "(or PRESET+CHANGE, a change of mxp.MITIGATIONS, e.g. "
                                                  "mxfp8_e4m3+ceil)"),
    (["train", "--diagnostic-format", "bf16"], "valid: fp8_e4m3, fp8_e5m2, fp6_e3m2, fp6_e2m3, fp4_e2m1, int8"),
    (["train", "--val-every", "15"], "multiple of --diagnostics-every"),
    (["train", "--reference-seed", "1"], "set --paired-run true"),
    (["ensemble", "--out", "/nonexistent/ens", "--kind", "seed", "--members", "2", "--horizon", "10", "--arms",
      "fp32", "bogus"], "or FIELD=VALUE (e.g. 'adam_eps=1e-15')"),  # an arm, as written on the command line
    (["bench", "nope"], "valid: quantize"),
    (["figures", "--only", "nope"], "valid: sawtooth"),
    (["figures", "--scale", "huge"], "invalid choice"),
])
def test_bad_input_exits_2_naming_valid_choices(args, message, capsys):
    with pytest.raises(SystemExit) as exc:
        code = main(args)
        raise SystemExit(code)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def _subparsers():
    parser = build_parser()
    (action,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    return action.choices


def test_every_flag_of_every_command_has_a_one_line_description():
    for name, sub in _subparsers().items():
        for action in sub._actions:
            assert action.help and action.help.strip(), f"proxy {name} {action.option_strings or action.dest}"


def test_config_flags_say_what_they_set_what_they_accept_and_their_default():
    assert set(FIELD_DOCS) == set(Config.field_names())
    assert "Fields" in Config.__doc__ and all(f"{n}: " in Config.__doc__ for n in FIELD_DOCS)
    helps = {a.dest: a.help for a in _subparsers()["train"]._actions}
    for name in Config.field_names():
        assert "default: " in helps[name], name
    assert "true or false" in helps["paired_run"]
    assert "gnmr:threshold=3" in helps["controller"] and "none" in helps["controller"]
    assert "one of: fp32, bf16, mxfp8_e4m3" in helps["recipe"]
    sweep_helps = {a.dest: a.help for a in _subparsers()["sweep"]._actions}
    assert "sweep axis" in sweep_helps["lr"]


@pytest.mark.parametrize("argv", [["train", "--help"], ["sweep", "--help"], ["intervene", "--help"],
                                  ["figures", "--help"], ["campaign", "--help"], ["bench", "--help"],
                                  *[["bench", name, "--help"] for name in BENCHMARKS]])
def test_help_is_plain_terminal_text(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "``" not in out and ":func:" not in out and ":mod:" not in out and ":class:" not in out, out
    if argv == ["bench", "--help"]:
        for name in BENCHMARKS:  # each benchmark with its one-line description
            assert f"  {name} " in out
        assert "milliseconds per training step" in out


def test_controller_none_is_no_controller():
    assert Config(controller="none").controller is None


def test_every_command_refuses_a_bad_name_with_configs_own_message(capsys):
    """One builder for every command's Config options: the value is checked by
    Config itself, so train, sweep and intervene say the same thing."""
    from mx_proxy.cli.experiment_commands import main as experiments

    def status(command, argv):
        try:
            return command(argv)
        except SystemExit as e:
            return e.code

    said = []
    for command, argv in ((main, ["train", "--act", "elu"]), (experiments, ["sweep", "--act", "elu", "relu"])):
        assert status(command, argv) == 2
        said.append(capsys.readouterr().err.strip().splitlines()[-1].split("error: ", 1)[1])
    assert said[0] == said[1] == "unknown act 'elu'; valid: " + ", ".join(CHOICES["act"])


def test_the_knob_declarations_decide_kinds_choices_and_interventions():
    """Each field's kind, names and intervenability come from its knob() line alone."""
    from mx_proxy.runner import interventions
    from mx_proxy.training import engine

    fields = {f.name: f for f in dataclasses.fields(Config)}
    assert set(fields_of_kind(STATIC) + fields_of_kind(DYNAMIC) + fields_of_kind(HOST)) == set(fields)
    assert engine.DYNAMIC_FIELDS == fields_of_kind(DYNAMIC) and engine.HOST_FIELDS == fields_of_kind(HOST)
    assert interventions.INTERVENABLE_FIELDS == tuple(n for n, f in fields.items() if f.metadata["intervene"])
    # a static field changes the program's key, a dynamic or host one does not
    base = Config(width=32)
    for name, value in (("act", "relu"), ("lr", 1e-3), ("seed", 7), ("checkpoint_every", 10)):
        same = engine.static_key(base.replace(**{name: value})) == engine.static_key(base)
        assert same == (fields[name].metadata["kind"] != STATIC), name
    helps = {a.dest: a for a in _subparsers()["intervene"]._actions}
    assert {n for n in fields if n in helps} == set(interventions.INTERVENABLE_FIELDS)
    for name, valid in CHOICES.items():
        assert f"one of: {', '.join(valid)}" in helps.get(name, _subparsers()["train"]._option_string_actions[
            "--" + name.replace("_", "-")]).help
