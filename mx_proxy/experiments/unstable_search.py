"""The search for a cheaper unstable setting: where does MX blow up often, and FP32 never?

The paper's own setting (width 512, 9000 steps) costs hours per run on a
CPU. This search walks the paper's Fig. 2 family — depth 4–8, width 128–384,
batch 2048, Adam with a constant LR 6e-4…3e-3, 7000 steps — from the
cheapest shape up (a step costs ∝ width² · depth; the LR costs nothing), each
shape's LRs from the largest down, and asks of each: do ``paper_e4m3`` or
``mxfp8_e4m3`` blow up in at least 30 % of at least 8 seeds while FP32 blows
up in none? Largest LR first because blow-ups grow with the LR: the first LR of a shape
at which FP32 stays stable is the likeliest to qualify, so the search reaches
it without first training the shape's stablest settings; and a shape whose
MX arms stay stable at an LR where FP32 does too is taken to be stable at its
smaller LRs, which are not trained (their rows say ``skipped`` and why). That
rule is an assumption, not a measurement: it is what makes the search fit a
CPU (a full walk of all 24 settings would take ~235 h on a 2-core CPU, see
docs/ensembles.md). Each setting is a ``seed`` ensemble
(:mod:`mx_proxy.experiments.ensemble`; arms ``fp32``, ``paper_e4m3``,
``mxfp8_e4m3``, member i at seed i + 1 in every arm) trained in two stages:

1. *screen*: members 0–3 of every arm, the MX arms' first. No MX blow-up in
   4 is out (a setting whose true rate is 30 % passes this screen with
   probability 1 − 0.7⁴ ≈ 0.76: the table says so), and FP32 is not
   trained. Otherwise FP32's four train: FP32 blowing up in any is the
   LR-driven instability both precisions share, the setting is out, and
   the search goes on to the shape's next smaller LR.
2. *full*: members 4–7 (the same ensemble, extended), then the verdict
   with Clopper–Pearson intervals.

The first setting that qualifies ends the search. Every setting tried is a
row per arm of the table (``results/unstable_search.csv`` by default), rebuilt
from the ensembles' exported members after each stage, so the table is the
honest record, negative results included. The search resumes where it
stopped (the ensembles' run stores), also across sessions on one machine.
A setting the table already decided (out, qualifying, or skipped) is not
trained again, even where its run store is gone (a fresh machine, a cleared
scratch folder): its rows are carried over from the table as they are,
so a committed table is where the next machine starts. Members trained
before the MX-first order (the first two settings, FP32 first) count the same.

A setting's MX screen alone outlasts some sessions, and the run store may
not survive to the next one. So the search also carries each setting's
exported members (``--carry``, default ``results/unstable_search/``, next to
the table, and committed with it): after every unit of four members it
copies the setting's exports there, and before a setting trains it copies
back whatever the store lacks. A fresh machine then trains only the members
no machine finished (a member's numbers do not depend on which machine's
unit it shared). The carried folders are the search's raw record too: every
member's loss curve and diagnostics, kept after the table has decided.

Usage::

    python -m mx_proxy.experiments.unstable_search --out ~/unstable-search [--hours 6] \\
        [--table results/unstable_search.csv] [--carry results/unstable_search]
    python -m mx_proxy.experiments.unstable_search --out ~/unstable-search --status

``--status`` prints the table and, per setting started and not decided, where
its ensemble stands (:func:`progress`: members exported, checkpointed,
member-steps left and hours at the measured speed, counted to all 8 members
per arm).
"""

from __future__ import annotations

import argparse
import itertools
import re
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from mx_proxy.experiments import ensemble as _ens
from mx_proxy.experiments import ensemble_result, ensemble_status, stats
from mx_proxy.store import durable
from mx_proxy.training.config import Config
from mx_proxy.training.paths import checked_path

__all__ = ["SETTINGS", "spec_of", "base_config", "ARMS", "search", "table", "read_table", "decided", "merged",
           "progress", "SCREEN", "MEMBERS", "RATE", "MX_ARMS", "parse_setting"]

