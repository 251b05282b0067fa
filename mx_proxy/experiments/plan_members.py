"""The plan's members so far: each study's exported members under ``DIR/<study>`` (e.g. ``results/plan``), their
outcomes by the ensembles' rule, and the machines they trained on.

- :func:`load_studies`: per study of the plan, its :class:`~mx_proxy.experiments.ensemble_result.EnsembleResult`
  (``None`` where ``DIR/<study>`` holds no member yet), its folder's spec checked against the plan's (or its lean
  version, :mod:`mx_proxy.experiments.lean`);
- :func:`samples`: every arm's outcomes (blown up by the horizon) as a :class:`pandas.Series` indexed by seed,
  keyed by ``STUDY/ARM``, what :mod:`mx_proxy.experiments.plan_stats` pairs;
- :func:`parent_state`: a branch study's state: the step its members branched at (the plan's, or an earlier
  multiple of :data:`BRANCH_STEP` where the parent had blown up by then on its machine, as the plan allows) and
  the parent's first blow-up by the rule on its recorded history;
- :func:`machines`: per member, the machine it trained on: its ``run.json``'s ``device``, or, where that names no
  model (``cpu: cpu``, exported before the exporter wrote one), the machine ``DIR/MACHINES.md`` lists for its
  study and seed.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pandas as pd

from mx_proxy.experiments import analysis, ensemble_result, lean
from mx_proxy.experiments.ensemble_spec import read_history, read_spec, results_folder

__all__ = ["load_studies", "samples", "machines", "machine_notes", "parent_state", "GENERIC_DEVICES", "NOTES_FILE",
           "BRANCH_STEP"]

BRANCH_STEP = 500
"""A branch study moved earlier (its parent blew up before the plan's branch step) branches at a multiple of this."""

NOTES_FILE = "MACHINES.md"
GENERIC_DEVICES = ("cpu: cpu",)
"""``run.json`` devices that name no model: :func:`machines` reads the notes for them."""


def load_studies(plan, folder) -> dict[str, ensemble_result.EnsembleResult | None]:
    """Every study of ``plan`` (in plan order) → its members' results in ``folder/<study>``, ``None`` where there
    is no member yet. A ValueError where ``folder`` is no folder, or a study's folder holds another ensemble."""
    root = Path(folder)
    if not root.is_dir():
        raise ValueError(f"{folder}: no plan results folder there (a folder with one sub-folder per study, e.g. "
                         f"results/plan)")
    out = {}
    for study in plan.studies:
        sub = root / study.id
        if results_folder(sub) is None:
            out[study.id] = None
            continue
        spec = read_spec(sub)
        allowed = (study.ensemble_spec, lean.study_spec(plan, study))
        if spec not in allowed and not _moved(spec, study.ensemble_spec, allowed):
            raise ValueError(f"{sub}: its ensemble.json is not study {study.id!r} of plan {plan.name!r} (nor its "
                             f"lean version): ensemble {spec.name!r}, arms {', '.join(spec.arms)}")
        result = ensemble_result.load(sub)
        out[study.id] = result if len(result.table) else None
    return out


def _moved(spec, planned, allowed) -> bool:
    """Whether ``spec`` is a branch study of ``allowed`` branched earlier, at a multiple of :data:`BRANCH_STEP`."""
    at = spec.branch_at
    if spec.kind != "branch" or not at or at % BRANCH_STEP or at >= planned.branch_at:
        return False
    at = planned.branch_at
    return dataclasses.replace(spec, branch_at=at, base=spec.base.replace(steps=at)) in allowed


def parent_state(study, result, folder) -> dict | None:
    """A branch study's state (``None`` for another study, or one without members): ``branch_at`` (its members'),
    ``planned_branch_at`` (the plan's), ``history`` (whether its branch history is recorded) and
    ``parent_blown_up_at``: the parent's first blow-up by the ensembles' rule on that history (``None``: none)."""
    if study.ensemble_spec.kind != "branch" or result is None:
        return None
    hist = read_history(Path(folder) / study.id)
    blown = None
    if hist is not None and len(hist):
        window = analysis.window_for_steps(result.spec.base.steps)
        ratio = analysis.loss_jump_ratio(hist["loss"].to_numpy(float), window)
        hot = np.flatnonzero(ratio > ensemble_result.RULE)
        blown = int(hist["step"].iloc[hot[0]]) if len(hot) else None
    return {"branch_at": result.spec.branch_at, "planned_branch_at": study.ensemble_spec.branch_at,
            "history": hist is not None, "parent_blown_up_at": blown}


def samples(results: dict) -> dict[str, pd.Series]:
    """``STUDY/ARM`` → that arm's outcomes (``True``: blown up by the horizon) indexed by seed, for every arm of
    every study with members (an arm without one: an empty Series)."""
    out = {}
    for sid, result in results.items():
        if result is None:
            continue
        for arm in result.spec.arms:
            rows = result.table[result.table["arm"] == arm]
            out[f"{sid}/{arm}"] = pd.Series(rows["event"].to_numpy(bool), index=rows["seed"].to_numpy(int),
                                            name=f"{sid}/{arm}")
    return out


def machine_notes(folder) -> list[dict]:
    """The rows of ``folder/MACHINES.md``'s table: ``study``, ``seeds`` (the first and last seed, inclusive),
    ``commit`` and ``machine`` (its text up to the first comma); none without the file."""
    path = Path(folder) / NOTES_FILE
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] in ("study", "") or set(cells[0]) <= {"-"}:
            continue
        m = re.search(r"seeds?\s+(\d+)(?:\s*[–-]\s*(\d+))?", cells[1])
        if m is None:
            continue
        first = int(m.group(1))
        rows.append({"study": cells[0], "seeds": (first, int(m.group(2) or first)), "commit": cells[2],
                     "machine": cells[3].split(",")[0].strip()})
    return rows


def machines(results: dict, folder) -> pd.DataFrame:
    """One row per member with members: ``study``, ``arm``, ``seed``, ``device`` (its ``run.json``'s),
    ``machine`` (the device, or for a :data:`GENERIC_DEVICES` one the notes' machine for its study and seed,
    else the device as it is), ``source`` (``run.json`` or ``MACHINES.md``) and ``commit`` (the first 7 digits
    of the commit it trained at)."""
    notes = machine_notes(folder)
    rows = []
    for sid, result in results.items():
        if result is None:
            continue
        for arm, runs in result.runs.items():
            for i, run in enumerate(runs):
                if run is None:
                    continue
                info, seed = run.info or {}, result.spec.seeds()[i]
                device = str(info.get("device", "unknown"))
                note = next((n for n in notes if n["study"] == sid and n["seeds"][0] <= seed <= n["seeds"][1]), None)
                generic = device in GENERIC_DEVICES and note is not None
                rows.append({"study": sid, "arm": arm, "seed": seed, "device": device,
                             "machine": note["machine"] if generic else device,
                             "source": NOTES_FILE if generic else "run.json",
                             "commit": str(info.get("git_commit") or "")[:7]})
    return pd.DataFrame(rows, columns=["study", "arm", "seed", "device", "machine", "source", "commit"])
