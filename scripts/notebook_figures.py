"""Compare a notebook's committed figures with what the current code draws, ignoring only font rendering.

:data:`RECORD_TEXTLESS` is a code cell run first in a notebook's kernel (by
``scripts/run_notebooks.py --check``): for every figure the kernel shows, it
also renders the same figure with no text drawn (``Text.draw`` skipped: the
layout, which reads text extents, is unchanged) and keeps that rendering in
a folder, named by the SHA-256 of the figure's PNG. :func:`compare` then
masks the pixels where the two renderings differ (the text, widened by a
few pixels) and counts the other pixels where the committed PNG and the
current one differ: a moved legend, another colour or line style, other
data. Text alone (another font, hinting, a changed number in a label) is
not counted.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np

__all__ = ["RECORD_TEXTLESS", "textless_path", "compare", "render", "TOLERANCE", "MAX_SHARE"]

TOLERANCE = 24      # a channel difference (of 255) up to this is antialiasing, not a change
MAX_SHARE = 5e-4    # at most this share of the non-text pixels may differ by more
MARGIN = 4          # pixels around drawn text that are masked too (antialiased glyph edges)

RECORD_TEXTLESS = """
import hashlib as _h, os as _os
from IPython import get_ipython as _ip
from matplotlib.figure import Figure as _Figure
from matplotlib.text import Text as _Text

_ip().run_line_magic("matplotlib", "inline")  # what the first figure does anyway: registers the PNG formatter

def _mx_proxy_record_textless(fig, _png=_ip().display_formatter.formatters["image/png"].lookup_by_type(_Figure),
                              _dir={folder!r}):
    data = _png(fig)
    if data:
        draw, _Text.draw = _Text.draw, lambda self, renderer: None
        try:
            bare = _png(fig)
        finally:
            _Text.draw = draw
        raw = data if isinstance(data, bytes) else __import__("base64").b64decode(data)
        with open(_os.path.join(_dir, _h.sha256(raw).hexdigest() + ".png"), "wb") as f:
            f.write(bare if isinstance(bare, bytes) else __import__("base64").b64decode(bare))
    return data

_ip().display_formatter.formatters["image/png"].for_type(_Figure, _mx_proxy_record_textless)
"""


def render(fig, textless: bool = False) -> bytes:
    """``fig`` as the inline backend shows it (PNG, tight bounding box), with no text drawn if ``textless``
    (what :data:`RECORD_TEXTLESS` does in a kernel)."""
    from matplotlib.text import Text

    buf = io.BytesIO()
    draw = Text.draw
    if textless:
        Text.draw = lambda self, renderer: None
    try:
        fig.savefig(buf, format="png", bbox_inches="tight")
    finally:
        Text.draw = draw
    return buf.getvalue()


def textless_path(folder: Path, png: bytes) -> Path:
    """Where :data:`RECORD_TEXTLESS` keeps the text-free rendering of the figure whose PNG is ``png``."""
    return Path(folder) / (hashlib.sha256(png).hexdigest() + ".png")


def _pixels(png: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(png)).convert("RGBA"), dtype=np.int16)


def _widen(mask: np.ndarray, by: int) -> np.ndarray:
    out = mask.copy()
    for dy in range(-by, by + 1):
        for dx in range(-by, by + 1):
            out |= np.roll(np.roll(mask, dy, axis=0), dx, axis=1)
    return out


def compare(committed: bytes, drawn: bytes, textless: bytes | None) -> tuple[bool, str]:
    """(same but for text?, what differs) of a committed PNG and the one the
    current code drew (``textless``: the same drawing without text; ``None``
    when not recorded: then every pixel counts)."""
    a, b = _pixels(committed), _pixels(drawn)
    if a.shape != b.shape:
        return False, f"size {a.shape[1]}×{a.shape[0]} committed, {b.shape[1]}×{b.shape[0]} drawn now"
    text = np.zeros(a.shape[:2], bool)
    if textless is not None:
        c = _pixels(textless)
        if c.shape == b.shape:
            text = _widen((c != b).any(axis=2), MARGIN)
    differ = (np.abs(a - b) > TOLERANCE).any(axis=2) & ~text
    share = differ.sum() / max(1, (~text).sum())
    if share > MAX_SHARE:
        ys, xs = np.nonzero(differ)
        return False, (f"{differ.sum()} pixels outside text differ ({100 * share:.2f} %), in x {xs.min()}–{xs.max()}, "
                       f"y {ys.min()}–{ys.max()}")
    return True, f"same outside text ({differ.sum()} stray pixels, {100 * text.mean():.1f} % of the image is text)"
