"""``--track tensorboard|mlflow``: each run's metrics streamed as it trains, read back, compared with its store entry.

Offline: the TensorBoard event files are read with tensorboard's own
``EventAccumulator`` (what TensorBoard shows, purges included), the MLflow
file store with ``mlflow.search_runs`` and the client's metric history. Each
tracked series must equal the run's ``metrics.parquet`` column (its measured
steps: NaN is "not measured here") step for step and bit for bit (TensorBoard
holds float32, as the metrics are). The tests of a tracker skip, saying why,
where its package is not installed (``pip install 'mx-proxy[tensorboard,mlflow]'``).
"""

import importlib
import json
import sys

import numpy as np
import pandas as pd
import pytest

import mx_proxy as mxp
from mx_proxy.cli.main import main
from mx_proxy.experiments import executors, parallel, tracking
from mx_proxy.runner import loop as runner

TINY = mxp.Config(width=16, depth=2, batch=32, steps=40, diagnostics_every=10, val_every=10, recipe="mxfp8_e4m3",
                  paired_run=True)
CLI = ["--width", "16", "--depth", "2", "--batch", "32", "--steps", "40", "--diagnostics-every", "10",
       "--val-every", "10", "--recipe", "mxfp8_e4m3", "--paired-run", "true", "--quiet"]


def _needs(kind: str):
    try:
        tracking.check_installed(kind)
    except tracking.TrackingUnavailable as e:
        pytest.skip(str(e))
    if kind == "tensorboard":
        return importlib.import_module("tensorboard.backend.event_processing.event_accumulator")
    return importlib.import_module("mlflow")


def _measured(metrics: pd.DataFrame, column: str, first: int = 0) -> tuple[list[int], np.ndarray]:
    rows = metrics.loc[(metrics["step"] >= first) & metrics[column].notna(), ["step", column]]
    return rows["step"].tolist(), rows[column].to_numpy()


