"""An ensemble's results as rates: outcomes per member, P(blow-up), survival, paired tests, loss gaps.

:func:`load` reads an :class:`EnsembleResult` from its results folder;
:func:`mx_proxy.experiments.ensemble_train.ensemble` (``mxp.ensemble``),
the notebook's entry point, trains (or resumes, or loads) one and returns it.

One rule decides every member's outcome (:func:`outcomes`): a member *blows
up* at the first step from its start at which it stops being stable,
:func:`mx_proxy.experiments.analysis.unstable_after`: the first step whose
loss exceeds 10× its minimum over the previous 100 steps, or the engine's
divergence (a non-finite loss, or one step ``spike_factor``× the previous)
where that comes first
(a branch member's window reaches into the state's history: its export keeps
the 100 steps before the branch). A member without a blow-up is censored at
its last recorded step (the arm's horizon; a ``twin`` member also where the
engine stopped its paired ``unchanged`` member). Time to blow-up counts
steps from the member's start (``branch_at``, or 0).

The tables (:class:`EnsembleResult`), each computed by
:mod:`mx_proxy.experiments.stats`:

- :meth:`~EnsembleResult.rates`: per arm, blow-ups / members with a
  Clopper–Pearson 95 % interval, and the Kaplan–Meier survival at the horizon
  with its band;
- :meth:`~EnsembleResult.paired_tests`: each arm against the control (the
  first arm), member by member (same perturbation): McNemar's exact test
  and the log-rank test, with the pairs a difference as large as the
  observed one needs (:mod:`mx_proxy.experiments.power`), and
  :meth:`~EnsembleResult.detectable`: the rates the pairs at hand can tell
  from the control's; :meth:`~EnsembleResult.all_arms_test`: every arm with
  all its members exported at once (the ``twin`` aside), Cochran's Q, and
  :meth:`~EnsembleResult.members_test`: the same arms' blow-ups per member
  (perturbation), Cochran's Q across the members;
- :meth:`~EnsembleResult.loss_gap`: over the members that stayed stable to the horizon, the
  mean loss over the last 100 steps against the FP32 member with the same
  perturbation (the ``twin`` arm, or an ``fp32`` arm), in %, with a
  bootstrap interval;
- :meth:`~EnsembleResult.sensitivity`: the blow-ups and McNemar's test again
  with the rule's factor 10 replaced by each of :data:`FACTORS` (does a
  conclusion hang on the threshold?), and :meth:`~EnsembleResult.recoveries`:
  per arm, the engine's divergences and the blow-ups the loss came back from.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import numpy as np
import pandas as pd

from mx_proxy.experiments import analysis, power, result_folders, stats
from mx_proxy.experiments.ensemble import TWIN, Ensemble, member_label, read_spec
from mx_proxy.experiments.ensemble_export import labels, verified
from mx_proxy.experiments.ensemble_spec import load_member, results_folder
from mx_proxy.training.result import Run

__all__ = ["EnsembleResult", "AllArms", "Members", "load", "load_member", "outcomes", "TAIL", "RULE",
           "FACTORS", "RECOVERED", "POWER"]

TAIL = 100  # steps whose mean loss the loss gap compares
RULE = 10.0
"""The blow-up rule's factor: a loss above ``RULE`` × its minimum over the previous 100 steps."""
POWER = 0.8
"""The power the planning figures ask for (:meth:`EnsembleResult.paired_tests`' ``pairs_needed``,
:meth:`EnsembleResult.detectable`)."""
FACTORS = (5.0, 10.0, 100.0, 1000.0)
"""The factors :meth:`EnsembleResult.sensitivity` puts in place of :data:`RULE`."""
RECOVERED = 2.0
"""A blow-up is recovered from when the mean loss over the member's last ``TAIL`` steps is at most ``RECOVERED``
× its minimum over the 100 steps before the blow-up."""


