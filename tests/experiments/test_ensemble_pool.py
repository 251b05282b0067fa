"""Pooling ensembles of one member config: against one ensemble holding every member, and the refusals."""

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import mx_proxy as mxp
from mx_proxy.cli import main as cli
from mx_proxy.experiments import ensemble as E
from mx_proxy.experiments import ensemble_pool, ensemble_report, ensemble_result, report
from mx_proxy.training.result import Run

BASE = mxp.Config(width=16, depth=2, steps=100, diagnostics_every=10)
ARMS = ("fp32", "paper_e4m3")
ROOT = Path(__file__).resolve().parents[2]
CPU = ("results/ensembles/w256-d4-lr0.002-cpu", "results/ensembles/w256-d4-lr0.002-cpu-s9")


def _spec(name, first_seed, members, kind="seed", arms=ARMS, **changes):
    return E.Ensemble(name, kind, BASE.replace(**changes), arms, members=members, horizon=200,
                      first_seed=first_seed, checkpoint_every=50 if first_seed % 2 else 100)


def _loss(seed: int, arm: str) -> np.ndarray:
    """Flat, blowing up at step 20 × seed where the seed is odd and the arm is paper_e4m3."""
    loss = np.full(200, 1.0 + 0.01 * seed)
    if seed % 2 and arm == "paper_e4m3":
        loss[20 * seed:] = 50.0
    return loss


def _result(spec, missing=()):
    runs = {arm: [None if (arm, s) in missing else
                  Run(spec.config(arm, i), pd.DataFrame({"step": np.arange(200), "loss": _loss(s, arm)}), None,
                      info={"ensemble": {"arm": arm, "member": i}})
                  for i, s in enumerate(spec.seeds())] for arm in spec.arms}
    return ensemble_result.EnsembleResult(spec, runs)


def test_pooled_ensembles_are_one_ensemble_of_every_member_in_seed_order():
    a, b, c = _spec("a", 1, 2), _spec("b", 3, 3), _spec("c", 6, 1)
    whole = _result(_spec("whole", 1, 6))
    for parts in ([a, b, c], [c, a, b]):
        pooled = ensemble_pool.pool([_result(s) for s in parts])
        assert pooled.spec.name == "a+b+c" and pooled.spec.first_seed == 1 and pooled.spec.members == 6
        pd.testing.assert_frame_equal(pooled.table, whole.table)
        pd.testing.assert_frame_equal(pooled.rates(), whole.rates())
        pd.testing.assert_frame_equal(pooled.paired_tests(), whole.paired_tests())
    assert list(whole.table.query("event").seed) == [1, 3, 5]  # the made blow-ups, so the tables above are not empty


def test_pooling_keeps_members_not_exported_yet_and_the_first_ensembles_arm_order_and_control():
    first = _result(_spec("a", 1, 2, arms=("paper_e4m3", "fp32"))).against("fp32")
    pooled = ensemble_pool.pool([first, _result(_spec("b", 3, 2), missing={("fp32", 4)})])
    assert pooled.spec.arms == ("paper_e4m3", "fp32") and pooled.control == "fp32"
    assert [r is None for r in pooled.runs["fp32"]] == [False, False, False, True]
    assert pooled.table.groupby("arm").size().to_dict() == {"fp32": 3, "paper_e4m3": 4}
    only = _result(_spec("a", 1, 2))
    assert ensemble_pool.pool([only]) is only and mxp.pool_ensembles is ensemble_pool.pool


@pytest.mark.parametrize("second,match", [
    (lambda: _spec("b", 4, 2), r"follow on.*'a' has s_i = 1…2, 'b' s_i = 4…5"),  # a gap
    (lambda: _spec("b", 2, 2), r"follow on.*'a' has s_i = 1…2, 'b' s_i = 2…3"),  # an overlap
    (lambda: _spec("b", 3, 2, lr=1e-3), r"train different 'fp32' members: they differ in lr"),
    (lambda: _spec("b", 3, 2, arms=("fp32",)), r"different arms: 'fp32', 'paper_e4m3' and 'fp32'"),
    (lambda: _spec("b", 3, 2, kind="data"), r"vary different things: seed and data"),
    (lambda: _spec("a", 3, 2), r"an ensemble given twice"),
])
def test_ensembles_that_do_not_pool_are_refused_naming_why(second, match):
    with pytest.raises(ValueError, match=match):
        ensemble_pool.pool([_result(_spec("a", 1, 2)), _result(second())])


def test_branch_ensembles_and_empty_or_foreign_inputs_are_refused():
    branch = E.Ensemble("br", "branch", BASE.replace(steps=100), ("fp32",), members=2, horizon=100, branch_at=100)
    made = ensemble_result.EnsembleResult(branch, {"fp32": [None, None]})
    with pytest.raises(ValueError, match="'br' is a branch ensemble; only seed and data ensembles pool"):
        ensemble_pool.pool([_result(_spec("a", 1, 2)), made])
    with pytest.raises(ValueError, match="no ensembles to pool"):
        ensemble_pool.pool([])
    with pytest.raises(TypeError, match="EnsembleResults"):
        ensemble_pool.pool([_result(_spec("a", 1, 2)), "results/x"])


def test_a_data_ensembles_member_config_keeps_its_init_seed():
    spec = _spec("d", 1, 2, kind="data", seed=7)
    assert ensemble_pool.member_config(spec, "fp32").seed == 7
    assert ensemble_pool.member_config(spec, "fp32").data_seed == 0
    assert dataclasses.replace(spec, first_seed=3) != spec  # the seeds differ, the member configs do not
    assert ensemble_pool.member_config(dataclasses.replace(spec, first_seed=3), "fp32") == \
        ensemble_pool.member_config(spec, "fp32")


def test_report_of_several_folders_is_their_pooled_report_in_cli_block_and_update(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    pooled = ensemble_pool.pool([ensemble_result.load(f) for f in CPU])
    printed = report.for_folder(list(CPU), parts=["rates", "paired"])
    assert printed == ensemble_report.markdown(pooled, source=" + ".join(CPU), parts=["rates", "paired"])
    assert f"s_i = 1…{pooled.spec.members}" in printed and f"({' + '.join(CPU)})" in printed
    assert cli.main(["report", *CPU, "--only", "rates", "paired"]) == 0
    assert capsys.readouterr().out == printed
    arguments = f"{' '.join(CPU)} --only rates paired"
    assert report.for_block(arguments) == printed
    doc = tmp_path / "doc.md"
    doc.write_text(f"{report.BEGIN.format(arguments)}\nold\n{report.END}\n")
    assert report.update(doc) and report.blocks(doc.read_text()) == [(arguments, printed)]
    with pytest.raises(ValueError, match="not an ensemble's results folder.*'results/medium'"):
        report.for_folder([CPU[0], "results/medium"])
    with pytest.raises(SystemExit) as err:
        cli.main(["report", CPU[0], "results/ensembles/fig7-6000"])  # a branch ensemble does not pool
    assert err.value.code == 2
