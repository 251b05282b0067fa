"""``scripts/gpu_moreseeds.sh`` end to end at width 16 (on whatever device this is): it trains the seed ensemble
from seed 9 on, copies its exports into ``$OUT`` (never into the repository) and prints the ensemble's report; a
second call trains nothing, nor does a fresh work folder that starts from those exports (as from committed ones)."""

import gpu_scripts
import pytest

from mx_proxy.experiments import ensemble_result, report

pytestmark = pytest.mark.e2e  # runs the real GPU script end to end on the CPU

TINY = ["--width", "16", "--steps", "30", "--horizon", "30", "--batch", "32", "--members", "2", "--group-size", "2",
        "--arms", "fp32", "mxfp8_e4m3"]


def test_gpu_moreseeds_script_trains_exports_and_reports(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    done = gpu_scripts.call("gpu_moreseeds.sh", 900, work, out, *TINY)
    gpu_scripts.assert_trained(done, "more seeds")
    dest = out / "results" / "ensembles" / "w256-d4-lr0.002-s9"
    res = ensemble_result.load(dest)
    assert res.spec.kind == "seed" and res.spec.arms == ("fp32", "mxfp8_e4m3") and res.spec.seeds() == [9, 10]
    # the search's member config (its committed seed 1), but for the test's overrides and the seed
    search = ensemble_result.load(gpu_scripts.ROOT / "results" / "unstable_search" / "w256-d4-lr0.002").runs
    config, want = res.runs["fp32"][0].config, search["fp32"][0].config
    assert config.replace(width=256, steps=7000, batch=2048, seed=1, data_seed=1) == want
    text = (work / "report.md").read_text()
    assert text == report.for_folder(dest) and text in done.stdout
    again = gpu_scripts.call("gpu_moreseeds.sh", 900, work, out, *TINY)  # everything exported: nothing trained
    assert again.returncode == 0 and "member-step" not in again.stderr, again.stderr[-2000:]

    fresh, out2 = tmp_path / "fresh", tmp_path / "out2"  # another machine, the first one's exports committed
    resumed = gpu_scripts.call("gpu_moreseeds.sh", 900, fresh, out2, *TINY, COMMITTED=str(dest))
    assert resumed.returncode == 0 and "more seeds exit status 0" in resumed.stdout, resumed.stderr[-3000:]
    assert "member-step" not in resumed.stderr  # nothing trained again
    assert (out2 / "results" / "ensembles" / "w256-d4-lr0.002-s9" / "index.csv").read_text() == \
        (dest / "index.csv").read_text()
    assert not (gpu_scripts.ROOT / "results" / "ensembles" / "w256-d4-lr0.002-s9").exists()
