"""Paths resolved once, for a command and its ``--status`` alike, and every check before any training (issue 63):
``ensemble --out`` through a symbolic-link loop or ``~nosuchuser``, ``--status`` of such a folder, ``campaign --out
'~/x'`` with its ``--status``; ``--figures`` naming a file, a refused ``--epsilon``, ``--reference`` naming a file,
``intervene`` on an exported result; ``figures --quiet``. Each refusal is one line, exit status 2, nothing trained
and nothing written."""

import shutil
from pathlib import Path

import pytest

import mx_proxy as mxp
from mx_proxy.cli import main as cli
from mx_proxy.experiments import paper
from mx_proxy.viz import figures, plots

ROOT = Path(__file__).resolve().parents[2]
SEED = ["--kind", "seed", "--arms", "fp32", "--members", "1", "--horizon", "5", "--width", "8", "--depth", "1",
        "--batch", "16", "--quiet"]


def status(argv) -> int:
    try:
        return cli.main(argv)
    except SystemExit as e:
        return e.code


def last_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and not any("Traceback" in line for line in err), err
    return err[-1]


def _bad_paths(tmp_path):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "file").write_text("")
    return {"loop": (str(tmp_path / "loop" / "x"), "a symbolic-link loop"),
            "user": ("~no_such_user_proxy/x", "no such user 'no_such_user_proxy'"),
            "file": (str(tmp_path / "file" / "x"), "is a file, not a folder")}


@pytest.mark.parametrize("argv", [["ensemble", "--out", "{}", *SEED], ["ensemble", "--out", "{}", "--status"],
                                  ["campaign", "--scale", "smoke", "--out", "{}", "--status"],
                                  ["report", "--figures", "{}", str(ROOT / "results/ensembles/seeds-w512")]],
                         ids=["ensemble", "ensemble-status", "campaign-status", "report-figures"])
def test_a_bad_path_is_one_line_naming_it_for_a_command_and_its_status(argv, tmp_path, capsys, trained):
    for kind, (path, why) in _bad_paths(tmp_path).items():
        assert status([a.format(path) for a in argv]) == 2, kind
        line = last_error(capsys)
        assert repr(path) in line and why in line, (kind, line)  # was: a raw traceback, or "damaged" Slurm record
    assert trained == []


def test_a_campaign_folder_under_the_home_folder_is_the_same_for_its_status(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))
    shutil.copytree(ROOT / "results" / "medium", tmp_path / "x" / "results")
    assert cli.main(["campaign", "--scale", "medium", "--out", "~/x", "--status"]) == 0
    home = capsys.readouterr().out
    assert cli.main(["campaign", "--scale", "medium", "--out", str(tmp_path / "x"), "--status"]) == 0
    assert capsys.readouterr().out == home
    done = [line.split()[0] for line in home.splitlines() if " done " in line]
    assert sorted(done) == sorted(p.name for p in (ROOT / "results" / "medium").iterdir() if p.is_dir())


def test_figures_naming_a_file_is_refused_before_any_training(tmp_path, capsys, trained):
    (tmp_path / "file").write_text("")
    for argv in (["ensemble", "--out", str(tmp_path / "e"), *SEED, "--figures", str(tmp_path / "file")],
                 ["campaign", "--scale", "smoke", "--out", str(tmp_path / "c"), "--only", "control", "--quiet",
                  "--figures", str(tmp_path / "file")]):
        assert status(argv) == 2
        line = last_error(capsys)
        assert f"--figures '{tmp_path / 'file'}' is a file, not a folder" in line, line
    assert trained == [] and sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing written


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A stored run with a checkpoint at step 10: a branch source."""
    store = tmp_path_factory.mktemp("store")
    run = mxp.train(mxp.Config(width=8, depth=1, batch=16, steps=20, diagnostics_every=5, checkpoint_at=(10,)),
                    store=store, progress=False)
    return run.path


@pytest.mark.parametrize("extra, said", [
    (["--epsilon", "-1"], "epsilon must be a finite number >= 0, got -1.0"),
    (["--arms", "twin"], "the 'twin' arm is the paired FP32 run"),
    (["--reference", "{file}"], "--reference '{file}' is a file, not a folder"),
    (["--reference", "{folder}"], "--reference '{folder}' is not an exported run's folder"),
], ids=["epsilon", "arms", "reference-file", "reference-folder"])
def test_a_refused_branch_ensemble_writes_no_branch_state(stored, tmp_path, capsys, extra, said, trained):
    (tmp_path / "file").write_text("")
    (tmp_path / "folder").mkdir()
    names = {"file": tmp_path / "file", "folder": tmp_path / "folder"}
    argv = ["ensemble", "--out", str(tmp_path / "e"), "--kind", "branch", "--branch-from", stored, "--branch-at", "10",
            "--arms", "unchanged", "--members", "1", "--horizon", "5", "--quiet"]
    argv = argv[:argv.index("--arms")] + argv[argv.index("--members"):] if "--arms" in extra else argv
    assert status(argv + [a.format(**names) for a in extra]) == 2
    line = last_error(capsys)
    assert said.format(**names) in line, line
    assert not (tmp_path / "e").exists() and trained == []  # was: the branch state written, then refused


def test_a_refused_branch_ensemble_in_python_writes_nothing(stored, tmp_path, trained):
    with pytest.raises(ValueError, match="epsilon must be a finite number >= 0"):
        mxp.ensemble(stored, branch_at=10, arms=["unchanged"], members=1, horizon=5, epsilon=-1.0,
                     out=tmp_path / "e", progress=False)
    assert not (tmp_path / "e").exists() and trained == []


def test_intervene_on_an_exported_result_says_what_it_is(capsys):
    folder = ROOT / "results" / "medium" / "paired-w128-paper_e4m3-lr6e-4-s0"
    assert status(["intervene", str(folder), "--at-step", "100", "--recipe", "fp32", "--quiet"]) == 2
    line = last_error(capsys)
    assert "is an exported result (paired run 'paired-w128-paper_e4m3-lr6e-4-s0'" in line, line
    assert "not a stored run" in line and "damaged" not in line


class _Stop(Exception):
    pass


def test_figures_quiet_reaches_every_training_figure(monkeypatch, tmp_path):
    """Was: ``figures --quiet`` still drew a training progress bar (the figure functions trained with bars)."""
    seen = []

    def sweep(config, *, progress=True, **_):
        seen.append(progress)
        raise _Stop

    monkeypatch.setattr(paper.runner, "sweep", sweep)
    trainers = [n for n in figures.FIGURES if n in figures.TRAINED or n in ("interventions", "systems")]
    for name in trainers:
        with pytest.raises(_Stop):
            figures.FIGURES[name]("smoke", store=None, progress=False)
    assert seen == [False] * len(trainers)
    drawn = []
    monkeypatch.setitem(figures.FIGURES, "sawtooth", lambda scale, **kw: drawn.append(kw) or plots.plt.figure())
    figures.generate(["sawtooth"], scale="smoke", out=tmp_path, progress=False, log=lambda *_: None)
    assert drawn[0]["progress"] is False  # generate hands its progress to the figure
