"""Benchmarks behind ``proxy bench NAME``.

Each module here exposes ``main(argv) -> int``; it
measures everything it reports within one run and prints ratios, because
these machines are shared and noisy: no benchmark asserts a time.
"""

BENCHMARKS = {
    "quantize": "proxy.bench.quantize",
    "step": "proxy.bench.step",
    "sweep": "proxy.bench.sweep",
    "compile": "proxy.bench.compile",
    "kernels": "proxy.bench.kernels",
}
