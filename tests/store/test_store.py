"""The run store: load instead of retrain, verified entries, atomic promotion,
resumable sweeps, and every way an entry can be damaged, edited, stale,
unwritable or raced."""

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import mx_proxy as mxp
from mx_proxy.runner import loop as runner
from mx_proxy.store import checkpoint as C
from mx_proxy.store import run_store as S

# fp32 without diagnostics: the cheapest program to compile.
BASE = mxp.Config(width=32, depth=2, batch=64, steps=40, diagnostics_every=0, val_every=20, recipe="fp32")
AXES = dict(lr=[1e-3, 3e-3], seed=[0, 1])
ROOT = Path(__file__).resolve().parents[2]


def same_metrics(a, b):
    return list(a.metrics.columns) == list(b.metrics.columns) and all(
        np.array_equal(a.metrics[c].to_numpy(), b.metrics[c].to_numpy(), equal_nan=True) for c in a.metrics)


def entries(root):
    return sorted(p.name for p in Path(root).iterdir() if not p.name.startswith("."))


def test_train_twice_loads_the_stored_run(tmp_path, trained):
    first = mxp.train(BASE, store=tmp_path, progress=False)
    assert len(trained) == 1
    d = tmp_path / BASE.hash()
    assert first.path == str(d) and entries(tmp_path) == [BASE.hash()]
    assert {p.name for p in d.iterdir()} >= {"config.json", "metrics.parquet", "params.npz", "run.json"}
    assert mxp.Config.from_dict(json.loads((d / "config.json").read_text())) == BASE
    again = mxp.train(BASE, store=tmp_path, progress=False)
    assert len(trained) == 1  # loaded, not trained
    assert again.config == BASE and same_metrics(first, again) and again.diverged_at == first.diverged_at
    for k in first.params:
        for leaf in first.params[k]:
            assert np.array_equal(first.params[k][leaf], again.params[k][leaf])
    assert again.metrics["loss"].dtype == np.float32  # Parquet keeps float32 bit for bit
    forced = mxp.train(BASE, store=tmp_path, force=True, progress=False)
    assert len(trained) == 2 and same_metrics(first, forced)


