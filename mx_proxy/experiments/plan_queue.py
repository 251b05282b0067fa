"""The plan's queue on one machine kind: its units in order, each trained, resumed and exported.

``python -m mx_proxy.experiments.plan_queue cpu --store DIR --export DIR`` trains the plan's (``docs/plan.json``,
:mod:`mx_proxy.experiments.plan`) units for the ``cpu`` (or ``gpu``) machine one after another: unit ``k`` of a
study trains members ``[k·unit, (k+1)·unit)`` of every arm in ``DIR/<study>`` (the run store: checkpoints, so an
interrupted unit resumes where it stopped), then copies every finished member into ``EXPORT/<study>`` (the
committed copy, e.g. ``results/plan``), where the next call finds it: a unit whose members are all exported there
(or in ``--committed DIR/<study>``: the members a GPU window finds committed in its tree, while it exports the new
ones elsewhere, e.g. ``$OUT``) is skipped, and a fresh store starts from the exported members.

``--seconds`` is the queue's time budget: no unit starts with less than ``--min-seconds`` of it left, and the unit
running when it runs out stops at the end of its segment, every unfinished member checkpointed in the store (what a
SIGINT does too): a unit cut short loses no finished segment while the store lasts (the next call on the same
machine resumes it there), and its finished members are exported either way. A store on a machine that is given
back goes with it: a unit cut short there trains again from its exported members. The queue prints the member-steps
of the members it finished, per second, and what is left of the plan.

Each member trains in groups of ``group_size`` members per program (a divisor of the study's unit; default the
largest one up to :data:`GROUP_SIZE` of the study's machine); on one machine kind keep it fixed for a study, so
the bits of a member do not depend on how many were trained beside it on a machine whose batched GEMMs depend on
the batch. ``--lean``: the study's lean ensemble
(:mod:`mx_proxy.experiments.lean`: diagnostics only where the plan scores warning signals); a study's export
folder holds one mode's members (the other's spec is refused there).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from mx_proxy.experiments import ensemble as _ens
from mx_proxy.experiments import lean as _lean
from mx_proxy.experiments import plan as _plan
from mx_proxy.experiments.ensemble_export import copy_members, exported
from mx_proxy.runner import interrupt
from mx_proxy.runner import loop as runner

__all__ = ["pending", "run_unit", "run_queue", "spec_of", "GROUP_SIZE", "MIN_SECONDS", "main"]

GROUP_SIZE = {"cpu": 1, "gpu": 8}
"""Members per program (vmapped group) on each machine kind, unless ``group_size`` is given."""

MIN_SECONDS = 30.0
"""No unit starts with less of the budget left (a compile and a segment)."""


class _Deadline:
    """An :class:`mx_proxy.runner.interrupt.Interruption`'s request flag that is also set once ``clock()`` passes
    ``deadline``: the host loop, which reads it after every segment, then stops there, checkpointed."""

    def __init__(self, deadline: float | None, clock):
        self.deadline, self.clock, self._set = deadline, clock, False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set or (self.deadline is not None and self.clock() >= self.deadline)


def spec_of(plan: _plan.Plan, study: _plan.Study, lean: bool = False):
    """The ensemble the queue trains for ``study``: the plan's, or its lean version (``lean``)."""
    return _lean.study_spec(plan, study) if lean else study.ensemble_spec


def _folders(export, committed) -> list[Path]:
    return [Path(f).expanduser() for f in (export, committed) if f is not None]


def _missing(spec, unit: _plan.Unit, folders: list[Path]) -> list[tuple[str, int]]:
    return [(arm, i) for arm in spec.trained_arms() for i in range(unit.start, unit.stop)
            if all(exported(spec, arm, i, f / unit.study.id) is None for f in folders)]


def pending(plan: _plan.Plan, machine: str, export, *, committed=None, lean: bool = False) -> list[_plan.Unit]:
    """``machine``'s units (in order) with a member exported neither in ``export/<study>`` nor in
    ``committed/<study>``."""
    folders = _folders(export, committed)
    return [u for u in _plan.units(plan, machine) if _missing(spec_of(plan, u.study, lean), u, folders)]


def run_unit(unit: _plan.Unit, store, export, *, spec=None, committed=None, group_size: int | None = None,
             progress: bool = True, log=print) -> list[str]:
    """Train (or resume) ``unit`` in ``store/<study>`` (``spec``: its study's ensemble, default the plan's) and copy
    its study's finished members into ``export/<study>``; returns the labels copied. A run that is stopped
    (:mod:`mx_proxy.runner.interrupt`) exports what finished, then raises."""
    spec, sid = spec or unit.study.ensemble_spec, unit.study.id
    out, dest = Path(store).expanduser() / sid, Path(export).expanduser() / sid
    for folder in _folders(dest.parent, committed):  # a fresh store resumes from the exports, committed ones too
        copy_members(spec, folder / sid, out / "results")
    source = None
    try:
        if spec.kind == "branch":  # the parent run, trained (or loaded) on this machine, to the branch step
            source = runner.train(unit.study.parent, store=out / "runs", progress=progress)
        _ens.run(spec, out, source=source, group_size=_group(unit, group_size), upto=unit.stop, progress=progress,
                 log=log)
    finally:
        members = range(unit.start, unit.stop) if committed is not None else None  # not the committed ones again
        copied = copy_members(spec, out / "results", dest, members) if (out / "results").is_dir() else []
    return copied


