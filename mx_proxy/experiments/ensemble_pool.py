"""Several ensembles of one member config, reported as one.

An ensemble's members are often trained as more than one ensemble: seeds
1–8 in one session, seeds 9–16 later, each with its own results folder.
:func:`pool` joins them into one :class:`~mx_proxy.experiments.ensemble_result.EnsembleResult`
whose member i has seed s_i = s_0 + i over all of them, so every rate,
interval and paired test counts every member (``mx-proxy report A B``).

Ensembles pool when

- each is a ``seed`` or ``data`` ensemble (a ``branch`` ensemble's members
  also depend on its branch state, which its spec does not identify);
- they have the same arms (the pooled order, and so the control, is the
  first ensemble's);
- every arm trains the same member config in each, up to the seeds the
  ensemble's kind varies and how often it checkpoints
  (:func:`member_config`); and
- their seeds follow on from one another, no gap and no overlap, once sorted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from mx_proxy.experiments.ensemble import Ensemble
from mx_proxy.experiments.ensemble_result import EnsembleResult
from mx_proxy.training.config import Config

__all__ = ["pool", "member_config", "POOLED_KINDS"]

POOLED_KINDS = ("seed", "data")
_VARIED = {"seed": ("seed", "data_seed"), "data": ("data_seed",)}


def member_config(spec: Ensemble, arm: str) -> Config:
    """The config every member of ``arm`` trains, its varied seeds (``seed``
    and ``data_seed`` in a seed ensemble, ``data_seed`` in a data one) set to
    0 and its ``checkpoint_every`` to its ``diagnostics_every`` (or 1): these
    change no result."""
    config = spec.config(arm, 0)
    zeros = {field: 0 for field in _VARIED[spec.kind]}
    return config.replace(checkpoint_every=max(config.diagnostics_every, 1), **zeros)


def _differing(a: Config, b: Config) -> list[str]:
    return [f.name for f in dataclasses.fields(Config) if getattr(a, f.name) != getattr(b, f.name)]


def _seed_range(spec: Ensemble) -> str:
    return f"s_i = {spec.first_seed}…{spec.first_seed + spec.members - 1}"


def pool(results: Sequence[EnsembleResult]) -> EnsembleResult:
    """``results`` (each an :class:`EnsembleResult`, e.g. from
    :func:`~mx_proxy.experiments.ensemble_result.load`) as one ensemble:
    named ``A+B+…`` in seed order, ``first_seed`` the smallest, ``members``
    the sum, each arm's members in seed order (``None`` where one is not
    exported yet), the first result's arm order, confidence and control.
    A ValueError names what keeps them apart (module docstring)."""
    results = list(results)
    if not results:
        raise ValueError("no ensembles to pool")
    if not all(isinstance(r, EnsembleResult) for r in results):
        raise TypeError(f"pool takes EnsembleResults, got {[type(r).__name__ for r in results]}")
    first = results[0]
    if len(results) == 1:
        return first
    names = [r.spec.name for r in results]
    if len(set(names)) != len(names):
        raise ValueError(f"an ensemble given twice: {names}")
    for r in results:
        s = r.spec
        if s.kind not in POOLED_KINDS:
            raise ValueError(f"ensemble {s.name!r} is a {s.kind} ensemble; only {' and '.join(POOLED_KINDS)} "
                             f"ensembles pool (a branch ensemble's members also depend on its state)")
        if s.kind != first.spec.kind:
            raise ValueError(f"ensembles {first.spec.name!r} and {s.name!r} vary different things: "
                             f"{first.spec.kind} and {s.kind}")
        if set(s.arms) != set(first.spec.arms):
            raise ValueError(f"ensembles {first.spec.name!r} and {s.name!r} have different arms: "
                             f"{', '.join(map(repr, first.spec.arms))} and {', '.join(map(repr, s.arms))}")
        for arm in first.spec.arms:
            differ = _differing(member_config(first.spec, arm), member_config(s, arm))
            if differ:
                raise ValueError(f"ensembles {first.spec.name!r} and {s.name!r} train different {arm!r} members: "
                                 f"they differ in {', '.join(differ)}")
    ordered = sorted(results, key=lambda r: r.spec.first_seed)
    for a, b in zip(ordered, ordered[1:]):
        if b.spec.first_seed != a.spec.first_seed + a.spec.members:
            raise ValueError(f"the ensembles' seeds must follow on from one another: {a.spec.name!r} has "
                             f"{_seed_range(a.spec)}, {b.spec.name!r} {_seed_range(b.spec)}")
    spec = dataclasses.replace(first.spec, name="+".join(r.spec.name for r in ordered),
                               first_seed=ordered[0].spec.first_seed, members=sum(r.spec.members for r in ordered))
    runs = {arm: [run for r in ordered for run in r.runs[arm]] for arm in first.spec.arms}
    return EnsembleResult(spec, runs, first.confidence, first.control_arm)
