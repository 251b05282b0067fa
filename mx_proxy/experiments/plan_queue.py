"""The plan's queue on one machine kind: its units in order, each trained, resumed and exported.

``python -m mx_proxy.experiments.plan_queue cpu --store DIR --export DIR`` trains the plan's (``docs/plan.json``,
:mod:`mx_proxy.experiments.plan`) units for the ``cpu`` (or ``gpu``) machine one after another: unit ``k`` of a
study trains members ``[k·unit, (k+1)·unit)`` of every arm in ``DIR/<study>`` (the run store: checkpoints, so an
interrupted unit resumes where it stopped), then copies every finished member into ``EXPORT/<study>`` (the
committed copy, e.g. ``results/plan``), where the next call finds it: a unit whose members are all exported there
is skipped, and a fresh store starts from the exported members. ``--seconds`` stops starting units once that much
time has passed (a unit already running finishes, or is interrupted with SIGINT and resumes next time).

Each member trains alone (``group_size`` of the study's machine, :data:`GROUP_SIZE`), so the bits of a member do not
depend on how many members were trained beside it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from mx_proxy.experiments import ensemble as _ens
from mx_proxy.experiments import plan as _plan
from mx_proxy.experiments.ensemble_export import copy_members, exported
from mx_proxy.runner import loop as runner

__all__ = ["pending", "run_unit", "run_queue", "GROUP_SIZE", "main"]

GROUP_SIZE = {"cpu": 1, "gpu": 8}
"""Members per program (vmapped group) on each machine kind."""


def _missing(unit: _plan.Unit, export: Path) -> list[tuple[str, int]]:
    spec = unit.study.ensemble_spec
    folder = Path(export) / unit.study.id
    return [(arm, i) for arm in spec.trained_arms() for i in range(unit.start, unit.stop)
            if exported(spec, arm, i, folder) is None]


def pending(plan: _plan.Plan, machine: str, export) -> list[_plan.Unit]:
    """``machine``'s units (in order) with a member not yet exported in ``export/<study>``."""
    return [u for u in _plan.units(plan, machine) if _missing(u, Path(export))]


def run_unit(unit: _plan.Unit, store, export, *, progress: bool = True, log=print) -> list[str]:
    """Train (or resume) ``unit`` in ``store/<study>`` and copy its study's finished members into
    ``export/<study>``; returns the labels copied."""
    spec, sid = unit.study.ensemble_spec, unit.study.id
    out, dest = Path(store).expanduser() / sid, Path(export).expanduser() / sid
    copy_members(spec, dest, out / "results")  # a fresh store resumes from the committed exports
    source = None
    if spec.kind == "branch":  # the parent run, trained (or loaded) on this machine, to the branch step
        source = runner.train(unit.study.parent, store=out / "runs", progress=progress)
    _ens.run(spec, out, source=source, group_size=GROUP_SIZE[unit.study.machine], upto=unit.stop,
             progress=progress, log=log)
    return copy_members(spec, out / "results", dest)


def run_queue(plan: _plan.Plan, machine: str, store, export, *, seconds: float | None = None,
              progress: bool = True, log=print) -> list[_plan.Unit]:
    """Run ``machine``'s pending units in order until none is left or ``seconds`` have passed (no unit starts
    after that); returns the units that finished."""
    t0, done = time.time(), []
    for unit in pending(plan, machine, export):
        if seconds is not None and time.time() - t0 >= seconds:
            log(f"plan queue: {seconds:.0f} s passed; {unit.label} and the units after it not started")
            break
        log(f"plan queue: {unit.label} ({unit.member_steps():,} member-steps at most)")
        copied = run_unit(unit, store, export, progress=progress, log=log)
        log(f"plan queue: {unit.label} done, {len(copied)} members exported to {Path(export) / unit.study.id}")
        done.append(unit)
    left = pending(plan, machine, export)
    log(f"plan queue: {len(left)} {machine} units left" + (f", next {left[0].label}" if left else ""))
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mx_proxy.experiments.plan_queue", description=__doc__.split("\n")[0])
    p.add_argument("machine", choices=_plan.MACHINES)
    p.add_argument("--store", required=True, help="the run store: one folder per study (checkpoints, resume)")
    p.add_argument("--export", required=True, help="where finished members are copied (e.g. results/plan)")
    p.add_argument("--plan", default=None, help=f"the plan file (default {_plan.PLAN_FILE})")
    p.add_argument("--seconds", type=float, default=None, help="start no unit after this many seconds")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    a = p.parse_args(argv)
    try:
        plan = _plan.load(a.plan)
    except ValueError as e:
        print(f"plan queue: {e}", file=sys.stderr)
        return 2
    run_queue(plan, a.machine, a.store, a.export, seconds=a.seconds, progress=not a.quiet)
    return 0


if __name__ == "__main__":
    sys.exit(main())
