"""Tests never read or write a run store unless they pass one (a tmp folder): ``store=None`` is the default.

The test process is headless: figures render with matplotlib's Agg backend
(``MPLBACKEND``, unless the caller chose one). The notebook test removes it
again for its kernels, which must use their own inline backend."""

import os
import subprocess
import sys

os.environ.setdefault("MPLBACKEND", "Agg")


def dead_pid() -> int:
    """The id of a process that has exited: how a test plays a killed trainer."""
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)


def killed_run_folder(store, key) -> str:
    """Where a killed process was training the run ``key`` in ``store``."""
    return os.path.join(store, f"{key}.partial-{dead_pid()}")


def pytest_terminal_summary(terminalreporter):
    """What the order-aware comparisons (tests/exactness.py) found, when any ran in this process."""
    import exactness

    line = exactness.summary()
    if line:
        terminalreporter.write_line(line)
