"""``Sweep``: the result of :func:`mxp.sweep`, and how sweep axes become member configs."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from mx_proxy.numerics.recipe import Recipe
from mx_proxy.training.config import Config
from mx_proxy.training.result import Run

__all__ = ["Sweep", "members"]


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


def members(config: Config, axes: dict) -> tuple[dict, list[Config]]:
    """(axes as lists, one config per member): the Cartesian product of the
    axes (last axis fastest) applied to ``config``.

    Raises:
      ValueError: an unknown axis (naming the valid fields), an axis with no
        values, or a value the Config rejects.
    """
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
