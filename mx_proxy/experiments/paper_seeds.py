"""The paper's own setting at other seeds: is seed 0's blow-up a rate, and how large?

``results/paper`` holds one seed of the paper's setting (width 512, depth 4,
batch 2048, Adam at LR 6e-4, 9000 steps, bf16 dots): its ``paper_e4m3`` run
blew up at step 6841 beside a stable FP32 run. This experiment trains the
same configuration at other seeds as a ``seed`` ensemble
(:mod:`mx_proxy.experiments.ensemble`): member i of every arm at
``seed = data_seed = first_seed + i`` (default seeds 1–4), arms ``fp32``
(the control), ``paper_e4m3`` and ``mxfp8_e4m3``, each member a
single-recipe run (no FP32 twin trained beside it: FP32 is an arm of its
own, paired with the others by seed). Its base is the exported paired run's
config (``config.json``), with its recipe kept, so an arm that is a
mitigation of it (``fp32_keep_bias``: FP32 with the LN bias frozen from
step 0, as the authors' MX run never trains it) can be appended later, its
members paired with these.

A member at width 512 costs ~0.7–0.9 s per step on a 2-core CPU
(docs/campaign.md), ~2 h to step 9000: give ``--group-size 1`` there, so
that each member is exported as soon as it finishes, and copy
``OUT/results`` into the repository (``results/ensembles/seeds-w512``) as
members land. A fresh machine resumes from those committed exports: before
training, :func:`copy_committed` copies into ``OUT/results`` every member
exported in ``results/ensembles/seeds-w512`` (``--committed``) that
``OUT/results`` lacks and whose config is the one it would train, and
:func:`mx_proxy.experiments.ensemble.train_unit` loads those instead of
training them.

Usage::

    python -m mx_proxy.experiments.paper_seeds --out ~/seeds [--members 4] [--group-size 1] [--hours 1.8] \\
        [--arms fp32 paper_e4m3 mxfp8_e4m3 fp32_keep_bias]
    python -m mx_proxy.experiments.paper_seeds --out ~/seeds --status
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from mx_proxy.experiments import ensemble as _ens
from mx_proxy.experiments import ensemble_status
from mx_proxy.store import files
from mx_proxy.training.config import Config
from mx_proxy.training.paths import checked_path

__all__ = ["PARENT", "COMMITTED", "ARMS", "NAME", "base_config", "spec_of", "copy_committed", "run", "main"]

PARENT = Path(__file__).resolve().parents[2] / "results" / "paper" / "paired-w512-paper_e4m3-lr6e-4-s0"
"""The exported paired run of seed 0 whose config the members share."""
ARMS = ("fp32", "paper_e4m3", "mxfp8_e4m3")
NAME = "seeds-w512"
MEMBERS = 4
COMMITTED = Path(__file__).resolve().parents[2] / "results" / "ensembles" / NAME
"""The members exported so far, as committed: a fresh ``OUT`` starts from them (:func:`copy_committed`)."""


def base_config(parent=PARENT, **changes) -> Config:
    """The members' base: the exported run's config without its paired FP32 run and its checkpoint steps
    (``changes``: Config fields set otherwise, e.g. a smaller width and steps for a test)."""
    cfg = files.read_config(Path(parent) / "config.json")
    return cfg.replace(paired_run=False, gradient_reference="same_point", checkpoint_at=(), **changes)


def spec_of(members: int = MEMBERS, *, arms=ARMS, first_seed: int = 1, parent=PARENT, **changes) -> _ens.Ensemble:
    """The seed ensemble: ``members`` seeds from ``first_seed`` of ``arms`` at the parent run's config."""
    base = base_config(parent, **changes)
    return _ens.Ensemble(NAME, "seed", base, tuple(arms), members, base.steps, first_seed=first_seed,
                         checkpoint_every=500)


def copy_committed(spec: _ens.Ensemble, out, committed=COMMITTED) -> list[str]:
    """Copy into ``out/results`` each member of ``spec`` that ``committed``
    (a results folder) has exported, whole and with the config ``spec``
    trains it with, and ``out/results`` has not
    (:func:`mx_proxy.experiments.ensemble.copy_members`). Returns the copied
    members' labels (none where ``committed`` is missing or is ``out/results`` itself)."""
    return _ens.copy_members(spec, committed, checked_path(out, "out", folder=True) / "results")


