"""``scripts/gpu_session.sh`` gives each GPU script the time left, in order, and starts none it cannot give 30 s."""

import os
import subprocess

import gpu_scripts


def test_gpu_session_starts_no_job_without_the_time_for_it(tmp_path):
    done = subprocess.run(["bash", str(gpu_scripts.ROOT / "scripts" / "gpu_session.sh"), "10"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [line.split(" not started")[0] for line in done.stdout.splitlines()] == [
        f"gpu session: gpu_{job}.sh" for job in ("moreseeds", "ablations", "fig7", "seeds", "search")]
    assert not (tmp_path / "results").exists()


def test_gpu_session_gives_the_fig7_replica_its_options_and_the_others_none(tmp_path):
    """Each job called as ``scripts/JOB SECONDS WORK [OPTIONS]`` (stand-ins that print their arguments): the Fig. 7
    replica gets ``$FIG7_OPTIONS``, by default the two mechanism arms appended."""
    (tmp_path / "scripts").mkdir()
    session = tmp_path / "scripts" / "gpu_session.sh"
    session.write_text((gpu_scripts.ROOT / "scripts" / "gpu_session.sh").read_text())
    for job in ("gpu_moreseeds.sh", "gpu_ablations.sh", "gpu_fig7.sh", "gpu_seeds.sh", "gpu_search.sh"):
        (tmp_path / "scripts" / job).write_text(f'echo "{job} $2 ${{@:3}}"\n')

    def jobs(**env):
        done = subprocess.run(["bash", str(session), "100"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=60, env={**os.environ, **env})
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    assert jobs() == ["gpu_moreseeds.sh /tmp/proxy-moreseeds ", "gpu_ablations.sh /tmp/proxy-ablations ",
                      "gpu_fig7.sh /tmp/proxy-fig7 --arms adam_eps=1e-15 train_ln_bias",
                      "gpu_seeds.sh /tmp/proxy-seeds ", "gpu_search.sh /tmp/proxy-search "]
    options = "--arms rceil --group-size 4"
    assert jobs(FIG7_OPTIONS=options)[2] == f"gpu_fig7.sh /tmp/proxy-fig7 {options}"
    assert jobs(FIG7_OPTIONS="")[2] == "gpu_fig7.sh /tmp/proxy-fig7 "
    settings = "--settings w256-d4-lr0.002"
    assert jobs(SEARCH_OPTIONS=settings)[4] == f"gpu_search.sh /tmp/proxy-search {settings}"
    assert jobs(GPU_JOBS="search fig7") == ["gpu_search.sh /tmp/proxy-search ",
                                           "gpu_fig7.sh /tmp/proxy-fig7 --arms adam_eps=1e-15 train_ln_bias"]
    assert jobs(GPU_JOBS="") == []


def test_gpu_session_refuses_a_job_it_does_not_know(tmp_path):
    done = subprocess.run(["bash", str(gpu_scripts.ROOT / "scripts" / "gpu_session.sh"), "100"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, env={**os.environ, "GPU_JOBS": "seeds fig8"})
    assert done.returncode == 2
    assert "'fig8'" in done.stderr and "moreseeds ablations fig7 seeds search" in done.stderr
    assert done.stdout == "" and not (tmp_path / "results").exists()  # refused before any job started
