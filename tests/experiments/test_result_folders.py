"""No result lost or miscounted, round 3 (issue 63): what a results folder is read as, and what its report says.

Families: results folders trusted by glob (a member replaced by another config's run, backup copies, foreign and
damaged folders), reports that omit or mislabel (arms with no member exported, NaN losses, numbers that do not
exist), ``report --update`` on a document (line endings, markers that do not parse). The committed results
(``results/ensembles/seeds-w512``, ``results/medium``) are copied into tmp_path and damaged there; what must
train (a resume) is a width-16 ensemble of 20 steps."""

import json
import math
import shutil
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import mx_proxy as mxp
from mx_proxy.cli import main as cli
from mx_proxy.experiments import (
    analysis,
    campaign,
    ensemble_report,
    ensemble_result,
    ensemble_status,
    report,
    result_folders,
)
from mx_proxy.experiments import ensemble as E
from mx_proxy.training.config import Config
from mx_proxy.training.result import Run

ROOT = Path(__file__).resolve().parents[2]
SEEDS = ROOT / "results" / "ensembles" / "seeds-w512"  # a seed ensemble, 1-2 members of 5 arms exported
MEDIUM = ROOT / "results" / "medium"  # a campaign's results: two paired runs and a control


@pytest.fixture
def seeds(tmp_path):
    shutil.copytree(SEEDS, tmp_path / "seeds")
    return tmp_path / "seeds"


@pytest.fixture
def medium(tmp_path):
    shutil.copytree(MEDIUM, tmp_path / "medium")
    return tmp_path / "medium"


def _ignored(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, result_folders.ResultsWarning)]


def _load(folder):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = ensemble_result.load(folder)
    return result, _ignored(caught)


# --------------------------------------------------------------------------- results folders trusted by glob


def _another_lr(folder: Path) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(cfg, lr=3e-3)))


@pytest.mark.parametrize("replace, differs", [
    (lambda r: shutil.copytree(r / "fp32-m01", r / "fp32-m00", dirs_exist_ok=True), "seed 2 (the spec's: 1)"),
    (lambda r: shutil.copytree(r / "paper_e4m3-m00", r / "fp32-m00", dirs_exist_ok=True), "recipe"),
    (lambda r: _another_lr(r / "fp32-m00"), "lr 0.003 (the spec's: 0.0006)"),
], ids=["another-seed", "another-arm", "another-lr"])
def test_a_member_replaced_by_another_configs_run_is_not_counted(seeds, replace, differs):
    before, said = _load(seeds)
    assert said == [] and before.runs["fp32"][0] is not None
    replace(seeds)
    after, said = _load(seeds)
    assert after.runs["fp32"][0] is None and after.runs["fp32"][1] is not None  # set aside, the rest kept
    (line,) = said
    assert "'fp32-m00': not this member's run" in line and differs in line, line
    rates = after.rates().set_index("arm")
    assert rates.loc["fp32", "members"] == 1 and rates.loc["paper_e4m3", "members"] == 2
    assert after.table.equals(before.table.iloc[1:].reset_index(drop=True))  # fp32 member 0 is row 0


def test_copies_foreign_and_damaged_folders_are_ignored_with_one_warning_naming_each(seeds):
    shutil.copytree(seeds / "fp32-m00", seeds / "fp32-m00.bak")
    shutil.copytree(seeds / "paper_e4m3-m01", seeds / "paper_e4m3-m01 (copy)")
    (seeds / "stray").mkdir()
    (seeds / "stray" / "run.json").write_text("")
    (seeds / "notes").mkdir()  # no run.json: not pretending to be a run, not named
    before = ensemble_result.load(SEEDS)
    after, said = _load(seeds)
    assert after.table.equals(before.table)
    (line,) = said
    for name in ("fp32-m00.bak", "paper_e4m3-m01 (copy)", "stray"):
        assert f"'{name}': not a label of the spec" in line, line
    assert "3 folder(s) ignored" in line and "notes" not in line
    assert ensemble_report.markdown(after) == ensemble_report.markdown(before)


