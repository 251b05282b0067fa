"""Where a campaign stands, read from its folder without training anything.

A paper-scale campaign on a CPU spans sessions: its paired runs train for
hours into ``OUT/runs`` and checkpoint every few hundred steps. :func:`status`
answers, at any moment and from any process, what :func:`mx_proxy.experiments.campaign.run`
would resume: for each planned run whether it is done (exported to
``OUT/results``), in a training folder (``<key>.partial-<pid>@<host>``) whose
process is alive or gone, or not started; how many steps its newest
checkpoint holds; and what its metrics show so far (numbers of a run that
has not finished: partial, and labelled so by ``state``).

It reads the newest checkpoint's ``metrics.parquet`` (the rows of every step
before it), never the training state, so it is cheap and safe beside a
running campaign.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from mx_proxy.experiments import analysis, result_folders
from mx_proxy.experiments import campaign as _campaign
from mx_proxy.experiments import scales as _scales
from mx_proxy.experiments.executors import slurm as _slurm
from mx_proxy.store import checkpoint as ckpt
from mx_proxy.store import durable, files
from mx_proxy.training.config import Config
from mx_proxy.training.result import Run

__all__ = ["STATES", "status", "partial_metrics", "jobs", "with_jobs"]

STATES = ("done", "training", "interrupted", "not started")
"""``training``: a live process's training folder; ``interrupted``: its
process is gone (a rerun of the campaign resumes from the newest checkpoint)."""

MEASURES = ("unstable_at", "loss", "vs_fp32_pct", "zeta_median", "zeta_max", "zeta_paper_median", "zeta_paper_max",
            "ln_clamp_max")
"""The columns of :func:`mx_proxy.experiments.analysis.headline` that :func:`status` shows."""


def _newest(run_folders: list[Path]) -> tuple[Path, int] | None:
    best = None
    for d in run_folders:
        for step in ckpt.steps(d / "checkpoints"):
            if best is None or step > best[1]:
                best = (d, step)
    return best


def partial_metrics(out: str | os.PathLike, config: Config) -> tuple[pd.DataFrame, int, Path] | None:
    """(metrics of every step before the newest checkpoint, that step, its
    training folder) of the run of ``config`` in ``out/runs``, or ``None``
    when no training folder holds a checkpoint; metrics that fail their
    checks (:func:`mx_proxy.store.files.read_metrics`) are left out (steps only)."""
    runs = Path(out) / "runs"
    found = _newest(sorted(runs.glob(f"{config.hash()}.partial-*")))
    if found is None:
        return None
    folder, step = found
    try:
        metrics = files.read_metrics(ckpt.step_dir(folder / "checkpoints", step) / "metrics.parquet", step, config)
    except files.EntryError:
        metrics = pd.DataFrame({"step": np.arange(step)})
    return metrics, step, folder


def _seconds_per_step(folder: Path) -> float:
    """Wall seconds per step of one training folder: the fastest interval
    between its consecutive checkpoints (a pause, or the gap between two
    sessions, only lengthens an interval); NaN with fewer than two."""
    steps = ckpt.steps(folder / "checkpoints")
    t = [ckpt.step_dir(folder / "checkpoints", s).stat().st_mtime for s in steps]
    rates = [(t[i + 1] - t[i]) / (steps[i + 1] - steps[i]) for i in range(len(steps) - 1) if t[i + 1] > t[i]]
    return min(rates) if rates else float("nan")


def _exported(folder: Path, entry, ignored: list) -> Run | None:
    """The planned run ``entry`` as exported in ``folder`` (its label's), if that export is whole and of the
    config the campaign plans; else ``None``, and a folder that holds something else is added to ``ignored``."""
    if not (folder / "run.json").exists():
        return None
    try:
        run = _campaign.load_result(folder)
    except files.EntryError as e:
        ignored.append((folder, str(e)))
        return None
    if run.info["label"] != entry.label or _numbers(run.config) != _numbers(entry.config):
        ignored.append((folder, f"not the planned run {entry.label!r} (another label or config)"))
        return None
    return run


def _numbers(config: Config) -> Config:
    """``config`` without what never changes a run's numbers: where it kept checkpoints (a resume continues bit
    for bit), which a campaign's plan has changed between versions."""
    return config.replace(checkpoint_every=0, checkpoint_at=())


