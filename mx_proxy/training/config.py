"""``Config``: every knob of a proxy run, declared and defaulted in one place."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from typing import Any

import numpy as np

from mx_proxy.nn.architectures import ARCHS
from mx_proxy.nn.blocks import INITS
from mx_proxy.nn.layers import ACTIVATIONS
from mx_proxy.nn.resmlp import NORMS
from mx_proxy.numerics import recipe as _recipes
from mx_proxy.numerics import recipe_json
from mx_proxy.numerics.quantize import MXSpec
from mx_proxy.numerics.recipe import Recipe
from mx_proxy.training.controllers import GNMR

__all__ = ["Config", "FIELD_DOCS", "OPTIMIZERS", "SCHEDULES", "GRADIENT_REFERENCES", "SCHEMA", "SEED_LIMIT"]

OPTIMIZERS = ("adam", "sgd")
SCHEDULES = ("constant", "cosine")
GRADIENT_REFERENCES = ("same_point", "paired_run")
SCHEMA = 2  # part of every config's hash: bump when a field's meaning changes
SEED_LIMIT = 2 ** 32  # seeds are JAX PRNG seeds: 0 <= seed < 2**32
_SEEDS = ("seed", "data_seed", "teacher_seed", "reference_seed", "reference_data_seed")


# One line per Config field: what it sets. The CLI's --help prints these (every field is a --flag) and
# they close Config's docstring, so the two cannot drift apart; tests/test_cli.py checks every field has one.
FIELD_DOCS: dict[str, str] = {
    "width": "student width d (hidden size of every residual block)",
    "depth": "number L of residual blocks of the student",
    "act": "activation of the student's MLP blocks",
    "norm": "normalization before each block (layernorm_noaffine: LayerNorm without gain and bias)",
    "init": "weight init: pytorch (U(+-1/sqrt(fan_in))) or xavier_normal (scaled by init_gain)",
    "init_gain": "gain of the xavier_normal init",
    "teacher_width": "teacher width (none: the student's)",
    "teacher_depth": "teacher depth (none: the student's)",
    "teacher_act": "teacher activation (none: the student's)",
    "batch": "rows per training batch (x ~ N(0, I), targets teacher(x) + noise)",
    "noise": "standard deviation of the Gaussian noise added to the teacher's targets",
    "optimizer": "optimizer (adam: beta1, beta2, adam_eps; sgd: momentum)",
    "lr": "learning rate (peak of the schedule)",
    "momentum": "SGD momentum (0: plain SGD)",
    "beta1": "Adam beta1",
    "beta2": "Adam beta2",
    "adam_eps": "Adam epsilon",
    "schedule": "learning-rate schedule: constant, or cosine decay to lr_min over the run",
    "lr_min": "final learning rate of the cosine schedule",
    "warmup_steps": "steps of linear learning-rate warm-up",
    "steps": "training steps",
    "seed": "seed of the student's initial weights",
    "data_seed": "seed of the batches (batch t is a pure function of data_seed and t)",
    "teacher_seed": "seed of the frozen teacher's weights",
    "recipe": "precision recipe: which tensors are MX-quantized and how (docs/recipes.md)",
    "dot": "CPU GEMMs of bf16-valued operands: f32 (float32 dots, reproducible) or bf16 (AVX512-BF16/AMX dots)",
    "arch": "student architecture: resmlp (the paper's) or ngpt (hypersphere-normalized)",
    "controller": "stability controller: none, gnmr, or gnmr:key=value,... (e.g. gnmr:threshold=3,lock_steps=50)",
    "diagnostics_every": "record the reference gradient, zeta bound, cosine and clamp statistics every N steps "
                         "(0: never)",
    "gradient_reference": "reference gradient of the diagnostics: 'same_point' (same weights and batch) or "
                          "'paired_run' (the paired run's gradient, the paper's definition)",
    "paired_run": "train the reference_recipe run alongside on the same batches (records ref_loss, zeta_paper)",
    "reference_recipe": "recipe of the reference gradient and of the paired run",
    "reference_seed": "start the paired run from this init seed instead (a control; needs paired_run)",
    "reference_data_seed": "feed the paired run this data seed's batches instead (a control; needs paired_run)",
    "diagnostic_format": "MX element format that counts LN-gain clamping where the recipe does not quantize them",
    "val_every": "held-out validation loss every N steps (a multiple of diagnostics_every; 0: never)",
    "val_batches": "held-out batches of the validation loss",
    "spike_factor": "a loss above this many times the previous step's is a divergence (the run stops)",
    "checkpoint_every": "save the full train state every N steps (0: never; needed for interventions)",
    "checkpoint_at": "save the full train state at these steps (multiples of diagnostics_every)",
}


@dataclasses.dataclass(frozen=True)
class Config:
    """One proxy run (frozen; derive variants with :meth:`replace`).

    Model: ``width`` d, ``depth`` L residual blocks, activation ``act``
    (gelu/relu/swiglu/tanh/linear/relu2/silu), ``norm`` (layernorm/rmsnorm/layernorm_noaffine/none), ``init``
    (pytorch: U(±1/sqrt(fan_in)); xavier_normal with ``init_gain``). Teacher:
    ``teacher_width``/``teacher_depth``/``teacher_act`` default to the
    student's. Data: ``batch`` rows of x ~ N(0, I), targets teacher(x) +
    ``noise``·N(0, I). Optimizer: ``adam`` (``beta1``, ``beta2``,
    ``adam_eps``) or ``sgd`` (``momentum``, 0 = plain SGD); learning rate ``lr``,
    ``schedule`` constant or cosine decay to ``lr_min`` over ``steps``, after
    ``warmup_steps`` of linear warm-up. Seeds: ``seed`` (student init),
    ``data_seed`` (batches), ``teacher_seed`` (teacher weights).

    Precision: ``recipe`` (a preset name or a :class:`Recipe`). ``dot``:
    how GEMMs whose operands hold only bfloat16 values (MX elements of at
    most 8 significant bits with E8M0 scales, bf16 vector values) are
    computed on the CPU: ``"f32"`` float32 dots, the reproducible reference
    path (XLA's YNNPACK fusions off, so sweeps equal single runs); ``"bf16"``
    bfloat16 × bfloat16 → float32 dots on the AVX512-BF16/AMX units (YNNPACK
    on): the same products and float32 accumulation in another summation
    order, 1.6-1.9× the float32 GEMM speed (docs/benchmarks.md). GPUs use bf16
    tensor-core dots for such GEMMs with either value.

    Beyond the paper: ``arch`` ``"resmlp"`` (the paper's student) or
    ``"ngpt"`` (hypersphere-normalized, :mod:`mx_proxy.nn.ngpt`; ``norm`` does not
    apply); ``controller``: ``None`` or a :class:`mx_proxy.training.controllers.GNMR`
    stability controller (a string such as ``"gnmr"`` or
    ``"gnmr:threshold=3,lock_steps=50"`` is parsed), which promotes units to
    its action's precision at run time.

    Recording: loss, gradient and update norms every step; every
    ``diagnostics_every`` steps (0 = never) the reference gradient, ‖ζ‖ bound,
    cosine and clamp statistics, where ``gradient_reference`` is
    ``same_point`` (the ``reference_recipe``'s gradient at the same weights and
    batch) or ``paired_run`` (gradient of the reference run trained alongside,
    the paper's definition); clamp fractions of LN gains use the recipe's
    weight spec, or ``diagnostic_format`` (MX E4M3 by default) for unquantized
    recipes.

    The paired reference run (``paired_run=True``, implied by
    ``gradient_reference="paired_run"``) trains ``reference_recipe`` (default
    fp32) alongside from the same init, batches and LR, or from
    ``reference_seed`` / on ``reference_data_seed``'s batches when set (the
    controls of the paper's metric: FP32 against FP32 with another seed). With
    it, every step records ``ref_loss``, ``ref_grad_norm`` and
    ``zeta_paper`` = ‖g̃ − g_ref‖² / ‖g_ref‖² (squared, the
    quantity the paper plots; two uncorrelated gradients of equal norm give
    exactly 2) and ``cosine_paper`` against the paired run's gradient.
    ``val_every`` steps (a multiple of ``diagnostics_every``) the loss on
    ``val_batches`` held-out batches. A run stops at the first non-finite loss
    or a loss above ``spike_factor`` × the previous step's.

    Checkpoints (host side only, they never change the compiled program):
    the full train state is saved every ``checkpoint_every`` steps (0 = never)
    and at each step of ``checkpoint_at``; a checkpoint step must be a multiple
    of ``diagnostics_every`` so that a run resumed there records diagnostics
    on the same steps. ``mxp.intervene`` continues a run from one.
    """

    width: int = 128
    depth: int = 4
    act: str = "gelu"
    norm: str = "layernorm"
    init: str = "pytorch"
    init_gain: float = 0.5
    teacher_width: int | None = None
    teacher_depth: int | None = None
    teacher_act: str | None = None
    batch: int = 512
    noise: float = 0.005
    optimizer: str = "adam"
    lr: float = 6e-4
    momentum: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    adam_eps: float = 1e-8
    schedule: str = "constant"
    lr_min: float = 0.0
    warmup_steps: int = 0
    steps: int = 1000
    seed: int = 0
    data_seed: int = 0
    teacher_seed: int = 0
    recipe: str | Recipe = "fp32"
    dot: str = "f32"
    arch: str = "resmlp"
    controller: GNMR | str | None = None
    diagnostics_every: int = 10
    gradient_reference: str = "same_point"
    paired_run: bool = False
    reference_recipe: str | Recipe = "fp32"
    reference_seed: int | None = None
    reference_data_seed: int | None = None
    diagnostic_format: str = "fp8_e4m3"
    val_every: int = 100
    val_batches: int = 4
    spike_factor: float = 100.0
    checkpoint_every: int = 0
    checkpoint_at: tuple[int, ...] = ()

    def __post_init__(self):
        for f in dataclasses.fields(self):  # numpy scalars are welcome; store them as Python numbers
            v = getattr(self, f.name)
            if isinstance(v, np.integer):
                object.__setattr__(self, f.name, int(v))
            elif isinstance(v, np.floating):
                object.__setattr__(self, f.name, float(v))
            elif isinstance(v, np.bool_):
                object.__setattr__(self, f.name, bool(v))
        _check_types(self)
        try:
            self._validate()
        except TypeError as e:  # a value of a type no check above foresaw: still the caller's input
            raise ValueError(f"invalid config value ({e})") from None

    def _validate(self):

        def positive_int(name, allow_zero=False):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0 or (v == 0 and not allow_zero):
                need = "a non-negative" if allow_zero else "a positive"
                raise ValueError(f"{name} must be {need} integer, got {v!r}")

        def choice(name, valid, optional=False):
            v = getattr(self, name)
            if optional and v is None:
                return
            if v not in valid:
                raise ValueError(f"unknown {name} {v!r}; valid: {', '.join(valid)}")

        def positive_float(name, allow_zero=False):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 \
                    or (v == 0 and not allow_zero):
                need = "a non-negative" if allow_zero else "a positive"
                raise ValueError(f"{name} must be {need} finite number, got {v!r}")

        for name in ("width", "depth", "batch", "steps", "val_batches"):
            positive_int(name)
        for name in ("diagnostics_every", "val_every", "warmup_steps", "checkpoint_every"):
            positive_int(name, allow_zero=True)
        for name in _SEEDS:
            v = getattr(self, name)
            if v is None and name.startswith("reference"):
                continue
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < SEED_LIMIT:
                raise ValueError(f"{name} must be an integer in [0, 2**32), got {v!r}")
        for name in ("teacher_width", "teacher_depth"):
            if getattr(self, name) is not None:
                positive_int(name)
        choice("act", ACTIVATIONS)
        choice("dot", _recipes.DOTS)
        choice("teacher_act", ACTIVATIONS, optional=True)
        choice("norm", NORMS)
        choice("arch", ARCHS)
        if isinstance(self.controller, str) and self.controller.strip().lower() in ("none", "off"):
            object.__setattr__(self, "controller", None)
        elif isinstance(self.controller, str):
            object.__setattr__(self, "controller", GNMR.parse(self.controller))
        elif isinstance(self.controller, dict):
            object.__setattr__(self, "controller", GNMR.from_dict(self.controller))
        elif self.controller is not None and not isinstance(self.controller, GNMR):
            raise ValueError(f"controller must be None, a GNMR or a string such as 'gnmr:threshold=3', "
                             f"got {self.controller!r}")
        choice("init", INITS)
        choice("optimizer", OPTIMIZERS)
        choice("schedule", SCHEDULES)
        choice("gradient_reference", GRADIENT_REFERENCES)
        positive_float("lr")
        positive_float("init_gain")
        positive_float("adam_eps")
        positive_float("spike_factor")
        for name in ("noise", "lr_min", "momentum"):
            positive_float(name, allow_zero=True)
        for name in ("beta1", "beta2", "momentum"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must lie in [0, 1), got {getattr(self, name)!r}")
        if self.schedule == "cosine" and self.lr_min > self.lr:
            raise ValueError(f"lr_min ({self.lr_min:g}) must not exceed lr ({self.lr:g}): the cosine schedule decays "
                             f"from lr to lr_min")
        if self.spike_factor <= 1.0:
            raise ValueError(f"spike_factor must be > 1 (a loss that many times the previous step's is a divergence), "
                             f"got {self.spike_factor!r}")
        if self.warmup_steps > self.steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must not exceed steps ({self.steps})")
        MXSpec(self.diagnostic_format)  # validates the name
        object.__setattr__(self, "recipe", _recipes.get(self.recipe))
        object.__setattr__(self, "reference_recipe", _recipes.get(self.reference_recipe))
        if self.reference_recipe.stochastic:
            raise ValueError(f"reference_recipe {self.reference_recipe.name!r} rounds stochastically; the reference "
                             f"must be deterministic (e.g. fp32 or bf16)")
        if not isinstance(self.paired_run, bool):
            raise ValueError(f"paired_run must be True or False, got {self.paired_run!r}")
        unpaired = [n for n in ("reference_seed", "reference_data_seed") if getattr(self, n) is not None]
        if unpaired and not self.has_paired_run:
            raise ValueError(f"{', '.join(unpaired)} only change the paired reference run; set paired_run=True "
                             f"(or gradient_reference='paired_run')")
        if self.diagnostics_every and self.val_every and self.val_every % self.diagnostics_every:
            raise ValueError(
                f"val_every ({self.val_every}) must be a multiple of diagnostics_every ({self.diagnostics_every})")
        at = self.checkpoint_at
        if isinstance(at, (str, bytes)) or not hasattr(at, "__iter__"):
            raise ValueError(f"checkpoint_at must be a tuple of steps, got {at!r}")
        at = tuple(sorted(set(at)))
        if any(isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t <= 0 for t in at):
            raise ValueError(f"checkpoint_at must hold positive integer steps, got {self.checkpoint_at!r}")
        object.__setattr__(self, "checkpoint_at", tuple(int(t) for t in at))
        late = [t for t in self.checkpoint_at if t > self.steps]
        if late:
            raise ValueError(f"checkpoint_at {late} past the end of the run: a checkpoint step must be <= steps "
                             f"({self.steps})")
        P = self.diagnostics_every
        for t in self.checkpoint_at + ((self.checkpoint_every,) if self.checkpoint_every else ()):
            if P and t % P:
                raise ValueError(f"checkpoint step {t} must be a multiple of diagnostics_every ({P})")
        if self.has_paired_run and not self.diagnostics_every:
            raise ValueError("a paired reference run (paired_run=True or gradient_reference='paired_run') needs "
                             "diagnostics_every > 0")

    # -- derived -------------------------------------------------------------
    @property
    def has_paired_run(self) -> bool:
        """True when a reference run trains alongside (``paired_run`` or
        ``gradient_reference == "paired_run"``)."""
        return self.paired_run or self.gradient_reference == "paired_run"

    @property
    def teacher(self) -> tuple[int, int, str]:
        """(width, depth, activation) of the teacher, defaults resolved."""
        return (self.teacher_width or self.width, self.teacher_depth or self.depth, self.teacher_act or self.act)

    @property
    def chunk(self) -> int:
        """Steps per compiled ``lax.scan`` segment (the host loop's unit)."""
        if self.val_every:
            return self.val_every
        return max(self.diagnostics_every, 1) * max(1, 100 // max(self.diagnostics_every, 1))

    def checkpoint_steps(self) -> tuple[int, ...]:
        """Every step (1 … ``steps``) at which the run saves its train state."""
        every = range(self.checkpoint_every, self.steps + 1, self.checkpoint_every) if self.checkpoint_every else ()
        return tuple(sorted(set(every) | {t for t in self.checkpoint_at if t <= self.steps}))

    def replace(self, **changes) -> "Config":
        """A validated variant; unknown knobs raise a ValueError naming the valid ones."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown config field(s) {sorted(unknown)}; valid: {', '.join(self.field_names())}")
        return dataclasses.replace(self, **changes)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    # -- serialization -------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict of every field plus the ``schema`` version; recipes
        are their preset name when unmodified presets."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["recipe"] = recipe_json.to_json(self.recipe)
        d["reference_recipe"] = recipe_json.to_json(self.reference_recipe)
        d["controller"] = None if self.controller is None else self.controller.to_dict()
        d["checkpoint_at"] = list(self.checkpoint_at)
        d["schema"] = SCHEMA
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Config":
        """Inverse of :meth:`to_dict`; fields missing from an older dict take their defaults."""
        d = dict(d)
        d.pop("schema", None)
        if "checkpoint_at" in d:
            d["checkpoint_at"] = tuple(d["checkpoint_at"])
        for name in ("recipe", "reference_recipe"):
            if name in d:
                d[name] = recipe_json.from_json(d[name])
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def hash(self) -> str:
        """A stable 16-hex-digit key of the full config (and the schema version)."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]


def _check_types(config: Config) -> None:
    """Refuse a value of the wrong type with a ValueError naming its field,
    and normalize the numbers so that equal configs have one hash: a float
    field holds a Python float (``lr=1`` is ``lr=1.0``, ``-0.0`` is 0.0)."""
    for f in dataclasses.fields(config):
        kind, v = str(f.type), getattr(config, f.name)
        if v is None and kind.endswith("| None"):
            continue
        if kind == "float":
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ValueError(f"{f.name} must be a number, got {v!r} ({type(v).__name__})")
            object.__setattr__(config, f.name, float(v) + 0.0)
        elif kind in ("str", "str | None") and not isinstance(v, str):
            raise ValueError(f"{f.name} must be a name (a string), got {v!r} ({type(v).__name__})")
        elif kind in ("int", "int | None") and (isinstance(v, bool) or not isinstance(v, int)):
            raise ValueError(f"{f.name} must be an integer, got {v!r} ({type(v).__name__})")
        elif kind == "bool" and not isinstance(v, bool):
            raise ValueError(f"{f.name} must be True or False, got {v!r} ({type(v).__name__})")


def _field_list() -> str:
    missing = sorted(set(Config.field_names()) - set(FIELD_DOCS))
    if missing:  # a new field needs its one-line doc (the CLI's help prints it)
        raise RuntimeError(f"Config fields without a line in FIELD_DOCS: {missing}")
    return "\n".join(f"      {name}: {FIELD_DOCS[name]}" for name in Config.field_names())


Config.__doc__ = (Config.__doc__ or "").rstrip() + "\n\n    Fields (``FIELD_DOCS``; the CLI's ``--help`` prints the same lines):\n" \
    + _field_list() + "\n"
