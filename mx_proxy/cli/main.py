"""The ``mx-proxy`` command line."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings

import pandas as pd

from mx_proxy.cli.bench import BENCHMARKS, describe
from mx_proxy.cli.config_options import add_config_options, config_from_args
from mx_proxy.cli.ensemble_command import add_ensemble_command, write_figures
from mx_proxy.cli.executor_options import (
    SLURM_FLAGS,
    add_executor_options,
    executor_from_args,
    print_jobs,
    report_failures,
)
from mx_proxy.cli.experiment_commands import add_experiment_commands, add_store_options, guard, store_arg
from mx_proxy.cli.help import cli_message
from mx_proxy.cli.list_command import add_list_command
from mx_proxy.cli.parser import Parser
from mx_proxy.cli.plan_command import add_plan_options
from mx_proxy.cli.plan_command import run as plan_report
from mx_proxy.cli.plan_command import wanted as wants_plan
from mx_proxy.cli.track_options import add_track_options, tracking_from_args
from mx_proxy.cli.transformer_command import add_transformer_command
from mx_proxy.experiments import (
    campaign,
    campaign_status,
    ensemble_pool,
    ensemble_report,
    ensemble_result,
    report,
    scales,
    tracking,
)
from mx_proxy.experiments.ensemble_spec import results_folder
from mx_proxy.experiments.executors import UnitsFailed
from mx_proxy.runner import loop as runner
from mx_proxy.store import durable
from mx_proxy.viz.figures import FIGURE_DOCS, FIGURES, campaign_figures, default_dir, generate


def _bench(args) -> int:
    if args.name not in BENCHMARKS:
        print(f"mx-proxy bench: unknown benchmark {args.name!r}; valid: {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(BENCHMARKS[args.name])
    return int(module.main(args.rest) or 0)


def _train(args) -> int:
    cfg = config_from_args(args.parser, args)
    store = store_arg(args)
    with tracking.active(tracking_from_args(args, store or None)):
        run = runner.train(cfg, store=store if store is not False else None, force=args.force,
                           progress=not args.quiet)
    print(f"{run.summary()}" + (f" -> {run.path}" if run.path else ""))
    return 0


def _figures(args) -> int:
    try:
        store = store_arg(args)
        executor = None if args.executor == "local" and not any(getattr(args, f, None) for f in SLURM_FLAGS) else \
            executor_from_args(args, os.path.join(store or ".", ".slurm"), store=store)
        with tracking.active(tracking_from_args(args, store or None, f"figures-{args.scale}")):
            written = generate(args.only, scale=args.scale, out=args.out, store=store or None, results=args.results,
                               pdf=args.pdf, jobs=args.jobs, progress=not args.quiet, executor=executor)
    except ValueError as err:
        args.parser.error(cli_message(str(err)))
    except UnitsFailed as err:
        return report_failures("figures", err)
    if written:
        print(f"{len(written)} figure file(s) in {os.path.dirname(written[0])}"
              + ("" if store is False else f"; run store: {store}"))
    return 0


def _campaign(args) -> int:
    try:
        out = durable.checked_path(args.out, "campaign folder", folder=True)  # once, for training and --status
        if args.status:
            return _campaign_status(args, out)
        figures = durable.checked_path(args.figures, "--figures", folder=True) if args.figures else None
        executor = executor_from_args(args, os.path.join(out, "slurm"), store=not args.no_store)
        track = tracking_from_args(args, None if args.no_store else os.path.join(out, "runs"),
                                   f"campaign-{args.scale}")
        with tracking.active(track):
            index = campaign.run(args.scale, out, kinds=args.only or campaign.KINDS, widths=args.widths,
                                 seeds=args.seeds, progress=not args.quiet, store=not args.no_store,
                                 estimate=args.estimate, executor=executor)
    except ValueError as err:
        args.parser.error(cli_message(str(err)))
    except UnitsFailed as err:
        return report_failures("campaign", err)
    except KeyboardInterrupt:
        jobs = (" (Slurm jobs keep running: rerun to attach to them, or scancel them)" if args.executor == "slurm"
                else "")
        print("mx-proxy campaign: interrupted; finished runs are kept in the store and results folder, "
              f"and a rerun resumes{jobs}", file=sys.stderr)
        return 130
    if len(index):
        cols = ["label", "diverged_at", "final_loss", "steps_run", "wall_time_s"]
        print(index[cols].to_string(index=False))
    print(f"results: {out / 'results'} (index.csv)" + ("" if args.no_store else f"; run store: {out / 'runs'}"))
    if figures is not None:
        for path in campaign_figures(out / "results", out=figures):
            print(f"figure: {path}")
    return 0


def _campaign_status(args, out) -> int:
    """``mx-proxy campaign --status``: where each planned run stands (trains nothing)."""
    try:
        table = campaign_status.status(args.scale, out, widths=args.widths, seeds=args.seeds,
                                       kinds=[k for k in (args.only or campaign.KINDS) if k != "intervention"])
        units = campaign_status.jobs(out)
        table = campaign_status.with_jobs(table, units)
    except ValueError as err:
        args.parser.error(cli_message(str(err)))
    with pd.option_context("display.width", 200, "display.max_columns", None, "display.float_format", "{:.4g}".format):
        print(table.to_string(index=False) if len(table) else "no planned runs")
    if len(table) and table["state"].isin(["training", "interrupted"]).any():
        print("(training / interrupted: metrics of the steps before the newest checkpoint, not final results; "
              "s_per_step: its fastest interval between two checkpoints, eta_h the steps left at that speed)")
    print_jobs(units, "campaign")
    return 0


def _report(args) -> int:
    """``mx-proxy report``: a results folder as Markdown, or the report blocks of Markdown files rewritten, or the
    plan's report (``--plan``)."""
    if wants_plan(args):
        return plan_report(args)
    try:
        if args.update and args.control:
            args.parser.error("--control applies to a results folder; a block keeps its own (`FOLDER --control ARM`)")
        if args.update:
            for path in args.update:
                changed = report.update(path)
                print(f"{path}: {'rewritten' if changed else 'already up to date'}")
            return 0
        if not args.results:
            args.parser.error("give a results folder (e.g. results/paper) or --update FILE ...")
        for folder in args.results if args.figures else ():
            if not ensemble_report.is_ensemble(folder):
                args.parser.error(f"--figures draws an ensemble's figures (survival, blow-up rates, ...); "
                                  f"{folder!r} is not an ensemble's results folder (no ensemble.json)")
        if args.figures:
            durable.checked_path(args.figures, "--figures", folder=True)  # before the report is computed
        print(report.for_folder(args.results, parts=args.only, control=args.control), end="")
        if args.figures:
            result = ensemble_pool.pool([ensemble_result.load(f) for f in args.results])
            write_figures(result, args.figures, results_folder(args.results[0]) if len(args.results) == 1 else None)
    except (ValueError, OSError) as err:
        args.parser.error(cli_message(str(err)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="mx-proxy", description="MX low-precision training workbench")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    add_experiment_commands(sub)
    listing = "\n".join(f"  {name:<9} {describe(name)}" for name in BENCHMARKS)
    bench = sub.add_parser("bench", help="run a benchmark and print measured ratios",
                           description="Run one benchmark; it measures everything it reports in this run and prints "
                                       "ratios (no benchmark asserts a time). docs/benchmarks.md has what each "
                                       f"measured here. `mx-proxy bench NAME --help` shows its options.\n\n"
                                       f"benchmarks:\n{listing}")
    bench.add_argument("name", metavar="NAME", help=f"one of: {', '.join(BENCHMARKS)}")
    bench.add_argument("rest", nargs=argparse.REMAINDER, help="the benchmark's own options")
    bench.set_defaults(func=_bench)

    train = sub.add_parser("train", help="train one run into the run store (config.json, metrics.parquet, ...)")
    add_config_options(train)
    add_store_options(train, aliases=("--store", "--out"))
    add_track_options(train)
    train.set_defaults(func=guard(_train), parser=train)

    camp = sub.add_parser("campaign", help="run the paper's headline experiments at a scale (Figs. 2, 4, 5, 7)")
    camp.add_argument("--scale", required=True, choices=[n for n, s in scales.SCALES.items() if s.campaign],
                      help="smoke (CI), medium (a 2-core CPU, hours) or paper (one H200, minutes)")
    camp.add_argument("--out", required=True, help="folder for the run store (OUT/runs) and results (OUT/results)")
    camp.add_argument("--only", nargs="+", choices=campaign.KINDS, help="parts to run (default: all)")
    camp.add_argument("--widths", nargs="+", type=int, help="only these model widths")
    camp.add_argument("--seeds", nargs="+", type=int,
                      help="the paired runs and controls at these student-init seeds (default: the scale's, 0)")
    camp.add_argument("--figures", metavar="DIR", help="also write the campaign's figures into DIR")
    camp.add_argument("--quiet", action="store_true", help="no progress bars")
    camp.add_argument("--estimate", action="store_true",
                      help="first time two steps of each paired run still to train and print the expected wall time")
    camp.add_argument("--status", action="store_true",
                      help="train nothing: print where each planned run stands (done, training, interrupted or not "
                           "started; steps done, its metrics so far, the time left)")
    camp.add_argument("--no-store", action="store_true",
                      help="keep the runs in memory (no OUT/runs: nothing to resume from); results are still written")
    add_executor_options(camp)
    add_track_options(camp)
    camp.set_defaults(func=guard(_campaign), parser=camp)
    add_ensemble_command(sub)
    add_list_command(sub)
    add_transformer_command(sub)

    rep = sub.add_parser(
        "report", help="a campaign's or an ensemble's results as Markdown (the README's headline)",
        description="Print the headline of a campaign results folder as Markdown: a table of its paired runs and "
                    "controls (divergence, loss against FP32, same-point and paper ζ, LN clamping, the LN gains' "
                    "drift), a line of facts per run and the interventions; of an ensemble's results folder: "
                    "P(blow-up) per arm with 95 % intervals, survival, paired tests against the control, loss "
                    "gaps and the warning signals' scores. With --update, rewrite each block "
                    f"between `{report.BEGIN.format('FOLDER')}` and `{report.END}` in the given Markdown files "
                    "from its folder. With --plan [DIR], the pre-registered plan's report (docs/plan.md): each "
                    "study's members so far and exactly the tests the plan registers, Holm-corrected per family, "
                    "interim until a study has all its members (docs/ensembles.md).")
    rep.add_argument("results", nargs="*", help="a results folder (OUT/results of a campaign or an ensemble, e.g. "
                                                "results/paper), or several ensembles' folders whose members "
                                                "differ only in their seeds, which follow on: reported pooled as "
                                                "one ensemble")
    rep.add_argument("--update", nargs="+", metavar="FILE", help="Markdown files whose report blocks to rewrite")
    rep.add_argument("--only", nargs="+", metavar="PART", choices=ensemble_report.PARTS,
                     help=f"an ensemble's results: print only these sections after its header (valid: "
                          f"{', '.join(ensemble_report.PARTS)}); a block "
                          f"`{report.BEGIN.format('FOLDER --only PART …')}` keeps the same sections")
    rep.add_argument("--control", metavar="ARM",
                     help="an ensemble's results: the arm the paired tests, the end-loss tests and the rule's table "
                          "compare every other against (default: its first arm, e.g. `unchanged`); a block "
                          f"`{report.BEGIN.format('FOLDER --control ARM')}` keeps it")
    rep.add_argument("--figures", metavar="DIR", help="an ensemble's results: also draw its survival, blow-up-rate, "
                                                       "loss and warning-signal figures (of the members exported so "
                                                       "far) into DIR; with --plan, the plan's effects figure")
    add_plan_options(rep)
    rep.set_defaults(func=guard(_report), parser=rep)

    listing = "\n".join(f"  {name:<22} {FIGURE_DOCS[name]}" for name in FIGURES)
    figures = sub.add_parser(
        "figures", help="regenerate the figures (PNG, optionally PDF)",
        description=f"Train (or load) the runs each figure needs and draw it. By default the figures go to "
                    f"{default_dir('figures')} and the runs to the store {default_dir('runs')}, outside the "
                    f"checkout; --out figures/ replaces the committed figures. The runs of all the figures asked "
                    f"for train first, in parallel processes (--jobs).\n\nfigures (--only):\n{listing}")
    figures.add_argument("--scale", default="quick", choices=scales.names(),
                         help="experiment scale: smoke (seconds), quick (minutes on 2 cores), medium, unstable "
                              "(where mxfp8_e4m3 blows up at a rate: a GPU job), paper (default: quick)")
    figures.add_argument("--only", nargs="+", metavar="NAME", help=f"figures to make (default: all); valid: "
                                                                    f"{', '.join(FIGURES)}")
    figures.add_argument("--out", default=None, metavar="DIR",
                         help=f"output folder (default: {default_dir('figures')}; figures/ replaces the committed "
                              f"ones)")
    figures.add_argument("--pdf", action="store_true", help="also write PDF")
    figures.add_argument("--results", default="results", metavar="DIR",
                         help="campaign results root for the headline_* figures (default: results/)")
    figures.add_argument("--jobs", type=int, default=None, metavar="N",
                         help="processes that train the runs in parallel (default: one per core, at most 4; "
                              "1: everything in this process)")
    figures.add_argument("--quiet", action="store_true", help="no progress bar")
    add_store_options(figures, train=False, default=str(default_dir("runs")))
    add_executor_options(figures)
    add_track_options(figures)
    figures.set_defaults(func=guard(_figures), parser=figures)
    return parser


def headless_backend() -> None:
    """Select matplotlib's non-interactive Agg backend for this process,
    unless ``$MPLBACKEND`` names one: the command writes figures to files and
    must neither open windows nor need a display. Only entry points choose a
    backend; library modules (``mxp.plots``) never do."""
    if os.environ.get("MPLBACKEND"):
        return
    import matplotlib

    matplotlib.use("Agg")


def _one_line_warnings() -> None:
    """The project's own warnings (a results folder's copies set aside, a damaged store entry, a tracker that
    cannot be reached) as one line each, ``mx-proxy: warning: …``, without the source line Python adds."""
    default = warnings.formatwarning
    if getattr(default, "one_line", False):
        return

    def format_warning(message, category, filename, lineno, line=None):
        if category.__module__.startswith("mx_proxy."):
            return f"mx-proxy: warning: {message}\n"
        return default(message, category, filename, lineno, line)

    format_warning.one_line = True
    warnings.formatwarning = format_warning


def main(argv: list[str] | None = None) -> int:
    headless_backend()
    _one_line_warnings()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"mx-proxy {args.command}: interrupted; results finished before the interrupt are kept", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
