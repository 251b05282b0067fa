"""The pre-registered plan: its studies, hypotheses, tests, members and costs, read from ``docs/plan.json``.

The plan is data (``docs/plan.json``, described in ``docs/plan.md``), committed before any of its members
trains. This module reads and validates it, and derives what the queues and the report need from it:

- :class:`Study`: one ensemble the plan trains on one machine kind (``gpu`` or ``cpu``), its
  :class:`~mx_proxy.experiments.ensemble_spec.Ensemble` (:meth:`Study.ensemble`), trained in *units* of
  ``unit`` members per arm, every arm on the same seeds, so a study cut short has equal members in every arm;
- :class:`Hypothesis`: a question, its primary test and its secondary tests; the primary tests of all
  hypotheses form one family corrected by Holm's method, each hypothesis's secondary tests another;
- :func:`units`: the plan's units for one machine kind in the order they run (what is answered first when the
  machine's time runs out): each study's units in turn, in the plan's ``order``;
- :func:`power_table` and :func:`cost_table`: the power of each primary test at the plan's members, and each
  study's cost in member-steps and machine-minutes at the measured rates.

An arm named in a test is ``ARM`` (an arm of the hypothesis's study) or ``STUDY/ARM`` (another study's arm;
the two are paired by seed, which means the same initialization and batches on two machines).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from pathlib import Path

import pandas as pd

from mx_proxy.experiments import power
from mx_proxy.experiments.ensemble_spec import Ensemble
from mx_proxy.training.config import Config

__all__ = ["Plan", "Study", "Hypothesis", "Test", "Unit", "load", "units", "power_table", "cost_table", "PLAN_FILE",
           "MACHINES", "TESTS", "SCHEMA", "detectable_auc", "holm_alpha"]

PLAN_FILE = Path(__file__).resolve().parents[2] / "docs" / "plan.json"
SCHEMA = 1
MACHINES = ("gpu", "cpu")
TESTS = ("mcnemar", "main_effect", "interaction", "cochran", "auc")
SCENARIOS = (0.1, 0.3, 0.5)  # the control rates at which power_table states the detectable rates


@dataclasses.dataclass(frozen=True)
class Test:
    """One pre-registered test: ``kind`` (one of :data:`TESTS`) and what it compares (``a``/``b``: an arm or a
    pair of arms; ``cells``: a factor's two levels; ``signal``: a warning signal's name)."""

    kind: str
    a: str | tuple[str, ...] | None = None
    b: str | tuple[str, ...] | None = None
    cells: tuple[tuple[str, tuple[str, ...]], ...] = ()
    factor: str | None = None
    signal: str | None = None

    def arms(self) -> tuple[str, ...]:
        """Every arm reference the test reads."""
        refs = []
        for x in (self.a, self.b):
            refs += [x] if isinstance(x, str) else list(x or ())
        for _, level in self.cells:
            refs += list(level)
        return tuple(refs)

    def describe(self) -> str:
        if self.kind == "mcnemar":
            return f"{self.a} vs {self.b} (McNemar, paired by seed)"
        if self.kind == "main_effect":
            (hi, a), (lo, b) = self.cells
            return f"{self.factor}: {hi} {'+'.join(a)} vs {lo} {'+'.join(b)} (paired sign-flip test)"
        if self.kind == "interaction":
            return (f"({self.a[0]} − {self.a[1]}) − ({self.b[0]} − {self.b[1]}) (paired sign-flip test)")
        if self.kind == "cochran":
            return "every arm at once (Cochran's Q)"
        return f"AUC of {self.signal} (Mann–Whitney, one score per member)"


@dataclasses.dataclass(frozen=True)
class Study:
    """One ensemble of the plan (``docs/plan.json``'s ``studies``), trained on one machine kind."""

    id: str
    hypothesis: str
    machine: str
    ensemble_spec: Ensemble
    unit: int
    parent: Config | None = None

    def ensemble(self, members: int | None = None) -> Ensemble:
        """The study's ensemble, with ``members`` per arm (default: all the plan's)."""
        return self.ensemble_spec if members is None else dataclasses.replace(self.ensemble_spec, members=members)

    @property
    def members(self) -> int:
        return self.ensemble_spec.members

    def member_steps(self) -> int:
        """Member-steps of the whole study, every member trained to its horizon (the most it can cost: a member
        may stop at its first blow-up), plus its parent's steps for a branch study."""
        spec = self.ensemble_spec
        arms = len(spec.trained_arms())
        return arms * spec.members * spec.horizon + (self.parent.steps if self.parent is not None else 0)


@dataclasses.dataclass(frozen=True)
class Hypothesis:
    id: str
    study: str
    question: str
    primary: Test
    secondary: tuple[Test, ...]
    arms: tuple[str, ...] = ()  # H3's arms (the members whose signals are scored)
    window: int | None = None
    gap: int | None = None


@dataclasses.dataclass(frozen=True)
class Unit:
    """One unit of a queue: ``study``'s members ``[start, stop)`` of every arm."""

    study: Study
    start: int
    stop: int

    @property
    def label(self) -> str:
        seeds = self.study.ensemble_spec.seeds()
        return f"{self.study.id} seeds {seeds[self.start]}-{seeds[self.stop - 1]}"

    def member_steps(self) -> int:
        spec = self.study.ensemble_spec
        return len(spec.trained_arms()) * (self.stop - self.start) * spec.horizon


@dataclasses.dataclass(frozen=True)
class Plan:
    name: str
    registered: str
    alpha: float
    power: float
    correction: str
    studies: tuple[Study, ...]
    hypotheses: tuple[Hypothesis, ...]
    order: tuple[tuple[str, tuple[str, ...]], ...]
    costs: dict

    def study(self, sid: str) -> Study:
        for s in self.studies:
            if s.id == sid:
                return s
        raise ValueError(f"the plan has no study {sid!r}; valid: {', '.join(s.id for s in self.studies)}")

    def hypothesis(self, hid: str) -> Hypothesis:
        for h in self.hypotheses:
            if h.id == hid:
                return h
        raise ValueError(f"the plan has no hypothesis {hid!r}; valid: {', '.join(h.id for h in self.hypotheses)}")

    def resolve(self, hypothesis: Hypothesis, ref: str) -> tuple[Study, str]:
        """``(study, arm)`` for an arm reference of ``hypothesis``'s tests (``ARM`` or ``STUDY/ARM``)."""
        sid, arm = ref.split("/", 1) if "/" in ref else (hypothesis.study, ref)
        study = self.study(sid)
        if arm not in study.ensemble_spec.arms:
            raise ValueError(f"{hypothesis.id}: arm {ref!r} is not an arm of study {sid!r}; valid: "
                             f"{', '.join(study.ensemble_spec.arms)}")
        return study, arm


def _need(d: dict, key: str, where: str):
    if key not in d:
        raise ValueError(f"{where}: missing {key!r}")
    return d[key]


def _test(d: dict, where: str) -> Test:
    kind = _need(d, "test", where)
    if kind not in TESTS:
        raise ValueError(f"{where}: unknown test {kind!r}; valid: {', '.join(TESTS)}")
    pair = lambda v: tuple(v) if isinstance(v, list) else v  # noqa: E731
    cells = tuple((k, tuple(v)) for k, v in d.get("cells", {}).items())
    t = Test(kind, a=pair(d.get("a")), b=pair(d.get("b")), cells=cells, factor=d.get("factor"),
             signal=d.get("signal"))
    shape = {"mcnemar": isinstance(t.a, str) and isinstance(t.b, str),
             "interaction": all(isinstance(x, tuple) and len(x) == 2 for x in (t.a, t.b)),
             "main_effect": len(cells) == 2 and t.factor is not None and all(len(v) == 2 for _, v in cells),
             "cochran": d.get("arms") == "all", "auc": isinstance(t.signal, str)}[kind]
    if not shape:
        raise ValueError(f"{where}: a {kind!r} test is malformed: {d}")
    return t


def _study(d: dict, settings: dict) -> Study:
    sid = _need(d, "id", "a study")
    where = f"study {sid!r}"
    machine = _need(d, "machine", where)
    if machine not in MACHINES:
        raise ValueError(f"{where}: unknown machine {machine!r}; valid: {', '.join(MACHINES)}")
    setting = _need(d, "setting", where)
    if setting not in settings:
        raise ValueError(f"{where}: unknown setting {setting!r}; valid: {', '.join(settings)}")
    base = Config(**settings[setting]).replace(**d.get("changes", {}))
    parent = None
    if d["kind"] == "branch":
        parent = base.replace(**_need(d, "parent", where), steps=_need(d, "branch_at", where))
        base = parent
    members, unit = _need(d, "members", where), _need(d, "unit", where)
    if not isinstance(unit, int) or unit < 1 or members % unit:
        raise ValueError(f"{where}: unit ({unit!r}) must be a positive divisor of members ({members})")
    spec = Ensemble(name=sid, kind=d["kind"], base=base, arms=tuple(_need(d, "arms", where)), members=members,
                    horizon=_need(d, "horizon", where), branch_at=d.get("branch_at"),
                    first_seed=_need(d, "first_seed", where), checkpoint_every=_need(d, "checkpoint_every", where))
    return Study(sid, _need(d, "hypothesis", where), machine, spec, unit, parent)


def load(path: str | Path | None = None) -> Plan:
    """The plan in ``path`` (default :data:`PLAN_FILE`), validated: every study's ensemble is a valid
    :class:`Ensemble`, every test's arms exist, every study is in its machine's order once. A ValueError names
    the file and what is wrong."""
    path = Path(PLAN_FILE if path is None else path)
    if not path.is_file():
        raise ValueError(f"{path}: no plan there (a file is needed)")
    try:
        return _plan(json.loads(path.read_text()))
    except (ValueError, TypeError, KeyError, OSError) as e:
        raise ValueError(f"{path}: {type(e).__name__ if isinstance(e, KeyError) else ''}{e}") from None


def _plan(d: dict) -> Plan:
    if not isinstance(d, dict) or d.get("schema") != SCHEMA:
        raise ValueError(f"not a plan of schema {SCHEMA}")
    studies = tuple(_study(s, _need(d, "settings", "the plan")) for s in _need(d, "studies", "the plan"))
    ids = [s.id for s in studies]
    if len(set(ids)) != len(ids):
        raise ValueError(f"study ids repeat: {ids}")
    hyps = tuple(Hypothesis(h["id"], h["study"], h["question"], _test(h["primary"], f"{h['id']} primary"),
                            tuple(_test(t, f"{h['id']} secondary") for t in h.get("secondary", ())),
                            tuple(h.get("arms", ())), h.get("window"), h.get("gap")) for h in d["hypotheses"])
    order = tuple((m, tuple(v)) for m, v in _need(d, "order", "the plan").items())
    plan = Plan(d["name"], d["registered"], float(d["alpha"]), float(d["power"]), d["correction"], studies, hyps,
                order, dict(d.get("costs", {})))
    if plan.correction != "holm":
        raise ValueError(f"unknown correction {plan.correction!r}; valid: holm")
    for machine, sids in order:
        mine = sorted(s.id for s in studies if s.machine == machine)
        if sorted(sids) != mine:
            raise ValueError(f"order[{machine!r}] must list each {machine} study once: {mine}, got {list(sids)}")
    for h in hyps:
        plan.study(h.study)
        for t in (h.primary, *h.secondary):
            for ref in t.arms():
                plan.resolve(h, ref)
        for arm in h.arms:
            plan.resolve(h, arm)
    return plan


def units(plan: Plan, machine: str) -> list[Unit]:
    """``machine``'s units in the order they run: each study of ``plan.order[machine]`` in turn, its members in
    blocks of ``unit`` per arm."""
    if machine not in MACHINES:
        raise ValueError(f"unknown machine {machine!r}; valid: {', '.join(MACHINES)}")
    out = []
    for sid in dict(plan.order).get(machine, ()):
        s = plan.study(sid)
        out += [Unit(s, i, i + s.unit) for i in range(0, s.members, s.unit)]
    return out


def _rate(plan: Plan, study: Study, arm: str) -> float:
    """Member-steps/s of one arm at the plan's measured rates: (today, target) on a GPU, (CPU, CPU) on a CPU."""
    c, spec = plan.costs, study.ensemble_spec
    if study.machine == "cpu":
        return c["cpu"]["fp32" if spec.recipe(arm).name == "fp32" else "mx"]
    return c["gpu_today"] * (c["width256_speedup"] if spec.base.width == 256 else 1.0)


def cost_table(plan: Plan) -> pd.DataFrame:
    """Per study: members per arm, units, member-steps (at most), and the machine-minutes they take at today's
    and the target rate (one arm trained at a time, as the queues do)."""
    rows = []
    for machine, sids in plan.order:
        for sid in sids:
            s = plan.study(sid)
            spec = s.ensemble_spec
            per_arm = spec.members * spec.horizon
            today = sum(per_arm / _rate(plan, s, a) for a in spec.trained_arms()) / 60
            target = today * (plan.costs["gpu_today"] / plan.costs["gpu_target"] if machine == "gpu" else 1.0)
            rows.append(dict(study=sid, machine=machine, arms=len(spec.trained_arms()), members=spec.members,
                             units=spec.members // s.unit, member_steps=s.member_steps(),
                             minutes_today=today, minutes_target=target))
    return pd.DataFrame(rows)


def holm_alpha(plan: Plan) -> float:
    """The level of Holm's first (strictest) step over the family of primary tests."""
    return plan.alpha / len(plan.hypotheses)


def power_table(plan: Plan) -> pd.DataFrame:
    """For each hypothesis whose primary test is McNemar's: the pairs (members per arm), and the rates its
    pairs detect with the plan's power, above and below each control rate of :data:`SCENARIOS`, at the plan's
    level and at Holm's strictest step (outcomes independent within a pair: the conservative case). For H3's
    AUC: the AUC detectable with 20 blown-up and 20 stable members (normal approximation of Mann–Whitney)."""
    rows = []
    for h in plan.hypotheses:
        s = plan.study(h.study)
        n = s.members
        for level, alpha in (("alpha", plan.alpha), ("holm_first", holm_alpha(plan))):
            if h.primary.kind == "mcnemar":
                for p in SCENARIOS:
                    above, below = power.detectable(p, n, plan.power, alpha)
                    rows.append(dict(hypothesis=h.id, test=h.primary.describe(), pairs=n, level=level,
                                     alpha=alpha, control_rate=p, detectable_above=above, detectable_below=below))
            else:
                rows.append(dict(hypothesis=h.id, test=h.primary.describe(), pairs="20 + 20", level=level, alpha=alpha,
                                 control_rate=math.nan, detectable_above=detectable_auc(20, 20, plan.power, alpha),
                                 detectable_below=math.nan))
    return pd.DataFrame(rows)


def detectable_auc(positives: int, negatives: int, power_: float = 0.8, alpha: float = 0.05) -> float:
    """The smallest AUC a two-sided Mann–Whitney test at level ``alpha`` detects with ``power_``, from
    ``positives`` and ``negatives`` independent scores: 0.5 + (z_{1−α/2} + z_{power}) · SE₀, SE₀² =
    (n₁ + n₀ + 1) / (12 n₁ n₀), the AUC's variance under no difference."""
    z = statistics.NormalDist().inv_cdf
    se0 = math.sqrt((positives + negatives + 1) / (12 * positives * negatives))
    return 0.5 + (z(1 - alpha / 2) + z(power_)) * se0

