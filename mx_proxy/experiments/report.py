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

import numpy as np
import pandas as pd

from mx_proxy.experiments import analysis, campaign, ensemble_report
from mx_proxy.store import durable
from mx_proxy.training.result import Run

__all__ = ["markdown", "for_folder", "for_block", "blocks", "update", "BEGIN", "END"]

BEGIN = "<!-- mx-proxy report {} -->"
END = "<!-- end of report -->"

_NOTES = {"paper_e4m3": "the authors' code, E4M3 everywhere", "mxfp8_e4m3": "LN gains really MX-quantized"}


def _num(v: float, sign: str = "") -> str:
    """``v`` to 2 decimals below 10, 1 below 100, a whole number above (``sign="+"``: always signed); ``−`` as
    the minus sign, ``–`` for a missing value."""
    if v is None or not math.isfinite(v):
        return "–"
    return f"{v:{sign}.{2 if abs(v) < 10 else 1 if abs(v) < 100 else 0}f}".replace("-", "−")


def _pct(v: float) -> str:
    return "–" if not math.isfinite(v) else f"{_num(v, '+')} %"


def _whole_pct(v: float) -> str:
    """A fraction as a whole percentage, ``–`` where there is none (a run that records no LN clamping)."""
    return "–" if v is None or not math.isfinite(v) else f"{100 * v:.0f} %"


def _name(r: Run, seeds: bool = False) -> str:
    """How a row names its run; ``seeds``: the folder holds several seeds, so the run's seed is said too."""
    c = r.config
    seed = f", seed {c.seed}" if seeds else ""
    if r.info.get("kind") == "control":
        other = f" with seed {c.reference_seed}" if c.reference_seed not in (None, c.seed) else ""
        return f"control{seed}: `{c.recipe.name}` against `{c.reference_recipe.name}`{other}"
    note = _NOTES.get(c.recipe.name)
    return f"`{c.recipe.name}`" + (f" ({note}{seed})" if note else f" ({seed[2:]})" if seeds else "")


def _diverged(r: Run, h: dict) -> str:
    """The engine's divergence (non-finite loss or a one-step spike), with a blow-up before it, else a blow-up,
    else ``no``."""
    if r.diverged_at is not None:
        early = h["blowup_at"] is not None and h["blowup_at"] < r.diverged_at
        return (f"**blew up at step {h['blowup_at']}**, diverged at step {r.diverged_at}" if early
                else f"diverged at step {r.diverged_at}")
    if h["blowup_at"] is not None:
        return f"**blew up at step {h['blowup_at']}** (loss up to {h['loss_max']:.3g} at step {h['loss_max_at']})"
    return "no"


def _steps(v) -> str:
    return "never" if v is None or pd.isna(v) else str(int(v))


def _row(r: Run, h: dict, drift, seeds: bool = False) -> str:
    counted = " (counted)" if r.config.recipe.ln_affine is None else ""
    same = "0 (nothing quantized)" if h["zeta_max"] == 0 else f"{_num(h['zeta_median'])} / {_num(h['zeta_max'])}"
    gains = " / ".join(f"{v:.3f}" for v in drift["last"]) if len(drift) else "–"
    full = drift.dropna(subset=["all_clamped_at"]).sort_values("all_clamped_at", kind="stable")
    first = full.head(1) if len(full) else drift.dropna(subset=["half_clamped_at"]).sort_values(
        "half_clamped_at", kind="stable").head(1)
    onset = (f"block {int(first['block'].iloc[0])}: {_steps(first['half_clamped_at'].iloc[0])} / "
             f"{_steps(first['all_clamped_at'].iloc[0])}") if len(first) else "never"
    return (f"| {_name(r, seeds)} | {_diverged(r, h)} | {_pct(h['vs_fp32_pct'])} | {same} | "
            f"{_num(h['zeta_paper_median'])} / {_num(h['zeta_paper_max'])} | "
            f"{_whole_pct(h['ln_clamp_max'])}{counted} | {gains} ({int(drift['in_band'].sum())} of {len(drift)}) | "
            f"{onset} |")


