"""``scripts/gpu_seeds.sh`` end to end at width 16 (on whatever device this is): it trains the seed ensemble,
copies its exports into ``$OUT`` and prints the ensemble's report; a second call loads, trains nothing."""

import gpu_scripts
import pytest

from mx_proxy.experiments import ensemble_result, report

pytestmark = pytest.mark.e2e  # runs the real GPU script end to end on the CPU


def _call(work, out):
    tiny = ["--width", "16", "--steps", "30", "--batch", "32", "--members", "2", "--arms", "fp32", "mxfp8_e4m3"]
    return gpu_scripts.call("gpu_seeds.sh", 900, work, out, *tiny)


def test_gpu_seeds_script_trains_exports_and_reports(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    done = _call(work, out)
    gpu_scripts.assert_trained(done, "paper seeds")
    dest = out / "results" / "ensembles" / "seeds-w512"
    res = ensemble_result.load(dest)
    assert res.spec.kind == "seed" and res.spec.arms == ("fp32", "mxfp8_e4m3")
    assert all(r is not None and r.config.width == 16 and r.config.seed == i + 1
               for runs in res.runs.values() for i, r in enumerate(runs))
    text = (work / "report.md").read_text()
    assert text == report.for_folder(dest) and text in done.stdout
    again = _call(work, out)  # everything exported: loaded, nothing trained
    assert again.returncode == 0 and "[paper seeds] fp32 members [0, 1] exported" in again.stdout
    assert "member-step/s" not in again.stderr
