"""The plan's effects figure: each registered comparison's difference of rates with its 95 % bootstrap interval,
forest style (:func:`mx_proxy.experiments.plan_report.compute`'s report in, a Figure out)."""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt

__all__ = ["plan_effects", "TITLE_WIDTH", "LABEL_WIDTH"]

TITLE_WIDTH = 80
"""Characters per line of the title (wrapped, never cut off at the figure's edge)."""
LABEL_WIDTH = 48
"""Characters per line of a test's label."""

_FAMILY = {"primary": "#D55E00", "secondary": "#0072B2"}


def _label(t: dict) -> str:
    pairs = f"{t['pairs']}/{t['planned_pairs']} {'members' if t['kind'] == 'auc' else 'pairs'}"
    tag = f"{t['hypothesis']} {t['family']}" + (", interim" if t["interim"] else "")
    return textwrap.fill(f"{tag}: {t['test']} ({pairs})", LABEL_WIDTH)


def _forest(ax, rows: list[dict], null: float, xlabel: str) -> None:
    for y, t in enumerate(rows):
        c = _FAMILY[t["family"]]
        low = t["estimate"] if t["low"] is None else t["low"]
        high = t["estimate"] if t["high"] is None else t["high"]
        ax.errorbar(t["estimate"], y, xerr=[[t["estimate"] - low], [high - t["estimate"]]], fmt="o", color=c,
                    capsize=4, lw=1.6, mfc="white" if t["interim"] else c)
        p = "–" if t["pvalue"] is None else f"{t['pvalue']:.2g}"
        ax.annotate(f"p {p}", (high, y), xytext=(6, 0), textcoords="offset points", va="center", fontsize=7)
    lo = min([null] + [t["estimate"] if t["low"] is None else t["low"] for t in rows])
    hi = max([null] + [t["estimate"] if t["high"] is None else t["high"] for t in rows])
    pad = 0.05 + 0.1 * (hi - lo)
    if null == 0.5:  # an AUC: its whole range, and room for the p
        lo, hi, pad = 0.0, 1.0, 0.05
    ax.set_xlim(lo - pad, hi + 2.5 * pad)  # room for the p beside the rightmost interval
    ax.axvline(null, color="0.4", lw=1, ls="--")
    ax.set_yticks(range(len(rows)), [_label(t) for t in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.grid(axis="x", alpha=0.3)


def plan_effects(report: dict, title: str | None = None):
    """One row per registered test with pairs so far: its estimate (a difference of rates, paired by seed; H3: the
    AUC) with its 95 % bootstrap interval, the null (0, or ½ for an AUC) dashed, primary tests orange and secondary
    blue, an interim test's marker hollow; the p beside each. Without any such test, a figure saying so."""
    rows = [t for t in report["tests"] if t["pairs"] and t["estimate"] is not None]
    diffs = [t for t in rows if t["kind"] != "auc"]
    aucs = [t for t in rows if t["kind"] == "auc"]
    title = title or (f"Plan {report['plan']}: the registered comparisons so far (difference of rates, 95 % "
                      f"bootstrap interval over seeds; hollow: interim, before the study has all its members)")
    panels = [(d, n, x) for d, n, x in ((diffs, 0.0, "difference of blow-up rates (arm a − arm b), paired by seed"),
                                        (aucs, 0.5, "AUC of the warning signal (blown-up vs stable members)")) if d]
    if not panels:
        fig, ax = plt.subplots(figsize=(7.5, 2.0), layout="constrained")
        ax.axis("off")
        ax.text(0.5, 0.5, textwrap.fill(f"No registered test of plan {report['plan']} has pairs yet "
                                         f"(members under {report['folder']}).", 70),
                ha="center", va="center", fontsize=9)
        ax.set_title(textwrap.fill(title, TITLE_WIDTH), fontsize=9)
        return fig
    heights = [len(d) for d, _, _ in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9.0, 0.5 * sum(heights) + 1.2 * len(panels) + 0.6),
                             gridspec_kw={"height_ratios": heights}, layout="constrained", squeeze=False)
    for ax, (d, null, xlabel) in zip(axes[:, 0], panels):
        _forest(ax, d, null, xlabel)
    fig.suptitle(textwrap.fill(title, TITLE_WIDTH), fontsize=9)
    return fig
