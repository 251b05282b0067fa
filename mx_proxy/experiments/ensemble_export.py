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

from mx_proxy.experiments import campaign, result_folders
from mx_proxy.experiments.ensemble_spec import CONTROL, HISTORY, TWIN, Ensemble, load_member, member_label, write_spec
from mx_proxy.store import durable
from mx_proxy.training.config import Config
from mx_proxy.training.result import Run

__all__ = ["export", "exported", "verified", "export_config", "set_aside", "labels", "copy_members"]


def _has_twin(spec: Ensemble, arm: str) -> bool:
    """Whether ``arm``'s members are exported with their paired FP32 twin beside them."""
    return arm == CONTROL and TWIN in spec.arms


def _arms(spec: Ensemble, arm: str) -> list[str]:
    """The arms a member of ``arm`` is exported as: its own, and ``twin`` where it has one."""
    return [arm] + ([TWIN] if _has_twin(spec, arm) else [])


def _labels(spec: Ensemble, arm: str, i: int) -> list[str]:
    """The export folders of member ``i`` of ``arm``: its own, and its twin's where it has one."""
    return [member_label(name, i) for name in _arms(spec, arm)]


def export_config(spec: Ensemble, arm: str, i: int) -> Config:
    """The config member ``i`` of ``arm`` is exported with: the one it trains, and a ``twin`` member's, its
    ``unchanged`` member's paired FP32 run as a run of its own."""
    if arm == TWIN:
        return spec.config(CONTROL, i).replace(recipe=spec.base.reference_recipe, paired_run=False)
    return spec.config(arm, i)


def verified(spec: Ensemble, arm: str, i: int, results) -> tuple[Run | None, str | None]:
    """Member ``i`` of ``arm`` as exported in ``results``, checked against the spec: ``(run, None)`` for an
    export that is whole and this member's (its config is :func:`export_config`'s), ``(None, why)`` for a
    folder under its label that holds something else (damaged, another config: another learning rate, seed,
    arm), ``(None, None)`` where nothing is exported yet."""
    folder = Path(results) / member_label(arm, i)
    if not (folder / "run.json").exists():
        return None, None
    try:
        r = load_member(spec, folder)
    except ValueError as e:  # files.EntryError: a truncated or altered file
        return None, str(e)
    want = export_config(spec, arm, i)
    if r.config != want:
        ours, theirs = want.to_dict(), r.config.to_dict()
        differ = ", ".join(f"{k} {theirs[k]!r} (the spec's: {ours[k]!r})" for k in ours if ours[k] != theirs.get(k))
        return None, f"not this member's run: its config differs in {differ}"
    return r, None


def exported(spec: Ensemble, arm: str, i: int, results: Path) -> Run | None:
    """Member ``i`` of ``arm`` as exported in ``results`` (and its twin's export
    beside an ``unchanged`` member that has one), if that export is this
    member's (its config is the one the member trains, :func:`verified`) and
    whole; else ``None`` (a damaged or foreign export is trained again and rewritten)."""
    runs = [verified(spec, name, i, results)[0] for name in _arms(spec, arm)]
    return runs[0] if all(r is not None for r in runs) else None


def set_aside(spec: Ensemble, arm: str, i: int, results) -> None:
    """Set aside (:func:`mx_proxy.experiments.result_folders.set_aside`) each export folder of member ``i``
    of ``arm`` (and its twin's) that holds something else than this member's run, before it is exported again."""
    for name in _arms(spec, arm):
        _, why = verified(spec, name, i, results)
        if why is not None:
            result_folders.set_aside(Path(results) / member_label(name, i), why)


def _twin_run(spec: Ensemble, r: Run, i: int) -> Run:
    """The paired FP32 run of an ``unchanged`` member, as a member of the ``twin`` arm."""
    m = r.metrics
    cols = {"step": m["step"], "loss": m["ref_loss"], "lr": m["lr"], "grad_norm": m["ref_grad_norm"]}
    metrics = pd.DataFrame(cols).dropna(subset=["loss"]).reset_index(drop=True)
    cfg = export_config(spec, TWIN, i)
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
    _write_index(spec, results)


def labels(spec: Ensemble) -> list[str]:
    """Every member's export label, arm by arm."""
    return [member_label(arm, i) for arm in spec.arms for i in range(spec.members)]


def _write_index(spec: Ensemble, results: Path) -> None:
    index = result_folders.index(results, labels(spec))  # the spec's members only: no copy counts twice
    durable.atomic_write(results / "index.csv", lambda p: index.to_csv(p, index=False))


def copy_members(spec: Ensemble, src, dst, members=None) -> list[str]:
    """Copy into the results folder ``dst`` each member of ``spec`` that the
    results folder ``src`` has exported, whole and with the config ``spec``
    trains it with (:func:`exported`), and ``dst`` has not (a damaged or
    foreign export there is replaced); each member folder (with its twin's
    beside ``unchanged``) is copied to a temporary sibling and renamed into
    place, then ``dst``'s spec and index are written. Returns the copied
    members' labels (none where ``src`` is missing or is ``dst`` itself); ``members``: only these indices.
    How exports travel between a run store's results and a committed copy,
    either way."""
    src, dst = Path(src).expanduser(), Path(dst).expanduser()
    if not src.is_dir() or (dst.is_dir() and src.resolve() == dst.resolve()):
        return []
    copied = []
    for arm in spec.trained_arms():
        for i in range(spec.members) if members is None else sorted(members):
            if exported(spec, arm, i, dst) is not None or exported(spec, arm, i, src) is None:
                continue
            set_aside(spec, arm, i, dst)  # a damaged or foreign export in the way
            for label in _labels(spec, arm, i):
                durable.discard(dst / label)  # an incomplete one (no run.json)
                tmp = dst / durable.tmp_name(label)
                shutil.copytree(src / label, tmp)
                durable.rename(tmp, dst / label)
                copied.append(label)
    if copied:
        write_spec(spec, dst)
        _write_index(spec, dst)
    return copied
