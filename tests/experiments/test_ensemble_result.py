"""Outcomes, rates, paired tests, loss gaps and warning-signal scores on members made for the test."""

import math

import numpy as np
import pandas as pd
import pytest

import mx_proxy as mxp
from mx_proxy.experiments import ensemble as E
from mx_proxy.experiments import ensemble_report, ensemble_result, power, signals, stats
from mx_proxy.training.result import Run

BASE = mxp.Config(width=16, depth=2, steps=100, paired_run=True, diagnostics_every=5, recipe="paper_e4m3")
SPEC = E.Ensemble("made", "branch", BASE, ("unchanged", "twin", "fp32"), members=4, horizon=200, branch_at=100,
                  checkpoint_every=50)


def _run(arm, i, loss, diverged_at=None, extra=None):
    steps = np.arange(len(loss))
    m = pd.DataFrame({"step": steps, "loss": np.asarray(loss, float)} | (extra or {}))
    return Run(SPEC.config(arm, i), m, diverged_at, info={"ensemble": {"arm": arm, "member": i}})


def _flat(n=300, level=1.0):
    return np.full(n, level)


def _members():
    """unchanged: m0 blows up at 150, m1 stopped by the engine at 180, m2 stable, m3 blows up at 290;
    twin: m1 censored where its pair stopped (180), otherwise stable at 1.0; fp32: stable at 1.1."""
    u0, u3 = _flat(), _flat()
    u0[150:] = 20.0
    u3[290:] = 15.0
    unchanged = [_run("unchanged", 0, u0), _run("unchanged", 1, _flat(181), diverged_at=180),
                 _run("unchanged", 2, _flat(level=1.05)), _run("unchanged", 3, u3)]
    twin = [_run("twin", i, _flat(181 if i == 1 else 300)) for i in range(4)]
    fp32 = [_run("fp32", i, _flat(level=1.1)) for i in range(4)]
    return {"unchanged": unchanged, "twin": twin, "fp32": fp32}


@pytest.fixture(scope="module")
def result():
    return ensemble_result.EnsembleResult(SPEC, _members())


def test_outcomes_apply_one_rule_to_every_member(result):
    t = result.table.set_index(["arm", "member"])
    assert t.loc[("unchanged", 0), ["event", "time"]].tolist() == [True, 50]
    assert t.loc[("unchanged", 1), ["event", "time"]].tolist() == [True, 80]  # the engine's divergence
    assert t.loc[("unchanged", 2), ["event", "time"]].tolist() == [False, 200]  # censored at the horizon
    assert t.loc[("unchanged", 3), ["event", "time"]].tolist() == [True, 190]
    assert t.loc[("twin", 1), ["event", "time"]].tolist() == [False, 81]  # censored where its pair stopped
    assert not t.loc["fp32", "event"].any() and (t.loc["fp32", "time"] == 200).all()


def test_rates_and_survival_equal_their_independent_computation(result):
    r = result.rates().set_index("arm")
    expect = stats.rate(3, 4)
    assert (r.loc["unchanged", "blowups"], r.loc["unchanged", "members"]) == (3, 4)
    assert r.loc["unchanged", ["p", "low", "high"]].tolist() == pytest.approx([expect.p, expect.low, expect.high])
    s = result.survival("unchanged")
    # product limit by hand: 4 at risk; events at 50, 80, 190; one censored at 200
    assert s["t"].tolist() == [0, 50, 80, 190, 200]
    np.testing.assert_allclose(s["survival"], [1, 3 / 4, 2 / 4, 1 / 4, 1 / 4])
    assert r.loc["unchanged", "survival"] == pytest.approx(0.25) and r.loc["unchanged", "median_time"] == 80
    assert r.loc["fp32", "p"] == 0 and pd.isna(r.loc["fp32", "median_time"])


