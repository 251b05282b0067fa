"""The students by architecture: ``resmlp`` (the paper's proxy, :mod:`proxy.model`)
and ``ngpt`` (hypersphere-normalized, :mod:`proxy.ngpt`)."""

from __future__ import annotations

import flax.linen as nn

from proxy.model import Student
from proxy.ngpt import NGPTStudent, normalize_weights

__all__ = ["ARCHS", "student", "weight_projection"]

ARCHS = ("resmlp", "ngpt")


def student(arch: str = "resmlp", **kw) -> nn.Module:
    """The student module of an architecture: ``resmlp`` (:class:`~proxy.model.Student`,
    the paper's proxy) or ``ngpt`` (:class:`~proxy.ngpt.NGPTStudent`; no
    LayerNorm, so ``norm`` does not apply to it).

    Raises:
      ValueError: an unknown ``arch`` (naming the valid ones).
    """
    if arch == "resmlp":
        return Student(**kw)
    if arch == "ngpt":
        kw.pop("norm", None)
        return NGPTStudent(**kw)
    raise ValueError(f"unknown arch {arch!r}; valid: {', '.join(ARCHS)}")


def weight_projection(arch: str):
    """What the engine applies to the weights after init and after every
    optimizer step: nGPT's renormalization to the unit sphere, else nothing."""
    return normalize_weights if arch == "ngpt" else None
