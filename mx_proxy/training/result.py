"""``Run``: the result of one training run, and the metrics table it carries."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pandas as pd

from mx_proxy.training import controllers
from mx_proxy.training.config import Config

__all__ = ["Run", "metrics_frame", "segment_length"]


@dataclasses.dataclass
class Run:
    """The result of one training run.

    Attributes:
      config: the :class:`Config` it ran.
      metrics: one row per step that ran (a diverged run ends at its
        ``diverged_at`` row); see the README for the columns.
      diverged_at: first step whose loss was non-finite or spiked above
        ``spike_factor`` × the previous step's, else ``None``.
      params: final student parameters (numpy pytree; at a divergence, the
        last parameters before it).
      wall_time_s: seconds spent training (compilation included), summed over
        the stretches of a resumed run; an intervention's own steps only.
      info: provenance (e.g. the parent run and intervention that made it;
        ``key``, the run's key in a run store).
      path: the run's folder in a run store, or ``None`` (in memory only).
      checkpoints: in-memory checkpoints ``{step: (TrainState, metrics)}`` of
        a run kept out of any store (stored runs keep them on disk).
    """

    config: Config
    metrics: pd.DataFrame
    diverged_at: int | None
    params: Any = None
    wall_time_s: float = 0.0
    info: dict = dataclasses.field(default_factory=dict)
    path: str | None = None
    checkpoints: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @property
    def final_loss(self) -> float:
        """Training loss of the last step before any divergence."""
        losses = self.metrics["loss"]
        if self.diverged_at is not None:
            losses = losses[self.metrics["step"] < self.diverged_at]
        return float(losses.iloc[-1]) if len(losses) else float("nan")

    @property
    def events(self) -> pd.DataFrame:
        """The stability controller's promotions and releases, one row each:
        ``step`` (first step the unit ran promoted, or back in low
        precision), ``unit``, ``event`` (``promote``/``release``) and the
        ``gnmr``/``delta_gnmr`` that triggered it. Empty without a controller."""
        depth = self.config.depth
        names = controllers.unit_names(depth)
        cols = [f"promoted/{n}" for n in names]
        if self.config.controller is None or not all(c in self.metrics for c in cols):
            return controllers.events(np.zeros(0, np.int64), np.zeros((0, len(names)), bool),
                                      np.zeros((0, len(names))), np.zeros((0, len(names))), names)
        m = self.metrics
        return controllers.events(m["step"].to_numpy(), m[cols].to_numpy(bool),
                                  m[[f"gnmr/{n}" for n in names]].to_numpy(),
                                  m[[f"delta_gnmr/{n}" for n in names]].to_numpy(), names)

    def summary(self) -> str:
        """One line: recipe, steps, final loss, divergence."""
        c = self.config
        status = f"diverged at step {self.diverged_at}" if self.diverged_at is not None else "stable"
        return (f"{c.recipe.name}: width {c.width} depth {c.depth} lr {c.lr:g} seed {c.seed} — "
                f"{len(self.metrics)} steps, final loss {self.final_loss:.4g}, {status}")

    def __repr__(self) -> str:
        return f"Run({self.summary()})"


_LEADING = ("loss", "lr", "grad_norm", "update_norm", "zeta_bound", "cosine", "zeta_paper", "cosine_paper",
            "ln_clamp_frac", "weight_clamp_frac", "act_clamp_frac", "ref_loss", "ref_grad_norm", "low_precision_frac")


def metrics_frame(metrics: dict[str, np.ndarray], start: int = 0) -> pd.DataFrame:
    """Flatten stacked step metrics (leaves (T,) or (T, depth)) into columns;
    per-block arrays ``name/block`` become ``name/block_0`` … columns, and
    per-unit arrays ``name/unit`` (T, 2·depth) of the stability controller
    ``name/block_0/ln``, ``name/block_0/gemm`` … columns."""
    unit_names = controllers.unit_names
    cols: dict[str, np.ndarray] = {}
    n = None
    for name, arr in metrics.items():
        arr = np.asarray(arr)
        n = arr.shape[0]
        if arr.ndim == 1:
            cols[name] = arr
        else:
            if name.endswith("/unit"):
                for i, unit in enumerate(unit_names(arr.shape[1] // 2)):
                    cols[f"{name.removesuffix('/unit')}/{unit}"] = arr[:, i]
                continue
            base = name.removesuffix("/block")
            for i in range(arr.shape[1]):
                cols[f"{base}/block_{i}"] = arr[:, i]
    head = [c for c in _LEADING if c in cols]
    order = head + sorted(c for c in cols if c not in head)
    frame = pd.DataFrame({c: cols[c] for c in order})
    frame.insert(0, "step", np.arange(start, start + (n or 0), dtype=np.int64))
    return frame


def segment_length(config: Config, t: int) -> int:
    """Steps of the host-loop segment starting at step ``t``: up to the next
    multiple of ``config.chunk``, the end of the run or the next checkpoint."""
    n = min(config.chunk - t % config.chunk, config.steps - t)
    later = [c for c in config.checkpoint_steps() if c > t]
    return min(n, later[0] - t) if later else n
