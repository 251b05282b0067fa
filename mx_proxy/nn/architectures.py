"""The students by architecture: ``resmlp`` (the paper's proxy, :mod:`mx_proxy.nn.resmlp`)
and ``ngpt`` (hypersphere-normalized, :mod:`mx_proxy.nn.ngpt`)."""

from __future__ import annotations

import flax.linen as nn

from mx_proxy.nn.model_spec import ModelSpec
from mx_proxy.nn.ngpt import NGPTStudent, normalize_weights
from mx_proxy.nn.resmlp import Student

__all__ = ["ARCHS", "student", "weight_projection"]

ARCHS = ("resmlp", "ngpt")


def student(arch: str, spec: ModelSpec) -> nn.Module:
    """The student module of an architecture, built from ``spec`` (handed to it whole): ``resmlp``
    (:class:`~mx_proxy.nn.resmlp.Student`, the paper's proxy) or ``ngpt``
    (:class:`~mx_proxy.nn.ngpt.NGPTStudent`; no LayerNorm, so ``spec.norm`` does not apply to it).

    Raises:
      ValueError: an unknown ``arch`` (naming the valid ones).
    """
    if arch == "resmlp":
        return Student(spec)
    if arch == "ngpt":
        return NGPTStudent(spec)
    raise ValueError(f"unknown arch {arch!r}; valid: {', '.join(ARCHS)}")


def weight_projection(arch: str):
    """What the engine applies to the weights after init and after every
    optimizer step: nGPT's renormalization to the unit sphere, else nothing."""
    return normalize_weights if arch == "ngpt" else None
