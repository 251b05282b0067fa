"""scripts/tier_coverage.py: the per-package table of the two tiers' line coverage, from coverage.py data files
written here for a toy package (no test run of the suite itself)."""

import importlib.util
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("tier_coverage", ROOT / "scripts" / "tier_coverage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_packages_are_the_folders_under_mx_proxy_and_top_level_modules_are_mx_proxy():
    tc = _script()
    assert tc.package("mx_proxy/numerics/mx/block_scale.py") == "mx_proxy/numerics"
    assert tc.package("mx_proxy/version.py") == "mx_proxy"


def test_the_table_sums_statements_per_package_and_flags_a_loss_and_a_module_at_zero():
    tc = _script()
    both = {"mx_proxy/a/x.py": (100, 90), "mx_proxy/a/y.py": (50, 50), "mx_proxy/b/z.py": (10, 10),
            "mx_proxy/version.py": (4, 4)}
    unit = {"mx_proxy/a/x.py": (100, 88), "mx_proxy/a/y.py": (50, 49), "mx_proxy/b/z.py": (10, 10),
            "mx_proxy/version.py": (4, 4)}
    text, ok = tc.table(unit, both, max_loss=5.0)
    # package a: 150 statements, unit 137 (91.3 %), both 140 (93.3 %)
    assert "| `mx_proxy/a` | 150 | 91.3 % | 93.3 % | 2.0 points |" in text
    assert "| `mx_proxy` | 4 | 100.0 % | 100.0 % | 0.0 points |" in text
    assert ok and text.endswith("covers: none.")
    # a module the unit tier never runs (absent from its data) fails the check, and so does a loss over the limit
    text, ok = tc.table({k: v for k, v in unit.items() if k != "mx_proxy/b/z.py"}, both, max_loss=5.0)
    assert not ok and "`mx_proxy/b/z.py`" in text.splitlines()[-1]
    assert "| `mx_proxy/b` | 10 | 0.0 % | 100.0 % | 100.0 points |" in text
    assert not tc.table(unit, both, max_loss=1.0)[1]


def test_per_file_reads_a_coverage_data_file(tmp_path):
    """The statements and hits of real coverage.py data, for files under the repo's mx_proxy only."""
    coverage = pytest.importorskip("coverage")
    tc = _script()
    data = tmp_path / "cov"
    cov = coverage.Coverage(data_file=str(data), include=[str(ROOT / "mx_proxy" / "version.py")])
    cov.start()
    runpy.run_path(str(ROOT / "mx_proxy" / "version.py"))  # executed afresh, the imported module untouched
    cov.stop()
    cov.save()
    got = tc.per_file(data)
    assert list(got) == ["mx_proxy/version.py"]
    n, hit = got["mx_proxy/version.py"]
    assert 0 < hit <= n


def test_from_a_folder_without_the_data_files_is_exit_status_2(tmp_path):
    tc = _script()
    with pytest.raises(SystemExit) as e:
        tc.main(["--from", str(tmp_path)])
    assert e.value.code == 2
