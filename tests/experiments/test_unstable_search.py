"""The cheaper-unstable-setting search: its settings, its stopping rule, one tiny setting end to end."""

import pandas as pd
import pytest

from mx_proxy.experiments import ensemble as E
from mx_proxy.experiments import unstable_search as U


def test_settings_cover_the_fig2_family_cheapest_shape_first_largest_lr_first():
    assert len(U.SETTINGS) == 3 * 2 * 4 and len(set(U.SETTINGS)) == len(U.SETTINGS)
    assert U.SETTINGS[:4] == ((128, 4, 3e-3), (128, 4, 2e-3), (128, 4, 1e-3), (128, 4, 6e-4))
    costs = [w * w * d for w, d, _ in U.SETTINGS]
    assert costs == sorted(costs) and {lr for *_, lr in U.SETTINGS} == {6e-4, 1e-3, 2e-3, 3e-3}
    assert {(w, d) for w, d, _ in U.SETTINGS} == {(w, d) for w in (128, 256, 384) for d in (4, 8)}


def test_verdicts_follow_the_stated_rule():
    v = U._verdict

    def rows(fp32, paper, mxfp8):
        return {"fp32": fp32, "paper_e4m3": paper, "mxfp8_e4m3": mxfp8}

    assert v(rows((1, 4), (3, 4), (0, 4)))[1].startswith("out: FP32 blew up")
    assert v(rows((1, 4), (0, 0), (0, 0))) == ("screen", "out: FP32 blew up too (1/4: LR-driven); MX arms not trained")
    assert v(rows((0, 4), (0, 4), (0, 4))) == ("screen", "out: no MX blow-up in 4 (a 30 % rate passes with "
                                                         "probability 0.76)")  # the committed rows' verdict
    assert v(rows((0, 0), (0, 4), (0, 4)))[1].endswith("; FP32 not trained")
    assert v(rows((0, 0), (0, 4), (0, 0))) is None  # the MX screen half done
    assert v(rows((0, 0), (1, 4), (0, 4))) is None  # an MX blow-up: FP32's screen decides
    assert v(rows((0, 4), (1, 4), (0, 4))) == ("screen", "passes the screen: extend to 8")
    assert v(rows((0, 4), (1, 8), (0, 6))) is None  # the full stage half done
    assert v(rows((1, 6), (1, 8), (0, 6)))[1] == "out: FP32 blew up too (1/6: LR-driven)"
    assert v(rows((0, 8), (3, 8), (0, 8))) == ("full", "qualifies")  # 3/8 ≥ 30 %
    assert v(rows((0, 8), (2, 8), (2, 8)))[1].startswith("out: MX blew up in fewer")


def test_a_tiny_setting_is_screened_recorded_and_resumed(tmp_path, trained):
    """No MX blow-up in 30 steps: out at the screen, decided by the MX arms alone; FP32 is not trained."""
    log = []
    kw = dict(settings=[(16, 2, 3e-3)], steps=30, batch=32, progress=False, log=log.append)
    df = U.search(tmp_path / "s", table_path=tmp_path / "t.csv", **kw)
    assert list(df["arm"]) == list(U.ARMS) and list(df["members"]) == [0, U.SCREEN, U.SCREEN]
    assert set(df["verdict"]) == {"out: no MX blow-up in 4 (a 30 % rate passes with probability 0.76); "
                                  "FP32 not trained"}
    assert {c.recipe.name for c in trained} == set(U.MX_ARMS)
    assert pd.read_csv(tmp_path / "t.csv")["verdict"].tolist() == df["verdict"].tolist()
    n = len(trained)
    again = U.search(tmp_path / "s", **kw)  # everything stored: the same table, nothing trained
    pd.testing.assert_frame_equal(again, df)
    assert len(trained) == n
    now = U.progress(tmp_path / "s")  # the MX screen's members exported, nothing else started
    assert list(now["setting"]) == ["w16-d2-lr0.003"] * 3 and list(now["arm"]) == list(U.ARMS)
    assert list(now["done"]) == [0, U.SCREEN, U.SCREEN]
    assert list(now["member_steps_done"]) == [0, U.SCREEN * 30, U.SCREEN * 30]