def test_paired_tests_against_the_control(result):
    t = result.paired_tests().set_index("arm")
    assert t.loc["fp32", ["only_control", "only_arm", "both", "neither"]].tolist() == [3, 0, 0, 1]
    assert t.loc["fp32", "mcnemar_p"] == pytest.approx(0.25)  # 2 · (1/2)^3
    assert t.loc["fp32", "logrank"] > 0 and t.loc["fp32", "logrank_p"] < 0.05
    # 3 / 4 against 0 / 4: the fewest pairs whose exact power at those rates reaches 0.8, found by scanning here
    first = next(n for n in range(1, 200) if power.mcnemar_power(0.75, 0.0, n) >= 0.8)
    assert t.loc["fp32", "pairs_needed"] == first
    assert t.loc["twin", "only_control"] == 3 and t.loc["twin", "pairs_needed"] == first  # the twin never blew up


def test_detectable_rates_over_the_pairs_at_hand(result):
    pairs, p, above, below = result.detectable()
    assert (pairs, p) == (4, 0.75)
    assert math.isnan(above) and math.isnan(below)  # 4 pairs: the exact test can reject nothing at 0.05
    assert power.mcnemar_power(0.75, 0.0, 4) == 0.0
    text = "\n".join(ensemble_report._paired(result))
    assert "| pairs needed |" in text and "| 4 | 3 / 0 / 0 / 1 | 0.25 |" in text
    assert ("With 4 pairs (the fewest any arm shares with `unchanged`) and `unchanged`'s rate on them 0.75 (3 of 4), "
            "no rate of an arm is told apart with 80 % probability." in text)


def test_loss_gap_over_stable_pairs_only(result):
    g = result.loss_gap().set_index("arm")
    assert g.loc["unchanged", "stable_pairs"] == 1 and g.loc["unchanged", "gap_pct"] == pytest.approx(5.0)
    assert g.loc["fp32", "stable_pairs"] == 3 and g.loc["fp32", "gap_pct"] == pytest.approx(10.0)
    assert g.loc["fp32", "low"] == pytest.approx(10.0) and g.loc["fp32", "high"] == pytest.approx(10.0)


def test_end_loss_tests_compare_every_pair_a_stopped_member_the_higher(result):
    """fp32 (1.1 everywhere) against unchanged's tails 20, stopped, 1.05 and (90 steps at 1 and 10 at 15) 2.4;
    the twin (1.0) against the same, its member 1 stopped with its pair: a tie."""
    t = result.end_loss_tests().set_index("arm")
    assert t.loc["fp32", ["pairs", "lower", "higher", "ties"]].tolist() == [4, 3, 1, 0]
    assert t.loc["fp32", "sign_p"] == pytest.approx(0.625)  # 2 · P(Bin(4, 1/2) ≥ 3) = 2 · 5/16
    assert t.loc["fp32", "median_ratio"] == pytest.approx(1.1 / 2.4)  # of 1.1/20, 1.1/1.05, 1.1/2.4
    assert t.loc["twin", ["lower", "higher", "ties"]].tolist() == [3, 0, 1]
    assert t.loc["twin", "sign_p"] == pytest.approx(0.25)


def _signal_result(rng):
    """4 members blow up (at 260, 230, 280, 250), 4 do not; ``zeta_bound`` ramps up over the 100 steps
    before each blow-up and is noise elsewhere; ``update_norm`` is one constant."""
    runs = {"unchanged": [], "fp32": []}
    spec = E.Ensemble("sig", "branch", BASE, ("unchanged", "fp32"), members=4, horizon=200, branch_at=100,
                      checkpoint_every=50)
    for arm, blowups in (("unchanged", (260, 230, 280, 250)), ("fp32", (None,) * 4)):
        for i, b in enumerate(blowups):
            loss = _flat()
            zeta = rng.uniform(0.2, 0.4, 300)
            if b is not None:
                loss[b:] = 50.0
                zeta[b - 100:b] = np.linspace(0.5, 2.0, 100)
            m = pd.DataFrame({"step": np.arange(300), "loss": loss, "zeta_bound": zeta, "update_norm": 1.0})
            runs[arm].append(Run(spec.config(arm, i), m, None))
    return ensemble_result.EnsembleResult(spec, runs)


