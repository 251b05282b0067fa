"""``mx-proxy sweep`` and ``mx-proxy intervene``: the experiment commands of the CLI.

``add_experiment_commands(subparsers)`` adds both to the ``mx-proxy`` parser
(``mx_proxy.cli.main`` calls it); :func:`main` runs them standalone (tests).

    mx-proxy sweep --lr 1e-4 3e-4 1e-3 --seed 0 1 --recipe fp32 mxfp8_mixed --steps 3000
    mx-proxy intervene runs/<key> --at-step 4500 --recipe fp32
    mx-proxy intervene runs/<key> --at-step 4500 --apply ln_exempt

Every Config field is an option (``--diagnostics-every`` for
``diagnostics_every``); in ``sweep`` each takes one or more values and the
fields given several values become the sweep's axes. Bad input exits with
status 2 and a message naming the valid choices; Ctrl-C stops cleanly, the
members finished so far stay in the store.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import jax

from mx_proxy.cli.config_options import add_config_options, config_changes
from mx_proxy.cli.executor_options import add_executor_options, executor_from_args, report_failures
from mx_proxy.cli.help import cli_message
from mx_proxy.cli.parser import Parser
from mx_proxy.cli.track_options import add_track_options, tracking_from_args
from mx_proxy.experiments import parallel, tracking
from mx_proxy.experiments.executors import UnitsFailed
from mx_proxy.numerics.recipe import MITIGATIONS
from mx_proxy.runner import interventions
from mx_proxy.runner import loop as runner
from mx_proxy.store import durable
from mx_proxy.training.config import Config

__all__ = ["add_experiment_commands", "sweep_axes", "main", "add_store_options", "store_arg",
           "DEFAULT_STORE", "guard", "check_out"]

DEFAULT_STORE = "runs"
_OFF = ("off", "none", "no", "false", "0")


def add_store_options(p: argparse.ArgumentParser, *, train: bool = True, aliases=("--store",),
                      default: str | None = DEFAULT_STORE):
    """``--store DIR`` (default ``runs/``; ``off`` keeps results in memory),
    ``--no-store``, and for training commands ``--force`` and ``--quiet``."""
    g = p.add_mutually_exclusive_group()
    where = f"default: {default}/" if default else "default: the parent run's store"
    g.add_argument(*aliases, dest="store", default=default, metavar="DIR",
                   help=f"run-store folder ({where}; 'off' keeps results in memory only)")
    g.add_argument("--no-store", action="store_true", help="keep results in memory only (nothing written)")
    if train:
        p.add_argument("--force", action="store_true", help="retrain even if the store has the result")
        p.add_argument("--quiet", action="store_true", help="no progress bar")


def store_arg(args):
    """The ``store=`` argument the options ask for: a folder, ``False`` (memory
    only: ``--no-store`` or ``--store off``), or ``None`` (no ``--store`` where
    its default is none)."""
    if getattr(args, "no_store", False) or (args.store is not None and str(args.store).strip().lower() in _OFF):
        return False
    if args.store is not None and not str(args.store).strip():
        raise ValueError("--store needs a folder, got an empty one; --store off (or --no-store) keeps results in "
                         "memory only")
    return args.store


def check_out(path) -> Path:
    """``--out FILE`` checked before any training: a .parquet or .csv file in
    an existing, writable folder (not a folder itself)."""
    out = durable.checked_path(path, "--out", folder=False)
    if out.suffix not in (".parquet", ".csv"):
        raise ValueError(f"--out {path}: the file name must end in .parquet or .csv")
    parent = out.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"--out {path}: the folder {parent} does not exist or is not writable")
    if out.exists() and not os.access(out, os.W_OK):
        raise ValueError(f"--out {path} exists and is not writable")
    return out


def sweep_axes(args) -> tuple[Config, dict]:
    """(base config, axes) from parsed ``mx-proxy sweep`` arguments: fields given
    one value go into the base config, fields given several are axes."""
    base, axes = {}, {}
    for name, v in config_changes(args).items():
        if name == "checkpoint_at":  # one tuple of steps, never an axis
            base[name] = v
        elif len(v) == 1:
            base[name] = v[0]
        else:
            axes[name] = list(v)
    return Config(**base), axes


def _submit_sweep(executor, base: Config, axes: dict, store, quiet: bool) -> int:
    """Train the sweep's members the store lacks on ``executor`` (one unit
    per compiled program); returns how many it trained."""
    units = parallel.plan_units([(base, axes)], store)
    failures = executor.run(units, store, progress=not quiet, log=print)
    if failures:
        raise UnitsFailed(failures)
    return sum(len(u.configs) for u in units)


def _cmd_sweep(args) -> int:
    base, axes = sweep_axes(args)
    store = store_arg(args)
    out = check_out(args.out) if args.out else None
    executor = executor_from_args(args, Path(store or ".") / ".slurm", store=store)
    track = tracking_from_args(args, store or None)
    trained = []
    runner.hooks.append(trained.append)
    try:
        with tracking.active(track):
            if executor.name == "slurm":
                trained += [None] * _submit_sweep(executor, base, axes, store, args.quiet)
            result = runner.sweep(base, store=store, force=args.force, progress=not args.quiet,
                                  shard=not args.no_shard, **axes)
    except UnitsFailed as err:
        return report_failures("sweep", err)
    except KeyboardInterrupt:
        where = "memory (nothing kept)" if store is False else store
        print(f"mx-proxy sweep: interrupted after {len(trained)} trained member(s); finished members are in "
              f"{where}", file=sys.stderr)
        return 130
    finally:
        runner.hooks.remove(trained.append)
    print(result.summary())
    stored = None if store is False else Path(result.runs[0].path).parent
    print(f"{len(result)} members ({len(trained)} trained, {len(result) - len(trained)} loaded)"
          + ("" if stored is None else f"; stored in {stored}"))
    if out is not None:
        frame = result.to_frame()
        durable.write_output(out, lambda p: frame.to_csv(p, index=False) if out.suffix == ".csv"
                             else frame.to_parquet(p, index=False),
                             elsewhere="" if stored is None else f"every member is also in the run store {stored}")
        print(f"metrics of all members written to {out}")
    return 0


def _cmd_intervene(args) -> int:
    changes = config_changes(args, interventions.INTERVENABLE_FIELDS)
    changes.pop("recipe", None)
    try:
        store = store_arg(args)  # None: the parent's own store
        parent = args.run_dir
        if args.replay:
            parent = interventions.with_checkpoint(parent, args.at_step, progress=not args.quiet)
            if "replay" in parent.info:
                print(interventions.replay_summary(parent.info["replay"], args.at_step, "the parent's"))
        run = interventions.intervene(parent, args.at_step, recipe=args.recipe, apply=args.apply or (),
                               store=store, force=args.force, progress=not args.quiet, **changes)
    except KeyboardInterrupt:
        print("mx-proxy intervene: interrupted; nothing saved for this intervention", file=sys.stderr)
        return 130
    print(run.summary())
    print(f"intervention at step {args.at_step} on {run.info['parent']}"
          + (f"; stored in {run.path}" if run.path else ""))
    return 0


def _one_line(e: BaseException) -> str | None:
    """The one-line message of an expected failure, or None for a bug."""
    if isinstance(e, ValueError):
        return cli_message(str(e))
    if isinstance(e, OSError):  # a full disk, a folder gone; a SaveError says where the result is
        return str(e) if e.strerror is None else f"{e.strerror}: {e.filename or ''}".rstrip(": ")
    if isinstance(e, MemoryError) or (isinstance(e, jax.errors.JaxRuntimeError) and "RESOURCE_EXHAUSTED" in str(e)):
        first = (str(e).splitlines() or [""])[0][:200]
        return f"out of memory ({first or type(e).__name__}); use a smaller width, depth or batch (or fewer sweep " \
               f"members per program: group_size)"
    return None


def guard(fn):
    """``fn(args)`` with every expected failure (bad input, an unwritable
    destination, a full disk, out of memory) one line on stderr and exit
    status 2."""
    def run(args) -> int:
        try:
            return fn(args)
        except (ValueError, OSError, MemoryError, jax.errors.JaxRuntimeError) as e:
            line = _one_line(e)
            if line is None:
                raise
            print(f"mx-proxy {args.command}: error: {line}", file=sys.stderr)
            return 2

    return run


def add_experiment_commands(subparsers) -> None:
    """Add ``sweep`` and ``intervene`` to an ``mx_proxy`` argparse subparsers object."""
    sw = subparsers.add_parser(
        "sweep", help="train the product of swept Config values (vmapped where the program is shared)",
        description="Each Config field is an option taking one or more values; fields with several values are "
                    "the sweep's axes, e.g. --lr 1e-4 3e-4 1e-3 --seed 0 1 --recipe fp32 mxfp8_mixed.")
    add_config_options(sw, multi=True)
    add_store_options(sw)
    sw.add_argument("--no-shard", action="store_true", help="do not split members over several JAX devices")
    sw.add_argument("--out", default=None, metavar="FILE", help="write Sweep.to_frame() (.parquet or .csv)")
    add_executor_options(sw)
    add_track_options(sw)
    sw.set_defaults(func=guard(_cmd_sweep))

    iv = subparsers.add_parser(
        "intervene", help="continue a stored run from a checkpoint with a change",
        description="Continue RUN_DIR from its checkpoint at --at-step on the same batches, with a new recipe, "
                    "named mitigations (--apply) and/or other settings; the result lands in the parent's store "
                    "unless --store/--no-store say otherwise. The parent must have a checkpoint there (train it "
                    "with --checkpoint-at STEP or --checkpoint-every N), or --replay recomputes one.\n\n"
                    "mitigations (--apply):\n"
                    + "\n".join(f"  {k:<19} {m.description}" for k, m in MITIGATIONS.items()))
    iv.add_argument("run_dir", metavar="RUN_DIR", help="a stored run's folder (runs/<key>)")
    iv.add_argument("--at-step", type=int, required=True, metavar="STEP",
                    help="the checkpoint step to continue from (the parent's --checkpoint-at or --checkpoint-every)")
    iv.add_argument("--replay", action="store_true",
                    help="if the parent has no checkpoint at STEP, recompute its state there from its newest "
                         "checkpoint before (mxp.with_checkpoint; the replayed losses are checked against the "
                         "parent's)")
    iv.add_argument("--apply", nargs="+", default=None, metavar="NAME", choices=list(MITIGATIONS),
                    help=f"named mitigations: {', '.join(MITIGATIONS)}")
    add_config_options(iv, interventions.INTERVENABLE_FIELDS)
    add_store_options(iv, default=None)
    iv.set_defaults(func=guard(_cmd_intervene))


def main(argv=None) -> int:
    """Run ``sweep`` / ``intervene`` standalone; returns the exit status."""

    parser = Parser(prog="mx-proxy")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    add_experiment_commands(sub)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
