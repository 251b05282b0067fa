"""``scripts/gpu_ablations.sh`` end to end at the smoke scale (on whatever device this is): it trains each cell as a
seed ensemble, copies the rates table and every cell's exports into ``$OUT`` (never into the repository), and a
fresh work folder resumes from those exports (as from committed ones) without training again."""

import gpu_scripts
import pandas as pd
import pytest

from mx_proxy.experiments import cell_rates

pytestmark = pytest.mark.e2e  # runs the real GPU script end to end on the CPU

ROOT = gpu_scripts.ROOT
TINY = ["--scale", "smoke", "--steps", "30", "--members", "2"]
CELLS = "act=gelu,norm=layernorm act=relu2,norm=rmsnorm"


def test_gpu_ablations_script_trains_copies_and_resumes_from_the_exports(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    done = gpu_scripts.call("gpu_ablations.sh", 900, work, out, *TINY, NAME="rates_smoke", ABLATION_CELLS=CELLS)
    gpu_scripts.assert_trained(done, "ablation rates")
    table = pd.read_csv(out / "results" / "rates_smoke.csv")
    assert table[["act", "norm", "arm"]].values.tolist() == [
        ["gelu", "layernorm", "fp32"], ["gelu", "layernorm", "mxfp8_e4m3"],
        ["relu2", "rmsnorm", "fp32"], ["relu2", "rmsnorm", "mxfp8_e4m3"]]
    assert set(table["members"]) == {2}
    cells = sorted(p.name for p in (out / "results" / "rates_smoke").iterdir())
    assert cells == sorted(cell_rates.cell_name(cell_rates.parse_cell(c)) for c in CELLS.split())
    assert all((out / "results" / "rates_smoke" / c / "ensemble.json").is_file() for c in cells)
    assert not (ROOT / "results" / "rates_smoke").exists() and not (ROOT / "results" / "rates_smoke.csv").exists()

    fresh, out2 = tmp_path / "fresh", tmp_path / "out2"  # another machine, the first one's exports committed
    again = gpu_scripts.call("gpu_ablations.sh", 900, fresh, out2, *TINY, NAME="rates_smoke", ABLATION_CELLS=CELLS,
                             COMMITTED=str(out / "results" / "rates_smoke"))
    assert again.returncode == 0 and "ablation rates exit status 0" in again.stdout, again.stderr[-3000:]
    assert "member-step" not in again.stderr  # nothing trained again
    pd.testing.assert_frame_equal(pd.read_csv(out2 / "results" / "rates_smoke.csv"), table)