def test_a_signal_that_ramps_before_each_blowup_scores_and_warns(result):
    sig = signals.score(_signal_result(np.random.default_rng(0))).set_index("signal")
    assert sig.loc["zeta_bound", "auc_100"] == pytest.approx(1.0)
    assert 0.5 < sig.loc["zeta_bound", "auc_500"] <= 1.0
    assert sig.loc["zeta_bound", "events"] == 4 and sig.loc["zeta_bound", "warned"] == 4
    assert sig.loc["zeta_bound", "lead"] == 100  # the ramp's first step is above every quiet value
    assert sig.loc["update_norm", "auc_100"] == pytest.approx(0.5)  # a constant: chance


def test_signals_before_draws_each_blowup_against_the_quiet_band():
    import matplotlib

    matplotlib.use("Agg")
    from mx_proxy.viz import plots

    res = _signal_result(np.random.default_rng(1))
    fig = plots.signals_before(res, window=150)
    panels = {ax.get_title().split("\n")[0]: ax for ax in fig.axes if ax.get_visible()}
    assert "same-point ‖ζ‖ bound" in panels and "update norm" in panels and "paper's ζ (vs the FP32 run)" not in panels
    ax = panels["same-point ‖ζ‖ bound"]
    members = [line for line in ax.lines if line.get_linewidth() < 1 and line.get_linestyle() == "-"]
    ramp = np.linspace(0.5, 2.0, 100)
    blowups = (260, 230, 280, 250)
    assert len(members) == len(blowups)
    for line, b, run in zip(members, blowups, res.runs["unchanged"], strict=True):
        m = run.metrics  # the raw recorded values: every 5th step from the start, the 150 before the blow-up
        keep = (m["step"] >= res.spec.start) & (m["step"] < b) & (b - m["step"] <= 150) & (m["step"] % 5 == 0)
        np.testing.assert_array_equal(line.get_xdata(), -(b - m.loc[keep, "step"]).to_numpy())
        np.testing.assert_array_equal(line.get_ydata(), m.loc[keep, "zeta_bound"].to_numpy())
    (median,) = [line for line in ax.lines if line.get_linewidth() > 1.5]
    x, y = np.asarray(median.get_xdata()), np.asarray(median.get_ydata())
    on_ramp = x >= -100  # every member on the same ramp there: the median is the ramp
    np.testing.assert_allclose(y[on_ramp], ramp[(100 + x[on_ramp]).astype(int)])
    (alarm,) = [line for line in ax.lines if line.get_linestyle() == "--"]
    thr = signals.score(res).set_index("signal").loc["zeta_bound", "threshold"]
    assert alarm.get_ydata()[0] == pytest.approx(thr)
    assert "warned 4/4" in ax.get_title()
    plots.plt.close(fig)
    stable = ensemble_result.EnsembleResult(res.spec, {"unchanged": res.runs["fp32"], "fp32": res.runs["fp32"]})
    with pytest.raises(ValueError, match="no member that blew up"):
        plots.signals_before(stable)


def test_gnmr_signal_is_the_controllers_ratio_computed_independently():
    g = np.array([[1.0, 2.0], [1.0, 2.0], [3.0, 2.0], [1.0, 8.0], [2.0, 2.0]] * 4)
    m = pd.DataFrame({"step": np.arange(len(g)), "loss": 1.0, "grad_norm/block_0": g[:, 0],
                      "grad_norm/block_1": g[:, 1]})
    f = signals.signal_frame(m)
    expect_g, expect_d = [], []
    for t in range(len(g)):
        ratio = [g[t, u] / g[:t, u].mean() if t else math.nan for u in range(2)]
        delta = [g[t, u] / g[t - 10:t, u].mean() if t >= 10 else math.nan for u in range(2)]
        expect_g.append(np.nanmax(ratio) if t else math.nan)
        expect_d.append(np.nanmax(delta) if t >= 10 else math.nan)
    np.testing.assert_allclose(f["gnmr"], expect_g, rtol=1e-6)
    np.testing.assert_allclose(f["delta_gnmr"], expect_d, rtol=1e-6)


