"""Benchmarks behind ``proxy bench NAME``.

Each module here exposes ``main(argv) -> int``; it
measures everything it reports within one run and prints ratios, because
these machines are shared and noisy: no benchmark asserts a time.
"""

import ast
from pathlib import Path

from proxy.text import plain

BENCHMARKS = {
    "quantize": "proxy.bench.quantize",
    "step": "proxy.bench.step",
    "sweep": "proxy.bench.sweep",
    "compile": "proxy.bench.compile",
    "kernels": "proxy.bench.kernels",
}


def describe(name: str) -> str:
    """The one-line description of benchmark ``name``: the first line of its
    module's docstring without the ``proxy bench NAME:`` prefix (read from
    the source, so ``proxy bench --help`` imports no benchmark)."""
    path = Path(__file__).with_name(BENCHMARKS[name].rsplit(".", 1)[-1] + ".py")
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    first = plain(doc.split("\n\n", 1)[0]).replace("\n", " ")
    return first.split(": ", 1)[1] if first.startswith(f"proxy bench {name}:") else first
