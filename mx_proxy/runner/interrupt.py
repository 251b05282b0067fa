"""Stopping training between segments: a scheduler's signal, Ctrl-C, Kernel → Interrupt, a Stop button.

Two ways to ask the host loop (:func:`mx_proxy.runner.loop.run_members`) to stop at
the end of its current segment, where every unfinished member is checkpointed:

- :data:`stop`, a process-wide event a scheduler's signal handler sets
  (:mod:`mx_proxy.experiments.executors.job`); the loop then raises
  :class:`Stopped` and the job requeues.
- :func:`interruptible`, the context ``train``, ``sweep`` and ``intervene``
  (and the explorer, ``figures``) run in. In the main thread it turns the
  first SIGINT (Ctrl-C in a terminal, Kernel → Interrupt in Jupyter) into a
  request to stop at the end of the segment; a second SIGINT raises
  ``KeyboardInterrupt`` at once. :meth:`Interruption.request` does the same
  from code (the explorer's Stop button, from another thread). When the
  outermost context exits after a request it raises :class:`Interrupted`:
  a ``KeyboardInterrupt`` whose message is one line saying what was kept
  (runs that finished and where they are stored, runs checkpointed at the
  step they reached), which IPython shows instead of a traceback. The
  kernel stays usable, and a rerun loads the finished runs and resumes the
  checkpointed ones.

A request is per thread (the explorer trains in a thread of its own while
the kernel runs cells); :data:`stop` stops every thread.
"""

from __future__ import annotations

import os
import signal
import threading

__all__ = ["stop", "Stopped", "Interrupted", "Interruption", "interruptible", "current", "requested"]

stop = threading.Event()
"""Set it (a scheduler's signal handler does, :mod:`mx_proxy.experiments.executors.job`) to stop every
training loop of this process at the end of its current segment: each unfinished member is checkpointed at
the step reached, then :class:`Stopped` is raised. A rerun resumes from that checkpoint, bit for bit."""


class Stopped(Exception):
    """Training stopped on request (:data:`stop`, or an :class:`Interruption`)
    at the end of a segment; ``step``: where every unfinished member was
    checkpointed; ``runs``: those members' :class:`~mx_proxy.training.result.Run`
    s so far (metrics up to ``step``); ``kept``: per member, where its
    checkpoint is (``None``: in memory only)."""

    def __init__(self, step: int, runs=(), kept=()):
        super().__init__(f"stopped at step {step} on request; every unfinished member was checkpointed there")
        self.step, self.runs, self.kept = step, list(runs), list(kept)


class Interrupted(KeyboardInterrupt):
    """Training interrupted (Ctrl-C, Kernel → Interrupt, a Stop button) and
    stopped at the end of a segment. ``str(err)``: one line saying what was
    kept; ``runs``: the runs that finished before it and those stopped
    (metrics so far). IPython shows the one line instead of a traceback."""

    def __init__(self, message: str, runs=()):
        super().__init__(message)
        self.runs = list(runs)

    def _render_traceback_(self):  # IPython's hook: these lines instead of a traceback
        return [f"Interrupted: {self}"]


def _where(path) -> str:
    return os.path.dirname(os.fspath(path)) or "."


class Interruption:
    """The state of one outermost :func:`interruptible` context: whether a
    stop was requested, what finished and what was checkpointed."""

    def __init__(self):
        self.requested = threading.Event()
        self.finished: list = []  # Runs that finished inside the context
        self.stopped: list = []   # (Run so far, step, where its checkpoint is or None)

    def request(self) -> None:
        """Stop at the end of the current segment (thread-safe: a Stop button calls it)."""
        self.requested.set()

    def finish(self, *runs) -> None:
        self.finished += [r for r in runs if r is not None]

    def line(self) -> str:
        """One line: what finished (and where it is stored), what was checkpointed where."""
        parts = []
        if self.finished:
            stored = sorted({_where(r.path) for r in self.finished if r.path})
            names = ", ".join(dict.fromkeys(r.config.recipe.name for r in self.finished))
            parts.append(f"{len(self.finished)} finished run(s) kept ({names})"
                         + (f" in {', '.join(stored)}" if stored else " in memory (Interrupted.runs)"))
        if self.stopped:
            step = self.stopped[0][1]
            total = self.stopped[0][0].config.steps
            names = ", ".join(dict.fromkeys(r.config.recipe.name for r, _, _ in self.stopped))
            dirs = sorted({_where(_where(w)) for _, _, w in self.stopped if w})
            parts.append(f"{names} stopped at step {step} of {total}, "
                         + (f"checkpointed in {', '.join(dirs)} (a rerun resumes there)" if dirs
                            else "not kept (no store: its metrics so far are in Interrupted.runs)"))
        return "; ".join(parts) or "nothing had finished yet"

    def error(self) -> Interrupted:
        return Interrupted(self.line(), self.finished + [r for r, _, _ in self.stopped])


_local = threading.local()


def current() -> Interruption | None:
    """This thread's active :class:`Interruption` (``None`` outside :func:`interruptible`)."""
    return getattr(_local, "state", None)


def requested() -> bool:
    """Whether the host loop should stop at the end of this segment: :data:`stop` is set, or this thread's
    interruption was requested."""
    state = current()
    return stop.is_set() or (state is not None and state.requested.is_set())


class interruptible:
    """Context manager (see the module docstring); nested contexts share the
    outermost one's :class:`Interruption`, which ``with`` gives. ``state``:
    use this one (the explorer's, whose Stop button requests it) instead of
    a new one."""

    def __init__(self, state: Interruption | None = None):
        self._given = state
        self._outer = False
        self._previous = None

    def __enter__(self) -> Interruption:
        state = current()
        if state is not None:
            return state
        self._outer = True
        state = _local.state = self._given or Interruption()
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.default_int_handler

            def on_sigint(signum, frame):
                if state.requested.is_set():  # a second interrupt: at once
                    signal.signal(signal.SIGINT, signal.default_int_handler)
                    raise KeyboardInterrupt
                state.request()

            signal.signal(signal.SIGINT, on_sigint)
        return state

    def __exit__(self, kind, err, tb):
        if not self._outer:
            return False
        state = current()
        _local.state = None
        if self._previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._previous)
        if not state.requested.is_set():
            return False
        if isinstance(err, Stopped):
            state.stopped += [(r, err.step, k) for r, k in zip(err.runs, err.kept)]
        if kind is None or (isinstance(err, Stopped) and not stop.is_set()):
            raise state.error() from None
        return False
