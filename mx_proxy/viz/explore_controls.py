"""The explorer's controls, their checks, and the compile times it measured.

Number controls are text fields read here: a value out of range or not a
number is an error naming the field and its valid range (never clamped to
one that is). :class:`CompileTimes` keeps how long the first segment of a
new program shape took, so that the next new shape can say what to expect.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
import tempfile
import threading
from pathlib import Path

from mx_proxy.nn.activations import ACTIVATIONS
from mx_proxy.nn.norms import NORMS
from mx_proxy.training import compile_cache
from mx_proxy.training.config import Config

__all__ = ["CONTROLS", "RANGES", "make_controls", "read_controls", "check_value", "val_every", "CompileTimes",
           "markdown_html"]

# the panel's controls, each a Config field except "recipes"
CONTROLS = ("recipes", "act", "norm", "width", "depth", "lr", "steps", "seed", "diagnostics_every")
# the whole-number controls: (smallest, largest, label)
RANGES = {"width": (1, 1 << 16, "width"), "depth": (1, 256, "depth"), "steps": (1, 10 ** 8, "steps"),
          "seed": (0, 2 ** 32 - 1, "seed"), "diagnostics_every": (0, 10 ** 6, "diagnostics every")}


def _number_text(w):
    """ipywidgets' Text, accepting numbers from code (kept as their text): ``controls["steps"].value = 60``."""
    import traitlets

    class TextOrNumber(traitlets.Unicode):
        def validate(self, obj, value):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                value = repr(value) if isinstance(value, float) else str(value)
            return super().validate(obj, value)

    class NumberText(w.Text):
        value = TextOrNumber(help="String value").tag(sync=True)

    return NumberText


def make_controls(w, base: Config, recipes: list[str], chosen: tuple[str, ...]) -> dict:
    """The :data:`CONTROLS` widgets, starting at ``base``'s values and the ``chosen`` recipes."""
    wide = {"description_width": "initial"}
    text = _number_text(w)
    controls = {
        "recipes": w.SelectMultiple(options=recipes, value=chosen, rows=6, description="MX recipes", style=wide),
        "act": w.Dropdown(options=ACTIVATIONS.names(), value=base.act, description="activation", style=wide),
        "norm": w.Dropdown(options=NORMS.names(), value=base.norm, description="norm", style=wide),
        "lr": text(value=repr(float(base.lr)), description="LR", style=wide, continuous_update=True,
                   tooltip="learning rate: a positive number, e.g. 3e-3"),
    }
    for name, (lo, hi, label) in RANGES.items():
        controls[name] = text(value=str(getattr(base, name)), description=label, style=wide,
                              tooltip=f"a whole number from {lo} to {hi}")
    return {k: controls[k] for k in CONTROLS}


def check_value(name: str, value):
    """The value of control ``name`` (its text) as a Config value.

    Raises:
      ValueError: not a number, not whole, or out of the field's range; the
        message names the field, the valid range and the value given.
    """
    text = str(value).strip()
    if name == "lr":
        try:
            lr = float(text)
        except ValueError:
            lr = math.nan
        if not (math.isfinite(lr) and lr > 0):
            raise ValueError(f"LR must be a positive finite number (e.g. 3e-3), got {text!r}")
        return lr
    lo, hi, label = RANGES[name]
    if not re.fullmatch(r"[+-]?\d+", text):
        raise ValueError(f"{label} must be a whole number from {lo} to {hi}, got {text!r}")
    number = int(text)
    if not lo <= number <= hi:
        raise ValueError(f"{label} must be a whole number from {lo} to {hi}, got {number}")
    return number


def read_controls(controls: dict) -> dict:
    """``{field: value}`` of every control, checked (:func:`check_value`);
    the first bad one raises its ValueError."""
    out = {"recipes": tuple(controls["recipes"].value), "act": controls["act"].value, "norm": controls["norm"].value}
    for name in ("lr", *RANGES):
        out[name] = check_value(name, controls[name].value)
    return out


def val_every(every: int, period: int) -> int:
    """The smallest multiple of the diagnostics ``period`` at least ``every``
    (a Config needs val_every to be a multiple of it); unchanged for period 0."""
    if not period or not every:
        return every
    return period * math.ceil(every / period)


def markdown_html(text: str) -> str:
    """The explorer's Markdown (``**bold**``, ``- `` items) as HTML."""
    lines, items = [], []
    for raw in text.splitlines():
        line = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", html.escape(raw))
        if raw.startswith("- "):
            items.append(f"<li>{line[2:]}</li>")
            continue
        if items:
            lines.append("<ul>" + "".join(items) + "</ul>")
            items = []
        lines.append(f"<p>{line}</p>")
    if items:
        lines.append("<ul>" + "".join(items) + "</ul>")
    return "".join(lines)


class CompileTimes:
    """Seconds the first segment of a new program shape took (compiling
    included), per shape and the latest of any, kept in a small JSON file
    beside JAX's compilation cache (in memory when that cache is off)."""

    NAME = "proxy-explorer-compile-times.json"

    def __init__(self, folder: Path | None = None):
        folder = folder if folder is not None else compile_cache.active_dir()
        self.path = None if folder is None else Path(folder) / self.NAME
        self._memory: dict = {}
        self._lock = threading.Lock()

    def _read(self) -> dict:
        if self.path is None:
            return dict(self._memory)
        try:
            data = json.loads(self.path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def expected(self, shape: str) -> float | None:
        """The seconds measured for ``shape`` last time, else for the latest new shape, else ``None``."""
        data = self._read()
        value = data.get("shapes", {}).get(shape, data.get("last"))
        return float(value) if isinstance(value, (int, float)) else None

    def record(self, shape: str, seconds: float) -> None:
        with self._lock:
            data = self._read()
            data.setdefault("shapes", {})[shape] = data["last"] = round(float(seconds), 1)
            if self.path is None:
                self._memory = data
                return
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tmp-")
                with os.fdopen(fd, "w") as f:
                    json.dump(data, f)
                os.replace(tmp, self.path)
            except OSError:  # an unwritable cache folder: the estimate is only lost
                self._memory = data
                self.path = None
