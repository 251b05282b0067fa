"""The plan's report (:func:`mx_proxy.experiments.plan_report.compute`) written as Markdown text: what ``mx-proxy
report --plan`` prints.

One section per study (its members so far, its arms' blow-ups, its machines), then one per hypothesis (its
registered tests, primary first, each with its pairs, difference of rates and interval, p-value, Holm's adjusted
p in its family, the power its pairs reach, and whether it is interim);
:func:`mx_proxy.experiments.plan_report.select` limits a report to some studies first.
"""

from __future__ import annotations

import math

__all__ = ["markdown"]


def _f(v, digits: int = 2) -> str:
    return "–" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{digits}f}"


def _signed(v) -> str:
    return "–" if v is None else f"{v:+.2f}".replace("-", "−")


def _p(v) -> str:
    if v is None:
        return "–"
    return f"{v:.2g}" if v < 0.01 else f"{v:.2f}"


def _seeds(text: str) -> str:
    return f"seed {text}" if text.isdigit() else f"seeds {text}"


def _study(s: dict) -> list[str]:
    head = f"### Study `{s['id']}` ({s['hypothesis']}, {s['machine_kind']})"
    if s["status"] == "no members":
        return [head, "", f"No members yet (0 of {s['planned']} an arm): every test that reads it waits.", ""]
    label = ("complete" if s["status"] == "complete" else
             f"interim: {s['members']} of {s['planned']} members an arm")
    lines = [head, "", f"{label.capitalize()} ({_seeds(s['seeds'])}).", "",
             "| arm | members | blew up (rule, factor 10) | P(blow-up) [95 % CI] | median steps to blow-up | "
             "blew up at factor 3 / 30 / 100 (secondary) |", "|---|---:|---:|---|---:|---|"]
    for a in s["arms"]:
        sens = " / ".join(str(a["sensitivity"].get(k, "–")) for k in ("3", "30", "100"))
        med = "–" if a["median_steps"] is None else str(int(a["median_steps"]))
        lines.append(f"| `{a['arm']}` | {a['members']} | {a['blowups']} | {_f(a['rate'])} [{_f(a['low'])}, "
                     f"{_f(a['high'])}] | {med} | {sens} |")
    lines += _parent(s["parent"])
    lines += ["", "Machines (`run.json`'s `device`; where it names no model, the machine MACHINES.md lists):", ""]
    for m in s["machines"]:
        said = "" if m["source"] == "run.json" else f" (MACHINES.md; run.json: {', '.join(m['devices'])})"
        lines.append(f"- {m['machine']}{said}: {_seeds(m['seeds'])}, commit {', '.join(m['commits']) or '–'}; "
                     "blew up " + ", ".join(f"`{arm}` {k} of {n}" for arm, (k, n) in m["blowups"].items()))
    if s["mixed_machines"]:
        lines += ["", f"Mixed machines: this study's members trained on {len(s['machines'])} different machines "
                      f"(a study trains on one kind; its tests pool them, the per-machine counts above describe)."]
    return lines + [""]


def _parent(p: dict | None) -> list[str]:
    """A branch study's state, as the plan asks the report to say it."""
    if p is None:
        return []
    moved = ("" if p["branch_at"] == p["planned_branch_at"] else
             f", not the plan's {p['planned_branch_at']}: its parent had blown up before that on this machine")
    state = ("no branch history recorded" if not p["history"] else
             f"its parent had blown up by the rule at step {p['parent_blown_up_at']}" if p["parent_blown_up_at"]
             is not None else "its parent had not blown up by the rule on its recorded history")
    return ["", f"Branched at step {p['branch_at']}{moved}; {state}."]


def _power(t: dict) -> str:
    parts = []
    for p in t.get("power", []):
        level = "α" if p["level"] == "alpha" else "Holm's first step"
        if "detectable_auc" in p:
            parts.append(f"AUC ≥ {_f(p['detectable_auc'])} at {level} {p['alpha']:g}")
            continue
        sides = [f"≥ {p['detectable_above']:.2f}" if p["detectable_above"] is not None else "",
                 f"≤ {p['detectable_below']:.2f}" if p["detectable_below"] is not None else ""]
        told = " or ".join(x for x in sides if x) or "no rate"
        parts.append(f"{told} vs {p['reference_rate']:.2f} at {level} {p['alpha']:g}")
    return "; ".join(parts) or "–"


