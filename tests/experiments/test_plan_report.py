"""The plan's report (mx-proxy report --plan): its statistics against independent computations, the report on
synthetic members, and the report on the committed results/plan against a recomputation from the run files."""

import copy
import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binomtest

from mx_proxy.cli.main import main
from mx_proxy.experiments import plan as P
from mx_proxy.experiments import plan_members, plan_render, plan_report, plan_stats
from mx_proxy.experiments.ensemble_export import export
from mx_proxy.experiments.ensemble_spec import write_spec
from mx_proxy.training.result import Run
from mx_proxy.viz import plots

ROOT = Path(__file__).resolve().parents[2]
TINY = {"width": 16, "depth": 1, "batch": 32, "lr": 0.001, "steps": 300, "dot": "f32", "recipe": "fp32",
        "diagnostics_every": 0, "gradient_reference": "same_point", "val_every": 0}
HORIZON, BLOWUP_AT = 300, 150

# blew up (1) or not, by member (seeds 101-106); s2's arms have 5 of their 6 members: interim
OUTCOMES = {
    "s22": {"paper_e4m3": [1, 1, 1, 1, 0, 1], "train_ln_bias": [0, 0, 1, 0, 0, 0],
            "fp32_keep_bias": [1, 0, 0, 0, 0, 0], "fp32": [0, 0, 0, 0, 0, 0]},
    "s2": {"fp32": [0, 1, 0, 0, 0], "bf16": [1, 1, 1, 0, 1], "paper_e4m3": [1, 1, 0, 1, 1]},
}


def _plan_dict() -> dict:
    d = copy.deepcopy(json.loads(P.PLAN_FILE.read_text()))
    d["settings"] = {"tiny": TINY}
    study = {"machine": "cpu", "kind": "seed", "setting": "tiny", "first_seed": 101, "members": 6, "unit": 6,
             "horizon": HORIZON, "checkpoint_every": 100}
    d["studies"] = [dict(study, id="s22", hypothesis="HA", arms=list(OUTCOMES["s22"])),
                    dict(study, id="s2", hypothesis="HB", arms=list(OUTCOMES["s2"])),
                    dict(study, id="s0", hypothesis="HB", arms=["fp32"])]
    d["order"] = {"cpu": ["s22", "s2", "s0"]}
    d["hypotheses"] = [
        {"id": "HA", "study": "s22", "question": "bias?", "primary": {"test": "mcnemar", "a": "paper_e4m3",
                                                                     "b": "train_ln_bias"},
         "secondary": [{"test": "main_effect", "factor": "bias",
                        "cells": {"frozen": ["paper_e4m3", "fp32_keep_bias"], "trained": ["train_ln_bias", "fp32"]}},
                       {"test": "interaction", "a": ["paper_e4m3", "train_ln_bias"], "b": ["fp32_keep_bias", "fp32"]},
                       {"test": "mcnemar", "a": "fp32_keep_bias", "b": "fp32"}]},
        {"id": "HB", "study": "s2", "question": "machine?", "primary": {"test": "mcnemar", "a": "fp32", "b": "bf16"},
         "secondary": [{"test": "cochran", "arms": "all"}, {"test": "mcnemar", "a": "s22/fp32", "b": "fp32"},
                       {"test": "mcnemar", "a": "fp32", "b": "s0/fp32"}]},
        {"id": "HD", "study": "s22", "question": "signal?", "arms": ["paper_e4m3", "train_ln_bias"], "window": 500,
         "gap": 50, "primary": {"test": "auc", "signal": "loss_jump"}},
    ]
    return d


