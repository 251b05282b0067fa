"""Ensembles end to end at width 16: branch members, pairing across arms, the twin, resume, export, CLI."""

import json

import jax
import numpy as np
import pandas as pd
import pytest

import mx_proxy as mxp
from mx_proxy.cli import main as cli
from mx_proxy.experiments import branch, ensemble_result, ensemble_status, report
from mx_proxy.experiments import ensemble as E
from mx_proxy.viz import plots

PARENT = mxp.Config(width=16, depth=2, batch=32, steps=40, lr=3e-3, recipe="paper_e4m3", paired_run=True,
                    diagnostics_every=5, checkpoint_at=(20,))


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    return mxp.train(PARENT, store=tmp_path_factory.mktemp("parent"), progress=False)


def _spec(parent, **kw):
    kw = dict(dict(name="t", kind="branch", base=parent.config, arms=("unchanged", "twin", "fp32"), members=4,
                   horizon=20, branch_at=20, checkpoint_every=10), **kw)
    return E.Ensemble(**kw)


@pytest.fixture(scope="module")
def trained(parent, tmp_path_factory):
    out = tmp_path_factory.mktemp("ens")
    spec = _spec(parent, epsilon=1e-3)
    runs = E.run(spec, out, source=parent, progress=False, log=lambda *_: None)
    return spec, out, runs


def test_a_member_on_the_parents_own_data_stream_is_the_parent(parent, tmp_path):
    spec = _spec(parent, arms=("unchanged", "twin"), members=1, first_seed=PARENT.data_seed)
    runs = E.run(spec, tmp_path, source=parent, progress=False, log=lambda *_: None)
    (member,) = runs["unchanged"]
    own = parent.metrics[parent.metrics["step"] >= 20].reset_index(drop=True)
    got = member.metrics[member.metrics["step"] >= 20].reset_index(drop=True)
    np.testing.assert_array_equal(got["loss"].to_numpy(), own["loss"].to_numpy())
    np.testing.assert_array_equal(got["ref_loss"].to_numpy(), own["ref_loss"].to_numpy())
    twin = mxp.load_ensemble(tmp_path).runs["twin"][0]
    np.testing.assert_array_equal(twin.metrics.set_index("step").loc[20:, "loss"].to_numpy(), own["ref_loss"])


def test_arms_are_paired_member_by_member(trained):
    spec, out, runs = trained
    for i in range(spec.members):
        seeds = {runs[a][i].config.data_seed for a in ("unchanged", "fp32")}
        assert seeds == {spec.first_seed + i}
        assert runs["unchanged"][i].info["perturbation"] == {"seed": spec.first_seed + i, "epsilon": 1e-3}
    assert len({r.final_loss for r in runs["unchanged"]}) == spec.members  # each its own stream
    res = mxp.load_ensemble(out)
    for i in range(spec.members):  # the twin arm is the unchanged members' paired FP32 run
        u, t = runs["unchanged"][i].metrics, res.runs["twin"][i].metrics
        both = u[u["step"] >= 20 - E.HISTORY][["step", "ref_loss"]].merge(t[["step", "loss"]], on="step")
        np.testing.assert_array_equal(both["ref_loss"].to_numpy(), both["loss"].to_numpy())


def test_an_exported_member_whose_store_entry_is_stale_loads_from_its_export_unreported(trained, tmp_path, recwarn):
    """Resuming under changed numerics code: the export is the member's result, so its stale store entry is neither
    read nor reported as "training it again"; a current entry is still served from the store, info and all."""
    import shutil

    from mx_proxy.runner import loop as runner
    from mx_proxy.store.run_store import Store, StoreWarning
    spec, out, runs = trained
    shutil.copytree(out, tmp_path / "e", ignore=shutil.ignore_patterns("checkpoints"))
    st, parent_key = Store(tmp_path / "e" / "runs"), branch.read(tmp_path / "e" / "branch").key
    key = E.member_key(spec, "fp32", 0, parent_key)
    meta = st.path(key) / "run.json"
    meta.write_text(json.dumps(dict(json.loads(meta.read_text()), code_version="0" * 16)))
    assert st.stale(key) and not st.stale(E.member_key(spec, "fp32", 1, parent_key)) and not st.stale("0" * 16)
    log = []
    runner.hooks.append(log.append)
    try:
        got = E.train_unit(tmp_path / "e", "fp32", (0, 1), progress=False)
    finally:
        runner.hooks.remove(log.append)
    assert log == [] and not [w for w in recwarn if issubclass(w.category, StoreWarning)]
    assert got[0].path == str(tmp_path / "e" / "results" / E.member_label("fp32", 0))  # from its export
    assert got[1].info["perturbation"] == runs["fp32"][1].info["perturbation"]  # from the store
    np.testing.assert_array_equal(got[0].metrics["loss"].to_numpy()[-20:], runs["fp32"][0].metrics["loss"][-20:])


