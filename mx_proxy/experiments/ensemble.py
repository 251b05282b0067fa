"""Ensembles: N members of one configuration that differ in one named, recorded perturbation.

An instability the paper calls stochastic is a rate; one trajectory is one
draw. An :class:`Ensemble` trains, per *arm* (a recipe or an intervention),
``members`` runs that differ only in:

- ``seed``: the student's init and its data stream (``seed = data_seed = s_i``);
- ``data``: the data stream only (``data_seed = s_i``, same init);
- ``branch``: replicas continued from one stored state at step ``branch_at``
  (:mod:`mx_proxy.experiments.branch`), each on its own data stream after it
  (``data_seed = s_i``; the batch of step t is a pure function of the data
  seed and t), optionally with its parameters scaled by ``1 + ε·z``, z ~ N(0, 1)
  drawn from ``s_i`` (the same z for every arm).

with ``s_i = first_seed + i``: member i of every arm sees the same
perturbation, so arms are paired. An arm is ``unchanged`` (the base recipe),
a mitigation of it (:data:`mx_proxy.numerics.recipe.MITIGATIONS`, e.g.
``fp32``, ``rceil``, ``paper_bump``) or a recipe preset (``mxfp8_e4m3``).
In a branch ensemble whose state holds the paired FP32 run, the arm ``twin``
is that run branched with the same perturbations: it trains beside the
``unchanged`` arm as its paired run (one program; the paper's ζ against it
is recorded every step), and is exported as an arm of its own.

The members of an arm share one compiled program (they differ only in seeds,
dynamic fields) and train as groups of the runner's member axis: the units
(:func:`units`: an arm and up to ``group_size`` of its members) that
:func:`run` hands to an executor (:mod:`mx_proxy.experiments.executors`:
this process, ``jobs`` local worker processes, or a Slurm array). Folder ``OUT``:

- ``OUT/runs/``: the run store (members train there, checkpointing every
  ``checkpoint_every`` steps, the newest two kept, so an interrupted ensemble
  resumes across sessions under the same code);
- ``OUT/branch/``: the branch state (branch ensembles);
- ``OUT/results/``: ``ensemble.json`` (the spec) and one exported folder per
  member, ``<arm>-m<i>/`` (``metrics.parquet`` from ``branch_at − 100`` on
  for branch members, so the blow-up rule sees its window; ``config.json``,
  ``run.json``), written as each unit finishes, ``index.csv`` and, for a
  branch ensemble, ``branch_history.parquet`` (the state's loss and gradient
  norms before the branch). This
  folder is what :mod:`mx_proxy.experiments.ensemble_result` and ``mx-proxy
  report`` read. A member it holds but the store does not (a fresh
  machine, the results copied back) is done and loaded from there; a
  branch state must have the history ``branch_history.parquet`` recorded.
"""

from __future__ import annotations

import time
from pathlib import Path

from mx_proxy.experiments import branch as _branch
from mx_proxy.experiments import executors
from mx_proxy.experiments.ensemble_export import copy_members, export, exported, set_aside
from mx_proxy.experiments.ensemble_spec import (
    CONTROL,
    HISTORY,
    HISTORY_FILE,
    KINDS,
    MAX_MEMBERS,
    SPEC_FILE,
    TWIN,
    Ensemble,
    arm_names,
    default_out,
    ensemble_folder,
    extends,
    member_key,
    member_label,
    positive_int,
    read_history,
    read_spec,
    write_spec,
)
from mx_proxy.experiments.executors.local import MAX_JOBS
from mx_proxy.numerics import recipe_json
from mx_proxy.numerics.recipe import MITIGATIONS
from mx_proxy.runner import interventions
from mx_proxy.runner import loop as runner
from mx_proxy.runner.interrupt import interruptible
from mx_proxy.store import checkpoint as ckpt
from mx_proxy.store import run_store as _store
from mx_proxy.store import tables
from mx_proxy.training import memory as _memory
from mx_proxy.training.config import Config
from mx_proxy.training.engine import dynamic_for, program_for
from mx_proxy.training.result import Run

# the spec's names are re-exported: mx_proxy.experiments.ensemble is the experiment's one entry point
__all__ = ["Ensemble", "KINDS", "CONTROL", "TWIN", "HISTORY", "SPEC_FILE", "HISTORY_FILE", "arm_names", "extends",
           "member_label", "member_key", "read_spec", "read_history", "default_out", "units", "work", "train_unit",
           "train_arm", "run", "export", "exported", "copy_members", "prepare", "prepare_branch", "read_branch",
           "ensemble_folder"]

