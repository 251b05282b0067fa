"""An ensemble's results folder written out as Markdown: the rates, the paired tests, the loss gaps, the signals.

Every number comes from :mod:`mx_proxy.experiments.ensemble_result` and
:mod:`mx_proxy.experiments.signals` on the exported members; ``mx-proxy
report <folder>`` prints it, and a README block naming an ensemble folder is
regenerated from it like a campaign's (:mod:`mx_proxy.experiments.report`).
"""

from __future__ import annotations

import math
import os

import numpy as np
import pandas as pd

from mx_proxy.experiments import analysis, ensemble_pool, ensemble_result, power, signals, stats
from mx_proxy.experiments.ensemble import HISTORY, TWIN
from mx_proxy.experiments.ensemble_result import RULE
from mx_proxy.experiments.ensemble_spec import read_history, results_folder

__all__ = ["markdown", "for_folder", "is_ensemble", "check_parts", "PARTS"]

PARTS = ("rates", "paired", "loss_gap", "signals", "rule")
"""The report's sections, in order (``mx-proxy report FOLDER --only PART …``): P(blow-up) and survival per arm,
the paired tests against the control, the loss gaps to FP32, the warning signals, and how the blow-ups depend on
the rule's factor. The header (the ensemble and the blow-up rule) comes with any of them."""


def is_ensemble(folder) -> bool:
    return results_folder(folder) is not None


def _p(v: float) -> str:
    if v is None or not math.isfinite(v):
        return "–"
    return f"{v:.2g}" if v < 0.01 else f"{v:.2f}"


def _frac(v: float) -> str:
    return "–" if v is None or not math.isfinite(v) else f"{v:.2f}"


def _pct(v: float) -> str:
    return "–" if v is None or not math.isfinite(v) else f"{v:+.2f} %".replace("-", "−")


def _arm(result, arm: str) -> str:
    s = result.spec
    if arm == TWIN:
        return f"`twin` (the FP32 run trained beside `{s.base.recipe.name}` from step 0)"
    if arm == "unchanged":
        return f"`unchanged` (`{s.base.recipe.name}`)"
    return f"`{arm}`"


def _state(result, history: pd.DataFrame | None) -> list[str]:
    """A branch ensemble's state before the branch, by the blow-up rule on its recorded history: had its run (and
    its FP32 twin, where recorded) blown up already? Its members then continue a run past its blow-up."""
    s = result.spec
    if s.kind != "branch" or history is None or not len(history):
        return []
    window = analysis.window_for_steps(s.base.steps)
    said = []
    for col, who in (("loss", f"its run (`{s.base.recipe.name}`)"), ("ref_loss", "its FP32 twin")):
        if col not in history:
            continue
        loss = history[col].to_numpy(dtype=float)
        hot = np.flatnonzero(analysis.loss_jump_ratio(loss, window) > RULE)
        if len(hot):
            peak = hot[0] + int(np.argmax(np.where(np.isfinite(loss[hot[0]:]), loss[hot[0]:], np.inf)))  # its worst
            said.append(f"{who} had blown up at step {int(history['step'].iloc[hot[0]])} (loss "
                        f"{loss[peak]:.3g} at step {int(history['step'].iloc[peak])})")
        else:
            said.append(f"{who} had not blown up")
    tail = history.iloc[-HISTORY:]
    means = "; ".join(f"{name} {tail[col].mean():.3g}" for col, name in (("loss", "run"), ("ref_loss", "twin"))
                      if col in tail)
    return [f"The state at step {s.branch_at}, by the rule on its recorded history: {' and '.join(said)} "
            f"(mean loss over the last {len(tail)} steps before the branch: {means}).", ""]


