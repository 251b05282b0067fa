"""A committed branch ensemble continued on a fresh machine: replay its state, train what it lacks.

A branch ensemble's state (``fig7-6000``: seed 0's ``paper_e4m3`` run at
step 6000, 176 MB with its FP32 twin) is too large to commit, and the run
store that held it does not outlive its machine; the members' exports are
committed (``results/ensembles/<name>``). This continues such an ensemble:

1. ``OUT/results`` becomes a link to the committed folder, so each member
   is exported straight into it as its unit finishes;
2. the state is replayed from step 0 with the ensemble's base config (into
   ``OUT/replay``, resumable) and written as ``OUT/branch``; training is
   deterministic, so on the CPU model that trained the ensemble the replay
   is the run, and :func:`mx_proxy.experiments.ensemble.prepare` refuses it
   unless its loss before the branch equals the ensemble's recorded history
   (``branch_history.parquet``) bit for bit, before any member trains;
3. the members the committed results lack train
   (:func:`mx_proxy.experiments.ensemble.run`; exported ones are loaded).

Without ``paired`` the replay leaves out the base's FP32 twin (about half
the cost): every arm but the twin-paired control trains from that state
exactly as from the paired one, and the control is refused, naming its
members. ``arms`` appends arms (e.g. ``adam_eps=1e-15``), paired with the
others member by member.

On another machine (another CPU model, whose bf16-dot summation order
differs; a GPU) the replay drifts from the recorded run after a few steps,
and step 3 refuses it. ``new`` makes it a new ensemble instead: the
committed one's spec (its arms, members, horizon, branch step and base
config; named after the folder ``new``) branched from this machine's
replayed state, its own history recorded, every member trained and
exported into ``new``. Its rates are a second sample of the same question
from a state that is not the committed one: report it beside it, not
pooled with it. The replay is paired there whenever the spec has the
``twin`` control.

Usage::

    python -m mx_proxy.experiments.branch_replay --results results/ensembles/fig7-6000 --out ~/fig7 \\
        [--arms ARM ...] [--group-size 2] [--paired] [--reference results/paper/<label>] \\
        [--new results/ensembles/fig7-6000-<machine>]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from mx_proxy.experiments import analysis
from mx_proxy.experiments import branch as _branch
from mx_proxy.experiments import ensemble as _ens
from mx_proxy.runner import loop as runner
from mx_proxy.training.config import Config
from mx_proxy.training.result import Run

__all__ = ["replay_config", "link_results", "continue_ensemble", "main"]


def replay_config(spec: _ens.Ensemble, paired: bool = False) -> Config:
    """The config whose run, replayed from step 0, gives ``spec``'s branch state (without its FP32 twin unless
    ``paired``)."""
    if spec.kind != "branch":
        raise ValueError(f"ensemble {spec.name!r} is a {spec.kind} ensemble: only a branch ensemble has a state "
                         f"to replay")
    return spec.base if paired or not spec.base.has_paired_run else spec.base.replace(paired_run=False)


def link_results(results, out) -> Path:
    """Make ``out/results`` a link to the committed ``results`` folder (validated: it holds an ensemble's
    spec); an ``out/results`` that exists must already be that link."""
    results = Path(results).expanduser().resolve()
    _ens.read_spec(results)
    link = Path(out).expanduser() / "results"
    if link.is_symlink() or link.exists():
        if link.resolve() != results:
            raise ValueError(f"{link} exists and is not a link to {results}: give another --out")
        return link
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(results, link, target_is_directory=True)
    return link


def continue_ensemble(results, out, *, arms: Iterable[str] = (), paired: bool = False,
                      group_size: int | None = None, reference=None, new=None, progress: bool = True,
                      log: Callable[[str], None] = print) -> dict[str, list[Run]]:
    """Continue the branch ensemble committed in ``results`` in the folder
    ``out``, or, with ``new`` (a folder), start its replica there from this
    machine's replayed state (see the module docstring); returns ``{arm: [member runs]}``."""
    out = Path(out).expanduser()
    spec = _ens.read_spec(results)
    replay_config(spec)  # a branch ensemble, else ValueError before anything is written
    more = tuple(a for a in arms if a not in spec.arms)
    if more:
        spec = dataclasses.replace(spec, arms=spec.arms + more)  # validated by the Ensemble itself
    if group_size is not None:
        _ens.positive_int("group_size", group_size, 1, _ens.MAX_MEMBERS)
    if new is not None:
        new = Path(new).expanduser()
        if new.resolve() == Path(results).expanduser().resolve():
            raise ValueError(f"--new {new} is the committed ensemble's own folder: give a folder for the new one")
        spec = dataclasses.replace(spec, name=new.name)
        _ens.write_spec(spec, new)  # where it holds another ensemble's spec: refused now, not after the replay
        paired = paired or _ens.TWIN in spec.arms
        results = new
    link_results(results, out)
    if not _branch.exists(out / "branch"):
        config = replay_config(spec, paired)
        log(f"[branch replay] {spec.name}: replaying {config.recipe.name}"
            f"{' with its FP32 twin' if config.has_paired_run else ''} to step {config.steps} in {out / 'replay'}")
        run = runner.train(config, store=out / "replay", progress=progress)
        early = [step for step in analysis.instability(run)["blowups"] if step < spec.branch_at]
        if early:
            log(f"[branch replay] {spec.name}: this replay blew up at step {early[0]}, before the branch at step "
                f"{spec.branch_at}: its members continue a run past its blow-up (the report's header says so)")
        _branch.write(run, spec.branch_at, out / "branch", reference=reference)
    return _ens.run(spec, out, group_size=group_size, progress=progress, log=log)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mx_proxy.experiments.branch_replay", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", required=True, help="the committed ensemble's folder (results/ensembles/<name>)")
    p.add_argument("--out", required=True, help="a working folder (OUT/replay, OUT/branch, OUT/runs)")
    p.add_argument("--arms", nargs="+", default=(), metavar="ARM", help="arms to append")
    p.add_argument("--paired", action="store_true", help="replay the base's FP32 twin too (twice the cost)")
    p.add_argument("--group-size", type=int, help="members trained as one program (default: a whole arm)")
    p.add_argument("--reference", metavar="DIR", help="an exported run to compare the replay's losses with")
    p.add_argument("--new", metavar="DIR",
                   help="start a new ensemble in DIR with the committed one's spec, from this machine's replayed "
                        "state (another CPU model, a GPU: where the replay cannot match the recorded history)")
    args = p.parse_args(argv)
    try:
        continue_ensemble(args.results, args.out, arms=args.arms, paired=args.paired, group_size=args.group_size,
                          reference=args.reference, new=args.new)
    except ValueError as e:
        p.error(str(e))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
