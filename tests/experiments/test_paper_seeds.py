"""The paper's setting at other seeds: its spec against the exported run it copies, and the command's checks."""

import json

import pytest

from mx_proxy.experiments import ensemble as E
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
    assert P.spec_of(1, arms=("fp32", "train_ln_bias")).recipe("train_ln_bias").train_ln_bias  # the converse arm


@pytest.mark.parametrize("args, message", [(["--members", "0"], "--members must be ≥ 1, got 0"),
                                           (["--hours", "-1"], "--hours must be > 0, got -1.0"),
                                           (["--group-size", "0"], "--group-size must be ≥ 1, got 0"),
                                           (["--arms", "fp32", "bogus"], "unknown arm"),
                                           (["--committed", "/no/such/folder"], "is not a folder"),
                                           (["--status"], "not an ensemble folder")])
def test_bad_options_exit_2_naming_the_value(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as e:
        P.main(["--out", str(tmp_path / "e"), *args])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "e").exists()


TINY = dict(width=16, steps=30, batch=32, val_every=0)


def test_a_fresh_out_starts_from_the_committed_members_with_its_config(tmp_path, capsys):
    """A fresh OUT copies the members a results folder exported (whole, same config) and trains only the
    others; members of another config are not copied, and the repository's width-512 members never match a
    test's config."""
    spec = P.spec_of(2, arms=("fp32", "mxfp8_e4m3"), **TINY)
    first = tmp_path / "first"
    assert P.run(spec, first, progress=False, log=lambda *_: None, committed=None) == 4
    committed = first / "results"
    (committed / "mxfp8_e4m3-m01" / "run.json").unlink()  # not whole: not copied, trained again
    fresh = tmp_path / "fresh"
    lines = []
    assert P.run(spec, fresh, progress=False, log=lines.append, committed=committed) == 4
    assert lines[0] == (f"[paper seeds] 3 member(s) copied from {committed}: fp32-m00, fp32-m01, mxfp8_e4m3-m00")
    for label in ("fp32-m00", "fp32-m01", "mxfp8_e4m3-m00"):
        assert (fresh / "results" / label / "metrics.parquet").read_bytes() == \
            (committed / label / "metrics.parquet").read_bytes()
    trained = [p.name for p in (fresh / "runs").iterdir() if not p.name.startswith(".")]
    assert trained == [spec.config("mxfp8_e4m3", 1).hash()]  # the one member trained here: the store holds it alone
    assert (fresh / "results" / "mxfp8_e4m3-m01" / "run.json").exists()
    other = P.spec_of(2, arms=("fp32", "mxfp8_e4m3"), **{**TINY, "width": 8})
    assert P.copy_committed(other, tmp_path / "other", committed) == []  # another config: nothing copied
    assert P.copy_committed(spec, tmp_path / "repo", P.COMMITTED) == []  # the committed width-512 members
    assert P.copy_committed(spec, first, committed) == []  # its own results folder


def test_without_arms_a_command_trains_the_saved_or_the_committed_ensembles_arms(tmp_path):
    """A fresh folder on a GPU continues the committed ensemble with every arm appended since (not the three
    defaults, which would write a spec without them over the committed one); a resume keeps its own."""
    committed, out = tmp_path / "committed", tmp_path / "out"
    assert P.default_arms(out, None) == P.ARMS
    E.write_spec(P.spec_of(1, arms=(*P.ARMS, "fp32_keep_bias"), **TINY), committed)
    assert P.default_arms(out, committed) == (*P.ARMS, "fp32_keep_bias")
    E.write_spec(P.spec_of(1, arms=("fp32", "train_ln_bias"), **TINY), out / "results")
    assert P.default_arms(out, committed) == ("fp32", "train_ln_bias")
