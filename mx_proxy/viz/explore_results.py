"""What the explorer shows of its runs: the figure's panels, the results table, its sentences, the status line."""

from __future__ import annotations

import os

import pandas as pd

from mx_proxy.numerics.recipe import PRESETS, Recipe
from mx_proxy.viz import plots
from mx_proxy.viz.explore_controls import markdown_html
from mx_proxy.viz.plots.quantization import worst_operand

__all__ = ["PANELS", "QUANT_PANELS", "TABLE_COLUMNS", "REFERENCE", "panels", "draw_panel", "legend", "table",
           "conclusions", "summary_html", "results_html", "recipe_defaults"]

# (metrics column, axis label, y scale): the figure's panels, in order
PANELS = (("loss", "training loss", "log"), ("zeta_bound", "‖ζ‖ bound (vs FP32 at the same weights)", "linear"),
          ("cosine", "cosine(g_MX, g_FP32)", "linear"), ("ln_clamp_frac", "LN gains clamped (fraction)", "linear"))
_WORST = "worst:"  # a panel of worst_operand(metrics, STAT) over the GEMM operands' quant/ columns
# added below them when the runs record quantization statistics (Config.quant_stats)
QUANT_PANELS = ((_WORST + "snr_db", "lowest SNR of a GEMM operand [dB]", "linear"),
                (_WORST + "underflow_frac", "highest underflow of a GEMM operand (fraction)", "linear"))


def panels(config) -> tuple:
    """The figure's panels for runs like ``config``: :data:`PANELS`, and with
    ``quant_stats`` the worst operand's SNR and underflow too (:data:`QUANT_PANELS`)."""
    return PANELS + QUANT_PANELS if config.quant_stats else PANELS


def _column(run, col: str):
    """Column ``col`` of the run's metrics (``worst:STAT``: derived, :func:`worst_operand`), or None."""
    if col.startswith(_WORST):
        return worst_operand(run.metrics, col[len(_WORST):])
    return run.metrics[col] if col in run.metrics else None
# the columns of Explorer.table, after the recipe (its index)
TABLE_COLUMNS = ("final_loss", "vs_fp32", "zeta_median", "cosine_min", "ln_clamp_max", "diverged_at")
REFERENCE = "fp32"


def draw_panel(ax, shown: dict, col: str, label: str, scale: str) -> None:
    """One panel: column ``col`` of every run in ``shown`` (name → Run); FP32
    has no ‖ζ‖ or cosine to show (exactly 0 and 1 against itself), a norm
    without gains gets a note instead of a clamp curve. No legend: the
    figure has one, below its panels (:func:`legend`)."""
    ax.clear()
    ax.set_title(label, fontsize=10)
    ax.set_xlabel("step")
    ax.set_yscale(scale)
    drawn = 0
    for name, run in shown.items():
        values = _column(run, col)
        if values is None or (name == REFERENCE and col in ("zeta_bound", "cosine")):
            continue
        ok = values.notna().to_numpy()
        if not ok.any():
            continue
        ax.plot(run.metrics["step"][ok], values[ok], lw=0.9, color=plots.color(name), label=name)
        if run.diverged_at is not None:
            ax.axvline(run.diverged_at, color=plots.color(name), ls=":", lw=1)
        drawn += 1
    if not drawn and col == "ln_clamp_frac" and shown:
        norm = next(iter(shown.values())).config.norm
        ax.text(0.5, 0.5, f"no LN gains to clamp (norm={norm})", ha="center", va="center",
                transform=ax.transAxes, fontsize=9, color="0.4")


def legend(figure) -> None:
    """One legend for all panels, below them (never over a curve): each run once."""
    for old in list(figure.legends):
        old.remove()
    seen = {}
    for ax in figure.axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    if seen:
        figure.legend(list(seen.values()), list(seen), loc="outside lower center", ncol=min(len(seen), 6),
                      fontsize=8, frameon=False)


def table(runs) -> pd.DataFrame:
    """One row per run, indexed by recipe: final loss, its ratio to FP32's,
    median ‖ζ‖ bound, minimum cosine, maximum LN clamp fraction (NaN where a
    metric was not measured, e.g. no LN gains), first diverged step (NaN if
    stable). Empty (with these columns) for no runs."""
    runs = list(runs)
    ref = next((r for r in runs if r.config.recipe.name == REFERENCE), None)

    def stat(m, col, how) -> float:
        return float(getattr(m[col].dropna(), how)()) if col in m and m[col].notna().any() else float("nan")

    rows = []
    for r in runs:
        m = r.metrics
        rows.append(dict(recipe=r.config.recipe.name, final_loss=r.final_loss,
                         vs_fp32=r.final_loss / ref.final_loss if ref is not None else float("nan"),
                         zeta_median=stat(m, "zeta_bound", "median"), cosine_min=stat(m, "cosine", "min"),
                         ln_clamp_max=stat(m, "ln_clamp_frac", "max"),
                         diverged_at=float("nan") if r.diverged_at is None else float(r.diverged_at)))
    return pd.DataFrame(rows, columns=("recipe",) + TABLE_COLUMNS).set_index("recipe")


