"""Tests never read or write a run store unless they pass one (a tmp folder): ``store=None`` is the default.

The test process is headless: figures render with matplotlib's Agg backend
(``MPLBACKEND``, unless the caller chose one). The notebook test removes it
again for its kernels, which must use their own inline backend.

XLA compiles the suite's programs with its backend (LLVM) optimizations off: the suite's shapes are tiny and
its time is mostly compilation, which this shortens by a third to a half (docs/benchmarks.md, "The test suite").
XLA's HLO passes, the dot libraries and every result are unchanged (no fast-math at any level: IEEE float32
arithmetic rounds the same whether or not LLVM vectorizes it; the bit-exact tests say so). Subprocesses and
notebook kernels inherit it. ``MX_PROXY_TEST_XLA_OPT=default`` keeps XLA's default level, as users run it."""

import gc
import os
import signal
import subprocess
import sys

import pytest
from hypothesis import settings

os.environ.setdefault("MPLBACKEND", "Agg")

# before anything initializes a JAX backend (XLA reads its flags once per process)
TEST_XLA_FLAG = "--xla_backend_optimization_level=0"
if (os.environ.get("MX_PROXY_TEST_XLA_OPT", "fast") != "default"
        and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", "")):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAG}".strip()

# Property tests compile JAX programs: their first examples take seconds, so no per-example deadline
# (the modules' own settings say so too; this covers any new one).
settings.register_profile("proxy", deadline=None)
settings.load_profile("proxy")


@pytest.fixture
def sigint_raises():
    """SIGINT raises KeyboardInterrupt for the test, as in a terminal or a Jupyter kernel, also where the suite was
    started in the background of a non-interactive shell (which starts it with SIGINT ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture
def trained():
    """The configs the runner actually trains during a test (its timing-free hook), in order."""
    from mx_proxy.runner import loop as runner

    log = []
    runner.hooks.append(log.append)
    yield log
    runner.hooks.remove(log.append)


def dead_pid() -> int:
    """The id of a process that has exited: how a test plays a killed trainer."""
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)


def killed_run_folder(store, key) -> str:
    """Where a killed process was training the run ``key`` in ``store``."""
    return os.path.join(store, f"{key}.partial-{dead_pid()}")


def pytest_runtest_teardown(item, nextitem):
    """Between test modules, give back the compiled programs of a worker that
    holds many: every XLA:CPU executable keeps memory mappings of its own, and
    a long-lived xdist worker that compiles hundreds of programs would
    otherwise approach Linux's per-process cap (vm.max_map_count), where XLA
    crashes. The library releases its own least recently used programs near
    half the cap (mx_proxy.store.executables); here, at 40 %, everything goes."""
    if nextitem is not None and nextitem.module is item.module or "mx_proxy.store.executables" not in sys.modules:
        return
    executables = sys.modules["mx_proxy.store.executables"]
    usage = executables.map_usage()
    if usage is not None and usage[0] > 0.4 * usage[1]:
        executables.release_all()
        sys.modules["jax"].clear_caches()


def pytest_sessionfinish(session):
    """Collect the heap once, and freeze what survives, before an xdist worker
    reports that it has finished.

    After that report the controller gives the worker's remaining teardown
    (pytest's final garbage collection among it) 5 seconds, then execnet sends
    the worker a SIGINT. After hours of JAX programs a full collection of the
    heap outlasts that on a busy 2-core machine, and the KeyboardInterrupt
    surfaces in the first Python code after the collection: hypothesis's gc
    callback, which cannot raise, hence a ``PytestUnraisableExceptionWarning
    ... KeyboardInterrupt`` at the end of the run. Collected and frozen here,
    while the controller still waits, the later collections have nothing to
    walk."""
    if "jax" in sys.modules:
        sys.modules["jax"].clear_caches()
    gc.collect()
    gc.freeze()


def pytest_terminal_summary(terminalreporter):
    """What the order-aware comparisons (tests/exactness.py) found, when any ran in this process."""
    import exactness

    line = exactness.summary()
    if line:
        terminalreporter.write_line(line)