def status(scale: str | _scales.ExperimentScale, out: str | os.PathLike,
           kinds: Iterable[str] = ("paired", "control", "grid"), widths: Iterable[int] | None = None,
           seeds: Iterable[int] | None = None) -> pd.DataFrame:
    """One row per planned run of ``scale``'s campaign in ``out``: ``label``,
    ``kind``, ``state`` (one of :data:`STATES`), ``step`` (steps done: the
    newest checkpoint's, or the finished run's), ``steps`` (planned),
    ``diverged_at`` (finished runs), the measures of the recorded steps
    (``unstable_at``: diverged or blew up, see
    :func:`~mx_proxy.experiments.analysis.unstable_at`; ``loss``,
    ``vs_fp32_pct``, ``zeta_median``, ``zeta_max``,
    ``zeta_paper_median``, ``zeta_paper_max``, ``ln_clamp_max``; NaN where a
    run records none), ``s_per_step`` (the fastest interval between two
    consecutive checkpoints) and ``eta_h`` (the steps left at that speed).
    ``widths``: only the runs of these model widths; ``seeds``: the paired
    runs and controls at these seeds (as :func:`campaign.run`).

    Raises:
      ValueError: a scale without a campaign or an unknown part (naming the valid ones).
    """
    out = durable.checked_path(out, "campaign folder", folder=True)  # as campaign.run resolves it
    rows, ignored = [], []
    widths = None if widths is None else set(widths)
    for e in _campaign.plan(_scales.with_seeds(scale, seeds), kinds):
        if widths is not None and e.config.width not in widths:
            continue
        row = {"label": e.label, "kind": e.kind, "state": "not started", "step": 0, "steps": e.config.steps,
               "diverged_at": pd.NA}
        partial = partial_metrics(out, e.config)
        run = _exported(out / "results" / e.label, e, ignored)
        if run is not None:
            row.update(state="done", step=run.info["steps_run"], s_per_step=float("nan"), eta_h=0.0,
                       diverged_at=pd.NA if run.diverged_at is None else run.diverged_at)
        elif partial is not None:
            metrics, step, folder = partial
            run = Run(e.config, metrics, None)
            alive = not durable.owner_gone(folder.name.rsplit(".partial-", 1)[1])
            sec = _seconds_per_step(folder)
            row.update(state="training" if alive else "interrupted", step=step, s_per_step=sec,
                       eta_h=sec * (e.config.steps - step) / 3600)
        measures = analysis.headline(run) if run is not None else {}
        row.update({k: measures.get(k, float("nan")) for k in MEASURES})
        rows.append(row)
    result_folders.warn(ignored, out / "results")
    columns = ["label", "kind", "state", "step", "steps", "diverged_at", *MEASURES, "s_per_step", "eta_h"]
    df = pd.DataFrame(rows, columns=columns)
    for c in ("diverged_at", "unstable_at"):
        df[c] = df[c].astype("Int64")
    return df


def jobs(out: str | os.PathLike) -> pd.DataFrame:
    """One row per unit the campaign in ``out`` submitted to Slurm
    (``--executor slurm``; none otherwise): ``unit``, ``job``, ``state``
    (``done``, ``pending``, ``running``, ``requeued`` or ``failed (STATE)``),
    ``checkpoint`` (the step of its newest checkpoint), ``stdout``,
    ``stderr`` and a failed unit's last log lines (``tail``); see
    :func:`mx_proxy.experiments.executors.slurm.jobs`."""
    out = durable.checked_path(out, "campaign folder", folder=True)
    rows = _slurm.jobs(out / "slurm", out / "runs")
    df = pd.DataFrame(rows, columns=["unit", "labels", "job", "state", "checkpoint", "stdout", "stderr", "tail"])
    df["checkpoint"] = df["checkpoint"].astype("Int64")
    return df


def with_jobs(table: pd.DataFrame, units: pd.DataFrame) -> pd.DataFrame:
    """``table`` (:func:`status`) with each run's Slurm ``job`` and
    ``job_state`` from ``units`` (:func:`jobs`). Only this host's processes
    can be judged alive from a training folder's name, so a run whose job
    is no longer pending or running is ``interrupted``, not ``training``."""
    if not len(units):
        return table
    by_label = {label: (u.job, u.state) for u in units.itertuples() for label in u.labels}
    table = table.copy()
    table["job"] = [by_label.get(label, (None, None))[0] for label in table["label"]]
    table["job_state"] = [by_label.get(label, (None, None))[1] for label in table["label"]]
    gone = (table["state"] == "training") & table["job_state"].notna() \
        & ~table["job_state"].isin(["running", "pending", "requeued"])
    table.loc[gone, "state"] = "interrupted"
    return table