ARMS = ("fp32", "paper_e4m3", "mxfp8_e4m3")
MX_ARMS = ARMS[1:]
SCREEN, MEMBERS, RATE = 4, 8, 0.30
STEPS = 7000
_COLUMNS = ["setting", "width", "depth", "lr", "batch", "steps", "arm", "members", "blowups", "p", "low", "high",
            "first_blowup_at", "stage", "verdict"]


def _label(width: int, depth: int, lr: float) -> str:
    return f"w{width}-d{depth}-lr{lr:g}"


def _order(width: int, depth: int, lr: float) -> tuple:
    """The search order's sort key: the cheapest shape first (a step costs ∝ width² · depth), its largest LR first."""
    return width * width * depth, width, depth, -lr


SETTINGS: tuple[tuple[int, int, float], ...] = tuple(sorted(
    itertools.product((128, 256, 384), (4, 8), (6e-4, 1e-3, 2e-3, 3e-3)), key=lambda s: _order(*s)))
"""(width, depth, LR) of the Fig. 2 family, cheapest shape first (cost ∝ width² · depth), its largest LR first."""


def base_config(width: int, depth: int, lr: float, steps: int = STEPS, batch: int = 2048, **changes) -> Config:
    """The members' base config of one setting (the paper's proxy, diagnostics every 50 steps, bf16 dots)."""
    return Config(width=width, depth=depth, lr=lr, batch=batch, steps=steps, diagnostics_every=50, val_every=0,
                  dot="bf16").replace(**changes)


def spec_of(width: int, depth: int, lr: float, **changes) -> _ens.Ensemble:
    base = base_config(width, depth, lr, **changes)
    return _ens.Ensemble(_label(width, depth, lr), "seed", base, ARMS, MEMBERS, base.steps, checkpoint_every=500)


def _verdict(rows: dict) -> tuple[str, str] | None:
    """(stage reached, verdict) from the arms' (blow-ups, members exported); ``None`` while a stage is unfinished."""
    (fp32, n32), mx = rows["fp32"], [rows[a] for a in MX_ARMS]
    mx_k, mx_n = max(k for k, _ in mx), min(n for _, n in mx)
    stage = "full" if max(n for _, n in rows.values()) > SCREEN else "screen"
    if fp32 and n32 >= SCREEN:
        return stage, f"out: FP32 blew up too ({fp32}/{n32}: LR-driven){'; MX arms not trained' if not mx_n else ''}"
    if mx_n < SCREEN or (mx_k and n32 < SCREEN):
        return None
    if mx_n <= SCREEN and not mx_k:
        return "screen", (f"out: no MX blow-up in {SCREEN} (a 30 % rate passes with probability 0.76)"
                          f"{'; FP32 not trained' if not n32 else ''}")
    if max(mx_n, n32) <= SCREEN:
        return "screen", "passes the screen: extend to 8"
    if min(mx_n, n32) < MEMBERS:
        return None
    ok = any(k >= RATE * n for k, n in mx)
    return "full", "qualifies" if ok else f"out: MX blew up in fewer than {RATE:.0%} of {MEMBERS}"


def _row(base: Config, arm: str, stage: str, verdict: str, blowups: int = 0, members: int = 0,
         first_blowup_at: int | None = None) -> dict:
    """One row of the table: ``arm`` of the setting whose members' base config is ``base``."""
    r = stats.rate(blowups, members) if members else stats.Rate(0, 0, float("nan"), float("nan"), float("nan"))
    return {"setting": _label(base.width, base.depth, base.lr), "width": base.width, "depth": base.depth,
            "lr": base.lr, "batch": base.batch, "steps": base.steps, "arm": arm, "members": members,
            "blowups": blowups, "p": r.p, "low": r.low, "high": r.high, "first_blowup_at": first_blowup_at,
            "stage": stage, "verdict": verdict}


