"""The ``proxy`` command line."""

from __future__ import annotations

import argparse
import importlib
import sys

from proxy.bench import BENCHMARKS


class _Parser(argparse.ArgumentParser):
    """argparse exits with status 2 on bad input and names the valid choices."""


def _bench(args) -> int:
    if args.name not in BENCHMARKS:
        print(f"proxy bench: unknown benchmark {args.name!r}; valid: {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(BENCHMARKS[args.name])
    return int(module.main(args.rest) or 0)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="proxy", description="MX low-precision training workbench")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    bench = sub.add_parser("bench", help="run a benchmark and print measured ratios")
    bench.add_argument("name", help=f"one of: {', '.join(BENCHMARKS)}")
    bench.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the benchmark")
    bench.set_defaults(func=_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
