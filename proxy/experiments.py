"""Experiments: vectorized sweeps, a run store, checkpoints and interventions.

``train(config, store=...)`` trains one run (or loads it from the store);
``sweep(config, lr=[...], seed=[...], recipe=[...])`` trains the Cartesian
product of its axes; ``intervene(run, at_step, recipe=...)`` continues a run
from a checkpoint with a change, on the very same batches.

How a sweep runs. Members are grouped by compiled program (everything but the
engine's dynamic fields: learning rate, LR floor, noise, spike factor, seeds);
each group trains as ONE compiled program, ``jax.vmap`` over the members'
train states and dynamic values. What the members share is computed once:
the teacher (unless ``teacher_seed`` is swept), the batches and targets
(unless ``data_seed`` or ``noise`` is swept). Program-changing axes (recipe,
width, activation, norm, optimizer…) loop over groups. With several JAX
devices the member axis is sharded across them (``jax.sharding``; members are
padded to a multiple of the device count); across hosts, call
``jax.distributed.initialize()`` in every process first, and the same code
shards the member axis over all hosts' devices. A member that diverges is
frozen by the engine (its updates are masked) and gets its own
``diverged_at``; the others run on, bit for bit as if alone.

Exactness: on CPU, a member of a vmapped sweep reproduces its single
``train`` run metric for metric, bit for bit. Three things make that hold
(see ``proxy.engine``): XLA's YNNPACK library fusions are switched off
(they reduce in a shape-dependent order); the shared batch is copied per
member (XLA otherwise simplifies the first LayerNorm's backward differently
for an unbatched input); and Adam's bias correction is written as a product
with per-step scalars (XLA rewrites a division by a broadcast scalar
differently with and without a member axis). A group whose config has a
stability controller maps its members with ``lax.map`` instead of ``vmap``
(see :func:`_vmapped`), which keeps that equality.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from proxy import checkpoint as ckpt
from proxy import recipe as _recipes
from proxy import store as _store
from proxy.config import Config
from proxy.engine import DYNAMIC_FIELDS, Dynamic, Program, TrainState, compiler_options, dynamic_for, program_for, \
    static_key
from proxy.recipe import PRESETS, Recipe
from proxy.run import Run, _run_loop, finish, metrics_frame, segment_length

__all__ = ["train", "sweep", "Sweep", "intervene", "load", "INTERVENTIONS", "INTERVENABLE_FIELDS", "hooks",
           "apply_interventions"]

# Called with the Config of every run or sweep member actually trained (not loaded from a store).
hooks: list[Callable[[Config], None]] = []

# Fields an intervention may change; everything else (model, data, seeds) must stay
# the parent's so that the continued run sees the same weights' shapes and batches.
INTERVENABLE_FIELDS = ("recipe", "lr", "lr_min", "schedule", "warmup_steps", "optimizer", "momentum", "beta1",
                       "beta2", "adam_eps", "spike_factor", "steps", "diagnostics_every", "gradient_reference",
                       "diagnostic_format", "val_every", "checkpoint_every", "checkpoint_at")




def _rceil(r: Recipe) -> Recipe:
    # NVFP4 (E4M3) block scales have their own rule and no exponent to bump
    return r.map_specs(lambda s: s if s.scale_format != "e8m0" else dataclasses.replace(s, scale_rule="rceil"))


# The paper's in-situ interventions, as recipe transformations of the running recipe.
INTERVENTIONS: dict[str, tuple[str, Callable[[Recipe], Recipe]]] = {
    "fp32": ("switch to full precision (everything float32)", lambda r: PRESETS["fp32"]),
    "ln_exempt": ("stop quantizing LayerNorm: LN math in fp32, LN gain/bias not MX-quantized",
                  lambda r: r.replace(ln_precision="fp32", ln_affine=None)),
    "rceil": ("bump the shared exponent: round-up (rceil) scales everywhere, nothing clamps", _rceil),
    "bf16_activations": ("activations and gradients in bf16, forward and backward; weights keep their MX spec",
                         lambda r: r.replace(fwd_x=None, dgrad_g=None, wgrad_x=None, wgrad_g=None, ln_affine=None)),
    "backward_unquantized": ("stop quantizing the backward pass (forward-only quantization)",
                             lambda r: r.replace(dgrad_g=None, dgrad_w=None, wgrad_x=None, wgrad_g=None)),
    "gelu_unquantized": ("activation function (GELU) math in fp32", lambda r: r.replace(act_precision="fp32")),
    "bf16_weights": ("weights (and LN gain/bias) in bf16 in every GEMM; activations and gradients keep MX",
                     lambda r: r.replace(fwd_w=None, dgrad_w=None, ln_affine=None)),
    # the authors' code's own switches (student_teacher.py), for the paper_* recipes
    "paper_no_ln_quant": ("the authors' dont_quantize_layernorm: LN input, gain and bias unrounded, mean and "
                          "variance in fp32, the rest of the LN forward in bf16, its backward in fp32",
                          lambda r: r.replace(ln_precision="stats_fp32")),
    "paper_forward_only": ("the authors' dont_quantize_backprop: backward GEMMs unquantized and the whole "
                           "backward in fp32",
                           lambda r: r.replace(dgrad_g=None, dgrad_w=None, wgrad_x=None, wgrad_g=None,
                                               backward_precision="fp32")),
}


def apply_interventions(recipe: Recipe | str, names: str | Iterable[str]) -> Recipe:
    """``recipe`` transformed by the named interventions (in order); the name records them."""
    r = _recipes.get(recipe)
    names = [names] if isinstance(names, str) else list(names)
    for n in names:
        if n not in INTERVENTIONS:
            raise ValueError(f"unknown intervention {n!r}; valid: {', '.join(INTERVENTIONS)}")
        new = INTERVENTIONS[n][1](r)
        r = new if new is PRESETS["fp32"] else new.replace(name=f"{r.name}+{n}")
    return r


# --------------------------------------------------------------------------- single runs


def _notify(config: Config):
    for h in list(hooks):
        h(config)


def _check_config(config):
    if not isinstance(config, Config):
        raise ValueError(f"expected a proxy.Config, got {type(config).__name__}")


def _save_hook(config: Config, sink: ckpt.CheckpointSink | None, meta: dict):
    steps = set(config.checkpoint_steps())
    if sink is None or not steps:
        return None

    def on_segment(t, state, frames):
        if t in steps:
            sink.save(t, state, pd.concat(frames, ignore_index=True) if frames else None, meta)

    return on_segment


def _train_single(config: Config, sink: ckpt.CheckpointSink | None, *, progress: bool, resume: bool,
                  info: dict | None = None) -> Run:
    t0 = time.perf_counter()
    program = program_for(config)
    dyn = dynamic_for(config)
    state, teacher = program.init(dyn)
    start, frames = 0, []
    info = dict(info or {})
    if resume and sink is not None:
        done = [s for s in sink.steps() if s <= config.steps]
        if done:
            start = done[-1]
            state, m = sink.restore(start, ckpt.template(program, dyn))
            frames = [m] if m is not None and len(m) else []
            info["resumed_from"] = start
    if start and bool(state.diverged):  # the checkpoint already holds the run's end
        run = finish(config, state, frames, t0, info)
    else:
        state, frames = _run_loop(program, config, state, dyn, teacher, start, progress,
                                  _save_hook(config, sink, {"config_hash": config.hash(),
                                                            "code_version": _store.code_version()}), frames)
        run = finish(config, state, frames, t0, info)
    if sink is not None and sink.directory is None:
        run.checkpoints = sink.memory
    return run


def train(config: Config, *, store=None, force: bool = False, progress: bool = True) -> Run:
    """Train ``config`` (or load it from the store); see :func:`proxy.train`."""
    _check_config(config)
    st = _store.resolve(store)
    key = config.hash()
    if st is not None and not force:
        run = st.load(key)
        if run is not None:
            return run
    if st is not None and (force or st.stale(key)):
        st.discard(key)
    sink = ckpt.CheckpointSink(st.checkpoint_dir(key)) if st is not None else ckpt.CheckpointSink(memory={})
    run = _train_single(config, sink, progress=progress, resume=st is not None, info={"key": key})
    _notify(config)
    if st is not None:
        st.save(run, key)
    return run


def load(path) -> Run:
    """A stored run from its folder (``runs/<key>``)."""
    return _store.load_dir(path)


# --------------------------------------------------------------------------- sweeps


@dataclasses.dataclass
class Sweep:
    """The result of :func:`sweep`.

    Attributes:
      base: the config the axes were applied to.
      axes: ``{field: [values]}`` in the order given.
      configs: one config per member (Cartesian product of the axes, last axis fastest).
      runs: one :class:`Run` per member, in the same order.
    """

    base: Config
    axes: dict[str, list]
    configs: list[Config]
    runs: list[Run]

    def __len__(self):
        return len(self.runs)

    def __iter__(self):
        return iter(self.runs)

    def __getitem__(self, i) -> Run:
        return self.runs[i]

    def values(self, i: int) -> dict[str, Any]:
        """The swept values of member ``i`` (recipes by name)."""
        c = self.configs[i]
        return {k: (c.recipe.name if k == "recipe" else getattr(c, k)) for k in self.axes}

    def select(self, **values) -> list[Run]:
        """Members whose swept values equal ``values`` (recipes by name)."""
        return [r for i, r in enumerate(self.runs)
                if all(self.values(i)[k] == v for k, v in values.items())]

    def to_frame(self) -> pd.DataFrame:
        """One long DataFrame: a row per member and recorded step, with
        ``member`` and the swept values first and ``diverged_at`` and ``key``
        last. A metric column named like a swept field (``lr``: the scheduled
        learning rate of the step) is renamed ``<name>_at_step``."""
        frames = []
        for i, run in enumerate(self.runs):
            df = run.metrics.rename(columns={k: f"{k}_at_step" for k in self.axes if k in run.metrics.columns})
            lead = {"member": i, **self.values(i)}
            for j, (k, v) in enumerate(lead.items()):
                df.insert(j, k, [v] * len(df) if isinstance(v, tuple) else v)
            df["diverged_at"] = pd.array([run.diverged_at] * len(df), dtype="Int64")
            df["key"] = run.info.get("key", run.config.hash())
            frames.append(df)
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def summary(self) -> str:
        return "\n".join(f"[{i}] {self.values(i)}: {r.summary()}" for i, r in enumerate(self.runs))

    def __repr__(self):
        return f"Sweep({len(self)} members over {', '.join(self.axes) or 'no axes'})"


def _axis_values(name, values) -> list:
    if isinstance(values, (str, bytes, Recipe)) or not isinstance(values, Iterable):
        return [values]
    if name == "checkpoint_at" and all(isinstance(v, (int, np.integer)) for v in values):
        return [tuple(values)]
    return list(values)


def _members(config: Config, axes: dict) -> tuple[dict, list[Config]]:
    fields = Config.field_names()
    unknown = [a for a in axes if a not in fields]
    if unknown:
        raise ValueError(f"unknown sweep axis {', '.join(map(repr, unknown))}; valid: {', '.join(fields)}")
    axes = {k: _axis_values(k, v) for k, v in axes.items()}
    empty = [k for k, v in axes.items() if not v]
    if empty:
        raise ValueError(f"sweep axis {', '.join(map(repr, empty))} has no values; give at least one")
    configs = [config.replace(**dict(zip(axes, combo))) for combo in itertools.product(*axes.values())]
    return axes, configs


def _group_key(c: Config):
    return static_key(c), c.steps, c.checkpoint_steps()


def _stack(trees):
    return jax.tree.map(lambda *a: np.stack([np.asarray(x) for x in a]), *trees)


def _vmapped(program: Program, dyn_axes: Dynamic, teacher_axis):
    cache = program.__dict__.setdefault("_sweep_fns", {})
    key = (tuple(dyn_axes), teacher_axis)
    if key not in cache:
        opts = compiler_options()

        def segment(state, dyn, teacher, start, *, n_periods, tail, plain):
            def one(s, d, te):
                return program._segment(s, d, te, start, n_periods=n_periods, tail=tail, plain=plain)

            if program.controller is None:
                return jax.vmap(one, in_axes=(0, dyn_axes, teacher_axis))(state, dyn, teacher)
            # A stability controller's step is one lax.cond; vmap would turn it into a
            # select of both branches, inlined and fused differently from a single
            # run. lax.map keeps it a cond, so members still match single runs bit
            # for bit (members then run one after another).
            mapped = (state, Dynamic(*[v if ax == 0 else None for v, ax in zip(dyn, dyn_axes)]),
                      teacher if teacher_axis == 0 else None)

            def member(xs):
                s, d, te = xs
                d = Dynamic(*[v if ax == 0 else full for v, full, ax in zip(d, dyn, dyn_axes)])
                return one(s, d, te if teacher_axis == 0 else teacher)

            return jax.lax.map(member, mapped)

        seg = jax.jit(segment, static_argnames=("n_periods", "tail", "plain"), compiler_options=opts)
        val = jax.jit(jax.vmap(program._val_loss, in_axes=(0, dyn_axes, teacher_axis)), compiler_options=opts)
        cache[key] = (seg, val)
    return cache[key]


def _shardings(n_members: int, shard: bool):
    devices = jax.devices()
    if not shard or len(devices) < 2:
        return None, n_members
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(devices), ("members",))
    padded = math.ceil(n_members / len(devices)) * len(devices)
    return (NamedSharding(mesh, PartitionSpec("members")), NamedSharding(mesh, PartitionSpec())), padded


def _train_group(configs: list[Config], sinks: list, *, bar, shard: bool) -> list[Run]:
    """Train members that share one program, steps and checkpoint steps as one vmapped program."""
    t0 = time.perf_counter()
    c0 = configs[0]
    M = len(configs)
    program = program_for(c0)
    dyns = [dynamic_for(c) for c in configs]
    inits = [program.init(d) for d in dyns]  # per member: exactly the single run's initial state
    # Batched dynamic fields: those that differ, and always lr (the engine's per-member batch copy keys on it).
    batched = {f: f == "lr" or any(not np.array_equal(getattr(d, f), getattr(dyns[0], f)) for d in dyns)
               for f in Dynamic._fields}
    share_teacher = not batched["teacher_key"]
    dyn_axes = Dynamic(*(0 if batched[f] else None for f in Dynamic._fields))
    teacher_axis = None if share_teacher else 0

    sh, padded = _shardings(M, shard)
    pad = list(range(M)) + [M - 1] * (padded - M)

    def member_axis(trees):
        return _stack([trees[i] for i in pad])

    state = member_axis([s for s, _ in inits])
    dyn = Dynamic(*(member_axis([getattr(d, f) for d in dyns]) if batched[f] else getattr(dyns[0], f)
                    for f in Dynamic._fields))
    teacher = inits[0][1] if share_teacher else member_axis([te for _, te in inits])
    if sh is not None:
        split, repl = sh
        state = jax.device_put(state, split)
        dyn = Dynamic(*(jax.device_put(v, split if batched[f] else repl) for f, v in zip(Dynamic._fields, dyn)))
        teacher = jax.device_put(teacher, repl if share_teacher else split)
    seg, val = _vmapped(program, dyn_axes, teacher_axis)

    frames: list[list[pd.DataFrame]] = [[] for _ in range(M)]
    stopped = [False] * M
    ckpt_steps = set(c0.checkpoint_steps())
    t = 0
    while t < c0.steps:
        n = segment_length(c0, t)
        vals = np.asarray(val(state.params, dyn, teacher)) if c0.val_every and t % c0.val_every == 0 else None
        state, m = seg(state, dyn, teacher, np.int32(t), **program.segment_shape(t, n))
        m = jax.device_get(m)
        active = [i for i in range(M) if not stopped[i]]
        for i in active:
            frame = metrics_frame({k: v[i] for k, v in m.items()}, start=t)
            frame["val_loss"] = np.nan
            if vals is not None:
                frame.loc[frame.index[0], "val_loss"] = float(vals[i])
            frames[i].append(frame)
        t += n
        bar.update(n * len(active))
        if t in ckpt_steps:
            host_state = jax.device_get(state)
            meta = {"code_version": _store.code_version()}
            for i in active:
                if sinks[i] is not None:
                    member = jax.tree.map(lambda a: a[i], host_state)
                    sinks[i].save(t, member, pd.concat(frames[i], ignore_index=True),
                                  dict(meta, config_hash=configs[i].hash()))
        diverged = np.asarray(state.diverged)
        for i in active:
            if bool(diverged[i]):
                stopped[i] = True
        if all(stopped):
            break
    host_state = jax.device_get(state)
    wall = time.perf_counter() - t0
    runs = []
    for i, c in enumerate(configs):
        s = jax.tree.map(lambda a: a[i], host_state)
        run = finish(c, s, frames[i], time.perf_counter(), {"key": c.hash(), "sweep_group_size": M})
        run.wall_time_s = wall / M
        if sinks[i] is not None and sinks[i].directory is None:
            run.checkpoints = sinks[i].memory
        runs.append(run)
    return runs


def sweep(config: Config, *, store=None, force: bool = False, progress: bool = True, shard: bool = True,
          group_size: int | None = None, **axes) -> Sweep:
    """Train every combination of ``axes`` (Config fields → lists of values).

    Members that differ only in dynamic fields (``lr``, ``lr_min``, ``noise``,
    ``spike_factor``, ``seed``, ``data_seed``, ``teacher_seed``) run as one
    vmapped, compiled program; other axes loop over such groups. Members
    already in the store are loaded, not trained (``force=True`` retrains);
    each finished group is saved before the next starts, so an interrupted
    sweep resumes with only the missing members. ``store=False`` keeps
    everything in memory. ``shard``: split the member axis over all JAX
    devices when there are several. ``group_size`` caps members per compiled
    call (memory).

    Raises:
      ValueError: an unknown axis (naming the valid fields), an axis with no
        values, or an invalid value (the Config's own message).
    """
    _check_config(config)
    axes, configs = _members(config, axes)
    if group_size is not None and (not isinstance(group_size, int) or group_size < 1):
        raise ValueError(f"group_size must be a positive integer or None, got {group_size!r}")
    st = _store.resolve(store)
    keys = [c.hash() for c in configs]
    results: dict[str, Run] = {}
    if st is not None and not force:
        for k in keys:
            if k not in results:
                r = st.load(k)
                if r is not None:
                    results[k] = r
    todo: dict[str, Config] = {}
    for k, c in zip(keys, configs):
        if k not in results:
            todo[k] = c
    groups: dict[Any, list[str]] = {}
    for k, c in todo.items():
        groups.setdefault(_group_key(c), []).append(k)
    chunks = []
    for members in groups.values():
        size = group_size or len(members)
        chunks += [members[i:i + size] for i in range(0, len(members), size)]
    total = sum(todo[k].steps for k in todo)
    with tqdm(total=total, disable=not progress or not total, desc=f"sweep ({len(todo)} to train)", unit="step",
              leave=False) as bar:
        for members in chunks:
            if st is not None:
                for k in members:
                    if force or st.stale(k):
                        st.discard(k)
            sinks = [ckpt.CheckpointSink(st.checkpoint_dir(k)) if st is not None else ckpt.CheckpointSink(memory={})
                     for k in members]
            runs = _train_group([todo[k] for k in members], sinks, bar=bar, shard=shard)
            for k, run in zip(members, runs):
                _notify(run.config)
                if st is not None:
                    st.save(run, k)
                results[k] = run
    return Sweep(config, axes, configs, [results[k] for k in keys])


# --------------------------------------------------------------------------- interventions


def _parent_sink(run: Run) -> ckpt.CheckpointSink:
    if run.path is not None:
        return ckpt.CheckpointSink(Path(run.path) / "checkpoints")
    return ckpt.CheckpointSink(memory=run.checkpoints)


def _intervention_key(config: Config, parent_key: str, at_step: int) -> str:
    blob = json.dumps({"config": config.to_dict(), "parent": parent_key, "at_step": at_step}, sort_keys=True,
                      default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def intervene(run: Run | str | Path, at_step: int, recipe: str | Recipe | None = None, *,
              apply: str | Iterable[str] = (), store=None, force: bool = False, progress: bool = True,
              **changes) -> Run:
    """Continue ``run`` from its checkpoint at ``at_step`` with a change.

    Args:
      run: a :class:`Run` (or the folder of a stored run) trained with a
        checkpoint at ``at_step`` (``Config.checkpoint_at`` / ``checkpoint_every``).
      at_step: the step the change takes effect (steps 0 … at_step−1 are the parent's).
      recipe: the new recipe (a preset name or a :class:`Recipe`); default the parent's.
      apply: named interventions (see :data:`INTERVENTIONS`: ``fp32``,
        ``ln_exempt``, ``rceil``, ``bf16_activations``, ``backward_unquantized``,
        ``gelu_unquantized``, ``bf16_weights``) applied to that recipe.
      store: as for :func:`train`; default: the parent's store if it has one.
      **changes: other Config fields (see :data:`INTERVENABLE_FIELDS`: LR,
        schedule, optimizer settings, steps, …).

    Returns:
      The continued :class:`Run`: its metrics are the parent's before
      ``at_step`` followed by the new steps; ``info`` records ``parent`` (key),
      ``parent_path`` and ``intervention`` (step, recipe, applied names, changes).
      With no change at all it reproduces the parent exactly. Switching the
      optimizer kind re-initializes the optimizer state; turning on
      ``gradient_reference="paired_run"`` starts the paired FP32 run at the
      intervention from the same weights.

    Raises:
      ValueError: ``at_step`` beyond the run or without a checkpoint (naming
        the available ones), an unknown intervention, or a field that cannot
        change mid-run.
    """
    applied = [apply] if isinstance(apply, str) else list(apply)
    for name in applied:
        if name not in INTERVENTIONS:
            raise ValueError(f"unknown intervention {name!r}; valid: {', '.join(INTERVENTIONS)}")
    parent = _store.load_dir(run) if isinstance(run, (str, Path)) else run
    if not isinstance(parent, Run):
        raise ValueError(f"intervene needs a proxy.Run or a stored run folder, got {type(run).__name__}")
    bad = sorted(set(changes) - set(INTERVENABLE_FIELDS))
    if bad:
        unknown = [b for b in bad if b not in Config.field_names()]
        what = "unknown config field(s)" if unknown else "field(s) that cannot change mid-run"
        raise ValueError(f"intervene: {what} {bad}; changeable: {', '.join(INTERVENABLE_FIELDS)}")
    pc = parent.config
    sink = _parent_sink(parent)
    available = sink.steps()
    if isinstance(at_step, bool) or not isinstance(at_step, (int, np.integer)):
        raise ValueError(f"at_step must be an integer step, got {at_step!r}")
    at_step = int(at_step)
    last = pc.steps if parent.diverged_at is None else parent.diverged_at
    if not 0 < at_step <= last:
        raise ValueError(f"at_step {at_step} is beyond the run (it ran steps 0…{last - 1}"
                         f"{'' if parent.diverged_at is None else f', diverged at {parent.diverged_at}'}); "
                         f"checkpoints at: {available or 'none'}")
    if at_step not in available:
        raise ValueError(f"no checkpoint at step {at_step}; checkpoints at: {available or 'none'} "
                         f"(train the parent with checkpoint_at=({at_step},) or checkpoint_every)")
    new_recipe = _recipes.get(recipe) if recipe is not None else pc.recipe
    if applied:
        new_recipe = apply_interventions(new_recipe, applied)
    child = pc.replace(recipe=new_recipe, **changes)
    if child.steps <= at_step:
        raise ValueError(f"steps ({child.steps}) must exceed at_step ({at_step}) to continue the run")
    if child.diagnostics_every and at_step % child.diagnostics_every:
        raise ValueError(f"at_step {at_step} must be a multiple of diagnostics_every ({child.diagnostics_every})")

    parent_key = parent.info.get("key", pc.hash())
    key = _intervention_key(child, parent_key, at_step)
    if store is None and parent.path is not None:
        st = _store.Store(Path(parent.path).parent)
    else:
        st = _store.resolve(store)
    if st is not None and not force:
        found = st.load(key)
        if found is not None:
            return found
    if st is not None and (force or st.stale(key)):
        st.discard(key)

    t0 = time.perf_counter()
    p_prog, c_prog = program_for(pc), program_for(child)
    state, _ = sink.restore(at_step, ckpt.template(p_prog, dynamic_for(pc)))
    dyn = dynamic_for(child)
    fresh, teacher = c_prog.init(dyn)
    reset = []
    if jax.tree.structure(fresh.opt_state) != jax.tree.structure(state.opt_state):
        state = state._replace(opt_state=c_prog.tx.init(state.params))
        reset.append("opt_state")
    if c_prog.paired and not p_prog.paired:
        state = state._replace(ref_params=state.params, ref_opt=c_prog.tx.init(state.params))
        reset.append("paired_run")
    elif c_prog.paired and jax.tree.structure(fresh.ref_opt) != jax.tree.structure(state.ref_opt):
        state = state._replace(ref_opt=c_prog.tx.init(state.ref_params))
    elif not c_prog.paired:
        state = state._replace(ref_params=None, ref_opt=None)
    history = parent.metrics[parent.metrics["step"] < at_step].reset_index(drop=True)
    info = {"key": key, "parent": parent_key, "parent_path": parent.path,
            "intervention": {"at_step": at_step, "recipe": _recipes.to_json(new_recipe), "apply": applied,
                             "changes": {k: v for k, v in changes.items() if k != "recipe"}, "reset": reset}}
    csink = ckpt.CheckpointSink(st.checkpoint_dir(key)) if st is not None else ckpt.CheckpointSink(memory={})
    ckpt_hook = _save_hook(child, csink, {"config_hash": child.hash(), "parent": parent_key,
                                                   "code_version": _store.code_version()})
    state, frames = _run_loop(c_prog, child, state, dyn, teacher, at_step, progress, ckpt_hook,
                              [history] if len(history) else [])
    out = finish(child, state, frames, t0, info)
    if csink.directory is None:
        out.checkpoints = csink.memory
    _notify(child)
    if st is not None:
        st.save(out, key)
    return out