def _skipped_rows(width: int, depth: int, lr: float, stable_lr: float, **changes) -> list[dict]:
    """The table's rows of a setting not trained: its shape's MX arms were stable at the larger LR ``stable_lr``."""
    verdict = f"skipped: no MX blow-up at LR {stable_lr:g} of this shape, and blow-ups grow with the LR"
    return [_row(base_config(width, depth, lr, **changes), arm, "skipped", verdict) for arm in ARMS]


def table(out) -> pd.DataFrame:
    """The search's record so far: one row per arm of every setting that has exported members in ``out``."""
    rows = []
    found = [f for f in Path(out).glob("*") if (f / "results" / _ens.SPEC_FILE).exists()] if Path(out).is_dir() else []
    for folder in found:
        res = ensemble_result.load(folder)
        t = res.table
        counts = {a: (int(t[t["arm"] == a]["event"].sum()), int((t["arm"] == a).sum())) for a in ARMS}
        decision = _verdict(counts)
        if decision is None:  # a stage is still training
            continue
        stage, verdict = decision
        for arm in ARMS:
            k, n = counts[arm]
            first = t[(t["arm"] == arm) & t["event"]]["blowup_at"]
            rows.append(_row(res.spec.base.replace(steps=res.spec.horizon), arm, stage, verdict, k, n,
                             int(first.min()) if len(first) else None))
    rows.sort(key=lambda r: _order(r["width"], r["depth"], r["lr"]))  # stable: each setting's arms stay in order
    df = pd.DataFrame(rows, columns=_COLUMNS)
    df["first_blowup_at"] = df["first_blowup_at"].astype("Int64")
    return df


def read_table(path) -> pd.DataFrame:
    """The search's table at ``path`` (empty where there is none, or ``path`` is ``None``), validated: its
    columns are the search's."""
    if path is None or not Path(path).exists():
        return pd.DataFrame(columns=_COLUMNS)
    path = Path(path)
    df = pd.read_csv(path)
    if list(df.columns) != _COLUMNS:
        raise ValueError(f"{path} is not the unstable search's table: columns {list(df.columns)}, expected {_COLUMNS}")
    df["first_blowup_at"] = df["first_blowup_at"].astype("Int64")
    return df


def decided(df: pd.DataFrame) -> set[str]:
    """The settings of table ``df`` whose verdict is final (out, skipped, or qualifying)."""
    verdict = df["verdict"].astype(str)
    final = verdict.str.startswith("out") | verdict.str.startswith("skipped") | (verdict == "qualifies")
    return set(df.loc[final, "setting"])


def progress(out) -> pd.DataFrame:
    """Where each started setting's ensemble in ``out`` stands, in search order: one row per arm
    (:func:`mx_proxy.experiments.ensemble_status.status`) with its ``setting``. Reads only."""
    out = checked_path(out, "out", folder=True)
    started = [(f, _ens.read_spec(f)) for f in sorted(out.glob("*")) if (f / "results" / _ens.SPEC_FILE).exists()]
    started.sort(key=lambda fs: _order(fs[1].base.width, fs[1].base.depth, fs[1].base.lr))
    if not started:
        return pd.DataFrame(columns=["setting", "arm"])
    df = pd.concat([ensemble_status.status(f).assign(setting=s.name) for f, s in started], ignore_index=True)
    return df[["setting", *[c for c in df.columns if c != "setting"]]]


