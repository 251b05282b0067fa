"""An ensemble's spec: what it trains, which arms, which perturbation, and where its members go.

:class:`Ensemble` (frozen, saved as ``OUT/results/ensemble.json``) and the
names derived from it: each arm's recipe, each member's config, store key
and export label. :mod:`mx_proxy.experiments.ensemble` trains it; see that
module for the experiment itself.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from mx_proxy.numerics import recipe as _recipes
from mx_proxy.numerics.recipe_type import Recipe
from mx_proxy.store import durable, files
from mx_proxy.store import run_store as _store
from mx_proxy.training.config import BOUNDS, INTERVENABLE_FIELDS, SEED_LIMIT, Config
from mx_proxy.training.paths import checked_path, env_path
from mx_proxy.training.result import Run

__all__ = ["Ensemble", "KINDS", "CONTROL", "TWIN", "HISTORY", "SPEC_FILE", "HISTORY_FILE", "arm_names",
           "member_label", "member_key", "results_folder", "read_history", "read_spec", "write_spec", "extends",
           "arm_changes", "default_out", "positive_int", "load_member", "ensemble_folder", "ENSEMBLES_ENV"]

KINDS = ("seed", "data", "branch")
CONTROL = "unchanged"
TWIN = "twin"
HISTORY = 100  # rows of the parent's history a branch member's export keeps: the blow-up rule's window
SPEC_FILE = "ensemble.json"
HISTORY_FILE = "branch_history.parquet"  # the branch state's loss and per-block gradient norms, steps 0 … branch_at−1


def arm_names() -> tuple[str, ...]:
    """Every valid arm name: ``unchanged``, ``twin``, the mitigations, then the recipe presets."""
    return (CONTROL, TWIN, *_recipes.MITIGATIONS, *(p for p in _recipes.PRESETS if p not in _recipes.MITIGATIONS))


def arm_changes(arm: str) -> dict:
    """The Config change an arm ``FIELD=VALUE`` names (``{}`` for a named
    arm): an intervenable field (:data:`mx_proxy.training.config.INTERVENABLE_FIELDS`,
    not the recipe) set to VALUE, read as an int, else a float, else text;
    ``adam_eps=1e-15`` is the base recipe with Adam's ε at 1e-15."""
    if "=" not in arm:
        return {}
    field, text = arm.split("=", 1)
    if field not in INTERVENABLE_FIELDS or field == "recipe":
        raise ValueError(f"arm {arm!r}: {field!r} is not a field an arm may change; valid: "
                         f"{', '.join(f for f in INTERVENABLE_FIELDS if f != 'recipe')}")
    for parse in (int, float):
        try:
            return {field: parse(text)}
        except ValueError:
            continue
    return {field: text}


MAX_MEMBERS = 100_000  # members per arm, at most