KEEP_CHECKPOINTS = 2  # a group interrupted while saving resumes from the newest step every member holds


# --------------------------------------------------------------------------- members


def _info(spec: Ensemble, arm: str, i: int, key: str, parent: str | None) -> dict:
    info = {"key": key, "ensemble": {"name": spec.name, "kind": spec.kind, "arm": arm, "member": i,
                                     **spec.perturbation(i)}}
    if spec.kind == "branch":
        config = spec.config(arm, i)
        applied = [arm] if arm in MITIGATIONS else []
        info.update(parent=parent, perturbation=spec.perturbation(i),
                    intervention={"at_step": spec.branch_at, "recipe": recipe_json.to_json(config.recipe),
                                  "apply": applied, "changes": {"data_seed": config.data_seed}})
    return info


def _resume(config: Config, sink: ckpt.CheckpointSink, at: int) -> tuple | None:
    """(state, metrics, step, wall) of the newest checkpoint at or before
    ``at`` this member's own config wrote; damaged ones are dropped."""
    for step in reversed([s for s in sink.steps() if s <= at and sink.meta(s).get("config_hash") == config.hash()]):
        try:
            state, past = sink.restore(step, ckpt.template(program_for(config), dynamic_for(config)), config)
        except ckpt.CheckpointError as e:
            ckpt.set_aside(sink.directory, step, str(e))
            continue
        return state, past, step, float(sink.meta(step).get("wall_time_s", 0.0))
    return None


def _member(spec: Ensemble, arm: str, i: int, st: _store.Store, key: str, branch: _branch.Branch | None,
            at: int) -> runner.Member:
    """Member ``i`` of ``arm``, resumed from its newest checkpoint at or before
    ``at`` if it has one, else at its start (the branch state, perturbed)."""
    config = spec.config(arm, i)
    st.prepare(key, fresh=False)
    sink = ckpt.CheckpointSink(st.checkpoint_dir(key), keep_last=KEEP_CHECKPOINTS)
    info = _info(spec, arm, i, key, branch.key if branch else None)
    found = _resume(config, sink, at)
    if found is not None:
        state, past, step, wall = found
        _, teacher = runner.init_state(config)
        info["resumed_from"] = step
        if sink.meta(step).get("device"):
            info["device"] = sink.meta(step)["device"]  # the machines of the stretches before this one
        return runner.Member(config, state, teacher, sink, step, [past] if past is not None and len(past) else [],
                             info, wall)
    if branch is None:
        state, teacher = runner.init_state(config)
        return runner.Member(config, state, teacher, sink, 0, [], info)
    state = _branch.perturb(branch.state, spec.epsilon, spec.seeds()[i])
    state, teacher, reset = interventions.continue_state(state, branch.config, config)
    info["intervention"]["reset"] = reset
    return runner.Member(config, state, teacher, sink, spec.branch_at, [branch.metrics], info)


def _check_unit(spec: Ensemble, arm: str, members) -> list[int]:
    if arm not in spec.trained_arms():
        raise ValueError(f"arm {arm!r} does not train in ensemble {spec.name!r}; its arms: "
                         f"{', '.join(spec.trained_arms())}")
    members = list(range(spec.members)) if members is None else [int(i) for i in members]
    bad = [i for i in members if not 0 <= i < spec.members]
    if bad or len(set(members)) != len(members):
        raise ValueError(f"members {members} of arm {arm!r}: each once, in 0…{spec.members - 1}")
    return members


def _check_branch(spec: Ensemble, arm: str, todo: list[int], branch: _branch.Branch | None, bdir: Path) -> None:
    if branch is None:
        raise ValueError(f"members {todo} of arm {arm!r} need the branch state at step {spec.branch_at}, and {bdir} "
                         f"holds none: prepare the ensemble with a source (--branch-from)")
    if spec.config(arm, todo[0]).has_paired_run and branch.state.ref_params is None:
        raise ValueError(f"arm {arm!r} trains beside its FP32 twin, and the branch state in {bdir} holds no twin "
                         f"(written from a run without its paired FP32 run): members {todo} cannot train from it")


