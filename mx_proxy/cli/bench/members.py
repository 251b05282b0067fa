"""``mx-proxy bench members``: member-steps/s against the members trained as one program, beside the roofline.

An ensemble's budget is member-steps, and its members train in groups that share one compiled program (vmapped on
an accelerator, one after another by ``lax.map`` on a one-device CPU: :func:`mx_proxy.runner.programs.vmaps`). For
one configuration (``--width``, ``--depth``, ``--batch``, ``--dot``) this times, per recipe (``--recipes``), with
and without the paired FP32 twin (``--twin``), with the diagnostics every 5, every 50 or never (``--diagnostics``),
a group of each size in ``--members`` (1 4 8 16 32 64; the sizes after one that does not fit are skipped): one
segment of ``--steps`` steps of the host loop's own program (the ensemble's, metrics copied to the host included),
the best of ``--repeats`` after a first one that compiles. Each row prints the members' steps per second (the
twin's steps not counted) beside the roofline's (:mod:`mx_proxy.cli.bench.roofline`: XLA's ``cost_analysis()`` of
one member's compiled step, a plain one and a diagnostic one, times the segment's steps of each kind and the
members; every GEMM at the peak of its dot precision, the bytes at the device's bandwidth) and the measured
fraction of it (and of its compute time alone: XLA's bytes count every operation's operands, fused or held in a
cache or not, so on a CPU the memory time is no bound), then the fastest group size of each configuration.
Peaks: the datasheet's for a known GPU, measured on the machine for a CPU. ``--profile DIR``: a ``jax.profiler``
trace of one segment of the configuration furthest from its roofline (view it in TensorBoard's profile plugin or
Perfetto).
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np
import pandas as pd

from mx_proxy.cli.bench import machine
from mx_proxy.cli.bench import roofline as _roof
from mx_proxy.cli.bench.options import add_shape
from mx_proxy.runner import device, programs
from mx_proxy.runner.member_axis import place
from mx_proxy.runner.members import Member, init_state
from mx_proxy.store import checkpoint as ckpt
from mx_proxy.training import memory as _memory
from mx_proxy.training.config import Config
from mx_proxy.training.engine import dynamic_for, program_for
from mx_proxy.viz.text import plain

__all__ = ["main", "measure", "step_cost", "segment_cost", "COLUMNS", "DIAGNOSTICS"]

DIAGNOSTICS = {"5": 5, "50": 50, "never": 0}
COLUMNS = ["recipe", "twin", "diagnostics", "members", "program", "member_steps_per_s", "roofline_member_steps_per_s",
           "fraction", "compute_fraction", "bound"]
RUN_STEPS = 1000  # the timed configs' steps: more than a segment's rows (chunk), so every segment is the same program


def config_for(shape: dict, recipe: str, twin: bool, every: int) -> Config:
    """The timed configuration: ``shape`` (width, depth, batch, dot), ``recipe``, the twin or not, diagnostics
    every ``every`` steps (0: never); no validation, no checkpoints."""
    return Config(**shape, recipe=recipe, steps=RUN_STEPS, diagnostics_every=every, val_every=0, checkpoint_every=0,
                  paired_run=twin)


def step_cost(config: Config) -> dict:
    """:func:`mx_proxy.cli.bench.roofline.cost` of one member's step of ``config`` (a diagnostic step where the
    config has diagnostics: the cost of a conditional is its larger branch's)."""
    state, teacher = init_state(config)
    program, dyn = program_for(config), dynamic_for(config)
    return _roof.cost(lambda s, t, d, te: program._step(s, t, d, te), state, np.int32(0), dyn, teacher)


