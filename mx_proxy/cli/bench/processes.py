"""``mx-proxy bench processes``: member-steps per hour, one process vs two processes side by side.

An ensemble's budget is member-steps. Three ways to train members of one
configuration on this machine: (1) one process training one member, XLA's
threads on every core; (2) one process training two members as one sweep
group (what ``mx-proxy ensemble`` does with members that share a program;
on a one-device CPU the group's program runs them one after another, see
:func:`mx_proxy.runner.programs.members`); (3) two processes at once, each
training one member pinned to its own core (XLA sizes its thread pool by
the affinity: one thread each). Whole training runs are timed, as an
ensemble member runs (host loop and metrics included), of ``steps`` and of
``2 x steps`` steps; their difference is the steady-state cost of
``steps`` steps, without what a run pays once (loading its programs,
init, results). Both lengths are run once first (compiling is not
timed). The three are timed in turn within every repeat, so load from
other processes hits them alike; prints each one's member-steps per hour
(median over the repeats) and the fastest.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from mx_proxy.cli.bench import machine
from mx_proxy.cli.bench.options import add_shape
from mx_proxy.runner import loop as runner
from mx_proxy.training.config import Config
from mx_proxy.viz.text import plain

__all__ = ["main"]


def _config(spec: dict):
    return Config(**spec)


def _train(spec: dict, members: int) -> float:
    """Seconds of one whole training run of ``members`` members (seeds 0…)."""
    cfg = _config(spec)
    t = time.perf_counter()
    if members == 1:
        runner.train(cfg, store=None, progress=False)
    else:
        runner.sweep(cfg, store=None, progress=False, seed=list(range(members)))
    return time.perf_counter() - t


def _steady(spec: dict, members: int) -> float:
    """Seconds of ``spec["steps"]`` steps of ``members`` members at steady
    state: a run of twice the steps minus a run of the steps."""
    return _train(_doubled(spec), members) - _train(spec, members)


def _doubled(spec: dict) -> dict:
    return {**spec, "steps": 2 * spec["steps"]}


def _worker(spec: dict) -> int:
    """A pinned child: warm up, then time one run per ``go`` line on stdin."""
    _train(spec, 1), _train(_doubled(spec), 1)
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            break
        print(json.dumps({"seconds": _steady(spec, 1)}), flush=True)
    return 0


class _Pinned:
    """A worker process pinned to one CPU."""

    def __init__(self, spec: dict, cpu: int):
        self.proc = subprocess.Popen([sys.executable, "-m", "mx_proxy.cli.bench.processes", "--worker",
                                      json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))

    def expect(self, what: str) -> str:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"a worker process exited (exit code {self.proc.wait()}) before '{what}'")
        return line

    def go(self):
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def per_hour(members: int, steps: int, seconds: float) -> float:
    return members * steps * 3600.0 / seconds


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="mx-proxy bench processes", description=plain(__doc__))
    add_shape(p, width=512, batch=2048)
    p.add_argument("--recipe", default="paper_e4m3")
    p.add_argument("--dot", default="bf16")
    p.add_argument("--steps", type=int, default=10, help="steps per timed run")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--diagnostics-every", type=int, default=0)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return _worker(json.loads(args.worker))
    cpus = sorted(os.sched_getaffinity(0))
    spec = dict(width=args.width, depth=args.depth, batch=args.batch, recipe=args.recipe, dot=args.dot,
                steps=args.steps, diagnostics_every=args.diagnostics_every, val_every=0)
    print(f"mx-proxy bench processes: width {args.width}, depth {args.depth}, batch {args.batch}, {args.recipe}, "
          f"dot={args.dot}, diagnostics every {args.diagnostics_every or 'never'}; "
          f"runs of {args.steps} and {2 * args.steps} steps differenced, median of {args.repeats}")
    print(f"  CPU: {machine.describe()}")
    if len(cpus) < 2:
        print("  fewer than two CPUs: nothing to compare")
        return 0
    workers = [_Pinned(spec, cpu) for cpu in cpus[:2]]
    try:
        for members in (1, 2):  # warm-up: compile here while the workers compile
            _train(spec, members), _train(_doubled(spec), members)
        for w in workers:
            w.expect("ready")
        times = {"one": [], "group": [], "two": []}
        for _ in range(args.repeats):
            times["one"].append(per_hour(1, args.steps, _steady(spec, 1)))
            times["group"].append(per_hour(2, args.steps, _steady(spec, 2)))
            for w in workers:
                w.go()
            seconds = [json.loads(w.expect("a result"))["seconds"] for w in workers]
            times["two"].append(sum(per_hour(1, args.steps, s) for s in seconds))
    finally:
        for w in workers:
            w.close()
    rate = {k: float(np.median(v)) for k, v in times.items()}
    labels = {"one": "one process, one member (XLA threads on every core)",
              "group": "one process, two members as one sweep group",
              "two": "two processes, one member each, pinned to one core each"}
    for k, label in labels.items():
        print(f"  {label:56s} {rate[k]:8.0f} member-steps/hour ({3600e3 / rate[k]:.0f} ms per member-step)")
    best = max(rate, key=rate.get)
    print(f"  fastest: {labels[best]} ({rate[best] / rate['one']:.2f}x one process, one member)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
