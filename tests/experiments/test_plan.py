"""The pre-registered plan (docs/plan.json, docs/plan.md) and its queue."""

import copy
import json
import shutil
import statistics

import numpy as np
import pytest
from scipy.stats import binomtest

from mx_proxy.experiments import plan as P
from mx_proxy.experiments import plan_doc, plan_queue, power
from mx_proxy.experiments.ensemble_result import load as load_ensemble
from mx_proxy.experiments.ensemble_spec import read_spec

DOC = P.PLAN_FILE.with_suffix(".md")


@pytest.fixture(scope="module")
def plan():
    return P.load()


@pytest.fixture(scope="module")
def raw():
    return json.loads(P.PLAN_FILE.read_text())


def test_committed_plan_is_valid_and_as_the_issue_asks(plan):
    h1, h2 = plan.study("h1"), plan.study("h2")
    # H1: the 2 x 2 plus mxfp8_e4m3 at the paper's setting, >= 36 seeds, all arms on the same seeds
    assert set(h1.ensemble().arms) == {"paper_e4m3", "train_ln_bias", "fp32_keep_bias", "fp32", "mxfp8_e4m3"}
    assert h1.members >= 36 and h1.ensemble().kind == "seed"
    base = h1.ensemble().base
    assert (base.width, base.depth, base.batch, base.lr, base.steps) == (512, 4, 2048, 6e-4, 9000)
    recipes = {a: h1.ensemble().recipe(a) for a in h1.ensemble().arms}
    assert not recipes["paper_e4m3"].train_ln_bias and recipes["train_ln_bias"].train_ln_bias
    assert recipes["fp32"].name == "fp32"
    assert recipes["fp32_keep_bias"].replace(name="fp32", train_ln_bias=True) == recipes["fp32"]
    assert not recipes["fp32_keep_bias"].train_ln_bias and recipes["fp32"].train_ln_bias
    # H2: >= 32 members an arm, forward-only and bf16 activations among the mitigations, a parent to branch from
    assert h2.members >= 32 and {"paper_forward_only", "bf16_activations"} <= set(h2.ensemble().arms)
    assert h2.parent is not None and h2.parent.steps == h2.ensemble().branch_at
    # H4: >= 37 seeds on each machine, the same seeds
    cpu, gpu = plan.study("h4-cpu"), plan.study("h4-gpu")
    assert cpu.members >= 37 and cpu.ensemble().seeds() == gpu.ensemble().seeds()
    assert cpu.ensemble().base == gpu.ensemble().base
    f32 = plan.study("h4-cpu-f32dot").ensemble()
    assert f32.base == cpu.ensemble().base.replace(dot="f32")
    # the plan's seeds are not the pilot's
    assert min(h1.ensemble().seeds()) > 16 and min(cpu.ensemble().seeds()) > 16


def test_units_run_in_order_with_every_arm_on_the_same_seeds(plan):
    gpu = P.units(plan, "gpu")
    assert [u.study.id for u in gpu][:5] == ["h1"] * 5
    assert [u.study.id for u in gpu][5] == "h2"
    assert gpu[0].label == "h1 seeds 101-108" and gpu[0].member_steps() == 5 * 8 * 9000
    for sid in ("h1", "h2", "h4-gpu"):
        mine = [u for u in gpu if u.study.id == sid]
        assert [(u.start, u.stop) for u in mine] == [(i, i + 8) for i in range(0, 40, 8)]
    cpu = P.units(plan, "cpu")
    assert [u.study.id for u in cpu] == ["h4-cpu"] * 10 + ["h4-cpu-f32dot"] * 10
    with pytest.raises(ValueError, match="unknown machine 'tpu'; valid: gpu, cpu"):
        P.units(plan, "tpu")


def test_plan_md_tables_are_computed_from_the_plan(plan):
    text = DOC.read_text()
    assert plan_doc.with_tables(text, plan) == text, \
        "run: python -m mx_proxy.experiments.plan_doc --update docs/plan.md"


