"""``Config``: every knob of a proxy run, declared once.

Each field is one :func:`~mx_proxy.training.knobs.knob` line: its default,
its one-line doc, its kind (static: part of the compiled program; dynamic: a
traced value a sweep varies inside one program; host: read by the host loop
only), its valid names and whether an intervention may change it. The
engine's static key and traced values, the interventions, the CLI's options
(with their choices and help) and the docs read these declarations
(:data:`FIELD_DOCS`, :data:`CHOICES`, :func:`fields_of_kind`,
:data:`INTERVENABLE_FIELDS`); nothing else lists fields. How a field is
declared: :mod:`mx_proxy.training.knobs`; the checks of values together:
:mod:`mx_proxy.training.config_validation`; JSON and the hash (the run
store's key), and the rule that keeps old keys when a field is added:
:mod:`mx_proxy.training.config_json`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from mx_proxy.nn.activations import ACTIVATIONS
from mx_proxy.nn.architectures import ARCHS
from mx_proxy.nn.inits import INITS
from mx_proxy.nn.norms import NORMS
from mx_proxy.numerics import formats as _formats
from mx_proxy.numerics import recipe as _recipes
from mx_proxy.numerics import scale_rules as _scale_rules
from mx_proxy.numerics.recipe import Recipe
from mx_proxy.training import config_json
from mx_proxy.training.config_json import SCHEMA
from mx_proxy.training.config_validation import validate
from mx_proxy.training.controllers import GNMR
from mx_proxy.training.knobs import DYNAMIC, HOST, KINDS, STATIC, knob
from mx_proxy.training.values import check_value

__all__ = ["Config", "knob", "FIELD_DOCS", "CHOICES", "INTERVENABLE_FIELDS", "fields_of_kind", "STATIC", "DYNAMIC",
           "HOST", "KINDS", "OPTIMIZERS", "SCHEDULES", "GRADIENT_REFERENCES", "SCHEMA", "SEED_LIMIT", "MAX_STEPS",
           "BOUNDS", "check_field"]

OPTIMIZERS = ("adam", "sgd")
SCHEDULES = ("constant", "cosine")
GRADIENT_REFERENCES = ("same_point", "paired_run")
SEED_LIMIT = 2 ** 32  # seeds are JAX PRNG seeds: 0 <= seed < 2**32
MAX_STEPS = 10 ** 8  # a run's metrics table holds one row per step; step counters are int32
MAX_WIDTH = 2 ** 20  # far beyond any memory; the memory estimate refuses what does not fit
MAX_DEPTH = 256  # every block is traced and compiled: deeper programs take hours to build
MAX_BATCH = 2 ** 24
MAX_VAL_BATCHES = 10 ** 4  # every validation runs them all

_PRESET_NAMES = tuple(_recipes.PRESETS)


@dataclasses.dataclass(frozen=True)
class Config:
    """One proxy run (frozen; derive variants with :meth:`replace`).

    Model: ``width`` d, ``depth`` L residual blocks, activation ``act``
    (``mx-proxy list acts``), ``norm`` (``mx-proxy list norms``), ``init``
    (pytorch: U(±1/sqrt(fan_in)); xavier_normal with ``init_gain``). Teacher:
    ``teacher_width``/``teacher_depth``/``teacher_act`` default to the
    student's. Data: ``batch`` rows of x ~ N(0, I), targets teacher(x) +
    ``noise``·N(0, I). Optimizer: ``adam`` (``beta1``, ``beta2``,
    ``adam_eps``) or ``sgd`` (``momentum``, 0 = plain SGD); learning rate ``lr``,
    ``schedule`` constant or cosine decay to ``lr_min`` over ``steps``, after
    ``warmup_steps`` of linear warm-up. Seeds: ``seed`` (student init),
    ``data_seed`` (batches), ``teacher_seed`` (teacher weights).

    Precision: ``recipe`` (a preset name or a :class:`Recipe`). ``scale_rule``
    (``mx-proxy list scale-rules``): ``None`` keeps the recipe's own E8M0
    scale rules; a rule's name puts every E8M0 operand of the recipe (its
    overrides' and LN affine spec included) under it, as the suffix spelling
    does: ``recipe="mxfp8_e4m3", scale_rule="ceil"`` trains the recipe
    ``mxfp8_e4m3+ceil`` (its name records the rule; NVFP4's E4M3 scales keep
    theirs). A recipe whose name applies another rule (``"mxfp8_e4m3+rceil"``
    with ``scale_rule="ceil"``) is refused; the same one is fine. ``dot``:
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
    recipes. ``quant_stats=True`` adds, on those steps, the quantization
    statistics of every GEMM operand the recipe quantizes (underflow,
    saturation, last bin, scale exponent range, relative MSE and SNR:
    :mod:`mx_proxy.training.quant_stats`).

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

    width: int = knob(128, "student width d (hidden size of every residual block)", bounds=(1, MAX_WIDTH))
    depth: int = knob(4, "number L of residual blocks of the student", bounds=(1, MAX_DEPTH))
    act: str = knob("gelu", "activation of the student's MLP blocks", choices=ACTIVATIONS)
    norm: str = knob("layernorm", "normalization before each block (layernorm_noaffine: LayerNorm without gain and "
                     "bias)", choices=NORMS)
    init: str = knob("pytorch", "weight init: pytorch (U(+-1/sqrt(fan_in))) or xavier_normal (scaled by init_gain)",
                     choices=INITS)
    init_gain: float = knob(0.5, "gain of the xavier_normal init")
    teacher_width: int | None = knob(None, "teacher width (none: the student's)", bounds=(1, MAX_WIDTH))
    teacher_depth: int | None = knob(None, "teacher depth (none: the student's)", bounds=(1, MAX_DEPTH))
    teacher_act: str | None = knob(None, "teacher activation (none: the student's)", choices=ACTIVATIONS)
    batch: int = knob(512, "rows per training batch (x ~ N(0, I), targets teacher(x) + noise)", bounds=(1, MAX_BATCH))
    noise: float = knob(0.005, "standard deviation of the Gaussian noise added to the teacher's targets",
                        kind=DYNAMIC)
    optimizer: str = knob("adam", "optimizer (adam: beta1, beta2, adam_eps; sgd: momentum)", choices=OPTIMIZERS,
                          intervene=True)
    lr: float = knob(6e-4, "learning rate (peak of the schedule)", kind=DYNAMIC, intervene=True)
    momentum: float = knob(0.0, "SGD momentum (0: plain SGD)", intervene=True)
    beta1: float = knob(0.9, "Adam beta1", intervene=True)
    beta2: float = knob(0.999, "Adam beta2", intervene=True)
    adam_eps: float = knob(1e-8, "Adam epsilon", intervene=True)
    schedule: str = knob("constant", "learning-rate schedule: constant, or cosine decay to lr_min over the run",
                         choices=SCHEDULES, intervene=True)
    lr_min: float = knob(0.0, "final learning rate of the cosine schedule", kind=DYNAMIC, intervene=True)
    warmup_steps: int = knob(0, "steps of linear learning-rate warm-up", intervene=True, bounds=(0, MAX_STEPS))
    steps: int = knob(1000, "training steps", kind=DYNAMIC, intervene=True, bounds=(1, MAX_STEPS))
    seed: int = knob(0, "seed of the student's initial weights", kind=DYNAMIC, bounds=(0, SEED_LIMIT - 1), seed=True)
    data_seed: int = knob(0, "seed of the batches (batch t is a pure function of data_seed and t)", kind=DYNAMIC,
                          bounds=(0, SEED_LIMIT - 1), seed=True)
    teacher_seed: int = knob(0, "seed of the frozen teacher's weights", kind=DYNAMIC, bounds=(0, SEED_LIMIT - 1),
                             seed=True)
    recipe: str | Recipe = knob("fp32", "precision recipe: which tensors are MX-quantized and how (docs/recipes.md); "
                                      "PRESET+CHANGE applies a mitigation or a scale rule to a preset (e.g. "
                                      "mxfp8_e4m3+ceil; mx-proxy list scale-rules)",
                                choices=_PRESET_NAMES, intervene=True)
    dot: str = knob("f32", "CPU GEMMs of bf16-valued operands: f32 (float32 dots, reproducible) or bf16 "
                    "(AVX512-BF16/AMX dots)", choices=_recipes.DOTS)
    arch: str = knob("resmlp", "student architecture: resmlp (the paper's) or ngpt (hypersphere-normalized)",
                     choices=ARCHS)
    controller: GNMR | str | None = knob(None, "stability controller: none, gnmr, or gnmr:key=value,... "
                                               "(e.g. gnmr:threshold=3,lock_steps=50)")
    diagnostics_every: int = knob(10, "record the reference gradient, zeta bound, cosine and clamp statistics every "
                                      "N steps (0: never)", intervene=True, bounds=(0, MAX_STEPS))
    gradient_reference: str = knob("same_point", "reference gradient of the diagnostics: 'same_point' (same weights "
                                                 "and batch) or 'paired_run' (the paired run's gradient, the paper's "
                                                 "definition)", choices=GRADIENT_REFERENCES, intervene=True)
    paired_run: bool = knob(False, "train the reference_recipe run alongside on the same batches (records ref_loss, "
                                   "zeta_paper)", intervene=True)
    reference_recipe: str | Recipe = knob("fp32", "recipe of the reference gradient and of the paired run",
                                          choices=_PRESET_NAMES)
    reference_seed: int | None = knob(None, "start the paired run from this init seed instead (a control; needs "
                                            "paired_run)", kind=DYNAMIC, bounds=(0, SEED_LIMIT - 1),
                                      seed=True, none_means="seed")
    reference_data_seed: int | None = knob(None, "feed the paired run this data seed's batches instead (a control; "
                                                 "needs paired_run)", kind=DYNAMIC, bounds=(0, SEED_LIMIT - 1),
                                           seed=True, none_means="data_seed")
    diagnostic_format: str = knob("fp8_e4m3", "MX element format that counts LN-gain clamping where the recipe does "
                                              "not quantize them", choices=_formats.MX_ELEMENTS, intervene=True)
    val_every: int = knob(100, "held-out validation loss every N steps (a multiple of diagnostics_every; 0: never)",
                          intervene=True, bounds=(0, MAX_STEPS))
    val_batches: int = knob(4, "held-out batches of the validation loss", bounds=(1, MAX_VAL_BATCHES))
    spike_factor: float = knob(100.0, "a loss above this many times the previous step's is a divergence (the run "
                                      "stops)", kind=DYNAMIC, intervene=True)
    checkpoint_every: int = knob(0, "save the full train state every N steps (0: never; needed for interventions)",
                                 kind=HOST, intervene=True, bounds=(0, MAX_STEPS))
    checkpoint_at: tuple[int, ...] = knob((), "save the full train state at these steps (multiples of "
                                              "diagnostics_every)", kind=HOST, intervene=True)
    # fields added after schema 2: keyed_when_set=True (config_json.SCHEMA)
    quant_stats: bool = knob(False, "at every diagnostics step also record quantization statistics of each "
                                    "quantized GEMM operand (quant/<layer>/<operand>/<stat> columns)",
                             intervene=True, keyed_when_set=True)
    scale_rule: str | None = knob(None, "E8M0 scale rule of every MX operand of the recipe (none: the recipe's own; "
                                        "--recipe R --scale-rule X trains R+X; mx-proxy list scale-rules)",
                                  choices=_scale_rules.RULES, keyed_when_set=True)

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
            validate(self)
        except TypeError as e:  # a value of a type no check above foresaw: still the caller's input
            raise ValueError(f"invalid config value ({e})") from None

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
        """Steps per host-loop segment, at most: the rows of the run's one
        compiled segment program, which runs any number of steps up to it
        (never more than the run's steps: its metric buffers hold that many rows)."""
        if self.val_every:
            return min(self.val_every, self.steps)
        return min(max(self.diagnostics_every, 1) * max(1, 100 // max(self.diagnostics_every, 1)), self.steps)

    def checkpoint_steps(self) -> tuple[int, ...]:
        """Every step (1 … ``steps``) at which the run saves its train state."""
        every = range(self.checkpoint_every, self.steps + 1, self.checkpoint_every) if self.checkpoint_every else ()
        return tuple(sorted(set(every) | {t for t in self.checkpoint_at if t <= self.steps}))

    def replace(self, **changes) -> Config:
        """A validated variant; unknown knobs raise a ValueError naming the valid ones."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown config field(s) {sorted(unknown)}; valid: {', '.join(self.field_names())}")
        return dataclasses.replace(self, **changes)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    # -- serialization (mx_proxy.training.config_json) -----------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict of the fields plus the ``schema`` version (:func:`~mx_proxy.training.config_json.to_dict`)."""
        return config_json.to_dict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Config:
        """Inverse of :meth:`to_dict`; fields missing from an older dict take their defaults."""
        return config_json.from_dict(cls, d)

    def to_json(self) -> str:
        return config_json.to_json(self)

    def hash(self) -> str:
        """A stable 16-hex-digit key of the full config (and the schema version): the run store's key."""
        return config_json.config_hash(self)


def _check_types(config: Config) -> None:
    """Refuse a value of the wrong type or range with an error naming its
    field, and normalize the numbers so that equal configs have one hash
    (:func:`mx_proxy.training.values.check_value`)."""
    for f in dataclasses.fields(config):
        object.__setattr__(config, f.name, check_value(f, getattr(config, f.name)))


def check_field(name: str, value):
    """``value`` of Config field ``name`` checked on its own (type, range,
    empty names; :func:`mx_proxy.training.values.check_value`) and normalized:
    a caller refuses a bad value before any work, Config checks it again."""
    return check_value(Config.__dataclass_fields__[name], value)


FIELD_DOCS: dict[str, str] = {f.name: f.metadata["doc"] for f in dataclasses.fields(Config)}
"""One line per field: what it sets (the CLI's ``--help``, Config's docstring)."""

BOUNDS: dict[str, tuple[int, int]] = {f.name: f.metadata["bounds"] for f in dataclasses.fields(Config)
                                      if f.metadata["bounds"]}
"""The valid range of every integer field."""

CHOICES: dict[str, tuple[str, ...]] = {f.name: f.metadata["choices"] for f in dataclasses.fields(Config)
                                       if f.metadata["choices"]}
"""The valid names of every field that takes one of a list."""

INTERVENABLE_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Config) if f.metadata["intervene"])
"""The fields :func:`mx_proxy.intervene` may change; the model, data and seeds
stay the parent's so that the continued run sees the same weights' shapes and batches."""


def fields_of_kind(kind: str) -> tuple[str, ...]:
    """The names of the fields of one kind (:data:`STATIC`, :data:`DYNAMIC`, :data:`HOST`), in declaration order."""
    if kind not in KINDS:
        raise ValueError(f"unknown field kind {kind!r}; valid: {', '.join(KINDS)}")
    return tuple(f.name for f in dataclasses.fields(Config) if f.metadata["kind"] == kind)


Config.__doc__ = ((Config.__doc__ or "").rstrip()
                  + "\n\n    Fields (``FIELD_DOCS``; the CLI's ``--help`` prints the same lines):\n"
                  + "\n".join(f"      {name}: {doc}" for name, doc in FIELD_DOCS.items()) + "\n")
