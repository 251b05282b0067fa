"""The checks a :class:`~mx_proxy.training.config.Config` makes of its values together.

Each value's own type and range are checked first, field by field
(:func:`mx_proxy.training.values.check_value`); :func:`validate` then checks
names against their choices and what fields say about each other, and
normalizes what has several spellings (a controller string, a recipe name,
checkpoint steps). A bad value is a ValueError naming the field and what is
valid, the same from the API and from every command.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from mx_proxy.numerics import recipe as _recipes
from mx_proxy.numerics.quantize import MXSpec
from mx_proxy.training.controllers import GNMR

__all__ = ["validate", "LOOKED_UP"]

LOOKED_UP = ("recipe", "reference_recipe", "diagnostic_format")
"""Fields looked up rather than matched against their choices: a Recipe object or a format alias is valid too."""


def _set(config, name, value):
    object.__setattr__(config, name, value)


def _check_choices(config) -> None:
    for f in dataclasses.fields(config):
        if not f.metadata["choices"] or f.name in LOOKED_UP:
            continue
        v = getattr(config, f.name)
        if f.default is None and v is None:
            continue
        if v not in f.metadata["choices"]:
            raise ValueError(f"unknown {f.name} {v!r}; valid: {', '.join(f.metadata['choices'])}")


def _parse_controller(config) -> None:
    """``controller`` as ``None`` or a :class:`GNMR` (parsed from a string or a dict)."""
    c = config.controller
    if isinstance(c, str) and not c.strip():
        raise ValueError("controller must be none, gnmr or gnmr:key=value,... (e.g. gnmr:threshold=3), got an "
                         "empty string")
    if isinstance(c, str) and c.strip().lower() in ("none", "off"):
        _set(config, "controller", None)
    elif isinstance(c, str):
        _set(config, "controller", GNMR.parse(c))
    elif isinstance(c, dict):
        _set(config, "controller", GNMR.from_dict(c))
    elif c is not None and not isinstance(c, GNMR):
        raise ValueError(f"controller must be None, a GNMR or a string such as 'gnmr:threshold=3', got {c!r}")


def _positive_float(config, name, allow_zero=False) -> None:
    v = getattr(config, name)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 \
            or (v == 0 and not allow_zero):
        need = "a non-negative" if allow_zero else "a positive"
        raise ValueError(f"{name} must be {need} finite number, got {v!r}")


def _check_optimizer(config) -> None:
    """The learning rate, its schedule, the optimizer's constants and the divergence factor."""
    for name in ("lr", "init_gain", "adam_eps", "spike_factor"):
        _positive_float(config, name)
    for name in ("noise", "lr_min", "momentum"):
        _positive_float(config, name, allow_zero=True)
    for name in ("beta1", "beta2", "momentum"):
        if not 0.0 <= getattr(config, name) < 1.0:
            raise ValueError(f"{name} must lie in [0, 1), got {getattr(config, name)!r}")
    if config.schedule == "cosine" and config.lr_min > config.lr:
        raise ValueError(f"lr_min ({config.lr_min:g}) must not exceed lr ({config.lr:g}): the cosine schedule decays "
                         f"from lr to lr_min")
    if config.spike_factor <= 1.0:
        raise ValueError(f"spike_factor must be > 1 (a loss that many times the previous step's is a divergence), "
                         f"got {config.spike_factor!r}")
    if config.warmup_steps > config.steps:
        raise ValueError(f"warmup_steps ({config.warmup_steps}) must not exceed steps ({config.steps})")


def _resolve_precision(config) -> None:
    """The recipes as :class:`Recipe` objects, the diagnostic format checked; the reference must be deterministic."""
    MXSpec(config.diagnostic_format)  # validates the name
    _set(config, "recipe", _with_scale_rule(_recipes.get(config.recipe), config.scale_rule))
    _set(config, "reference_recipe", _recipes.get(config.reference_recipe))
    if config.reference_recipe.stochastic:
        raise ValueError(f"reference_recipe {config.reference_recipe.name!r} rounds stochastically; the reference "
                         f"must be deterministic (e.g. fp32 or bf16)")


def _with_scale_rule(recipe, rule: str | None):
    """``recipe`` under ``Config.scale_rule`` ``rule``: unchanged for ``None`` or a recipe whose name already
    applies ``rule`` (``mxfp8_e4m3+ceil``), else the recipe ``NAME+RULE`` (:func:`~mx_proxy.numerics.recipe.mitigate`).

    Raises:
      ValueError: a recipe whose name applies another rule, or a rule not defined for one of its formats.
    """
    named = _recipes.scale_rule_of(recipe)
    if rule is None or named == rule:
        return recipe
    if named is not None:
        base = recipe.name.split("+")[0]
        raise ValueError(f"scale_rule {rule!r} disagrees with recipe {recipe.name!r}, whose name applies the scale "
                         f"rule {named!r}; give the rule once (recipe {base!r} with scale_rule {rule!r}, or the "
                         f"recipe {base + '+' + rule!r}) or make the two agree")
    try:
        return _recipes.mitigate(recipe, rule)
    except ValueError as err:
        raise ValueError(f"scale_rule {rule!r}: {err}") from None


def _check_paired(config) -> None:
    if not isinstance(config.paired_run, bool):
        raise ValueError(f"paired_run must be True or False, got {config.paired_run!r}")
    unpaired = [n for n in ("reference_seed", "reference_data_seed") if getattr(config, n) is not None]
    if unpaired and not config.has_paired_run:
        raise ValueError(f"{', '.join(unpaired)} only change the paired reference run; set paired_run=True "
                         f"(or gradient_reference='paired_run')")


def _check_steps(config) -> None:
    """Validation, checkpoint and diagnostic steps agree (checkpoint steps sorted and deduplicated)."""
    P = config.diagnostics_every
    if P and config.val_every and config.val_every % P:
        raise ValueError(f"val_every ({config.val_every}) must be a multiple of diagnostics_every ({P})")
    at = config.checkpoint_at
    if isinstance(at, (str, bytes)) or not hasattr(at, "__iter__"):
        raise ValueError(f"checkpoint_at must be a tuple of steps, got {at!r}")
    at = tuple(sorted(set(at)))
    if any(isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t <= 0 for t in at):
        raise ValueError(f"checkpoint_at must hold positive integer steps, got {config.checkpoint_at!r}")
    _set(config, "checkpoint_at", tuple(int(t) for t in at))
    late = [t for t in config.checkpoint_at if t > config.steps]
    if late:
        raise ValueError(f"checkpoint_at {late} past the end of the run: a checkpoint step must be <= steps "
                         f"({config.steps})")
    for t in config.checkpoint_at + ((config.checkpoint_every,) if config.checkpoint_every else ()):
        if P and t % P:
            raise ValueError(f"checkpoint step {t} must be a multiple of diagnostics_every ({P})")
    if config.has_paired_run and not P:
        raise ValueError("a paired reference run (paired_run=True or gradient_reference='paired_run') needs "
                         "diagnostics_every > 0")
    if config.quant_stats and not P:
        raise ValueError("quant_stats records at diagnostics steps: it needs diagnostics_every > 0")


def validate(config) -> None:
    """Check ``config`` (a Config whose values passed their own checks) and
    normalize it in place (frozen: through ``object.__setattr__``), in this
    order, so that the first error is the one a caller sees."""
    _check_choices(config)
    _parse_controller(config)
    _check_optimizer(config)
    _resolve_precision(config)
    _check_paired(config)
    _check_steps(config)