def test_power_table_against_independent_computations(plan):
    t = P.power_table(plan)
    row = t[(t.hypothesis == "H1") & (t.level == "alpha") & (t.control_rate == 0.1)].iloc[0]
    above = row.detectable_above
    # by definition: the power at `above` reaches 80 %, one grid step below it does not
    assert power.mcnemar_power(0.1, above, 40) >= 0.8 > power.mcnemar_power(0.1, above - 1 / power.GRID, 40)
    # the power itself, by simulation of 40 independent pairs (an independent computation)
    rng = np.random.default_rng(0)
    a, b = rng.random((20000, 40)) < 0.1, rng.random((20000, 40)) < above
    only_a, only_b = (a & ~b).sum(1), (~a & b).sum(1)
    pairs = list(zip(only_a.tolist(), only_b.tolist()))
    rejected = {(x, y): x + y > 0 and binomtest(x, x + y).pvalue <= 0.05 for x, y in set(pairs)}
    rejects = [rejected[p] for p in pairs]
    assert abs(np.mean(rejects) - power.mcnemar_power(0.1, above, 40)) < 0.015
    holm = t[(t.hypothesis == "H1") & (t.level == "holm_first")].alpha.iloc[0]
    assert holm == pytest.approx(0.05 / 4)
    # the AUC row: 0.5 + (z_0.975 + z_0.8) * sqrt(41 / (12 * 400))
    z = statistics.NormalDist().inv_cdf
    assert P.detectable_auc(20, 20) == pytest.approx(0.5 + (z(0.975) + z(0.8)) * (41 / 4800) ** 0.5)


def test_cost_table_counts_member_steps(plan):
    c = P.cost_table(plan).set_index("study")
    assert c.loc["h1", "member_steps"] == 5 * 40 * 9000
    assert c.loc["h2", "member_steps"] == 10 * 40 * 1000 + 5000  # and the parent's steps
    assert c.loc["h1", "minutes_today"] == pytest.approx(5 * 40 * 9000 / 185 / 60)
    assert c.loc["h4-cpu", "minutes_today"] == pytest.approx(40 * 7000 * (1 / 7.4 + 2 / 11.0) / 60)


@pytest.mark.parametrize("path, value, message", [
    (("studies", 0, "machine"), "tpu", "unknown machine 'tpu'; valid: gpu, cpu"),
    (("studies", 0, "unit"), 7, r"unit \(7\) must be a positive divisor of members \(40\)"),
    (("studies", 0, "setting"), "huge", "unknown setting 'huge'; valid: paper, unstable"),
    (("hypotheses", 0, "primary", "b"), "rceil", "arm 'rceil' is not an arm of study 'h1'"),
    (("hypotheses", 3, "primary", "b"), "h9/fp32", "the plan has no study 'h9'"),
    (("hypotheses", 0, "primary", "test"), "t_test", "unknown test 't_test'; valid: mcnemar"),
    (("order", "gpu"), ["h1", "h2"], r"order\['gpu'\] must list each gpu study once"),
    (("correction",), "bonferroni", "unknown correction 'bonferroni'; valid: holm"),
    (("studies", 0, "arms"), ["fp32", "nonesuch"], "unknown arm 'nonesuch'"),
])
def test_bad_plans_are_refused_naming_the_value(raw, tmp_path, path, value, message):
    d = copy.deepcopy(raw)
    node = d
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=message):
        P.load(f)
    assert str(f) in str(pytest.raises(ValueError, P.load, f).value)


