"""Benchmarks behind ``mx-proxy bench NAME``.

Each module here exposes ``main(argv) -> int``; it
measures everything it reports within one run and prints ratios, because
these machines are shared and noisy: no benchmark asserts a time.
"""

import ast
from pathlib import Path

from mx_proxy.viz.text import plain

BENCHMARKS = {
    "quantize": "mx_proxy.cli.bench.quantize",
    "step": "mx_proxy.cli.bench.step",
    "sweep": "mx_proxy.cli.bench.sweep",
    "compile": "mx_proxy.cli.bench.compile",
    "kernels": "mx_proxy.cli.bench.kernels",
    "members": "mx_proxy.cli.bench.members",
    "processes": "mx_proxy.cli.bench.processes",
    "diagnostics": "mx_proxy.cli.bench.diagnostics",
}


def describe(name: str) -> str:
    """The one-line description of benchmark ``name``: the first line of its
    module's docstring without the ``mx-proxy bench NAME:`` prefix (read from
    the source, so ``mx-proxy bench --help`` imports no benchmark)."""
    path = Path(__file__).with_name(BENCHMARKS[name].rsplit(".", 1)[-1] + ".py")
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    first = plain(doc.split("\n\n", 1)[0]).replace("\n", " ")
    return first.split(": ", 1)[1] if first.startswith(f"mx-proxy bench {name}:") else first
