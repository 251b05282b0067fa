"""Command-line options the benchmarks share."""

from __future__ import annotations

import argparse

__all__ = ["add_shape"]


def add_shape(p: argparse.ArgumentParser, *, width: int, batch: int, depth: int = 4) -> None:
    """``--width``, ``--depth`` and ``--batch`` of the timed student, with these defaults."""
    p.add_argument("--width", type=int, default=width)
    p.add_argument("--depth", type=int, default=depth)
    p.add_argument("--batch", type=int, default=batch)
