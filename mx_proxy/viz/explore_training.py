"""How the explorer trains: one run with live updates, and Kernel → Interrupt while its thread trains."""

from __future__ import annotations

import signal
from collections.abc import Callable

from mx_proxy.runner import interrupt
from mx_proxy.runner.loop import train as _train
from mx_proxy.runner.progress import in_kernel
from mx_proxy.training.config import Config
from mx_proxy.training.result import Run

__all__ = ["train_live", "interrupt_on_sigint"]


def train_live(config: Config, store, on_update: Callable[[int, Run], None]) -> Run:
    """Train (or load from ``store``) one run, calling ``on_update(step,
    run_so_far)`` after every host-loop segment with the step reached and a
    :class:`Run` holding the metrics so far, and once more at the end with
    ``config.steps`` and the finished run (also when it was loaded from the
    store or diverged early). The one adapter between the explorer and the
    runner.

    Needs of the runner: ``train(config, store=..., progress=False,
    on_segment=f)`` calling ``f(step, runs)`` after each segment, ``runs`` a
    list with one :class:`Run` (metrics so far) per member.
    """
    def segment(step: int, runs: list[Run]) -> None:
        on_update(step, runs[0])

    run = _train(config, store=store, progress=False, on_segment=segment)
    on_update(config.steps, run)
    return run


def interrupt_on_sigint(interruption: interrupt.Interruption) -> Callable[[], None]:
    """Inside a Jupyter kernel: until the returned function is called, SIGINT (Kernel → Interrupt while no
    cell runs) requests ``interruption``. ipykernel gives each message it handles Python's own SIGINT handler
    and puts back, after it, the one it found, so the handler is installed from the kernel's event loop,
    between messages. Elsewhere: nothing."""
    if not in_kernel():
        return lambda: None
    from IPython import get_ipython

    loop = get_ipython().kernel.io_loop
    saved = []

    def on_sigint(signum, frame):
        interruption.request()

    def install():
        saved.append(signal.signal(signal.SIGINT, on_sigint))

    def uninstall():
        if saved and signal.getsignal(signal.SIGINT) is on_sigint:
            signal.signal(signal.SIGINT, saved[0])

    loop.add_callback(install)
    return lambda: loop.add_callback(uninstall)
