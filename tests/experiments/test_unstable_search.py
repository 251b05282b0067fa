"""The cheaper-unstable-setting search: its settings, its stopping rule, one tiny setting end to end."""

import pandas as pd
import pytest

from mx_proxy.experiments import unstable_search as U


def test_settings_cover_the_fig2_family_cheapest_shape_first_largest_lr_first():
    assert len(U.SETTINGS) == 3 * 2 * 4 and len(set(U.SETTINGS)) == len(U.SETTINGS)
    assert U.SETTINGS[:4] == ((128, 4, 3e-3), (128, 4, 2e-3), (128, 4, 1e-3), (128, 4, 6e-4))
    costs = [w * w * d for w, d, _ in U.SETTINGS]
    assert costs == sorted(costs) and {lr for *_, lr in U.SETTINGS} == {6e-4, 1e-3, 2e-3, 3e-3}
    assert {(w, d) for w, d, _ in U.SETTINGS} == {(w, d) for w in (128, 256, 384) for d in (4, 8)}


def test_verdicts_follow_the_stated_rule():
    v = U._verdict
    assert v({"fp32": (1, 4), "paper_e4m3": (3, 4), "mxfp8_e4m3": (0, 4)}, 4)[1].startswith("out: FP32 blew up")
    assert v({"fp32": (0, 4), "paper_e4m3": (0, 4), "mxfp8_e4m3": (0, 4)}, 4)[1].startswith("out: no MX blow-up")
    assert v({"fp32": (0, 4), "paper_e4m3": (1, 4), "mxfp8_e4m3": (0, 4)}, 4) == ("screen", "passes the screen: "
                                                                                     "extend to 8")
    assert v({"fp32": (0, 8), "paper_e4m3": (3, 8), "mxfp8_e4m3": (0, 8)}, 8) == ("full", "qualifies")  # 3/8 ≥ 30 %
    assert v({"fp32": (0, 8), "paper_e4m3": (2, 8), "mxfp8_e4m3": (2, 8)}, 8)[1].startswith("out: MX blew up in fewer")


def test_a_tiny_setting_is_screened_recorded_and_resumed(tmp_path):
    log = []
    kw = dict(settings=[(16, 2, 3e-3)], steps=30, batch=32, progress=False, log=log.append)
    df = U.search(tmp_path / "s", table_path=tmp_path / "t.csv", **kw)
    assert list(df["arm"]) == list(U.ARMS) and (df["members"] >= U.SCREEN).all()
    assert pd.read_csv(tmp_path / "t.csv")["verdict"].tolist() == df["verdict"].tolist()
    again = U.search(tmp_path / "s", **kw)  # everything stored: the same table, nothing trained
    pd.testing.assert_frame_equal(again, df)
    now = U.progress(tmp_path / "s")  # the screen's members exported, the other four not started
    assert list(now["setting"]) == ["w16-d2-lr0.003"] * 3 and list(now["arm"]) == list(U.ARMS)
    assert (now["done"] == U.SCREEN).all() and (now["member_steps_done"] == U.SCREEN * 30).all()
    assert (now["member_steps_left"] == (U.MEMBERS - U.SCREEN) * 30).all()


def test_status_prints_the_table_and_each_started_settings_progress(tmp_path, capsys):
    none = ["--table", str(tmp_path / "none.csv")]  # not the committed table, which --status reads by default
    assert U.main(["--out", str(tmp_path / "none"), "--status", *none]) == 0
    assert "no setting has exported members of every arm yet" in capsys.readouterr().out
    U.search(tmp_path / "s", settings=[(16, 2, 3e-3)], steps=20, batch=32, progress=False, log=lambda _: None)
    assert U.main(["--out", str(tmp_path / "s"), "--status", *none]) == 0
    out = capsys.readouterr().out
    assert "settings started" in out and out.count("w16-d2-lr0.003") == 2 * len(U.ARMS)  # table and progress rows


def test_a_setting_where_fp32_blows_up_in_its_screen_trains_no_mx_arm(tmp_path, trained):
    """LR 0.5 at width 16: FP32 blows up in all four screen members, so the setting is out (the LR-driven
    instability both precisions share) before any MX member trains; the table says so in every arm's row."""
    kw = dict(settings=[(16, 2, 0.5)], steps=30, batch=32, progress=False, log=lambda _: None)
    df = U.search(tmp_path / "s", **kw)
    assert {c.recipe.name for c in trained} == {"fp32"} and len(trained) >= 1
    assert list(df["arm"]) == list(U.ARMS) and list(df["members"]) == [U.SCREEN, 0, 0]
    assert df["blowups"].iloc[0] >= 1 and df[["p", "low", "high"]].iloc[1:].isna().all().all()
    assert set(df["verdict"]) == {f"out: FP32 blew up too ({df['blowups'].iloc[0]}/{U.SCREEN}: LR-driven); "
                                  f"MX arms not trained"} and set(df["stage"]) == {"screen"}
    n = len(trained)
    pd.testing.assert_frame_equal(U.search(tmp_path / "s", **kw), df)  # resumed: decided, nothing trained
    assert len(trained) == n


def test_a_setting_the_table_decided_is_not_trained_again_and_its_rows_are_carried(tmp_path, trained):
    """A fresh store (a new machine) with the committed table: the decided setting is skipped, its rows kept as
    they were, and the next setting is trained and written beside them in search order."""
    kw = dict(steps=20, batch=32, progress=False, log=lambda _: None)
    first = U.search(tmp_path / "old", table_path=tmp_path / "t.csv", settings=[(16, 2, 2e-3)], **kw)
    assert first["verdict"].iloc[0].startswith("out")  # no blow-up in 20 steps: decided at the screen
    trained.clear()
    log = []
    df = U.search(tmp_path / "new", table_path=tmp_path / "t.csv", settings=[(16, 2, 2e-3), (16, 2, 1e-3)],
                  **dict(kw, log=log.append))
    assert {c.lr for c in trained} == {1e-3}  # only the undecided setting trained
    assert any("w16-d2-lr0.002: decided in" in line for line in log)
    assert list(df["setting"]) == ["w16-d2-lr0.002"] * 3 + ["w16-d2-lr0.001"] * 3  # search order: larger LR first
    pd.testing.assert_frame_equal(df.iloc[:3].reset_index(drop=True), first)
    pd.testing.assert_frame_equal(U.read_table(tmp_path / "t.csv"), df)
    assert list(U.merged(tmp_path / "new", tmp_path / "t.csv")["setting"]) == list(df["setting"])


def test_a_table_that_is_not_the_searchs_is_refused(tmp_path):
    (tmp_path / "t.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not the unstable search's table"):
        U.search(tmp_path / "s", table_path=tmp_path / "t.csv", settings=[(16, 2, 2e-3)], steps=20, batch=32,
                 progress=False, log=lambda _: None)
