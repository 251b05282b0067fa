"""Train planned runs in parallel worker processes, with one progress bar.

``mx-proxy figures`` plans the runs of every figure it is asked for
(:func:`mx_proxy.experiments.paper.planned_sweeps`), drops those already in the run store,
and hands the rest to :func:`train_all`: one unit per compiled program (the
members of a unit differ only in learning rate or seeds and train as one
vmapped sweep), the most expensive first, pulled by ``jobs`` worker
processes as each finishes its last. On CPU a run's numbers do not depend on
which process trained it (each member equals its single run bit for bit), so
the figures drawn afterwards from the store are the ones a sequential run
draws.

Any unit of work goes this way (:class:`mx_proxy.experiments.executors.base.WorkUnit`:
``fn(*args, store=..., progress=True)`` in a worker); :class:`Unit` is the
one for planned sweep members. This is the process pool of the local
executor (:mod:`mx_proxy.experiments.executors.local`).

The bar counts training steps. Its ETA is measured, never guessed: it shows
``compiling`` until a worker has timed two segments of a unit, then the
remaining work (a paired run's step counting twice) at the measured rate of
the workers, plus the measured compile time of every unit not yet started.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue as _queue
import signal
import time
import traceback

from tqdm.auto import tqdm

from mx_proxy.experiments import tracking
from mx_proxy.runner import interrupt
from mx_proxy.runner import loop as runner
from mx_proxy.store import run_store as _store
from mx_proxy.training.config import Config
from mx_proxy.training.engine import static_key
from mx_proxy.training.sweeps import members

__all__ = ["Unit", "plan_units", "train_all", "train_configs", "default_jobs"]


class Unit:
    """Member configs that share one compiled program: ``runner.sweep(base, **axes)``."""

    def __init__(self, configs: list[Config]):
        self.configs = configs
        varying = [f for f in Config.field_names() if len({repr(getattr(c, f)) for c in configs}) > 1]
        self.axes = {f: list(dict.fromkeys(getattr(c, f) for c in configs)) for f in varying}
        size = 1
        for v in self.axes.values():
            size *= len(v)
        self.product = size == len(configs)  # else: its members train one by one
        self.steps = sum(c.steps for c in configs)
        self.cost = sum(c.steps * (2 if c.has_paired_run else 1) for c in configs)
        self.name = configs[0].recipe.name + (f" ×{len(configs)}" if len(configs) > 1 else "")

    def to_json(self) -> list[str]:
        return [c.to_json() for c in self.configs]

    @property
    def keys(self) -> tuple[str, ...]:
        """The store keys of its members."""
        return tuple(c.hash() for c in self.configs)

    @property
    def fn(self):
        return train_configs

    @property
    def args(self) -> tuple:
        return (self.to_json(),)


def train_configs(configs: list[str], *, store, progress: bool = True) -> list:
    """Train the member configs of one :class:`Unit` (JSON, as
    :meth:`Unit.to_json` writes them) into ``store``: as one vmapped sweep
    when they are a product of axes, else one by one; returns their runs."""
    unit = Unit([Config.from_dict(json.loads(c)) for c in configs])
    if unit.product:
        return list(runner.sweep(unit.configs[0], store=store, progress=progress, **unit.axes).runs)
    return [runner.train(c, store=store, progress=progress) for c in unit.configs]


def plan_units(sweeps, store) -> list[Unit]:
    """The units still to train for ``sweeps`` (``(config, axes)`` pairs as
    :func:`mx_proxy.experiments.paper.planned_sweeps` gives them): every member once, those
    already in ``store`` left out, grouped by compiled program, costliest first."""
    st = _store.resolve(store)
    todo: dict[str, Config] = {}
    for config, axes in sweeps:
        for c in members(config, axes)[1]:
            key = c.hash()
            if key not in todo and (st is None or not st.has(key)):
                todo[key] = c
    groups: dict = {}
    for c in todo.values():
        groups.setdefault((static_key(c), c.steps, c.checkpoint_steps()), []).append(c)
    return sorted((Unit(g) for g in groups.values()), key=lambda u: -u.cost)


def default_jobs(n_units: int) -> int:
    """Worker processes: one per CPU core this process may use (at most 4),
    no more than there are units."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, 4, n_units))


class _Bar:
    """Stands in for runner's tqdm bar inside a worker: forwards each update."""

    def __init__(self, out, uid, *args, **kwargs):
        self.out, self.uid = out, uid

    def update(self, n=1):
        self.out.put(("steps", self.uid, int(n), time.time()))

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _bar_factory(out, uid):
    """A stand-in for ``tqdm(...)`` that makes a :class:`_Bar` for unit ``uid``
    whatever arguments it is called with (binding ``uid`` now, not when called)."""
    return lambda *a, **k: _Bar(out, uid)


def _worker(tasks, out, store, track=None):
    # Ctrl-C / Kernel → Interrupt reach the whole process group: the parent alone decides, and asks a worker to
    # stop with SIGUSR1 (the host loop then checkpoints at the end of its segment and raises Stopped)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, lambda signum, frame: runner.stop.set())
    try:
        with tracking.active(track):  # the submitting process's --track, if any
            while True:
                item = tasks.get()
                if item is None or runner.stop.is_set():
                    return
                uid, fn, args = item
                out.put(("start", uid, 0, time.time()))
                runner.tqdm = _bar_factory(out, uid)  # the host loop reports every segment through its bar
                try:
                    fn(*args, store=store, progress=True)
                except runner.Stopped as e:
                    out.put(("stopped", uid, e.step, time.time()))
                    return
                out.put(("done", uid, 0, time.time()))
    except KeyboardInterrupt:
        return
    except BaseException:  # noqa: BLE001 -- reported to the parent, which raises it
        out.put(("error", -1, traceback.format_exc(), time.time()))


