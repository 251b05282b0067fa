"""The campaign's units of work: what :func:`mx_proxy.experiments.campaign.run` hands to an executor.

One unit per compiled program, as the campaign has always grouped its runs:

- the runs of one kind that differ only in learning rate or seed: one
  vmapped sweep;
- paired runs that differ only in recipe: one program beside their shared
  FP32 run (:mod:`mx_proxy.training.twins`);
- one paired run's interventions from one step: the state there (replayed
  from the checkpoint before when the run kept none, ``mxp.with_checkpoint``)
  continued with each named mitigation.

The functions a unit calls (:func:`train_group`, :func:`intervene_from`)
are module-level and take plain data, so a Slurm job can run them; they
train into the run store and return the runs (in this process; elsewhere
the campaign reads them back from the store).
"""

from __future__ import annotations

import json
from pathlib import Path

from mx_proxy.experiments.executors.base import Work
from mx_proxy.numerics import recipe as _recipes
from mx_proxy.runner import interventions
from mx_proxy.runner import loop as runner
from mx_proxy.store import run_store as _store
from mx_proxy.training import twins
from mx_proxy.training.config import Config
from mx_proxy.training.result import Run

__all__ = ["train_group", "intervene_from", "by_kind", "group_work", "intervention_work", "child_label",
           "child_config"]


def _lr_only(configs: list[Config]) -> bool:
    """True when the configs differ only in their learning rate (one vmapped sweep)."""
    first = configs[0]
    return len(configs) > 1 and all(c.replace(lr=first.lr) == first for c in configs)


def train_group(configs: list[str], *, store, progress: bool = True) -> list[Run]:
    """Train one campaign group (its configs as JSON) into ``store``: an LR
    sweep, paired recipes beside one FP32 run, or one by one; returns the
    runs in the order given. Finished runs load from the store."""
    configs = [Config.from_dict(json.loads(c)) for c in configs]
    if _lr_only(configs):
        return list(runner.sweep(configs[0], store=store, progress=progress, lr=[c.lr for c in configs]).runs)
    if twins.shareable(configs):  # 1 + k runs for k recipes
        return list(runner.sweep(configs[0], store=store, progress=progress,
                                 recipe=[c.recipe for c in configs]).runs)
    return [runner.train(c, store=store, progress=progress) for c in configs]


def child_config(parent: Config, name: str) -> Config:
    """The config of ``parent``'s intervention ``name`` as the campaign runs it (no checkpoints)."""
    return parent.replace(recipe=_recipes.mitigate(parent.recipe, [name]), checkpoint_at=(), checkpoint_every=0)


def intervene_from(parent, at_step: int, names: list[str], *, store, progress: bool = True) -> list[Run]:
    """Continue ``parent`` (a :class:`Run`, or its store folder) from
    ``at_step`` with each mitigation of ``names``; the state there is
    replayed from the checkpoint before when the run kept none. Returns the
    children in the order of ``names``."""
    parent = runner.load(parent) if isinstance(parent, (str, Path)) else parent
    source = interventions.with_checkpoint(parent, at_step, progress=progress)
    return [interventions.intervene(source, at_step, apply=name, checkpoint_at=(), checkpoint_every=0,
                                    store=store if store is not None else False, progress=progress)
            for name in names]


def by_kind(entries: list, kinds) -> dict[str, list[Work]]:
    """The units of the planned ``entries`` (with ``label``, ``kind`` and
    ``config``), by kind (every one of ``kinds`` a key): one per compiled
    program, LRs and seeds vmapped, paired recipes beside their shared FP32 run."""
    groups: dict = {}
    for e in entries:
        key = (e.kind, e.config.replace(lr=1.0, seed=0, reference_seed=None))
        if e.kind == "paired":
            key = (e.kind, e.config.replace(recipe="fp32"))
        groups.setdefault(key, []).append(e)
    units: dict[str, list] = {k: [] for k in kinds}
    for (kind, _), members in groups.items():
        units[kind].append(group_work(kind, members, f"{kind}: {', '.join(m.label for m in members)}"))
    return units


def group_work(kind: str, members: list, name: str) -> Work:
    """The unit of one campaign group (``members``: its planned entries, with
    ``label`` and ``config``)."""
    configs = [m.config for m in members]
    paired = 2 if configs[0].has_paired_run else 1
    cost = sum(c.steps for c in configs) * paired if not twins.shareable(configs) else \
        configs[0].steps * (1 + len(configs))
    return Work(name=name, cost=float(cost), fn=train_group, args=([c.to_json() for c in configs],),
                keys=tuple(c.hash() for c in configs), labels=tuple(m.label for m in members))


def child_label(parent_label: str, at_step: int, name: str) -> str:
    """The results label of an intervention."""
    return f"intervention-{parent_label.removeprefix('paired-')}-at{at_step}-{name}"


def intervention_work(parent: Run, parent_label: str, at_step: int, names: list[str], store) -> Work:
    """The unit of ``parent``'s interventions ``names`` from ``at_step``. With
    a store the job reads the parent from its folder; without one (in this
    process only) it is handed the run itself."""
    pc = parent.config
    parent_key = parent.info.get("key", pc.hash())
    keys = tuple(_store.entry_key(child_config(pc, n), parent_key, at_step) for n in names)
    source = parent.path if store is not None and parent.path is not None else parent
    steps = pc.steps - at_step
    return Work(name=f"{parent_label} at {at_step}: {', '.join(names)}",
                cost=float(steps * len(names) * (2 if pc.has_paired_run else 1)), fn=intervene_from,
                args=(str(source) if isinstance(source, str) else source, at_step, list(names)), keys=keys,
                labels=tuple(child_label(parent_label, at_step, n) for n in names))