def test_epsilon_perturbs_every_parameter_by_the_same_z_in_student_and_twin(parent, tmp_path):
    b = branch.read(branch.write(parent, 20, tmp_path / "b"))
    p = branch.perturb(b.state, 1e-2, 5)

    def z(before, after):
        pairs = [(np.asarray(x, np.float64), np.asarray(y, np.float64))
                 for x, y in zip(jax.tree.leaves(before), jax.tree.leaves(after))]
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.concatenate([np.where(x != 0, (y - x) / x / 1e-2, np.nan).ravel() for x, y in pairs])

    zs, zt = z(b.state.params, p.params), z(b.state.ref_params, p.ref_params)
    both = np.isfinite(zs) & np.isfinite(zt)  # a zero (the student's frozen LN bias) stays zero
    np.testing.assert_allclose(zs[both], zt[both], atol=1e-3)  # float32 rounding of x·(1 + εz) only
    assert abs(zs[both].mean()) < 0.1 and 0.9 < zs[both].std() < 1.1 and both.sum() > 4000
    assert branch.perturb(b.state, 0.0, 5) is b.state


def test_exports_report_status_and_figures(trained, tmp_path):
    spec, out, _ = trained
    res = ensemble_result.load(out / "results")
    assert set(res.table["arm"]) == {"unchanged", "twin", "fp32"} and len(res.table) == 12
    rates = res.rates()
    assert (rates["members"] == 4).all() and ((rates["low"] <= rates["p"]) & (rates["p"] <= rates["high"])).all()
    text = report.for_folder(out / "results")
    assert "P(blow-up), 95 % interval" in text and "McNemar" in text and "Which signal warns first" in text
    st = ensemble_status.status(out)
    assert (st["state"] == "done").all() and (st["member_steps_left"] == 0).all()
    exported = pd.read_parquet(out / "results" / E.member_label("fp32", 0) / "metrics.parquet")
    assert exported["step"].iloc[0] == 0 and exported["step"].iloc[-1] == 39  # from branch_at - HISTORY (clipped)
    for fn in (plots.survival, plots.blowup_rates, plots.trajectories):
        fn(res).savefig(tmp_path / f"{fn.__name__}.png")
        assert (tmp_path / f"{fn.__name__}.png").stat().st_size > 5000


class _Stop(Exception):
    pass


class _InterruptingBar:
    """A progress bar that interrupts the group once it has trained ``after`` member-steps."""

    def __init__(self, after):
        self.after, self.n = after, 0

    def update(self, n=1):
        self.n += n
        if self.n > self.after:
            raise _Stop


def test_an_interrupted_arm_resumes_to_the_uninterrupted_result(trained, parent, tmp_path):
    spec, out, runs = trained
    E.prepare(spec, tmp_path, source=parent)
    with pytest.raises(_Stop):  # killed after the checkpoint at step 30 (10 steps × 4 members past the branch)
        E.train_arm(tmp_path, "fp32", bar=_InterruptingBar(after=4 * 10))
    st = ensemble_status.status(tmp_path).set_index("arm")
    assert st.loc["fp32", "with_checkpoint"] == 4 and st.loc["fp32", "state"] in ("training", "interrupted")
    again = E.train_arm(tmp_path, "fp32", progress=False)
    assert all(r.info.get("resumed_from") == 30 for r in again)
    for a, b in zip(again, runs["fp32"]):
        pd.testing.assert_frame_equal(a.metrics.drop(columns=["val_loss"]), b.metrics.drop(columns=["val_loss"]))


