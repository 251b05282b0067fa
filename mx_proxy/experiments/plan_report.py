"""The pre-registered plan's report: every study's members so far and exactly the tests the plan registers.

:func:`compute` reads the plan (:mod:`mx_proxy.experiments.plan`) and its members under ``DIR/<study>``
(:mod:`mx_proxy.experiments.plan_members`) and returns the report as plain data (what ``mx-proxy report --plan
--json`` prints; :mod:`mx_proxy.experiments.plan_render` writes it as text), following docs/plan.md's rules:

- per study and arm: members so far, blow-ups by the ensembles' rule (factor 10) with a Clopper–Pearson interval,
  the median steps to blow-up (Kaplan–Meier), and the blow-ups at the rule's factors 3, 30 and 100 (the plan's
  sensitivity table: secondary, it decides nothing); the machines the members trained on;
- per registered test: its pairs (seeds every arm it reads has), the difference of rates with its 95 % bootstrap
  interval over seeds, its p-value (:mod:`mx_proxy.experiments.plan_stats`, H3's
  :mod:`mx_proxy.experiments.plan_signals`), Holm's adjusted p over the primary family and within each
  hypothesis's secondary family (a test without pairs counts as p = 1: each family keeps its registered size), and
  the power reached with the pairs so far (:func:`mx_proxy.experiments.power.detectable`);
- ``interim`` where a study the test reads has fewer members than the plan's in some arm: no primary test is
  declared answered then (the plan's "Interim reports" rule).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from mx_proxy.experiments import plan as _plan
from mx_proxy.experiments import plan_members, plan_signals, plan_stats, power, signals
from mx_proxy.experiments.ensemble_spec import TWIN

__all__ = ["compute", "select", "SENSITIVITY", "ranges", "SEED"]

SENSITIVITY = (3.0, 30.0, 100.0)
"""The rule's factors of the plan's sensitivity table (secondary: it decides nothing)."""
SEED = 0
"""The bootstrap's and the sampled permutations' seed: the report is the same on every call."""


def ranges(seeds) -> str:
    """Seeds as runs of consecutive ones: ``101–108, 110``."""
    s = sorted(int(x) for x in seeds)
    out, start = [], None
    for i, v in enumerate(s):
        start = v if start is None else start
        if i + 1 == len(s) or s[i + 1] != v + 1:
            out.append(f"{start}–{v}" if v != start else str(v))
            start = None
    return ", ".join(out)


def _num(v):
    """``v`` as JSON takes it: NaN and NA as ``None``, numpy scalars as Python ones."""
    if v is None or v is pd.NA:
        return None
    if isinstance(v, (np.integer, int)) and not isinstance(v, bool):
        return int(v)
    if isinstance(v, (np.floating, float)):
        return None if not math.isfinite(float(v)) else float(v)
    return v


def _arms(study) -> tuple[str, ...]:
    return tuple(a for a in study.ensemble_spec.arms if a != TWIN)


def _study(study, result, machines: pd.DataFrame, folder) -> dict:
    planned = study.members
    out = {"id": study.id, "hypothesis": study.hypothesis, "machine_kind": study.machine, "planned": planned,
           "arms": [], "machines": [], "mixed_machines": False,
           "parent": plan_members.parent_state(study, result, folder)}
    if result is None:
        out.update(status="no members", members=0)
        return out
    rates = result.rates().set_index("arm")
    sens = result.sensitivity(SENSITIVITY)
    for arm in _arms(study):
        row = {"arm": arm, "members": 0, "blowups": 0, "rate": None, "low": None, "high": None,
               "median_steps": None, "sensitivity": {}}
        if arm in rates.index:
            r = rates.loc[arm]
            row.update(members=int(r["members"]), blowups=int(r["blowups"]), rate=_num(r["p"]), low=_num(r["low"]),
                       high=_num(r["high"]),
                       median_steps=None if pd.isna(r["median_time"]) else int(r["median_time"]))
            mine = sens[sens["arm"] == arm]
            row["sensitivity"] = {f"{f:g}": int(k) for f, k in zip(mine["factor"], mine["blowups"])}
        out["arms"].append(row)
    least = min(a["members"] for a in out["arms"])
    out.update(members=least, status="complete" if least >= planned else "interim",
               seeds=ranges(result.table["seed"].unique()))
    mine = machines[machines["study"] == study.id]
    for (machine, source), g in mine.groupby(["machine", "source"], sort=False):
        events = result.table.set_index(["arm", "seed"])["event"]
        out["machines"].append({
            "machine": machine, "source": source, "devices": sorted(g["device"].unique()),
            "seeds": ranges(g["seed"].unique()), "commits": sorted(c for c in g["commit"].unique() if c),
            "blowups": {arm: [int(sum(bool(events.loc[(arm, s)]) for s in g[g["arm"] == arm]["seed"])),
                              int((g["arm"] == arm).sum())] for arm in _arms(study)}})
    out["mixed_machines"] = len(out["machines"]) > 1
    return out


def _studies_of(plan, h, test) -> tuple[str, ...]:
    if test.kind in ("cochran", "auc"):
        return (h.study,)
    return tuple(dict.fromkeys(plan.resolve(h, r)[0].id for r in test.arms()))


def _refs(plan, h, test) -> tuple[str, ...]:
    if test.kind == "cochran":
        return tuple(f"{h.study}/{a}" for a in _arms(plan.study(h.study)))
    return tuple("/".join((lambda s, a: (s.id, a))(*plan.resolve(h, r))) for r in test.arms())


def _keyed(test, plan, h):
    """``test`` with its arm references as ``STUDY/ARM`` (the keys of :func:`plan_members.samples`)."""
    key = lambda r: "/".join((lambda s, a: (s.id, a))(*plan.resolve(h, r)))  # noqa: E731
    conv = lambda x: key(x) if isinstance(x, str) else (tuple(key(r) for r in x) if x else x)  # noqa: E731
    return _plan.Test(test.kind, a=conv(test.a), b=conv(test.b), cells=tuple((k, conv(v)) for k, v in test.cells),
                      factor=test.factor, signal=test.signal)


def _power(plan, kind: str, samples, test, pairs: int, levels) -> list[dict]:
    """The rates the pairs so far detect with the plan's power, at each of ``levels`` (name, α): McNemar against
    arm b's observed rate over the pairs; H3 the AUC detectable from its blown-up and stable members."""
    out = []
    if kind == "mcnemar" and pairs:
        ref = float(plan_stats.paired(samples, (test.a, test.b))[test.b].mean())
        for name, alpha in levels:
            above, below = power.detectable(ref, pairs, plan.power, alpha)
            out.append({"level": name, "alpha": alpha, "reference_rate": ref, "detectable_above": _num(above),
                        "detectable_below": _num(below)})
    return out