def test_a_damaged_member_is_named_and_the_others_are_read(seeds):
    (seeds / "mxfp8_e4m3-m01" / "metrics.parquet").write_bytes(b"truncated")
    (seeds / "paper_e4m3-m00" / "run.json").write_text("{")
    result, said = _load(seeds)
    (line,) = said
    assert "mxfp8_e4m3-m01/metrics.parquet is damaged" in line and "paper_e4m3-m00/run.json is damaged" in line
    assert result.runs["mxfp8_e4m3"][1] is None and result.runs["paper_e4m3"][0] is None
    assert result.rates().set_index("arm")["members"].to_dict() == {
        "fp32": 2, "paper_e4m3": 1, "mxfp8_e4m3": 1, "fp32_keep_bias": 1, "train_ln_bias": 1}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A seed ensemble at width 16, 2 arms × 2 members × 20 steps, trained once."""
    out = tmp_path_factory.mktemp("tiny")
    spec = E.Ensemble("tiny", "seed", mxp.Config(width=16, depth=2, batch=32, diagnostics_every=10), ("fp32", "bf16"),
                      2, 20, checkpoint_every=10)
    E.run(spec, out, progress=False, log=lambda *_: None)
    return spec, out


def test_a_resume_sets_aside_a_foreign_member_retrains_it_and_indexes_each_label_once(tiny, tmp_path, trained):
    spec, out = tiny
    e = tmp_path / "e"
    shutil.copytree(out, e)
    res = e / "results"
    shutil.rmtree(e / "runs")  # a fresh machine: the exports are all there is
    shutil.copytree(res / "fp32-m00", res / "fp32-m00.bak")  # a backup copy
    shutil.rmtree(res / "fp32-m01")
    shutil.copytree(res / "fp32-m00", res / "fp32-m01")  # member 0's run under member 1's label
    shutil.rmtree(res / "bf16-m01")  # still to train
    (res / "stray").mkdir()
    (res / "stray" / "run.json").write_text("")  # an empty run.json: aborted the resume with a bare JSON error
    with pytest.warns(result_folders.ResultsWarning) as caught:
        runs = E.run(spec, e, progress=False, log=lambda *_: None)
    said = " | ".join(str(w.message) for w in caught)
    assert "/fp32-m01': not this member's run" in said and "set aside as 'fp32-m01.aside-0'" in said
    assert "seed 1 (the spec's: 2)" in said
    assert "'stray'" in said and "'fp32-m00.bak'" in said
    assert [c.seed for c in trained] == [2, 2]  # fp32-m01 and bf16-m01 trained again, nothing else
    assert all(r.config == spec.config(a, i) for a in spec.arms for i, r in enumerate(runs[a]))
    index = pd.read_csv(res / "index.csv")
    assert sorted(index["label"]) == ["bf16-m00", "bf16-m01", "fp32-m00", "fp32-m01"]  # each once
    assert (res / "fp32-m01.aside-0" / "run.json").exists() and (res / "fp32-m00.bak").exists()  # nothing deleted
    original = mxp.load_ensemble(out)
    again, _ = _load(e)
    for arm in spec.arms:  # bit for bit the members the first run trained
        for a, b in zip(original.runs[arm], again.runs[arm]):
            np.testing.assert_array_equal(a.metrics["loss"].to_numpy(), b.metrics["loss"].to_numpy())
    assert E.exported(spec, "fp32", 1, res) is not None


def test_ensemble_status_counts_only_verified_members(tiny, tmp_path):
    spec, out = tiny
    shutil.copytree(out, tmp_path / "e")
    res = tmp_path / "e" / "results"
    shutil.rmtree(res / "bf16-m00")
    shutil.copytree(res / "bf16-m01", res / "bf16-m00")  # another member's run under its label
    table = ensemble_status.status(tmp_path / "e").set_index("arm")
    assert table.loc["bf16", "done"] == 1 and table.loc["fp32", "done"] == 2


def test_a_campaigns_copies_and_strays_are_ignored_once_and_its_runs_reported_once(medium, capsys):
    label = "paired-w128-paper_e4m3-lr6e-4-s0"
    shutil.copytree(medium / label, medium / f"{label} (copy)")
    shutil.copytree(medium / label, medium / f"{label}.bak")
    (medium / "stray").mkdir()
    (medium / "stray" / "run.json").write_text("")
    printed = report.for_folder(MEDIUM)
    with pytest.warns(result_folders.ResultsWarning) as caught:
        assert cli.main(["report", str(medium)]) == 0
    (line,) = _ignored(caught)
    assert f"'{label} (copy)': its run.json is the export of '{label}' (a copy)" in line
    assert f"'{label}.bak'" in line and "'stray'" in line and "is damaged" in line
    assert capsys.readouterr().out == printed.replace(str(MEDIUM), str(medium))
    index = campaign.results_index(medium)  # the same warning: said once per process
    assert index["label"].is_unique and len(index) == 3 and len(campaign.load_results(medium)) == 3


# --------------------------------------------------------------------------- reports that omit or mislabel


def test_every_arm_of_the_spec_is_listed_with_0_exported_where_none_is(seeds):
    shutil.rmtree(seeds / "train_ln_bias-m00")
    result, _ = _load(seeds)
    assert "train_ln_bias" not in set(result.rates()["arm"])  # the API's table: arms with a member exported
    text = ensemble_report.markdown(result)
    lines = text.splitlines()
    assert "4 members per arm (0 exported so far in the least advanced arm)" in text
    assert "| `train_ln_bias` | 0 exported | – | – | – |" in lines  # the rates table
    assert "| `train_ln_bias` | 0 exported | – | – | – | – | – |" in lines  # the rule's table
    assert "Not tested against `fp32` yet (no member exported in both): `train_ln_bias`." in text
    full, _ = _load(SEEDS)
    assert "(1 exported so far in the least advanced arm)" in ensemble_report.markdown(full)


def _nan_at(folder: Path, step: int) -> None:
    p = folder / "metrics.parquet"
    m = pd.read_parquet(p)
    m.loc[m["step"] == step, "loss"] = np.float32("nan")
    m.to_parquet(p, index=False)


@pytest.mark.parametrize("step", [50, 4000, 8990], ids=["in-the-first-window", "mid-run", "in-the-tail"])
def test_a_nan_loss_the_engine_did_not_stop_at_is_a_blow_up_there(seeds, step):
    """The rule: a non-finite loss is a divergence, wherever the metrics hold one (fp32-m00 is stable)."""
    _nan_at(seeds / "fp32-m00", step)
    result, said = _load(seeds)
    assert said == []
    row = result.table.set_index(["arm", "member"]).loc[("fp32", 0)]
    assert row["event"] and row["blowup_at"] == step and row["time"] == step
    assert (row["tail_loss"] == math.inf) == (step >= 9000 - ensemble_result.TAIL)
    run = result.runs["fp32"][0]
    assert analysis.unstable_after(run, 0) == step
    text = ensemble_report.markdown(result)  # was: a statistics error naming no member
    assert "| `fp32` | 2 / 2 |" in text
    assert "nan" not in text.lower()


def _paired(steps: int) -> Run:
    """A paired run of ``steps`` steps whose loss sits at 0.1, its FP32 run's at 0.1, diagnostics every 20."""
    s = np.arange(steps)
    diag = s % 20 == 0
    m = pd.DataFrame({"step": s, "loss": np.full(steps, 0.1), "ref_loss": np.full(steps, 0.1),
                      "zeta_bound": np.where(diag, 0.5, np.nan), "zeta_paper": np.where(diag, 1.0, np.nan)})
    return Run(Config(steps=steps, depth=2, recipe="paper_e4m3", paired_run=True), m, None,
               info={"kind": "paired", "label": "paired-paper_e4m3"})