def tensorboard_series(folder) -> dict:
    """{tag: (steps, float32 values)} of one run's event files, as TensorBoard shows them."""
    ea = _needs("tensorboard")
    acc = ea.EventAccumulator(str(folder), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    return {tag: ([e.step for e in acc.Scalars(tag)], np.float32([e.value for e in acc.Scalars(tag)]))
            for tag in acc.Tags()["scalars"]}


def tensorboard_text(folder, tag: str) -> list[str]:
    ea = _needs("tensorboard")
    acc = ea.EventAccumulator(str(folder), size_guidance={ea.TENSORS: 0})
    acc.Reload()
    return [e.tensor_proto.string_val[0].decode() for e in acc.Tensors(tag)]


def assert_tensorboard_equals(folder, metrics: pd.DataFrame, first: int = 0):
    series = tensorboard_series(folder)
    columns = [c for c in metrics.columns if c != "step" and metrics.loc[metrics["step"] >= first, c].notna().any()]
    assert sorted(series) == sorted(columns)
    for c in columns:
        steps, values = _measured(metrics, c, first)
        assert series[c][0] == steps, c
        assert np.array_equal(series[c][1], values.astype(np.float32)), c


def mlflow_run(where, experiment: str, key: str):
    """(the search_runs row of store key ``key``, a client) in the MLflow file store ``where``."""
    mlflow = _needs("mlflow")
    mlflow.set_tracking_uri(where.as_uri())
    found = mlflow.search_runs(experiment_names=[experiment], filter_string=f"tags.`mx_proxy.key` = '{key}'")
    assert len(found) == 1, found
    return found.iloc[0], mlflow.tracking.MlflowClient(where.as_uri())


def assert_mlflow_equals(where, experiment: str, key: str, metrics: pd.DataFrame, first: int = 0):
    row, client = mlflow_run(where, experiment, key)
    for c in [c for c in metrics.columns if c != "step"]:
        steps, values = _measured(metrics, c, first)
        history = sorted(client.get_metric_history(row.run_id, tracking.mlflow_key(c)), key=lambda m: m.step)
        assert [m.step for m in history] == steps, c  # each step once
        assert np.array_equal([m.value for m in history], values.astype(np.float64)), c
        if steps:
            assert row[f"metrics.{tracking.mlflow_key(c)}"] == values[-1]
    return row


@pytest.mark.parametrize("kind", tracking.KINDS)
def test_a_sweep_streams_every_member_equal_to_its_stored_metrics(tmp_path, kind):
    """Four members in one program: one finishes, three diverge in different segments (the rows after a
    divergence, which the store drops, are never sent)."""
    _needs(kind)
    store = tmp_path / "runs"
    code = main(["sweep", *CLI, "--lr", "6e-4", "1e-2", "--spike-factor", "1.3", "1.4", "--store", str(store),
                 "--track", kind])
    assert code == 0
    runs = [mxp.load(p.parent) for p in sorted(store.glob("*/run.json"))]
    assert sorted(r.diverged_at or 0 for r in runs) == [0, 6, 15, 32]
    for run in runs:
        key = run.info["key"]
        if kind == "tensorboard":
            (folder,) = (store / "tensorboard").glob(f"*-{key}")
            assert_tensorboard_equals(folder, run.metrics)
            assert json.loads(tensorboard_text(folder, "config")[0].split("```\n")[1].rsplit("\n```")[0]) == \
                run.config.to_dict()
            outcome = f"diverged at step {run.diverged_at}" if run.diverged_at else "finished at step 39"
            assert tensorboard_text(folder, "outcome") == [outcome]
        else:
            row = assert_mlflow_equals(store / "mlruns", "mx-proxy", key, run.metrics)
            assert row["status"] == "FINISHED" and float(row["params.lr"]) == run.config.lr
            assert row.get("tags.mx_proxy.diverged_at") == (str(run.diverged_at) if run.diverged_at else None)


@pytest.mark.parametrize("kind", tracking.KINDS)
def test_a_stopped_run_resumed_from_its_checkpoint_streams_each_step_once(tmp_path, kind):
    """Stopped after a segment (as a scheduler's signal stops it), the held segment is not sent; the rerun resumes
    from the checkpoint and the tracker ends holding every step once, equal to the finished run's metrics."""
    _needs(kind)
    cfg, store, where = TINY.replace(checkpoint_every=20), tmp_path / "runs", tmp_path / kind

    def stop_after_step_10(t, runs):
        if t >= 10:
            runner.stop.set()

    with tracking.track(kind, where, experiment="resumed"):
        try:
            with pytest.raises(runner.Stopped):
                mxp.train(cfg, store=store, progress=False, on_segment=stop_after_step_10)
        finally:
            runner.stop.clear()
        run = mxp.train(cfg, store=store, progress=False)
    assert run.info["resumed_from"] == 10  # a stop asked in on_segment ends the run at that segment
    if kind == "tensorboard":
        (folder,) = where.glob(f"*-{cfg.hash()}")
        assert len(list(folder.glob("events.out.tfevents.*"))) == 2  # the stopped process's and the resumed one's
        assert_tensorboard_equals(folder, run.metrics)
    else:
        assert_mlflow_equals(where, "resumed", cfg.hash(), run.metrics)


def test_worker_processes_stream_what_this_process_tracks(tmp_path):
    """The local executor's worker processes activate the submitting process's tracking."""
    _needs("tensorboard")
    store, where = tmp_path / "runs", tmp_path / "tb"
    units = [parallel.Unit([TINY]), parallel.Unit([TINY.replace(recipe="fp32", paired_run=False)])]
    with tracking.track("tensorboard", where):
        assert executors.make("local", jobs=2).run(units, store, progress=False, log=lambda *_: None) == []
    for unit in units:
        (key,) = unit.keys
        (folder,) = where.glob(f"*-{key}")
        assert_tensorboard_equals(folder, mxp.load(store / key).metrics)


def test_a_tracker_that_fails_leaves_the_run_training(tmp_path):
    _needs("tensorboard")
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    with pytest.raises(ValueError, match="the tensorboard tracker's folder '.*a-file' is a file, not a folder"):
        tracking.Tracking("tensorboard", blocked)  # refused before anything trains
    later = tmp_path / "gone"
    spec = tracking.Tracking("tensorboard", later)
    later.write_text("a file where the folder was to be")  # the tracker fails once the run starts
    with pytest.warns(tracking.TrackingWarning, match="trains on without streaming"):
        with tracking.active(spec):
            run = mxp.train(TINY, store=tmp_path / "runs", progress=False)
    assert run.path is not None and len(run.metrics) == TINY.steps


@pytest.mark.parametrize("argv, message", [
    (["train", *CLI, "--track", "tensorboard"], "pip install 'mx-proxy[tensorboard]'"),
    (["sweep", *CLI, "--track", "mlflow"], "pip install 'mx-proxy[mlflow]'"),
    (["ensemble", "--kind", "seed", "--arms", "fp32", "--members", "2", "--horizon", "20", "--track", "mlflow"],
     "pip install 'mx-proxy[mlflow]'"),
    (["train", *CLI, "--track-dir", "somewhere"], "--track-dir somewhere: it says where --track writes; add --track "
                                                  "tensorboard or mlflow"),
    (["train", *CLI, "--no-store", "--track", "tensorboard"], "there is none (--no-store); give --track-dir DIR"),
    (["campaign", "--scale", "smoke", "--track", "wandb"], "argument --track: invalid choice: 'wandb'"),
])
def test_bad_tracking_options_exit_2_naming_what_to_do(tmp_path, monkeypatch, capsys, trained, argv, message):
    """A tracker's package that cannot be imported (as where the extra is not installed) is refused before any
    training, naming the pip extra."""
    monkeypatch.setitem(sys.modules, "mlflow", None)  # `import mlflow` raises ImportError, as if not installed
    monkeypatch.setitem(sys.modules, "tensorboard.summary.writer.event_file_writer", None)
    monkeypatch.chdir(tmp_path)
    out = ["--out", str(tmp_path / "out")] if argv[0] in ("ensemble", "campaign") else []
    try:
        code = main(argv + out)
    except SystemExit as e:  # the ensemble's and the campaign's argparse errors
        code = e.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err.strip().splitlines()[-1], err  # one line (argparse's usage may stand above it)
    assert trained == [] and not (tmp_path / "runs").exists() and not (tmp_path / "out" / "runs").exists()


def test_tracking_values_are_checked():
    with pytest.raises(ValueError, match="unknown tracker 'wandb'; valid: tensorboard, mlflow"):
        tracking.Tracking("wandb", "x")
    with pytest.raises(ValueError, match="needs a folder"):
        tracking.Tracking("tensorboard", " ")
    with pytest.raises(ValueError, match="must be a tracking.Tracking or None"):
        with tracking.active("tensorboard"):
            pass
    assert tracking.Tracking("mlflow", "http://127.0.0.1:5000").where == "http://127.0.0.1:5000"
    assert tracking.current() is None and runner.run_members is tracking._UNTRACKED


def _closed_port() -> int:
    import socket

    with socket.socket() as s:  # a port nothing listens on once the socket is closed
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_mlflow_server_is_one_warning_and_the_run_trains_untracked(tmp_path, monkeypatch):
    """Was: MLflow's retries stalled a 20-step run for ~4 minutes, per run. Now one bounded connection test."""
    import time

    from mx_proxy.experiments import tracking_service

    _needs("mlflow")
    for name in tracking_service.REQUESTS:
        monkeypatch.delenv(name, raising=False)
    uri = f"http://127.0.0.1:{_closed_port()}"
    t0 = time.perf_counter()
    with pytest.warns(tracking.TrackingWarning, match=f"the tracking server {uri} accepts no connection within 5 s "
                                                      f".*; training goes on untracked") as caught:
        with tracking.track("mlflow", uri) as spec:
            assert spec is None and tracking.current() is None
            run = mxp.train(TINY.replace(steps=20), store=tmp_path / "runs", progress=False)
    assert len(caught) == 1 and len(run.metrics) == 20 and time.perf_counter() - t0 < 60
    assert runner.run_members is tracking._UNTRACKED  # nothing left wrapped
    assert tracking_service.unreachable("http://host:notaport") == "a bad port (Port could not be cast to " \
                                                                   "integer value as 'notaport')"
    assert tracking_service.unreachable(str(tmp_path)) is None  # a folder: MLflow's file store, nothing to reach


def test_a_reachable_server_bounds_mlflows_own_retries(monkeypatch):
    import socket

    from mx_proxy.experiments import tracking_service

    for name in tracking_service.REQUESTS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "33")  # the user's own setting wins
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        assert tracking_service.reachable(f"http://127.0.0.1:{server.getsockname()[1]}")
    import os

    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "33"
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == tracking_service.REQUESTS["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]
