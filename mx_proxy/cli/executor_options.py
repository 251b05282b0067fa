"""``--executor local|slurm`` and the ``--slurm-*`` options, one builder for every command that trains several runs.

``campaign``, ``sweep`` and ``figures`` take them (:func:`add_executor_options`);
:func:`executor_from_args` turns them into an executor before any work
starts, and a bad value (a malformed time, a negative count, a Slurm option
with ``--executor local``, a machine without ``sbatch``) is one message
naming it and what is valid, exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from mx_proxy.experiments import executors
from mx_proxy.experiments.executors.base import UnitsFailed

__all__ = ["add_executor_options", "executor_from_args", "report_failures", "print_jobs", "SLURM_FLAGS"]

SLURM_FLAGS = ("slurm_partition", "slurm_time", "slurm_gpus_per_task", "slurm_cpus_per_task",
               "slurm_array_parallelism", "slurm_signal_delay", "slurm_setup", "slurm_option")


def add_executor_options(p: argparse.ArgumentParser) -> None:
    """Add ``--executor`` and the ``--slurm-*`` options to ``p``."""
    g = p.add_argument_group("where the runs train (one unit of work = one compiled program)")
    g.add_argument("--executor", choices=executors.EXECUTORS, default="local",
                   help="local: this machine (the default); slurm: each unit one task of one Slurm array job, "
                        "submitted from here through submitit (the run store must be on a filesystem the nodes "
                        "share; rerun the same command to resume, --status to see the jobs)")
    g.add_argument("--slurm-partition", metavar="NAME", help="sbatch --partition (default: the cluster's)")
    g.add_argument("--slurm-time", metavar="TIME",
                   help="time limit per job, e.g. 90 (minutes), 4:00:00, 1-00:00:00 (default 1:00:00); a longer "
                        "unit checkpoints at Slurm's warning signal and is requeued")
    g.add_argument("--slurm-gpus-per-task", type=int, metavar="N", help="sbatch --gpus-per-task (default 0)")
    g.add_argument("--slurm-cpus-per-task", type=int, metavar="N",
                   help="sbatch --cpus-per-task; XLA uses that many threads (default 1)")
    g.add_argument("--slurm-array-parallelism", type=int, metavar="N",
                   help="most array tasks running at once (default 256)")
    g.add_argument("--slurm-signal-delay", type=int, metavar="SECONDS",
                   help="Slurm warns a job this long before its time limit; it checkpoints at the end of the "
                        "current segment and is requeued (default 300: more than a segment takes)")
    g.add_argument("--slurm-setup", nargs="+", action="extend", metavar="LINE",
                   help="shell lines run before each job, e.g. 'module load cuda/12' 'source .venv/bin/activate'")
    g.add_argument("--slurm-option", nargs="+", action="extend", metavar="KEY=VALUE",
                   help="any other sbatch option, e.g. mem=16G account=proj qos=high constraint=h100 exclusive")


def _slurm_options(args) -> executors.SlurmOptions:
    kw = {"partition": args.slurm_partition, "time": args.slurm_time or "1:00:00",
          "setup": tuple(args.slurm_setup or ()), "extra": executors.parse_extra(args.slurm_option)}
    for flag, field in (("slurm_gpus_per_task", "gpus_per_task"), ("slurm_cpus_per_task", "cpus_per_task"),
                        ("slurm_array_parallelism", "array_parallelism"),
                        ("slurm_signal_delay", "signal_delay_s")):
        if getattr(args, flag) is not None:
            kw[field] = getattr(args, flag)
    return executors.SlurmOptions(**kw)


def executor_from_args(args, folder: str | Path, *, jobs: int = 1, store=True) -> executors.Executor:
    """The executor the options ask for, its Slurm record and logs in
    ``folder``; ``store``: the command's run store (``False``/``None``: none,
    which the Slurm executor refuses). Raises a ValueError naming a bad
    value and what is valid."""
    if args.executor != "slurm":
        given = [f"--{f.replace('_', '-')}" for f in SLURM_FLAGS if getattr(args, f, None)]
        if given:
            raise ValueError(f"{', '.join(given)}: Slurm options, which need --executor slurm "
                             f"(got --executor {args.executor})")
        return executors.make("local", jobs=jobs)
    if store is None or store is False:
        raise ValueError("--executor slurm trains into the run store (on a filesystem the nodes share); drop "
                         "--no-store / --store off")
    ex = executors.make("slurm", folder=folder, slurm=_slurm_options(args))
    ex.check()
    return ex


def report_failures(command: str, err: UnitsFailed) -> int:
    """Print the units that did not finish, each with its log's last lines, to stderr; returns exit status 1."""
    print(f"mx-proxy {command}: {err}", file=sys.stderr)
    return 1


def print_jobs(jobs: pd.DataFrame, command: str) -> None:
    """The Slurm units of a campaign or an ensemble (``--status``): one row
    per unit (its job id, state, newest checkpoint and log), then each failed
    unit's last log lines; nothing when none was submitted."""
    if not len(jobs):
        return
    print(f"\nSlurm units (rerun the {command} command to resume the unfinished ones from their newest checkpoints):")
    cols = ["unit", "job", "state", "checkpoint", "stdout"]
    with pd.option_context("display.width", 250, "display.max_columns", None, "display.max_colwidth", 90):
        print(jobs[cols].to_string(index=False))
    for _, row in jobs[jobs["tail"] != ""].iterrows():
        print(f"\n{row['unit']} (job {row['job']}, {row['state']}): last lines of {row['stderr']}")
        print("\n".join(f"    | {line}" for line in row["tail"].splitlines()))
