"""What the command line's ``--help`` says: one line per Config field (from
:data:`mx_proxy.training.config.FIELD_DOCS`) with its accepted values and default, and
docstrings turned into plain terminal text (no RST markup)."""

from __future__ import annotations

import argparse
import dataclasses
import re
import textwrap

from mx_proxy.training.config import BOUNDS, CHOICES, FIELD_DOCS, Config
from mx_proxy.viz.text import plain

__all__ = ["plain", "config_help", "PlainFormatter", "cli_message", "flag"]

def _hang(line: str, width: int) -> str:
    """A listing line ``  name   description`` wrapped under its description."""
    m = re.match(r"(\s*\S+\s+)", line)
    if not m or len(line) <= width:
        return line
    return textwrap.fill(line, width, subsequent_indent=" " * len(m.group(1)))


class PlainFormatter(argparse.HelpFormatter):
    """Help without RST markup; a description keeps its paragraphs (blank
    lines) and its indented lines (listings), and wraps the rest."""

    def _fill_text(self, text, width, indent):
        out = []
        for para in plain(text).split("\n\n"):
            if all(line.startswith("  ") for line in para.splitlines()[1:]) and "\n  " in para:
                out.append("\n".join(_hang(indent + line, width) for line in para.splitlines()))  # a listing
            else:
                out.append(super()._fill_text(para, width, indent))
        return "\n\n".join(out)

    def _expand_help(self, action):
        return plain(super()._expand_help(action))


def flag(name: str) -> str:
    """The option of a Config field: ``diagnostics_every`` → ``--diagnostics-every`` (field names with an
    underscore; a plain word such as "steps" is left alone)."""
    return "--" + name.replace("_", "-")


def _default(f: dataclasses.Field) -> str:
    d = f.default
    if d is None:
        return "none"
    if isinstance(d, bool):
        return "true" if d else "false"
    if isinstance(d, tuple):
        return "none" if not d else " ".join(map(str, d))
    return f"{d:g}" if isinstance(d, float) else str(d)


def config_help(name: str, *, multi: bool = False) -> str:
    """The ``--help`` line of Config field ``name``: what it sets, the values
    it accepts (``multi``: a sweep's one or more) and its default."""
    f = {f.name: f for f in dataclasses.fields(Config)}[name]
    parts = [cli_message(FIELD_DOCS[name])]
    if name in CHOICES:
        parts.append(f"one of: {', '.join(CHOICES[name])}")
    elif isinstance(f.default, bool):
        parts.append("true or false")
    elif name == "checkpoint_at":
        parts.append("one or more steps")
    elif name in BOUNDS:
        parts.append(f"an integer in [{BOUNDS[name][0]}, {BOUNDS[name][1]}]")
    if multi and name != "checkpoint_at":
        parts.append("several values: a sweep axis")
    parts.append(f"default: {_default(f)}")
    return "; ".join(parts).replace("%", "%%")


_FIELDS = sorted(Config.field_names(), key=len, reverse=True)
_WORDS = re.compile(
    r"(?<![\w'\"`/])(?P<field>" + "|".join(_FIELDS) + r")=(?P<value>\([^)]*\)|'[^']*'|\"[^\"]*\"|[\w.+-]+)"
    # quoted text, a path, the choices after "valid:": quoted as they are
    r"|(?P<verbatim>'[^']*'|\"[^\"]*\"|`[^`]*`|[^\s'\"`(),;]*[/\\~][^\s'\"`,;]*"
    r"|\bvalid: .*?(?=; |\.\s|\.$|\n|$))"
    r"|(?<![\w\-\"'])(?P<bare>" + "|".join([f for f in _FIELDS if "_" in f] + ["at_step"]) + r")(?![\w=(])")


def cli_message(message: str) -> str:
    """An API error message in the command line's words: ``checkpoint_at=(1500,)``
    → ``--checkpoint-at 1500``, ``paired_run=True`` → ``--paired-run true``,
    ``diagnostics_every`` → ``--diagnostics-every`` (field names with an
    underscore; a plain word such as "steps" is left alone). What a message
    quotes stays as it is: quoted text (``'adam_eps=1e-15'`` names an
    ensemble arm, written so on the command line too), a path
    (``/tmp/quant_stats``) and the choices listed after ``valid:`` (a figure
    named ``quant_stats``)."""

    def word(m):
        if m.group("verbatim"):
            return m.group("verbatim")
        if m.group("bare"):
            return flag(m.group("bare"))
        value = m.group("value").strip("'\"")
        if value.startswith("("):
            value = " ".join(v.strip() for v in value.strip("()").split(",") if v.strip())
        value = {"True": "true", "False": "false", "None": "none"}.get(value, value)
        return f"{flag(m.group('field'))} {value}"

    return _WORDS.sub(word, message)