def _test_row(plan, h, family: str, test, samples, results, studies: dict, levels, frames: dict) -> dict:
    reads = _studies_of(plan, h, test)
    complete = all(studies[s]["status"] == "complete" for s in reads)
    row = {"hypothesis": h.id, "family": family, "kind": test.kind, "test": test.describe(), "studies": list(reads),
           "arms": list(_refs(plan, h, test)),
           "planned_pairs": (len(h.arms) * plan.study(h.study).members if test.kind == "auc"
                             else min(plan.study(s).members for s in reads)),
           "interim": not complete}
    if test.kind == "auc":
        result = results[h.study]
        if result is not None and h.study not in frames:  # the signals of every member, once per study
            frames[h.study] = signals.labelled(result)
        a = (plan_signals.evaluate_auc(result, h.arms, test.signal, h.window or 500, h.gap or 50, seed=SEED,
                                       frames=frames[h.study]) if result is not None
             else plan_signals.AucOutcome(test.signal))
        lead = {}
        if result is not None and len(frames[h.study]):  # the signals module's lead time, reported with it
            mine = frames[h.study][frames[h.study]["arm"].isin(h.arms)]
            scored = signals.score_labelled(mine).set_index("signal") if len(mine) else pd.DataFrame()
            if test.signal in scored.index:
                r = scored.loc[test.signal]
                lead = {"lead_steps": _num(r["lead"]), "warned": int(r["warned"]), "events": int(r["events"])}
        row.update(pairs=a.positives + a.negatives, estimate=_num(a.auc), low=_num(a.low), high=_num(a.high),
                   pvalue=_num(a.pvalue_used), auc_pvalue=_num(a.pvalue), positives=a.positives,
                   negatives=a.negatives, auc_arms=list(a.auc_arms), paired_arms=list(a.paired_arms),
                   paired_n=a.paired_n, paired_rise=_num(a.paired_rise), paired_p=_num(a.paired_p),
                   lead_steps=lead.get("lead_steps"), warned=lead.get("warned"), events=lead.get("events"),
                   method="Mann–Whitney AUC, blown-up vs stable members" + (
                       "; arms with fewer than 5 stable members: paired Wilcoxon against their earlier window"
                       if a.paired_arms else ""),
                   power=[{"level": name, "alpha": alpha, "detectable_auc": _num(_plan.detectable_auc(
                       a.positives, a.negatives, plan.power, alpha))} for name, alpha in levels]
                   if a.positives and a.negatives else [])
        return row
    keyed = _keyed(test, plan, h)
    o = plan_stats.evaluate(keyed, samples, refs=_refs(plan, h, test), seed=SEED)
    row.update(pairs=o.pairs, estimate=_num(o.estimate), low=_num(o.low), high=_num(o.high), pvalue=_num(o.pvalue),
               statistic=_num(o.statistic), only_a=o.only_a, only_b=o.only_b, exact=o.exact, method=o.method,
               power=_power(plan, test.kind, samples, keyed, o.pairs, levels))
    return row