def _header(result, source: str | None) -> list[str]:
    s, c = result.spec, result.spec.base
    counts = result.table.groupby("arm").size()
    n_done = min(int(counts.get(arm, 0)) for arm in s.arms)  # an arm with none exported counts, as 0
    what = {"seed": "each member its own student init and data (seed = data seed = s_i)",
            "data": "each member its own data stream (data seed = s_i), one init",
            "branch": f"each member continued from one state at step {s.branch_at} on its own data stream "
                      f"(data seed s_i)" + (f", its parameters scaled by 1 + ε·z, ε = {s.epsilon:g}" if s.epsilon
                                            else "")}[s.kind]
    return [f"Ensemble `{s.name}`: {c.recipe.name} at width {c.width}, depth {c.depth}, batch {c.batch}, "
            f"{c.optimizer.capitalize()} LR {c.lr:g}; {what}; s_i = {s.first_seed}…{s.first_seed + s.members - 1}, "
            f"the same for every arm; {s.members} members per arm"
            + (f" ({n_done} exported so far in the least advanced arm)" if n_done < s.members else "")
            + f", each trained {s.horizon} steps" + (f" ({source})" if source else "") + ".", "",
            f"Blow-up: the first step whose loss exceeds 10× its minimum over the previous {HISTORY} steps, or the "
            f"engine's divergence (a non-finite loss) where that comes first; a member without one is censored at "
            f"its last step.", ""]


def check_parts(parts) -> tuple[str, ...]:
    """``parts`` as a tuple, each one of :data:`PARTS`, else a ValueError naming the bad one and the choices."""
    parts = (parts,) if isinstance(parts, str) else tuple(parts)
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        what = f"unknown report part {bad[0]!r}" if bad else "no report part given"
        raise ValueError(f"{what}; valid: {', '.join(PARTS)}")
    return parts


def markdown(result, source: str | None = None, history: pd.DataFrame | None = None, parts=PARTS) -> str:
    """The report of an :class:`~mx_proxy.experiments.ensemble_result.EnsembleResult` (see the module docstring):
    its header and the sections ``parts`` (:data:`PARTS`), in report order."""
    parts = check_parts(parts)
    lines = _header(result, source) + _state(result, history)
    if "rates" in parts:
        lines += _rates(result)
    if "paired" in parts:
        lines += _paired(result)
    if "loss_gap" in parts:
        lines += _loss_gap(result)
    if "signals" in parts:
        lines += _signals(result, history)
    if "rule" in parts:
        lines += ([""] if lines[-1] else []) + _rule(result)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n"


def _rates(result) -> list[str]:
    s = result.spec
    lines = [f"| arm | blew up | P(blow-up), 95 % interval | survival at step +{s.horizon} (band) "
              f"| median steps to blow-up |", "|---|---|---|---|---|"]
    rates = {r.arm: r for r in result.rates().itertuples()}
    for arm in s.arms:  # every arm of the spec, an arm with no member exported yet too
        if arm not in rates:
            lines.append(f"| {_arm(result, arm)} | 0 exported | – | – | – |")
            continue
        r = rates[arm]
        med = "–" if pd.isna(r.median_time) else str(int(r.median_time))
        lines.append(f"| {_arm(result, r.arm)} | {r.blowups} / {r.members} | {_frac(r.p)} [{_frac(r.low)}, "
                     f"{_frac(r.high)}] | {_frac(r.survival)} [{_frac(r.s_low)}, {_frac(r.s_high)}] | {med} |")
    return lines + [""]


