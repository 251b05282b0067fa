"""Tests never read or write a run store unless they pass one (a tmp folder): ``store=None`` is the default.

The test process is headless: figures render with matplotlib's Agg backend
(``MPLBACKEND``, unless the caller chose one). The notebook test removes it
again for its kernels, which must use their own inline backend.

XLA compiles the suite's programs with its backend (LLVM) optimizations off: the suite's shapes are tiny and its
time is mostly compilation, which this shortens by a fifth to a third (docs/benchmarks.md, "The test suite").
XLA's HLO passes, its code generators and the dot libraries are the same at either level, but LLVM's
optimizations change float32 results in the last bits: at the default level it contracts ``a * b + c`` into FMAs
and vectorizes reductions and elementwise loops, so sums add in another order (measured 2026-12-03: 2–4 % of the
elements of ``exp``, ``tanh`` or ``sqrt`` differ by 2–4 ulp, 29 % of ``a * b + c``, 59 % of a row ``mean``, more
ulps where a result is near zero; the losses of a 30-step width-64 run differ from step 0–2 on, by up to 2e-7
relative in FP32 and 4e-4 in MXFP8, where a flipped rounding moves a quantized value). So a result of the suite
is not bit for bit a user's. Every check compares results computed under the same flags, or with an independent
reference through a rounding model, and holds at either level; the claims that two different programs agree bit
for bit (twin groups, vmapped sweeps, resumes, controllers, quantization statistics on and off) also passed with
``MX_PROXY_TEST_XLA_OPT=default``, which keeps XLA's default level, as users run it (docs/benchmarks.md says
when). Subprocesses and notebook kernels inherit the flag."""

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


def pytest_configure(config):
    """``MX_PROXY_TEST_COMPILE_LOG=DIR``: record where each test process's compilation time goes
    (tests/compile_log.py; ``scripts/suite_time.py --compile-log DIR`` prints it)."""
    folder = os.environ.get("MX_PROXY_TEST_COMPILE_LOG")
    if folder:
        import compile_log

        compile_log.install(config, folder)


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
