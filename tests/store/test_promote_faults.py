"""Saving a run is crash-safe at every step (issue 32): a forked process saves a finished run and is
killed (``os._exit``, no cleanup of any kind) before its k-th file-system step, for every k, through
the fault hook of ``mx_proxy.store.durable``, with no timing involved. After each kill: a complete run
is always on disk (the new one once its run.json is written, otherwise the entry it was replacing),
and the next process's ``Store.clean()`` finishes the job: the store serves the new run when it was
complete, the old entry otherwise, and no leftover remains."""

import json
import os
import shutil
import warnings

import numpy as np
import pytest

import mx_proxy as mxp
from mx_proxy.store import durable, files, promote
from mx_proxy.store import run_store as S

CFG = mxp.Config(width=8, depth=1, batch=16, steps=20, diagnostics_every=0, val_every=0)  # the suite's cheapest program
STALE = "0" * 16


@pytest.fixture(scope="module")
def run():
    return mxp.train(CFG, progress=False)


class Steps:
    """A fault hook that exits the process before step ``k`` (counting from 0)."""

    def __init__(self, k):
        self.k, self.seen = k, 0

    def __call__(self, step):
        if self.seen == self.k:
            os._exit(17)
        self.seen += 1


def save_killed_at(root, run, k) -> bool:
    """Save ``run`` into ``root`` in a forked process killed before step ``k``; whether it finished."""
    pid = os.fork()
    if pid == 0:
        try:
            durable.FAULT_HOOK = Steps(k)
            S.Store(root).save(run, CFG.hash())
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def complete(folder):
    try:
        return files.read_entry(folder)
    except files.EntryError:
        return None


def runs_on_disk(root):
    """(new runs, stale runs): every complete run under ``root``, by the code that wrote it."""
    new, old = [], []
    for d in root.iterdir():
        found = complete(d) if d.is_dir() and not durable.is_tmp(d.name) else None
        if found is not None:
            meta = json.loads((d / "run.json").read_text())
            (old if meta["code_version"] == STALE else new).append(found)
    return new, old


def seed_old_entry(root, run):
    """An entry of the same key made by other numerics code (stale: replaced when the new run is promoted)."""
    S.Store(root).save(run, CFG.hash())
    meta_file = root / CFG.hash() / "run.json"
    meta_file.write_text(json.dumps(dict(json.loads(meta_file.read_text()), code_version=STALE)))


@pytest.mark.parametrize("replacing", [False, True], ids=["fresh", "replacing a stale entry"])
def test_a_kill_before_any_step_of_a_save_loses_nothing_complete(tmp_path, run, replacing):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # os.fork() in a process that has JAX threads
        for k in range(200):
            root = tmp_path / f"k{k}"
            root.mkdir()
            if replacing:
                seed_old_entry(root, run)
            finished = save_killed_at(root, run, k)
            new, old = runs_on_disk(root)
            run_json_written = any((p / "run.json").exists() for p in root.glob("*.partial-*")) or bool(new)
            assert new or old or not (replacing or run_json_written), f"nothing complete after a kill at step {k}"
            if run_json_written or finished:
                assert new, f"the finished run was lost by a kill at step {k}"
            S.Store(root).clean()
            leftovers = sorted(p.name for p in root.iterdir() if p.name not in (CFG.hash(), ".locks"))
            assert leftovers == [], (k, leftovers)
            served, problem, stale = S.Store(root)._usable(CFG.hash(), quiet=True)
            if run_json_written or finished:
                assert served is not None, (k, problem)
                np.testing.assert_array_equal(served.metrics["loss"].to_numpy(), run.metrics["loss"].to_numpy())
            else:
                assert stale == replacing, (k, problem)
            shutil.rmtree(root)
            if finished:
                break
    assert finished and k > 15  # every step of the save was a kill point once


def test_recovery_of_a_legacy_leftover(tmp_path, run):
    """A store killed under the earlier promotion (old entry renamed to .tmp-<mark>-<id>-old-<key>, the
    new run still in its training folder) is recovered, not emptied."""
    from conftest import dead_pid

    S.Store(tmp_path).save(run, CFG.hash())
    mark = f"{dead_pid()}@{durable._HOST}"
    (tmp_path / CFG.hash()).rename(tmp_path / f".tmp-{mark}-0123abcd-old-{CFG.hash()}")
    assert promote.pending(tmp_path) == [CFG.hash()]
    S.Store(tmp_path).clean()
    assert S.Store(tmp_path).load(CFG.hash()) is not None