def test_status_prints_the_table_and_the_progress_of_each_undecided_setting(tmp_path, capsys):
    none = ["--table", str(tmp_path / "none.csv")]  # not the committed table, which --status reads by default
    assert U.main(["--out", str(tmp_path / "none"), "--status", *none]) == 0
    assert "no setting has exported members of every arm yet" in capsys.readouterr().out
    kw = dict(steps=20, batch=32)
    U.search(tmp_path / "s", settings=[(16, 2, 3e-3)], progress=False, log=lambda _: None, **kw)  # decided: out
    half = U.spec_of(16, 3, 3e-3, **kw)  # the MX screen half done: paper_e4m3's four members only
    E.prepare(half, tmp_path / "s" / half.name)
    E.train_unit(tmp_path / "s" / half.name, "paper_e4m3", tuple(range(U.SCREEN)), progress=False)
    assert U.main(["--out", str(tmp_path / "s"), "--status", *none]) == 0
    out = capsys.readouterr().out
    table, started = out.split("settings in progress")
    assert table.count("w16-d2-lr0.003") == len(U.ARMS) and "w16-d3-lr0.003" not in table
    assert started.count("w16-d3-lr0.003") == len(U.ARMS) and "w16-d2-lr0.003" not in started


def test_a_shape_walks_down_its_lrs_while_fp32_blows_up_and_stops_where_mx_is_stable(tmp_path, trained):
    """Width 16, LR 0.5: the MX arms blow up in their screen, so FP32's screen trains, and blows up too: out
    (LR-driven), and the search goes on to the shape's next LR. At LR 3e-3 no MX member blows up: out, FP32 not
    trained, and the shape's smaller LR is skipped, untrained, its rows saying why."""
    kw = dict(settings=[(16, 2, 0.5), (16, 2, 3e-3), (16, 2, 1e-3)], steps=30, batch=32, progress=False,
              log=lambda _: None)
    df = U.search(tmp_path / "s", table_path=tmp_path / "t.csv", **kw)
    assert [(c.lr, c.recipe.name) for c in trained if c.lr == 0.5][-1] == (0.5, "fp32")  # FP32 after the MX arms
    assert {c.lr for c in trained} == {0.5, 3e-3} and {c.recipe.name for c in trained if c.lr == 3e-3} == \
        set(U.MX_ARMS)
    assert list(df["setting"]) == [s for s in ("w16-d2-lr0.5", "w16-d2-lr0.003", "w16-d2-lr0.001") for _ in U.ARMS]
    high, mid, low = (df.iloc[k:k + 3].reset_index(drop=True) for k in (0, 3, 6))
    assert list(high["members"]) == [U.SCREEN] * 3 and high["blowups"].iloc[0] >= 1 and high["blowups"].iloc[1] >= 1
    assert set(high["verdict"]) == {f"out: FP32 blew up too ({high['blowups'].iloc[0]}/{U.SCREEN}: LR-driven)"}
    assert list(mid["members"]) == [0, U.SCREEN, U.SCREEN] and mid["verdict"].iloc[0].endswith("FP32 not trained")
    assert list(low["members"]) == [0, 0, 0] and set(low["stage"]) == {"skipped"}
    assert set(low["verdict"]) == {"skipped: no MX blow-up at LR 0.003 of this shape, and blow-ups grow with the LR"}
    assert low[["p", "low", "high"]].isna().all().all()
    pd.testing.assert_frame_equal(U.read_table(tmp_path / "t.csv"), df)
    n = len(trained)
    pd.testing.assert_frame_equal(U.search(tmp_path / "s", table_path=tmp_path / "t.csv", **kw), df)  # resumed
    pd.testing.assert_frame_equal(U.search(tmp_path / "fresh", table_path=tmp_path / "t.csv", **kw), df)  # carried
    assert len(trained) == n


def test_a_setting_the_table_decided_is_not_trained_again_and_its_rows_are_carried(tmp_path, trained):
    """A fresh store (a new machine) with the committed table: the decided setting is skipped, its rows kept as
    they were, and the next setting is trained and written beside them in search order."""
    kw = dict(steps=20, batch=32, progress=False, log=lambda _: None)
    first = U.search(tmp_path / "old", table_path=tmp_path / "t.csv", settings=[(16, 2, 2e-3)], **kw)
    assert first["verdict"].iloc[0].startswith("out")  # no blow-up in 20 steps: decided at the screen
    trained.clear()
    log = []
    df = U.search(tmp_path / "new", table_path=tmp_path / "t.csv", settings=[(16, 2, 2e-3), (16, 3, 2e-3)],
                  **dict(kw, log=log.append))
    assert {c.depth for c in trained} == {3}  # only the undecided setting trained
    assert any("w16-d2-lr0.002: decided: out" in line for line in log)
    assert list(df["setting"]) == ["w16-d2-lr0.002"] * 3 + ["w16-d3-lr0.002"] * 3  # search order: cheaper shape first
    pd.testing.assert_frame_equal(df.iloc[:3].reset_index(drop=True), first)
    pd.testing.assert_frame_equal(U.read_table(tmp_path / "t.csv"), df)
    assert list(U.merged(tmp_path / "new", tmp_path / "t.csv")["setting"]) == list(df["setting"])