def test_status_tells_an_arm_waiting_for_its_next_member_from_one_not_started(trained, tmp_path):
    import shutil

    spec, out, _ = trained
    shutil.copytree(out, tmp_path / "e", ignore=shutil.ignore_patterns("runs"))
    shutil.rmtree(tmp_path / "e" / "results" / E.member_label("fp32", 3))
    for i in range(spec.members):
        for arm in ("unchanged", "twin"):
            shutil.rmtree(tmp_path / "e" / "results" / E.member_label(arm, i))
    st = ensemble_status.status(tmp_path / "e").set_index("arm")
    assert st.loc["fp32", "done"] == 3 and st.loc["fp32", "state"] == "waiting"
    assert st.loc["unchanged", "done"] == 0 and st.loc["unchanged", "state"] == "not started"


def test_status_tells_a_member_training_before_its_first_checkpoint_from_one_left_by_a_dead_process(tmp_path):
    """A member's training folder whose process lives but has no checkpoint yet is ``training`` (no steps
    counted); one left without a checkpoint by a process that is gone restarts from the start: ``not started``."""
    import subprocess
    import sys

    from mx_proxy.store import durable

    base = mxp.Config(width=16, depth=2, batch=32, steps=20, lr=3e-3, diagnostics_every=5)
    spec = E.Ensemble("s", "seed", base, ("fp32", "mxfp8_e4m3"), 4, 20)
    E.prepare(spec, tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = durable.mark().partition("@")[2]
    (tmp_path / "runs" / f"{E.member_key(spec, 'fp32', 0, None)}.partial-{durable.mark()}").mkdir(parents=True)
    (tmp_path / "runs" / f"{E.member_key(spec, 'mxfp8_e4m3', 0, None)}.partial-{dead.stdout.strip()}@{host}").mkdir()
    st = ensemble_status.status(tmp_path).set_index("arm")
    assert st.loc["fp32", "state"] == "training" and st.loc["fp32", "with_checkpoint"] == 0
    assert st.loc["mxfp8_e4m3", "state"] == "not started"
    assert (st["member_steps_done"] == 0).all() and (st["member_steps_left"] == 4 * 20).all()


def test_cli_resumes_the_saved_spec_and_refuses_another(trained, parent, tmp_path, capsys):
    spec, out, _ = trained
    assert cli.main(["ensemble", "--out", str(out), "--quiet"]) == 0  # everything stored: loads and reports
    assert "P(blow-up)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        cli.main(["ensemble", "--out", str(out), "--kind", "branch", "--branch-at", "20", "--arms", "unchanged",
                  "fp32", "--members", "2", "--horizon", "20"])
    assert e.value.code == 2 and "holds another ensemble (differs in arms," in capsys.readouterr().err
    assert cli.main(["ensemble", "--out", str(out), "--status"]) == 0
    assert "member-steps left" in capsys.readouterr().out


@pytest.mark.parametrize("change,message", [
    (dict(arms=("unchanged", "bogus")), "unknown arm 'bogus'; valid: unchanged, twin, fp32"),
    (dict(arms=("fp32", "twin")), "the 'twin' arm"),
    (dict(kind="nope"), "unknown ensemble kind 'nope'; valid: seed, data, branch"),
    (dict(members=0), r"members must be an integer in \[1, 100000\], got 0"),
    (dict(epsilon=-1.0), "epsilon must be a finite number >= 0"),
    (dict(kind="seed"), "branch_at and epsilon belong to a branch ensemble"),
    (dict(checkpoint_every=7), r"checkpoint_every \(7\) must be a multiple of diagnostics_every \(5\)"),
    (dict(arms=("unchanged", "unchanged")), "arms must be distinct"),
])
def test_bad_specs_are_refused_naming_the_valid_choices(parent, change, message):
    with pytest.raises(ValueError, match=message):
        _spec(parent, **change)


def test_spec_round_trips_through_json(parent):
    spec = _spec(parent, epsilon=1e-4, first_seed=7)
    again = E.Ensemble.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec and again.config("rceil", 2) == spec.config("rceil", 2)
    assert spec.config("rceil", 2).recipe.name == "paper_e4m3+rceil" and spec.config("rceil", 2).data_seed == 9
    assert spec.config("unchanged", 0).paired_run and not spec.config("fp32", 0).paired_run


