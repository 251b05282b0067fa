"""``mx-proxy report``: the headline numbers of a results folder, and the README blocks they write."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mx_proxy.cli import main as cli
from mx_proxy.experiments import analysis, report
from mx_proxy.training.config import Config
from mx_proxy.training.result import Run

ROOT = Path(__file__).resolve().parents[2]


def _run(diverged_at=None, steps=2000, recipe="paper_e4m3"):
    """A paired run with set metrics: block 0's gains drift from 1.0 to 0.9 (more than half clamped from step
    1200, all from 1600), block 1's stay at 1.02; one loss jump to 5× at step 700; diagnostics every 20 steps."""
    s = np.arange(steps)
    diag = s % 20 == 0
    loss = np.full(steps, 0.1)
    loss[700] = 0.5
    m = pd.DataFrame({"step": s, "loss": loss, "ref_loss": np.where(s == 1500, 0.05, 0.1),
                      "zeta_bound": np.where(diag, np.where(s < 1200, 0.5, 1.5), np.nan),
                      "zeta_paper": np.where(s == 300, 40.0, 1.0),
                      "ln_gain_mean/block_0": np.where(diag, 1.0 - 0.1 * s / (steps - 1), np.nan),
                      "ln_gain_mean/block_1": np.where(diag, 1.02, np.nan),
                      "ln_clamp_frac/block_0": np.where(diag, np.select([s >= 1600, s >= 1200], [1.0, 0.6], 0.0),
                                                        np.nan),
                      "ln_clamp_frac/block_1": np.where(diag, 0.0, np.nan)})
    m["ln_clamp_frac"] = (m["ln_clamp_frac/block_0"] + m["ln_clamp_frac/block_1"]) / 2
    info = {"kind": "paired", "label": f"paired-{recipe}"}
    return Run(Config(steps=steps, depth=2, recipe=recipe, paired_run=True), m, diverged_at, info=info)


def test_gain_drift_reads_each_blocks_means_and_its_clamp_onset():
    d = analysis.gain_drift(_run())
    assert list(d["block"]) == [0, 1]
    # block 0: mean over diagnostic steps 0..240 and 1760..1980 of the linear drift
    first = np.mean([1.0 - 0.1 * t / 1999 for t in range(0, 250, 20)])
    last = np.mean([1.0 - 0.1 * t / 1999 for t in range(1760, 2000, 20)])
    assert d["first"][0] == pytest.approx(first) and d["last"][0] == pytest.approx(last)
    assert list(d["in_band"]) == [True, False]  # 0.905 inside [0.875, 1); 1.02 above
    assert d["half_clamped_at"][0] == 1200 and d["all_clamped_at"][0] == 1600
    assert pd.isna(d["half_clamped_at"][1]) and pd.isna(d["all_clamped_at"][1])


def test_headline_finds_the_jump_the_fp32_ratio_peak_and_the_paper_zeta_peak():
    h = analysis.headline(_run())
    assert h["steps"] == 2000 and h["diverged_at"] is None and h["blowup_at"] is None
    assert h["max_jump"] == pytest.approx(5.0) and h["max_jump_at"] == 700
    assert h["fp32_ratio_max"] == pytest.approx(2.0) and h["fp32_ratio_max_at"] == 1500  # step 700 is before 1000
    assert h["zeta_paper_max"] == 40.0 and h["zeta_paper_max_at"] == 300
    assert h["vs_fp32_pct"] == pytest.approx(0.0)


def test_a_diverged_run_reports_the_steps_before_its_divergence():
    r = _run(diverged_at=1900)
    r.metrics.loc[r.metrics.step >= 1900, "loss"] = np.inf
    h = analysis.headline(r)
    assert h["zeta_before"] == 1.5 and h["zeta_before_max"] == 1.5  # steps 1400..1899
    d = analysis.gain_drift(r)  # the last 250 steps before the divergence: diagnostic steps 1660..1880
    assert d["last"][0] == pytest.approx(np.mean([1.0 - 0.1 * t / 1999 for t in range(1660, 1900, 20)]))
    text = report.markdown([r])
    assert "| diverged at step 1900 |" in text and "over the 500 steps before step 1900" in text