def _fmt(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}:{s:02d}"


def _status(units, jobs, started, first, done_steps, finished, rates, per_step) -> str:
    """``ETA m:ss`` from the measured step rate and compile time (``compiling``
    until both are measured), and the units compiling right now."""
    now = time.time()
    compiling = [units[u].name for u in started if u not in first and u not in finished]
    busy = f"; compiling {', '.join(compiling)}" if compiling else ""
    if not rates:
        return "ETA: measuring" + busy
    rate = sorted(rates[-20:])[len(rates[-20:]) // 2]  # of one worker
    seg = sorted(dt - n * per_step[u] / rate for u, (dt, n) in first.items())
    compile_s = max(0.0, seg[len(seg) // 2])
    work = 0.0
    for u, unit in enumerate(units):
        if u in finished:
            continue
        if u not in started:
            work += compile_s + unit.cost / rate
        elif u not in first:
            work += max(0.0, compile_s - (now - started[u])) + unit.cost / rate
        else:
            work += (unit.cost - done_steps[u] * per_step[u]) / rate
    return f"ETA {_fmt(work / max(1, min(jobs, len(units) - len(finished))))}" + busy


def train_all(units: list, store, *, jobs: int, progress: bool = True, log=print, on_start=None,
              on_done=None) -> float:
    """Train ``units`` (:class:`Unit` s, or any unit of work) into ``store``
    with ``jobs`` worker processes; returns the wall time. ``on_start(unit,
    None)`` and ``on_done(unit, None)`` are called here as a worker starts
    and finishes each. The workers stream their runs to this process's active
    tracking (:func:`mx_proxy.experiments.tracking.current`), if any."""
    t0 = time.time()
    if not units:
        return 0.0
    ctx = mp.get_context("spawn")
    tasks, out = ctx.Queue(), ctx.Queue()
    for uid, u in enumerate(units):
        tasks.put((uid, u.fn, u.args))
    for _ in range(jobs):
        tasks.put(None)
    procs = [ctx.Process(target=_worker, args=(tasks, out, str(store), tracking.current()), daemon=True)
             for _ in range(jobs)]
    for p in procs:
        p.start()
    log(f"training {sum(len(u.keys) for u in units)} runs ({len(units)} compiled programs) in {jobs} "
        f"processes into {store}")
    steps = [getattr(u, "steps", u.cost) or 1 for u in units]  # a unit without steps: its cost
    total = sum(steps)
    per_step = {uid: u.cost / n for uid, (u, n) in enumerate(zip(units, steps))}
    started, first, last, done_steps = {}, {}, {}, dict.fromkeys(range(len(units)), 0)
    rates, finished = [], set()
    bar = tqdm(total=total, disable=not progress, unit="step", desc="training",
               bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} steps [{elapsed}{postfix}]")
    bar.set_postfix_str("ETA: measuring")
    stopped: dict[int, int] = {}  # unit -> the step its worker stopped at
    asked = False
    with interrupt.interruptible() as interruption:
        try:
            while len(finished) + len(stopped) < len(units):
                if interruption.requested.is_set() and not asked:
                    asked = True  # once: ask every worker to stop at the end of its segment
                    for p in procs:
                        if p.is_alive():
                            os.kill(p.pid, signal.SIGUSR1)
                try:
                    kind, uid, n, t = out.get(timeout=0.2 if asked else 1.0)
                except _queue.Empty:
                    kind = None
                    if not any(p.is_alive() for p in procs):
                        if asked:
                            break
                        raise RuntimeError("mx-proxy figures: every training process exited before the runs were "
                                           "done") from None
                if kind == "error":
                    raise RuntimeError(f"a training process failed:\n{n}")
                if kind == "start":
                    started[uid] = t
                    if on_start is not None:
                        on_start(units[uid], None)
                elif kind == "steps":
                    if uid in last:  # a segment timed on its own: the rate, in paired-weighted steps per second
                        rates.append(n * per_step[uid] / max(t - last[uid], 1e-6))
                    else:
                        first[uid] = (t - started[uid], n)
                    last[uid] = t
                    done_steps[uid] += n
                    bar.update(n)
                elif kind == "done":
                    finished.add(uid)
                    if on_done is not None:
                        on_done(units[uid], None)
                elif kind == "stopped":
                    stopped[uid] = n
                bar.set_postfix_str(_status(units, jobs, started, first, done_steps, finished, rates, per_step))
        except KeyboardInterrupt:  # a second interrupt: at once
            for p in procs:
                p.terminate()
            raise
        finally:
            bar.close()
            for p in procs:
                p.join(timeout=10)
        if asked:
            steps_at = ", ".join(map(str, sorted(set(stopped.values())))) or "-"
            left = len(units) - len(finished) - len(stopped)
            raise interrupt.Interrupted(
                f"{len(finished)} of {len(units)} training units finished and are kept in {store}; {len(stopped)} "
                f"stopped at the end of a segment (step {steps_at}), checkpointed there (a rerun resumes)"
                + (f"; {left} not started" if left else ""))
    return time.time() - t0