def test_sensitivity_recounts_the_blowups_at_each_factor(result):
    # unchanged: m0 jumps to 20× its recent minimum, m3 to 15×, m1 is stopped by the engine; the rest stay flat
    s = result.sensitivity((5, 10, 16, 100)).set_index(["arm", "factor"])
    assert s.loc["unchanged", "blowups"].tolist() == [3, 3, 2, 1]  # the engine's stop counts at every factor
    assert (s.loc["fp32", "blowups"] == 0).all() and (s.loc["twin", "members"] == 4).all()
    # McNemar by hand: k discordant pairs, all one way: p = min(1, 2 · 2^-k)
    assert s.loc["fp32", "mcnemar_p"].tolist() == pytest.approx([0.25, 0.25, 0.5, 1.0])
    assert s.loc["unchanged", "mcnemar_p"].isna().all()
    ten = s.xs(10.0, level="factor")
    assert ten["blowups"].to_dict() == result.rates().set_index("arm")["blowups"].to_dict()
    with pytest.raises(ValueError, match="above 1"):
        result.sensitivity((0.5,))


def test_recoveries_count_the_stopped_and_the_blowups_the_loss_came_back_from():
    spec = E.Ensemble("rec", "branch", BASE, ("unchanged", "fp32"), members=4, horizon=200, branch_at=100,
                      checkpoint_every=50)

    def run(arm, i, loss, diverged_at=None):
        m = pd.DataFrame({"step": np.arange(len(loss)), "loss": np.asarray(loss, float)})
        return Run(spec.config(arm, i), m, diverged_at)

    back, high, late = _flat(), _flat(), _flat()
    back[150:170], back[170:] = 30.0, 1.9   # blew up, back within 2× of its minimum before (1.0)
    high[150:170], high[170:] = 30.0, 2.5   # blew up, settled 2.5× above it
    late[250:] = 40.0                       # blew up 50 steps before the end: its tail is the blow-up
    runs = {"unchanged": [run("unchanged", 0, back), run("unchanged", 1, high), run("unchanged", 2, late),
                          run("unchanged", 3, _flat(181), diverged_at=180)],
            "fp32": [run("fp32", i, _flat()) for i in range(4)]}
    r = ensemble_result.EnsembleResult(spec, runs).recoveries().set_index("arm")
    assert r.loc["unchanged", ["members", "blowups", "diverged", "recovered"]].tolist() == [4, 4, 1, 1]
    assert r.loc["fp32", ["blowups", "diverged", "recovered"]].tolist() == [0, 0, 0]


def test_the_report_prints_the_rule_section(result):
    from mx_proxy.experiments import ensemble_report

    text = ensemble_report.markdown(result, parts=("rule",))
    row = next(line for line in text.splitlines() if line.startswith("| `fp32` |"))
    assert row == "| `fp32` | 0 / 4 (p 0.25) | 0 / 4 (p 0.25) | 0 / 4 (p 1.00) | 0 / 4 (p 1.00) | 0 / 4 | 0 / 0 |"
    assert "| arm | 5× | 10× (the rule) | 100× | 1000× | stopped | recovered |" in text


def test_trajectories_mark_each_members_blowup_and_stop_where_the_table_has_them(result):
    import matplotlib

    matplotlib.use("Agg")
    from mx_proxy.viz import plots

    fig = plots.trajectories(result)
    panels = {ax.get_title(): ax for ax in fig.axes if ax.get_visible()}
    assert set(panels) == {"unchanged: 3/4 blew up", "twin: 0/4 blew up", "fp32: 0/4 blew up"}

    def marks(ax, marker):
        return sorted(float(line.get_xdata()[0]) for line in ax.lines if line.get_marker() == marker)

    unchanged = panels["unchanged: 3/4 blew up"]
    t = result.table[result.table["event"] & (result.table["arm"] == "unchanged")]
    assert marks(unchanged, "x") == sorted(float(b - SPEC.start) for b in t["blowup_at"])  # 150, 180, 290
    assert marks(unchanged, "s") == [180.0 - SPEC.start]  # the engine's stop, at its last finite loss
    assert marks(panels["fp32: 0/4 blew up"], "x") == []
    plots.plt.close(fig)


