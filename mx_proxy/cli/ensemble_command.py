"""``mx-proxy ensemble``: train, resume or inspect an ensemble (:mod:`mx_proxy.experiments.ensemble`).

    mx-proxy ensemble --out DIR --kind branch --branch-from RUN_OR_STATE --branch-at 6000 \\
        --arms unchanged twin fp32 rceil --members 8 --horizon 1000 --diagnostics-every 5
    mx-proxy ensemble --out DIR --kind seed --arms fp32 paper_e4m3 --members 8 --horizon 7000 --width 256 ...
    mx-proxy ensemble --out DIR              # resume the ensemble saved in DIR
    mx-proxy ensemble --out DIR --status     # members done / left, hours left; each Slurm unit's job and log
    mx-proxy ensemble --out DIR --executor slurm --slurm-time 4:00:00   # each unit one task of a Slurm array

Every Config field is an option for the ``seed`` and ``data`` kinds (the
members' base config); a branch ensemble takes its config from the branch
state. The spec is saved in ``DIR/results/ensemble.json``; rerunning with the
same folder resumes it (other settings are refused, naming what differs).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import pandas as pd

from mx_proxy.cli.config_options import add_config_options, config_changes
from mx_proxy.cli.executor_options import add_executor_options, executor_from_args, print_jobs, report_failures
from mx_proxy.cli.help import cli_message
from mx_proxy.cli.track_options import add_track_options, tracking_from_args
from mx_proxy.experiments import branch, ensemble_report, ensemble_result, ensemble_status, tracking
from mx_proxy.experiments import ensemble as _ens
from mx_proxy.experiments.executors import UnitsFailed
from mx_proxy.store import durable
from mx_proxy.training.config import Config
from mx_proxy.viz import plots

__all__ = ["add_ensemble_command"]


def _spec(args, out: Path) -> _ens.Ensemble | None:
    """The spec the options ask for, or ``None`` when they ask for none (resume the saved one); checked whole
    before anything is written (a branch state is written only once its spec is valid)."""
    given = [a for a in ("kind", "arms", "members", "horizon") if getattr(args, a) is not None]
    if not given:
        if config_changes(args):
            args.parser.error("config options need --kind seed or data (and --arms, --members, --horizon)")
        return None
    missing = [f"--{a}" for a in ("kind", "arms", "members", "horizon") if getattr(args, a) is None]
    if missing:
        args.parser.error(f"a new ensemble needs {', '.join(missing)} too (or none of them, to resume the one in "
                          f"--out)")
    name = args.name or out.name
    extra = dict(first_seed=args.first_seed, diagnostics_every=args.ens_diagnostics_every,
                 checkpoint_every=args.ens_checkpoint_every)
    if args.kind == "branch":
        bdir = out / "branch"
        if args.branch_at is None or (args.branch_from is None and not branch.exists(bdir)):
            args.parser.error("--kind branch needs --branch-at and --branch-from (a stored run's folder or a branch "
                              "state's folder)")
        if config_changes(args):
            args.parser.error(f"a branch ensemble takes its config from the branch state; drop "
                              f"{', '.join('--' + k.replace('_', '-') for k in config_changes(args))}")
        if args.reference is not None:
            branch.check_reference(args.reference)
        base = branch.read(bdir).config if branch.exists(bdir) else branch.source_config(args.branch_from)
        spec = _ens.Ensemble(name, "branch", base, tuple(args.arms), args.members, args.horizon,
                             branch_at=args.branch_at, epsilon=args.epsilon, **extra)
        if not branch.exists(bdir):
            branch.write(args.branch_from, args.branch_at, bdir, reference=args.reference)
            base = branch.read(bdir).config
            spec = dataclasses.replace(spec, base=base) if base != spec.base else spec
        return spec
    if args.branch_from or args.branch_at is not None or args.epsilon:
        args.parser.error(f"--branch-from, --branch-at and --epsilon belong to --kind branch, not {args.kind}")
    base = Config().replace(**config_changes(args))
    return _ens.Ensemble(name, args.kind, base, tuple(args.arms), args.members, args.horizon, **extra)


def _status(args, out: Path) -> int:
    """``--status``: each arm's members done and left, then (``--executor slurm``) each unit's job and log."""
    units = ensemble_status.jobs(out)
    table = ensemble_status.with_jobs(ensemble_status.status(out), units, out)
    with pd.option_context("display.width", 200, "display.max_columns", None, "display.float_format", "{:.4g}".format):
        print(table.to_string(index=False))
    left = table["member_steps_left"].sum()
    print(f"{int(table['done'].sum())} members done, {int((table['members'] - table['done']).sum())} left; "
          f"{left} member-steps left, {table['hours_left'].sum():.1f} h at the measured speed in one process")
    print_jobs(units, "ensemble")
    return 0


def write_figures(result: ensemble_result.EnsembleResult, folder, results) -> list[Path]:
    """Draw ``result``'s survival curves, blow-up rates and members' losses (the members exported so far) as
    ``folder/<name>_survival.png``, ``folder/<name>_blowup_rates.png`` and ``folder/<name>_loss.png``, and, once
    a member blew up after a diagnostic step, the warning signals before the blow-ups as
    ``folder/<name>_signals.png`` (with the branch history in ``results``, if any); each written atomically
    (on a full disk: elsewhere, saying that the results are in ``results``); prints and returns the paths."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    figures = [("survival", plots.survival), ("blowup_rates", plots.blowup_rates), ("loss", plots.trajectories)]
    table = result.table
    if len(table) and table["event"].any() and result.spec.diagnostics:
        history = _ens.read_history(results) if results is not None else None
        figures.append(("signals", lambda r: plots.signals_before(r, history)))
    paths = []
    for name, fn in figures:
        path = Path(folder) / f"{result.spec.name}_{name}.png"
        try:
            fig = fn(result)
        except ValueError as err:
            if name != "signals":
                raise
            print(f"figure {path} not drawn: {err}")  # every blow-up came before the first diagnostic step
            continue
        durable.write_output(path, lambda p, fig=fig: fig.savefig(p, dpi=130, format="png"),
                             elsewhere=f"the results are in {results}")
        plots.plt.close(fig)
        print(f"figure: {path}")
        paths.append(path)
    return paths