def _member(spec, arm, i, blown: bool, device: str) -> Run:
    loss = np.full(HORIZON, 1.0, np.float32)
    if blown:
        loss[BLOWUP_AT:] = 50.0
    m = pd.DataFrame({"step": np.arange(HORIZON), "loss": loss})
    return Run(spec.config(arm, i), m, None, info={"device": device})


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """A tiny plan with its members written as the queue exports them, and MACHINES.md naming the machine of the
    members whose run.json says only ``cpu: cpu``."""
    root = tmp_path_factory.mktemp("plan")
    f = root / "plan.json"
    f.write_text(json.dumps(_plan_dict()))
    plan = P.load(f)
    members = root / "members"
    for sid, arms in OUTCOMES.items():
        spec = plan.study(sid).ensemble_spec
        write_spec(spec, members / sid)
        for arm, events in arms.items():
            device = (lambda i: "cpu: cpu" if i < 3 else "cpu: Model B") if sid == "s22" else (lambda i: "cpu: Model B")
            export(spec, arm, {i: _member(spec, arm, i, bool(e), device(i)) for i, e in enumerate(events)},
                   members / sid)
    (members / "MACHINES.md").write_text("| study | members | commit trained | machine |\n|---|---|---|---|\n"
                                         "| s22 | seeds 101–103, all arms | abc1234 | Model A, 2 vCPUs |\n")
    return plan, f, members, plan_report.compute(plan, members)


def _test(report, hypothesis, kind, text=None):
    return next(t for t in report["tests"] if t["hypothesis"] == hypothesis and t["kind"] == kind
                and (text is None or text in t["test"]))


def test_mcnemar_and_difference_against_the_discordant_pairs_counted_by_hand(synthetic):
    _, _, _, report = synthetic
    a, b = np.array(OUTCOMES["s22"]["paper_e4m3"]), np.array(OUTCOMES["s22"]["train_ln_bias"])
    only_a, only_b = int(((a == 1) & (b == 0)).sum()), int(((a == 0) & (b == 1)).sum())
    t = report["tests"][0]
    assert (t["only_a"], t["only_b"], t["pairs"]) == (only_a, only_b, 6)
    assert t["pvalue"] == pytest.approx(binomtest(only_a, only_a + only_b, 0.5).pvalue)
    assert t["estimate"] == pytest.approx((a - b).mean())
    assert t["low"] <= t["estimate"] <= t["high"]
    # a cross-study comparison pairs by seed: s2 has seeds 101-105 only
    x = _test(report, "HB", "mcnemar", "s22/fp32")
    assert x["pairs"] == 5 and sorted(x["studies"]) == ["s2", "s22"]


def _brute_sign_flip(d) -> float:
    d = np.asarray(d, float)
    t = abs(d.mean())
    flips = [abs((np.array(s) * d).mean()) >= t - 1e-12 for s in itertools.product((1, -1), repeat=len(d))]
    return float(np.mean(flips))


def test_main_effect_and_interaction_against_a_brute_force_sign_flip_enumeration(synthetic):
    _, _, _, report = synthetic
    o = {k: np.array(v, float) for k, v in OUTCOMES["s22"].items()}
    main = 0.5 * ((o["paper_e4m3"] - o["train_ln_bias"]) + (o["fp32_keep_bias"] - o["fp32"]))
    inter = (o["paper_e4m3"] - o["train_ln_bias"]) - (o["fp32_keep_bias"] - o["fp32"])
    for kind, d in (("main_effect", main), ("interaction", inter)):
        t = _test(report, "HA", kind)
        assert t["estimate"] == pytest.approx(d.mean())
        assert t["pvalue"] == pytest.approx(_brute_sign_flip(d)) and t["exact"]


@pytest.mark.parametrize("d", [[1, 0.5, -1, 2, 0, 1, 1, -0.5], [0, 0, 0], [1, 1, 1, 1, 1]])
def test_sign_flip_is_the_enumeration_and_zeros_change_nothing(d):
    p, exact = plan_stats.sign_flip(d)
    assert exact and p == pytest.approx(_brute_sign_flip(d) if any(d) else 1.0)
    assert plan_stats.sign_flip(list(d) + [0, 0])[0] == pytest.approx(p)


