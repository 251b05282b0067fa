"""Progress bars of the host loop."""

from __future__ import annotations

from tqdm.std import tqdm  # the base class of every tqdm bar (auto, notebook, asyncio)

__all__ = ["restart_clock"]


def restart_clock(bar) -> None:
    """Start a progress bar's clock afresh, keeping its count: called after a
    group's first segment, which includes compiling (or loading) its program,
    so that the rate and ETA shown come from training steps alone (before,
    a first ETA could read tens of minutes for a run of two)."""
    if not isinstance(bar, tqdm) or bar.disable:  # another kind of bar (a worker's) keeps its own clock
        return
    done = bar.n
    bar.reset()
    bar.n = bar.last_print_n = bar.initial = done
    bar.refresh()
