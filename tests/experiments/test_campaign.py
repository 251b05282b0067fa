"""``mx-proxy campaign`` at smoke size: every kind of run, exported and read back, and its figures."""

import dataclasses
import json
import os

import numpy as np
import pandas as pd
import pytest

from mx_proxy.cli import main as cli
from mx_proxy.experiments import campaign, scales
from mx_proxy.viz import figures

from conftest import dead_pid


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("campaign")
    index = campaign.run("smoke", out, progress=False, log=lambda *_: None)
    return out, index


def test_plan_lists_the_grid_the_paired_runs_and_the_controls():
    entries = campaign.plan("paper")
    grid = [e for e in entries if e.kind == "grid"]
    assert len(grid) == 2 * 4 * 4  # widths x recipes x LRs (Fig. 2)
    assert {e.config.recipe.name for e in grid} == {"fp32", "paper_mix", "paper_fp6", "paper_e4m3"}
    assert all(e.config.batch == 2048 and e.config.depth == 4 and e.config.steps == 7000 for e in grid)
    paired = [e for e in entries if e.kind == "paired"]
    assert [e.config.recipe.name for e in paired] == ["paper_e4m3", "mxfp8_e4m3"]
    for e in paired:
        c = e.config
        assert c.width == 512 and c.steps == 9000 and c.paired_run and c.lr == 6e-4 and c.dot == "bf16"
        assert c.checkpoint_at == (4500, 4700, 4900, 5080, 5200) and c.checkpoint_every == 500
        assert c.diagnostics_every <= 50
    controls = {e.label for e in entries if e.kind == "control"}
    assert "control-w512-fp32-vs-fp32-seed+1-s0" in controls and "control-w512-bf16-vs-fp32-s0" in controls
    assert len({e.label for e in entries}) == len(entries)


def test_plan_rejects_unknown_parts_and_scales_without_a_campaign():
    with pytest.raises(ValueError, match="unknown campaign part.*valid: grid, paired, control, intervention"):
        campaign.plan("smoke", ("grid", "figs"))
    with pytest.raises(ValueError, match="has no campaign; scales with one: smoke, medium, paper"):
        campaign.plan("quick")


@pytest.mark.e2e
def test_smoke_campaign_exports_every_kind_and_loads_back(smoke):
    out, index = smoke
    assert set(index["kind"]) == set(campaign.KINDS)
    assert (index["code_version"].str.len() == 16).all()
    runs = campaign.load_results(out / "results")
    assert len(runs) == len(index)
    paired = [r for r in runs if r.info["kind"] == "paired"]
    d = paired[0].metrics.dropna(subset=["zeta_paper"])
    assert len(d) and {"zeta_bound", "cosine", "cosine_paper", "ln_clamp_frac", "ref_loss"} <= set(d.columns)
    for r in runs:  # metrics round-trip bit for bit through the results folder
        cfg = json.loads((out / "results" / r.info["label"] / "config.json").read_text())
        assert cfg["width"] == r.config.width
    children = [r for r in runs if r.info["kind"] == "intervention"]
    assert {r.info["intervention"]["apply"][0] for r in children} == {"fp32", "paper_no_ln_quant", "paper_bump"}
    (parent,) = [r for r in paired if r.config.recipe.name == scales.get("smoke").campaign.paired_recipes[0]]
    for c in children:  # a child shares its parent's metrics before the intervention step
        at = c.info["intervention"]["at_step"]
        before = c.metrics[c.metrics.step < at]
        pd.testing.assert_frame_equal(before[["step", "loss"]], parent.metrics[parent.metrics.step < at][
            ["step", "loss"]].reset_index(drop=True))
    assert pd.read_csv(out / "results" / "index.csv").shape[0] == len(index)


@pytest.mark.e2e
def test_an_export_is_the_same_bytes_whatever_order_the_interventions_keys_came_in(smoke, tmp_path):
    out, _ = smoke
    child = next(r for r in campaign.load_results(out / "results") if r.info["kind"] == "intervention")
    reordered = dict(reversed(list(child.info["intervention"].items())))  # as a fresh run holds it, unsorted
    a = campaign.export(child, "a", "intervention", tmp_path / "a")
    child.info["intervention"] = reordered
    b = campaign.export(child, "a", "intervention", tmp_path / "b")
    assert (a / "run.json").read_bytes() == (b / "run.json").read_bytes()


