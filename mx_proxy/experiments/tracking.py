"""Streaming each run's metrics into a tracker as it trains: TensorBoard event files or an MLflow store.

On a cluster a researcher cannot watch a job's progress bar; they follow
runs in the tracker they already use. ``--track tensorboard|mlflow`` (or,
in Python, ``with tracking.track("tensorboard", "runs/tensorboard"): ...``)
streams every metrics column of every run trained while it is active (loss,
ζ, cosine, clamp fractions, gradient norms, the GNMR controller's signals:
whatever the run records), segment by segment, to

- ``tensorboard``: event files in ``WHERE/<label>-<key>/`` (default ``WHERE``:
  ``<run store>/tensorboard``; ``tensorboard --logdir WHERE`` shows them),
  one event per step holding every column as a scalar, plus the config as
  text; written with the ``tensorboard`` package's own event writer (no
  TensorFlow, no PyTorch);
- ``mlflow``: one MLflow run per store key in experiment ``experiment`` of the
  tracking store ``WHERE`` (default ``<run store>/mlruns``, MLflow's file
  store: each run its own folder, safe for many jobs writing on a shared
  filesystem, which a SQLite file is not; a URI such as ``http://host:5000``
  is passed to MLflow as it is), with the config as params and the store key
  as the tag ``mx_proxy.key``; a column ``name/block_0`` is the metric
  ``name.block_0`` (:func:`mlflow_key`: the file store keeps each metric in a
  file named after it, so ``name`` and ``name/block_0`` cannot both be).

Which steps: those of the run's own training (from step 0; a branch
member or an intervention from its branch step: the history it inherits is
not sent again). A value the run did not measure at a step (NaN:
diagnostics every N steps, the validation loss) is not sent. A segment's
rows are held until the next segment shows the run still training (or the
run ends), so the rows after a divergence, which the run store drops, are
never sent: what a tracker holds is the run's ``metrics.parquet`` from that
first step. A run stopped (a scheduler's signal) or interrupted and then
resumed from a checkpoint writes on under the same name and sends its rows
again from that first step: TensorBoard is told (a ``SessionLog.START``) to
drop what the interrupted process had sent after it, MLflow continues the
newest MLflow run of the store key and skips the steps it holds (equal: a
resumed run continues bit for bit). A run trained afresh (no checkpoint to
resume) is a new MLflow run.

Where it hooks in: every run trains in :func:`mx_proxy.runner.loop.run_members`
(``train``, ``sweep``, interventions, ensembles), whose ``on_segment``
callback sees each member's metrics after every segment. While a tracking is
:func:`active`, ``runner.run_members`` is wrapped to add that callback (the
runner's source, which the code version hashes, is not edited, and nothing a
run computes changes). The active tracking travels with the units of work:
the local executor's worker processes and the Slurm executor's jobs
(:mod:`mx_proxy.experiments.executors`) activate :func:`current` of the
submitting process, so a job on another node streams into the same folder
(which must be on the shared filesystem, as the run store is). A tracker
that fails (a full disk, a store gone) is one :class:`TrackingWarning` and
stops streaming that run; training goes on; a tracking server that accepts
no connection within seconds is one warning, and nothing is tracked
(:mod:`mx_proxy.experiments.tracking_service`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import socket
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd

from mx_proxy.experiments import tracking_service
from mx_proxy.experiments.tracking_service import TrackingWarning
from mx_proxy.runner import loop as runner
from mx_proxy.training.paths import checked_path

__all__ = ["KINDS", "EXTRAS", "Tracking", "TrackingUnavailable", "TrackingWarning", "RunTracker", "check_installed",
           "active", "track", "current", "label", "open_run", "origin", "mlflow_key"]

KINDS = ("tensorboard", "mlflow")
EXTRAS = {"tensorboard": "tensorboard", "mlflow": "mlflow"}
"""The pip extra of ``mx-proxy`` that installs each tracker's package."""
_MODULES = {"tensorboard": "tensorboard.summary.writer.event_file_writer", "mlflow": "mlflow"}
_FOLDERS = {"tensorboard": "tensorboard", "mlflow": "mlruns"}
_KEY_TAG = "mx_proxy.key"


class TrackingUnavailable(ValueError):
    """The tracker's package is not installed; the message names the pip extra that installs it."""