def positive_int(name: str, v, minimum: int = 1, maximum: int | None = None) -> int:
    """``v`` as an int in [minimum, maximum] (no maximum: unbounded), else a ValueError naming the range."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum \
            or (maximum is not None and v > maximum):
        within = f"in [{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
        raise ValueError(f"{name} must be an integer {within}, got {v!r}")
    return int(v)


@dataclasses.dataclass(frozen=True)
class Ensemble:
    """What an ensemble trains (frozen; ``OUT/results/ensemble.json`` holds it).

    Args:
      name: a label (the results folder's name by convention).
      kind: ``seed``, ``data`` or ``branch`` (see :mod:`mx_proxy.experiments.ensemble`).
      base: the configuration every member shares (for ``branch``: the
        branched run's, from its state).
      arms: arm names (:func:`arm_names`, or ``FIELD=VALUE``: :func:`arm_changes`),
        the first is the control the paired tests compare with.
      members: N, members per arm.
      horizon: steps each member trains: after ``branch_at`` for a branch
        ensemble, from step 0 otherwise.
      branch_at: the step of the branch state (``branch`` only).
      epsilon: ε ≥ 0, the relative parameter perturbation of branch members.
      first_seed: s_0; member i's perturbation seed is ``first_seed + i``.
      diagnostics_every: every how many steps the diagnostics are recorded
        (None: the base config's), a divisor of ``branch_at`` and of
        ``checkpoint_every``.
      checkpoint_every: steps between the members' checkpoints (resume).
    """

    name: str
    kind: str
    base: Config
    arms: tuple[str, ...]
    members: int
    horizon: int
    branch_at: int | None = None
    epsilon: float = 0.0
    first_seed: int = 1
    diagnostics_every: int | None = None
    checkpoint_every: int = 100

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.strip() or "/" in self.name:
            raise ValueError(f"name must be a non-empty label without '/', got {self.name!r}")
        if self.kind not in KINDS:
            raise ValueError(f"unknown ensemble kind {self.kind!r}; valid: {', '.join(KINDS)}")
        if not isinstance(self.base, Config):
            raise TypeError(f"base must be a mxp.Config, got {type(self.base).__name__}")
        arms = (self.arms,) if isinstance(self.arms, str) else tuple(self.arms)
        object.__setattr__(self, "arms", arms)
        if not arms or len(set(arms)) != len(arms):
            raise ValueError(f"arms must be distinct names, at least one, got {list(arms)}")
        valid = arm_names()
        for a in arms:
            if a not in valid and "=" not in a:
                raise ValueError(f"unknown arm {a!r}; valid: {', '.join(valid)}, or FIELD=VALUE "
                                 f"(e.g. 'adam_eps=1e-15')")
        positive_int("members", self.members, 1, MAX_MEMBERS)
        positive_int("horizon", self.horizon, 1, BOUNDS["steps"][1])
        positive_int("checkpoint_every", self.checkpoint_every, 1, BOUNDS["checkpoint_every"][1])
        if self.diagnostics_every is not None:
            positive_int("diagnostics_every", self.diagnostics_every, *BOUNDS["diagnostics_every"])
        if not isinstance(self.epsilon, (int, float)) or isinstance(self.epsilon, bool) \
                or not math.isfinite(self.epsilon) or self.epsilon < 0:
            raise ValueError(f"epsilon must be a finite number >= 0, got {self.epsilon!r}")
        positive_int("first_seed", self.first_seed, 0, SEED_LIMIT - 1)
        if self.first_seed + self.members > SEED_LIMIT:
            raise ValueError(f"first_seed + members must stay below {SEED_LIMIT} (seeds are JAX PRNG seeds)")
        if self.kind == "branch":
            positive_int("branch_at", self.branch_at, 1, BOUNDS["steps"][1])
        elif self.branch_at is not None or self.epsilon:
            raise ValueError(f"branch_at and epsilon belong to a branch ensemble, not a {self.kind!r} one")
        if TWIN in arms and (self.kind != "branch" or not self.base.has_paired_run or CONTROL not in arms):
            raise ValueError("the 'twin' arm is the paired FP32 run of a branch ensemble's state, trained beside its "
                             "'unchanged' arm: it needs kind='branch', a state with a paired run and the 'unchanged' "
                             "arm")
        every = self.diagnostics
        if every:
            for what, v in (("checkpoint_every", self.checkpoint_every), ("branch_at", self.branch_at or 0)):
                if v % every:
                    raise ValueError(f"{what} ({v}) must be a multiple of diagnostics_every ({every})")
        for a in arms:  # an arm that cannot apply to the base fails now, not in a worker
            self.config(a, 0)

    # -- members ---------------------------------------------------------------
    @property
    def diagnostics(self) -> int:
        return self.base.diagnostics_every if self.diagnostics_every is None else int(self.diagnostics_every)

    @property
    def start(self) -> int:
        """The step every member starts from."""
        return self.branch_at if self.kind == "branch" else 0

    @property
    def end(self) -> int:
        """The step every member trains to (its config's ``steps``)."""
        return self.start + self.horizon

    def seeds(self) -> list[int]:
        """s_i, the perturbation seed of member i."""
        return [self.first_seed + i for i in range(self.members)]

    def trained_arms(self) -> tuple[str, ...]:
        """The arms that train as groups of their own (``twin`` trains inside ``unchanged``)."""
        return tuple(a for a in self.arms if a != TWIN)

    def recipe(self, arm: str) -> Recipe:
        """The recipe of ``arm``: the base's (``unchanged``, or an arm that changes
        another field), a mitigation of it, or a preset."""
        if arm == CONTROL or "=" in arm:
            return self.base.recipe
        if arm == TWIN:
            return self.base.reference_recipe
        if arm in _recipes.MITIGATIONS:
            return _recipes.mitigate(self.base.recipe, arm)
        return _recipes.get(arm)

    def config(self, arm: str, i: int) -> Config:
        """The config member ``i`` of ``arm`` trains."""
        s = self.seeds()[i]
        seeds = {"seed": dict(seed=s, data_seed=s), "data": dict(data_seed=s), "branch": dict(data_seed=s)}[self.kind]
        paired = self.base.has_paired_run and TWIN in self.arms and arm == CONTROL
        changes = dict(recipe=self.recipe(arm), steps=self.end, checkpoint_every=self.checkpoint_every,
                       checkpoint_at=(), diagnostics_every=self.diagnostics, paired_run=paired, **seeds)
        if not paired:
            changes["gradient_reference"] = "same_point"
        if self.base.val_every and self.diagnostics and self.base.val_every % self.diagnostics:
            changes["val_every"] = 0
        return self.base.replace(**changes, **arm_changes(arm))

    def perturbation(self, i: int) -> dict:
        return {"seed": self.seeds()[i], "epsilon": float(self.epsilon)}

    # -- JSON ------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["base"], d["arms"] = self.base.to_dict(), list(self.arms)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Ensemble:
        if not isinstance(d, dict) or not isinstance(d.get("base"), dict):
            raise ValueError(f"not an ensemble spec: {str(d)[:200]}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown ensemble field(s) {unknown}; valid: {', '.join(sorted(known))}")
        return cls(**dict(d, base=Config.from_dict(d["base"]), arms=tuple(d.get("arms", ()))))


def member_label(arm: str, i: int) -> str:
    """The folder of member ``i`` of ``arm`` under ``OUT/results``."""
    return f"{arm}-m{i:02d}"


def ensemble_folder(out) -> Path:
    """An ensemble's folder ``OUT`` as given (a flag, an argument), resolved once: absolute, ``~`` expanded, or
    a ValueError quoting it (:func:`mx_proxy.training.paths.checked_path`: an unknown ``~user``, a
    symbolic-link loop, a file). Training, ``--status`` and the report resolve it alike."""
    return checked_path(out, "ensemble folder", folder=True)


def results_folder(folder) -> Path | None:
    """The folder that holds the spec of the ensemble at ``folder``: ``folder`` itself (its results folder)
    or ``folder/results`` (its ``OUT``); ``None`` where neither does."""
    folder = Path(folder)
    return next((f for f in (folder, folder / "results") if (f / SPEC_FILE).exists()), None)


def read_history(folder) -> pd.DataFrame | None:
    """A branch ensemble's :data:`HISTORY_FILE` in ``folder`` (its ``OUT`` or results folder): the branch
    state's ``step``, ``loss`` (and gradient norms per block), validated; ``None`` where there is none."""
    results = results_folder(folder)
    p = None if results is None else results / HISTORY_FILE
    if p is None or not p.exists():
        return None
    try:
        h = files.read_table(p)
    except files.EntryError as e:
        raise ValueError(f"{p} is not a readable parquet file: {e}") from None
    steps = h["step"].to_numpy() if "step" in h else None
    if "loss" not in h or steps is None or (len(steps) > 1 and not (np.diff(steps) > 0).all()):
        raise ValueError(f"{p} is not a branch history: it needs a 'step' column, increasing, and a 'loss' column; "
                         f"it has {list(h.columns)}")
    return h


def read_spec(folder) -> Ensemble:
    """The spec saved in ``folder`` (an ensemble's ``OUT``, or its results folder), validated."""
    results = results_folder(folder)
    if results is None:
        raise ValueError(f"no {SPEC_FILE} in {folder} or {Path(folder) / 'results'}: not an ensemble folder")
    p = results / SPEC_FILE
    try:
        return Ensemble.from_dict(json.loads(p.read_text()))
    except (ValueError, TypeError) as e:
        raise ValueError(f"{p} is not a valid ensemble spec: {e}") from None


def write_spec(spec: Ensemble, results: Path) -> None:
    results.mkdir(parents=True, exist_ok=True)
    path = results / SPEC_FILE
    text = json.dumps(spec.to_dict(), indent=1, sort_keys=True)
    if path.exists():
        old = read_spec(results)
        if old == spec:
            return
        if not extends(spec, old):
            diff = sorted(k for k, v in spec.to_dict().items() if old.to_dict().get(k) != v)
            raise ValueError(f"{path} holds another ensemble (differs in {', '.join(diff)}); use another --out, "
                             f"the same settings to resume it, or more arms / members to extend it")
    durable.atomic_write(path, lambda p: Path(p).write_text(text))


def extends(new: Ensemble, old: Ensemble) -> bool:
    """Whether ``new`` is ``old`` with arms appended and/or more members: every
    member ``old`` trained keeps its config and key (the ``twin`` arm cannot
    come or go: it decides how ``unchanged`` trains)."""
    same = dataclasses.replace(new, arms=old.arms, members=old.members) == old
    return (same and new.arms[:len(old.arms)] == old.arms and new.members >= old.members
            and (TWIN in new.arms) == (TWIN in old.arms))


def member_key(spec: Ensemble, arm: str, i: int, parent: str | None) -> str:
    """The run-store key of member ``i`` of ``arm`` (``parent``: the branch state's key)."""
    cfg = spec.config(arm, i)
    if spec.kind != "branch":
        return cfg.hash()
    return _store.entry_key(cfg, parent, spec.branch_at, spec.perturbation(i))

ENSEMBLES_ENV = "PROXY_ENSEMBLES"


def default_out(name: str) -> Path:
    """Where ``mxp.ensemble`` keeps an ensemble by default: ``$PROXY_ENSEMBLES/<name>``, else
    ``~/.cache/proxy/ensembles/<name>``; a ``$PROXY_ENSEMBLES`` that is no folder path (a file, an unknown
    ``~user``, a symbolic-link loop) is a ValueError naming it (:func:`mx_proxy.training.paths.env_path`)."""
    root = env_path(ENSEMBLES_ENV, "where ensembles are kept")
    return (root if root is not None else checked_path("~/.cache/proxy/ensembles", "the ensembles' folder")) / name


def load_member(spec: Ensemble, folder) -> Run:
    """One exported member (``<arm>-m<i>/``), its files verified
    (:mod:`mx_proxy.store.files`): ``run.json`` against the results schema,
    its config, and its metrics: a float32 ``loss`` column and one row per
    step from the first the export keeps (``branch_at − 100`` of a branch
    member, else 0) for ``steps_run`` rows. A damaged file is a ValueError naming it."""
    folder = Path(folder)
    meta = files.read_json(folder / "run.json", files.RESULT_META)
    cfg = files.read_config(folder / "config.json")
    path = folder / "metrics.parquet"
    metrics = files.read_table(path)
    first = max(0, spec.start - HISTORY) if spec.kind == "branch" else 0
    steps = metrics["step"].to_numpy() if "step" in metrics else None
    if steps is None or "loss" not in metrics or metrics["loss"].dtype != np.float32:
        raise files.EntryError(f"{path} is damaged: it needs an int step and a float32 loss column")
    if len(metrics) != meta["steps_run"] or not np.array_equal(steps, np.arange(first, first + len(metrics))):
        raise files.EntryError(f"{path} is incomplete: {len(metrics)} rows, not one per step from {first} for "
                               f"{meta['steps_run']} steps")
    return Run(cfg, metrics, meta["diverged_at"], None, meta.get("wall_time_s") or 0.0, dict(meta), str(folder))
