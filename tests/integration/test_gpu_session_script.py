"""``scripts/gpu_session.sh`` gives each GPU script the time left, in order, and starts none it cannot give 30 s."""

import subprocess

import gpu_scripts


def test_gpu_session_starts_no_job_without_the_time_for_it(tmp_path):
    done = subprocess.run(["bash", str(gpu_scripts.ROOT / "scripts" / "gpu_session.sh"), "10"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [line.split(" not started")[0] for line in done.stdout.splitlines()] == [
        "gpu session: gpu_fig7.sh", "gpu session: gpu_seeds.sh", "gpu session: gpu_search.sh"]
    assert not (tmp_path / "results").exists()