@dataclasses.dataclass(frozen=True)
class Tracking:
    """Where runs stream their metrics (plain data, pickled into a Slurm job):
    ``kind`` (one of :data:`KINDS`), ``where`` (a folder, made absolute; for
    ``mlflow`` also a tracking URI) and the MLflow ``experiment``."""

    kind: str
    where: str
    experiment: str = "mx-proxy"

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown tracker {self.kind!r}; valid: {', '.join(KINDS)}")
        if not isinstance(self.where, (str, os.PathLike)) or not str(self.where).strip():
            raise ValueError(f"the {self.kind} tracker needs a folder to write to, got {self.where!r}")
        if not isinstance(self.experiment, str) or not self.experiment.strip():
            raise ValueError(f"the tracking experiment needs a name, got {self.experiment!r}")
        where = str(self.where)
        if not (self.kind == "mlflow" and tracking_service.is_uri(where)):
            where = str(checked_path(where, f"the {self.kind} tracker's folder", folder=True))
        object.__setattr__(self, "where", where)

    @classmethod
    def beside(cls, kind: str, store, where=None, experiment: str = "mx-proxy") -> Tracking:
        """A tracking into ``where``, by default ``<store>/tensorboard`` or
        ``<store>/mlruns`` beside the runs; a ValueError when neither is given."""
        if where is None:
            if store is None or store is False:
                raise ValueError(f"--track {kind} writes beside the run store and there is none (--no-store); give "
                                 f"--track-dir DIR")
            where = Path(store) / _FOLDERS.get(kind, "tracking")
        return cls(kind, str(where), experiment)


def check_installed(kind: str) -> None:
    """Raise :class:`TrackingUnavailable` naming the pip extra unless ``kind``'s package imports."""
    if kind not in KINDS:
        raise ValueError(f"unknown tracker {kind!r}; valid: {', '.join(KINDS)}")
    try:
        __import__(_MODULES[kind])
    except ImportError as e:
        raise TrackingUnavailable(f"--track {kind} needs the {kind} package, which is not installed here ({e}); "
                                  f"install it with: pip install 'mx-proxy[{EXTRAS[kind]}]'") from None


# --------------------------------------------------------------------------- one run's tracker


class RunTracker(Protocol):
    """One run in a tracker: ``log`` a frame of metrics rows (``step`` and
    columns), ``close`` with how the run ended (``finished``, ``diverged``,
    ``stopped``: it resumes later, ``failed``) and at which step (the last one
    sent; a diverged run's divergence step)."""

    def log(self, rows: pd.DataFrame) -> None: ...

    def close(self, outcome: str, step: int) -> None: ...


def label(config, info: dict) -> str:
    """A readable name of a run: an ensemble member's ``<ensemble>/<arm>-m<i>``, else its recipe's name."""
    ens = info.get("ensemble")
    if isinstance(ens, dict) and {"name", "arm", "member"} <= set(ens):
        text = f"{ens['name']}/{ens['arm']}-m{int(ens['member']):02d}"
    else:
        text = config.recipe.name
    return re.sub(r"[^A-Za-z0-9._/-]+", "_", text).strip("/.") or "run"


def _values(rows: pd.DataFrame):
    """(step, [(column, value)…]) per row: the numeric columns, NaN (not measured) left out."""
    cols = [c for c in rows.columns if c != "step" and pd.api.types.is_numeric_dtype(rows[c])]
    data = rows[cols].to_numpy(dtype=np.float64)
    for step, row in zip(rows["step"].to_numpy(), data):
        yield int(step), [(c, v) for c, v in zip(cols, row.tolist()) if not math.isnan(v)]


class _TensorBoard:
    """Event files in ``where/<label>-<key>/``, one event per step."""

    def __init__(self, spec: Tracking, name: str, key: str, start: int, config_json: str):
        from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self._summary = event_pb2, summary_pb2
        self.folder = Path(spec.where) / f"{name}-{key}"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.writer = EventFileWriter(str(self.folder), max_queue_size=1000, flush_secs=30)
        # what an earlier process sent from ``start`` on is dropped: this one sends it again
        self.writer.add_event(event_pb2.Event(wall_time=time.time(), step=start,
                                              session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))
        text = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text"))

        def note(tag, body, step):
            tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[body.encode()])
            value = summary_pb2.Summary.Value(tag=tag, metadata=text, tensor=tensor)
            self.writer.add_event(event_pb2.Event(wall_time=time.time(), step=step,
                                                  summary=summary_pb2.Summary(value=[value])))

        self._note = note
        note("config", f"store key `{key}`\n\n```\n{config_json}\n```", start)
        self.writer.flush()

    def log(self, rows: pd.DataFrame) -> None:
        now = time.time()
        for step, values in _values(rows):
            summary = self._summary.Summary(value=[self._summary.Summary.Value(tag=c, simple_value=v)
                                                   for c, v in values])
            self.writer.add_event(self._event.Event(wall_time=now, step=step, summary=summary))
        self.writer.flush()

    def close(self, outcome: str, step: int) -> None:
        self._note("outcome", f"{outcome} at step {step}", step)
        self.writer.close()


