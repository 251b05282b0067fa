"""Docstrings as terminal text: RST markup removed (``--help`` prints plain words)."""

from __future__ import annotations

import re

__all__ = ["plain"]

_ROLE = re.compile(r":(?:func|mod|class|meth|data|attr|obj|exc|ref|doc):`~?([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")


def plain(text: str | None) -> str | None:
    """``text`` without RST markup: ````x```` → x, :func:`mxp.train` → mxp.train."""
    if text is None:
        return None
    text = _ROLE.sub(lambda m: m.group(1), text)
    return _LITERAL.sub(lambda m: m.group(1), text)
