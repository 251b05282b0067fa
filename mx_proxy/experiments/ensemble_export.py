"""Where an ensemble's members are exported, and how exports travel: a
member's export (``OUT/results/<arm>-m<i>/``, with ``index.csv``), the
test of whether an export is a member's own and whole, and the copy of
whole members between results folders (a run store's and a committed one).
Re-exported by :mod:`mx_proxy.experiments.ensemble`, the experiment's entry point."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pandas as pd

from mx_proxy.experiments import campaign
from mx_proxy.experiments.ensemble_spec import CONTROL, HISTORY, TWIN, Ensemble, load_member, member_label, write_spec
from mx_proxy.store import durable
from mx_proxy.training.result import Run

__all__ = ["export", "exported", "copy_members"]


def _has_twin(spec: Ensemble, arm: str) -> bool:
    """Whether ``arm``'s members are exported with their paired FP32 twin beside them."""
    return arm == CONTROL and TWIN in spec.arms


def _labels(spec: Ensemble, arm: str, i: int) -> list[str]:
    """The export folders of member ``i`` of ``arm``: its own, and its twin's where it has one."""
    return [member_label(arm, i)] + ([member_label(TWIN, i)] if _has_twin(spec, arm) else [])


def exported(spec: Ensemble, arm: str, i: int, results: Path) -> Run | None:
    """Member ``i`` of ``arm`` as exported in ``results`` (and its twin's export
    beside an ``unchanged`` member that has one), if that export is this
    member's (its config is the one the member trains) and whole; else
    ``None`` (a damaged export is trained again and rewritten)."""
    labels = _labels(spec, arm, i)
    if not all((results / label / "run.json").exists() for label in labels):
        return None
    try:
        r = load_member(spec, results / labels[0])
    except ValueError:  # files.EntryError: a truncated or altered file
        return None
    return r if r.config == spec.config(arm, i) else None


def _twin_run(spec: Ensemble, r: Run, i: int) -> Run:
    """The paired FP32 run of an ``unchanged`` member, as a member of the ``twin`` arm."""
    m = r.metrics
    cols = {"step": m["step"], "loss": m["ref_loss"], "lr": m["lr"], "grad_norm": m["ref_grad_norm"]}
    metrics = pd.DataFrame(cols).dropna(subset=["loss"]).reset_index(drop=True)
    cfg = spec.config(CONTROL, i).replace(recipe=spec.base.reference_recipe, paired_run=False)
    info = dict(r.info, ensemble=dict(r.info["ensemble"], arm=TWIN), trained_with=r.info.get("key"),
                stopped_with_pair=r.diverged_at)
    return Run(cfg, metrics, None, None, r.wall_time_s, info)  # an engine stop of its pair censors it there


def export(spec: Ensemble, arm: str, runs: dict[int, Run], results) -> None:
    """Export members ``{i: run}`` of ``arm`` (and of ``twin`` beside
    ``unchanged``) to ``results/<arm>-m<i>/`` and rewrite ``results/index.csv``."""
    results = Path(results)
    arms = [(arm, runs)] + ([(TWIN, {i: _twin_run(spec, r, i) for i, r in runs.items()})]
                            if _has_twin(spec, arm) else [])
    for name, rs in arms:
        for i, r in rs.items():
            m = r.metrics
            if spec.kind == "branch":
                m = m[m["step"] >= spec.branch_at - HISTORY].reset_index(drop=True)
            view = dataclasses.replace(r, metrics=m, info=dict(r.info, history_from=int(m["step"].iloc[0])))
            campaign.export(view, member_label(name, i), "ensemble", results)
    _write_index(results)


def _write_index(results: Path) -> None:
    index = campaign.results_index(results)
    durable.atomic_write(results / "index.csv", lambda p: index.to_csv(p, index=False))


def copy_members(spec: Ensemble, src, dst) -> list[str]:
    """Copy into the results folder ``dst`` each member of ``spec`` that the
    results folder ``src`` has exported, whole and with the config ``spec``
    trains it with (:func:`exported`), and ``dst`` has not (a damaged or
    foreign export there is replaced); each member folder (with its twin's
    beside ``unchanged``) is copied to a temporary sibling and renamed into
    place, then ``dst``'s spec and index are written. Returns the copied
    members' labels (none where ``src`` is missing or is ``dst`` itself).
    How exports travel between a run store's results and a committed copy,
    either way."""
    src, dst = Path(src).expanduser(), Path(dst).expanduser()
    if not src.is_dir() or (dst.is_dir() and src.resolve() == dst.resolve()):
        return []
    copied = []
    for arm in spec.trained_arms():
        for i in range(spec.members):
            if exported(spec, arm, i, dst) is not None or exported(spec, arm, i, src) is None:
                continue
            labels = _labels(spec, arm, i)
            for label in labels:
                durable.discard(dst / label)  # a damaged or foreign export in the way
                tmp = dst / durable.tmp_name(label)
                shutil.copytree(src / label, tmp)
                durable.rename(tmp, dst / label)
            copied += labels
    if copied:
        write_spec(spec, dst)
        _write_index(dst)
    return copied