def test_seed_ensemble_members_differ_in_init_and_data(tmp_path, capsys):
    base = mxp.Config(width=16, depth=2, batch=32, steps=20, lr=3e-3, diagnostics_every=5)
    res = mxp.ensemble(base, kind="seed", arms=["fp32", "mxfp8_e4m3"], members=2, horizon=20, out=tmp_path,
                       checkpoint_every=10, progress=False)
    for arm in ("fp32", "mxfp8_e4m3"):
        assert [(r.config.seed, r.config.data_seed) for r in res.runs[arm]] == [(1, 1), (2, 2)]
    assert len(res.loss_gap()) == 1 and res.loss_gap()["reference"].iloc[0] == "fp32"
    assert capsys.readouterr().out == ""  # progress=False: silent, so a notebook's rerun prints what its run did
    again = mxp.ensemble(base, kind="seed", arms=["fp32", "mxfp8_e4m3"], members=2, horizon=20, out=tmp_path,
                         checkpoint_every=10)
    assert again.table.equals(res.table)
    assert capsys.readouterr().out.count(" done (") == 2  # with progress: a line per unit (here: loaded)


def test_units_split_arms_into_member_chunks_chunk_first(parent):
    spec = _spec(parent, members=5)
    assert E.units(spec, 2) == [("unchanged", (0, 1)), ("fp32", (0, 1)), ("unchanged", (2, 3)), ("fp32", (2, 3)),
                                ("unchanged", (4,)), ("fp32", (4,))]
    assert E.units(spec) == [("unchanged", (0, 1, 2, 3, 4)), ("fp32", (0, 1, 2, 3, 4))]
    with pytest.raises(ValueError, match="members \\[4, 9\\] of arm 'fp32': each once, in 0…4"):
        E._check_unit(spec, "fp32", [4, 9])


def test_a_member_does_not_depend_on_its_unit(trained, parent, tmp_path):
    spec, out, runs = trained
    again = E.run(spec, tmp_path, source=parent, group_size=3, progress=False, log=lambda *_: None)
    for arm in ("unchanged", "fp32"):
        for a, b in zip(again[arm], runs[arm]):
            pd.testing.assert_frame_equal(a.metrics.drop(columns=["val_loss"]), b.metrics.drop(columns=["val_loss"]))


def test_an_arm_may_change_one_intervenable_field(parent):
    spec = _spec(parent, arms=("unchanged", "adam_eps=1e-15", "lr=0.001"))
    assert spec.config("adam_eps=1e-15", 0).adam_eps == 1e-15 and spec.config("lr=0.001", 1).lr == 1e-3
    assert spec.config("adam_eps=1e-15", 0).recipe == parent.config.recipe
    with pytest.raises(ValueError, match="'width' is not a field an arm may change; valid: .*adam_eps"):
        _spec(parent, arms=("unchanged", "width=64"))


def test_an_ensemble_extends_with_arms_and_members_without_retraining(trained, parent, tmp_path):
    import shutil

    from mx_proxy.runner import loop as runner
    spec, out, runs = trained
    shutil.copytree(out, tmp_path / "e")
    more = _spec(parent, epsilon=1e-3, arms=spec.arms + ("adam_eps=1e-15",), members=5)
    assert E.extends(more, spec) and not E.extends(_spec(parent, arms=("unchanged", "fp32")), spec)
    log = []
    runner.hooks.append(log.append)
    try:
        again = E.run(more, tmp_path / "e", progress=False, log=lambda *_: None)
    finally:
        runner.hooks.remove(log.append)
    assert sorted((c.recipe.name, c.adam_eps, c.data_seed) for c in log) == sorted(
        [("paper_e4m3", 1e-15, s) for s in range(1, 6)] + [("paper_e4m3", 1e-8, 5), ("fp32", 1e-8, 5)])
    pd.testing.assert_frame_equal(again["fp32"][0].metrics, runs["fp32"][0].metrics)


def test_status_names_each_arms_slurm_jobs_and_an_arm_whose_jobs_ended_is_interrupted(tmp_path):
    """The per-arm table joined with the units' jobs (as ``ensemble_status.jobs`` reads them from the submission
    record and ``sacct``): a training folder on another node cannot be judged alive by its name, its job can."""
    base = mxp.Config(width=16, depth=2, batch=32, steps=20, lr=3e-3, diagnostics_every=5)
    spec = E.Ensemble("s", "seed", base, ("fp32", "mxfp8_e4m3"), 4, 20)
    E.prepare(spec, tmp_path)
    table = ensemble_status.status(tmp_path)
    table.loc[:, "state"] = "training"  # what a training folder of a live-looking (another host's) process says
    units = pd.DataFrame({"unit": ["s: fp32 m00-m01", "s: fp32 m02-m03", "s: mxfp8_e4m3 m00-m01"],
                          "labels": [["fp32-m00", "fp32-m01"], ["fp32-m02", "fp32-m03"],
                                     ["mxfp8_e4m3-m00", "mxfp8_e4m3-m01"]],
                          "job": ["7_0", "7_1", "7_2"], "state": ["running", "failed (CANCELLED)", "failed (FAILED)"]})
    joined = ensemble_status.with_jobs(table, units, tmp_path).set_index("arm")
    assert joined.loc["fp32", "jobs"] == "7_0 running, 7_1 failed (CANCELLED)"
    assert joined.loc["fp32", "state"] == "training"
    assert joined.loc["mxfp8_e4m3", "jobs"] == "7_2 failed (FAILED)"
    assert joined.loc["mxfp8_e4m3", "state"] == "interrupted"
    assert ensemble_status.with_jobs(table, units.iloc[:0], tmp_path) is table  # not submitted to Slurm: unchanged