def test_exported_members_are_carried_and_a_fresh_store_trains_only_what_no_machine_finished(tmp_path, trained):
    """One machine finished paper_e4m3's screen and carried its exports (then its store was lost); a fresh store
    with the carried folder trains mxfp8_e4m3's four members only, and decides as one uninterrupted search did.
    The carried folder ends up holding every exported file of the setting, byte for byte."""
    kw = dict(settings=[(16, 2, 3e-3)], steps=30, batch=32, progress=False, log=lambda _: None)
    ref = U.search(tmp_path / "ref", **kw)
    spec = U.spec_of(16, 2, 3e-3, steps=30, batch=32)
    E.prepare(spec, tmp_path / "old" / spec.name)
    E.train_unit(tmp_path / "old" / spec.name, "paper_e4m3", tuple(range(U.SCREEN)), progress=False)
    carried = tmp_path / "carried" / spec.name
    assert E.copy_members(spec, tmp_path / "old" / spec.name / "results", carried) == [
        E.member_label("paper_e4m3", i) for i in range(U.SCREEN)]
    trained.clear()
    log = []
    df = U.search(tmp_path / "new", carry_to=tmp_path / "carried", **dict(kw, log=log.append))
    assert [c.recipe.name for c in trained] == ["mxfp8_e4m3"] * U.SCREEN
    assert any(f"{spec.name}: " in line and "carried in from" in line for line in log)
    pd.testing.assert_frame_equal(df, ref)
    results = tmp_path / "new" / spec.name / "results"
    files = sorted(f.relative_to(results) for f in results.rglob("*") if f.is_file())
    assert files == sorted(f.relative_to(carried) for f in carried.rglob("*") if f.is_file())
    assert all((results / f).read_bytes() == (carried / f).read_bytes() for f in files)
    assert {f.parts[0] for f in files if len(f.parts) > 1} == {
        E.member_label(a, i) for a in U.MX_ARMS for i in range(U.SCREEN)}


def test_copy_members_copies_what_is_missing_or_damaged_and_nothing_else(tmp_path):
    """The carrying mechanism (ensemble.copy_members, also paper_seeds.copy_committed): whole member folders that
    the destination lacks, with the spec and index beside them; a damaged member is copied again, a whole one
    and a folder copied onto itself are left alone."""
    spec = U.spec_of(16, 2, 3e-3, steps=20, batch=32)
    E.prepare(spec, tmp_path / "s")
    E.train_unit(tmp_path / "s", "paper_e4m3", (0, 1), progress=False)
    src, dst = tmp_path / "s" / "results", tmp_path / "carried"
    assert E.copy_members(spec, src, dst) == ["paper_e4m3-m00", "paper_e4m3-m01"]
    assert E.read_spec(dst) == spec and (dst / "index.csv").read_bytes() == (src / "index.csv").read_bytes()
    assert E.copy_members(spec, src, dst) == []  # nothing new
    (dst / "paper_e4m3-m01" / "metrics.parquet").write_bytes(b"truncated")
    with pytest.warns(UserWarning, match="paper_e4m3-m01/metrics.parquet is damaged.*set aside as "
                                         "'paper_e4m3-m01.aside-0'"):
        assert E.copy_members(spec, src, dst) == ["paper_e4m3-m01"]
    assert (dst / "paper_e4m3-m01.aside-0" / "metrics.parquet").read_bytes() == b"truncated"  # kept, not deleted
    files = sorted(f.relative_to(src) for f in src.rglob("*") if f.is_file())
    assert files == sorted(f.relative_to(dst) for f in dst.rglob("*") if f.is_file() and ".aside-" not in str(f))
    assert all((src / f).read_bytes() == (dst / f).read_bytes() for f in files)
    assert E.copy_members(spec, src, src) == [] and E.copy_members(spec, tmp_path / "none", dst) == []


def test_a_table_that_is_not_the_searchs_is_refused(tmp_path):
    (tmp_path / "t.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not the unstable search's table"):
        U.search(tmp_path / "s", table_path=tmp_path / "t.csv", settings=[(16, 2, 2e-3)], steps=20, batch=32,
                 progress=False, log=lambda _: None)


@pytest.mark.parametrize("argv, message", [
    (["--settings", "w128-d8"], "setting 'w128-d8' is not a label like 'w128-d4-lr0.003'"),
    (["--settings", "w0-d4-lr0.003"], "width and depth must be ≥ 1"),
    (["--steps", "0"], "--steps must be ≥ 1, got 0"),
    (["--hours", "-1"], "--hours must be > 0, got -1.0"),
])
def test_bad_options_exit_with_status_2_naming_the_value(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        U.main(["--out", str(tmp_path / "s"), "--table", str(tmp_path / "t.csv"), *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_setting_labels_round_trip():
    assert all(U.parse_setting(U._label(*s)) == s for s in U.SETTINGS)
    assert U.parse_setting("w16-d2-lr6e-4") == (16, 2, 6e-4)
