"""Runtime stability controllers: GNMR (Gradient Norm-to-Mean Ratio).

GNMR watches the gradient norm of every *recoverable unit* and, when it jumps
relative to the unit's own history, promotes that unit to a higher precision
(``action``: bf16 or fp32) for a fixed number of steps. Nothing else about
the run changes (format, kernels, recipe of the other units).

Units
-----
Two per residual block, ordered block-major, LayerNorm before GEMMs:
``("block_0/ln", "block_0/gemm", "block_1/ln", ...)``, U = 2·depth
(:func:`unit_names`). :func:`unit_norms` maps the student's gradient pytree
onto them through :data:`PARAM_UNITS` (``alpha``, the step size of an
nGPT-style block without LayerNorm, belongs to the ln unit; a block with no
ln-kind parameter has ln norm 0, whose ratios are 0/0 = NaN and never fire).

Ratios (computed by :func:`update` at step t from the unit's norm g_t)
---------------------------------------------------------------------
* ``gnmr``       = g_t / mean of every finite norm the unit produced before t
  (NaN until one finite norm has been seen);
* ``delta_gnmr`` = g_t / mean of the finite norms among the last ``window``
  updates t−window … t−1 (NaN until ``window`` updates have been seen, or when
  all of them were non-finite).

Statistics are exact and simple: a float32 running sum and an int32 count of
finite norms per unit (the mean is their quotient) and a ring buffer of the
last ``window`` norms. Every finite norm enters them, including the norms a
unit produces while promoted (so the history keeps tracking the trajectory
and is not stale at release) and the norm that triggers a promotion;
non-finite norms never do (they are stored as NaN in the ring buffer and
skipped by its mean).

Triggers
--------
At update t a unit *fires* when all of
  (a) it ran in low precision at step t (it is not promoted; a promoted unit
      can neither re-trigger nor extend its lock, and a unit released at
      update t is first judged again at update t+1),
  (b) at least ``warmup`` updates (≥ ``window``) preceded this one, and
  (c) g_t is non-finite, or gnmr > ``threshold``, or delta_gnmr >
      ``delta_threshold`` (Δ-GNMR off when that is None).

Budget
------
At most ``max_overrides`` units are promoted at any step. The free slots at
update t are ``max_overrides`` minus the units that stay promoted at step t+1
(slots of units released at update t are free again). If more units fire than
slots are free, the ones with the highest score max(gnmr, delta_gnmr) win
(a non-finite norm scores +inf), ties going to the lower unit index; the
others are dropped (they are judged afresh on their next norm).

Timeline (L = ``lock_steps``)
-----------------------------
The state holds ``lock`` (U,), the remaining promoted steps; ``promoted(state)``
= lock > 0 is the mask in force for the step about to run. Per step t::

    mask_t = promoted(state)            # precision of each unit at step t
    grads_t = step(params, mask_t)      # → norms_t = unit_norms(grads_t)
    state, info = update(ctrl, state, norms_t)

A unit triggered at update t runs promoted at steps t+1 … t+L (exactly L
steps), is released by update t+L (``info["released"]``) and runs in low
precision again from step t+L+1; it can fire again at update t+L+1 at the
earliest. Example, L = 3, spike at step 40::

    step        39  40  41  42  43  44  45
    mask         ·   ·   P   P   P   ·   ·
    lock after   0   3   2   1   0   0   0
    info         -  trig  -   -  rel  -   -

:func:`events` turns a recorded mask into promote/release rows.

The units and their norms are :mod:`mx_proxy.training.controller_units`,
:func:`events` is :mod:`mx_proxy.training.controller_events` (both
re-exported here).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from mx_proxy.training.controller_events import EVENT_COLUMNS, events
from mx_proxy.training.controller_units import PARAM_UNITS, UNIT_KINDS, unit_names, unit_norms

__all__ = ["GNMR", "GNMRState", "ACTIONS", "UNIT_KINDS", "PARAM_UNITS", "init", "promoted", "update",
           "unit_names", "unit_norms", "events", "EVENT_COLUMNS", "UnitSelector", "selector"]

ACTIONS = ("bf16", "fp32")


@dataclasses.dataclass(frozen=True)
class GNMR:
    """GNMR controller settings (frozen, hashable: a static jit argument).

    ``threshold`` (> 1) on g_t / historical mean; ``delta_threshold`` (> 1,
    None = off) on g_t / mean of the last ``window`` norms; no trigger before
    ``warmup`` (≥ ``window``) updates; a triggered unit runs in ``action``
    precision for ``lock_steps`` steps; at most ``max_overrides`` units are
    promoted at once. See the module docstring for the exact semantics.
    """

    threshold: float = 3.0
    delta_threshold: float | None = 2.0
    window: int = 10
    max_overrides: int = 1
    lock_steps: int = 50
    action: str = "bf16"
    warmup: int = 20

    def __post_init__(self):
        def ratio(name, optional=False):
            v = getattr(self, name)
            if optional and v is None:
                return
            ok = (not isinstance(v, bool) and isinstance(v, (int, float, np.integer, np.floating))
                  and math.isfinite(v) and v > 1)
            if not ok:
                extra = " or None (off)" if optional else ""
                raise ValueError(f"{name} must be a finite number > 1{extra}, got {v!r}")
            object.__setattr__(self, name, float(v))

        def positive_int(name, minimum=1, what="a positive integer"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum:
                raise ValueError(f"{name} must be {what}, got {v!r}")
            object.__setattr__(self, name, int(v))

        ratio("threshold")
        ratio("delta_threshold", optional=True)
        for name in ("window", "max_overrides", "lock_steps"):
            positive_int(name)
        positive_int("warmup", self.window, f"an integer >= window ({self.window})")
        if self.action not in ACTIONS:
            raise ValueError(f"unknown action {self.action!r}; valid: {', '.join(ACTIONS)}")

    # -- serialization -------------------------------------------------------
    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict of every field."""
        return {name: getattr(self, name) for name in self.field_names()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GNMR:
        unknown = set(d) - set(cls.field_names())
        if unknown:
            raise ValueError(f"unknown GNMR field(s) {sorted(unknown)}; valid: {', '.join(cls.field_names())}")
        return cls(**d)

    def to_text(self) -> str:
        """The CLI form, ``GNMR.parse(ctrl.to_text()) == ctrl``."""
        parts = [f"{k}={'none' if v is None else v}" for k, v in self.to_dict().items()]
        return "gnmr:" + ",".join(parts)

    @classmethod
    def parse(cls, text: str) -> GNMR:
        """Parse the CLI form: ``"gnmr"`` (defaults), ``"gnmr:k=v,..."`` or
        ``"k=v,..."``, e.g. ``"threshold=3,lock_steps=50,action=fp32"``;
        ``delta_threshold=none`` disables Δ-GNMR."""
        if not isinstance(text, str):
            raise ValueError(f"GNMR spec must be a string, got {text!r}")
        body = text.strip()
        head, sep, rest = body.partition(":")
        if head.strip().lower() == "gnmr":
            body = rest if sep else ""
        elif sep:
            raise ValueError(f"unknown controller {head.strip()!r} in {text!r}; valid: gnmr")
        kwargs: dict[str, Any] = {}
        valid = ", ".join(cls.field_names())
        for item in filter(None, (s.strip() for s in body.split(","))):
            key, eq, value = (s.strip() for s in item.partition("="))
            if not eq or not key or not value:
                raise ValueError(f"bad GNMR setting {item!r} in {text!r}; expected key=value with key in: {valid}")
            if key not in cls.field_names():
                raise ValueError(f"unknown GNMR field {key!r} in {text!r}; valid: {valid}")
            if key in kwargs:
                raise ValueError(f"GNMR field {key!r} given twice in {text!r}")
            kwargs[key] = _parse_value(key, value)
        return cls(**kwargs)


def _parse_value(key: str, value: str):
    if key == "action":
        return value
    if key == "delta_threshold" and value.lower() in ("none", "off"):
        return None
    try:
        if key in ("threshold", "delta_threshold"):
            return float(value)
        return int(value)
    except ValueError:
        kind = "a number" if key in ("threshold", "delta_threshold") else "an integer"
        raise ValueError(f"GNMR field {key} must be {kind}, got {value!r}") from None


class GNMRState(NamedTuple):
    """Traced controller state for U units (vmap adds a leading member axis).

    count   int32 ()        updates seen (drives warm-up and the ring position)
    total   float32 (U,)    sum of the finite norms seen
    n       int32 (U,)      number of finite norms seen (mean = total / n)
    history float32 (window, U)  ring buffer of the last ``window`` norms, slot
                            count % window written next; NaN = empty/non-finite
    lock    int32 (U,)      promoted steps remaining; 0 = low precision
    """

    count: jax.Array
    total: jax.Array
    n: jax.Array
    history: jax.Array
    lock: jax.Array


def init(ctrl: GNMR, n_units: int) -> GNMRState:
    """Fresh state: nothing observed, every unit in low precision."""
    if isinstance(n_units, bool) or not isinstance(n_units, (int, np.integer)) or n_units < 1:
        raise ValueError(f"n_units must be a positive integer, got {n_units!r}")
    return GNMRState(count=jnp.zeros((), jnp.int32),
                     total=jnp.zeros((n_units,), jnp.float32),
                     n=jnp.zeros((n_units,), jnp.int32),
                     history=jnp.full((ctrl.window, n_units), jnp.nan, jnp.float32),
                     lock=jnp.zeros((n_units,), jnp.int32))


def promoted(state: GNMRState) -> jax.Array:
    """(U,) bool: the units running in ``action`` precision at the coming step."""
    return state.lock > 0


def update(ctrl: GNMR, state: GNMRState, norms) -> tuple[GNMRState, dict[str, jax.Array]]:
    """One controller step, after step t's gradients: ``norms`` (U,) are the
    per-unit gradient norms of step t (computed under ``promoted(state)``).

    Returns the state for step t+1 and ``info`` of (U,) arrays: ``gnmr``,
    ``delta_gnmr`` (float32, NaN before enough history), ``triggered``
    (newly promoted by this update), ``released`` (lock ran out at this
    update), ``promoted`` (mask in force at step t+1). Pure and jittable
    (``ctrl`` static); vmap/scan friendly.
    """
    g = jnp.asarray(norms, jnp.float32)
    finite = jnp.isfinite(g)

    # Ratios against the statistics of the norms before this one.
    mean = state.total / state.n.astype(jnp.float32)           # NaN (0/0) while n == 0
    gnmr = jnp.where(state.n > 0, g / mean, jnp.nan)
    hist_ok = jnp.isfinite(state.history)
    hist_n = jnp.sum(hist_ok, axis=0)
    recent = jnp.sum(jnp.where(hist_ok, state.history, 0.0), axis=0) / hist_n.astype(jnp.float32)
    delta = jnp.where((state.count >= ctrl.window) & (hist_n > 0), g / recent, jnp.nan)

    # Who fires (comparisons with NaN are False).
    was_promoted = state.lock > 0
    fires = ~finite | (gnmr > ctrl.threshold)
    if ctrl.delta_threshold is not None:
        fires = fires | (delta > ctrl.delta_threshold)
    candidate = fires & ~was_promoted & (state.count >= ctrl.warmup)

    # Budget: free slots after this update's releases; best scores first.
    lock = jnp.maximum(state.lock - 1, 0)
    free = ctrl.max_overrides - jnp.sum(lock > 0)
    score = jnp.fmax(jnp.nan_to_num(gnmr, nan=-jnp.inf), jnp.nan_to_num(delta, nan=-jnp.inf))
    score = jnp.where(finite, score, jnp.inf)
    idx = jnp.arange(g.shape[-1])
    beats = candidate[:, None] & ((score[:, None] > score[None, :])
                                  | ((score[:, None] == score[None, :]) & (idx[:, None] < idx[None, :])))
    rank = jnp.sum(beats, axis=0)                              # candidates ahead of each unit
    triggered = candidate & (rank < free)
    lock = jnp.where(triggered, jnp.int32(ctrl.lock_steps), lock).astype(jnp.int32)
    released = was_promoted & (lock == 0)

    # Statistics: every finite norm enters, promoted or not.
    slot = jnp.arange(ctrl.window) == (state.count % ctrl.window)
    history = jnp.where(slot[:, None], jnp.where(finite, g, jnp.nan)[None, :], state.history)
    new = GNMRState(count=state.count + 1,
                    total=state.total + jnp.where(finite, g, 0.0),
                    n=state.n + finite.astype(jnp.int32),
                    history=history,
                    lock=lock)
    info = {"gnmr": gnmr, "delta_gnmr": delta, "triggered": triggered, "released": released,
            "promoted": lock > 0}
    return new, info


# -- the engine's seam -----------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class UnitSelector:
    """The per-unit precision selector the engine plugs a controller in by.

    The engine knows nothing of GNMR: it asks :meth:`init` for a traced state
    (kept in ``TrainState.ctrl``), :meth:`mask` for the (depth, 2) boolean
    array the student reads (``promote``: per block, its normalization unit
    and its GEMM unit run ``high_recipe``), and after the step :meth:`update`
    for the next state and the metrics to record. ``high_recipe``: the preset
    name a selected unit runs.
    """

    controller: GNMR
    depth: int

    @property
    def high_recipe(self) -> str:
        return self.controller.action

    def init(self) -> GNMRState:
        return init(self.controller, 2 * self.depth)

    def mask(self, state: GNMRState) -> jax.Array:
        """(depth, 2) bool: the units that run ``high_recipe`` at the coming step."""
        return promoted(state).reshape(self.depth, 2)

    def update(self, state: GNMRState, grads, mask) -> tuple[GNMRState, dict[str, jax.Array]]:
        """(state for the next step, metrics) after a step run under ``mask``
        with student gradients ``grads``: per unit ``gnmr/unit``,
        ``delta_gnmr/unit``, ``promoted/unit`` (the mask in force) and
        ``low_precision_frac``, the share of GEMM units that ran the run's own recipe."""
        new, info = update(self.controller, state, unit_norms(grads))
        return new, {
            "gnmr/unit": info["gnmr"],
            "delta_gnmr/unit": info["delta_gnmr"],
            "promoted/unit": mask.reshape(-1),
            "low_precision_frac": 1.0 - jnp.mean(mask[:, 1].astype(jnp.float32)),
        }


def selector(controller: GNMR | None, depth: int) -> UnitSelector | None:
    """The selector of a run's ``Config.controller`` (``None`` without one)."""
    return None if controller is None else UnitSelector(controller, depth)