class _MLflow:
    """One MLflow run per store key (found again by its tag when the run resumes)."""

    _BATCH = 1000  # MLflow's most metrics per log_batch call

    def __init__(self, spec: Tracking, name: str, key: str, start: int, resumed: bool, config: dict):
        from mlflow.entities import Metric, Param, RunStatus
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        uri = spec.where if tracking_service.is_uri(spec.where) else Path(spec.where).as_uri()
        if uri.startswith("file:"):  # recent MLflow asks for this to use its file store (see the module docstring)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.Metric, self.client, self.ops = Metric, MlflowClient(uri), []
        experiment = self.client.get_experiment_by_name(spec.experiment)
        if experiment is None:
            try:
                exp_id = self.client.create_experiment(spec.experiment)
            except MlflowException:  # another job created it a moment ago
                exp_id = self.client.get_experiment_by_name(spec.experiment).experiment_id
        else:
            exp_id = experiment.experiment_id
        found = self.client.search_runs([exp_id], filter_string=f"tags.`{_KEY_TAG}` = '{key}'", max_results=1,
                                        order_by=["attributes.start_time DESC"]) if resumed else []
        self.skip_upto = start - 1
        if found:
            self.run_id = found[0].info.run_id
            self.client.update_run(self.run_id, status=RunStatus.to_string(RunStatus.RUNNING))
            sent = self.client.get_metric_history(self.run_id, "loss")
            self.skip_upto = max([start - 1] + [m.step for m in sent])  # already there, with these values
        else:
            tags = {_KEY_TAG: key, "mx_proxy.label": name, "mx_proxy.host": socket.gethostname()}
            self.run_id = self.client.create_run(exp_id, run_name=f"{name}-{key}", tags=tags).info.run_id
            params = [Param(k, json.dumps(v) if not isinstance(v, str) else v) for k, v in config.items()]
            self.client.log_batch(self.run_id, params=params)

    def log(self, rows: pd.DataFrame) -> None:
        now = int(time.time() * 1000)
        new = rows[rows["step"] > self.skip_upto]
        metrics = [self.Metric(mlflow_key(c), v, now, step) for step, values in _values(new) for c, v in values]
        for i in range(0, len(metrics), self._BATCH):  # queued: MLflow writes them in its own thread
            self.ops.append(self.client.log_batch(self.run_id, metrics=metrics[i:i + self._BATCH], synchronous=False))

    def close(self, outcome: str, step: int) -> None:
        for op in self.ops:
            op.wait()
        self.ops = []
        if outcome == "diverged":
            self.client.set_tag(self.run_id, "mx_proxy.diverged_at", str(step))
        status = {"finished": "FINISHED", "diverged": "FINISHED", "stopped": "KILLED"}.get(outcome, "FAILED")
        self.client.set_terminated(self.run_id, status)


def mlflow_key(column: str) -> str:
    """The MLflow metric of a metrics column: ``/`` becomes ``.`` (see the module docstring)."""
    return column.replace("/", ".")


def open_run(spec: Tracking, config, info: dict, start: int, resumed: bool = False) -> RunTracker:
    """The tracker of one run (``config``, ``info["key"]``) whose own rows
    begin at step ``start``; ``resumed``: it continues from a checkpoint."""
    key = re.sub(r"[^A-Za-z0-9._-]+", "_", str(info.get("key") or config.hash()))
    name = label(config, info)
    if spec.kind == "tensorboard":
        return _TensorBoard(spec, name, key, start, json.dumps(config.to_dict(), indent=1, sort_keys=True))
    return _MLflow(spec, name, key, start, resumed, config.to_dict())


def origin(member) -> int:
    """The first step of a member's own training: 0, or the step a branch
    member or an intervention continues from (the rows before it are inherited)."""
    intervention = member.info.get("intervention")
    return int(intervention.get("at_step", 0)) if isinstance(intervention, dict) else 0


# --------------------------------------------------------------------------- streaming a member group