def train_unit(out, arm: str, members=None, *, progress: bool = True, bar=None) -> dict[int, Run]:
    """Train (or load, or resume) ``members`` (default: all) of ``arm`` of the
    ensemble in ``out`` into ``out/runs`` as one program, export each, and
    return ``{i: run}``. The unit of work: a worker process (or a scheduler's
    task) calls it with the folder, the arm and the member indices; on CPU a
    member's numbers do not depend on which members share its program.

    A member the store does not hold but ``out/results`` has exported (a
    fresh machine, the store gone; results copied back from where they were
    committed; or an entry made by other numerics code, which is then neither
    read nor reported) is done: it is loaded from its export (metrics from
    ``branch_at − 100`` on for a branch member), not trained or exported again."""
    out = Path(out)
    spec = read_spec(out)
    members = _check_unit(spec, arm, members)
    bdir = out / "branch"
    branch = _branch.read(bdir) if spec.kind == "branch" and _branch.exists(bdir) else None
    st = _store.Store(out / "runs")
    st.check_writable()
    st.clean()
    parent = branch.key if branch else None
    keys = {i: member_key(spec, arm, i, parent) for i in members} if branch or spec.kind != "branch" else {}
    from_export = {i: r for i in members if (r := exported(spec, arm, i, out / "results")) is not None}
    for i in sorted(set(members) - set(from_export)):  # a foreign or damaged export under its label: kept aside
        set_aside(spec, arm, i, out / "results")
    done = {i: r for i in keys if not (i in from_export and st.stale(keys[i])) and (r := st.load(keys[i])) is not None}
    from_export = {i: r for i, r in from_export.items() if i not in done}
    todo = [i for i in members if i not in done and i not in from_export]
    if todo and spec.kind == "branch":
        _check_branch(spec, arm, todo, branch, bdir)
    if bar is not None:
        bar.update((len(done) + len(from_export)) * spec.horizon)
    if todo:
        group = [_member(spec, arm, i, st, keys[i], branch, spec.end) for i in todo]
        if len({m.start for m in group}) > 1:  # interrupted while saving: from the newest step all of them hold
            at = min(m.start for m in group)
            group = [_member(spec, arm, i, st, keys[i], branch, at) for i in todo]
        _memory.check(group[0].config, members=len(group))
        own_bar = bar is None
        bar = bar or runner.tqdm(total=len(todo) * spec.horizon, disable=not progress, unit="member-step",
                                 desc=f"{spec.name}: {arm} ×{len(todo)}")
        bar.update(sum(m.start - spec.start for m in group))
        with interruptible() as interruption:  # Ctrl-C: checkpointed at the end of the segment, then Interrupted
            try:
                runs = runner.run_members(group, group[0].start, bar=bar)
            finally:
                if own_bar:
                    bar.close()
            for i, r in zip(todo, runs):
                runner.notify(r.config)
                done[i] = st.save(r, keys[i])
                interruption.finish(done[i])
    if done:
        export(spec, arm, done, out / "results")
    return {i: done[i] if i in done else from_export[i] for i in members}


def train_arm(out, arm: str, *, progress: bool = True, bar=None) -> list[Run]:
    """Every member of ``arm`` (:func:`train_unit`), in member order."""
    runs = train_unit(out, arm, None, progress=progress, bar=bar)
    return [runs[i] for i in sorted(runs)]


# --------------------------------------------------------------------------- the whole ensemble


def units(spec: Ensemble, group_size: int | None = None) -> list[tuple[str, tuple[int, ...]]]:
    """The units of work: ``(arm, member indices)``, at most ``group_size``
    members each (default: a whole arm), ordered member chunk first, so that
    every arm has its first members before any has its last (partial results
    are balanced across arms)."""
    size = spec.members if group_size is None else positive_int("group_size", group_size, 1, MAX_MEMBERS)
    chunks = [tuple(range(i, min(i + size, spec.members))) for i in range(0, spec.members, size)]
    return [(arm, chunk) for chunk in chunks for arm in spec.trained_arms()]


def _unit_fn(out: str, arm: str, members: tuple[int, ...], *, store=None, progress: bool = True) -> list[Run]:
    """A unit's function for an executor (its ``store`` is the ensemble's own, ``out/runs``)."""
    runs = train_unit(out, arm, members, progress=progress)
    return [runs[i] for i in members]


def work(spec: Ensemble, out, group_size: int | None = None, upto: int | None = None) -> list[executors.Work]:
    """The :func:`units` of ``spec`` in ``out`` as executor units
    (:class:`mx_proxy.experiments.executors.Work`): name, cost in member-steps
    (a member trained beside its FP32 twin counting twice), the store keys;
    ``upto``: only members 0 … upto−1 (a first look at a rate, extended later
    with the same members)."""
    out = ensemble_folder(out)
    upto = spec.members if upto is None else min(positive_int("upto", upto), spec.members)
    parent = read_branch(out).key if spec.kind == "branch" else None
    return [executors.Work(name=f"{spec.name}: {arm} m{members[0]:02d}-m{members[-1]:02d}",
                           cost=len(members) * spec.horizon * (2 if spec.config(arm, 0).has_paired_run else 1),
                           fn=_unit_fn, args=(str(out), arm, members),
                           keys=tuple(member_key(spec, arm, i, parent) for i in members),
                           labels=tuple(member_label(arm, i) for i in members))
            for arm, members in units(spec, group_size) if members[-1] < upto]