def _paired(result) -> list[str]:
    lines = []
    tests = result.paired_tests()
    if len(tests):
        lines += [f"Against `{result.control}`, member by member (same perturbation): McNemar's exact test on "
                      f"blew up or not, and the log-rank test on the times to blow-up (+: `{result.control}` blows "
                      f"up sooner):", "",
                  "| arm | pairs | blew up: only control / only arm / both / neither | McNemar p | log-rank z | "
                  "log-rank p | pairs needed |", "|---|---|---|---|---|---|---|"]
        for t in tests.itertuples():
            needed = ("–" if t.only_control == t.only_arm
                      else f"> {power.MOST_PAIRS}" if pd.isna(t.pairs_needed) else str(t.pairs_needed))
            lines.append(f"| {_arm(result, t.arm)} | {t.pairs} | {t.only_control} / {t.only_arm} / {t.both} / "
                         f"{t.neither} | {_p(t.mcnemar_p)} | {_frac(t.logrank)} | {_p(t.logrank_p)} | {needed} |")
        lines += ["", _power_line(result), ""]
    untested = [a for a in result.spec.arms if a != result.control and a not in set(tests["arm"])]
    if untested:
        lines += [f"Not tested against `{result.control}` yet (no member exported in both): "
                  + ", ".join(_arm(result, a) for a in untested) + ".", ""]
    omnibus = result.all_arms_test()
    if omnibus is not None and len(omnibus.arms) > 2:
        q = omnibus.test
        aside = " (`twin` aside: it continues another state)" if TWIN in result.spec.arms else ""
        how = ("every within-member permutation counted" if q.exact
               else f"{stats.PERMUTATIONS} within-member permutations of the arms' outcomes, seeded")
        training = ("; left out until all their members are exported: "
                    + ", ".join(f"`{a}` ({int((result.table['arm'] == a).sum())} / {result.spec.members})"
                                for a in omnibus.incomplete)) if omnibus.incomplete else ""
        lines += [f"All {len(omnibus.arms)} arms with every member exported at once{aside}, over their "
                  f"{q.members} member{'s' * (q.members > 1)}: Cochran's Q = {q.statistic:.2f}, p = {_p(q.pvalue)} "
                  f"({how}){training}.", ""]
    per_member = result.members_test()
    if per_member is not None:
        q = per_member.test
        how = ("every within-arm permutation counted" if q.exact
               else f"{stats.PERMUTATIONS} within-arm permutations of the members' outcomes, seeded")
        seeds = per_member.seeds
        counts = ", ".join(map(str, per_member.blowups))
        lines += [f"Does the perturbation decide, whatever the arm? Blow-ups of the {len(per_member.arms)} arms "
                  f"with every member exported on member s_i = {seeds[0]}…{seeds[-1]}: {counts}; Cochran's Q "
                  f"across the members = {q.statistic:.2f}, p = {_p(q.pvalue)} ({how}; each arm keeps its count "
                  f"of blow-ups).", ""]
    return lines


def _power_line(result) -> str:
    pairs, p, above, below = result.detectable()
    pct = f"{ensemble_result.POWER:.0%}".replace("%", " %")
    sides = [f"at least {above:.2f}" if math.isfinite(above) else "",
             f"at most {below:.2f}" if math.isfinite(below) else ""]
    told = " or ".join(s for s in sides if s)
    at = (f"an arm is told apart with {pct} probability only at a rate of {told}" if told
          else f"no rate of an arm is told apart with {pct} probability")
    return (f"Pairs needed: how many pairs McNemar's test (level 0.05) needs to tell the two observed rates apart "
            f"with {pct} probability if outcomes were independent within a pair (a planning figure at the point "
            f"estimates, not a result; correlated outcomes change it). With {pairs} pair{'s' * (pairs != 1)} (the "
            f"fewest any arm shares with `{result.control}`) and `{result.control}`'s rate on them {p:.2f} "
            f"({round(p * pairs)} of {pairs}), {at}.")


def _loss_gap(result) -> list[str]:
    lines = []
    gap = result.loss_gap()
    if len(gap):
        ref = result.reference_arm()
        lines += [f"Loss against the `{ref}` member with the same perturbation, over the last "
                      f"{ensemble_result.TAIL} steps, among the pairs where neither blew up (mean, 95 % bootstrap "
                      f"interval):", "", "| arm | stable pairs | loss vs FP32 |", "|---|---|---|"]
        for g in gap.itertuples():
            value = (f"{_pct(g.gap_pct)} [{_pct(g.low)}, {_pct(g.high)}]" if g.stable_pairs
                     else "– (no pair where neither blew up)")
            lines.append(f"| {_arm(result, g.arm)} | {g.stable_pairs} | {value} |")
        lines.append("")
    ends = result.end_loss_tests()
    if len(ends):
        lines += _table(f"Loss against `{result.control}`, member by member, over every pair, blown up or not (the "
                        f"mean over the last {ensemble_result.TAIL} steps; a member stopped before the horizon counts "
                        f"as the higher): the sign test, and the median ratio over the pairs that both reached the "
                        f"horizon:",
                        ["arm", "pairs", "arm lower / higher / tied", "sign test p", "median loss ratio"],
                        [[_arm(result, e.arm), e.pairs, f"{e.lower} / {e.higher} / {e.ties}", _p(e.sign_p),
                          "–" if not math.isfinite(e.median_ratio) else f"{e.median_ratio:.3g}"]
                         for e in ends.itertuples()]) + [""]
    return lines