def test_markdown_writes_one_row_per_run_with_its_numbers():
    stable, mx = _run(), _run(recipe="mxfp8_e4m3")
    text = report.markdown([mx, stable], source="somewhere")
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert [r.split("|")[1].strip().split()[0] for r in rows] == ["`paper_e4m3`", "`mxfp8_e4m3`"]
    assert "0.50 / 1.50" in rows[0]  # same-point bound median / max: 60 diagnostic steps at 0.5, 40 at 1.5
    assert "1.00 / 40.0" in rows[0]  # the paper's ζ
    assert "(counted)" in rows[0] and "(counted)" not in rows[1]  # mxfp8_e4m3 quantizes the LN gains
    assert "(1 of 2)" in rows[0] and "block 0: 1200 / 1600" in rows[0]
    assert "largest loss jump 5.0× its minimum over the previous 100 steps (step 700)" in text
    assert "(somewhere)" in text.splitlines()[0] and "LR 6e-4" in text.splitlines()[0]


def test_rows_name_the_seed_when_a_folder_holds_several():
    runs = [_run(), _run(recipe="mxfp8_e4m3")]
    one = report.markdown(runs)
    assert "seed 0;" in one.splitlines()[0] and "seed 0)" not in one  # one seed: said once, in the header
    r = _run()
    text = report.markdown(runs + [Run(r.config.replace(seed=1), r.metrics, None, info=r.info)])
    assert text.splitlines()[0].split(";")[0].endswith("seeds 0, 1")
    rows = [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| `")]
    assert rows == ["`paper_e4m3` (the authors' code, E4M3 everywhere, seed 0)",
                    "`mxfp8_e4m3` (LN gains really MX-quantized, seed 0)",
                    "`paper_e4m3` (the authors' code, E4M3 everywhere, seed 1)"]
    assert "- `paper_e4m3` (the authors' code, E4M3 everywhere, seed 1): " in text


def test_markdown_rejects_results_without_paired_runs(tmp_path):
    r = _run()
    r.info["kind"] = "grid"
    with pytest.raises(ValueError, match="no paired or control runs.*grid"):
        report.markdown([r])
    with pytest.raises(ValueError, match="no campaign results in"):
        report.for_folder(tmp_path)


def test_readme_report_blocks_are_the_reports_of_the_committed_results(monkeypatch):
    monkeypatch.chdir(ROOT)
    found = [(doc, folder, body) for doc in ("README.md", "docs/campaign.md", "docs/ensembles.md")
             for folder, body in report.blocks((ROOT / doc).read_text())]
    assert any(doc == "README.md" for doc, _, _ in found)
    for doc, folder, body in found:
        assert body == report.for_block(folder), f"{doc}: the block of {folder} is stale; run " \
                                                  f"`mx-proxy report --update {doc}`"


def test_cli_report_prints_and_updates(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert cli.main(["report", "results/medium"]) == 0
    printed = capsys.readouterr().out
    assert printed == report.for_folder("results/medium")
    doc = tmp_path / "doc.md"
    inline = f"prose naming `{report.BEGIN.format('FOLDER')}` inline is not a block\n"
    doc.write_text(f"{inline}{report.BEGIN.format('results/medium')}\nold table\n{report.END}\nafter\n")
    assert cli.main(["report", "--update", str(doc)]) == 0
    assert doc.read_text() == f"{inline}{report.BEGIN.format('results/medium')}\n{printed}{report.END}\nafter\n"
    assert "already up to date" not in capsys.readouterr().out
    assert cli.main(["report", "--update", str(doc)]) == 0
    assert "already up to date" in capsys.readouterr().out
    with pytest.raises(SystemExit) as err:
        cli.main(["report", str(tmp_path / "nothing")])
    assert err.value.code == 2 and "no campaign results in" in capsys.readouterr().err


def _blown_up(steps=2000, at=1500):
    """A run whose loss climbs 900× over steps at, at+1 (30× a step: under the engine's one-step 100× rule)."""
    r = _run(steps=steps)
    loss = r.metrics["loss"].to_numpy().copy()
    loss[700] = 0.1
    loss[at:] = 0.1 * 30.0 ** np.minimum(np.arange(steps - at) + 1, 2)
    r.metrics["loss"] = loss
    return r


def test_a_blown_up_run_is_unstable_from_its_blowup_and_reported_so():
    r = _blown_up()
    h = analysis.headline(r)
    assert r.diverged_at is None and h["blowup_at"] == 1500 and h["unstable_at"] == 1500
    assert h["loss_max"] == pytest.approx(90.0) and h["loss_max_at"] == 1501
    assert h["zeta_before"] == 1.5 and h["zeta_median"] == 0.5  # the bound over steps < 1500: 60 at 0.5, 15 at 1.5
    assert h["vs_fp32_pct"] == pytest.approx(89900.0)  # the end of the run, blow-up included
    d = analysis.gain_drift(r)  # its last window ends at the blow-up
    assert d["last"][0] == pytest.approx(np.mean([1.0 - 0.1 * t / 1999 for t in range(1260, 1500, 20)]))
    text = report.markdown([r])
    assert "**blew up at step 1500** (loss up to 90 at step 1501)" in text
    assert "the engine's one-step rule, 100× the previous step, never fired" in text
    assert "(250 before step 1500)" in text and "+89900 %" in text
    assert analysis.unstable_at(_run()) is None
    assert analysis.unstable_after(r, 1000) == 1500 and analysis.unstable_after(r, 1501) is None  # from a step on


def test_a_run_that_blows_up_recovers_and_diverges_later_is_unstable_from_its_blowup():
    """The 10× blow-up at 1500 comes first, the engine's divergence (a non-finite loss) at 1900: the onset is the
    blow-up, and the report names both; a divergence with no blow-up before it is the onset itself."""
    r = _blown_up()
    loss = r.metrics["loss"].to_numpy().copy()
    loss[1510:] = 0.5  # recovered part of the way
    loss[1900] = np.nan
    r.metrics["loss"] = loss
    r = Run(r.config, r.metrics, 1900, info=r.info)
    assert analysis.unstable_at(r) == 1500 and analysis.unstable_after(r, 1501) == 1900
    assert analysis.unstable_after(r, 1901) is None
    assert "**blew up at step 1500**, diverged at step 1900" in report.markdown([r])
    only = _run(diverged_at=1900)
    assert analysis.unstable_at(only) == 1900 and "| diverged at step 1900 |" in report.markdown([only])


def test_interventions_table_lists_each_child_with_its_outcome():
    parent = _blown_up()
    parent.info["key"] = "parentkey"
    kids = []
    for name, blown in (("fp32", False), ("paper_bump", True)):
        k = _blown_up() if blown else _run()
        k.metrics = k.metrics[k.metrics.step < 1800].reset_index(drop=True)
        k.info = {"kind": "intervention", "label": f"intervention-{name}", "parent": "parentkey",
                  "intervention": {"at_step": 1000, "apply": [name]}}
        kids.append(k)
    text = report.markdown([parent, *kids])
    rows = [line for line in text.splitlines() if line.startswith("| `fp32` on") or line.startswith("| `paper_bump`")]
    assert rows == ["| `fp32` on `paper_e4m3` | 1000 → 1800 | no | 0.1 | 0.1 |",
                    "| `paper_bump` on `paper_e4m3` | 1000 → 1800 | blew up at step 1500 | 90 | 90 |"]
    assert "replayed" not in text
    kids[0].info["intervention"]["replay"] = {"from_step": 500, "paired_run": False, "identical": True}
    kids[1].info["intervention"]["replay"] = {"from_step": 500, "paired_run": False, "identical": True}
    text = report.markdown([parent, *kids])
    assert text.count("No checkpoint was kept at step 1000: the state there was replayed from step 500 without "
                      "the FP32 run; its losses equal the run's bit for bit.") == 1
    kids[1].info["intervention"]["replay"] = {"from_step": 500, "paired_run": True, "identical": False,
                                              "first_difference": 700}
    assert ("replayed from step 500; its losses differ from the run's from step 700"
            in report.markdown([parent, kids[1]]))


def test_cli_report_draws_a_committed_ensembles_figures_and_refuses_a_campaigns(tmp_path, capsys, monkeypatch):
    """`mx-proxy report ENSEMBLE --figures DIR` draws the survival, blow-up-rate, loss and (members blew up)
    warning-signal figures of the members exported so far (here the committed Fig. 7 ensemble's); a campaign
    folder is refused before any work."""
    from PIL import Image

    from mx_proxy.experiments import ensemble_result

    monkeypatch.chdir(ROOT)
    folder = "results/ensembles/fig7-6000"
    assert cli.main(["report", folder, "--figures", str(tmp_path / "figs")]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(report.for_folder(folder))
    spec = ensemble_result.load(folder).spec
    for name in ("survival", "blowup_rates", "loss", "signals"):
        path = tmp_path / "figs" / f"{spec.name}_{name}.png"
        assert f"figure: {path}" in printed
        with Image.open(path) as im:
            assert im.format == "PNG" and min(im.size) > 200
    with pytest.raises(SystemExit) as err:
        cli.main(["report", "results/medium", "--figures", str(tmp_path / "none")])
    assert err.value.code == 2 and not (tmp_path / "none").exists()
    assert "'results/medium' is not an ensemble's results folder" in capsys.readouterr().err


def test_an_ensembles_report_prints_only_the_parts_asked_for_and_a_block_keeps_them(tmp_path, capsys, monkeypatch):
    """`mx-proxy report ENSEMBLE --only PART …`: the header and those sections, in report order, each exactly as
    in the whole report; a README block with the same arguments is rewritten to the same text; a campaign's
    folder and an unknown part are refused with the choices named."""
    from mx_proxy.experiments import ensemble_report

    monkeypatch.chdir(ROOT)
    folder = "results/ensembles/fig7-6000"
    full = report.for_folder(folder)
    header = full.rstrip("\n").split("\n\n")[:3]  # the ensemble, the rule and the branch state, then the sections
    by_part = {p: report.for_folder(folder, parts=[p]).rstrip("\n").split("\n\n", 3)[3]
               for p in ensemble_report.PARTS}
    assert all(by_part.values())
    assert full == "\n\n".join(header + [by_part[p] for p in ensemble_report.PARTS]) + "\n"  # each part whole
    for parts in (["rates"], ["paired", "rates"], ["loss_gap"], ["signals", "paired"], ["rule", "rates"]):
        assert cli.main(["report", folder, "--only", *parts]) == 0
        printed = capsys.readouterr().out
        want = [by_part[p] for p in ensemble_report.PARTS if p in parts]
        assert printed == "\n\n".join(header + want) + "\n"
        assert printed == report.for_block(f"{folder} --only {' '.join(parts)}")
    doc = tmp_path / "doc.md"
    marker = report.BEGIN.format(f"{folder} --only rates paired")
    doc.write_text(f"{marker}\nold\n{report.END}\n")
    assert report.update(doc)
    assert doc.read_text() == f"{marker}\n{report.for_folder(folder, parts=['rates', 'paired'])}{report.END}\n"
    assert report.blocks(doc.read_text())[0][0] == f"{folder} --only rates paired"
    with pytest.raises(ValueError, match="unknown report part 'bogus'; valid: rates, paired, loss_gap, signals, rule"):
        ensemble_report.check_parts(["rates", "bogus"])
    with pytest.raises(ValueError, match="'results/medium' is not an ensemble's results folder"):
        report.for_folder("results/medium", parts=["rates"])
    for bad in (["results/medium", "--only", "rates"], [folder, "--only", "bogus"]):
        with pytest.raises(SystemExit) as err:
            cli.main(["report", *bad])
        assert err.value.code == 2
    assert "invalid choice: 'bogus'" in capsys.readouterr().err


def test_an_ensembles_report_tests_against_the_control_asked_for(tmp_path, capsys, monkeypatch):
    """`mx-proxy report ENSEMBLE --control ARM`: the paired tests against that arm (a mechanism arm against `fp32`
    rather than the unchanged run), each row McNemar's test on the member-by-member table; a block keeps the
    control; an arm the ensemble lacks, or a campaign's folder, is refused before any work with the choices named."""
    from mx_proxy.experiments import ensemble_result, stats

    monkeypatch.chdir(ROOT)
    folder = "results/ensembles/fig7-6000"
    result = ensemble_result.load(folder)
    assert result.control == "unchanged" and result.against("fp32").control == "fp32"
    tests = result.against("fp32").paired_tests().set_index("arm")
    assert "fp32" not in tests.index and "unchanged" in tests.index
    t = result.table.pivot(index="member", columns="arm", values="event")
    assert tests.loc["fp32_keep_bias", "mcnemar_p"] == stats.mcnemar(t["fp32"], t["fp32_keep_bias"]).pvalue
    assert tests.equals(result.paired_tests(control="fp32").set_index("arm"))
    assert cli.main(["report", folder, "--only", "paired", "--control", "fp32"]) == 0
    printed = capsys.readouterr().out
    assert "Against `fp32`, member by member" in printed and "| `fp32` |" not in printed
    assert printed == report.for_block(f"{folder} --only paired --control fp32")
    doc = tmp_path / "doc.md"
    marker = report.BEGIN.format(f"{folder} --only paired --control fp32")
    doc.write_text(f"{marker}\nold\n{report.END}\n")
    assert report.update(doc) and doc.read_text() == f"{marker}\n{printed}{report.END}\n"
    with pytest.raises(ValueError, match="control arm 'bogus' is not an arm of ensemble 'fig7-6000'; valid: "
                                         "'unchanged', 'twin', 'fp32'"):
        result.against("bogus")
    for bad, said in (([folder, "--control", "bogus"], "'adam_eps=1e-15'"),
                      (["results/medium", "--control", "fp32"], "'results/medium' is not an ensemble's results"),
                      (["--update", str(doc), "--control", "fp32"], "--control applies to a results folder")):
        with pytest.raises(SystemExit) as err:
            cli.main(["report", *bad])
        assert err.value.code == 2 and said in capsys.readouterr().err
    assert doc.read_text() == f"{marker}\n{printed}{report.END}\n"


def test_a_branch_ensembles_header_says_whether_its_state_had_blown_up_before_the_branch(monkeypatch):
    """The rule on the recorded history (the state's run and its FP32 twin): the committed state had not blown up;
    the same history with one 50× step at 4000 (and a peak of 80× at 4003) had, there, and its twin had not."""
    from mx_proxy.experiments import ensemble_report, ensemble_result

    monkeypatch.chdir(ROOT)
    result = ensemble_result.load("results/ensembles/fig7-6000")
    history = pd.read_parquet("results/ensembles/fig7-6000/branch_history.parquet")
    line = ensemble_report.markdown(result, history=history, parts=["rates"]).split("\n\n")[2]
    tail = history.iloc[-100:]
    assert line == ("The state at step 6000, by the rule on its recorded history: its run (`paper_e4m3`) had not "
                    "blown up and its FP32 twin had not blown up (mean loss over the last 100 steps before the "
                    f"branch: run {tail.loss.mean():.3g}; twin {tail.ref_loss.mean():.3g}).")
    bad = history.copy()
    floor = bad.loss.iloc[3900:4000].min()
    bad.loc[bad.step == 4000, "loss"] = 50.5 * floor
    bad.loc[bad.step == 4003, "loss"] = 80 * floor
    line = ensemble_report.markdown(result, history=bad, parts=["rates"]).split("\n\n")[2]
    assert (f"its run (`paper_e4m3`) had blown up at step 4000 (loss {80 * floor:.3g} at step 4003) and its FP32 "
            f"twin had not blown up") in line
    assert "The state at step" not in ensemble_report.markdown(result, history=None, parts=["rates"])