def outcomes(spec: Ensemble, runs: dict[str, list[Run]], factor: float = RULE) -> pd.DataFrame:
    """One row per member: ``arm``, ``member``, ``seed`` (its perturbation),
    ``blowup_at`` (step, or NA), ``event``, ``time`` (steps from the start
    to the blow-up, or to the censoring), ``last_step`` and ``tail_loss``
    (mean loss over its last ``TAIL`` recorded steps, +inf where one of them
    is not finite: a NaN loss is the rule's divergence, never a number). ``factor``: the rule's
    (:data:`RULE`; :meth:`EnsembleResult.sensitivity` varies it)."""
    rows = []
    for arm in spec.arms:
        for i, r in enumerate(runs.get(arm, [])):
            if r is None:
                continue
            m = r.metrics[r.metrics["step"] >= spec.start]
            last = int(m["step"].iloc[-1]) if len(m) else spec.start - 1
            onset = analysis.unstable_after(r, spec.start, analysis.instability(r, factor))
            event = onset is not None
            tail = m["loss"].tail(TAIL).to_numpy(dtype=float)
            tail_loss = float(tail.mean()) if np.isfinite(tail).all() else math.inf  # non-finite: the higher
            rows.append({"arm": arm, "member": i, "seed": spec.seeds()[i],
                         "blowup_at": onset, "event": event,
                         "time": (onset if event else last + 1) - spec.start, "last_step": last,
                         "tail_loss": tail_loss if len(tail) else math.nan})
    df = pd.DataFrame(rows, columns=["arm", "member", "seed", "blowup_at", "event", "time", "last_step", "tail_loss"])
    df["blowup_at"] = df["blowup_at"].astype("Int64")
    return df


class AllArms(NamedTuple):
    """:meth:`EnsembleResult.all_arms_test`'s answer: the ``arms`` it compared
    (every member exported), Cochran's Q over them (``test``), and the arms
    with members still to export (``incomplete``), left out."""

    arms: tuple[str, ...]
    test: stats.CochranQ
    incomplete: tuple[str, ...]


class Members(NamedTuple):
    """:meth:`EnsembleResult.members_test`'s answer: the ``arms`` it pooled,
    each member's ``seed`` (its perturbation, s_i) and ``blowups`` (how many
    of those arms blew up on it), and Cochran's Q across the members
    (``test``; its ``members`` field counts the arms, its ``arms`` field the
    members: the table is transposed)."""

    arms: tuple[str, ...]
    seeds: tuple[int, ...]
    blowups: tuple[int, ...]
    test: stats.CochranQ