def test_no_store_writes_nothing_and_relative_paths_resolve(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = mxp.train(BASE, progress=False)
    assert run.path is None and list(tmp_path.iterdir()) == []
    assert mxp.train(BASE, store=False, progress=False).path is None
    st = S.resolve("rel/runs")
    assert st.root == tmp_path / "rel" / "runs" and st.root.is_absolute()
    with pytest.raises(ValueError, match="store must be a folder path"):
        S.resolve(3)


def test_incomplete_entry_is_not_loaded(tmp_path, trained):
    d = tmp_path / BASE.hash()
    d.mkdir()
    (d / "metrics.parquet").write_bytes(b"half-written")  # no run.json: not a finished run
    assert S.Store(tmp_path).load(BASE.hash()) is None
    run = mxp.train(BASE, store=tmp_path, progress=False)
    assert len(trained) == 1 and run.path == str(d)
    assert not [p for p in d.iterdir() if ".tmp-" in p.name]


@pytest.mark.parametrize("damage", ["metrics.parquet", "run.json", "params.npz", "config.json"])
def test_a_damaged_entry_is_reported_once_and_retrained(tmp_path, trained, damage):
    first = mxp.train(BASE, store=tmp_path, progress=False)
    f = Path(first.path) / damage
    f.write_bytes(f.read_bytes()[: max(1, f.stat().st_size // 3)])  # truncated
    with pytest.warns(S.StoreWarning, match=f"{BASE.hash()}: damaged") as caught:
        again = mxp.train(BASE, store=tmp_path, progress=False)
    assert len([w for w in caught if issubclass(w.category, S.StoreWarning)]) == 1
    assert len(trained) == 2 and same_metrics(first, again)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert S.Store(tmp_path).load(BASE.hash()) is not None  # repaired


def test_an_edited_config_is_not_loaded_as_the_answer_to_another(tmp_path, trained):
    first = mxp.train(BASE, store=tmp_path, progress=False)
    cfg = Path(first.path) / "config.json"
    d = json.loads(cfg.read_text())
    d["lr"] = 0.5
    cfg.write_text(json.dumps(d))
    with pytest.warns(S.StoreWarning, match="hashes to .* not to its key"):
        again = mxp.train(BASE, store=tmp_path, progress=False)
    assert len(trained) == 2 and again.config == BASE and same_metrics(first, again)


def test_a_stale_entry_is_kept_until_its_replacement_exists(tmp_path, trained, monkeypatch):
    first = mxp.train(BASE, store=tmp_path, progress=False)
    monkeypatch.setattr(S, "code_version", lambda: "0000000000000000")  # as if the numerics code had changed

    def kill_before_saving(config):
        raise KeyboardInterrupt("killed after training, before saving")

    runner.hooks.append(kill_before_saving)
    try:
        with pytest.raises(KeyboardInterrupt), pytest.warns(S.StoreWarning, match="stale"):
            mxp.train(BASE, store=tmp_path, progress=False)
    finally:
        runner.hooks.remove(kill_before_saving)
    # the old result survived the killed retrain
    assert json.loads((Path(first.path) / "run.json").read_text())["code_version"] != S.code_version()
    with pytest.warns(S.StoreWarning, match="other numerics code"):  # loading it directly says it is stale
        assert S.load_dir(first.path).config == BASE
    with pytest.warns(S.StoreWarning, match="stale"):
        again = mxp.train(BASE, store=tmp_path, progress=False)
    assert same_metrics(first, again) and json.loads((Path(again.path) / "run.json").read_text())[
        "code_version"] == S.code_version()
    assert entries(tmp_path) == [BASE.hash()]


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc (unwritable even for root)")
def test_an_unwritable_store_fails_before_training(trained):
    ro = Path("/proc/self/proxy-runs")
    with pytest.raises(ValueError, match=r"run store /proc/\d+/proxy-runs is not writable"):
        mxp.train(BASE, store=ro, progress=False)
    assert trained == []


def test_a_file_as_store_fails_before_training(tmp_path, trained):
    f = tmp_path / "file"
    f.write_text("not a folder")
    with pytest.raises(ValueError, match=f"run store '{f}' is a file, not a folder"):  # quoted as given
        mxp.train(BASE, store=f, progress=False)
    with pytest.raises(ValueError, match=f"run store '{f}/sub': '{f}' is a file, not a folder"):
        mxp.sweep(BASE, store=f / "sub", progress=False, lr=[1e-3])
    assert trained == []


def test_a_damaged_member_alone_is_retrained(tmp_path, trained):
    a = mxp.sweep(BASE, store=tmp_path, progress=False, **AXES)
    assert len(trained) == 4
    (Path(a.runs[2].path) / "metrics.parquet").write_bytes(b"PAR1 truncated")
    with pytest.warns(S.StoreWarning, match="damaged"):
        b = mxp.sweep(BASE, store=tmp_path, progress=False, **AXES)
    assert len(trained) == 5 and trained[-1] == a.configs[2]
    for ra, rb in zip(a.runs, b.runs):
        assert same_metrics(ra, rb)


def test_second_identical_sweep_trains_nothing(tmp_path, trained):
    a = mxp.sweep(BASE, store=tmp_path, progress=False, **AXES)
    assert len(trained) == 4 and sorted(S.Store(tmp_path).keys()) == sorted(c.hash() for c in a.configs)
    b = mxp.sweep(BASE, store=tmp_path, progress=False, **AXES)
    assert len(trained) == 4
    for ra, rb in zip(a.runs, b.runs):
        assert same_metrics(ra, rb)
    c = mxp.sweep(BASE, store=tmp_path, progress=False, lr=[1e-3, 3e-3, 1e-2], seed=[0, 1])
    assert len(trained) == 6 and len(c) == 6


def test_interrupted_sweep_resumes_with_identical_results(tmp_path, trained):
    reference = mxp.sweep(BASE, progress=False, **AXES)
    trained.clear()

    def crash(config):
        if len(trained) == 3:
            raise KeyboardInterrupt("simulated kill")

    runner.hooks.append(crash)
    try:
        with pytest.raises(KeyboardInterrupt):
            mxp.sweep(BASE, store=tmp_path, progress=False, group_size=2, **AXES)
    finally:
        runner.hooks.remove(crash)
    assert len(S.Store(tmp_path).keys()) == 2  # the first group of two was saved before the kill
    trained.clear()
    resumed = mxp.sweep(BASE, store=tmp_path, progress=False, **AXES)
    assert len(trained) == 2  # only the missing members
    for ra, rb in zip(reference.runs, resumed.runs):
        assert same_metrics(ra, rb)


def test_leftovers_of_killed_writers_are_cleaned(tmp_path):
    run = mxp.train(BASE.replace(checkpoint_at=(20,)), store=tmp_path, progress=False)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)  # a process that has exited
    orphans = [tmp_path / f".tmp-{pid}-deadbeef-old-x", Path(run.path) / f".tmp-{pid}-cafe-metrics.parquet",
               Path(run.path) / "checkpoints" / f".tmp-{pid}-0001-step_000000020"]
    orphans[0].mkdir()
    orphans[1].write_text("half")
    orphans[2].mkdir()
    mine = tmp_path / C.durable.tmp_name("in-progress")  # this process's own temporary: never removed
    mine.mkdir()
    removed = S.Store(tmp_path).clean()
    assert sorted(removed) == sorted(orphans) and not any(p.exists() for p in orphans) and mine.exists()


_RACE = """
import sys, mx_proxy as mxp
cfg = mxp.Config(width=32, depth=2, batch=64, steps=40, diagnostics_every=0, val_every=20, recipe="fp32",
                   checkpoint_every=10)
run = mxp.train(cfg, store=sys.argv[1], progress=False)
print(run.path, float(run.metrics.loss.iloc[-1]))
"""


def test_three_processes_training_one_config_into_one_store(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, "-c", _RACE, str(tmp_path)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outs]
    paths = {o.split()[0] for o, _ in outs}
    losses = {o.split()[1] for o, _ in outs}
    assert len(paths) == 1 and len(losses) == 1  # one entry, one answer
    key = BASE.replace(checkpoint_every=10).hash()
    assert entries(tmp_path) == [key]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run = S.Store(tmp_path).load(key)
    assert run is not None and C.steps(Path(run.path) / "checkpoints") == [10, 20, 30, 40]


def test_intervene_from_inside_a_run_folder_lands_next_to_its_parent(tmp_path, monkeypatch):
    parent = mxp.train(BASE.replace(checkpoint_at=(20,)), store=tmp_path / "runs", progress=False)
    monkeypatch.chdir(parent.path)
    child = mxp.intervene(".", 20, apply="ln_exempt", progress=False)
    assert Path(child.path).parent == tmp_path / "runs"
    assert not any(p.is_dir() and (p / "run.json").exists() for p in Path(parent.path).iterdir())
