"""``mx-proxy report --plan [DIR]``: the pre-registered plan's report on its members so far (docs/plan.md).

The plan is ``docs/plan.json`` (or ``--plan-file``), its members ``DIR/<study>`` (default :data:`DEFAULT_DIR`);
:mod:`mx_proxy.experiments.plan_report` computes the report, :mod:`mx_proxy.experiments.plan_render` prints it
(``--json``: the same numbers as JSON), ``--study`` limits it to some studies and ``--figures DIR`` also draws its
effects figure (:func:`mx_proxy.viz.plots.plan_effects`) as ``DIR/<plan>_effects.png``.
"""

from __future__ import annotations

import json
from pathlib import Path

from mx_proxy.experiments import plan as _plan
from mx_proxy.experiments import plan_render, plan_report
from mx_proxy.store import durable
from mx_proxy.viz import plots

__all__ = ["add_plan_options", "wanted", "run", "DEFAULT_DIR", "write_figure"]

DEFAULT_DIR = "results/plan"
"""The plan's members when ``--plan`` names no folder (relative to the working directory)."""


def add_plan_options(rep) -> None:
    """The plan report's options of ``mx-proxy report``."""
    rep.add_argument("--plan", nargs="?", const=DEFAULT_DIR, default=None, metavar="DIR",
                     help=f"the pre-registered plan's report (docs/plan.md): each study's members so far under "
                          f"DIR/<study> (default {DEFAULT_DIR}) and exactly the tests the plan registers, interim "
                          f"until a study has all its members")
    rep.add_argument("--plan-file", metavar="FILE", help=f"with --plan: the plan (default {_plan.PLAN_FILE})")
    rep.add_argument("--study", nargs="+", metavar="ID", help="with --plan: only these studies (and the hypotheses "
                                                               "whose tests read them); the numbers stay the "
                                                               "whole plan's")
    rep.add_argument("--json", action="store_true", help="with --plan: print the report as JSON (the same numbers)")


def write_figure(report: dict, folder) -> Path:
    """Draw ``report``'s effects figure as ``folder/<plan>_effects.png`` (atomically); returns the path."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    path = Path(folder) / f"{report['plan']}_effects.png"
    fig = plots.plan_effects(report)
    durable.write_output(path, lambda p: fig.savefig(p, dpi=130, format="png"))
    plots.plt.close(fig)
    return path


def wanted(args) -> bool:
    """Whether ``mx-proxy report``'s arguments ask for the plan's report (``--plan`` or one of its options)."""
    return args.plan is not None or bool(args.plan_file or args.study or args.json)


def run(args) -> int:
    """``mx-proxy report --plan``: every check of the arguments before any work (a bad one: the parser's error,
    exit status 2), then the report."""
    error = args.parser.error
    given = [flag for flag, v in (("a results folder", args.results), ("--update", args.update),
                                  ("--only", args.only), ("--control", args.control)) if v]
    if args.plan is None:
        named = [flag for flag, v in (("--plan-file", args.plan_file), ("--study", args.study),
                                      ("--json", args.json)) if v]
        error(f"{named[0] if named else 'this option'} applies to the plan's report: add --plan [DIR]")
    if given:
        error(f"--plan reports the plan's studies; {given[0]} is not taken with it")
    if not Path(args.plan).is_dir():
        error(f"--plan: {args.plan!r} is no folder (the plan's members, one sub-folder per study, e.g. "
              f"{DEFAULT_DIR})")
    try:
        plan = _plan.load(args.plan_file)
        for sid in args.study or ():
            plan.study(sid)
        if args.figures:
            durable.checked_path(args.figures, "--figures", folder=True)
        report = plan_report.compute(plan, args.plan)
        shown = plan_report.select(report, args.study) if args.study else report
    except (ValueError, OSError) as err:
        error(str(err))
    if args.json:
        print(json.dumps(shown, indent=1, ensure_ascii=False, allow_nan=False))
    else:
        print(plan_render.markdown(shown), end="")
    if args.figures:
        print(f"figure: {write_figure(shown, args.figures)}")
    return 0