def _table(caption: str, columns: list[str], rows: list[list]) -> list[str]:
    """A captioned Markdown table, as report lines."""
    return ([caption, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
            + ["| " + " | ".join(str(v) for v in row) + " |" for row in rows])


def _signals(result, history) -> list[str]:
    s = result.spec
    lines = []
    sig = signals.score(result, history)
    if len(sig):
        lines += _table(f"Which signal warns first (every {s.diagnostics} steps of every member before its blow-up, "
                        f"pooled; AUC of predicting a blow-up within the next 100 / 500 steps; warned: the signal "
                        f"was above its 95th percentile at quiet steps right before the blow-up; lead: median steps "
                        f"from where it last rose above it, within the 500 steps before, to the blow-up):",
                        ["signal", "AUC, 100 steps", "AUC, 500 steps", "blow-ups warned of", "median lead (steps)"],
                        [[g.label, _frac(g.auc_100), _frac(g.auc_500), f"{g.warned} / {g.events}",
                          "–" if not math.isfinite(g.lead) else f"{g.lead:.0f}"] for g in sig.itertuples()])
    return lines


def _rule(result) -> list[str]:
    sens = result.sensitivity()
    if not len(sens):
        return []
    factors = list(dict.fromkeys(sens["factor"]))
    rec = result.recoveries().set_index("arm")
    spike = result.spec.base.spike_factor
    lines = [f"The blow-ups again with the rule's factor {ensemble_result.RULE:g} replaced (McNemar p against "
             f"`{result.control}`, member by member); stopped: the engine's divergence (a non-finite loss, or one "
             f"step {spike:g}× the previous); recovered: blown up by the rule, not stopped, and its mean loss over "
             f"its last {ensemble_result.TAIL} steps back within {ensemble_result.RECOVERED:g}× its minimum over "
             f"the {HISTORY} steps before the blow-up:", "",
             "| arm | " + " | ".join(f"{f:g}×" + (" (the rule)" if f == ensemble_result.RULE else "")
                                    for f in factors) + " | stopped | recovered |",
             "|---|" + "---|" * (len(factors) + 2)]
    by_arm = dict(tuple(sens.groupby("arm", sort=False)))
    for arm in result.spec.arms:
        if arm not in by_arm:
            lines.append(f"| {_arm(result, arm)} | " + " | ".join(["0 exported"] + ["–"] * (len(factors) + 1))
                         + " |")
            continue
        cells = [f"{r.blowups} / {r.members}" + ("" if arm == result.control else f" (p {_p(r.mcnemar_p)})")
                 for r in by_arm[arm].itertuples()]
        n = rec.loc[arm, "members"]
        cells += [f"{rec.loc[arm, 'diverged']} / {n}", f"{rec.loc[arm, 'recovered']} / {rec.loc[arm, 'blowups']}"]
        lines.append(f"| {_arm(result, arm)} | " + " | ".join(cells) + " |")
    return lines


def for_folder(folder, parts=PARTS, control: str | None = None) -> str:
    """:func:`markdown` of the ensemble whose results are in ``folder``, naming it (the sections ``parts``; the
    paired tests against ``control``, default the first arm). ``folder`` may be a list of folders: their
    ensembles pooled as one (:func:`mx_proxy.experiments.ensemble_pool.pool`), named in seed order."""
    parts = check_parts(parts)
    folders = [folder] if isinstance(folder, (str, os.PathLike)) else list(folder)
    result = ensemble_pool.pool([ensemble_result.load(f) for f in folders])
    if control is not None:
        result = result.against(control)
    hist = read_history(folders[0]) if len(folders) == 1 else None  # pooled ensembles are never branch ensembles
    if not len(result.table):
        raise ValueError(f"ensemble {result.spec.name!r} in {' + '.join(map(str, folders))} has no exported member "
                         f"yet")
    return markdown(result, source=" + ".join(map(str, folders)), history=hist, parts=parts)
