"""``mx-proxy report``: a campaign results folder written out as the README's headline (Markdown).

:func:`markdown` turns the exported runs of one results folder
(:func:`mx_proxy.experiments.campaign.load_results`) into a table, one row
per paired run and control, the facts under it (loss jumps, the LN gains'
drift into E4M3's clamp band [0.875, 1), the steps before any divergence)
and, where the campaign ran them, a table of the interventions. Every
number is computed here from the metrics (:func:`analysis.headline`,
:func:`analysis.gain_drift`): the README's headline blocks are this
function's output, and ``tests/experiments/test_report.py`` regenerates them
from the committed results and compares.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

from mx_proxy.experiments import analysis, campaign
from mx_proxy.training.result import Run

__all__ = ["markdown", "for_folder", "blocks", "update", "BEGIN", "END"]

BEGIN = "<!-- mx-proxy report {} -->"
END = "<!-- end of report -->"

_NOTES = {"paper_e4m3": "the authors' code, E4M3 everywhere", "mxfp8_e4m3": "LN gains really MX-quantized"}


def _num(v: float) -> str:
    """``v`` to 2 decimals below 10, 1 below 100, a whole number above; ``−`` as the minus sign."""
    if v is None or not math.isfinite(v):
        return "–"
    return f"{v:.{2 if abs(v) < 10 else 1 if abs(v) < 100 else 0}f}".replace("-", "−")


def _pct(v: float) -> str:
    return "–" if not math.isfinite(v) else f"{v:+.2f} %".replace("-", "−")


def _name(r: Run) -> str:
    c = r.config
    if r.info.get("kind") == "control":
        other = f" with seed {c.reference_seed}" if c.reference_seed not in (None, c.seed) else ""
        return f"control: `{c.recipe.name}` against `{c.reference_recipe.name}`{other}"
    note = _NOTES.get(c.recipe.name)
    return f"`{c.recipe.name}`" + (f" ({note})" if note else "")


def _diverged(r: Run, h: dict) -> str:
    if r.diverged_at is not None:
        return f"at step {r.diverged_at}"
    return "no" if h["blowup_at"] is None else f"no (10× blow-up at step {h['blowup_at']})"


def _steps(v) -> str:
    return "never" if v is None or v != v else str(int(v))


def _row(r: Run, h: dict, drift) -> str:
    counted = " (counted)" if r.config.recipe.ln_affine is None else ""
    same = "0 (nothing quantized)" if h["zeta_max"] == 0 else f"{_num(h['zeta_median'])} / {_num(h['zeta_max'])}"
    gains = " / ".join(f"{v:.3f}" for v in drift["last"]) if len(drift) else "–"
    first = drift.dropna(subset=["half_clamped_at"]).sort_values("half_clamped_at").head(1)
    onset = (f"block {int(first['block'].iloc[0])}: {_steps(first['half_clamped_at'].iloc[0])} / "
             f"{_steps(first['all_clamped_at'].iloc[0])}") if len(first) else "never"
    return (f"| {_name(r)} | {_diverged(r, h)} | {_pct(h['vs_fp32_pct'])} | {same} | "
            f"{_num(h['zeta_paper_median'])} / {_num(h['zeta_paper_max'])} | "
            f"{100 * h['ln_clamp_max']:.0f} %{counted} | {gains} ({int(drift['in_band'].sum())} of {len(drift)}) | "
            f"{onset} |")


def _facts(r: Run, h: dict, drift) -> str:
    s = (f"- {_name(r)}: largest loss jump {h['max_jump']:.1f}× its minimum over the previous "
         f"{analysis.blowup_window(r)} steps (step {h['max_jump_at']}); from step 1000 on, at most {h['fp32_ratio_max']:.2f}× the FP32 run's loss (step "
         f"{h['fp32_ratio_max_at']}); the paper's ζ peaked at step {h['zeta_paper_max_at']}")
    if len(drift):
        s += (f"; LN gain means of blocks 0–{len(drift) - 1} went from "
              f"{' / '.join(f'{v:.3f}' for v in drift['first'])} (first 250 steps) to "
              f"{' / '.join(f'{v:.3f}' for v in drift['last'])} (last 250)")
    if r.diverged_at is not None:
        s += (f"; over the 500 steps before its divergence the same-point ‖ζ‖ bound had median "
              f"{_num(h['zeta_before'])} (max {_num(h['zeta_before_max'])}) and the paper's ζ median "
              f"{_num(h['zeta_paper_before'])} (max {_num(h['zeta_paper_before_max'])})")
    return s + "."


def _order(r: Run) -> tuple:
    known = tuple(_NOTES)
    name = r.config.recipe.name
    return ({"paired": 0, "control": 1}.get(r.info.get("kind"), 2), r.config.width, r.config.seed,
            known.index(name) if name in known else len(known), r.info.get("label", ""))


def markdown(runs: list[Run], source: str | None = None) -> str:
    """The headline of one campaign's results as Markdown: a header line (the
    setting), a table of its paired runs and controls, one line of facts per
    run, and the interventions (if any). ``source``: the folder named in the
    header. Columns: diverged (the engine's stop, or a 10× blow-up over the
    recent minimum); mean loss over the last 100 steps against the FP32 run's
    over the same steps; the same-point ‖ζ‖ bound and the paper's ζ (median /
    max over the diagnostic steps before any divergence); the largest
    fraction of all LN gains clamped (``counted``: the recipe leaves them
    unquantized); the blocks' mean LN gain over the last 250 steps and how
    many lie in [0.875, 1); the first block whose gains were more than half
    clamped, at which step, and when all of them first were."""
    main = sorted((r for r in runs if r.info.get("kind") in ("paired", "control")), key=_order)
    if not main:
        raise ValueError(f"no paired or control runs in {source or 'these results'}; kinds present: "
                         f"{sorted({r.info.get('kind') for r in runs})}")
    c = main[0].config
    widths = sorted({r.config.width for r in main})
    steps = sorted({r.config.steps for r in main})
    seeds = sorted({r.config.seed for r in main})
    lines = [f"Width {' / '.join(map(str, widths))}, depth {c.depth}, batch {c.batch}, {c.optimizer.capitalize()} "
             f"LR {campaign.lr_label(c.lr)}, {' / '.join(map(str, steps))} steps, seed{'s' if len(seeds) > 1 else ''} "
             f"{', '.join(map(str, seeds))}; each MX run trained with its FP32 run alongside"
             + (f" ({source})" if source else "") + ":", ""]
    lines += ["| run | diverged | loss vs FP32, last 100 steps | same-point ‖ζ‖ median / max | paper's ζ median / max "
              "| LN gains clamped, max | LN gain means, last 250 steps (in [0.875, 1)) | LN gains > ½ / all clamped "
              "from step |", "|---|---|---|---|---|---|---|---|"]
    facts = []
    for r in main:
        h, drift = analysis.headline(r), analysis.gain_drift(r)
        lines.append(_row(r, h, drift))
        facts.append(_facts(r, h, drift))
    lines += [""] + facts
    children = sorted((r for r in runs if r.info.get("kind") == "intervention"),
                      key=lambda r: ((r.info.get("intervention") or {}).get("at_step") or 0, r.info.get("label", "")))
    if children:
        lines += ["", "| intervention | from step | diverged | final loss |", "|---|---|---|---|"]
        for r in children:
            iv = r.info.get("intervention") or {}
            what = "+".join(iv.get("apply") or []) or r.config.recipe.name
            lines.append(f"| `{what}` on `{r.info.get('label', '')}` | {iv.get('at_step', '–')} | "
                         f"{'at step ' + str(r.diverged_at) if r.diverged_at is not None else 'no'} | "
                         f"{r.final_loss:.4g} |")
    return "\n".join(lines) + "\n"


def _block_pattern() -> re.Pattern:
    head, tail = (re.escape(part) for part in BEGIN.split("{}"))
    return re.compile(rf"^{head}(\S+){tail}\n(.*?)^{re.escape(END)}$", re.M | re.S)


def blocks(text: str) -> list[tuple[str, str]]:
    """The report blocks of a Markdown text: ``(results folder, body)`` for
    each ``BEGIN`` line (naming the folder) and the next ``END`` line, each
    marker a line of its own; the body is what lies between them."""
    return [(m.group(1), m.group(2).strip("\n") + "\n") for m in _block_pattern().finditer(text)]


def for_folder(results: str | os.PathLike) -> str:
    """:func:`markdown` of the results folder ``results``, naming it."""
    path = Path(results)
    if not (path / "index.csv").exists() and not any(path.glob("*/run.json")):
        raise ValueError(f"no campaign results in {str(results)!r} (no */run.json); a campaign exports them to "
                         f"OUT/results")
    return markdown(campaign.load_results(path), source=str(results))


def update(path: str | os.PathLike) -> bool:
    """Rewrite every report block of the Markdown file ``path`` from its
    results folder (relative to the current directory); returns whether the
    file changed."""
    path = Path(path)
    old = path.read_text()
    text = _block_pattern().sub(lambda m: f"{BEGIN.format(m.group(1))}\n{for_folder(m.group(1))}{END}", old)
    if text != old:
        path.write_text(text)
    return text != old
