"""tests/compile_log.py: compile-time events added up per test and per program, written per worker, summed;
scripts/suite_time.py refuses a log folder that an earlier run filled and counts the CPU time of every
process its command starts."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from mx_proxy.cli.bench import machine

from compile_log import CompileLog, summary


class _Item:
    def __init__(self, nodeid):
        self.nodeid = nodeid


def test_events_add_up_per_test_and_program_and_the_summary_reads_every_worker(tmp_path, monkeypatch):
    for worker, scale in (("gw0", 1.0), ("gw1", 2.0)):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        log = CompileLog(str(tmp_path))
        log.pytest_runtest_setup(_Item("tests/a/test_x.py::test_one"))
        log.record("/jax/core/compile/jaxpr_trace_duration", 0.5 * scale, fun_name="segment")
        log.record("/jax/core/compile/backend_compile_duration", 3.0 * scale, fun_name="jit(segment)")
        log.record("/jax/core/compile/jaxpr_to_mlir_module_duration", 0.25 * scale, fun_name="jit(segment)")
        log.record("/jax/some/other_duration", 99.0, fun_name="jit(segment)")  # not a compile event: ignored
        log.count("/jax/compilation_cache/cache_misses")
        log.pytest_runtest_setup(_Item("tests/b/test_y.py::test_two[1]"))
        log.record("/jax/core/compile/backend_compile_duration", 1.0 * scale, fun_name="jit(add)")
        log.count("/jax/compilation_cache/cache_hits")
        log.pytest_sessionfinish(None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gw0.json", "gw1.json"]  # no temporary file left
    text = summary(tmp_path, top=5)
    lines = text.splitlines()
    assert lines[0] == ("compilation in the test processes (worker-seconds): trace 2, lower 1, backend 12; "
                        "persistent cache: 2 hits, 2 misses")
    programs = lines[2:4]
    assert programs[0].split() == ["9.0", "s", "backend,", "1.5", "s", "trace,", "0.8", "s", "lower", "in", "2",
                                   "compilations", "segment"]
    assert programs[1].endswith("in 2 compilations  add")
    assert lines[5].endswith("tests/a/test_x.py") and lines[6].endswith("tests/b/test_y.py")


def test_a_real_compilation_is_recorded(tmp_path):
    log = CompileLog(str(tmp_path))
    jax.monitoring.register_event_duration_secs_listener(log.record)
    try:
        log.pytest_runtest_setup(_Item("here"))
        unique = float(int.from_bytes(str(tmp_path).encode()[-6:], "little") % 9973)  # never a cache hit
        jax.jit(lambda x: jnp.sin(x) * 3.0 + unique)(jnp.arange(7.0)).block_until_ready()
    finally:
        jax.monitoring.unregister_event_duration_listener(log.record)
    (name,) = [n for n in log.per_program if n == "<lambda>"]
    assert log.per_program[name]["compilations"] == 1 and log.per_program[name]["backend"] > 0
    assert log.per_test["here"]["trace"] > 0 and log.per_test["here"]["lower"] > 0


def test_suite_time_refuses_a_log_folder_of_an_earlier_run_before_cloning(tmp_path):
    """scripts/suite_time.py would add an earlier run's logs to this one's summary: it exits 2 naming the folder."""
    (tmp_path / "gw0.json").write_text("{}")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(root / "scripts" / "suite_time.py"), "--compile-log", str(tmp_path),
                           "--keep", str(tmp_path / "clone")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert f"--compile-log {tmp_path}" in done.stderr and "earlier run" in done.stderr
    assert not (tmp_path / "clone").exists()


def _suite_time():
    path = Path(__file__).resolve().parents[2] / "scripts" / "suite_time.py"
    spec = importlib.util.spec_from_file_location("suite_time", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_suite_time_counts_the_cpu_of_grandchildren_and_states_it_per_core():
    """The command's CPU time includes what its own subprocesses computed (a grandchild here, as pytest's
    workers and their notebook kernels are): at least the CPU time the grandchild measured for itself, at
    most every core for the whole wall time."""
    st = _suite_time()
    burn = "import time\nwhile time.process_time() < 0.3: pass\nprint(time.process_time())"
    proc, wall, cpu = st.run_timed(f"{sys.executable} -c '{burn}' && true")
    own = float(proc.stdout)
    cores = machine.cpu()["cores"]
    assert proc.returncode == 0 and own >= 0.3
    assert own <= cpu <= wall * cores + 0.05
    assert st.cpu_share(300.0, 200.0, 2) == "1.50 of 2 cores busy on average (75 %; 5.0 CPU-min)"


def test_suite_time_reads_each_tier_from_the_readme(tmp_path):
    """The unit tier is the opening block's first pytest line without ``-m e2e``, the end-to-end tier the one
    with it, whichever comes first; comments are skipped, an unknown tier is a ValueError naming the choices."""
    st = _suite_time()
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n```bash\n# python -m pytest -m e2e commented out\npython -m pytest -q -m e2e\n"
                      "pip install -e . && python -m pytest -n 3 -q\n```\n\n```bash\npython -m pytest later\n```\n")
    assert st.readme_test_command(readme) == "pip install -e . && python -m pytest -n 3 -q"
    assert st.readme_test_command(readme, "e2e") == "python -m pytest -q -m e2e"
    with pytest.raises(ValueError, match="tier='slow'; valid: unit, e2e"):
        st.readme_test_command(readme, "slow")
    readme.write_text("```bash\npip install -e . && python -m pytest -q\n```\n")
    with pytest.raises(SystemExit, match="no e2e pytest command"):
        st.readme_test_command(readme, "e2e")