def _group(unit: _plan.Unit, group_size: int | None) -> int:
    """Members per program for ``unit``: ``group_size``, a divisor of the study's unit (a group never spans two
    units), by default the largest divisor of the unit not above :data:`GROUP_SIZE` of its machine."""
    size = unit.study.unit
    if group_size is None:
        return math.gcd(GROUP_SIZE[unit.study.machine], size)
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1 or size % group_size:
        raise ValueError(f"group_size must be a positive divisor of study {unit.study.id!r}'s unit ({size} members), "
                         f"got {group_size!r}")
    return group_size


def _labels(folder: Path) -> list[str]:
    """The member folders exported in ``folder`` (those with a run.json)."""
    return [d.name for d in folder.iterdir() if (d / "run.json").is_file()] if folder.is_dir() else []


def _steps_run(folder: Path, labels) -> int:
    total = 0
    for label in labels:
        try:
            total += int(json.loads((folder / label / "run.json").read_text())["steps_run"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return total


def run_queue(plan: _plan.Plan, machine: str, store, export, *, seconds: float | None = None, committed=None,
              lean: bool = False, group_size: int | None = None, min_seconds: float = MIN_SECONDS,
              progress: bool = True, log=print, clock=time.monotonic) -> list[_plan.Unit]:
    """Run ``machine``'s pending units in order until none is left or the budget of ``seconds`` is spent (see
    the module docstring); returns the units that finished."""
    for u in _plan.units(plan, machine):  # a group size that does not fit a unit is refused before any training
        _group(u, group_size)
    t0 = clock()
    deadline = None if seconds is None else t0 + seconds
    done, steps, cut = [], 0, None
    for unit in pending(plan, machine, export, committed=committed, lean=lean):
        if deadline is not None and (deadline - clock() <= 0 or deadline - clock() < min_seconds):
            log(f"plan queue: {deadline - clock():.0f} s of the budget left; {unit.label} and the units after it "
                f"not started")
            break
        spec = spec_of(plan, unit.study, lean)
        log(f"plan queue: {unit.label} ({len(spec.trained_arms()) * (unit.stop - unit.start) * spec.horizon:,} "
            f"member-steps at most)")
        folder = Path(export).expanduser() / unit.study.id
        before = set(_labels(folder))
        state = interrupt.Interruption()
        state.requested = _Deadline(deadline, clock)
        try:
            with interrupt.interruptible(state):
                run_unit(unit, store, export, spec=spec, committed=committed, group_size=group_size,
                         progress=progress, log=log)
        except interrupt.Interrupted as e:  # the budget ran out (or a SIGINT came) before the last segment ended
            if _missing(spec, unit, _folders(export, committed)):
                cut = f"{unit.label} cut short: {e}"
        copied = sorted(set(_labels(folder)) - before)
        steps += _steps_run(folder, copied)
        if cut:
            log(f"plan queue: {cut}")
            break
        log(f"plan queue: {unit.label} done, {len(copied)} members exported to {Path(export) / unit.study.id}")
        done.append(unit)
    spent = max(clock() - t0, 1e-9)
    left = pending(plan, machine, export, committed=committed, lean=lean)
    most = sum(len(spec_of(plan, u.study, lean).trained_arms()) * (u.stop - u.start) * u.study.ensemble_spec.horizon
               for u in left)
    log(f"plan queue: {steps:,} member-steps of the members finished here in {spent:.0f} s "
        f"({steps / spent:.1f} member-steps/s)")
    log(f"plan queue: {len(left)} {machine} units left" + (f", next {left[0].label}; {most:,} member-steps at most"
                                                            if left else ""))
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mx_proxy.experiments.plan_queue", description=__doc__.split("\n")[0])
    p.add_argument("machine", choices=_plan.MACHINES)
    p.add_argument("--store", required=True, help="the run store: one folder per study (checkpoints, resume)")
    p.add_argument("--export", required=True, help="where finished members are copied (e.g. results/plan)")
    p.add_argument("--committed", default=None, help="members already committed (e.g. results/plan): not trained "
                   "again, a fresh store resumes from them")
    p.add_argument("--plan", default=None, help=f"the plan file (default {_plan.PLAN_FILE})")
    p.add_argument("--seconds", type=float, default=None, help="the time budget: the running unit stops at the end "
                   "of its segment when it is spent")
    p.add_argument("--min-seconds", type=float, default=MIN_SECONDS, help="start no unit with less budget left")
    p.add_argument("--lean", action="store_true", help="the studies' lean ensembles (mx_proxy.experiments.lean)")
    p.add_argument("--group-size", type=int, default=None, help="members per program (default: cpu 1, gpu 8)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    a = p.parse_args(argv)
    if a.seconds is not None and a.seconds <= 0:
        p.error(f"--seconds must be positive, got {a.seconds}")
    if a.group_size is not None and a.group_size < 1:
        p.error(f"--group-size must be a positive integer, got {a.group_size}")
    try:
        plan = _plan.load(a.plan)
        for u in _plan.units(plan, a.machine):
            _group(u, a.group_size)
    except ValueError as e:
        print(f"plan queue: {e}", file=sys.stderr)
        return 2
    run_queue(plan, a.machine, a.store, a.export, seconds=a.seconds, committed=a.committed, lean=a.lean,
              group_size=a.group_size, min_seconds=a.min_seconds, progress=not a.quiet)
    return 0


if __name__ == "__main__":
    sys.exit(main())