def test_missing_and_damaged_plan_files(tmp_path):
    with pytest.raises(ValueError, match="no plan there"):
        P.load(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        P.load(tmp_path / "bad.json")
    assert plan_queue.main(["cpu", "--store", str(tmp_path / "s"), "--export", str(tmp_path / "e"),
                            "--plan", str(tmp_path / "bad.json")]) == 2
    assert not (tmp_path / "s").exists() and not (tmp_path / "e").exists()


TINY = {"width": 16, "depth": 1, "batch": 32, "lr": 0.001, "steps": 12, "dot": "f32", "recipe": "fp32",
        "diagnostics_every": 4, "gradient_reference": "same_point", "val_every": 0}


def _tiny_plan(raw, tmp_path):
    d = copy.deepcopy(raw)
    d["settings"] = {"tiny": TINY}
    d["studies"] = [
        {"id": "t-seed", "hypothesis": "H1", "machine": "cpu", "kind": "seed", "setting": "tiny",
         "arms": ["fp32", "bf16"], "first_seed": 101, "members": 2, "unit": 1, "horizon": 12, "checkpoint_every": 4},
        {"id": "t-branch", "hypothesis": "H2", "machine": "cpu", "kind": "branch", "setting": "tiny",
         "parent": {"recipe": "bf16", "seed": 0, "data_seed": 0}, "branch_at": 8,
         "arms": ["unchanged", "fp32"], "first_seed": 1, "members": 1, "unit": 1, "horizon": 4,
         "checkpoint_every": 4}]
    d["order"] = {"cpu": ["t-seed", "t-branch"]}
    d["hypotheses"] = [
        {"id": "H1", "study": "t-seed", "question": "?", "primary": {"test": "mcnemar", "a": "fp32", "b": "bf16"}},
        {"id": "H2", "study": "t-branch", "question": "?",
         "primary": {"test": "mcnemar", "a": "unchanged", "b": "fp32"}}]
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(d))
    return P.load(f)


def test_queue_trains_exports_skips_and_resumes_from_exports(raw, tmp_path):
    plan = _tiny_plan(raw, tmp_path)
    store, export = tmp_path / "store", tmp_path / "export"
    logged = []
    first = plan_queue.run_queue(plan, "cpu", store, export, seconds=0.0, progress=False, log=logged.append)
    assert first == [] and "t-seed seeds 101-101 and the units after it not started" in logged[0]
    done = plan_queue.run_queue(plan, "cpu", store, export, progress=False, log=logged.append)
    assert [u.label for u in done] == ["t-seed seeds 101-101", "t-seed seeds 102-102", "t-branch seeds 1-1"]
    assert logged[-1] == "plan queue: 0 cpu units left"
    seed_spec = read_spec(export / "t-seed")
    assert seed_spec == plan.study("t-seed").ensemble()
    result = load_ensemble(export / "t-seed")
    assert result.rates()["members"].tolist() == [2, 2]
    # a second call, and a fresh store that starts from the exports, train nothing
    assert plan_queue.run_queue(plan, "cpu", store, export, progress=False, log=logged.append) == []
    assert plan_queue.pending(plan, "cpu", export) == []
    # a member whose export is lost is trained again, bit for bit the same
    before = (export / "t-seed" / "bf16-m01" / "run.json").read_text()
    metrics = load_ensemble(export / "t-seed").runs["bf16"][1].metrics
    shutil.rmtree(export / "t-seed" / "bf16-m01")
    fresh = tmp_path / "fresh-store"
    again = plan_queue.run_queue(plan, "cpu", fresh, export, progress=False, log=logged.append)
    assert [u.label for u in again] == ["t-seed seeds 102-102"]
    assert json.loads((export / "t-seed" / "bf16-m01" / "run.json").read_text())["key"] == json.loads(before)["key"]
    assert load_ensemble(export / "t-seed").runs["bf16"][1].metrics.equals(metrics)


def _members(export, plan):
    """{(study, arm, member): (metrics, key)} of every member exported in ``export``."""
    out = {}
    for s in plan.studies:
        if not (export / s.id).is_dir():
            continue
        for arm, runs in load_ensemble(export / s.id).runs.items():
            for i, r in enumerate(runs):
                if r is not None:
                    out[(s.id, arm, i)] = (r.metrics, r.info.get("key"))
    return out