def _facts(r: Run, h: dict, drift, seeds: bool = False) -> str:
    onset = h["unstable_at"]
    w = analysis.blowup_window(r)
    s = f"- {_name(r, seeds)}: "
    if onset is None:
        s += (f"largest loss jump {h['max_jump']:.1f}× its minimum over the previous {w} steps (step "
              f"{h['max_jump_at']})")
        if h["fp32_ratio_max_at"] is not None:  # a run shorter than 1000 steps (or without an FP32 run) has none
            s += (f"; from step 1000 on, at most {h['fp32_ratio_max']:.2f}× the FP32 run's loss (step "
                  f"{h['fp32_ratio_max_at']})")
    else:
        what = (f"diverged at step {onset}" if r.diverged_at is not None else
                f"blew up at step {onset} (loss past 10× its minimum over the previous {w} steps; the engine's "
                f"one-step rule, {r.config.spike_factor:g}× the previous step, never fired, so it trained on)")
        again = h["blowups"][1:] if r.diverged_at is None else []
        if again:
            what += f", and again at step{'s' if len(again) > 1 else ''} {', '.join(map(str, again))}"
        s += (f"{what}; loss peaked at {h['loss_max']:.3g} (step {h['loss_max_at']}), {h['max_jump']:.0f}× its "
              f"recent minimum, and over the last 100 steps it is {_pct(h['vs_fp32_pct'])} against the FP32 run's; "
              f"over the 500 steps before step {onset} the same-point ‖ζ‖ bound had median "
              f"{_num(h['zeta_before'])} (max {_num(h['zeta_before_max'])}) and the paper's ζ median "
              f"{_num(h['zeta_paper_before'])} (max {_num(h['zeta_paper_before_max'])})")
    if h["zeta_paper_max_at"] is not None:
        s += f"; the paper's ζ peaked at step {h['zeta_paper_max_at']}" + (" (before the instability)" if onset else "")
    if len(drift):
        span = "last 250" if onset is None else f"250 before step {onset}"
        s += (f"; LN gain means of blocks 0–{len(drift) - 1} went from "
              f"{' / '.join(f'{v:.3f}' for v in drift['first'])} (first 250 steps) to "
              f"{' / '.join(f'{v:.3f}' for v in drift['last'])} ({span})")
    return s + "."


def _intervention_row(r: Run, parent: Run | None) -> str:
    iv = r.info.get("intervention") or {}
    at = iv.get("at_step")
    what = "+".join(iv.get("apply") or []) or r.config.recipe.name
    h = analysis.headline(r)
    after = r.metrics[r.metrics["step"] >= (at or 0)]
    fin = after[np.isfinite(after["loss"].to_numpy(dtype=float))]
    onset = analysis.unstable_after(r, at or 0, h)  # not one the child inherited from its parent
    status = ("no" if onset is None else
              f"diverged at step {onset}" if onset == r.diverged_at else f"blew up at step {onset}")
    of = f"`{parent.config.recipe.name}`" if parent is not None else f"`{r.info.get('parent', '?')}`"
    return (f"| `{what}` on {of} | {at if at is not None else '–'} → {int(r.metrics['step'].iloc[-1]) + 1} | "
            f"{status} | {fin['loss'].max():.3g} | {h['loss']:.3g} |")


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
    many lie in [0.875, 1) (of an unstable run: the 250 steps before it
    became unstable); the first block whose gains were all clamped (or, if
    none ever was, more than half), the step at which more than half of them
    first were and the step at which all of them first were."""
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
    lines += ["| run | diverged / blew up | loss vs FP32, last 100 steps | same-point ‖ζ‖ median / max "
              "| paper's ζ median / max "
              "| LN gains clamped, max | LN gain means, last 250 stable steps (in [0.875, 1)) "
              "| first block all clamped: "
              "> ½ / all from step |", "|---|---|---|---|---|---|---|---|"]
    facts = []
    for r in main:
        h, drift = analysis.headline(r), analysis.gain_drift(r)
        lines.append(_row(r, h, drift, len(seeds) > 1))
        facts.append(_facts(r, h, drift, len(seeds) > 1))
    lines += [""] + facts
    children = sorted((r for r in runs if r.info.get("kind") == "intervention"),
                      key=lambda r: ((r.info.get("intervention") or {}).get("at_step") or 0, r.info.get("label", "")))
    if children:
        by_key = {r.info.get("key"): r for r in main}
        lines += ["", "Continued from the checkpoint at the first step shown, with one intervention each (Fig. 7):",
                  "", "| intervention | steps | diverged / blew up | largest loss after the intervention "
                      "| mean loss, last 100 steps |", "|---|---|---|---|---|"]
        for r in children:
            lines.append(_intervention_row(r, by_key.get(r.info.get("parent"))))
        lines += _replay_notes(children)
    return "\n".join(lines) + "\n"


def _replay_notes(children: list[Run]) -> list[str]:
    """One sentence per intervention step whose state was replayed (no
    checkpoint was kept there; ``mxp.with_checkpoint``): from where, and
    whether the replayed losses were the parent's bit for bit."""
    notes = {}
    for r in children:
        iv = r.info.get("intervention") or {}
        rp = iv.get("replay")
        if rp:
            same = ("its losses equal the run's bit for bit" if rp.get("identical") else
                    f"its losses differ from the run's from step {rp.get('first_difference')}, so these "
                    f"continue the replayed trajectory")
            notes[iv.get("at_step")] = (f"No checkpoint was kept at step {iv.get('at_step')}: the state there was "
                                        f"replayed from step {rp.get('from_step')}"
                                        f"{'' if rp.get('paired_run') else ' without the FP32 run'}; {same}.")
    return ["", *(notes[t] for t in sorted(notes))] if notes else []


