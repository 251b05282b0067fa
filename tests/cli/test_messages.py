"""Error messages in the command line's words, quoting paths and values verbatim (issue 63: the message filter turned
any substring equal to a config field's name into a flag, inside paths, lists of valid choices and arm names)."""

import pytest

from mx_proxy.cli import main as cli
from mx_proxy.cli.help import cli_message
from mx_proxy.experiments import ensemble_pool
from mx_proxy.training.config import Config


@pytest.mark.parametrize("message, shown", [
    # what it translates: an API field, alone or with its value
    ("val_every (15) must be a multiple of diagnostics_every (10)",
     "--val-every (15) must be a multiple of --diagnostics-every (10)"),
    ("checkpoint_at=(1500, 3000) past the end", "--checkpoint-at 1500 3000 past the end"),
    ("set paired_run=True (or gradient_reference='paired_run')",
     "set --paired-run true (or --gradient-reference paired_run)"),
    ("quant_stats records at diagnostics steps", "--quant-stats records at diagnostics steps"),
    # what it quotes as it is
    ("no campaign results in '/tmp/x/quant_stats' (no <label>/run.json)",
     "no campaign results in '/tmp/x/quant_stats' (no <label>/run.json)"),
    ("run store /tmp/quant_stats/diagnostics_every: a file", "run store /tmp/quant_stats/diagnostics_every: a file"),
    ("folder ~/paired_run/x is gone", "folder ~/paired_run/x is gone"),
    ("unknown figure(s) ['x']; valid: sawtooth, quant_stats, systems",
     "unknown figure(s) ['x']; valid: sawtooth, quant_stats, systems"),
    ("arms 'unchanged', 'adam_eps=1e-15' and 'unchanged'", "arms 'unchanged', 'adam_eps=1e-15' and 'unchanged'"),
    ("the block of `results/spike_factor --only rates`", "the block of `results/spike_factor --only rates`"),
    # both in one message
    ("'lr_min' in '/a/lr_min': lr_min must not exceed lr", "'lr_min' in '/a/lr_min': --lr-min must not exceed lr"),
])
def test_the_filter_translates_field_names_and_quotes_paths_choices_and_arms_verbatim(message, shown):
    assert cli_message(message) == shown


def test_every_field_name_inside_a_path_survives(tmp_path):
    for name in Config.field_names():
        path = f"{tmp_path}/{name}/x_{name}"
        assert cli_message(f"no results in {path!r}") == f"no results in {path!r}"
        assert cli_message(f"store {path}: gone") == f"store {path}: gone"


def test_a_path_named_for_a_field_is_printed_as_given(tmp_path, capsys):
    folder = tmp_path / "quant_stats"
    folder.mkdir()
    with pytest.raises(SystemExit) as err:
        cli.main(["report", str(folder)])
    assert err.value.code == 2 and f"'{folder}'" in capsys.readouterr().err


def test_a_valid_choice_named_for_a_field_is_listed_as_it_is_typed(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["figures", "--only", "nope", "--store", "off", "--quiet"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert "quant_stats" in err and "--quant-stats" not in err, err


def test_arm_names_stay_whole_in_a_pooling_error():
    from mx_proxy.experiments.ensemble_result import EnsembleResult
    from mx_proxy.experiments.ensemble_spec import Ensemble

    base = Config(width=16, depth=2, batch=32)
    a = EnsembleResult(Ensemble("a", "seed", base, ("fp32", "adam_eps=1e-15"), 2, 10), {})
    b = EnsembleResult(Ensemble("b", "seed", base, ("fp32",), 2, 10, first_seed=3), {})
    with pytest.raises(ValueError) as err:
        ensemble_pool.pool([a, b])
    assert cli_message(str(err.value)).endswith("different arms: 'fp32', 'adam_eps=1e-15' and 'fp32'")
