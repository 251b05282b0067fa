"""The argument parser every ``mx-proxy`` command uses.

It prints help as plain terminal text (:class:`~mx_proxy.cli.help.PlainFormatter`)
and refuses, in one line with exit status 2 before any work, an option or
argument given an empty (or blank) value: every string the commands take
is a name or a path, and an empty one would silently mean something else
(``--controller ''`` turning a controller on, ``--out ''`` writing nothing).
"""

from __future__ import annotations

import argparse

from mx_proxy.cli.help import PlainFormatter

__all__ = ["Parser"]


class Parser(argparse.ArgumentParser):
    """argparse with plain help and no empty values (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", PlainFormatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        ns, rest = super().parse_known_args(args, namespace)
        for action in self._actions:
            if action.nargs == argparse.REMAINDER:  # another program's arguments (a benchmark's)
                continue
            value = getattr(ns, action.dest, None)
            values = value if isinstance(value, (list, tuple)) else [value]
            if any(isinstance(v, str) and not v.strip() for v in values):
                name = "/".join(action.option_strings) or action.metavar or action.dest
                self.exit(2, f"{self.prog}: error: {name} was given an empty value; it takes a name or a path\n")
        return ns, rest
