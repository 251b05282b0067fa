"""``scripts/gpu_lease.sh`` packs everything its jobs write into one archive beside its two logs, so that all of it
comes back through the device tool (at most 8 files from ``$OUT``, at most two folders down)."""

import os
import subprocess
import sys
import tarfile

import gpu_scripts
import pytest

pytestmark = pytest.mark.e2e  # runs the real GPU script end to end on the CPU


def lease(tmp_path, timeout=300, **env):
    """(the finished ``scripts/gpu_lease.sh 12`` run in ``tmp_path`` with ``env`` added, its $OUT folder)."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    env = {**os.environ, "OUT": str(out), **env,
           "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["bash", str(gpu_scripts.ROOT / "scripts" / "gpu_lease.sh"), "12"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout), out


def test_gpu_lease_returns_three_files_and_the_archive_holds_what_the_jobs_wrote(tmp_path):
    done, out = lease(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu_out.tar.gz", "kernels.log", "session.log"]
    assert "no time left for the plan queue" in (out / "session.log").read_text()  # no time left to train
    with tarfile.open(out / "gpu_out.tar.gz") as tar:
        names = tar.getnames()
    assert "./gpu_kernels.log" in names, names  # written by scripts/gpu_kernels.py into the staging folder
    assert "gpu lease: packed" in done.stdout
    assert not (tmp_path / "results").exists() and not (gpu_scripts.ROOT / "gpu_out.tar.gz").exists()


def test_gpu_lease_without_the_kernel_check_and_with_a_bad_choice(tmp_path):
    """KERNELS=none runs no kernel check (no kernels.log); a value it does not know is refused before anything runs."""
    done, out = lease(tmp_path, KERNELS="none")
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu_out.tar.gz", "session.log"]
    with tarfile.open(out / "gpu_out.tar.gz") as tar:
        assert "./gpu_kernels.log" not in tar.getnames()
    bad, _ = lease(tmp_path, timeout=60, KERNELS="fast")
    assert bad.returncode == 2 and "'fast'" in bad.stderr and "probe (default), full, none" in bad.stderr
    assert sorted(p.name for p in out.iterdir()) == ["gpu_out.tar.gz", "session.log"]


def test_gpu_lease_splits_an_archive_too_large_to_come_back(tmp_path):
    """An archive over PART_BYTES (15 MiB by default: the device tool returns no file over 16 MiB) comes back as
    pieces gpu_out.tar.gz.part0, part1, ... that ``cat`` joins into the archive."""
    done, out = lease(tmp_path, PART_BYTES="300")
    assert done.returncode == 0, done.stderr[-3000:]
    parts = sorted(p for p in out.iterdir() if p.name.startswith("gpu_out.tar.gz.part"))
    assert len(parts) >= 2 and not (out / "gpu_out.tar.gz").exists()
    assert all(p.stat().st_size <= 300 for p in parts)
    assert "cat gpu_out.tar.gz.part* | tar xz" in done.stdout
    joined = tmp_path / "joined.tar.gz"
    joined.write_bytes(b"".join(p.read_bytes() for p in parts))
    with tarfile.open(joined) as tar:
        assert "./gpu_kernels.log" in tar.getnames()
