"""Where the suite's compilation time goes, per test and per program (a pytest plugin).

Loaded by ``tests/conftest.py`` when ``MX_PROXY_TEST_COMPILE_LOG`` names a folder: every test process (each
xdist worker) adds up JAX's own compile-time events (``jax.monitoring``: tracing, lowering to MLIR, XLA's
backend) per test and per program name, and writes them to ``<folder>/<worker>.json`` when its session ends.
``python scripts/suite_time.py --compile-log DIR`` sets it and prints the summary (:func:`summary`).
Subprocesses and notebook kernels are not counted: their time shows in the test's own duration.
"""

from __future__ import annotations

import collections
import json
import os
from pathlib import Path

EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace",
          "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
          "/jax/core/compile/backend_compile_duration": "backend"}


class CompileLog:
    """Seconds per (test, kind) and per (program, kind), and the number of backend compilations per program."""

    def __init__(self, folder: str):
        self.folder = Path(folder)
        self.test = "(outside tests)"
        self.per_test: dict[str, dict[str, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
        self.per_program: dict[str, dict[str, float]] = collections.defaultdict(
            lambda: collections.defaultdict(float))

    def record(self, event: str, duration: float, fun_name: str = "?", **_):
        kind = EVENTS.get(event)
        if kind is None:
            return
        name = fun_name[4:-1] if fun_name.startswith("jit(") and fun_name.endswith(")") else fun_name
        self.per_test[self.test][kind] += duration
        self.per_program[name][kind] += duration
        if kind == "backend":
            self.per_program[name]["compilations"] += 1

    def count(self, event: str, **_):
        if event in ("/jax/compilation_cache/cache_hits", "/jax/compilation_cache/cache_misses"):
            self.per_test[self.test][event.rsplit("/", 1)[1]] += 1

    def pytest_runtest_setup(self, item):
        self.test = item.nodeid

    def pytest_sessionfinish(self, session):
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / f".{worker}.json.tmp"
        tmp.write_text(json.dumps({"per_test": self.per_test, "per_program": self.per_program}))
        tmp.replace(self.folder / f"{worker}.json")


def install(config, folder: str) -> None:
    """Register the plugin and its ``jax.monitoring`` listener in this process."""
    from jax import monitoring

    log = CompileLog(folder)
    monitoring.register_event_duration_secs_listener(log.record)
    monitoring.register_event_listener(log.count)
    config.pluginmanager.register(log, "mx_proxy_compile_log")


def summary(folder: str | Path, top: int = 15) -> str:
    """The workers' logs in ``folder`` added up: seconds per kind, then the ``top`` programs and test files by
    backend compile time."""
    tests: dict[str, dict[str, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
    programs: dict[str, dict[str, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
    for path in sorted(Path(folder).glob("*.json")):
        log = json.loads(path.read_text())
        for into, key in ((tests, "per_test"), (programs, "per_program")):
            for name, kinds in log[key].items():
                for kind, v in kinds.items():
                    into[name.split("::")[0] if key == "per_test" else name][kind] += v
    total = {k: sum(t.get(k, 0.0) for t in tests.values()) for k in (*EVENTS.values(), "cache_hits", "cache_misses")}
    lines = ["compilation in the test processes (worker-seconds): "
             + ", ".join(f"{k} {total[k]:.0f}" for k in EVENTS.values())
             + f"; persistent cache: {total['cache_hits']:.0f} hits, {total['cache_misses']:.0f} misses"]
    for title, table, extra in (("programs", programs, "compilations"), ("test files", tests, None)):
        lines.append(f"top {top} {title} by backend seconds:")
        for name, kinds in sorted(table.items(), key=lambda kv: -kv[1].get("backend", 0.0))[:top]:
            n = f" in {int(kinds[extra])} compilations" if extra else ""
            lines.append(f"  {kinds.get('backend', 0.0):7.1f} s backend, {kinds.get('trace', 0.0):6.1f} s trace, "
                         f"{kinds.get('lower', 0.0):6.1f} s lower{n}  {name}")
    return "\n".join(lines)
