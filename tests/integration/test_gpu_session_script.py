"""``scripts/gpu_session.sh``: one queue, the kernel slot first, then the plan's GPU units with the time left, every
finished member exported to ``$OUT/results/plan`` and the committed ones (``results/plan``) not trained again."""

import json
import os
import subprocess
import sys

import gpu_scripts
import pytest

from mx_proxy.experiments import plan as P

TINY = {"width": 16, "depth": 1, "batch": 32, "lr": 0.001, "steps": 8, "dot": "f32", "recipe": "fp32",
        "diagnostics_every": 4, "gradient_reference": "same_point", "val_every": 0}


def session(tmp_path, seconds, out, **env):
    env = {**os.environ, "OUT": str(out), "KERNELS": "none", "PLAN_STORE": str(tmp_path / "store"), **env,
           "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["bash", str(gpu_scripts.ROOT / "scripts" / "gpu_session.sh"), str(seconds)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def tiny_plan(tmp_path):
    d = json.loads(P.PLAN_FILE.read_text())
    d["settings"] = {"tiny": TINY}
    d["studies"] = [{"id": "t-gpu", "hypothesis": "H1", "machine": "gpu", "kind": "seed", "setting": "tiny",
                     "arms": ["fp32", "bf16"], "first_seed": 101, "members": 2, "unit": 1, "horizon": 8,
                     "checkpoint_every": 4}]
    d["order"] = {"gpu": ["t-gpu"], "cpu": []}
    d["hypotheses"] = [{"id": "H1", "study": "t-gpu", "question": "?",
                        "primary": {"test": "mcnemar", "a": "fp32", "b": "bf16"}}]
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(d))
    return f


@pytest.mark.e2e
def test_gpu_session_starts_no_unit_without_the_time_for_it(tmp_path):
    done = session(tmp_path, 35, tmp_path / "out", PLAN=str(tiny_plan(tmp_path)))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "t-gpu seeds 101-101 and the units after it not started" in done.stdout
    assert "plan queue: 2 gpu units left, next t-gpu seeds 101-101" in done.stdout
    assert not (tmp_path / "out" / "results" / "plan" / "t-gpu").exists()


def test_gpu_session_refuses_a_kernel_or_bench_choice_it_does_not_know(tmp_path):
    done = session(tmp_path, 100, tmp_path / "out", KERNELS="fast")
    assert done.returncode == 2 and "'fast'" in done.stderr and "probe (default), full, none" in done.stderr
    assert done.stdout == ""
    done = session(tmp_path, 100, tmp_path / "out", BENCH="step")
    assert done.returncode == 2 and "'step'" in done.stderr and "none (default), members" in done.stderr


@pytest.mark.e2e
def test_gpu_session_benchmarks_the_members_before_the_queue(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    done = session(tmp_path, 60, out, BENCH="members", PLAN=str(tiny_plan(tmp_path)),
                   BENCH_OPTIONS="--width 16 --depth 1 --batch 16 --dot f32 --recipes fp32 --members 1,2 --twin no "
                                 "--diagnostics never --steps 2 --repeats 1")
    assert done.returncode == 0, done.stderr[-3000:]
    log = (out / "bench_members.log").read_text()
    assert "fastest group size" in log and "profile of fp32" in log and (out / "profile").is_dir()
    assert "plan queue:" in done.stdout


@pytest.mark.e2e
def test_gpu_session_exports_to_out_and_the_next_window_resumes_from_the_committed_members(tmp_path):
    plan = str(tiny_plan(tmp_path))
    first = session(tmp_path, 600, tmp_path / "out1", PLAN=plan, PLAN_OPTIONS="--min-seconds 0")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "plan queue: 0 gpu units left" in first.stdout
    exported = tmp_path / "out1" / "results" / "plan" / "t-gpu"
    assert sorted(p.name for p in exported.iterdir() if (p / "run.json").exists()) == \
        ["bf16-m00", "bf16-m01", "fp32-m00", "fp32-m01"]
    assert json.loads((exported / "fp32-m00" / "run.json").read_text())["device"].startswith("cpu: ")
    # the next window: a fresh machine (store), this window's members committed in its tree: nothing to train
    second = session(tmp_path, 600, tmp_path / "out2", PLAN=plan, PLAN_STORE=str(tmp_path / "store2"),
                     PLAN_COMMITTED=str(tmp_path / "out1" / "results" / "plan"))
    assert second.returncode == 0, second.stderr[-3000:]
    assert "plan queue: 0 gpu units left" in second.stdout
    assert not (tmp_path / "out2" / "results" / "plan" / "t-gpu").exists() or not any(
        (p / "run.json").exists() for p in (tmp_path / "out2" / "results" / "plan" / "t-gpu").iterdir())