def test_a_fresh_machine_resumes_from_the_exported_results_and_a_student_only_state(trained, parent, tmp_path):
    """The store and branch state gone, the results kept (committed): exported members are done, not retrained;
    the state replayed without its FP32 twin (losses identical to the paired run's) trains the arms that need no
    twin, bit for bit as from the paired state, and refuses the one that does."""
    import shutil

    from mx_proxy.runner import loop as runner
    spec, out, runs = trained
    shutil.copytree(out / "results", tmp_path / "e" / "results")
    for i in (2, 3):
        shutil.rmtree(tmp_path / "e" / "results" / E.member_label("fp32", i))
    damaged = tmp_path / "e" / "results" / E.member_label("fp32", 1) / "metrics.parquet"
    damaged.write_bytes(damaged.read_bytes()[:100])  # trained again and rewritten
    with pytest.raises(ValueError, match="needs a source"):
        E.run(spec, tmp_path / "e", progress=False, log=lambda *_: None)
    alone = mxp.train(PARENT.replace(paired_run=False), store=tmp_path / "alone", progress=False)
    np.testing.assert_array_equal(alone.metrics["loss"].to_numpy(), parent.metrics["loss"].to_numpy())
    log = []
    runner.hooks.append(log.append)
    try:
        again = E.run(spec, tmp_path / "e", source=alone, progress=False, log=lambda *_: None)
    finally:
        runner.hooks.remove(log.append)
    assert sorted((c.recipe.name, c.data_seed) for c in log) == [("fp32", 2), ("fp32", 3), ("fp32", 4)]
    for i in range(spec.members):
        a, b = again["fp32"][i].metrics, runs["fp32"][i].metrics
        b = b[b["step"] >= a["step"].iloc[0]].reset_index(drop=True)  # an export keeps 100 steps before the branch
        after = (a["step"] >= spec.branch_at).to_numpy()
        cols = [c for c in b.columns if c in a.columns and c != "val_loss"]
        paired_only = sorted(set(b.columns) - set(a.columns))  # the paired state's history: its twin's columns
        assert set(paired_only) <= {"ref_loss", "ref_grad_norm", "zeta_paper", "cosine_paper"}
        assert i == 0 or (paired_only and b.loc[after, paired_only].isna().all().all())  # m1-m3 trained anew
        pd.testing.assert_frame_equal(a.loc[after, cols], b.loc[after, cols], check_dtype=False)
        np.testing.assert_array_equal(a["loss"], b["loss"])  # the history before the branch too
        assert again["unchanged"][i].path == str(tmp_path / "e" / "results" / E.member_label("unchanged", i))
    shutil.rmtree(tmp_path / "e" / "results" / E.member_label("twin", 3))
    with pytest.raises(ValueError, match=r"arm 'unchanged' trains beside its FP32 twin.*holds no twin.*\[3\]"):
        E.train_unit(tmp_path / "e", "unchanged", (3,), progress=False)


def test_a_branch_state_whose_history_is_not_the_members_is_refused(trained, parent, tmp_path):
    import shutil

    spec, out, _ = trained
    shutil.copytree(out / "results", tmp_path / "e" / "results")
    hist = tmp_path / "e" / "results" / E.HISTORY_FILE
    h = pd.read_parquet(hist)
    h.loc[h["step"] == 7, "loss"] *= np.float32(1 + 2**-20)
    h.to_parquet(hist, index=False)
    with pytest.raises(ValueError, match="not the one the members in .* branched from: its loss differs .* at step 7"):
        E.prepare(spec, tmp_path / "e", source=parent)
