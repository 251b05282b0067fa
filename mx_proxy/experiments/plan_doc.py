"""``docs/plan.md``'s tables, computed from the plan (``python -m mx_proxy.experiments.plan_doc --update FILE``).

The power of each primary test at the plan's members and each study's cost (:mod:`mx_proxy.experiments.plan`),
as the Markdown between :data:`BLOCK_BEGIN` and :data:`BLOCK_END`; a test keeps ``docs/plan.md`` equal to it.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from mx_proxy.experiments import plan as _plan
from mx_proxy.store import durable

__all__ = ["tables_markdown", "with_tables", "main", "BLOCK_BEGIN", "BLOCK_END"]


BLOCK_BEGIN = "<!-- mx-proxy plan tables -->"
BLOCK_END = "<!-- end of plan tables -->"


def _f(x, digits=2) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def tables_markdown(plan: _plan.Plan) -> str:
    """The power and cost tables of ``docs/plan.md`` (between :data:`BLOCK_BEGIN` and :data:`BLOCK_END`),
    computed from the plan."""
    pw = _plan.power_table(plan)
    lines = ["Power of each primary test at the plan's members (power "
             f"{plan.power:.0%}; outcomes independent within a pair, the conservative case; `holm_first`: "
             f"α = {plan.alpha}/{len(plan.hypotheses)}, Holm's strictest step):", "",
             "| hypothesis | primary test | pairs (H3: members) | level | control rate | detectable above "
             "| detectable below |",
             "|---|---|---:|---|---:|---:|---:|"]
    for r in pw.itertuples():
        lines.append(f"| {r.hypothesis} | {r.test} | {r.pairs} | {r.level} (α = {r.alpha:.4g}) | "
                     f"{_f(r.control_rate)} | {_f(r.detectable_above, 3)} | {_f(r.detectable_below, 3)} |")
    lines += ["", "H3's rows: the smallest AUC detectable from 20 blown-up and 20 stable members.", "",
              "Cost (every member trained to its horizon; a member may stop at its first blow-up, so this is the "
              "most), one arm at a time:", "",
              "| order | study | machine | arms | members per arm | units | member-steps | minutes at today's rate "
              "| minutes at the target rate |", "|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for i, r in enumerate(_plan.cost_table(plan).itertuples(), 1):
        lines.append(f"| {i} | `{r.study}` | {r.machine} | {r.arms} | {r.members} | {r.units} | "
                     f"{r.member_steps:,} | {r.minutes_today:,.0f} | {r.minutes_target:,.0f} |")
    return "\n".join(lines)


def with_tables(text: str, plan: _plan.Plan) -> str:
    """``text`` (``docs/plan.md``) with the block between :data:`BLOCK_BEGIN` and :data:`BLOCK_END` replaced by
    :func:`tables_markdown`; a ValueError where the markers are not there once each, in order."""
    if text.count(BLOCK_BEGIN) != 1 or text.count(BLOCK_END) != 1 or text.index(BLOCK_BEGIN) > text.index(BLOCK_END):
        raise ValueError(f"the text needs the lines {BLOCK_BEGIN!r} and {BLOCK_END!r}, once each, in that order")
    head, rest = text.split(BLOCK_BEGIN)
    _, tail = rest.split(BLOCK_END)
    return f"{head}{BLOCK_BEGIN}\n{tables_markdown(plan)}\n{BLOCK_END}{tail}"


def main(argv: list[str] | None = None) -> int:
    """``python -m mx_proxy.experiments.plan_doc [--plan FILE] [--update MARKDOWN]``: print the plan's tables, or
    rewrite them in MARKDOWN's block (``docs/plan.md``)."""
    p = argparse.ArgumentParser(prog="python -m mx_proxy.experiments.plan_doc", description=main.__doc__)
    p.add_argument("--plan", default=None)
    p.add_argument("--update", default=None)
    a = p.parse_args(argv)
    try:
        plan = _plan.load(a.plan)
        if a.update is None:
            print(tables_markdown(plan))
            return 0
        path = Path(a.update)
        text = path.read_text()
        new = with_tables(text, plan)
    except (ValueError, OSError) as e:
        print(f"plan: {e}", file=sys.stderr)
        return 2
    if new != text:
        durable.atomic_write(path, lambda q: Path(q).write_text(new))
    print(f"{path}: {'updated' if new != text else 'already up to date'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
