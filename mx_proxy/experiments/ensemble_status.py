"""Where an ensemble stands, read from its folder (trains nothing; safe beside a running job).

Per arm: members exported (done), members with a checkpoint (their newest
step; ``training`` while the process that writes it lives, ``interrupted``
once it is gone: rerunning the command resumes them; ``training`` too for a
member whose process lives but has not written its first checkpoint yet;
``waiting`` where some members are exported and none of the rest has
started), member-steps done (to the newest checkpoint) and
left, the measured seconds per member-step (a checkpoint's ``wall_time_s``,
summed over a resumed member's stretches, over the steps it covers; the
median over members, per model, a member trained beside its FP32 twin
counting two) and the hours left at that speed in one process.

An ensemble run with ``--executor slurm`` also has its units' jobs
(:func:`jobs`: per unit its Slurm job id and state, the step of its newest
checkpoint, its log files and, for a failed one, the log's last lines), and
:func:`with_jobs` adds each arm's jobs to the table: a training folder left
on another node cannot be judged alive from its name, so an arm none of
whose jobs is pending or running is ``interrupted``, not ``training``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from mx_proxy.experiments import campaign_status
from mx_proxy.experiments import ensemble as _ens
from mx_proxy.store import checkpoint as ckpt
from mx_proxy.store import durable

__all__ = ["status", "jobs", "with_jobs"]


def _member_progress(root: Path, key: str, start: int) -> tuple[str | None, int | None, float | None]:
    """(state, newest checkpoint step, seconds per step) of one member's training folders; the step is None
    for a member whose live process has written no checkpoint yet (``training``), and the state None where no
    folder is being trained or can be resumed."""
    best: tuple[str | None, int | None, float | None] = (None, None, None)
    for part in sorted(root.glob(f"{key}.partial-*")):
        cdir = part / "checkpoints"
        found = ckpt.steps(cdir)
        gone = durable.owner_gone(part.name.rsplit(".partial-", 1)[1])
        if not found:
            if not gone and best[0] is None:  # started, before its first checkpoint; a dead one restarts anew
                best = ("training", None, None)
            continue
        step = found[-1]
        wall = ckpt.meta(cdir, step).get("wall_time_s")
        state = "interrupted" if gone else "training"
        rate = float(wall) / (step - start) if wall and step > start else None
        if best[1] is None or step >= best[1]:
            best = (state, step, rate)
    return best


def status(out) -> pd.DataFrame:
    """One row per arm of the ensemble in ``out`` (see the module docstring)."""
    out = _ens.ensemble_folder(out)
    spec = _ens.read_spec(out)
    branch_key = _ens.read_branch(out).key if spec.kind == "branch" and (out / "branch").exists() else None
    root = out / "runs"
    rows, rates = [], []
    for arm in spec.trained_arms():
        models = 2 if spec.config(arm, 0).has_paired_run else 1  # a member trained beside its FP32 twin
        done, running, steps_done, states = 0, 0, 0, set()
        for i in range(spec.members):
            if _ens.exported(spec, arm, i, out / "results") is not None:  # whole, and this member's
                done += 1
                steps_done += spec.horizon
                continue
            key = _ens.member_key(spec, arm, i, branch_key) if spec.kind != "branch" or branch_key else None
            if key is None:
                continue
            state, step, rate = _member_progress(root, key, spec.start)
            if state is not None:
                states.add(state)
            if step is not None:
                running += 1
                steps_done += step - spec.start
                if rate is not None:
                    rates.append(rate / models)
        rows.append({"arm": arm, "models": models, "members": spec.members, "done": done, "with_checkpoint": running,
                     "state": "done" if done == spec.members else "/".join(sorted(states)) or (
                         "waiting" if done else "not started"),
                     "member_steps_done": steps_done, "member_steps_left": spec.members * spec.horizon - steps_done})
    df = pd.DataFrame(rows)
    rate = float(np.median(rates)) if rates else np.nan  # per model-step: a twin-paired member-step is two
    df["s_per_member_step"] = df["models"] * rate
    df["hours_left"] = df["member_steps_left"] * df["s_per_member_step"] / 3600.0
    return df.drop(columns="models")


def jobs(out) -> pd.DataFrame:
    """One row per unit of the ensemble in ``out`` submitted to Slurm (none
    otherwise): ``unit``, ``labels`` (its members), ``job``, ``state``
    (``done``, ``pending``, ``running``, ``requeued`` or ``failed (STATE)``),
    ``checkpoint``, ``stdout``, ``stderr``, ``tail``. An ensemble's folder is
    laid out as a campaign's (``OUT/slurm``, ``OUT/runs``), so this is
    :func:`mx_proxy.experiments.campaign_status.jobs`."""
    return campaign_status.jobs(_ens.ensemble_folder(out))


_ACTIVE = ("pending", "running", "requeued")


def with_jobs(table: pd.DataFrame, units: pd.DataFrame, out) -> pd.DataFrame:
    """``table`` (:func:`status`) with each arm's Slurm ``jobs`` (``id state``
    per unit, newest submission) from ``units`` (:func:`jobs`); an arm
    ``training`` none of whose jobs may still run becomes ``interrupted``."""
    if not len(units):
        return table
    spec = _ens.read_spec(_ens.ensemble_folder(out))
    arm_of = {_ens.member_label(arm, i): arm for arm in spec.trained_arms() for i in range(spec.members)}
    per_arm: dict[str, list] = {}
    for u in units.itertuples():
        for arm in dict.fromkeys(arm_of[label] for label in u.labels if label in arm_of):
            per_arm.setdefault(arm, []).append((u.job, u.state))
    table = table.copy()
    table["jobs"] = [", ".join(f"{job} {state}" for job, state in per_arm.get(arm, [])) for arm in table["arm"]]
    for i, arm in enumerate(table["arm"]):
        states = table.at[i, "state"].split("/")
        if "training" in states and not any(state in _ACTIVE for _, state in per_arm.get(arm, [])):
            table.at[i, "state"] = "/".join(sorted({"interrupted" if s == "training" else s for s in states}))
    return table