@pytest.mark.e2e
def test_paired_recipes_share_one_fp32_run(smoke):
    out, _ = smoke
    paired = [r for r in campaign.load_results(out / "results", ("paired",))]
    assert sorted(r.config.recipe.name for r in paired) == ["mxfp8_e4m3", "paper_e4m3"]
    np.testing.assert_array_equal(paired[0].metrics["ref_loss"].values, paired[1].metrics["ref_loss"].values)
    assert paired[0].metrics["zeta_paper"].notna().all()  # the paper's zeta every step


@pytest.mark.e2e
def test_interventions_after_divergence_skip_a_stable_parent(smoke):
    out, _ = smoke
    s = scales.get("smoke")
    s = dataclasses.replace(s, campaign=dataclasses.replace(s.campaign, interventions_after_divergence=True))
    lines = []
    campaign.run(s, out, kinds=("paired", "intervention"), progress=False, log=lines.append)
    assert sum("no interventions needed" in line for line in lines) == 2


@pytest.mark.e2e
def test_the_late_intervention_replays_to_a_step_without_a_checkpoint(tmp_path, monkeypatch):
    s = scales.get("smoke")  # paired runs of 60 steps, checkpointed at 30
    s = dataclasses.replace(s, campaign=dataclasses.replace(
        s.campaign, paired_recipes=("paper_e4m3",), interventions=("fp32",), controls=(),
        interventions_after_divergence=True, late_intervention=10))
    monkeypatch.setattr(campaign.analysis, "unstable_at", lambda run: 55)  # as if it blew up at 55
    lines = []
    index = campaign.run(s, tmp_path, kinds=("paired", "intervention"), progress=False, log=lines.append)
    assert any("replayed from step 30 to 40: losses identical to the run's" in line for line in lines)
    children = {r.info["intervention"]["at_step"]: r for r in campaign.load_results(tmp_path / "results")
                if r.info["kind"] == "intervention"}
    assert sorted(children) == [30, 40] and set(index["kind"]) == {"paired", "intervention"}
    assert children[40].info["intervention"]["replay"]["identical"]
    assert "replay" not in children[30].info["intervention"]
    (parent,) = campaign.load_results(tmp_path / "results", ("paired",))
    before = children[40].metrics[children[40].metrics.step < 40]
    np.testing.assert_array_equal(before["loss"], parent.metrics["loss"][:40])


def test_seconds_per_step_times_a_twin_group():
    c = scales.get("smoke").config.replace(paired_run=True, steps=20)
    one = campaign.seconds_per_step([c.replace(recipe="mxfp8_e4m3")])
    both = campaign.seconds_per_step([c.replace(recipe="mxfp8_e4m3"), c.replace(recipe="paper_e4m3")])
    assert 0 < one and 0 < both


@pytest.mark.e2e
def test_a_second_campaign_call_loads_everything(smoke):
    out, index = smoke
    again = campaign.run("smoke", out, kinds=("paired", "control"), progress=False, log=lambda *_: None)
    assert again.shape[0] == index.shape[0]


@pytest.mark.e2e
def test_headline_figures_come_from_the_largest_scale_with_results(smoke, tmp_path, monkeypatch):
    out, _ = smoke
    root = tmp_path / "results"
    root.mkdir()
    (root / "smoke").symlink_to(out / "results")
    scale, runs = figures.headline_source(("paired",), root)
    assert scale == "smoke" and runs
    written = figures.generate(["headline_zeta", "headline_interventions"], scale="smoke", out=str(tmp_path / "f"),
                               results=str(root), log=lambda *_: None)
    assert len(written) == 2
    with pytest.raises(ValueError, match="needs campaign results"):
        figures.generate(["headline_zeta"], scale="smoke", out=str(tmp_path / "f"), results=str(tmp_path / "empty"),
                         log=lambda *_: None)


@pytest.mark.e2e
def test_campaign_figures_draw_everything_a_results_folder_holds(smoke, tmp_path):
    out, _ = smoke
    paths = figures.campaign_figures(out / "results", out=str(tmp_path))
    assert sorted(p.rsplit("/", 1)[-1] for p in paths) == sorted(f"{n}.png" for n in figures.HEADLINE)


