"""The lean ensemble mode for rates: an ensemble that records what its tests read, and nothing more.

A rate (a blow-up count out of N members, a McNemar pair) reads each member's loss, which every step records, and
the engine's blow-up stop; the warning-signal scoring (:mod:`mx_proxy.experiments.signals`, the plan's H3) also
reads the diagnostics. So :func:`lean` turns an ensemble into its lean version:

- **diagnostics** only as often as the scoring needs: every :data:`SIGNAL_PERIOD` steps for an ensemble whose
  signals are scored, never otherwise. Why 50: the plan's H3 scores each member by a signal's largest value over
  its diagnostic steps in (T − 500, T − 50] (docs/plan.md), so a diagnostic step every 50 puts one in every
  50-step stretch of that window; the signals that need no diagnostic step (update norm, loss jump, GNMR from the
  per-block gradient norms) are recorded every step anyway. Measured on the committed Fig. 7 ensembles (recorded
  every 5 steps; 18 and 26 blow-ups), the pooled AUCs at H = 100 and 500 of H3's seven signals from every 50th
  step alone differ from those from every 5th by at most 0.033 (docs/ensembles.md, "Lean ensembles"); what
  every 50 steps cannot give is the signals module's descriptive lead time, which there was 1–10 steps.
- **no twin** unless asked: a branch ensemble's ``twin`` arm (the paired FP32 run, which doubles its arm's
  cost) is dropped unless ``twin=True``;
- the loss every step, and the train state on the device from one segment to the next (the host loop's: only a
  segment's metrics come to the host, once per segment), as in every ensemble.

The members' group size (how many share one compiled program) is the caller's, from a measurement
(``mx-proxy bench members``). On a CPU a lean member's loss equals its member in the full ensemble bit for bit
(the diagnostics sit in a conditional the plain steps do not take; tests/experiments/test_lean.py); elsewhere the
two are two programs, equal where the compiler makes them so.
"""

from __future__ import annotations

import dataclasses

from mx_proxy.experiments import plan as _plan
from mx_proxy.experiments.ensemble_spec import TWIN, Ensemble

__all__ = ["SIGNAL_PERIOD", "lean", "scored", "study_spec"]

SIGNAL_PERIOD = 50
"""Steps between the diagnostic steps of a lean ensemble whose warning signals are scored (see the module)."""


def lean(spec: Ensemble, *, signals: bool, twin: bool = False, period: int = SIGNAL_PERIOD) -> Ensemble:
    """The lean version of ``spec``: diagnostics every ``period`` steps where ``signals`` are scored (never
    otherwise), its ``twin`` arm only if ``twin``. A twin needs diagnostics (its ζ is one): kept, it keeps them."""
    arms = spec.arms if twin else tuple(a for a in spec.arms if a != TWIN)
    every = period if signals or TWIN in arms else 0
    return dataclasses.replace(spec, arms=arms, diagnostics_every=every)


def scored(plan: _plan.Plan, study: str) -> bool:
    """Whether a hypothesis of ``plan`` scores warning signals (an ``auc`` test) on ``study``'s members."""
    return any(h.study == study and any(t.kind == "auc" for t in (h.primary, *h.secondary))
               for h in plan.hypotheses)


def study_spec(plan: _plan.Plan, study: _plan.Study) -> Ensemble:
    """The lean ensemble of one of ``plan``'s studies: its diagnostics every :data:`SIGNAL_PERIOD` steps if its
    signals are scored (H3's study), else never; the plan's twin arms kept (the plan asks for them)."""
    spec = study.ensemble_spec
    return lean(spec, signals=scored(plan, study.id), twin=True, period=spec.diagnostics or SIGNAL_PERIOD)
