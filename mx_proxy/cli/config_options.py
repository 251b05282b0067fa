"""Config fields as command-line options: the one builder every command uses.

Each :class:`~mx_proxy.training.config.Config` field is ``--field-name``
(``diagnostics_every`` → ``--diagnostics-every``), typed from its
annotation, with its help line, valid names and default taken from its
:func:`~mx_proxy.training.config.knob` declaration. ``mx-proxy train`` takes
one value per option, ``mx-proxy sweep`` one or more (``multi``), ``mx-proxy
intervene`` the intervenable fields only. Values are checked by Config
itself, so the API and every command refuse a bad value with the same
message (exit status 2 from the CLI).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable

from mx_proxy.cli.help import cli_message, config_help, flag
from mx_proxy.training.config import CHOICES, Config

__all__ = ["add_config_options", "config_from_args", "config_changes", "parse_bool"]

_FIELDS = {f.name: f for f in dataclasses.fields(Config)}


def parse_bool(text: str) -> bool:
    """``true/false``, ``yes/no``, ``on/off``, ``1/0`` (case-insensitive)."""
    v = str(text).strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean {text!r}; valid: true, false (yes/no, on/off, 1/0)")


def _type(f: dataclasses.Field):
    """The parser of one value of field ``f`` (names, recipes and controller specs stay strings)."""
    ann = str(f.type)
    if ann == "bool":
        return parse_bool
    if ann.startswith("tuple"):
        return int
    if ann == "float":
        return float
    if ann in ("int", "int | None"):
        return int
    return str


def _metavar(f: dataclasses.Field) -> str:
    if f.name in CHOICES:
        return "NAME"
    return {"controller": "SPEC", "checkpoint_at": "STEP"}.get(f.name) or {
        parse_bool: "BOOL", int: "N", float: "X"}.get(_type(f), "TEXT")


def add_config_options(parser: argparse.ArgumentParser, fields: Iterable[str] | None = None, *,
                       multi: bool = False) -> None:
    """Add ``--field-name`` for each of ``fields`` (default: every Config field).

    ``multi``: each option takes one or more values (a sweep's axes);
    otherwise one, except ``--checkpoint-at`` (one or more steps). An option
    not given is ``None`` in the parsed namespace.
    """
    wanted = set(_FIELDS if fields is None else fields)
    unknown = wanted - set(_FIELDS)
    if unknown:
        raise ValueError(f"unknown config field(s) {sorted(unknown)}; valid: {', '.join(_FIELDS)}")
    for name, f in _FIELDS.items():
        if name in wanted:
            nargs = "+" if multi or name == "checkpoint_at" else None
            parser.add_argument(flag(name), dest=name, type=_type(f), nargs=nargs, default=None, metavar=_metavar(f),
                                help=config_help(name, multi=multi))


def config_changes(args: argparse.Namespace, fields: Iterable[str] | None = None) -> dict:
    """The Config fields the parsed options set (lists of several values kept as lists, ``checkpoint_at`` a tuple)."""
    out = {}
    for name in (_FIELDS if fields is None else fields):
        v = getattr(args, name, None)
        if v is not None:
            out[name] = tuple(v) if name == "checkpoint_at" else v
    return out


def config_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace, base: Config | None = None) -> Config:
    """The Config the (single-valued) options ask for; a bad value exits with status 2 and Config's message."""
    try:
        return (base or Config()).replace(**config_changes(args))
    except ValueError as err:
        parser.error(cli_message(str(err)))
