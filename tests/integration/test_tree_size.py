"""The tracked tree stays small enough to travel: a job sent to a lent GPU machine carries at most 64 MiB of
working tree, tracked files included. Every tracked run table is in the compact format (store/tables.py; a
legacy one is ~2.2x larger), and the tracked files together stay within :data:`BUDGET`. Skipped outside a git
checkout (an installed package, an sdist)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mx_proxy.store import tables

ROOT = Path(__file__).resolve().parents[2]
MIB = 2**20
BUDGET = 56 * MIB
"""Issue 59 asks for 40 MiB; with every committed result converted the tree was 47.1 MiB (49,347,510 bytes,
33.5 MB of it run tables at ~3.1 bytes per float32 value recorded every step, the lossless floor), and the plan's
first 24 CPU members (results/plan/h4-cpu, ~170 kB each) brought it to 51.1 MiB. 56 MiB leaves 8 MiB of the
64 MiB a GPU job carries; the plan's ~300 more members do not fit in git at this size, so a change that needs
more says so here (and the members' per-step columns, or where results live, is the decision to make)."""


def _tracked() -> list[Path]:
    if shutil.which("git") is None:
        pytest.skip("no git")
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True)
    if out.returncode != 0:
        pytest.skip(f"{ROOT} is not a git checkout")
    return [ROOT / p for p in out.stdout.decode().split("\0") if p]


def test_the_tracked_tree_stays_within_its_budget():
    sizes = {p: os.lstat(p).st_size for p in _tracked() if os.path.lexists(p)}  # a file deleted, not yet staged
    total = sum(sizes.values())
    largest = ", ".join(f"{p.relative_to(ROOT)} {n / MIB:.1f} MiB" for p, n in
                        sorted(sizes.items(), key=lambda kv: -kv[1])[:5])
    assert total <= BUDGET, (f"the tracked files hold {total / MIB:.1f} MiB, over the budget of {BUDGET / MIB:.0f} MiB "
                             f"(largest: {largest})")


def test_every_tracked_run_table_is_compact():
    legacy = [p.relative_to(ROOT) for p in _tracked() if p.name in tables.NAMES and p.is_file()
              and tables.format_of(p) != tables.FORMAT.decode()]
    assert not legacy, (f"{len(legacy)} tracked table(s) in the legacy format ({', '.join(map(str, legacy[:3]))}"
                        f"{' …' if len(legacy) > 3 else ''}): rewrite them with `python -m mx_proxy.store.compact "
                        f"results`")
