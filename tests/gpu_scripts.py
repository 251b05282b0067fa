"""The repository's GPU scripts (``scripts/gpu_*.sh``) called from a test as a user calls them, on whatever
device runs the test: ``OUT`` set to a temporary folder, the test's Python first on ``PATH``."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def call(script: str, seconds: int, work: Path, out: Path, *options: str, cwd: Path | None = None,
         **env: str) -> subprocess.CompletedProcess:
    """Run ``scripts/<script> SECONDS WORK [OPTIONS...]`` with ``$OUT`` = ``out`` and ``env`` added."""
    env = {**os.environ, "OUT": str(out), **env,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["bash", str(ROOT / "scripts" / script), str(seconds), str(work), *options],
                          cwd=cwd or work.parent, env=env, capture_output=True, text=True, timeout=1200)


def assert_trained(done: subprocess.CompletedProcess, what: str) -> None:
    """The script finished (``<what> exit status 0``) and trained something (a progress bar in its stderr)."""
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{what} exit status 0" in done.stdout and "member-step" in done.stderr, done.stdout[-3000:]