def test_survival_panels_draw_each_arm_against_the_control_with_its_mcnemar_p(result):
    import matplotlib

    matplotlib.use("Agg")
    from mx_proxy.viz import plots

    def curve(line):  # a step line's (t, survival) corners, as drawn
        return np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)

    for res in (result, result.against("fp32")):
        fig = plots.survival(res, panels=True)
        panels = {ax.get_title(): ax for ax in fig.axes if ax.get_visible()}
        tests = res.paired_tests().set_index("arm")
        control = res.control
        expect = {f"{a}: {int(r.blowups)}/{int(r.members)} blew up, McNemar p = {tests.loc[a, 'mcnemar_p']:.2f}"
                  for a, r in res.rates().set_index("arm").iterrows() if a != control}
        assert set(panels) == expect and len(panels) == 2
        s = res.survival(control)
        for ax in panels.values():
            labels = [line.get_label() for line in ax.lines]
            assert len(ax.lines) == 2 and labels[0].startswith(f"{control}: ")
            t, y = curve(ax.lines[0])  # the control, the same curve in every panel
            assert t.tolist() == s["t"].tolist() + [SPEC.horizon]
            np.testing.assert_allclose(y, np.r_[s["survival"], s["survival"].iloc[-1]])
        plots.plt.close(fig)
    single = plots.survival(result)  # three arms: one panel by default
    assert len(single.axes) == 1 and len(single.axes[0].lines) == 3
    with pytest.raises(ValueError, match="panels=True"):
        plots.survival(result, ax=single.axes[0], panels=True)
    plots.plt.close(single)


def test_all_arms_and_members_tests_are_cochrans_q_over_the_arms_with_every_member_exported(result):
    arms, q, incomplete = result.all_arms_test()  # the twin continues another state: left out
    assert arms == ("unchanged", "fp32") and (q.members, q.arms) == (4, 2) and incomplete == ()
    assert q.statistic == pytest.approx(3.0) and q.pvalue == pytest.approx(0.25)  # McNemar's, 3 discordant pairs
    spec = E.Ensemble("four", "branch", BASE, ("unchanged", "fp32", "rceil", "paper_bump"), members=4, horizon=200,
                      branch_at=100, checkpoint_every=50)
    blew = {"unchanged": (0, 1), "fp32": (1,), "rceil": (0, 1, 2, 3), "paper_bump": (2,)}
    runs = {}
    for arm, members in blew.items():
        runs[arm] = []
        for i in range(4 if arm != "paper_bump" else 1):  # paper_bump: members 1-3 not exported yet
            loss = _flat()
            if i in members:
                loss[150:] = 50.0
            runs[arm].append(Run(spec.config(arm, i), pd.DataFrame({"step": np.arange(300), "loss": loss}), None))
        runs[arm] += [None] * (4 - len(runs[arm]))
    res = ensemble_result.EnsembleResult(spec, runs)
    arms, q, incomplete = res.all_arms_test()
    table = [[1, 0, 1], [1, 1, 1], [0, 0, 1], [0, 0, 1]]  # members 0-3 of the complete arms: blew up or not
    assert arms == ("unchanged", "fp32", "rceil") and incomplete == ("paper_bump",)
    assert q == stats.cochran_q(table) and q.members == 4  # not the 1 member paper_bump shares with them
    from mx_proxy.experiments import ensemble_report

    text = ensemble_report.markdown(res, parts=("paired",))
    assert (f"All 3 arms with every member exported at once, over their 4 members: Cochran's Q = {q.statistic:.2f}"
            in text)
    assert "left out until all their members are exported: `paper_bump` (1 / 4)." in text
    members = res.members_test()  # the same three arms, each member (data stream) a treatment
    assert members.arms == arms and members.seeds == (1, 2, 3, 4) and members.blowups == (2, 3, 1, 1)
    # Q by hand with the roles swapped: k = 4 members, member totals C = (2, 3, 1, 1), arm totals R = (2, 1, 4):
    # Q = (k-1)(k·ΣC² − T²) / (k·T − ΣR²) = 3 (4·15 − 49) / (28 − 21)
    assert members.test.statistic == pytest.approx(33 / 7) and (members.test.members, members.test.arms) == (3, 4)
    # exactly: rceil's 4 blow-ups fix nothing; of unchanged's 6 placements × fp32's 4, ΣC² reaches its maximum,
    # 15, observed, when fp32's blow-up shares a member with one of unchanged's: 12 of 24
    assert not members.test.exact and members.test.pvalue == pytest.approx(0.5, abs=0.03)
    assert members == res.members_test() and members.test == stats.cochran_q(np.array(table).T)
    assert ("Blow-ups of the 3 arms with every member exported on member s_i = 1…4: 2, 3, 1, 1; "
            f"Cochran's Q across the members = {33 / 7:.2f}") in text
    runs["rceil"][3] = None  # only two complete arms: no omnibus test beyond the paired one
    two = ensemble_result.EnsembleResult(spec, runs)
    assert two.all_arms_test().arms == ("unchanged", "fp32")
    assert "arms with every member exported at once" not in ensemble_report.markdown(two, parts=("paired",))
    runs["fp32"][0] = None
    assert ensemble_result.EnsembleResult(spec, runs).all_arms_test() is None
    assert ensemble_result.EnsembleResult(spec, runs).members_test() is None


