"""The run store: load instead of retrain, atomic entries, resumable sweeps."""

import json

import numpy as np
import pytest

import proxy
from proxy import experiments as E
from proxy import store as S

# fp32 without diagnostics: the cheapest program to compile.
BASE = proxy.Config(width=32, depth=2, batch=64, steps=40, diagnostics_every=0, val_every=20, recipe="fp32")
AXES = dict(lr=[1e-3, 3e-3], seed=[0, 1])


@pytest.fixture
def trained():
    """Configs actually trained (the timing-free hook)."""
    log = []
    E.hooks.append(log.append)
    yield log
    E.hooks.remove(log.append)


def same_metrics(a, b):
    return list(a.metrics.columns) == list(b.metrics.columns) and all(
        np.array_equal(a.metrics[c].to_numpy(), b.metrics[c].to_numpy(), equal_nan=True) for c in a.metrics)


def test_train_twice_loads_the_stored_run(tmp_path, trained):
    first = proxy.train(BASE, store=tmp_path, progress=False)
    assert len(trained) == 1
    d = tmp_path / BASE.hash()
    assert first.path == str(d)
    assert {p.name for p in d.iterdir()} >= {"config.json", "metrics.parquet", "params.npz", "run.json"}
    assert proxy.Config.from_dict(json.loads((d / "config.json").read_text())) == BASE
    again = proxy.train(BASE, store=tmp_path, progress=False)
    assert len(trained) == 1  # loaded, not trained
    assert again.config == BASE and same_metrics(first, again) and again.diverged_at == first.diverged_at
    for k in first.params:
        for leaf in first.params[k]:
            assert np.array_equal(first.params[k][leaf], again.params[k][leaf])
    assert again.metrics["loss"].dtype == np.float32  # Parquet keeps float32 bit for bit
    forced = proxy.train(BASE, store=tmp_path, force=True, progress=False)
    assert len(trained) == 2 and same_metrics(first, forced)


def test_incomplete_entry_is_not_loaded(tmp_path, trained):
    d = tmp_path / BASE.hash()
    d.mkdir()
    (d / "metrics.parquet").write_bytes(b"half-written")  # no run.json: not a finished run
    assert S.Store(tmp_path).load(BASE.hash()) is None
    run = proxy.train(BASE, store=tmp_path, progress=False)
    assert len(trained) == 1 and run.path == str(d)
    assert not [p for p in d.iterdir() if ".tmp-" in p.name]


def test_run_made_by_other_code_is_retrained(tmp_path, trained, monkeypatch):
    first = proxy.train(BASE, store=tmp_path, progress=False)
    monkeypatch.setattr(S, "_CODE", "0000000000000000")  # as if the numerics code had changed
    assert S.Store(tmp_path).load(BASE.hash()) is None and S.Store(tmp_path).stale(BASE.hash())
    again = proxy.train(BASE, store=tmp_path, progress=False)
    assert len(trained) == 2 and same_metrics(first, again)
    assert S.Store(tmp_path).load(BASE.hash()) is not None


def test_store_false_and_env_default(tmp_path, monkeypatch, trained):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PROXY_STORE", raising=False)
    run = proxy.train(BASE, store=False, progress=False)
    assert run.path is None and list(tmp_path.iterdir()) == []
    assert S.resolve(None).root.name == "runs"
    monkeypatch.setenv("PROXY_STORE", str(tmp_path / "elsewhere"))
    assert S.resolve(None).root == tmp_path / "elsewhere"
    monkeypatch.setenv("PROXY_STORE", "off")
    assert S.resolve(None) is None
    with pytest.raises(ValueError, match="store must be a folder path"):
        S.resolve(3)


def test_second_identical_sweep_trains_nothing(tmp_path, trained):
    a = E.sweep(BASE, store=tmp_path, progress=False, **AXES)
    assert len(trained) == 4 and sorted(S.Store(tmp_path).keys()) == sorted(c.hash() for c in a.configs)
    b = E.sweep(BASE, store=tmp_path, progress=False, **AXES)
    assert len(trained) == 4
    for ra, rb in zip(a.runs, b.runs):
        assert same_metrics(ra, rb)
    # a wider sweep trains only the new members
    c = E.sweep(BASE, store=tmp_path, progress=False, lr=[1e-3, 3e-3, 1e-2], seed=[0, 1])
    assert len(trained) == 6 and len(c) == 6


def test_interrupted_sweep_resumes_with_identical_results(tmp_path, trained):
    reference = E.sweep(BASE, store=False, progress=False, **AXES)
    trained.clear()

    def crash(config):
        if len(trained) == 3:
            raise KeyboardInterrupt("simulated kill")

    E.hooks.append(crash)
    try:
        with pytest.raises(KeyboardInterrupt):
            E.sweep(BASE, store=tmp_path, progress=False, group_size=2, **AXES)
    finally:
        E.hooks.remove(crash)
    assert len(S.Store(tmp_path).keys()) == 2  # the first group of two was saved before the kill
    trained.clear()
    resumed = E.sweep(BASE, store=tmp_path, progress=False, **AXES)
    assert len(trained) == 2  # only the missing members
    for ra, rb in zip(reference.runs, resumed.runs):
        assert same_metrics(ra, rb)