@pytest.mark.parametrize("d", [[1, 0.5, -1, 2, 0, 1, 1, -0.5, 1.5, -2, 1, 0.5], [1] * 13, [0.5, -0.5] * 6])
def test_the_exact_convolution_beyond_scipys_enumeration_is_the_enumeration(d):
    p, exact = plan_stats.sign_flip(d, exact_up_to=0)
    assert exact and p == pytest.approx(_brute_sign_flip(d))
    # 40 seeds, as the plan's: still exact, and within the sampled test's error of scipy's random flips
    rng = np.random.default_rng(1)
    big = rng.choice([-1, -0.5, 0, 0.5, 1, 1.5, 2], size=40)
    p40, exact40 = plan_stats.sign_flip(big)
    from scipy.stats import permutation_test
    sampled = permutation_test((big[big != 0],), lambda x, axis=-1: np.mean(x, axis=axis), vectorized=True,
                               permutation_type="samples", n_resamples=99_999, rng=np.random.default_rng(0)).pvalue
    assert exact40 and abs(p40 - sampled) < 0.01


def test_holm_against_a_hand_worked_family():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04 -> running max 0.02, 0.03, 0.06, 0.06
    assert plan_stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert plan_stats.holm([0.5, np.nan]) == pytest.approx([1.0, 1.0])  # an untested p keeps the family's size
    assert plan_stats.holm([0.01, np.nan]) == pytest.approx([0.02, 1.0])
    with pytest.raises(ValueError, match="1.5"):
        plan_stats.holm([0.1, 1.5])


def test_holm_families_interim_labels_and_power(synthetic):
    plan, _, _, report = synthetic
    primary = [t for t in report["tests"] if t["family"] == "primary"]
    assert [t["family_size"] for t in primary] == [3, 3, 3]
    assert [t["holm_p"] for t in primary] == pytest.approx(plan_stats.holm([t["pvalue"] for t in primary]))
    ha, hb, hd = primary
    # H3's path: train_ln_bias (5 stable) scored by the AUC, paper_e4m3 (1 stable) by its earlier window, which
    # these 300-step members do not have; the loss jump is 1 before every blow-up: AUC 1/2
    assert (hd["positives"], hd["negatives"], hd["auc_arms"], hd["paired_arms"]) == (1, 5, ["train_ln_bias"],
                                                                                      ["paper_e4m3"])
    assert hd["estimate"] == pytest.approx(0.5) and hd["paired_n"] == 0
    assert hd["events"] == 6  # the lead time of the signals module, over H3's arms' blow-ups
    assert not ha["interim"] and ha["verdict"] in ("rejected (Holm)", "not rejected (Holm)")
    assert (ha["verdict"] == "rejected (Holm)") == (ha["holm_p"] <= plan.alpha)
    assert hb["interim"] and hb["verdict"] == "interim: not declared"  # s2 has 5 of its 6 members
    secondary = [t for t in report["tests"] if t["hypothesis"] == "HA" and t["family"] == "secondary"]
    assert [t["holm_p"] for t in secondary] == pytest.approx(plan_stats.holm([t["pvalue"] for t in secondary]))
    # the power reached: the rates McNemar detects from 6 pairs against arm b's observed rate
    from mx_proxy.experiments import power
    rate_b = np.mean(OUTCOMES["s22"]["train_ln_bias"])
    levels = {p["level"]: p for p in ha["power"]}
    assert levels["holm_first"]["alpha"] == pytest.approx(plan.alpha / 3)
    above, _ = power.detectable(rate_b, 6, plan.power, plan.alpha)
    assert levels["alpha"]["detectable_above"] == (None if np.isnan(above) else pytest.approx(above))
    assert levels["alpha"]["reference_rate"] == pytest.approx(rate_b)
    # a study without members: its tests have no pairs, count as p = 1, and say so
    empty = _test(report, "HB", "mcnemar", "s0/fp32")
    assert empty["pairs"] == 0 and empty["pvalue"] is None and empty["holm_p"] is None
    study = next(s for s in report["studies"] if s["id"] == "s0")
    assert study["status"] == "no members"
    assert "### Study `s0` (HB, cpu)\n\nNo members yet" in plan_render.markdown(report)