def _detail(t: dict) -> str:
    if t["kind"] == "mcnemar" and t["pairs"]:
        return f"discordant {t['only_a']} only `{t['arms'][0]}` / {t['only_b']} only `{t['arms'][1]}`"
    if t["kind"] == "cochran" and t["pairs"]:
        return f"Q = {t['statistic']:.2f}" + ("" if t["exact"] else ", sampled permutations")
    if t["kind"] in ("main_effect", "interaction") and t["pairs"]:
        return "sign-flip " + ("exact" if t["exact"] else "sampled")
    if t["kind"] == "auc" and t["pairs"]:
        said = f"{t['positives']} blown up / {t['negatives']} stable"
        if t.get("events"):
            lead = "–" if t["lead_steps"] is None else f"{t['lead_steps']:.0f}"
            said += f"; lead {lead} steps (median; warned of {t['warned']} of {t['events']} blow-ups)"
        if t["paired_arms"]:
            said += (f"; {', '.join(t['paired_arms'])} (< 5 stable): Wilcoxon over {t['paired_n']} members, median "
                     f"rise {_f(t['paired_rise'], 3)}, p {_p(t['paired_p'])}")
        return said
    return ""


def _pct(v: float) -> str:
    return f"{100 * v:.0f} %"


def _hypothesis(h: dict, tests: list[dict], power: float) -> list[str]:
    lines = [f"### {h['id']} (study `{h['study']}`)", "", h["question"], "",
             "| family | test | pairs (of planned) | difference of rates [95 % CI] | p | Holm p (family) | "
             f"power reached ({_pct(power)}) | status | details |", "|---|---|---:|---|---:|---:|---|---|---|"]
    for t in tests:
        what = "AUC" if t["kind"] == "auc" else "difference"
        est = ("–" if t["estimate"] is None else
               (f"{what} {_f(t['estimate'])}" if t["kind"] == "auc" else _signed(t["estimate"]))
               + ("" if t["low"] is None else f" [{_signed(t['low']) if t['kind'] != 'auc' else _f(t['low'])}, "
                                               f"{_signed(t['high']) if t['kind'] != 'auc' else _f(t['high'])}]"))
        pairs = f"{t['pairs']} of {t['planned_pairs']}" + (" (members)" if t["kind"] == "auc" else "")
        status = t["verdict"] if t["pairs"] else t["verdict"] + ", no pairs yet"
        lines.append(f"| {t['family']} | {t['test']} | {pairs} | {est} | {_p(t['pvalue'])} | "
                     f"{_p(t['holm_p'])} (of {t['family_size']}) | {_power(t)} | {status} | {_detail(t)} |")
    return lines + [""]


def markdown(report: dict) -> str:
    """The report as Markdown (see the module docstring)."""
    with_members = [s["id"] for s in report["studies"] if s["status"] != "no members"]
    lines = [f"Plan `{report['plan']}` (registered {report['registered']}), members under `{report['folder']}`: "
             f"{len(with_members)} of the {len(report['studies'])} studies shown have members"
             + (f" ({', '.join(with_members)})" if with_members else "") + ".", "",
             "Interim: every study below 40 members an arm is interim; no primary test is declared answered "
             f"before every study it reads has all its members. Holm's method at α = {report['alpha']:g} over the "
             f"{report['primary_family']} primary tests, and within each hypothesis's "
             "secondary tests (read as secondary whatever their p); a test without pairs yet counts as p = 1 in its "
             "family. A difference is arm a's rate minus arm b's (a main effect: the mean of its two paired "
             "differences; an interaction: the difference of two paired differences), paired by seed, with a 95 % "
             "bootstrap interval over seeds. Power reached: the rates McNemar's exact test detects with "
             f"{_pct(report['power'])} power "
             "from the pairs so far against arm b's observed rate (outcomes independent within a pair).", "",
             "## Studies", ""]
    for s in report["studies"]:
        lines += _study(s)
    lines += ["## Hypotheses", ""]
    for h in report["hypotheses"]:
        tests = [t for t in report["tests"] if t["hypothesis"] == h["id"]]
        lines += _hypothesis(h, tests, report["power"])
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n"
