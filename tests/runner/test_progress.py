"""Progress bars: the rate and ETA come from training steps, not from compiling."""

import functools
import io

from tqdm import tqdm

import mx_proxy as mxp
from mx_proxy.runner import loop


def _recording_bar(monkeypatch):
    seen = {"resets": [], "bars": []}

    class Bar(tqdm):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            seen["bars"].append(self)

        def reset(self, total=None):
            seen["resets"].append(self.n)
            super().reset(total)

    monkeypatch.setattr(loop, "tqdm", functools.partial(Bar, file=io.StringIO(), mininterval=0))
    return seen


def test_the_clock_restarts_after_the_segment_that_compiled(monkeypatch):
    seen = _recording_bar(monkeypatch)
    cfg = mxp.Config(width=8, depth=1, batch=16, steps=30, diagnostics_every=10, val_every=10)  # 3 segments of 10
    mxp.train(cfg, progress=True)
    (bar,) = seen["bars"]
    assert seen["resets"] == [10] and bar.n == 30 and bar.initial == 10


def test_a_sweep_restarts_it_once_per_program_group(monkeypatch):
    seen = _recording_bar(monkeypatch)
    cfg = mxp.Config(width=8, depth=1, batch=16, steps=20, diagnostics_every=10, val_every=10)
    mxp.sweep(cfg, width=[8, 16], progress=True)  # two widths: two programs, one after the other
    (bar,) = seen["bars"]
    assert seen["resets"] == [10, 30] and bar.n == 40
