"""``scripts/gpu_lease.sh`` packs everything its jobs write into one archive beside its two logs, so that all of it
comes back through the device tool (at most 8 files from ``$OUT``, at most two folders down)."""

import os
import subprocess
import sys
import tarfile

import gpu_scripts


def test_gpu_lease_returns_three_files_and_the_archive_holds_what_the_jobs_wrote(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OUT": str(out),
           "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(["bash", str(gpu_scripts.ROOT / "scripts" / "gpu_lease.sh"), "12"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu_out.tar.gz", "kernels.log", "session.log"]
    assert "gpu session: gpu_fig7.sh not started" in (out / "session.log").read_text()  # no time left to train
    with tarfile.open(out / "gpu_out.tar.gz") as tar:
        names = tar.getnames()
    assert "./gpu_kernels.log" in names, names  # written by scripts/gpu_kernels.py into the staging folder
    assert "gpu lease: packed" in done.stdout
    assert not (tmp_path / "results").exists() and not (gpu_scripts.ROOT / "gpu_out.tar.gz").exists()
