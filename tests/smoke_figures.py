"""The figures command at the smoke scale, run once per test session and shared by the tests that need its runs.

``mx-proxy figures --scale smoke`` trains every experiment of :mod:`mx_proxy.experiments.paper` (about 45 runs,
most of its time compiling their programs), and the notebooks at the smoke scale train the same runs again. So the
suite runs the command once: :func:`make` runs it under a file lock in a folder that every pytest-xdist worker of
the session shares (the first worker to ask runs it, the other waits and reads the outcome), and records what it
did (exit status, stdout, stderr) beside its figures and run store. ``tests/viz/test_figures.py`` checks that outcome
as the command's first call; every notebook test starts from a copy of its store, so a notebook trains only the
runs the command does not, and the systems table of ``tests/experiments/test_systems.py`` reads its smoke runs
from one (docs/benchmarks.md, "The test suite"). :func:`order` runs the command's own test first
and the tests that copy its store last, so that with two workers neither waits for it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

FIXTURE = "smoke_figures"   # the command's outcome
OWN_TEST = "test_figures_command_writes_every_png_at_smoke_and_reuses_runs"  # checks that outcome


@dataclass(frozen=True)
class SmokeFigures:
    """What the one run of ``mx-proxy figures --scale smoke`` left: ``out`` (its figures), ``store`` (its run
    store, read-only for the tests: copy it with :func:`copy_store`) and the finished process's outcome."""

    out: Path
    store: Path
    returncode: int
    stdout: str
    stderr: str


def command(out: Path, store: Path, *extra: str) -> list[str]:
    """The figures command at the smoke scale, writing into ``out`` and ``store`` (no committed results read)."""
    return [sys.executable, "-m", "mx_proxy.cli", "figures", "--scale", "smoke", "--out", str(out), "--store",
            str(store), "--results", str(out / "no-results"), *extra]


def environment() -> dict[str, str]:
    """The suite's environment with the headless backend (the compilation cache, $PROXY_COMPILE_CACHE, is shared)."""
    return dict(os.environ, MPLBACKEND="Agg")


def make(folder: Path) -> SmokeFigures:
    """Run the command into ``folder`` unless a worker of this session already has (or is: then wait for it)."""
    folder.mkdir(parents=True, exist_ok=True)
    done = folder / "outcome.json"
    with FileLock(str(folder / "outcome.lock")):
        if not done.exists():
            p = subprocess.run(command(folder / "figs", folder / "runs"), env=environment(), capture_output=True,
                               text=True, timeout=1800)
            tmp = folder / "outcome.json.tmp"
            tmp.write_text(json.dumps({"returncode": p.returncode, "stdout": p.stdout, "stderr": p.stderr}))
            tmp.replace(done)
    outcome = json.loads(done.read_text())
    return SmokeFigures(out=folder / "figs", store=folder / "runs", **outcome)


def shared_folder(tmp_path_factory) -> Path:
    """A folder shared by every xdist worker of this session (without xdist: the session's own base folder)."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "smoke-figures"


def copy_store(smoke: SmokeFigures, to: Path) -> Path:
    """A private copy of the command's run store at ``to`` (empty when the command stored nothing)."""
    if smoke.store.is_dir():
        shutil.copytree(smoke.store, to, ignore=shutil.ignore_patterns(".locks", "*.partial-*"))
    else:
        to.mkdir(parents=True)
    return to


def order(items) -> None:
    """In place: the command's own test first, the other tests that use its outcome (its store) last (stable)."""
    def rank(item):
        if FIXTURE not in getattr(item, "fixturenames", ()):
            return 1
        return 0 if getattr(item, "originalname", item.name) == OWN_TEST else 2

    items.sort(key=rank)
