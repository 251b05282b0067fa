"""Ablations as rates: every cell of an ablation (an activation, a normalization, any Config change) trained as
a seed ensemble of each recipe, and its blow-ups counted with intervals.

One run per (cell, recipe) says whether that one trajectory blew up; at a setting where blow-ups are
stochastic (the ``unstable`` scale: ``mxfp8_e4m3`` blew up in 4 of 8 seeds, FP32 in none) that is a coin
toss. Here each cell is a ``seed`` ensemble (:func:`mx_proxy.experiments.ensemble_train.ensemble`): the
recipes are its arms, member i at seed = data seed = ``first_seed`` + i in every arm, so the arms are paired
and each cell's table gives P(blow-up) per recipe with a Clopper–Pearson 95 % interval and McNemar's exact
test against the first recipe. Notebooks 03 and 04 use it where the scale sets ``rate_members``.

Usage::

    from mx_proxy.experiments import cell_rates, scales
    s = scales.get("unstable")
    cells = cell_rates.train(s.config, ["fp32", "mxfp8_e4m3"], s.rate_members,
                             cells=[{"act": "gelu"}, {"act": "relu", "norm": "rmsnorm"}], out="~/ablation-rates")
    cells.rates()      # one row per (cell, recipe)
    cells.runs         # every member's Run, for analysis.summary and the plots

From a shell (resumable: each cell's ensemble resumes in its folder; the table is rewritten after each cell)::

    python -m mx_proxy.experiments.cell_rates --scale unstable --out ~/ablation-rates \
        --cells act=gelu,norm=layernorm act=gelu,norm=rmsnorm --table results/ablation_rates_unstable.csv
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from mx_proxy.experiments import scales
from mx_proxy.experiments.ensemble_result import EnsembleResult
from mx_proxy.experiments.ensemble_train import ensemble
from mx_proxy.store import durable
from mx_proxy.training.config import Config
from mx_proxy.training.paths import checked_path
from mx_proxy.training.result import Run

__all__ = ["CellRates", "train", "cell_configs", "cell_name", "parse_cell"]


def parse_cell(text: str) -> dict[str, Any]:
    """One cell's Config changes from ``FIELD=VALUE[,FIELD=VALUE…]`` (e.g. ``act=relu,norm=rmsnorm``); each
    VALUE read as an int, else a float, else ``true``/``false``, else text.

    Raises:
      ValueError: a part without ``=`` or a field Config does not have (naming it and the valid fields)."""
    changes = {}
    for part in text.split(","):
        field, eq, value = part.partition("=")
        if not eq or not field:
            raise ValueError(f"cell {text!r}: {part!r} is not FIELD=VALUE (e.g. act=relu,norm=rmsnorm)")
        if field not in Config.field_names():
            raise ValueError(f"cell {text!r}: unknown field {field!r}; valid: {', '.join(Config.field_names())}")
        for parse in (int, float, {"true": True, "false": False}.__getitem__):
            try:
                changes[field] = parse(value)
                break
            except (KeyError, ValueError):
                continue
        else:
            changes[field] = value
    return changes


def cell_name(changes: Mapping[str, Any]) -> str:
    """A folder name of one cell's Config changes in letters, digits, ``.``, ``_`` and ``-`` alone, e.g.
    ``act-relu__norm-rmsnorm`` (``base``: none)."""
    if not changes:
        return "base"
    return "__".join(f"{k}-{re.sub(r'[^A-Za-z0-9._-]', '-', str(v))}" for k, v in sorted(changes.items()))


def cell_configs(config: Config, cells: Sequence[Mapping[str, Any]]) -> list[Config]:
    """``config`` with each cell's changes applied.

    Raises:
      ValueError: a cell whose changes make an invalid Config, naming the cell."""
    bases = []
    for c in cells:
        try:
            bases.append(config.replace(**c))
        except (TypeError, ValueError) as e:
            raise ValueError(f"ablation cell {dict(c)}: {e}") from None
    return bases


@dataclasses.dataclass(frozen=True)
class CellRates:
    """The seed ensembles of an ablation: ``cells[i]`` (its Config changes) trained as ``ensembles[i]``."""

    cells: tuple[Mapping[str, Any], ...]
    ensembles: tuple[EnsembleResult, ...]

    @property
    def runs(self) -> list[Run]:
        """Every member of every cell and recipe (recipe by recipe, member by member, cell after cell)."""
        return [r for e in self.ensembles for arm in e.spec.arms for r in e.runs.get(arm, []) if r is not None]

    def rates(self) -> pd.DataFrame:
        """One row per (cell, recipe): the cell's changed fields as columns, then ``arm`` (the recipe),
        ``members``, ``blowups``, ``p`` with its 95 % interval ``low``/``high`` (Clopper–Pearson), and
        ``mcnemar_p``: McNemar's exact test against the cell's first recipe on the same seeds (``NaN`` for
        the first recipe itself)."""
        keys = sorted({k for c in self.cells for k in c})
        frames = []
        for changes, e in zip(self.cells, self.ensembles):
            r = e.rates()[["arm", "members", "blowups", "p", "low", "high"]]
            t = e.paired_tests()
            mc = dict(zip(t["arm"], t["mcnemar_p"])) if len(t) else {}
            r = r.assign(mcnemar_p=[mc.get(a, float("nan")) for a in r["arm"]])
            for k in reversed(keys):
                r.insert(0, k, changes.get(k, getattr(e.spec.base, k)))
            frames.append(r)
        return pd.concat(frames, ignore_index=True)


def train(config: Config, recipes: Sequence[str], members: int, *, cells: Sequence[Mapping[str, Any]] = ({},),
          out, first_seed: int = 1, progress: bool = False) -> CellRates:
    """Train each cell of an ablation as a seed ensemble of ``recipes``.

    Args:
      config: the base config (its ``recipe`` and seeds are the ensembles' to set).
      recipes: the arms; the first is the control of the paired tests (e.g. ``fp32``).
      members: seeds per recipe and cell (≥ 1): seed = data seed = ``first_seed`` … ``first_seed`` + members − 1.
      cells: Config changes, one mapping per cell (e.g. ``{"act": "relu", "norm": "rmsnorm"}``).
      out: folder of the cells' ensembles, one subfolder per cell (:func:`cell_name`); rerunning with the
        same folder loads what is there and trains only what is missing.
      progress: progress bars (``False``: silent, so a notebook's output is the same when a rerun loads).

    Raises:
      ValueError: no recipe, ``members`` < 1, ``out`` not a usable folder path, or a cell whose changes make
        an invalid Config (naming it),
        before anything trains.
    """
    recipes = [recipes] if isinstance(recipes, str) else list(recipes)
    if not recipes:
        raise ValueError("cell_rates.train needs at least one recipe")
    if isinstance(members, bool) or not isinstance(members, int) or members < 1:
        raise ValueError(f"members must be an integer >= 1, got {members!r}")
    cells = tuple(dict(c) for c in cells)
    bases = cell_configs(config, cells)
    out = checked_path(out, "out", folder=True)
    results = tuple(ensemble(base, kind="seed", arms=recipes, members=members, horizon=base.steps,
                             first_seed=first_seed, name=cell_name(c), out=out / cell_name(c), progress=progress)
                    for c, base in zip(cells, bases))
    return CellRates(cells, results)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mx_proxy.experiments.cell_rates", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", default="unstable", help=f"base config; valid: {', '.join(scales.names())}")
    p.add_argument("--out", required=True, help="folder of the cells' ensembles (resumable)")
    p.add_argument("--recipes", nargs="+", default=["fp32", "mxfp8_e4m3"], help="the arms; the first is the control")
    p.add_argument("--cells", nargs="+", metavar="FIELD=VALUE[,...]",
                   help="the cells (default: the scale's ablation_cells, act=…,norm=…)")
    p.add_argument("--members", type=int, help="seeds per cell and recipe (default: the scale's rate_members)")
    p.add_argument("--steps", type=int, help="fewer steps per member (a test)")
    p.add_argument("--table", help="CSV of the rates, rewritten (atomically) after each cell")
    args = p.parse_args(argv)
    try:
        scale = scales.get(args.scale)
        cells = ([parse_cell(c) for c in args.cells] if args.cells
                 else [{"act": a, "norm": n} for a, n in scale.ablation_cells])
        members = scale.rate_members if args.members is None else args.members
        if members < 1:
            raise ValueError(f"--members must be >= 1, got {members}" if args.members is not None
                             else f"scale {scale.name!r} has no rate_members; give --members N (N >= 1)")
        if args.steps is not None and args.steps < 1:
            raise ValueError(f"--steps must be >= 1, got {args.steps}")
        config = scale.config.replace(**({"steps": args.steps} if args.steps else {}))
        cell_configs(config, cells)  # every cell checked before any trains
        for r in args.recipes:
            config.replace(recipe=r)
    except ValueError as e:
        p.error(str(e))
    done = CellRates((), ())
    for c in cells:
        one = train(config, args.recipes, members, cells=[c], out=args.out, progress=True)
        done = CellRates(done.cells + one.cells, done.ensembles + one.ensembles)
        rates = done.rates()
        if args.table:
            durable.atomic_write(Path(args.table), lambda path, rates=rates: rates.to_csv(path, index=False))
    with pd.option_context("display.width", 200, "display.max_columns", None):
        print(rates.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
