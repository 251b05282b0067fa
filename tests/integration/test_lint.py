"""`ruff check` over the repository passes with the configuration in pyproject.toml ([tool.ruff]): line length,
import order, pyflakes, bugbear, pyupgrade. Read-only (``--no-cache``: nothing is written into the repo)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_check_passes():
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                         cwd=ROOT, capture_output=True, text=True, check=False)
    assert "No module named ruff" not in out.stderr, "ruff is missing: pip install -e '.[test]'"
    assert out.returncode == 0, f"ruff check found problems:\n{out.stdout}{out.stderr}"