def prepare_branch(source, step: int, out) -> Path:
    """The branch state of ``out`` (``out/branch``), written from ``source`` at ``step`` unless there is one."""
    bdir = ensemble_folder(out) / "branch"
    if not _branch.exists(bdir):
        _branch.write(source, step, bdir)
    return bdir


def read_branch(out) -> _branch.Branch:
    """The branch state of the ensemble folder ``out``."""
    return _branch.read(ensemble_folder(out) / "branch")


def _same_history(b: _branch.Branch, hist: Path, bdir: Path) -> None:
    """Refuse a branch state whose losses before the branch differ (bit for
    bit) from the history its ensemble recorded: its exported members branched from another state."""
    found = _branch.compare_losses(b.metrics, hist.parent, b.step, file=hist.name)
    if not found["identical"]:
        raise ValueError(f"the branch state in {bdir} is not the one the members in {hist.parent} branched from: "
                         f"its loss differs from {hist.name}'s at step {found['first_difference']}")


def prepare(spec: Ensemble, out, source=None) -> Path:
    """Write ``spec`` (and, for a branch ensemble, the branch state from
    ``source``: a run, a stored run's folder or a branch-state folder) into
    ``out``; an existing folder must hold the same spec."""
    out = ensemble_folder(out)
    write_spec(spec, out / "results")
    if spec.kind == "branch":
        bdir = out / "branch"
        if not _branch.exists(bdir) and source is None:
            raise ValueError(f"a branch ensemble needs a source (a run or a branch state) for its state at step "
                             f"{spec.branch_at}; {bdir} has none")
        prepare_branch(source, spec.branch_at, out)
        b = _branch.read(bdir)
        student_only = spec.base.has_paired_run and b.config == spec.base.replace(paired_run=False)
        if b.step != spec.branch_at or not (b.config == spec.base or student_only):
            raise ValueError(f"the branch state in {bdir} (step {b.step}, config {b.config.hash()}) is not the "
                             f"ensemble's (step {spec.branch_at}, config {spec.base.hash()})")
        hist = out / "results" / HISTORY_FILE
        if hist.exists():  # the members exported so far branched from the state this history is of
            _same_history(b, hist, bdir)
        else:
            cols = ["step", "loss"] + [c for c in b.metrics if c == "ref_loss" or c.startswith("grad_norm/block_")]
            tables.write(hist, b.metrics[cols])
    return out


def run(spec: Ensemble, out, *, source=None, jobs: int = 1, group_size: int | None = None, upto: int | None = None,
        executor: executors.Executor | None = None, progress: bool = True, log=print) -> dict[str, list[Run]]:
    """Train (resume, or load) every member of ``spec`` in ``out`` (see the
    module docstring), unit by unit (:func:`work`), through ``executor``
    (default: this machine, ``jobs`` worker processes; or a Slurm array,
    :mod:`mx_proxy.experiments.executors`). Returns ``{arm: [member runs]}``
    of the trained arms (``upto``: members 0 … upto−1 only, in units of at
    most ``group_size``, which should divide it); units that did not finish raise
    :class:`~mx_proxy.experiments.executors.UnitsFailed` after the others are exported."""
    jobs = positive_int("jobs", jobs, 1, MAX_JOBS)
    if group_size is not None:
        positive_int("group_size", group_size, 1, MAX_MEMBERS)
    out = prepare(spec, out, source)
    executor = executor if executor is not None else executors.make("local", jobs=jobs)
    t0 = time.time()

    def done(unit, _):
        log(f"  {unit.name} done ({time.time() - t0:.0f} s)")

    plan = work(spec, out, group_size, upto)
    failures = executor.run(plan, out / "runs", on_done=done, progress=progress, log=log)
    if failures:
        raise executors.UnitsFailed(failures)
    trained = {arm: {} for arm in spec.trained_arms()}
    for unit in plan:  # all stored now: this loads them
        _, arm, members = unit.args
        trained[arm].update(train_unit(out, arm, members, progress=False))
    return {arm: [runs[i] for i in sorted(runs)] for arm, runs in trained.items()}
