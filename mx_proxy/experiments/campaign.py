"""``mx-proxy campaign``: the paper's headline experiments, run where the paper ran them.

A scale's :class:`~mx_proxy.experiments.scales.Campaign` lists four kinds of runs:

- ``grid``: Fig. 2, every width × recipe × learning rate (the LRs of one
  width and recipe are one vmapped program);
- ``paired``: Figs. 4/5, each MX recipe with its FP32 run trained alongside
  (``paired_run=True``; the recipes of one width, LR and seed share one
  FP32 run, :mod:`mx_proxy.training.twins`): every diagnostic step records the same-point ‖ζ‖
  bound (quantization error at the same weights), the paper's squared ζ
  against the FP32 run, the cosines and the LN clamp fractions;
- ``control``: the paper metric's controls, e.g. FP32 against FP32 with
  another seed (two decorrelated runs give ζ_paper ≈ 2 with nothing
  quantized);
- ``intervention``: Fig. 7, the first paired run continued from its
  checkpoints with each named intervention.

Runs train into a run store (``OUT/runs``: resumable, and a second call loads
what is done) and are exported, as they finish, to a compact results folder
(``OUT/results``): per run ``metrics.parquet`` (every step), ``config.json``
and ``run.json`` (label, kind, divergence, wall time, code version), and an
``index.csv`` of all of them. :func:`load_results` reads such a folder back
as :class:`~mx_proxy.training.result.Run` objects (without parameters) for the figures.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import jax
import pandas as pd

from mx_proxy.experiments import analysis, campaign_units, executors, result_folders
from mx_proxy.experiments import scales as _scales
from mx_proxy.runner import device as _device
from mx_proxy.runner import interventions
from mx_proxy.runner import loop as runner
from mx_proxy.store import checkpoint as ckpt
from mx_proxy.store import durable, files, tables
from mx_proxy.store import run_store as _store
from mx_proxy.training import twins
from mx_proxy.training.config import Config
from mx_proxy.training.engine import compiler_options, dynamic_for, program_for
from mx_proxy.training.result import Run

__all__ = ["KINDS", "Entry", "plan", "run", "export", "load_results", "load_result", "results_index", "lr_label",
           "intervention_steps"]

KINDS = ("grid", "paired", "control", "intervention")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One planned run: its results-folder ``label``, ``kind`` and config."""

    label: str
    kind: str
    config: Config


def lr_label(v: float) -> str:
    """A learning rate as the labels write it: 6e-4, 1e-3."""
    return f"{v:.0e}".replace("e-0", "e-")


def plan(scale: str | _scales.ExperimentScale, kinds: Iterable[str] = KINDS) -> list[Entry]:
    """The grid, paired and control runs of a scale's campaign (interventions
    follow from the trained paired run, see :func:`run`)."""
    s = scale if isinstance(scale, _scales.ExperimentScale) else _scales.get(scale)
    c = s.campaign
    if c is None:
        raise ValueError(f"scale {s.name!r} has no campaign; scales with one: "
                         f"{', '.join(n for n in _scales.names() if _scales.get(n).campaign)}")
    kinds = _check_kinds(kinds)
    base = s.config.replace(checkpoint_every=0, checkpoint_at=())
    out: list[Entry] = []
    if "grid" in kinds:
        for w in c.grid_widths:
            for r in c.grid_recipes:
                for lr in c.grid_lrs:
                    cfg = base.replace(width=w, recipe=r, lr=lr, steps=c.grid_steps,
                                       diagnostics_every=c.grid_diagnostics_every,
                                       val_every=_multiple(base.val_every, c.grid_diagnostics_every))
                    out.append(Entry(f"grid-w{w}-{r}-lr{lr_label(lr)}", "grid", cfg))
    paired_base = s.config.replace(steps=c.paired_steps, paired_run=True, checkpoint_every=c.checkpoint_every,
                                   checkpoint_at=tuple(c.intervention_steps))
    if "paired" in kinds:
        for w in c.paired_widths:
            for r in c.paired_recipes:
                for lr in c.paired_lrs:
                    for seed in c.seeds:
                        cfg = paired_base.replace(width=w, recipe=r, lr=lr, seed=seed)
                        out.append(Entry(f"paired-w{w}-{r}-lr{lr_label(lr)}-s{seed}", "paired", cfg))
    if "control" in kinds:
        for w in c.paired_widths:
            for recipe, ref, offset in c.controls:
                for seed in c.seeds:
                    cfg = paired_base.replace(width=w, recipe=recipe, reference_recipe=ref, lr=c.paired_lrs[0],
                                              seed=seed, reference_seed=seed + offset if offset else None,
                                              checkpoint_every=0, checkpoint_at=())
                    tag = f"{recipe}-vs-{ref}" + (f"-seed+{offset}" if offset else "")
                    out.append(Entry(f"control-w{w}-{tag}-s{seed}", "control", cfg))
    return out