def segment_cost(plain_step: dict, diag_step: dict, steps: int, every: int, members: int) -> dict:
    """The cost of ``members`` members' segment of ``steps`` steps from step 0: ``⌈steps / every⌉`` diagnostic
    steps (none for ``every`` = 0), the rest plain."""
    k = -(-steps // every) if every else 0

    def total(field):
        return members * ((steps - k) * plain_step[field] + k * diag_step[field])

    return {"flops": total("flops"), "bytes": total("bytes"),
            "dots": {c: members * ((steps - k) * plain_step["dots"][c] + k * diag_step["dots"][c])
                     for c in _roof.DOT_CLASSES}}


def _plus(a: dict, b: dict, sign: int = 1) -> dict:
    return {"flops": a["flops"] + sign * b["flops"], "bytes": a["bytes"] + sign * b["bytes"],
            "dots": {c: a["dots"][c] + sign * b["dots"][c] for c in _roof.DOT_CLASSES}}


def _plain_step(shape: dict, recipe: str, twin: bool) -> tuple[dict, dict]:
    """(the cost of a plain step, what a diagnostic step adds) of one member. A twin needs diagnostics, so its
    plain step is its diagnostic step less the same-point diagnostics' increment measured without the twin."""
    plain_step = step_cost(config_for(shape, recipe, False, 0))
    increment = _plus(step_cost(config_for(shape, recipe, False, 5)), plain_step, -1)
    if twin:
        plain_step = _plus(step_cost(config_for(shape, recipe, True, 5)), increment, -1)
    return plain_step, increment


def _group(config: Config, members: int) -> list[Member]:
    out = []
    for s in range(members):
        c = config.replace(seed=s, data_seed=s)
        state, teacher = init_state(c)
        out.append(Member(c, state, teacher, ckpt.CheckpointSink(memory={})))
    return out


def _timed(config: Config, members: int, steps: int, repeats: int, profile=None) -> float:
    """Best seconds of one segment of ``steps`` steps from step 0 of ``members`` members as one program."""
    _memory.check(config, members=members)
    p = place(_group(config, members))
    state, _ = p.segment(p.state, p.dyn, p.teacher, np.int32(0), steps)  # compiles
    jax.block_until_ready(state)
    if profile is not None:
        with jax.profiler.trace(str(profile)):
            jax.block_until_ready(p.segment(p.state, p.dyn, p.teacher, np.int32(0), steps)[0])
    best = np.inf
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(p.segment(p.state, p.dyn, p.teacher, np.int32(0), steps)[0])
        best = min(best, time.perf_counter() - t)
    return best


def _out_of_memory(e: Exception) -> bool:
    return isinstance(e, ValueError) and "memory" in str(e) or "RESOURCE_EXHAUSTED" in str(e) \
        or "out of memory" in str(e).lower()


def measure(shape: dict, recipes, twins, diagnostics, members, *, steps: int, repeats: int, peaks: dict,
            log=print) -> pd.DataFrame:
    """One row (:data:`COLUMNS`) per recipe × twin × diagnostics × group size; a group that does not fit ends
    its configuration's sizes (a row with ``bound`` = ``out of memory``)."""
    rows = []
    for recipe in recipes:
        for twin in twins:
            plain_step, increment = _plain_step(shape, recipe, twin)
            for name in diagnostics:
                every = DIAGNOSTICS[name]
                if twin and not every:
                    log(f"  {recipe}, twin yes, diagnostics never: not a configuration (the twin needs diagnostics)")
                    continue
                config = config_for(shape, recipe, twin, every)
                diag_step = _plus(plain_step, increment) if every else plain_step
                for m in members:
                    row = {"recipe": recipe, "twin": "yes" if twin else "no", "diagnostics": name, "members": m,
                           "program": "vmap" if m > 1 and programs.vmaps(config, jax.default_backend(),
                                                                          jax.device_count()) else
                           ("one" if m == 1 else "lax.map")}
                    try:
                        seconds = _timed(config, m, steps, repeats)
                    except Exception as e:  # noqa: BLE001 (a group that does not fit ends the sizes)
                        if not _out_of_memory(e):
                            raise
                        rows.append({**row, "bound": "out of memory"})
                        log(f"  {recipe}, twin {row['twin']}, diagnostics {name}: {m} members do not fit")
                        break
                    roof = _roof.roofline_seconds(segment_cost(plain_step, diag_step, steps, every, m), peaks)
                    rows.append({**row, "member_steps_per_s": m * steps / seconds,
                                 "roofline_member_steps_per_s": m * steps / roof["seconds"],
                                 "fraction": roof["seconds"] / seconds, "compute_fraction": roof["compute"] / seconds,
                                 "bound": roof["bound"]})
                    log(f"  {recipe}, twin {row['twin']}, diagnostics {name}, {m} members: "
                        f"{m * steps / seconds:.1f} member-steps/s ({roof['seconds'] / seconds:.1%} of the roofline)")
    return pd.DataFrame(rows, columns=COLUMNS)


def fastest(table: pd.DataFrame) -> pd.DataFrame:
    """The fastest group size of each recipe × twin × diagnostics."""
    ok = table.dropna(subset=["member_steps_per_s"])
    best = ok.loc[ok.groupby(["recipe", "twin", "diagnostics"], sort=False)["member_steps_per_s"].idxmax()]
    return best[["recipe", "twin", "diagnostics", "members", "member_steps_per_s", "fraction"]]


def _peaks() -> _roof.Peaks:
    if jax.default_backend() == "cpu":
        return _roof.measure_cpu()
    kind = jax.devices()[0].device_kind
    found = _roof.peaks_for(kind)
    if found is None:
        raise SystemExit(f"mx-proxy bench members: no peaks known for {kind!r}; known: {', '.join(_roof.PEAKS)}")
    return found


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--members takes group sizes like 1,4,8, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--members takes positive group sizes, got {text!r}")
    return sizes


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="mx-proxy bench members", description=plain(__doc__))
    add_shape(p, width=512, batch=2048)
    p.add_argument("--dot", default="bf16", choices=("bf16", "f32"))
    p.add_argument("--recipes", nargs="+", default=["fp32", "paper_e4m3", "mxfp8_e4m3"])
    p.add_argument("--members", type=_sizes, default=[1, 4, 8, 16, 32, 64], help="group sizes, e.g. 1,4,8")
    p.add_argument("--twin", choices=("no", "yes", "both"), default="both")
    p.add_argument("--diagnostics", nargs="+", choices=tuple(DIAGNOSTICS), default=list(DIAGNOSTICS))
    p.add_argument("--steps", type=int, default=50, help="steps of the timed segment (at most 100)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--profile", default=None, help="write a jax.profiler trace of the slowest configuration here")
    a = p.parse_args(argv)
    if not 1 <= a.steps <= 100:
        p.error(f"--steps must be in 1…100 (a segment's rows), got {a.steps}")
    if a.repeats < 1:
        p.error(f"--repeats must be at least 1, got {a.repeats}")
    shape = dict(width=a.width, depth=a.depth, batch=a.batch, dot=a.dot)
    for r in a.recipes:
        try:
            config_for(shape, r, False, 0)
        except ValueError as e:
            p.error(str(e))
    peaks = _peaks()
    here = device.describe()
    print(f"mx-proxy bench members: width {a.width}, depth {a.depth}, batch {a.batch}, dot={a.dot}; segments of "
          f"{a.steps} steps, best of {a.repeats}; {here}, jax {jax.__version__}")
    if jax.default_backend() == "cpu":
        print(f"  CPU: {machine.describe()}")
    print("  peaks (" + peaks.source + "): " + ", ".join(f"{k} {peaks[k] / 1e12:.3g} TFLOP/s"
                                                         for k in _roof.DOT_CLASSES)
          + f", {peaks['bandwidth'] / 1e9:.3g} GB/s")
    twins = {"no": [False], "yes": [True], "both": [False, True]}[a.twin]
    table = measure(shape, a.recipes, twins, a.diagnostics, a.members, steps=a.steps, repeats=a.repeats, peaks=peaks)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
        print("fastest group size:")
        print(fastest(table).to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    if a.profile:
        worst = table.dropna(subset=["fraction"]).sort_values("fraction").iloc[0]
        config = config_for(shape, worst["recipe"], worst["twin"] == "yes", DIAGNOSTICS[worst["diagnostics"]])
        _timed(config, int(worst["members"]), a.steps, 1, profile=a.profile)
        print(f"profile of {worst['recipe']}, twin {worst['twin']}, diagnostics {worst['diagnostics']}, "
              f"{worst['members']} members ({worst['fraction']:.1%} of its roofline): a jax.profiler trace in "
              f"{a.profile}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
