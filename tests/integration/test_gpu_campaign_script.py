"""``scripts/gpu_campaign.sh`` end to end at the smoke scale (on whatever device this is): it trains, exports,
copies the results and figures into ``$OUT`` and prints the headline report."""

import gpu_scripts
import pytest

from mx_proxy.experiments import report

pytestmark = pytest.mark.e2e  # runs the real GPU script end to end on the CPU


def test_gpu_campaign_script_copies_results_figures_and_the_report(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    done = gpu_scripts.call("gpu_campaign.sh", 900, work, out, SCALE="smoke")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "campaign exit status 0" in done.stdout
    results = out / "results" / "smoke"
    assert (results / "index.csv").exists() and any(results.glob("paired-*/metrics.parquet"))
    assert {p.name for p in (out / "figures").glob("headline_*.png")} >= {"headline_zeta.png",
                                                                         "headline_interventions.png"}
    text = (work / "report.md").read_text()
    assert text == report.for_folder(results) and text in done.stdout