_ARGUMENTS = r"\S+(?: [^\s-]\S*)*(?: --only(?: [a-z_]+)+)?(?: --control \S+)?"
_MARKER = re.compile(r"\s*<!--\s*(?:mx-proxy\s+report|end\s+of\s+report)\b")  # what a marker looks like


def _begin() -> re.Pattern:
    head, tail = (re.escape(part) for part in BEGIN.split("{}"))
    return re.compile(rf"{head}({_ARGUMENTS}){tail}")


def _parse(text: str, where: str) -> tuple[list[str], list[tuple[int, int, str]]]:
    """The lines of ``text`` (each with its own line ending) and its blocks, ``(begin line, end line,
    arguments)`` (0-based); a ValueError naming the line (1-based, in ``where``) of a line that looks like a
    marker and does not parse, of a begin marker without an end marker, or of an end marker without a begin."""
    lines, found, begun = text.splitlines(keepends=True), [], None
    form = f"a block is a line `{BEGIN.format('FOLDER [--only PART …] [--control ARM]')}`, the report, and a " \
           f"line `{END}`"
    for n, line in enumerate(lines):
        bare = line.rstrip("\r\n")
        m = _begin().fullmatch(bare)
        if m or bare == END:
            if (begun is None) == (bare == END) or (m and begun is not None):
                at = begun[0] if begun is not None else n
                what = "an end marker without a begin marker" if begun is None else \
                    f"a begin marker without an end marker before line {n + 1}"
                raise ValueError(f"{where}:{at + 1}: {what} ({form})")
            if m:
                begun = (n, m.group(1))
            else:
                found.append((begun[0], n, begun[1]))
                begun = None
        elif _MARKER.match(bare):
            raise ValueError(f"{where}:{n + 1}: a report marker that does not parse: {bare!r} ({form})")
    if begun is not None:
        raise ValueError(f"{where}:{begun[0] + 1}: a begin marker without an end marker ({form})")
    return lines, found