def conclusions(runs) -> str:
    """Markdown: the settings of ``runs`` and one sentence per MX run, computed from :func:`table`."""
    runs = list(runs)
    if not runs:
        return "Nothing trained yet: press **Train** (or call `panel.train()`)."
    t = table(runs)
    c = runs[0].config
    lines = [f"Width {c.width}, depth {c.depth}, activation {c.act}, norm {c.norm}, LR {c.lr:g}, seed {c.seed}, "
             f"{c.steps} steps:"]
    for name, row in t.drop(index=REFERENCE, errors="ignore").iterrows():
        fate = f"diverged at step {row.diverged_at:.0f}" if pd.notna(row.diverged_at) else "stayed stable"
        clamp = ("no LN gains to clamp" if pd.isna(row.ln_clamp_max)
                 else f"at most {100 * row.ln_clamp_max:.0f}% of the LN gains clamped")
        lines.append(f"- **{name}** {fate}; its final loss is {row.vs_fp32:.3g}× FP32's, its median ‖ζ‖ bound "
                     f"{row.zeta_median:.3g} (minimum cosine {row.cosine_min:.3g}), {clamp}.")
    return "\n".join(lines)


def results_html(runs) -> str:
    """:func:`table` and :func:`conclusions` of ``runs`` as HTML ("" for no runs)."""
    runs = list(runs)
    if not runs:
        return ""
    t = table(runs).reset_index()
    cell = "padding:2px 10px;border-bottom:1px solid #ccc;text-align:right"
    head = "".join(f"<th style='{cell}'>{c}</th>" for c in t.columns)
    rows = "".join("<tr>" + "".join(f"<td style='{cell}'>"
                                    f"{v if isinstance(v, str) else '—' if pd.isna(v) else f'{v:.4g}'}"
                                    "</td>" for v in row) + "</tr>" for row in t.itertuples(index=False))
    return (f"<table style='border-collapse:collapse;margin:4px 0'><tr>{head}</tr>{rows}</table>"
            + markdown_html(conclusions(runs)))


def summary_html(runs, store) -> str:
    """One HTML line per run: final loss, median ‖ζ‖ bound, divergence, where it is stored."""
    rows = []
    for r in runs:
        m = r.metrics
        zeta = m["zeta_bound"].median() if "zeta_bound" in m else float("nan")
        fate = f"diverged at {r.diverged_at}" if r.diverged_at is not None else "stable"
        # the store as it was given (e.g. "../runs"), not this machine's absolute path: the line is saved
        # with a notebook's widget state
        where = (f" — {os.path.join(os.fspath(store), os.path.basename(os.fspath(r.path)))}"
                 if r.path and store is not None else f" — {r.path}" if r.path else "")
        rows.append(f"<b>{r.config.recipe.name}</b>: final loss {r.final_loss:.4g}, median ‖ζ‖ bound "
                    f"{zeta:.3g}, {fate}{where}")
    return "<br>".join(rows)


def recipe_defaults(recipe) -> tuple[tuple[str, ...], dict[str, Recipe]]:
    """(selected names, extra recipes) for a ``recipe`` default: a preset
    name, a :class:`Recipe`, or a sequence of them; FP32 is never selected
    (it always trains)."""
    items = [recipe] if isinstance(recipe, (str, Recipe)) else list(recipe)
    names, extra = [], {}
    for item in items:
        if isinstance(item, Recipe):
            if item.name in PRESETS and PRESETS[item.name] != item:
                raise ValueError(f"recipe {item.name!r} differs from the preset of that name; give it another name "
                                 f"(recipe.replace(name=...))")
            if item.name not in PRESETS:
                extra[item.name] = item
            name = item.name
        elif isinstance(item, str):
            if item not in PRESETS:
                raise ValueError(f"unknown recipe {item!r}; valid: {', '.join(PRESETS)}")
            name = item
        else:
            raise ValueError(f"recipe must be a preset name, a mxp.Recipe or a sequence of them, got {item!r}")
        if name != REFERENCE and name not in names:
            names.append(name)
    return tuple(names), extra
