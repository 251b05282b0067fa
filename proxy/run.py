"""``train(config) -> Run``: the host loop around the compiled segments."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from proxy.config import Config
from proxy.engine import Program, TrainState, dynamic_for, program_for

__all__ = ["Run", "train", "metrics_frame"]


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
      wall_time_s: seconds spent training (compilation included).
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
        from proxy import controllers

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
    from proxy.controllers import unit_names

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


def _run_loop(program: Program, config: Config, state: TrainState, dyn, teacher, start: int,
              progress: bool, on_segment=None, frames=None):
    """Train from ``start`` to ``config.steps``; returns (state, frames).
    ``on_segment(t, state, frames)`` runs after each segment (checkpoints)."""
    frames = list(frames or [])
    bar = tqdm(total=config.steps, initial=start, disable=not progress, desc=config.recipe.name,
               unit="step", leave=False)
    t = start
    while t < config.steps:
        n = segment_length(config, t)
        val = float(program.val_loss(state.params, dyn, teacher)) if config.val_every and t % config.val_every == 0 else None
        state, m = program.run_segment(state, dyn, teacher, np.int32(t), **program.segment_shape(t, n))
        frame = metrics_frame(jax.device_get(m), start=t)
        frame["val_loss"] = np.nan
        if val is not None:
            frame.loc[frame.index[0], "val_loss"] = val
        frames.append(frame)
        t += n
        bar.update(n)
        if on_segment is not None:
            on_segment(t, state, frames)
        if bool(state.diverged):
            break
    bar.close()
    return state, frames


def finish(config: Config, state: TrainState, frames, t0: float, info=None) -> Run:
    metrics = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame({"step": []})
    diverged_at = int(state.diverged_at) if bool(state.diverged) else None
    if diverged_at is not None:
        metrics = metrics[metrics["step"] <= diverged_at].reset_index(drop=True)
    return Run(config, metrics, diverged_at, jax.device_get(state.params), time.perf_counter() - t0, info or {})


def train(config: Config, *, progress: bool = True, store=None, force: bool = False) -> Run:
    """Train the student of ``config`` from its seed; see :class:`Run`.

    Never raises on divergence: a NaN/Inf or spiking loss stops the run
    cleanly with ``diverged_at`` set and everything before it kept.

    ``store``: a run-store folder (``None``: ``$PROXY_STORE`` or ``runs/``;
    ``False``: memory only). A config already stored there is loaded instead
    of trained (``force=True`` retrains); a run interrupted after a
    checkpoint resumes from it. See :mod:`proxy.experiments`.
    """
    from proxy import experiments  # the store and checkpoints sit above this module

    return experiments.train(config, progress=progress, store=store, force=force)