def run(spec: _ens.Ensemble, out, *, group_size: int | None = 1, hours: float | None = None, progress: bool = True,
        log=print, committed=COMMITTED) -> int:
    """Train the units of ``spec`` in ``out`` in order (members chunk first:
    seed 1 of every arm before seed 2 of any) until all are exported or
    ``hours`` have passed (checked between units); returns the units trained or loaded.
    ``committed``: a results folder whose members start ``out`` (:func:`copy_committed`; ``None``: none)."""
    out = checked_path(out, "out", folder=True)
    _ens.prepare(spec, out)
    if committed is not None:
        copied = copy_committed(spec, out, committed)
        if copied:
            log(f"[paper seeds] {len(copied)} member(s) copied from {committed}: {', '.join(copied)}")
    t0, n = time.time(), 0
    for arm, members in _ens.units(spec, group_size):
        if hours is not None and time.time() - t0 > hours * 3600:
            log(f"[paper seeds] {hours:g} h spent: stopping before {arm} m{members[0]:02d}; rerun to continue")
            break
        _ens.train_unit(out, arm, members, progress=progress)
        n += 1
        log(f"[paper seeds] {arm} members {list(members)} exported ({time.time() - t0:.0f} s)")
    return n


def default_arms(out, committed: Path | None) -> tuple[str, ...]:
    """The arms a command without ``--arms`` trains: those of the ensemble saved in ``out`` (a resume), else of
    the ``committed`` one (a fresh folder continues it, e.g. on a GPU, without dropping an arm appended since),
    else :data:`ARMS`."""
    for folder in (checked_path(out, "out", folder=True) / "results", committed):
        if folder is not None and (folder / _ens.SPEC_FILE).exists():
            return _ens.read_spec(folder).arms
    return ARMS


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mx_proxy.experiments.paper_seeds", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the ensemble's folder (OUT/runs, OUT/results); resumable")
    p.add_argument("--members", type=int, default=MEMBERS, help="seeds per arm (default 4: seeds 1-4)")
    p.add_argument("--arms", nargs="+", metavar="ARM",
                   help=f"the arms, the control first (default: those of the ensemble saved in OUT, else of the "
                        f"committed one, else {' '.join(ARMS)}); more than a saved ensemble's extend it, e.g. "
                        f"{' '.join(ARMS)} fp32_keep_bias")
    p.add_argument("--group-size", type=int, default=1, help="members trained as one program (default 1)")
    p.add_argument("--hours", type=float, help="stop (between units) after this many hours; rerun to continue")
    p.add_argument("--status", action="store_true", help="print where each arm stands, train nothing")
    p.add_argument("--committed", metavar="DIR|none",
                   help="a results folder whose exported members (same config) OUT starts from, copied into "
                        "OUT/results before training (default: the repository's results/ensembles/seeds-w512; "
                        "none: start from nothing)")
    p.add_argument("--width", type=int, help="a smaller width (a test; default the parent run's, 512)")
    p.add_argument("--steps", type=int, help="fewer steps (a test; default the parent run's, 9000)")
    p.add_argument("--batch", type=int, help="a smaller batch (a test; default the parent run's, 2048)")
    args = p.parse_args(argv)
    if args.status:
        try:
            print(ensemble_status.status(args.out).to_string(index=False))
        except ValueError as e:  # nothing started in OUT yet
            p.error(str(e))
        return 0
    for name in ("members", "group_size", "width", "steps", "batch"):
        v = getattr(args, name)
        if v is not None and v < 1:
            p.error(f"--{name.replace('_', '-')} must be ≥ 1, got {v}")
    if args.hours is not None and not args.hours > 0:
        p.error(f"--hours must be > 0, got {args.hours}")
    changes = {k: getattr(args, k) for k in ("width", "steps", "batch") if getattr(args, k) is not None}
    if "steps" in changes:
        changes["val_every"] = 0  # the parent's validation period need not divide a test's steps
    if args.committed is None:  # the repository's folder, where this checkout has one
        committed = COMMITTED if COMMITTED.is_dir() else None
    else:
        committed = None if args.committed == "none" else Path(args.committed)
        if committed is not None and not committed.is_dir():
            p.error(f"--committed {args.committed!r} is not a folder (give a results folder, or none)")
    try:
        spec = spec_of(args.members, arms=args.arms or default_arms(args.out, committed), **changes)
    except ValueError as e:
        p.error(str(e))
    run(spec, args.out, group_size=args.group_size, hours=args.hours, committed=committed)
    print(ensemble_status.status(args.out).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
