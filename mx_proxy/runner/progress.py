"""Progress bars of the host loop: tqdm in a terminal, one line of text in a Jupyter kernel.

In a terminal a bar is tqdm's (it disappears when done). In a Jupyter
kernel a widget bar would be saved into the notebook as a widget that
renders nothing without a live kernel (or "0/3000"), so there a bar is one
line of plain text in a display that updates in place (``fp32: 1200/3000
[00:40<01:00]``), and when the work is done :func:`report` replaces it with
the finished line, ``fp32: 3000/3000 steps [02:10]``, built from the runs
themselves (their steps and recorded training time). A run loaded from a
store gets the very same line, so rerunning a notebook whose runs are
stored rewrites nothing.
"""

from __future__ import annotations

import time

from tqdm.std import tqdm  # the base class of every tqdm bar (auto, notebook, asyncio)

__all__ = ["restart_clock", "in_kernel", "bar", "TextBar", "report", "finished_line", "clock"]


def in_kernel() -> bool:
    """True inside a Jupyter kernel (an IPython shell with a kernel attached)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def clock(seconds: float) -> str:
    """``mm:ss`` (``h:mm:ss`` from an hour), as tqdm writes elapsed time."""
    return tqdm.format_interval(max(0.0, float(seconds)))


class TextBar:
    """A progress bar for a Jupyter kernel: one line of text in a display
    that updates in place, at most every ``every`` seconds (see the module
    docstring). Used like a tqdm bar (``update``, ``close``, a context manager)."""

    def __init__(self, total: int = 0, initial: int = 0, desc: str = "", disable: bool = False, every: float = 0.5,
                 **_):
        self.total, self.n, self.initial, self.desc, self.disable, self.every = total, initial, initial, desc, \
            disable, every
        self.t0 = time.perf_counter()
        self._shown = 0.0
        self.handle = None
        self.text = ""

    def _line(self) -> str:
        dt = time.perf_counter() - self.t0
        done = self.n - self.initial
        eta = f"<{clock(dt / done * (self.total - self.n))}" if done > 0 and self.total else ""
        return f"{self.desc}: {self.n}/{self.total} [{clock(dt)}{eta}]"

    def show(self, text: str) -> None:
        """Show ``text`` as this bar's line (the first call displays it, later ones update it)."""
        if self.disable:
            return
        from IPython.display import display

        self.text = text
        if self.handle is None:
            self.handle = display({"text/plain": text}, raw=True, display_id=True)
        else:
            self.handle.update({"text/plain": text}, raw=True)

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.perf_counter()
        if now - self._shown >= self.every:
            self._shown = now
            self.show(self._line())

    def reset_clock(self) -> None:
        self.t0, self.initial = time.perf_counter(), self.n

    def close(self) -> None:
        pass

    def __enter__(self):
        self.show(self._line())
        return self

    def __exit__(self, *exc):
        return False


def bar(total: int, *, initial: int = 0, desc: str = "", disable: bool = False, unit: str = "step", **kwargs):
    """A progress bar: a :class:`TextBar` in a Jupyter kernel, tqdm's elsewhere (``leave=False``)."""
    if in_kernel():
        return TextBar(total=total, initial=initial, desc=desc, disable=disable)
    return tqdm(total=total, initial=initial, desc=desc, disable=disable, unit=unit, leave=False, **kwargs)


def finished_line(desc: str, runs, start: int = 0) -> str:
    """``desc: done/total steps [elapsed]`` of finished ``runs``: steps each
    trained from ``start`` (to its end, or to its divergence), and the sum
    of their recorded training times."""
    runs = list(runs)
    total = sum(r.config.steps - start for r in runs)
    done = sum((r.config.steps if r.diverged_at is None else min(r.diverged_at + 1, r.config.steps)) - start
               for r in runs)
    diverged = sum(r.diverged_at is not None for r in runs)
    wall = sum(float(r.wall_time_s or 0.0) for r in runs)
    return (f"{desc}: {done}/{total} steps [{clock(wall)}]"
            + (f", {diverged} diverged" if diverged else ""))


def report(bar, desc: str, runs, *, progress: bool = True, start: int = 0) -> None:
    """In a Jupyter kernel (and with ``progress``), show :func:`finished_line`
    of ``runs``: in ``bar``'s display when it is a :class:`TextBar`, else as
    a new line (runs that were loaded). Elsewhere nothing."""
    if not progress or not in_kernel():
        return
    line = finished_line(desc, runs, start)
    if isinstance(bar, TextBar) and not bar.disable:
        bar.show(line)
    else:
        TextBar(desc=desc).show(line)


def restart_clock(bar) -> None:
    """Start a progress bar's clock afresh, keeping its count: called after a
    group's first segment, which includes compiling (or loading) its program,
    so that the rate and ETA shown come from training steps alone (before,
    a first ETA could read tens of minutes for a run of two)."""
    if isinstance(bar, TextBar):
        bar.reset_clock()
        return
    if not isinstance(bar, tqdm) or bar.disable:  # another kind of bar (a worker's) keeps its own clock
        return
    done = bar.n
    bar.reset()
    bar.n = bar.last_print_n = bar.initial = done
    bar.refresh()