def test_a_campaign_run_shorter_than_the_window_prints_only_numbers_that_exist():
    short, long = _paired(600), _paired(2000)
    text = report.markdown([short])
    assert "nan" not in text and "None" not in text and "from step 1000 on" not in text
    assert "from step 1000 on, at most" in report.markdown([long])


# --------------------------------------------------------------------------- report --update on a document


def _doc(tmp_path, text: str, newline: str) -> Path:
    doc = tmp_path / "doc.md"
    doc.write_bytes(text.replace("\n", newline).encode())
    return doc


@pytest.mark.parametrize("newline", ["\r\n", "\n"], ids=["windows", "unix"])
def test_update_keeps_line_endings_and_every_byte_outside_the_blocks(tmp_path, newline, monkeypatch):
    monkeypatch.chdir(ROOT)
    before = "# Title  \n\ttabbed, trailing spaces   \nnon-ASCII: ζ ≈ 2 …\n"
    after = "\nbetween  \n"
    begin = report.BEGIN.format("results/medium")
    doc = _doc(tmp_path, f"{before}{begin}\nold\n{report.END}{after}{begin}\n{report.END}\nno final newline", newline)
    assert report.update(doc)
    raw = doc.read_bytes()
    body = report.for_folder("results/medium").replace("\n", newline)
    want = (f"{before}{begin}\n".replace("\n", newline) + body + f"{report.END}{after}{begin}\n".replace("\n", newline)
            + body + f"{report.END}\nno final newline".replace("\n", newline))
    assert raw == want.encode()
    assert not report.update(doc) and doc.read_bytes() == raw  # up to date: untouched
    assert report.blocks(raw.decode())[0] == ("results/medium", report.for_folder("results/medium"))


@pytest.mark.parametrize("text, line, says", [
    ("intro\n{begin}\nold\n", 2, "a begin marker without an end marker"),
    ("{begin}\nold\n{begin}\nold\n{end}\n", 1, "a begin marker without an end marker before line 3"),
    ("intro\n{end}\n", 2, "an end marker without a begin marker"),
    ("intro\n\n<!--  mx-proxy report results/medium -->\nold\n{end}\n", 3, "a report marker that does not parse"),
    ("{begin}\nold\n<!-- end of report  -->\n", 3, "a report marker that does not parse"),
    ("<!-- mx-proxy report results/medium --only nothing-such -->\nold\n{end}\n", 1,
     "a report marker that does not parse"),
    ("x\n<!-- mx-proxy report results/nowhere -->\nold\n{end}\n", 2, "no campaign results in 'results/nowhere'"),
], ids=["no-end", "begin-twice", "end-alone", "extra-space", "end-extra-space", "bad-arguments", "no-results"])
def test_update_refuses_a_block_it_cannot_parse_naming_the_line_and_writes_nothing(tmp_path, text, line, says,
                                                                                   monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    doc = _doc(tmp_path, text.format(begin=report.BEGIN.format("results/medium"), end=report.END), "\r\n")
    raw = doc.read_bytes()
    with pytest.raises(ValueError, match=f"{doc}:{line}: .*{says}"):
        report.update(doc)
    with pytest.raises(SystemExit) as err:
        cli.main(["report", "--update", str(doc)])
    assert err.value.code == 2
    assert f"{doc}:{line}:" in capsys.readouterr().err and doc.read_bytes() == raw  # was: "already up to date"