def _run(args) -> int:
    out = Path(args.out)
    try:
        out = _ens.ensemble_folder(args.out)  # once, for training and --status alike
        if args.status:
            return _status(args, out)
        figures = durable.checked_path(args.figures, "--figures", folder=True) if args.figures else None
        spec = _spec(args, out) or _ens.read_spec(out)
        executor = executor_from_args(args, out / "slurm", jobs=args.jobs)
        with tracking.active(tracking_from_args(args, out / "runs", spec.name)):
            _ens.run(spec, out, group_size=args.group_size, executor=executor, progress=not args.quiet)
        result = ensemble_result.load(out / "results")
        print(ensemble_report.for_folder(out / "results"), end="")
        if figures is not None:
            write_figures(result, figures, out / "results")
    except UnitsFailed as err:
        return report_failures("ensemble", err)
    except (ValueError, TypeError, OSError) as err:
        args.parser.error(cli_message(str(err)))
    except KeyboardInterrupt:
        print(f"mx-proxy ensemble: interrupted; finished members are exported to {out / 'results'} and the others "
              f"resume from their checkpoints when you rerun the command", file=sys.stderr)
        return 130
    return 0


def add_ensemble_command(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("ensemble", help="N members per arm differing in one recorded perturbation: rates, not one "
                                        "trajectory", description=__doc__)
    p.add_argument("--out", required=True, help="the ensemble's folder (OUT/runs, OUT/branch, OUT/results)")
    p.add_argument("--name", help="its label (default: the folder's name)")
    p.add_argument("--kind", choices=_ens.KINDS, help="what members differ in: seed (init and data), data (data "
                                                      "only), branch (data after one stored state)")
    p.add_argument("--arms", nargs="+", metavar="ARM",
                   help=f"the first is the control; valid: {', '.join(_ens.arm_names())}, or FIELD=VALUE of a field "
                        f"an intervention may change (e.g. adam_eps=1e-15); more arms or --members than a saved "
                        f"ensemble extend it")
    p.add_argument("--members", type=int, metavar="N", help="members per arm")
    p.add_argument("--horizon", type=int, metavar="STEPS", help="steps each member trains (after the branch)")
    p.add_argument("--branch-from", metavar="PATH", help="a stored run's folder, or a branch state's folder")
    p.add_argument("--branch-at", type=int, metavar="STEP", help="the step to branch at")
    p.add_argument("--reference", metavar="DIR",
                   help="an exported run (e.g. results/paper/<label>) whose losses the branch state's history is "
                        "compared with, bit for bit (recorded with the state)")
    p.add_argument("--epsilon", type=float, default=0.0, help="relative parameter perturbation at the branch "
                                                              "(default 0)")
    p.add_argument("--first-seed", type=int, default=1, help="member i's perturbation seed is this + i (default 1)")
    p.add_argument("--diagnostics-every", dest="ens_diagnostics_every", type=int, metavar="N",
                   help="diagnostics every N steps in the members (default: the base config's)")
    p.add_argument("--checkpoint-every", dest="ens_checkpoint_every", type=int, default=100, metavar="N",
                   help="steps between the members' checkpoints (default 100)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes, one unit (an arm's group of members) each "
                                                       "(default 1)")
    p.add_argument("--group-size", type=int, metavar="N",
                   help="members per unit (default: a whole arm); smaller units export sooner and balance partial "
                        "results across arms (members 0…N−1 of every arm first)")
    p.add_argument("--status", action="store_true", help="train nothing: where each arm stands")
    p.add_argument("--figures", metavar="DIR", help="also draw the survival, blow-up-rate, loss and warning-signal "
                   "figures into DIR")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_executor_options(p)
    add_track_options(p)
    add_config_options(p, [f for f in Config.field_names() if f not in ("diagnostics_every", "checkpoint_every")])
    p.set_defaults(func=_run, parser=p)
    return p
