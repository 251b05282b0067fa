"""What a results folder holds: its exported runs, found by their labels, and what is not one of them.

A results folder (``OUT/results`` of a campaign or of an ensemble) holds one
folder per exported run, named for its label (``paired-w32-…``,
``fp32-m00``), each with ``run.json`` (written last), ``config.json`` and
``metrics.parquet``. Nothing in it counts for being there (:func:`scan`):

- a folder is a run's only if its ``run.json`` passes the results schema
  (:data:`mx_proxy.store.files.RESULT_META`) and names the folder's own
  label: a copy (``fp32-m00.bak/``, ``paired-… (copy)/``) names the label
  of the folder it was copied from, and is ignored;
- a damaged ``run.json`` (empty, truncated, another schema) is named and
  ignored, and the rest are read;
- where the labels are known (an ensemble's spec lists its members'), a
  folder under any other name is foreign, and ignored;
- folders without a ``run.json`` (an export a kill interrupted: ``run.json``
  is written last), temporary folders and folders set aside
  (``<label>.aside-<n>``, :func:`set_aside`) are not runs, and pass unnamed.

Every read names what it ignored in one :class:`ResultsWarning`
(:func:`warn`). An ensemble's members are also checked against the config
its spec gives them (:func:`mx_proxy.experiments.ensemble_export.verified`).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from pathlib import Path

import pandas as pd

from mx_proxy.store import durable, files

__all__ = ["ResultsWarning", "Scan", "scan", "warn", "index", "set_aside", "ASIDE"]

ASIDE = ".aside-"
"""The mark of a folder set aside (:func:`set_aside`): ``<label>.aside-<n>``."""

SHOWN = 5  # folders a warning names one by one; the rest are counted


class ResultsWarning(UserWarning):
    """A results folder holds folders that are not its runs (copies, foreign or damaged exports): they are
    ignored (named), and the rest are read."""


@dataclasses.dataclass(frozen=True)
class Scan:
    """:func:`scan`'s answer: ``found``, label → (folder, its verified ``run.json``), in label order, and
    ``ignored``, (folder, why) for each folder that looked like a run and is not one of them."""

    found: dict
    ignored: tuple


def _not_a_run(d: Path) -> bool:
    return not d.is_dir() or durable.is_tmp(d.name) or ASIDE in d.name or not (d / "run.json").exists()


def scan(results, labels=None) -> Scan:
    """The exported runs in the folder ``results`` (see the module docstring); ``labels``: the only labels a
    run may have (an ensemble's members), ``None``: any. A missing folder holds none."""
    results = Path(results)
    allowed = None if labels is None else set(labels)
    found, ignored = {}, []
    children = sorted(results.iterdir()) if results.is_dir() else []
    for d in children:
        if _not_a_run(d):
            continue
        if allowed is not None and d.name not in allowed:
            ignored.append((d, "not a label of the spec (a copy or a foreign folder)"))
            continue
        try:
            meta = files.read_json(d / "run.json", files.RESULT_META)
        except files.EntryError as e:
            ignored.append((d, str(e)))
            continue
        if meta["label"] != d.name:
            ignored.append((d, f"its run.json is the export of {meta['label']!r} (a copy)"))
            continue
        found[d.name] = (d, meta)
    return Scan(found, tuple(ignored))


_WARNED: set[tuple[str, str]] = set()  # (results folder, message): a process says each once


def warn(ignored, results, stacklevel: int = 3) -> None:
    """One :class:`ResultsWarning` naming each of ``ignored`` ((folder, why) pairs) in ``results``; none if
    there are none, or if this process has said the same of the same folder before (a command reads a
    results folder several times: to resume, to index, to report)."""
    ignored = list(ignored)
    if not ignored:
        return
    shown = "; ".join(f"{str(Path(d).name)!r}: {why}" for d, why in ignored[:SHOWN])
    more = f"; and {len(ignored) - SHOWN} more" if len(ignored) > SHOWN else ""
    message = (f"results folder {str(results)!r}: {len(ignored)} folder(s) ignored, not counted as results "
               f"({shown}{more})")
    key = (os.path.abspath(results), message.split(": ", 1)[1])
    if key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(message, ResultsWarning, stacklevel=stacklevel)


def index(results: str | os.PathLike, labels=None) -> pd.DataFrame:
    """One row per exported run of a results folder (:func:`scan`, ``labels`` as there; what it ignores is
    warned of), from its ``run.json`` and ``config.json``, sorted by label."""
    found = scan(results, labels)
    ignored, rows = list(found.ignored), []
    for label, (d, meta) in found.found.items():
        try:
            cfg = files.read_config(d / "config.json")
        except files.EntryError as e:
            ignored.append((d, str(e)))
            continue
        rows.append({"label": label, "kind": meta["kind"], "recipe": cfg.recipe.name,
                     "reference": cfg.reference_recipe.name if cfg.has_paired_run else None,
                     "width": cfg.width, "depth": cfg.depth, "batch": cfg.batch, "lr": cfg.lr, "seed": cfg.seed,
                     "steps": cfg.steps, "steps_run": meta["steps_run"], "diverged_at": meta["diverged_at"],
                     "final_loss": meta.get("final_loss"), "wall_time_s": meta.get("wall_time_s"),
                     "code_version": meta.get("code_version"), "git_commit": meta.get("git_commit"),
                     "device": meta.get("device")})
    warn(ignored, results)
    df = pd.DataFrame(rows)
    if len(df):
        df["diverged_at"] = df["diverged_at"].astype("Int64")
    return df


def set_aside(folder: Path, why: str) -> Path:
    """Rename the export ``folder`` to ``<label>.aside-<n>`` beside it (the first free ``n``), so that a run
    exported again under its label replaces nothing anyone may still want, with one :class:`ResultsWarning`
    saying why; returns the new path."""
    folder = Path(folder)
    n = 0
    while (aside := folder.with_name(f"{folder.name}{ASIDE}{n}")).exists():
        n += 1
    durable.rename(folder, aside)
    warnings.warn(f"{str(folder)!r}: {why}; set aside as {aside.name!r}, to be exported again", ResultsWarning,
                  stacklevel=3)
    return aside