def blocks(text: str, where: str = "the text") -> list[tuple[str, str]]:
    """The report blocks of a Markdown text: ``(arguments, body)`` for each
    ``BEGIN`` line and the next ``END`` line, each marker a line of its own.
    The arguments are those of ``mx-proxy report`` that print the block: a
    results folder (or several ensembles' folders, pooled), for an ensemble's
    optionally ``--only PART …`` and ``--control ARM`` (:func:`for_block`);
    the body is what lies between the markers (``\n`` line endings). A line
    that looks like a marker but does not parse, and a marker without its
    partner, are a ValueError naming the line (in ``where``)."""
    lines, found = _parse(text, where)
    return [(args, "".join(lines[b + 1:e]).replace("\r\n", "\n").strip("\n") + "\n") for b, e, args in found]


def for_block(arguments: str) -> str:
    """The report a block's ``arguments`` (``FOLDER …``, then optionally ``--only PART …`` and ``--control ARM``)
    name, as ``mx-proxy report`` with those arguments prints it."""
    words = arguments.split()
    at = next((i for i, w in enumerate(words) if w.startswith("--")), len(words))
    folders, rest = words[:at], words[at:]
    control = None
    if "--control" in rest:
        at = rest.index("--control")
        control, rest = rest[at + 1], rest[:at]
    return for_folder(folders, parts=rest[1:] if rest else None, control=control)


def for_folder(results, parts=None, control: str | None = None) -> str:
    """:func:`markdown` of the results folder ``results``, naming it (an
    ensemble's folder: :func:`mx_proxy.experiments.ensemble_report.for_folder`,
    its sections ``parts``, default all, its paired tests against the arm
    ``control``, default the first; a campaign's report has neither).
    ``results`` may be a list of ensembles' folders, reported pooled as one
    (:mod:`mx_proxy.experiments.ensemble_pool`)."""
    if not isinstance(results, (str, os.PathLike)):
        folders = list(results)
        if len(folders) != 1:
            if not folders:
                raise ValueError("no results folder given")
            bad = [str(f) for f in folders if not ensemble_report.is_ensemble(f)]
            if bad:
                raise ValueError(f"only ensembles' results pool into one report; not an ensemble's results folder "
                                 f"(no ensemble.json): {', '.join(map(repr, bad))}")
            return ensemble_report.for_folder(folders, ensemble_report.PARTS if parts is None else parts, control)
        results = folders[0]
    path = Path(results)
    if ensemble_report.is_ensemble(path):
        return ensemble_report.for_folder(path, ensemble_report.PARTS if parts is None else parts, control)
    if parts is not None or control is not None:
        what = (f"report parts ({', '.join(ensemble_report.PARTS)}) are sections" if parts is not None
                else f"a control arm ({control!r}) is what the paired tests compare against")
        raise ValueError(f"{what} in an ensemble's report; {str(results)!r} is not an ensemble's results folder "
                         f"(no ensemble.json)")
    runs = campaign.load_results(path)
    if not runs:
        raise ValueError(f"no campaign results in {str(results)!r} (no <label>/run.json of its own label); a "
                         f"campaign exports them to OUT/results")
    return markdown(runs, source=str(results))


def update(path: str | os.PathLike) -> bool:
    """Rewrite every report block of the Markdown file ``path`` from its
    results folder (relative to the current directory); returns whether the
    file changed. Only the lines between a block's markers change: every
    byte outside them (the markers included) stays as it was, and the new
    lines take the begin marker's line ending (a Windows file stays one).
    Every block is computed before the file is written; one that cannot be
    (a marker that does not parse, a folder without results) is a ValueError
    naming its line, and the file is left as it was."""
    path = durable.checked_path(path, "Markdown file", folder=False)
    raw = path.read_bytes()
    try:
        old = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{str(path)!r} is not UTF-8 text ({e})") from None
    lines, found = _parse(old, str(path))
    out, kept = [], 0
    for b, e, args in found:
        out += lines[kept:b + 1]
        ending = lines[b][len(lines[b].rstrip("\r\n")):]
        try:
            body = for_block(args)
        except (ValueError, OSError) as err:
            raise ValueError(f"{path}:{b + 1}: the block of {args!r}: {err}") from None
        out.append(body.replace("\n", ending))
        kept = e
    text = "".join(out + lines[kept:])
    if text != old:
        durable.write_output(path, lambda p: p.write_bytes(text.encode("utf-8")))
    return text != old