def search(out, *, table_path=None, hours: float | None = None, settings=SETTINGS, progress: bool = True,
           log: Callable[[str], None] = print, carry_to=None, **changes) -> pd.DataFrame:
    """Run the search (see the module docstring) in ``out`` until a setting
    qualifies, every setting is decided, or ``hours`` have passed (checked
    between stages); rewrite ``table_path`` after each stage. A setting that
    ``table_path`` already decided is skipped and its rows are kept; so is a
    setting whose shape was stable at a larger LR (rows ``skipped``).
    ``carry_to``: the folder each setting's exported members are carried in
    (:func:`mx_proxy.experiments.ensemble.copy_members`, after every unit;
    read back before the setting trains), or ``None``.
    ``changes``: Config fields every setting's base takes (smaller
    ``steps``/``batch`` for a test)."""
    out = checked_path(out, "out", folder=True)
    read_table(table_path)  # refuse a file that is not the search's table before anything trains
    t0 = time.time()
    stable_at: dict[tuple[int, int], float] = {}  # shape → the LR at which its MX arms stayed stable
    extra: list[dict] = []  # rows of the settings skipped in this call
    now = merged(out, table_path)  # the table as it stands; only a write (after training or a skip) changes it

    def write() -> pd.DataFrame:
        nonlocal now
        now = _write(out, table_path, extra)
        return now

    def over() -> bool:
        if hours is not None and time.time() - t0 > hours * 3600:
            log(f"[unstable search] {hours:g} h spent: stopping; rerun to continue")
            return True
        return False

    def settle(name: str, verdict: str, shape: tuple[int, int], lr: float, how: str = "") -> None:
        log(f"[unstable search] {name}: {how}{verdict}")
        if not verdict.startswith("out: FP32 blew up"):  # MX stable here: the shape's smaller LRs are too
            stable_at.setdefault(shape, lr)

    for width, depth, lr in settings:
        spec = spec_of(width, depth, lr, **changes)
        folder, shape = out / spec.name, (width, depth)
        if spec.name in decided(now):  # by its exported members, or carried over from the table
            verdict = _verdict_of(now, spec.name)
            if verdict == "qualifies":
                log(f"[unstable search] {spec.name}: qualifies")
                return write()
            if not verdict.startswith("skipped"):
                settle(spec.name, verdict, shape, lr, how="decided: ")
            continue
        if shape in stable_at:
            extra.extend(_skipped_rows(width, depth, lr, stable_at[shape], **changes))
            log(f"[unstable search] {spec.name}: {extra[-1]['verdict']}")
            write()
            continue
        if over():
            return write()
        carried = None if carry_to is None else Path(carry_to) / spec.name
        _ens.prepare(spec, folder)
        if carried is not None and (got := _ens.copy_members(spec, carried, folder / "results")):
            log(f"[unstable search] {spec.name}: {len(got)} exported members carried in from {carried}")
        verdict = None
        for arm in (*MX_ARMS, "fp32"):  # the screen: FP32 only where an MX arm blew up
            _unit(spec, folder, arm, range(SCREEN), carried, progress)
            df = write()
            verdict = _verdict_of(df, spec.name)
            if verdict is not None:
                break
        if verdict == "qualifies":  # resumed after its full stage
            return df
        if verdict is not None and verdict.startswith("out"):
            settle(spec.name, verdict, shape, lr)
            continue
        log(f"[unstable search] {spec.name}, {SCREEN} members: {verdict or 'extending to 8'}")
        if over():
            return write()
        for arm in (*MX_ARMS, "fp32"):  # the full stage: members 4–7 of every arm
            _unit(spec, folder, arm, range(SCREEN, MEMBERS), carried, progress)
        df = write()
        verdict = _verdict_of(df, spec.name)
        if verdict == "qualifies":
            log(f"[unstable search] {spec.name}, {MEMBERS} members: qualifies")
            return df
        settle(spec.name, verdict, shape, lr)
    return write()


def _unit(spec: _ens.Ensemble, folder: Path, arm: str, members: range, carried: Path | None, progress: bool) -> None:
    """Train (or load) ``members`` of ``arm`` in the setting's ``folder``, then carry its exports to ``carried``."""
    _ens.train_unit(folder, arm, tuple(members), progress=progress)
    if carried is not None:
        _ens.copy_members(spec, folder / "results", carried)


def _verdict_of(df: pd.DataFrame, name: str) -> str | None:
    """The verdict of setting ``name`` in the table ``df`` (``None`` while it has no row)."""
    mine = df[df["setting"] == name]
    return mine["verdict"].iloc[0] if len(mine) else None