def test_cochran_over_every_arm_and_the_study_rates(synthetic):
    from mx_proxy.experiments import stats
    _, _, _, report = synthetic
    table = np.column_stack([OUTCOMES["s2"][a] for a in OUTCOMES["s2"]]).astype(bool)
    q = stats.cochran_q(table)
    t = _test(report, "HB", "cochran")
    assert t["statistic"] == pytest.approx(q.statistic) and t["pvalue"] == pytest.approx(q.pvalue)
    s2 = next(s for s in report["studies"] if s["id"] == "s2")
    assert s2["status"] == "interim" and s2["members"] == 5
    assert {a["arm"]: a["blowups"] for a in s2["arms"]} == {k: sum(v) for k, v in OUTCOMES["s2"].items()}


def test_machines_from_run_json_and_the_notes_and_a_mixed_study_said_so(synthetic):
    _, _, members, report = synthetic
    s22, s2 = (next(s for s in report["studies"] if s["id"] == i) for i in ("s22", "s2"))
    by = {m["machine"]: m for m in s22["machines"]}
    assert set(by) == {"Model A", "cpu: Model B"} and s22["mixed_machines"] and not s2["mixed_machines"]
    assert by["Model A"]["source"] == "MACHINES.md" and by["Model A"]["seeds"] == "101–103"
    assert by["Model A"]["blowups"]["paper_e4m3"] == [3, 3]
    assert "Mixed machines: this study's members trained on 2 different machines" in plan_render.markdown(report)


def test_the_command_prints_the_same_numbers_as_json_and_draws_the_figure(synthetic, tmp_path, capsys):
    _, f, members, report = synthetic
    assert main(["report", "--plan", str(members), "--plan-file", str(f), "--json",
                 "--figures", str(tmp_path / "fig")]) == 0
    out = capsys.readouterr().out
    printed = json.loads(out[:out.rindex("}") + 1])
    assert printed == json.loads(json.dumps(report))
    assert (tmp_path / "fig" / f"{report['plan']}_effects.png").stat().st_size > 0
    assert main(["report", "--plan", str(members), "--plan-file", str(f), "--study", "s2"]) == 0
    text = capsys.readouterr().out
    assert "### HB" in text and "### HA" not in text and "Study `s22`" not in text


def test_the_figure_title_fits_the_figure(synthetic):
    _, _, _, report = synthetic
    fig = plots.plan_effects(report)
    fig.canvas.draw()
    box, title = fig.bbox, fig._suptitle.get_window_extent()
    assert box.x0 <= title.x0 and title.x1 <= box.x1 and title.y1 <= box.y1
    plots.plt.close(fig)


def test_bad_input_exits_2_naming_the_value(synthetic, tmp_path, capsys):
    _, f, members, _ = synthetic
    assert _exit(["report", "--plan", str(tmp_path / "none"), "--plan-file", str(f)]) == 2
    assert "none" in capsys.readouterr().err
    assert _exit(["report", "--plan", str(members), "--plan-file", str(f), "--study", "nope"]) == 2
    assert "'nope'; valid: s22, s2, s0" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**_plan_dict(), "correction": "bonferroni"}))
    assert _exit(["report", "--plan", str(members), "--plan-file", str(bad)]) == 2
    assert "'bonferroni'" in capsys.readouterr().err
    assert _exit(["report", "--json"]) == 2 and "--json applies to the plan's report" in capsys.readouterr().err
    other = tmp_path / "other"
    (other / "s2").mkdir(parents=True)
    write_spec(P.load(f).study("s22").ensemble_spec, other / "s2")  # another study's ensemble in s2's folder
    with pytest.raises(ValueError, match="is not study 's2'"):
        plan_members.load_studies(P.load(f), other)


def _exit(argv) -> int:
    with pytest.raises(SystemExit) as e:
        main(argv)
    return e.value.code


