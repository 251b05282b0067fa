"""``scripts/gpu_search.sh`` end to end at width 16 (on whatever device this is): it starts from the committed
table, searches, copies the rewritten table and the carried members into ``$OUT`` (never into the repository)
and prints the status; a second call trains nothing."""

import gpu_scripts
import pandas as pd
import pytest

from mx_proxy.experiments import ensemble as E
from mx_proxy.experiments import unstable_search as U

pytestmark = pytest.mark.e2e  # runs the real GPU script end to end on the CPU

ROOT = gpu_scripts.ROOT


def _call(work, out):
    tiny = ["--settings", "w16-d2-lr0.003", "w16-d2-lr0.001", "--steps", "30", "--batch", "32"]
    return gpu_scripts.call("gpu_search.sh", 900, work, out, *tiny)


def test_gpu_search_script_carries_the_committed_table_searches_and_copies_it(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    done = _call(work, out)
    gpu_scripts.assert_trained(done, "unstable search")
    committed = U.read_table(ROOT / "results" / "unstable_search.csv")
    got = U.read_table(out / "results" / "unstable_search.csv")
    pd.testing.assert_frame_equal(U.read_table(work / "unstable_search.csv"), got)
    mine = got[got["setting"].str.startswith("w16-")].reset_index(drop=True)
    assert list(mine["setting"]) == ["w16-d2-lr0.003"] * 3 + ["w16-d2-lr0.001"] * 3
    assert mine["verdict"].iloc[0].startswith("out: no MX blow-up") and set(mine["stage"].iloc[3:]) == {"skipped"}
    carried = got[~got["setting"].str.startswith("w16-")].reset_index(drop=True)
    pd.testing.assert_frame_equal(carried, committed[committed["setting"].isin(U.decided(committed))]
                                  .reset_index(drop=True))
    assert (work / "status.txt").read_text() in done.stdout and "w16-d2-lr0.003" in done.stdout
    members = out / "results" / "unstable_search" / "w16-d2-lr0.003"
    exported = sorted(f.relative_to(members) for f in members.rglob("*") if f.is_file())
    assert {f.parts[0] for f in exported if len(f.parts) > 1} == {
        E.member_label(a, i) for a in U.MX_ARMS for i in range(U.SCREEN)}
    assert all((members / f).read_bytes() == (work / "carried" / "w16-d2-lr0.003" / f).read_bytes() for f in exported)
    assert not (ROOT / "results" / "unstable_search" / "w16-d2-lr0.003").exists()
    again = _call(work, out)  # everything decided: nothing trained, the same table
    assert again.returncode == 0 and "member-step/s" not in again.stderr
    pd.testing.assert_frame_equal(U.read_table(out / "results" / "unstable_search.csv"), got)