class _Stream:
    """One member's rows on their way to its tracker: each segment's rows are
    held until the next segment shows the member still training (a diverged
    member stops growing; the store drops its rows after the divergence)."""

    def __init__(self, tracker: RunTracker | None, first: int, start: int, what: str):
        self.tracker, self.sent, self.seen, self.last, self.what = tracker, first, start, None, what

    def _send(self, metrics: pd.DataFrame, upto: float) -> None:
        rows = metrics[(metrics["step"] >= self.sent) & (metrics["step"] < upto)]
        if len(rows) and self.tracker is not None:
            self._safely(lambda: self.tracker.log(rows))
        if len(rows):
            self.sent = int(rows["step"].iloc[-1]) + 1

    def segment(self, metrics: pd.DataFrame) -> None:
        end = int(metrics["step"].iloc[-1]) + 1 if len(metrics) else self.seen
        if end > self.seen:
            if self.last is not None:
                self._send(self.last, self.seen)
            self.seen, self.last = end, metrics

    def finish(self, metrics: pd.DataFrame | None, outcome: str, diverged_at: int | None = None) -> None:
        """Send what is left of a finished run (``metrics``, trimmed at its
        divergence); a stopped or failed one (``None``) sends no more: the rows
        held may follow a divergence, and a resumed run sends them again."""
        if metrics is not None:
            self._send(metrics, math.inf)
        step = diverged_at if diverged_at is not None else max(self.sent - 1, 0)
        if self.tracker is not None:
            self._safely(lambda: self.tracker.close(outcome, step))

    def _safely(self, fn: Callable[[], object]):
        """``fn()``, or ``None`` and one :class:`TrackingWarning` if it fails (the tracker is then dropped)."""
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 -- a tracker never stops training
            warnings.warn(f"tracking {self.what}: {type(e).__name__}: {e}; it trains on without streaming",
                          TrackingWarning, stacklevel=4)
            self.tracker = None
            return None


_STACK: list[Tracking] = []
_UNTRACKED = runner.run_members


def _tracked_run_members(group, start, *, on_segment=None, **kwargs):
    """``runner.run_members`` streaming every member's metrics to :func:`current` (see the module docstring)."""
    spec = current()
    if spec is None:
        return _UNTRACKED(group, start, on_segment=on_segment, **kwargs)
    streams = []
    for m in group:
        what = f"{label(m.config, m.info)} ({m.info.get('key', m.config.hash())}) with {spec.kind}"
        resumed = "resumed_from" in m.info
        first = origin(m) if resumed else start
        stream = _Stream(None, first, start, what)
        stream.tracker = stream._safely(lambda: open_run(spec, m.config, m.info, first, resumed))  # noqa: B023
        streams.append(stream)

    def segment(t, runs):
        for stream, run in zip(streams, runs):
            stream.segment(run.metrics)
        if on_segment is not None:
            on_segment(t, runs)

    try:
        runs = _UNTRACKED(group, start, on_segment=segment, **kwargs)
    except BaseException as e:
        for stream in streams:
            stream.finish(None, "stopped" if isinstance(e, runner.Stopped) else "failed")
        raise
    for stream, run in zip(streams, runs):
        stream.finish(run.metrics, "finished" if run.diverged_at is None else "diverged", run.diverged_at)
    return runs


def current() -> Tracking | None:
    """The tracking active in this process (the innermost :func:`active`), or ``None``."""
    return _STACK[-1] if _STACK else None


@contextlib.contextmanager
def active(spec: Tracking | None):
    """Stream every run trained inside the block to ``spec`` (``None``:
    nothing changes). Raises :class:`TrackingUnavailable` first when its
    package is not installed; an MLflow server that accepts no connection is
    one :class:`TrackingWarning`, and the block trains untracked. Nested blocks use the innermost spec."""
    if spec is None:
        yield None
        return
    if not isinstance(spec, Tracking):
        raise ValueError(f"tracking must be a tracking.Tracking or None, got {spec!r}")
    check_installed(spec.kind)
    if spec.kind == "mlflow" and not tracking_service.reachable(spec.where):  # warned: the runs train untracked
        yield None
        return
    _STACK.append(spec)
    runner.run_members = _tracked_run_members
    try:
        yield spec
    finally:
        _STACK.pop()
        if not _STACK:
            runner.run_members = _UNTRACKED


def track(kind: str, where, experiment: str = "mx-proxy"):
    """``with track("tensorboard", "runs/tensorboard"): mxp.train(...)``: :func:`active` of a :class:`Tracking`."""
    return active(Tracking(kind, where, experiment))