def _same_members(a: dict, b: dict):
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k][1] == b[k][1] and a[k][0].equals(b[k][0]), k


def test_a_budget_cuts_a_unit_at_a_segment_and_the_resumed_queue_ends_as_an_uninterrupted_one(raw, tmp_path):
    plan = _tiny_plan(raw, tmp_path)
    whole = tmp_path / "whole"
    plan_queue.run_queue(plan, "cpu", whole / "store", whole / "export", progress=False, log=lambda *_: None)
    ticks = iter(range(10 ** 6))  # a clock that advances one "second" each time it is read: a deterministic cut

    def clock():
        return float(next(ticks))

    store, export, logged, calls = tmp_path / "store", tmp_path / "export", [], 0
    while plan_queue.pending(plan, "cpu", export) and calls < 40:
        plan_queue.run_queue(plan, "cpu", store, export, seconds=5, min_seconds=0, progress=False,
                             log=logged.append, clock=clock)
        calls += 1
    cuts = [line for line in logged if "cut short" in line]
    assert calls > 1 and cuts and "checkpointed" in cuts[0], logged
    assert any("member-steps of the members finished here" in line for line in logged)
    _same_members(_members(export, plan), _members(whole / "export", plan))


def test_a_window_resumes_from_committed_members_and_exports_only_new_ones(raw, tmp_path):
    plan = _tiny_plan(raw, tmp_path)
    committed, logged = tmp_path / "results", []
    done = plan_queue.run_queue(plan, "cpu", tmp_path / "store1", committed, progress=False, log=logged.append)
    assert [u.label for u in done][:1] == ["t-seed seeds 101-101"]
    shutil.rmtree(committed / "t-seed" / "bf16-m01")
    shutil.rmtree(committed / "t-branch")
    out = tmp_path / "OUT"  # a new window: a fresh machine (store), the committed members in its tree
    again = plan_queue.run_queue(plan, "cpu", tmp_path / "store2", out, committed=committed, progress=False,
                                 log=logged.append)
    assert [u.label for u in again] == ["t-seed seeds 102-102", "t-branch seeds 1-1"]
    assert plan_queue.pending(plan, "cpu", out, committed=committed) == []
    fp32 = sorted(p.name for p in (out / "t-seed").iterdir() if (p / "run.json").exists())
    assert fp32 == ["bf16-m01", "fp32-m01"]  # only the unit trained here; the committed members are not copied


def test_the_lean_queue_trains_the_same_losses_and_refuses_a_group_that_does_not_fit_a_unit(raw, tmp_path):
    plan = _tiny_plan(raw, tmp_path)
    plan_queue.run_queue(plan, "cpu", tmp_path / "s1", tmp_path / "full", progress=False, log=lambda *_: None)
    plan_queue.run_queue(plan, "cpu", tmp_path / "s2", tmp_path / "lean", lean=True, progress=False,
                         log=lambda *_: None)
    assert read_spec(tmp_path / "lean" / "t-branch").diagnostics == 0  # no hypothesis scores its signals
    full, lean = _members(tmp_path / "full", plan), _members(tmp_path / "lean", plan)
    assert sorted(full) == sorted(lean)
    for k in full:  # the loss every step, bit for bit (a CPU), with and without the diagnostics
        assert np.array_equal(full[k][0]["loss"].to_numpy(), lean[k][0]["loss"].to_numpy()), k
    # a study's export folder holds one mode's members
    with pytest.raises(ValueError, match="diagnostics_every"):
        plan_queue.run_queue(plan, "cpu", tmp_path / "s1", tmp_path / "full", lean=True, progress=False,
                             log=lambda *_: None)
    assert plan_queue.main(["cpu", "--store", str(tmp_path / "s3"), "--export", str(tmp_path / "e3"),
                            "--plan", str(tmp_path / "plan.json"), "--group-size", "2"]) == 2
    assert not (tmp_path / "s3").exists() and not (tmp_path / "e3").exists()