def _holm(rows: list[dict], alpha: float) -> None:
    adjusted = plan_stats.holm([np.nan if r["pvalue"] is None else r["pvalue"] for r in rows])
    for r, p in zip(rows, adjusted):
        r["holm_p"] = None if r["pvalue"] is None else float(p)
        r["family_size"] = len(rows)
        significant = bool(p <= alpha)
        if r["family"] == "primary":
            r["verdict"] = ("interim: not declared" if r["interim"] else
                            "rejected (Holm)" if significant else "not rejected (Holm)")
        else:
            r["verdict"] = ("secondary, interim" if r["interim"] else "secondary") + (
                ": below α after Holm" if significant else "")


def compute(plan, folder) -> dict:
    """The report of ``plan`` (a :class:`~mx_proxy.experiments.plan.Plan`) on its members under ``folder`` (see
    the module docstring), as plain data (JSON-ready: NaN as ``None``)."""
    results = plan_members.load_studies(plan, folder)
    machines = plan_members.machines(results, folder)
    samples = {f"{s.id}/{a}": pd.Series(dtype=bool) for s in plan.studies for a in s.ensemble_spec.arms}
    samples.update(plan_members.samples(results))
    studies = {s.id: _study(s, results[s.id], machines, folder) for s in plan.studies}
    holm_first = _plan.holm_alpha(plan)
    primary, tests, frames = [], [], {}
    for h in plan.hypotheses:
        p = _test_row(plan, h, "primary", h.primary, samples, results, studies,
                      (("alpha", plan.alpha), ("holm_first", holm_first)), frames)
        secondary = [_test_row(plan, h, "secondary", t, samples, results, studies, (("alpha", plan.alpha),), frames)
                     for t in h.secondary]
        _holm(secondary, plan.alpha)
        primary.append(p)
        tests += [p] + secondary
    _holm(primary, plan.alpha)
    return {"plan": plan.name, "registered": plan.registered, "alpha": plan.alpha, "power": plan.power,
            "folder": str(folder), "primary_family": len(plan.hypotheses), "studies": list(studies.values()),
            "hypotheses": [{"id": h.id, "study": h.study, "question": h.question} for h in plan.hypotheses],
            "tests": tests}


def select(report: dict, studies) -> dict:
    """``report`` limited to the studies ``studies`` (ids of its studies; a ValueError names an unknown one and
    the valid ones) and the hypotheses with a test that reads one of them (all their tests); the numbers, Holm's
    families included, stay those of the whole plan."""
    ids = [s["id"] for s in report["studies"]]
    keep = set(studies)
    bad = sorted(keep - set(ids))
    if bad:
        raise ValueError(f"the plan has no study {bad[0]!r}; valid: {', '.join(ids)}")
    hyps = {t["hypothesis"] for t in report["tests"] if set(t["studies"]) & keep}
    return {**report, "studies": [s for s in report["studies"] if s["id"] in keep],
            "hypotheses": [h for h in report["hypotheses"] if h["id"] in hyps],
            "tests": [t for t in report["tests"] if t["hypothesis"] in hyps]}
