"""A committed branch ensemble continued on a fresh machine (width 16): its state replayed without the twin,
checked against the recorded history, only the missing members trained, each exported into the committed folder."""

import dataclasses
import shutil

import numpy as np
import pandas as pd
import pytest

import mx_proxy as mxp
from mx_proxy.experiments import branch_replay as B
from mx_proxy.experiments import ensemble as E

PARENT = mxp.Config(width=16, depth=2, batch=32, steps=30, lr=3e-3, recipe="paper_e4m3", paired_run=True,
                    diagnostics_every=5, checkpoint_at=(20,))


@pytest.fixture(scope="module")
def committed(tmp_path_factory):
    """A finished branch ensemble's results, as committed (the store and state left behind), and its runs."""
    root = tmp_path_factory.mktemp("ens")
    parent = mxp.train(PARENT, store=root / "parent", progress=False)
    spec = E.Ensemble("t", "branch", parent.config, ("unchanged", "twin", "fp32"), 2, 10, branch_at=20,
                      checkpoint_every=10)
    runs = E.run(spec, root / "old", source=parent, progress=False, log=lambda *_: None)
    return root / "old" / "results", runs


def test_only_the_missing_members_train_from_the_replayed_state_into_the_committed_folder(committed, tmp_path,
                                                                                             trained):
    results, runs = committed
    mine = tmp_path / "committed"
    shutil.copytree(results, mine)
    shutil.rmtree(mine / E.member_label("fp32", 1))
    trained.clear()
    got = B.continue_ensemble(mine, tmp_path / "work", arms=["rceil"], progress=False, log=lambda *_: None)
    # the replay (paper_e4m3 alone, to the base's 30 steps), then fp32 m1 and the appended arm's two members
    assert [(c.recipe.name, c.paired_run, c.data_seed, c.steps) for c in trained] == [
        ("paper_e4m3", False, PARENT.data_seed, 30), ("fp32", False, 2, 30), ("paper_e4m3+rceil", False, 1, 30),
        ("paper_e4m3+rceil", False, 2, 30)]
    assert (tmp_path / "work" / "results").resolve() == mine.resolve()
    assert {p.name for p in mine.glob("rceil-m*")} == {"rceil-m00", "rceil-m01"} and (mine / "fp32-m01").is_dir()
    assert E.read_spec(mine).arms == ("unchanged", "twin", "fp32", "rceil")
    a = got["fp32"][1].metrics
    b = runs["fp32"][1].metrics
    after = (a["step"] >= 20).to_numpy()
    cols = ["step", "loss", "grad_norm"]
    pd.testing.assert_frame_equal(a.loc[after, cols].reset_index(drop=True),
                                  b[b["step"] >= 20][cols].reset_index(drop=True))
    np.testing.assert_array_equal(a["loss"], b["loss"])  # the replayed history too, bit for bit


def test_a_working_folder_with_other_results_and_a_seed_ensemble_are_refused(committed, tmp_path):
    results, _ = committed
    (tmp_path / "w" / "results").mkdir(parents=True)
    with pytest.raises(ValueError, match="exists and is not a link to"):
        B.continue_ensemble(results, tmp_path / "w", progress=False, log=lambda *_: None)
    seed = E.Ensemble("s", "seed", PARENT.replace(paired_run=False), ("fp32",), 1, 10)
    E.prepare(seed, tmp_path / "s")
    with pytest.raises(SystemExit) as e:
        B.main(["--results", str(tmp_path / "s" / "results"), "--out", str(tmp_path / "w2")])
    assert e.value.code == 2 and not (tmp_path / "w2").exists()


def test_a_replay_that_drifted_is_refused_and_new_starts_a_replica_from_it(committed, tmp_path, trained):
    """Another machine's replay differs from the recorded history (played here by altering the history): continuing
    the committed ensemble is refused; ``new`` trains the same spec from the replayed state (with its twin, for the
    control) into a new folder, which records its own history, and leaves the committed folder as it was."""
    results, _ = committed
    mine = tmp_path / "committed"
    shutil.copytree(results, mine)
    hist = pd.read_parquet(mine / E.HISTORY_FILE)
    hist.loc[hist["step"] == 5, "loss"] *= np.float32(1.0001)
    hist.to_parquet(mine / E.HISTORY_FILE, index=False)
    before = sorted(p.relative_to(mine) for p in mine.rglob("*"))
    with pytest.raises(ValueError, match="loss differs from branch_history.parquet's at step 5"):
        B.continue_ensemble(mine, tmp_path / "w1", progress=False, log=lambda *_: None)
    with pytest.raises(ValueError, match="is the committed ensemble's own folder"):
        B.continue_ensemble(mine, tmp_path / "w2", new=mine, progress=False, log=lambda *_: None)
    other = dataclasses.replace(E.read_spec(mine), name="elsewhere", horizon=5)
    E.write_spec(other, tmp_path / "elsewhere")
    trained.clear()
    with pytest.raises(ValueError, match="holds another ensemble"):  # before any replay step
        B.continue_ensemble(mine, tmp_path / "w3", new=tmp_path / "elsewhere", progress=False, log=lambda *_: None)
    assert trained == []
    got = B.continue_ensemble(mine, tmp_path / "w2", new=tmp_path / "t-here", progress=False, log=lambda *_: None)
    assert [(c.recipe.name, c.paired_run) for c in trained][0] == ("paper_e4m3", True)  # the replay, with its twin
    new = mxp.load_ensemble(tmp_path / "t-here")
    assert new.spec == dataclasses.replace(E.read_spec(mine), name="t-here")
    assert sorted(p.relative_to(mine) for p in mine.rglob("*")) == before  # nothing written into the committed one
    replayed = pd.read_parquet(tmp_path / "t-here" / E.HISTORY_FILE)
    pd.testing.assert_frame_equal(replayed, pd.read_parquet(results / E.HISTORY_FILE))  # this machine's, unaltered
    old = mxp.load_ensemble(results)
    assert set(new.runs) == set(old.runs) == {"unchanged", "twin", "fp32"} and set(got) == {"unchanged", "fp32"}
    for arm in old.runs:  # here the replay is the run: every member as the committed one's
        for a, b in zip(new.runs[arm], old.runs[arm], strict=True):
            np.testing.assert_array_equal(a.metrics["loss"], b.metrics["loss"])