def _multiple(every: int, period: int) -> int:
    return max(period, (every // period) * period) if every else 0


def _check_kinds(kinds) -> tuple[str, ...]:
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"unknown campaign part(s) {bad}; valid: {', '.join(KINDS)}")
    return kinds


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def export(run_: Run, label: str, kind: str, results: str | os.PathLike) -> Path:
    """Write one run's compact results to ``results/label/`` (metrics,
    config, provenance; no parameters) atomically, and return the folder."""
    folder = Path(results) / label
    folder.mkdir(parents=True, exist_ok=True)
    meta = {
        "label": label, "kind": kind, "diverged_at": run_.diverged_at, "steps_run": int(len(run_.metrics)),
        "final_loss": run_.final_loss, "wall_time_s": run_.wall_time_s, "key": run_.info.get("key"),
        # the intervention's keys sorted, as the store returns them, so a re-export writes the same bytes
        "intervention": json.loads(json.dumps(run_.info.get("intervention"), sort_keys=True, default=str)),
        "parent": run_.info.get("parent"), "code_version": _store.code_version(), "git_commit": _git_commit(),
        # the machines it trained on (recorded by the host loop); this one for a run that recorded none
        "device": run_.info.get("device") or _device.describe(), "host": platform.node(),
    }
    for name, write in (("metrics.parquet", lambda p: tables.to_file(run_.metrics, p)),
                        ("config.json", lambda p: Path(p).write_text(run_.config.to_json())),
                        ("run.json", lambda p: Path(p).write_text(json.dumps(meta, indent=1, default=str)))):
        durable.atomic_write(folder / name, write)
    return folder


def results_index(results: str | os.PathLike) -> pd.DataFrame:
    """One row per exported run of a results folder (from each ``run.json``
    and ``config.json``), sorted by label; copies, foreign and damaged
    folders are ignored, named in one warning (:func:`mx_proxy.experiments.result_folders.index`)."""
    return result_folders.index(results)


def load_results(results: str | os.PathLike, kinds: Iterable[str] = KINDS) -> list[Run]:
    """The exported runs of a results folder (``kinds`` only), as :class:`Run`
    objects without parameters; ``info`` holds the ``run.json`` fields. Only
    folders that hold their own label's run count
    (:func:`mx_proxy.experiments.result_folders.scan`); a copy, a foreign or a
    damaged one is ignored, named in one warning, and the rest are read."""
    kinds = _check_kinds(kinds)
    found = result_folders.scan(results)
    runs, ignored = [], list(found.ignored)
    for folder, _ in found.found.values():
        try:
            runs.append(load_result(folder))
        except files.EntryError as e:
            ignored.append((folder, str(e)))
    result_folders.warn(ignored, results)
    return [r for r in runs if r.info["kind"] in kinds]


def load_result(folder: str | os.PathLike) -> Run:
    """One exported run (``results/<label>/``) as a :class:`Run` without
    parameters; ``info`` holds its ``run.json`` fields. Every file is
    verified (:mod:`mx_proxy.store.files`): a damaged one is a ValueError naming it."""
    folder = Path(folder)
    meta = files.read_json(folder / "run.json", files.RESULT_META)
    cfg = files.read_config(folder / "config.json")
    metrics = files.read_metrics(folder / "metrics.parquet", meta["steps_run"], cfg)
    return Run(cfg, metrics, meta["diverged_at"], None, meta.get("wall_time_s") or 0.0, dict(meta), str(folder))


def _of_widths(entries: list, widths, scale: str) -> list:
    """The planned ``entries`` of ``widths`` (all for None); a width the
    campaign does not plan is a ValueError naming those it does."""
    if widths is None:
        return entries
    planned = sorted({e.config.width for e in entries})
    unknown = sorted(set(widths) - set(planned))
    if unknown:
        raise ValueError(f"campaign {scale!r} plans no run of width {', '.join(map(str, unknown))}; its widths: "
                         f"{', '.join(map(str, planned))}")
    return [e for e in entries if e.config.width in set(widths)]


def run(scale: str | _scales.ExperimentScale, out: str | os.PathLike, *, kinds: Iterable[str] = KINDS,
        widths: Iterable[int] | None = None, seeds: Iterable[int] | None = None, progress: bool = True,
        store: bool = True, log: Callable[[str], None] = print, estimate: bool = False,
        executor: executors.Executor | None = None) -> pd.DataFrame:
    """Train (or load) every run of the scale's campaign into ``out/runs`` (or
    memory only with ``store=False``) and export each to ``out/results`` as
    soon as it is done; returns the index.

    ``kinds``: the parts to run (``grid``, ``paired``, ``control``,
    ``intervention``); ``widths``: only these widths; ``seeds``: the paired
    runs and controls at these student-init seeds instead of the scale's
    (:func:`~mx_proxy.experiments.scales.with_seeds`). Runs of one width and
    recipe that differ only in LR or seed train as one vmapped program: each
    such group is one unit of work (:mod:`mx_proxy.experiments.campaign_units`)
    for ``executor`` (default: this process, one unit after another, the
    headline first; ``executors.make("slurm", ...)``: one Slurm array task
    per unit, needs the store). Interrupted, it resumes: finished runs load
    from the store and an unfinished one continues from its last
    checkpoint. ``estimate``: first time two steps of each paired run still
    to train and log the expected wall time (a compile each).

    Raises:
      executors.UnitsFailed: after everything else finished and was
        exported, naming each unit that did not (with its log's last lines).
    """
    s = _scales.with_seeds(scale, seeds)
    kinds = _check_kinds(kinds)
    executor = executor if executor is not None else executors.LocalExecutor()
    out = durable.checked_path(out, "campaign folder", folder=True)
    store, results = (out / "runs" if store else None), out / "results"
    entries = _of_widths(plan(s, kinds), widths, s.name)
    units = campaign_units.by_kind(entries, KINDS)
    t0 = time.perf_counter()
    trained: dict[str, Run] = {}  # label -> run, as units finish
    kind_of = {u.name: k for k, us in units.items() for u in us}

    def on_start(unit, _):
        log(f"[campaign {s.name}] {unit.name}")

    def on_done(unit, runs):
        runs = runs if runs is not None else _from_store(store, unit)
        kind = kind_of.get(unit.name, "intervention")
        replay = (runs[0].info.get("intervention") or {}).get("replay") if kind == "intervention" else None
        if replay:
            log(f"  {unit.name.split(' at ')[0]}: "
                f"{interventions.replay_summary(replay, runs[0].info['intervention']['at_step'])}")
        for label, r in zip(unit.labels, runs):
            trained[label] = r
            export(r, label, kind, results)
            log(f"  {label}: final loss {r.final_loss:.4g}, {_outcome(r, kind)}"
                + ("" if kind == "intervention" else f" ({time.perf_counter() - t0:.0f}s)"))

    if estimate and "paired" in kinds:
        _estimate(s, units["paired"], results, log)
    hooks = dict(on_start=on_start, on_done=on_done, progress=progress, log=log)
    failures = []
    # the headline first (a time-limited run keeps what it finished): paired runs, their interventions,
    # the controls, then the LR grid; an executor that runs units at once gets all but the interventions together
    rest = units["control"] + units["grid"]
    failures += executor.run(units["paired"] + (rest if executor.concurrent else []), store, **hooks)
    if "intervention" in kinds and s.campaign.interventions:
        work = _interventions(s, widths, store, trained, executor, progress, log)
        failures += executor.run(work, store, **hooks)
    if not executor.concurrent:
        failures += executor.run(rest, store, **hooks)
    index = results_index(results)
    if len(index):
        durable.atomic_write(results / "index.csv", lambda p: index.to_csv(p, index=False))
    if failures:
        raise executors.UnitsFailed(failures)
    return index


def _from_store(store, unit) -> list[Run]:
    """The runs of a unit that trained elsewhere, read back from the store."""
    st = _store.resolve(store)
    runs = [st.load(k) for k in unit.keys] if st is not None else []
    if len(runs) != len(unit.keys) or any(r is None for r in runs):
        raise RuntimeError(f"unit {unit.name} finished but the run store {store} does not hold all its runs")
    return runs


def _outcome(r: Run, kind: str) -> str:
    if kind != "intervention":
        return f"diverged at {r.diverged_at}" if r.diverged_at is not None else "stable"
    onset = analysis.unstable_after(r, r.info["intervention"]["at_step"])
    return "stable" if onset is None else (f"diverged at {onset}" if onset == r.diverged_at else f"blew up at {onset}")


def _estimate(s: _scales.ExperimentScale, units, results: Path, log) -> None:
    """Log the measured seconds per step of each paired group still to train, and the total."""
    total = 0.0
    for unit in units:
        todo = [Config.from_dict(json.loads(c)) for c, label in zip(unit.args[0], unit.labels)
                if not (results / label / "run.json").exists()]
        if not todo:
            continue
        sec = seconds_per_step(todo)
        total += sec * todo[0].steps
        log(f"[campaign {s.name}] {unit.name.removeprefix('paired: ')}: {sec * 1e3:.0f} ms/step measured here, "
            f"{todo[0].steps} steps ≈ {_duration(sec * todo[0].steps)}")
    if total:
        log(f"[campaign {s.name}] expected wall time of the paired runs still to train: {_duration(total)} "
            f"from scratch (less where the store holds checkpoints to resume from)")


def intervention_steps(campaign_: _scales.Campaign, parent: Run) -> list[int]:
    """The steps to continue ``parent`` from: with
    ``interventions_after_divergence``, the campaign's intervention steps
    before the run became unstable (:func:`analysis.unstable_at`: diverged,
    or blew up 10× over its recent minimum), its newest checkpoint before
    that and, with ``late_intervention``, the diagnostics step that many
    steps before it (which may need a replay: ``mxp.with_checkpoint``), or
    none for a stable run; otherwise the campaign's steps (those before a
    divergence)."""
    onset = analysis.unstable_at(parent) if campaign_.interventions_after_divergence else parent.diverged_at
    if campaign_.interventions_after_divergence and onset is None:
        return []
    steps = [t for t in campaign_.intervention_steps if onset is None or t < onset]
    if campaign_.interventions_after_divergence:
        before = [t for t in interventions.checkpoint_steps(parent) if t < onset and not _stop_checkpoint(parent, t)]
        steps += [max(before)] if before and max(before) not in steps else []
        every = parent.config.diagnostics_every or 1
        late = (onset - campaign_.late_intervention) // every * every
        steps += [late] if campaign_.late_intervention and late > 0 and late not in steps else []
    return sorted(steps)


def _stop_checkpoint(parent: Run, step: int) -> bool:
    """Whether ``parent``'s checkpoint at ``step`` is one a stopped job wrote
    where it stopped (:data:`mx_proxy.runner.loop.stop`), not a planned one."""
    if parent.path is None or parent.checkpoints:
        return False
    return bool(ckpt.meta(Path(parent.path) / "checkpoints", step).get("stopped"))


def _interventions(s: _scales.ExperimentScale, widths, store, trained: dict, executor, progress, log) -> list:
    """Fig. 7's units: paired runs at the largest width (first LR and seed)
    continued from each of :func:`intervention_steps` with each mitigation:
    the first paired recipe's run, or, with ``interventions_after_divergence``,
    every paired run that diverged or blew up. A parent comes from this call
    (``trained``), else from the store; a local executor trains one missing."""
    c = s.campaign
    paired = [e for e in plan(s, ("paired",)) if widths is None or e.config.width in widths]
    if not paired:
        return []
    top = max(e.config.width for e in paired)
    first = [e for e in paired if e.config.width == top and e.config.lr == c.paired_lrs[0]
             and e.config.seed == c.seeds[0]]
    if not c.interventions_after_divergence:
        first = [e for e in first if e.config.recipe.name == c.paired_recipes[0]]
    work = []
    for p in first:
        parent = trained.get(p.label)
        if parent is None and executor.name == "local":
            parent = runner.train(p.config, store=store, progress=progress)
        elif parent is None:
            parent = _store.resolve(store).load(p.config.hash()) if store is not None else None
        if parent is None:
            log(f"  {p.label}: not trained (its unit did not finish), so no interventions from it yet")
            continue
        steps = intervention_steps(c, parent)
        if not steps:
            onset = analysis.unstable_at(parent)
            log(f"  {p.label}: stable to step {p.config.steps}, no interventions needed" if onset is None
                else f"  {p.label}: no checkpoint before it became unstable (step {onset})")
            continue
        work += [campaign_units.intervention_work(parent, p.label, t, list(c.interventions), store) for t in steps]
    return work


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{max(seconds / 60, 0.1):.1f} min"


def seconds_per_step(configs: list[Config], steps: int = 2) -> float:
    """Measured wall seconds of one training step of ``configs`` trained
    together (one config, or paired recipes sharing their FP32 run; paired
    runs and diagnostics included, at their period): at least ``steps``
    steps timed after a compiled warm-up call."""
    configs = configs if twins.shareable(configs) else configs[:1]
    first = configs[0]
    program = twins.TwinProgram(tuple(configs)) if len(configs) > 1 else program_for(first)
    dyn = dynamic_for(first)
    opts = compiler_options(first)
    states = [jax.jit(program_for(c).init, compiler_options=opts)(dyn) for c in configs]
    teacher = states[0][1]
    state = twins.twin_state([st for st, _ in states]) if len(configs) > 1 else states[0][0]
    n = max(steps, first.diagnostics_every or 1)
    seg = jax.jit(program.segment, static_argnames=("size",), compiler_options=opts)
    start, steps = jax.numpy.int32(0), jax.numpy.int32(n)
    jax.block_until_ready(seg(state, dyn, teacher, start, steps, size=n))
    t0 = time.perf_counter()
    jax.block_until_ready(seg(state, dyn, teacher, start, steps, size=n))
    return (time.perf_counter() - t0) / n