def test_a_loss_gap_without_a_stable_pair_says_so():
    from mx_proxy.experiments import ensemble_report

    res = _signal_result(np.random.default_rng(0))  # every unchanged member blew up
    assert res.loss_gap().set_index("arm").loc["unchanged", "stable_pairs"] == 0
    text = ensemble_report.markdown(res, parts=("loss_gap",))
    assert "| `unchanged` (`paper_e4m3`) | 0 | – (no pair where neither blew up) |" in text


def test_read_history_validates_the_branch_history_before_use(tmp_path):
    E.write_spec(SPEC, tmp_path)
    assert E.read_history(tmp_path) is None  # a seed or data ensemble has none
    path = tmp_path / E.HISTORY_FILE
    good = pd.DataFrame({"step": np.arange(5), "loss": np.linspace(1, 0.5, 5)})
    good.to_parquet(path, index=False)
    pd.testing.assert_frame_equal(E.read_history(tmp_path.parent / tmp_path.name), good)
    good.iloc[::-1].to_parquet(path, index=False)
    with pytest.raises(ValueError, match="'step' column, increasing"):
        E.read_history(tmp_path)
    good.drop(columns="loss").to_parquet(path, index=False)
    with pytest.raises(ValueError, match="not a branch history"):
        E.read_history(tmp_path)
    path.write_bytes(b"not parquet")
    with pytest.raises(ValueError, match="not a readable parquet file"):
        E.read_history(tmp_path)


def test_tables_of_an_ensemble_whose_control_has_no_member_yet_keep_their_columns():
    """Arms export one by one: while the control arm has no member, the paired tables are empty but keep their
    columns, so that ``t[t["arm"] == a]`` works (notebook 07 reads every committed ensemble that way)."""
    import pathlib

    from mx_proxy.experiments import ensemble_result

    full = ensemble_result.load(pathlib.Path(__file__).resolve().parents[2] / "results" / "unstable_search"
                                / "w256-d4-lr0.002")
    partial = ensemble_result.EnsembleResult(full.spec, {"mxfp8_e4m3": full.runs["mxfp8_e4m3"]})
    assert partial.control == "fp32" and partial.rates()["arm"].tolist() == ["mxfp8_e4m3"]
    for table in (partial.paired_tests(), partial.loss_gap(), partial.end_loss_tests()):
        assert len(table) == 0 and "arm" in table.columns
    assert list(partial.paired_tests().columns) == list(full.paired_tests().columns)
    assert list(partial.loss_gap().columns) == list(full.loss_gap().columns)
    nothing = ensemble_result.EnsembleResult(full.spec, {})
    assert len(nothing.rates()) == 0 and list(nothing.rates().columns) == list(full.rates().columns)
    assert full.paired_tests()["pairs_needed"].dtype == "Int64" == nothing.rates()["median_time"].dtype