def test_seeds_replace_the_scales_seeds_of_paired_runs_and_controls():
    s = scales.with_seeds("paper", (1, 2))
    entries = campaign.plan(s, ("paired", "control"))
    assert sorted(e.label for e in entries if e.kind == "paired") == [
        f"paired-w512-{r}-lr6e-4-s{k}" for r in ("mxfp8_e4m3", "paper_e4m3") for k in (1, 2)]
    assert {e.config.seed for e in entries} == {1, 2}
    assert {e.config.reference_seed for e in entries if "seed+1" in e.label} == {2, 3}
    assert scales.with_seeds("paper", None) is scales.get("paper")
    for bad in ((), (1, 1), (-1,), (True,)):
        with pytest.raises(ValueError, match="campaign seeds must be distinct non-negative integers"):
            scales.with_seeds("paper", bad)
    with pytest.raises(ValueError, match="has no campaign"):
        scales.with_seeds("quick", (1,))


def test_cli_campaign_reports_bad_input_with_status_2(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        cli.main(["campaign", "--scale", "quick", "--out", str(tmp_path)])
    assert e.value.code == 2
    assert "invalid choice: 'quick'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["campaign", "--scale", "smoke", "--out", str(tmp_path), "--only", "everything"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        cli.main(["campaign", "--scale", "smoke", "--out", str(tmp_path), "--seeds", "3", "3", "--status"])
    assert e.value.code == 2 and "got [3, 3]" in capsys.readouterr().err


def test_every_scale_campaign_is_consistent():
    for name in scales.names():
        c = scales.get(name).campaign
        if c is None:
            continue
        for kind in campaign.KINDS[:3]:
            for e in campaign.plan(name, (kind,)):
                assert e.config.recipe.name in e.label or kind == "control"


def _fake_partial(out, entry, metrics, steps, mark):
    """A training folder of ``entry`` holding checkpoints at ``steps`` (meta and metrics only: what --status reads)."""
    folder = out / "runs" / f"{entry.config.hash()}.partial-{mark}" / "checkpoints"
    for s in steps:
        d = folder / f"step_{s:09d}"
        d.mkdir(parents=True)
        (d / "meta.json").write_text(json.dumps({"step": s}))
        metrics[metrics.step < s].to_parquet(d / "metrics.parquet")
    return folder.parent


@pytest.mark.e2e
def test_status_reads_done_partial_and_missing_runs_without_training(smoke, tmp_path):
    from mx_proxy.experiments import campaign_status

    out, _ = smoke
    done = campaign_status.status("smoke", out)
    assert (done["state"] == "done").all() and len(done) == len(campaign.plan("smoke", ("paired", "control", "grid")))
    assert (done["step"] == done["steps"]).all() and (done["eta_h"] == 0).all()
    paired = done[done["kind"] == "paired"]
    assert paired["zeta_median"].notna().all() and paired["vs_fp32_pct"].notna().all()

    # a copy of the smoke campaign in which one paired run was killed after its second checkpoint
    fresh = tmp_path / "camp"
    first, second = campaign.plan("smoke", ("paired",))[:2]
    metrics = pd.read_parquet(out / "results" / first.label / "metrics.parquet")
    n = first.config.steps
    killed_folder = _fake_partial(fresh, first, metrics, (n // 6, n // 3, n // 2), dead_pid())
    for s, t in ((n // 6, 1000.0), (n // 3, 1000.0 + 3 * (n // 6)), (n // 2, 9000.0)):  # 3 s/step, then a pause
        os.utime(killed_folder / "checkpoints" / f"step_{s:09d}", (t, t))
    _fake_partial(fresh, second, metrics, (n // 4,), f"{os.getpid()}")  # a live trainer's (this process's)
    table = campaign_status.status("smoke", fresh, ("paired",)).set_index("label")
    killed, live = table.loc[first.label], table.loc[second.label]
    assert killed["state"] == "interrupted" and killed["step"] == n // 2 and killed["s_per_step"] == 3.0
    assert killed["eta_h"] == pytest.approx(3.0 * (n - n // 2) / 3600)
    assert live["state"] == "training" and live["step"] == n // 4 and np.isnan(live["s_per_step"])
    expected = metrics[metrics.step < n // 2]
    assert killed["zeta_median"] == pytest.approx(float(expected["zeta_bound"].median()))
    assert killed["loss"] == pytest.approx(float(expected["loss"].tail(100).mean()))
    assert not (fresh / "results").exists()  # nothing trained, nothing exported
    empty = campaign_status.status("smoke", tmp_path / "nothing", ("paired",))
    assert (empty["state"] == "not started").all() and (empty["step"] == 0).all()


@pytest.mark.e2e
def test_cli_campaign_status_prints_the_table(smoke, capsys):
    out, _ = smoke
    assert cli.main(["campaign", "--scale", "smoke", "--out", str(out), "--status", "--only", "paired"]) == 0
    text = capsys.readouterr().out
    assert "state" in text and "done" in text and "paired-" in text and "grid-" not in text
    assert cli.main(["campaign", "--scale", "smoke", "--out", str(out), "--status", "--widths", "7"]) == 0
    assert "no planned runs" in capsys.readouterr().out
    assert cli.main(["campaign", "--scale", "smoke", "--out", str(out), "--status", "--only", "paired",
                     "--seeds", "5"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("paired-")]
    assert rows and all("-s5" in r and "not started" in r for r in rows)


def test_headline_numbers_of_a_diverged_run_look_at_the_steps_before_it():
    from mx_proxy.experiments import analysis
    from mx_proxy.training.config import Config
    from mx_proxy.training.result import Run

    steps = np.arange(1000)
    m = pd.DataFrame({"step": steps, "loss": np.where(steps < 900, 1.0, np.inf), "ref_loss": 0.8,
                      "zeta_bound": np.where(steps % 20 == 0, np.where(steps < 400, 0.5, 2.0), np.nan),
                      "zeta_paper": np.where(steps < 400, 1.0, 3.0), "ln_clamp_frac": np.nan})
    h = analysis.headline(Run(Config(steps=1000), m, 900))
    assert h["loss"] == 1.0 and h["vs_fp32_pct"] == pytest.approx(25.0)
    assert h["zeta_max"] == 2.0 and h["zeta_paper_max"] == 3.0  # the diverged steps never count
    assert h["zeta_before"] == 2.0 and h["zeta_paper_before"] == 3.0  # steps 400..899: all after the change
    assert np.isnan(h["ln_clamp_max"]) and h["clamp_window"] is None
    stable = analysis.headline(Run(Config(steps=1000), m[m.step < 900], None))
    assert "zeta_before" not in stable and stable["zeta_median"] == 2.0  # 25 diagnostic steps at 2.0, 20 at 0.5


def test_interventions_start_before_a_divergence_or_a_blowup_and_from_the_newest_checkpoint_before_it():
    from mx_proxy.training.config import Config
    from mx_proxy.training.result import Run

    def parent(loss_at=None, diverged_at=None, steps=8000):
        loss = np.full(steps, 0.1)
        if loss_at is not None:
            loss[loss_at:] = 30.0  # 300×: a blow-up the engine's one-step rule would have caught only at 100×
        m = pd.DataFrame({"step": np.arange(steps), "loss": loss})
        run = Run(Config(steps=steps), m, diverged_at)
        run.checkpoints = {t: None for t in (500, 1000, 4500, 5000, 5080, 5500, 6000, 6500, 7000, 7500)}
        return run

    after = scales.Campaign(paired_recipes=("paper_e4m3",), paired_widths=(32,), paired_lrs=(6e-4,), paired_steps=8000,
                            intervention_steps=(4500, 5080), interventions=("fp32",),
                            interventions_after_divergence=True)
    assert campaign.intervention_steps(after, parent(loss_at=6841)) == [4500, 5080, 6500]
    assert campaign.intervention_steps(after, parent(diverged_at=5300)) == [4500, 5080]  # 5080: the newest before
    assert campaign.intervention_steps(after, parent(diverged_at=4700)) == [4500]
    assert campaign.intervention_steps(after, parent()) == []  # stable: nothing to save
    always = dataclasses.replace(after, interventions_after_divergence=False)
    assert campaign.intervention_steps(always, parent()) == [4500, 5080]
    assert campaign.intervention_steps(always, parent(diverged_at=5000)) == [4500]
    late = dataclasses.replace(after, late_intervention=20)  # 20 steps before, down to a diagnostics step
    every = Config().diagnostics_every
    assert campaign.intervention_steps(late, parent(loss_at=6841)) == [4500, 5080, 6500, (6841 - 20) // every * every]
    assert campaign.intervention_steps(late, parent(diverged_at=5300)) == [4500, 5080, (5300 - 20) // every * every]
    assert campaign.intervention_steps(late, parent()) == []
    with pytest.raises(ValueError, match="late_intervention must be a number of steps >= 0, got -1"):
        dataclasses.replace(after, late_intervention=-1)