@dataclasses.dataclass
class EnsembleResult:
    """An ensemble's spec and its members' runs (``runs[arm][i]``; ``None``
    where a member is not exported yet), with the tables of the module docstring."""

    spec: Ensemble
    runs: dict[str, list[Run | None]]
    confidence: float = 0.95
    control_arm: str | None = None
    """The arm every other is tested against; ``None``: the first arm."""

    def __post_init__(self):
        if self.control_arm is not None and self.control_arm not in self.spec.arms:
            raise ValueError(f"control arm {self.control_arm!r} is not an arm of ensemble {self.spec.name!r}; "
                             f"valid: {', '.join(map(repr, self.spec.arms))}")
        self.table = outcomes(self.spec, self.runs)

    @property
    def control(self) -> str:
        """The arm the paired tests, the end-loss tests and the rule's table compare against (:attr:`control_arm`,
        default the first arm)."""
        return self.control_arm or self.spec.arms[0]

    def against(self, control: str) -> EnsembleResult:
        """The same results with ``control`` as the arm every other is tested against (e.g. a mechanism arm
        against ``fp32`` rather than against the unchanged run); a ValueError names the arms if it is none."""
        return dataclasses.replace(self, control_arm=control)

    def complete(self, arm: str) -> bool:
        return all(r is not None for r in self.runs.get(arm, [])) and len(self.runs.get(arm, [])) == self.spec.members

    def _arm(self, arm: str, table: pd.DataFrame | None = None) -> pd.DataFrame:
        """``arm``'s rows of ``table`` (default: the outcomes by the rule, :attr:`table`)."""
        table = self.table if table is None else table
        return table[table["arm"] == arm]

    def survival(self, arm: str) -> pd.DataFrame:
        """Kaplan–Meier S(t) of ``arm`` (:func:`mx_proxy.experiments.stats.survival`), t in steps from the start."""
        d = self._arm(arm)
        if not len(d):
            raise ValueError(f"arm {arm!r} has no members exported; arms: {', '.join(self.spec.arms)}")
        return stats.survival(d["time"], d["event"], self.confidence)

    def rates(self) -> pd.DataFrame:
        """Per arm with a member exported: ``members`` (exported), ``blowups``, ``p`` with ``low``/``high``
        (Clopper–Pearson), ``survival`` at the horizon with ``s_low``/``s_high``,
        and the median time to blow-up (``median_time``, NA where S stays above ½). The report lists the
        other arms of the spec as ``0 exported`` (:mod:`mx_proxy.experiments.ensemble_report`)."""
        rows = []
        for arm in self.spec.arms:
            d = self._arm(arm)
            if not len(d):
                continue
            r = stats.rate(int(d["event"].sum()), len(d), self.confidence)
            s = self.survival(arm)
            at_end = s[s["t"] <= self.spec.horizon].iloc[-1]
            below = s[s["survival"] <= 0.5]
            rows.append({"arm": arm, "members": r.n, "blowups": r.k, "p": r.p, "low": r.low, "high": r.high,
                         "survival": float(at_end["survival"]), "s_low": float(at_end["low"]),
                         "s_high": float(at_end["high"]),
                         "median_time": int(below["t"].iloc[0]) if len(below) else None})
        df = pd.DataFrame(rows, columns=["arm", "members", "blowups", "p", "low", "high", "survival", "s_low",
                                         "s_high", "median_time"])
        df["median_time"] = df["median_time"].astype("Int64")
        return df

    def _pairs(self, other: str, table: pd.DataFrame | None = None):
        """``(arm, other's outcomes, arm's outcomes, the members both have)``
        for every arm but ``other`` that shares members with it (indexed by
        member), from ``table`` (default: :attr:`table`)."""
        o = self._arm(other, table).set_index("member")
        for arm in self.spec.arms:
            a = self._arm(arm, table).set_index("member")
            both = o.index.intersection(a.index)
            if arm != other and len(both):
                yield arm, o, a, both

    def paired_tests(self, control: str | None = None) -> pd.DataFrame:
        """Each other arm against ``control`` (default: the first arm) over the
        members both have: McNemar's exact test on blew up / did not, and the
        log-rank test on the times (a positive statistic: the control's
        blow-ups come sooner); ``pairs_needed``: the pairs McNemar's test needs
        to tell the two observed rates apart with :data:`POWER` probability at
        level 0.05, outcomes independent within a pair
        (:func:`~mx_proxy.experiments.power.pairs_needed`; ``<NA>`` where the
        rates are equal or 2000 pairs do not suffice) — a planning figure at
        the point estimates, not a result."""
        control = control or self.control
        rows = []
        for arm, c, a, both in self._pairs(control):
            mc = stats.mcnemar(c.loc[both, "event"], a.loc[both, "event"])
            lr = stats.logrank(c.loc[both, "time"], c.loc[both, "event"], a.loc[both, "time"], a.loc[both, "event"])
            p_c, p_a = float(c.loc[both, "event"].mean()), float(a.loc[both, "event"].mean())
            rows.append({"arm": arm, "control": control, "pairs": len(both), "only_control": mc.only_a,
                         "only_arm": mc.only_b, "both": mc.both, "neither": mc.neither, "mcnemar_p": mc.pvalue,
                         "logrank": lr.statistic, "logrank_p": lr.pvalue,
                         "pairs_needed": power.pairs_needed(p_c, p_a, POWER) if p_c != p_a else None})
        df = pd.DataFrame(rows, columns=["arm", "control", "pairs", "only_control", "only_arm", "both", "neither",
                                         "mcnemar_p", "logrank", "logrank_p", "pairs_needed"])
        df["pairs_needed"] = df["pairs_needed"].astype("Int64")
        return df

    def detectable(self, control: str | None = None) -> tuple[int, float, float, float] | None:
        """What the pairs at hand can detect: ``(pairs, p, above, below)``, where ``pairs`` is the fewest
        members another arm shares with ``control`` (default: the first arm), ``p`` the control's rate over
        them, and ``above``/``below`` the nearest rates that McNemar's test (level 0.05) tells from ``p`` with
        probability :data:`POWER` over that many pairs, outcomes independent within a pair
        (:func:`~mx_proxy.experiments.power.detectable`; NaN where no rate on that side is). ``None`` without
        another arm."""
        control = control or self.control
        pairs = [(c, both) for _, c, _, both in self._pairs(control)]
        if not pairs:
            return None
        c, both = min(pairs, key=lambda cb: len(cb[1]))
        p_c = float(c.loc[both, "event"].mean())
        above, below = power.detectable(p_c, len(both), POWER)
        return len(both), p_c, above, below

    def all_arms_test(self, seed: int = 0) -> AllArms | None:
        """Whether the arms differ at all: Cochran's Q over the arms with every
        member exported, with its permutation p-value
        (:func:`~mx_proxy.experiments.stats.cochran_q`; ``seed`` fixes the
        sampled permutations). Arms still training are left out (and named in
        :attr:`AllArms.incomplete`), so the test stays the complete arms' one
        while an ensemble grows, rather than shrinking to the few members the
        newest arm has. The ``twin`` arm is left out too: it continues another
        state (the FP32 run's), where every other arm continues the same one.
        ``None`` with fewer than two complete arms."""
        complete, incomplete = self._complete_arms()
        if len(complete) < 2:
            return None
        return AllArms(complete, stats.cochran_q(self._events(complete), seed=seed), incomplete)

    def members_test(self, seed: int = 0) -> Members | None:
        """Whether some perturbations blow up more often than others, whatever
        the arm: over the arms :meth:`all_arms_test` compares, Cochran's Q
        with the roles swapped (each arm a block, each member a treatment), its
        p-value from permuting each arm's outcomes over its members, which
        keeps every arm's count of blow-ups (``seed`` fixes the sampled
        permutations). In a ``branch`` ensemble a member is a data stream
        after the branch, so a small p says the batches, not the arm, decide
        when a member blows up. ``None`` where :meth:`all_arms_test` is."""
        complete, _ = self._complete_arms()
        if len(complete) < 2:
            return None
        table = self._events(complete)
        return Members(complete, tuple(int(s) for s in self.spec.seeds()), tuple(int(c) for c in table.sum(axis=1)),
                       stats.cochran_q(table.T, seed=seed))

    def _complete_arms(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The arms but ``twin`` split into those with every member exported and the rest."""
        arms = [a for a in self.spec.arms if a != TWIN]
        return tuple(a for a in arms if self.complete(a)), tuple(a for a in arms if not self.complete(a))

    def _events(self, arms) -> np.ndarray:
        """Blew up or not, ``[member, arm]``, for ``arms`` (every member exported)."""
        return np.column_stack([self._arm(a).sort_values("member")["event"].to_numpy(dtype=bool) for a in arms])

    def sensitivity(self, factors=FACTORS) -> pd.DataFrame:
        """The rule with each of ``factors`` in place of its 10: one row per
        arm and factor, ``members``, ``blowups``, and McNemar's exact p
        against the control over the members both have (NaN for the control)."""
        rows = []
        for factor in factors:
            factor = float(factor)
            if not math.isfinite(factor) or factor <= 1.0:
                raise ValueError(f"a blow-up factor must be a finite number above 1, got {factor!r}")
            table = self.table if factor == RULE else outcomes(self.spec, self.runs, factor)
            p = {arm: stats.mcnemar(c.loc[both, "event"], a.loc[both, "event"]).pvalue
                 for arm, c, a, both in self._pairs(self.control, table)}
            for arm in self.spec.arms:
                a = self._arm(arm, table)
                if len(a):
                    rows.append({"arm": arm, "factor": factor, "members": len(a), "blowups": int(a["event"].sum()),
                                 "mcnemar_p": p.get(arm, math.nan)})
        return pd.DataFrame(rows, columns=["arm", "factor", "members", "blowups", "mcnemar_p"])

    def recoveries(self) -> pd.DataFrame:
        """Per arm: ``members``, ``blowups`` (the rule), ``diverged`` (the
        engine stopped the member: a non-finite loss, or one step
        ``spike_factor``× the previous) and ``recovered``: members that blew up,
        were not stopped, and whose mean loss over their last ``TAIL`` steps
        came back to at most :data:`RECOVERED` × their minimum over the 100
        steps before the blow-up."""
        rows = []
        for arm in self.spec.arms:
            d = self._arm(arm)
            if not len(d):
                continue
            diverged = recovered = 0
            for m in d.itertuples():
                run = self.runs[arm][m.member]
                stopped = run.diverged_at is not None and run.diverged_at >= self.spec.start
                diverged += stopped
                if m.event and not stopped:
                    steps, loss = run.metrics["step"].to_numpy(), run.metrics["loss"].to_numpy(dtype=float)
                    w = analysis.blowup_window(run)
                    at = int(np.searchsorted(steps, m.blowup_at))
                    before = loss[max(0, at - w):at]
                    tail = loss[len(loss) - min(TAIL, len(loss) - at):]  # after the blow-up only
                    recovered += bool(len(before) and len(tail) and np.all(np.isfinite(tail))
                                      and tail.mean() <= RECOVERED * before.min())
            rows.append({"arm": arm, "members": len(d), "blowups": int(d["event"].sum()), "diverged": diverged,
                         "recovered": recovered})
        return pd.DataFrame(rows, columns=["arm", "members", "blowups", "diverged", "recovered"])

    def reference_arm(self) -> str | None:
        """The FP32 arm the loss gap compares with: ``twin``, else ``fp32``, else none."""
        return next((a for a in (TWIN, "fp32") if a in self.spec.arms), None)

    def end_loss_tests(self, control: str | None = None) -> pd.DataFrame:
        """Each other arm's loss against ``control``'s (default: the first arm), member by member, over every
        pair, blown up or not: the mean loss over the last ``TAIL`` steps, +inf for a member that stopped
        before the horizon (the engine's divergence, or its pair's). Per arm: ``lower`` / ``higher`` /
        ``ties`` (the arm's against the control's), the sign test's ``sign_p``
        (:func:`~mx_proxy.experiments.stats.sign_test`), and ``median_ratio``, the median of arm / control over
        the pairs where both reached the horizon (NaN without one)."""
        control = control or self.control
        end = self.spec.end - 1
        rows = []
        for arm, c, a, both in self._pairs(control):
            lc, la = (np.where(t.loc[both, "last_step"] == end, t.loc[both, "tail_loss"], np.inf) for t in (c, a))
            st = stats.sign_test(la, lc)
            whole = np.isfinite(la) & np.isfinite(lc)
            rows.append({"arm": arm, "control": control, "pairs": len(both), "lower": st.lower,
                         "higher": st.higher, "ties": st.ties, "sign_p": st.pvalue,
                         "median_ratio": float(np.median(la[whole] / lc[whole])) if whole.any() else math.nan})
        return pd.DataFrame(rows, columns=["arm", "control", "pairs", "lower", "higher", "ties", "sign_p",
                                           "median_ratio"])

    def loss_gap(self, seed: int = 0) -> pd.DataFrame:
        """Per arm, over the members where both it and its FP32 member
        (:meth:`reference_arm`, same perturbation) stayed stable to the
        horizon (no blow-up, not censored early): the mean of
        100·(tail loss / FP32 tail loss − 1) with a bootstrap interval
        (``seed`` fixes the resampling)."""
        columns = ["arm", "reference", "stable_pairs", "gap_pct", "low", "high"]
        ref = self.reference_arm()
        if ref is None:
            return pd.DataFrame(columns=columns)
        rows = []
        for arm, f, a, both in self._pairs(ref):
            end = self.spec.end - 1
            ok = [m for m in both if not a.loc[m, "event"] and not f.loc[m, "event"]
                  and a.loc[m, "last_step"] == end and f.loc[m, "last_step"] == end]  # the same last steps
            gaps = [100.0 * (a.loc[m, "tail_loss"] / f.loc[m, "tail_loss"] - 1.0) for m in ok]
            est = stats.bootstrap_mean(gaps, self.confidence, seed=seed)
            rows.append({"arm": arm, "reference": ref, "stable_pairs": est.n, "gap_pct": est.value,
                         "low": est.low, "high": est.high})
        return pd.DataFrame(rows, columns=columns)


def load(folder, confidence: float = 0.95) -> EnsembleResult:
    """The exported members of the ensemble whose results are in ``folder``
    (``OUT/results``, or ``OUT``), each found by its label and verified
    against the config the spec gives it (:func:`~mx_proxy.experiments.ensemble_export.verified`);
    members not exported yet are ``None``, and so is an export that is
    damaged or another config's run, named in one warning with every other
    folder that is no member (a copy, a foreign folder) and left out."""
    spec = read_spec(folder)
    results = results_folder(folder)
    members = labels(spec)
    runs = {}
    ignored = [(d, why) for d, why in result_folders.scan(results, members).ignored if d.name not in members]
    for arm in spec.arms:
        runs[arm] = []
        for i in range(spec.members):
            run, why = verified(spec, arm, i, results)
            runs[arm].append(run)
            if why is not None:
                ignored.append((results / member_label(arm, i), why))
    result_folders.warn(ignored, results)
    return EnsembleResult(spec, runs, confidence)