def _blown_up(folder: Path) -> bool:
    """The ensembles' rule recomputed from one member's files: a loss above 10x its minimum over the previous 100
    steps (after the first 100), a non-finite loss, or the engine's stop recorded in run.json."""
    loss = pd.read_parquet(folder / "metrics.parquet")["loss"].to_numpy(float)
    prior = pd.Series(np.where(np.isfinite(loss), loss, np.inf)).rolling(100).min().shift(1).to_numpy()
    jump = (loss > 10 * prior)[100:]
    return bool(jump.any() or not np.isfinite(loss).all()
                or json.loads((folder / "run.json").read_text())["diverged_at"] is not None)


@pytest.fixture(scope="module")
def committed():
    return plan_report.compute(P.load(), ROOT / "results" / "plan")


def test_the_committed_plan_members_against_a_recomputation_from_the_run_files(committed):
    report = committed
    study = next(s for s in report["studies"] if s["id"] == "h4-cpu")
    folder = ROOT / "results" / "plan" / "h4-cpu"
    members = sorted(d for d in folder.iterdir() if (d / "run.json").is_file())
    for arm in study["arms"]:
        mine = [d for d in members if d.name.rsplit("-m", 1)[0] == arm["arm"]]
        assert arm["members"] == len(mine) > 0
        assert arm["blowups"] == sum(_blown_up(d) for d in mine)
    devices = {json.loads((d / "run.json").read_text())["device"] for d in members}
    assert study["mixed_machines"] == (len({m["machine"] for m in study["machines"]}) > 1)
    assert {d for m in study["machines"] for d in m["devices"]} == devices
    assert study["status"] == "interim" and study["members"] == min(a["members"] for a in study["arms"])
    # every other study has no member yet: each of its tests waits, none is declared
    assert all(t["interim"] for t in report["tests"])
    assert [t["verdict"] for t in report["tests"] if t["family"] == "primary"] == ["interim: not declared"] * 4


def _signal_result():
    """H3's scoring on made members: ``zeta_bound`` = a_i + step / 1000 at every 50th step (so a window's largest
    value is at its last diagnostic step); paper_e4m3: 6 stable, 3 blown up (scored by the AUC); mxfp8_e4m3: 2
    stable, 3 blown up (fewer than 5 stable: against their own earlier window)."""
    from mx_proxy.experiments.ensemble_result import EnsembleResult
    from mx_proxy.experiments.ensemble_spec import Ensemble
    from mx_proxy.training.config import Config

    spec = Ensemble("h3", "seed", Config(**{**TINY, "steps": 3000, "diagnostics_every": 50}),
                    ("paper_e4m3", "mxfp8_e4m3"), members=9, horizon=3000, first_seed=101, checkpoint_every=500)
    plan = {"paper_e4m3": [None] * 6 + [1700, 2210, 2990], "mxfp8_e4m3": [None] * 2 + [1600, 2400, 2800] + [None] * 4}
    level = {"paper_e4m3": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.9, 0.25, 0.8], "mxfp8_e4m3": [0.3] * 9}
    runs = {}
    for arm, times in plan.items():
        runs[arm] = []
        for i, t in enumerate(times[:5] if arm == "mxfp8_e4m3" else times):
            steps = np.arange(t + 1 if t else 3000)
            loss = np.full(len(steps), 1.0, np.float32)
            if t:
                loss[t] = 100.0
            zeta = np.where(steps % 50 == 0, level[arm][i] + steps / 1000, np.nan)
            runs[arm].append(Run(spec.config(arm, i), pd.DataFrame({"step": steps, "loss": loss, "zeta_bound": zeta}),
                                 None))
        runs[arm] += [None] * (9 - len(runs[arm]))
    return EnsembleResult(spec, runs), plan, level


