"""Quantization statistics of every operand of a quantized model: :func:`operand_statistics`.

The workbench's per-operand statistics (:mod:`mx_proxy.training.quant_stats`
for the proxy's student) on any model quantized by rules: for each
quantized layer and each operand its recipe quantizes, the tensor exactly as
that GEMM's quantizer receives it (rounded to the vector precision of its
pass) and its :class:`~mx_proxy.numerics.operand_stats.OperandStats`
(underflow, clamp and last-bin fractions, scale exponent range, relative
MSE, SNR). The x and W operands are recorded while the model runs; the
output gradient g (``dgrad_g``, ``wgrad_g``) is the gradient of the loss
with respect to a zero added to each layer's output, taken in a second
pass. Normalization layers add ``ln_gain``: their gain measured with the
recipe's LN-affine spec, else its weight spec (``ln_clamp_frac`` of the
proxy's diagnostics, per layer).

Layers are named by module path; a layer called more than once in one pass
gets ``#1``, ``#2`` … after its path for the later calls.
"""

from __future__ import annotations

import contextlib
import threading

import jax
import jax.numpy as jnp
import pandas as pd

from mx_proxy.nn.rounding import vround
from mx_proxy.numerics import operands
from mx_proxy.numerics.operand_stats import STATS, OperandStats, operand_stats
from mx_proxy.numerics.recipe import Recipe

__all__ = ["operand_statistics", "table", "observer", "observe_norm", "STATS"]

_local = threading.local()


class _Capture:
    def __init__(self, perturbations=None):
        self.perturbations = perturbations
        self.gemms: dict[str, tuple] = {}  # name -> (recipe, a, b)
        self.shapes: dict[str, tuple] = {}
        self.norms: dict[str, tuple] = {}  # name -> (recipe, gain)
        self.calls: dict[str, int] = {}

    def name(self, path: str) -> str:
        n = self.calls.get(path, 0)
        self.calls[path] = n + 1
        return path if n == 0 else f"{path}#{n}"


def _active() -> _Capture | None:
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


@contextlib.contextmanager
def _capturing(perturbations=None):
    if not hasattr(_local, "stack"):
        _local.stack = []
    cap = _Capture(perturbations)
    _local.stack.append(cap)
    try:
        yield cap
    finally:
        _local.stack.pop()


def observer(path: str, recipe: Recipe):
    """The ``observe(a, b, y) -> y`` hook of one layer call (:func:`~mx_proxy.interop.dot_general.mx_dot_general`),
    or ``None`` outside :func:`operand_statistics`."""
    cap = _active()
    if cap is None:
        return None
    name = cap.name(path)

    def observe(a, b, y):
        cap.gemms[name] = (recipe, a, b)
        cap.shapes[name] = y.shape
        return y if cap.perturbations is None else y + cap.perturbations[name]

    return observe


def observe_norm(path: str, recipe: Recipe, gain) -> None:
    """Record a normalization layer's gain (no-op outside :func:`operand_statistics`)."""
    cap = _active()
    if cap is not None and gain is not None:
        cap.norms[cap.name(path)] = (recipe, gain)


def _gemm_stats(recipe: Recipe, a, b, g) -> dict[str, OperandStats]:
    """Each quantized operand of one product: a (B, M, K), b (B, K, N), g (B, M, N); the 2-D tables' block axis
    of :mod:`mx_proxy.numerics.operands` is one further here (the leading B)."""
    out = {}
    for op in operands.OPERANDS:
        spec = getattr(recipe, op)
        if spec is None:
            continue
        info = operands.get(op)
        tensor = {"x": a, "w": b, "g": g}[info.tensor]
        precision = recipe.vector if info.gemm == "forward" else recipe.backward_vector
        out[op] = operand_stats(vround(tensor, precision, recipe.vector_rounding), spec, info.axis + 1)
    return out


def _gain_spec(recipe: Recipe):
    spec = recipe.ln_affine or recipe.weight_spec
    if spec is None:
        return None
    if spec.rule is not None and spec.rule.per_element:
        spec = spec.replace(scale_rule="floor")  # as the proxy's diagnostics count a per-element rule's clamping
    return spec.replace(block_dims=1)


def operand_statistics(loss_fn, *args) -> dict[str, jax.Array]:
    """The statistics of every quantized operand of one step.

    Args:
      loss_fn: ``loss_fn(*args) -> scalar`` that runs the quantized model (a
        :class:`~mx_proxy.interop.linen.QuantizedModel`'s ``apply``, or an NNX
        model quantized by :func:`~mx_proxy.interop.nnx_model.quantize_nnx`)
        once or more. Not itself jitted (it must be traced here); jit
        ``operand_statistics`` instead.
      args: its arguments (parameters, batch, ...).

    Returns:
      ``{"<layer>/<operand>/<stat>": float32 scalar}`` for each layer, each
      operand its recipe quantizes (:data:`~mx_proxy.numerics.operands.OPERANDS`,
      and ``ln_gain`` of a normalization) and each statistic of
      :data:`~mx_proxy.numerics.operand_stats.STATS`. :func:`table` makes a DataFrame of it.
    """
    with _capturing() as cap:
        jax.eval_shape(loss_fn, *args)
    zeros = {n: jnp.zeros(s, jnp.float32) for n, s in cap.shapes.items()}
    recipes = {n: r for n, (r, _, _) in cap.gemms.items()}

    def run(perturbations):
        with _capturing(perturbations) as c:
            loss = loss_fn(*args)
        return loss, ({n: (a, b) for n, (_, a, b) in c.gemms.items()}, {n: g for n, (_, g) in c.norms.items()})

    need_g = any(getattr(r, op) is not None for r in recipes.values() for op in ("dgrad_g", "wgrad_g"))
    if need_g:
        grads, (gemms, gains) = jax.grad(run, has_aux=True)(zeros)
    else:
        _, (gemms, gains) = run(zeros)
        grads = zeros
    out = {}
    for name, (a, b) in gemms.items():
        for op, st in _gemm_stats(recipes[name], a, b, grads[name]).items():
            out |= {f"{name}/{op}/{s}": v for s, v in st._asdict().items()}
    for name, (recipe, _) in cap.norms.items():
        spec = _gain_spec(recipe)
        if spec is None:
            continue
        prec = recipe.vector if recipe.ln_precision == "vector" else "fp32"  # as quantize_affine rounds it
        st = operand_stats(vround(gains[name], prec, recipe.vector_rounding), spec, -1)
        out |= {f"{name}/ln_gain/{s}": v for s, v in st._asdict().items()}
    return out


def table(stats: dict) -> pd.DataFrame:
    """:func:`operand_statistics`' result as one row per (layer, operand), one column per statistic."""
    rows: dict[tuple[str, str], dict] = {}
    for key, value in stats.items():
        layer, op, stat = key.rsplit("/", 2)
        rows.setdefault((layer, op), {"layer": layer, "operand": op})[stat] = float(value)
    return pd.DataFrame(list(rows.values()), columns=["layer", "operand", *STATS])