def merged(out, table_path=None, extra=()) -> pd.DataFrame:
    """:func:`table` of ``out`` with the rows of the settings the table at
    ``table_path`` decided and ``out`` holds nothing of, carried over as they
    are, and the ``extra`` rows (skipped settings) of settings neither holds, in search order."""
    df = table(out)
    before = read_table(table_path)
    keep = before[before["setting"].isin(decided(before) - set(df["setting"]))]
    more = pd.DataFrame(list(extra), columns=_COLUMNS)
    more = more[~more["setting"].isin(set(df["setting"]) | set(keep["setting"]))]
    parts = [p for p in (df, keep, more) if len(p)]  # an empty frame would turn the text columns' dtype to object
    if not parts:
        return df
    df = pd.concat(parts, ignore_index=True)
    df["first_blowup_at"] = df["first_blowup_at"].astype("Int64")
    key = [_order(int(w), int(d), float(lr)) for w, d, lr in zip(df["width"], df["depth"], df["lr"])]
    return df.iloc[sorted(range(len(df)), key=key.__getitem__)].reset_index(drop=True)


def _write(out: Path, table_path, extra=()) -> pd.DataFrame:
    df = merged(out, table_path, extra)
    if table_path is not None:
        durable.atomic_write(Path(table_path), lambda p: df.to_csv(p, index=False))
    return df


def parse_setting(label: str) -> tuple[int, int, float]:
    """``(width, depth, lr)`` of a setting's label, e.g. ``"w128-d8-lr0.003"``."""
    m = re.fullmatch(r"w(\d+)-d(\d+)-lr([0-9.eE+-]+)", label)
    try:
        width, depth, lr = int(m[1]), int(m[2]), float(m[3])
    except (TypeError, ValueError):
        raise ValueError(f"setting {label!r} is not a label like {_label(*SETTINGS[0])!r} "
                         f"(w<width>-d<depth>-lr<LR>)") from None
    if width < 1 or depth < 1 or not lr > 0:
        raise ValueError(f"setting {label!r}: width and depth must be ≥ 1 and the LR > 0")
    return width, depth, lr


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mx_proxy.experiments.unstable_search", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder of the settings' ensembles (resumable)")
    p.add_argument("--table", default="results/unstable_search.csv", help="the table to rewrite after each stage")
    p.add_argument("--carry", default="results/unstable_search",
                   help="the folder each setting's exported members are carried in, to commit: after every unit of "
                        "members, and read back before a setting trains (default: results/unstable_search)")
    p.add_argument("--hours", type=float, help="stop (between stages) after this many hours; rerun to continue")
    p.add_argument("--status", action="store_true", help="print the table of what has run, train nothing")
    p.add_argument("--settings", nargs="+", metavar="LABEL",
                   help="search only these settings (labels like w128-d8-lr0.003), in search order "
                        "(default: the Fig. 2 family, all 24)")
    p.add_argument("--steps", type=int, help=f"fewer steps per member (a test; default {STEPS})")
    p.add_argument("--batch", type=int, help="a smaller batch (a test; default 2048)")
    args = p.parse_args(argv)
    if args.hours is not None and not args.hours > 0:
        p.error(f"--hours must be > 0, got {args.hours}")
    for name in ("steps", "batch"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name} must be ≥ 1, got {getattr(args, name)}")
    try:
        settings = SETTINGS if args.settings is None else tuple(sorted(
            dict.fromkeys(parse_setting(s) for s in args.settings), key=lambda s: _order(*s)))
        read_table(args.table)
    except ValueError as e:
        p.error(str(e))
    if args.status:
        done = merged(args.out, args.table)
        print(done.to_string(index=False) if len(done) else "no setting has exported members of every arm yet")
        now = progress(args.out)
        now = now[~now["setting"].isin(decided(done))]  # a decided setting has nothing left to train
        if len(now):
            with pd.option_context("display.width", 200, "display.max_columns", None,
                                   "display.float_format", "{:.4g}".format):
                print("\nsettings in progress (member-steps and hours counted to all members):")
                print(now.to_string(index=False))
        return 0
    changes = {k: getattr(args, k) for k in ("steps", "batch") if getattr(args, k) is not None}
    df = search(args.out, table_path=args.table, hours=args.hours, settings=settings, carry_to=args.carry, **changes)
    print(df.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