def test_h3_scores_and_auc_against_a_hand_computation():
    from scipy.stats import mannwhitneyu, wilcoxon

    from mx_proxy.experiments import plan_signals, stats
    result, times, level = _signal_result()
    last = lambda t, back: (t - back) // 50 * 50 / 1000  # noqa: E731 (the last diagnostic step at most t - back)
    s = plan_signals.scores(result, ("paper_e4m3", "mxfp8_e4m3"), "zeta_bound").set_index(["arm", "member"])
    for arm, ts in times.items():
        blown = {i: t for i, t in enumerate(ts) if t}
        for i in range(5 if arm == "mxfp8_e4m3" else 9):
            want = (level[arm][i] + last(blown[i], 50) if i in blown else
                    float(np.median([level[arm][i] + last(t, 50) for t in blown.values()])))
            assert s.loc[(arm, i), "score"] == pytest.approx(want)
    a = plan_signals.evaluate_auc(result, ("paper_e4m3", "mxfp8_e4m3"), "zeta_bound")
    assert a.auc_arms == ("paper_e4m3",) and a.paired_arms == ("mxfp8_e4m3",)
    p = s.loc["paper_e4m3"]
    pos, neg = p.loc[p["event"], "score"], p.loc[~p["event"], "score"]
    assert (a.positives, a.negatives) == (3, 6)
    assert a.auc == pytest.approx(stats.auc(p["score"], p["event"]))
    assert a.pvalue == pytest.approx(mannwhitneyu(pos, neg, alternative="two-sided").pvalue)
    assert a.low <= a.auc <= a.high
    m = s.loc["mxfp8_e4m3"]
    m = m[m["event"]]
    assert a.paired_n == 3 and a.paired_p == pytest.approx(wilcoxon(m["score"], m["early"]).pvalue)
    assert m["early"].to_numpy() == pytest.approx([0.3 + last(t, 1000) for t in (1600, 2400, 2800)])


def test_the_docs_block_is_the_commands_output_on_the_committed_members(committed):
    text = (ROOT / "docs" / "ensembles.md").read_text()
    block = text.split("<!-- plan report: mx-proxy report --plan --study h4-cpu -->\n", 1)[1]
    block = block.split("<!-- end of plan report -->", 1)[0]
    shown = plan_report.select({**committed, "folder": "results/plan"}, ["h4-cpu"])
    assert block == plan_render.markdown(shown)


def test_a_branch_study_moved_earlier_says_so_with_its_parents_blow_up(tmp_path):
    import dataclasses

    from mx_proxy.experiments.ensemble_spec import HISTORY_FILE
    from mx_proxy.store import tables

    d = _plan_dict()
    d["studies"].append({"id": "b1", "hypothesis": "HC", "machine": "cpu", "kind": "branch", "setting": "tiny",
                         "parent": {"recipe": "paper_e4m3", "seed": 0, "data_seed": 0}, "branch_at": 1000,
                         "arms": ["unchanged", "fp32"], "first_seed": 1, "members": 2, "unit": 2, "horizon": 300,
                         "checkpoint_every": 100})
    d["order"]["cpu"].append("b1")
    d["hypotheses"].append({"id": "HC", "study": "b1", "question": "branch?",
                            "primary": {"test": "mcnemar", "a": "unchanged", "b": "fp32"}})
    (tmp_path / "plan.json").write_text(json.dumps(d))
    plan = P.load(tmp_path / "plan.json")
    planned = plan.study("b1").ensemble_spec
    spec = dataclasses.replace(planned, branch_at=500, base=planned.base.replace(steps=500))
    folder = tmp_path / "members" / "b1"
    write_spec(spec, folder)
    steps = np.arange(400, 800)
    for arm in spec.arms:
        runs = {i: Run(spec.config(arm, i), pd.DataFrame({"step": steps, "loss": np.ones(len(steps), np.float32)}),
                       None, info={"device": "cpu: X"}) for i in range(2)}
        export(spec, arm, runs, folder)
    parent = np.ones(500, np.float32)
    parent[300:] = 50.0
    tables.write(folder / HISTORY_FILE, pd.DataFrame({"step": np.arange(500), "loss": parent}))
    report = plan_report.compute(plan, tmp_path / "members")
    b1 = next(s for s in report["studies"] if s["id"] == "b1")
    assert b1["parent"] == {"branch_at": 500, "planned_branch_at": 1000, "history": True, "parent_blown_up_at": 300}
    assert "Branched at step 500, not the plan's 1000" in plan_render.markdown(report)
    assert b1["status"] == "complete" and _test(report, "HC", "mcnemar")["pairs"] == 2
