"""The ``proxy`` command line."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
import typing

from proxy.bench import BENCHMARKS
from proxy.experiments_cli import parse_bool


class _Parser(argparse.ArgumentParser):
    """argparse exits with status 2 on bad input and names the valid choices."""


def _bench(args) -> int:
    if args.name not in BENCHMARKS:
        print(f"proxy bench: unknown benchmark {args.name!r}; valid: {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(BENCHMARKS[args.name])
    return int(module.main(args.rest) or 0)


_CHOICES = {  # fields whose valid values argparse should list
    "act": "proxy.layers:ACTIVATIONS", "teacher_act": "proxy.layers:ACTIVATIONS", "norm": "proxy.model:NORMS",
    "init": "proxy.model:INITS", "arch": "proxy.model:ARCHS", "optimizer": "proxy.config:OPTIMIZERS", "schedule": "proxy.config:SCHEDULES",
    "gradient_reference": "proxy.config:GRADIENT_REFERENCES", "recipe": "proxy.recipe:PRESETS",
    "reference_recipe": "proxy.recipe:PRESETS",
}



def _lookup(path: str):
    module, name = path.split(":")
    return tuple(getattr(importlib.import_module(module), name))


def add_config_arguments(parser: argparse.ArgumentParser, *, nargs: str | None = None) -> None:
    """One ``--field-name`` option per :class:`proxy.Config` field, typed from
    its default (``nargs="+"`` turns each into a list, for sweeps)."""
    from proxy.config import Config

    hints = typing.get_type_hints(Config)
    for f in dataclasses.fields(Config):
        default = f.default
        hint = hints[f.name]
        if f.name in _CHOICES:
            kind, choices = str, _lookup(_CHOICES[f.name])
        else:
            choices = None
            kind = type(default) if default is not None else (int if "int" in str(hint) else str)
            if kind is tuple:
                kind = int
            if kind is bool:
                kind = parse_bool
        parser.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=kind, choices=choices,
                            nargs=nargs or ("*" if isinstance(default, tuple) else None), default=None,
                            help=f"default: {default!r}")


def config_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace, base=None):
    """The Config the options ask for; a bad value exits with status 2."""
    from proxy.config import Config

    changes = {f.name: getattr(args, f.name) for f in dataclasses.fields(Config)
               if getattr(args, f.name, None) is not None}
    changes = {k: tuple(v) if isinstance(v, list) else v for k, v in changes.items()}
    try:
        return (base or Config()).replace(**changes)
    except ValueError as err:
        parser.error(str(err))


def _train(args) -> int:
    import proxy

    config = config_from_args(args.parser, args)
    run = proxy.train(config, store=args.out, force=args.force, progress=not args.quiet)
    print(f"{run.summary()}" + (f" -> {run.path}" if run.path else ""))
    return 0


def _figures(args) -> int:
    from proxy.figures import generate

    try:
        generate(args.only, scale=args.scale, out=args.out, pdf=args.pdf)
    except ValueError as err:
        args.parser.error(str(err))
    return 0


def _campaign(args) -> int:
    from proxy import campaign

    try:
        index = campaign.run(args.scale, args.out, kinds=args.only or campaign.KINDS, widths=args.widths,
                             progress=not args.quiet)
    except ValueError as err:
        args.parser.error(str(err))
    except KeyboardInterrupt:
        print("proxy campaign: interrupted; finished runs are kept in the store and results folder, "
              "and a rerun resumes", file=sys.stderr)
        return 130
    if len(index):
        cols = ["label", "diverged_at", "final_loss", "steps_run", "wall_time_s"]
        print(index[cols].to_string(index=False))
    print(f"results: {args.out}/results (index.csv); run store: {args.out}/runs")
    if args.figures:
        from proxy.figures import campaign_figures

        for path in campaign_figures(f"{args.out}/results", out=args.figures):
            print(f"figure: {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="proxy", description="MX low-precision training workbench")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    from proxy.experiments_cli import add_experiment_commands

    add_experiment_commands(sub)
    bench = sub.add_parser("bench", help="run a benchmark and print measured ratios")
    bench.add_argument("name", help=f"one of: {', '.join(BENCHMARKS)}")
    bench.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the benchmark")
    bench.set_defaults(func=_bench)

    train = sub.add_parser("train", help="train one run into the run store (config.json, metrics.parquet, ...)")
    add_config_arguments(train)
    train.add_argument("--out", default=None,
                       help="run store folder; the run lands in OUT/<config hash>/ (default: $PROXY_STORE or runs/; "
                            "'off' keeps it in memory)")
    train.add_argument("--force", action="store_true", help="retrain even if the store holds this config")
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.set_defaults(func=_train, parser=train)

    from proxy.campaign import KINDS
    from proxy.scales import SCALES as _ALL_SCALES

    camp = sub.add_parser("campaign", help="run the paper's headline experiments at a scale (Figs. 2, 4, 5, 7)")
    camp.add_argument("--scale", required=True, choices=[n for n, s in _ALL_SCALES.items() if s.campaign],
                      help="smoke (CI), medium (a 2-core CPU, hours) or paper (one H200, minutes)")
    camp.add_argument("--out", required=True, help="folder for the run store (OUT/runs) and results (OUT/results)")
    camp.add_argument("--only", nargs="+", choices=KINDS, help="parts to run (default: all)")
    camp.add_argument("--widths", nargs="+", type=int, help="only these model widths")
    camp.add_argument("--figures", metavar="DIR", help="also write the campaign's figures into DIR")
    camp.add_argument("--quiet", action="store_true", help="no progress bars")
    camp.set_defaults(func=_campaign, parser=camp)

    from proxy.figures import FIGURES, SCALES

    figures = sub.add_parser("figures", help="regenerate the figures (PNG, optionally PDF)")
    figures.add_argument("--scale", default="quick", choices=SCALES, help="experiment scale (default: quick)")
    figures.add_argument("--only", nargs="+", metavar="NAME", help=f"figures to make; valid: {', '.join(FIGURES)}")
    figures.add_argument("--out", default="figures", help="output folder (default: figures/)")
    figures.add_argument("--pdf", action="store_true", help="also write PDF")
    figures.set_defaults(func=_figures, parser=figures)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
