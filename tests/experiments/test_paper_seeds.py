"""The paper's setting at other seeds: its spec against the exported run it copies, and the command's checks."""

import json

import pytest

from mx_proxy.experiments import paper_seeds as P
from mx_proxy.numerics.recipe import PRESETS
from mx_proxy.training.config import Config


def test_members_are_the_exported_runs_config_at_other_seeds_paired_by_seed():
    parent = Config.from_dict(json.loads((P.PARENT / "config.json").read_text()))
    spec = P.spec_of()
    assert spec.kind == "seed" and spec.members == 4 and spec.horizon == parent.steps == 9000
    for arm in P.ARMS:
        assert spec.recipe(arm) == PRESETS[arm]
        for i in range(spec.members):
            c = spec.config(arm, i)
            assert (c.seed, c.data_seed, c.teacher_seed) == (i + 1, i + 1, parent.teacher_seed)
            assert not c.paired_run and c.checkpoint_at == ()
            same = {k: v for k, v in c.to_dict().items() if k not in
                    ("recipe", "seed", "data_seed", "paired_run", "checkpoint_at", "checkpoint_every")}
            assert same == {k: parent.to_dict()[k] for k in same}, arm
    assert spec.recipe("fp32_keep_bias").train_ln_bias == PRESETS["paper_e4m3"].train_ln_bias is False


@pytest.mark.parametrize("args, message", [(["--members", "0"], "--members must be ≥ 1, got 0"),
                                           (["--hours", "-1"], "--hours must be > 0, got -1.0"),
                                           (["--group-size", "0"], "--group-size must be ≥ 1, got 0"),
                                           (["--arms", "fp32", "bogus"], "unknown arm")])
def test_bad_options_exit_2_naming_the_value(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as e:
        P.main(["--out", str(tmp_path / "e"), *args])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "e").exists()
