"""``mx-proxy list KIND``: the entries of a registry, read from the registry itself.

    mx-proxy list scale-rules            # floor, rceil, ceil, even, paper_bump, one line each
    mx-proxy list acts --markdown        # the table docs/architecture.md embeds

Kinds (:data:`LISTINGS`): ``acts``, ``norms``, ``scale-rules``, ``formats``,
``operands`` (the registries of :mod:`mx_proxy.numerics.registry`) and
``recipes`` (the presets). The docs' tables are these listings
(``tests/cli/test_list.py`` checks that they are current), so a new entry
shows up everywhere without editing a list.
"""

from __future__ import annotations

import argparse

from mx_proxy.nn.activations import ACTIVATIONS
from mx_proxy.nn.norms import NORMS
from mx_proxy.numerics import recipe as _recipes
from mx_proxy.numerics.formats import FORMATS
from mx_proxy.numerics.operands import OPERAND_INFO
from mx_proxy.numerics.scale_rules import RULES

__all__ = ["LISTINGS", "KINDS", "markdown", "plain", "add_list_command"]

# kind -> (registry, (header, attribute) columns between the name and the doc line)
LISTINGS = {
    "acts": (ACTIVATIONS, (("gated", "gated"),)),
    "norms": (NORMS, (("parameters", "param_names"), ("in figures", "label"))),
    "scale-rules": (RULES, (("Pallas kernels", "kernels"), ("elements", "elements"))),
    "formats": (FORMATS, (("bits", "bits"), ("emax", "emax"), ("max normal", "max_normal"))),
    "operands": (OPERAND_INFO, (("GEMM", "gemm"), ("tensor", "tensor"), ("block axis", "axis"))),
}
KINDS = tuple(LISTINGS) + ("recipes",)


def markdown(kind: str) -> str:
    """The Markdown table of ``kind`` (the docs embed it between ``<!-- mx-proxy list KIND -->`` and
    ``<!-- end of list -->``)."""
    if kind == "recipes":
        return _recipes.table()
    registry, columns = LISTINGS[kind]
    return registry.table(columns)


def plain(kind: str) -> str:
    """``kind`` as aligned text: one line per entry, its name first."""
    if kind == "recipes":
        rows = [[n, _recipes.description(n)] for n in _recipes.names()]
        headers = ["name", "what"]
    else:
        registry, columns = LISTINGS[kind]
        rows, headers = registry.rows(columns), ["name", *(h for h, _ in columns), "what"]
    widths = [max(len(r[i]) for r in rows + [headers]) for i in range(len(headers) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:-1], widths)) + "  " + r[-1] for r in [headers, *rows])


def _list(args) -> int:
    print(markdown(args.kind) if args.markdown else plain(args.kind))
    return 0


def add_list_command(sub) -> argparse.ArgumentParser:
    """``mx-proxy list KIND [--markdown]``."""
    p = sub.add_parser("list", help="list the activations, norms, scale rules, formats, operands or recipes",
                       description="Print the entries of one registry, each with its one-line description: what "
                                   "Config fields, --options and recipes accept. Kinds: "
                                   + "; ".join(f"{k}: {LISTINGS[k][0].what}" for k in LISTINGS)
                                   + "; recipes: the precision presets.")
    p.add_argument("kind", choices=KINDS, metavar="KIND", help=f"one of: {', '.join(KINDS)}")
    p.add_argument("--markdown", action="store_true", help="a Markdown table (as the docs embed it)")
    p.set_defaults(func=_list)
    return p
