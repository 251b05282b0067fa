"""``scripts/gpu_campaign.sh`` end to end at the smoke scale (on whatever device this is): it trains, exports,
copies the results and figures into ``$OUT`` and prints the headline report."""

import os
import subprocess
import sys
from pathlib import Path

from mx_proxy.experiments import report

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_campaign_script_copies_results_figures_and_the_report(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "OUT": str(out), "SCALE": "smoke",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_campaign.sh"), "900", str(work)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "campaign exit status 0" in done.stdout
    results = out / "results" / "smoke"
    assert (results / "index.csv").exists() and any(results.glob("paired-*/metrics.parquet"))
    assert {p.name for p in (out / "figures").glob("headline_*.png")} >= {"headline_zeta.png",
                                                                         "headline_interventions.png"}
    text = (work / "report.md").read_text()
    assert text == report.for_folder(results) and text in done.stdout
