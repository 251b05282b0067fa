"""``proxy figures``: regenerate every figure into a folder.

Each entry of :data:`FIGURES` is a function ``(scale) -> Figure``; those that
train reuse stored runs, so a second call is fast.
"""

from __future__ import annotations

import os
import time
from typing import Callable

from proxy import plots

__all__ = ["FIGURES", "SCALES", "generate"]

SCALES = ("smoke", "quick", "paper")

FIGURES: dict[str, Callable] = {
    "sawtooth": lambda scale: plots.sawtooth("fp8_e4m3"),
    "ln_collapse": lambda scale: plots.ln_collapse("fp8_e4m3"),
}


def generate(names=None, *, scale: str = "quick", out: str = "figures", pdf: bool = False, log=print) -> list[str]:
    """Write the named figures (default: all) as PNG (and PDF) into ``out``.

    Raises:
      ValueError: for an unknown figure name or scale, naming the valid ones.
    """
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; valid: {', '.join(SCALES)}")
    names = list(FIGURES) if not names else list(names)
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        raise ValueError(f"unknown figure(s) {unknown}; valid: {', '.join(FIGURES)}")
    os.makedirs(out, exist_ok=True)
    written = []
    for i, name in enumerate(names, 1):
        t0 = time.perf_counter()
        fig = FIGURES[name](scale)
        for ext in ("png", "pdf") if pdf else ("png",):
            path = os.path.join(out, f"{name}.{ext}")
            fig.savefig(path, dpi=120)
            written.append(path)
        plots.plt.close(fig)
        log(f"[{i}/{len(names)}] {name}: {time.perf_counter() - t0:.1f}s -> {os.path.join(out, name)}.png")
    return written
