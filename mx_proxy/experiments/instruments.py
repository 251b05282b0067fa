"""The workbench's instruments on a user's own model: quantization statistics, gradient bias, the blow-up rule.

What the proxy measures on its student, for any model quantized by rules
(:func:`mx_proxy.interop.linen.quantize`, :func:`mx_proxy.interop.nnx_model.quantize_nnx`)
and any loss history:

* :func:`quant_table`: every quantized operand's statistics at one step
  (:func:`mx_proxy.interop.capture.operand_statistics`: the clamp, flush
  (``underflow_frac``) and last-bin fractions, scale exponent range, relative
  MSE, SNR), one row per (layer, operand); :func:`quant_summary` the worst of
  each over the model;
* :func:`gradient_bias`: the low-precision gradient against the same model's
  FP32 gradient at the same parameters and batch, as the proxy's diagnostic
  step does (:mod:`mx_proxy.training.diagnostics`): ζ = ‖g_MX − g_FP32‖ /
  ‖g_FP32‖ (``zeta_bound``), the absolute ‖g_MX − g_FP32‖, the paper's squared
  ζ and the cosine;
* :func:`blowup_at`: the ensembles' blow-up rule
  (:mod:`mx_proxy.experiments.ensemble_result`: a loss above
  :data:`~mx_proxy.experiments.ensemble_result.RULE` × its minimum over the
  previous W steps, W = 100 or a tenth of a short history, the first W
  skipped; a non-finite loss; a step ``spike_factor`` × the previous) on a
  bare loss series, and :func:`blowup_rates` the rate of it over an ensemble
  of histories per arm, with its Clopper–Pearson interval.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from mx_proxy.experiments import analysis, stats
from mx_proxy.experiments.ensemble_result import RULE
from mx_proxy.interop import capture
from mx_proxy.training import diagnostics
from mx_proxy.training.config import Config

__all__ = ["quant_table", "quant_summary", "GradientBias", "gradient_bias", "compare_gradients", "blowup_at",
           "blowup_rates", "SPIKE_FACTOR", "SUMMARY_STATS"]

SPIKE_FACTOR = Config.spike_factor
"""The engine's one-step divergence factor (a loss above this × the previous step's), the proxy's default."""
SUMMARY_STATS = ("clamp_frac", "underflow_frac", "last_bin_frac")
"""The statistics :func:`quant_summary` reports: the clamp, flush-to-zero and last-bin fractions."""


def quant_table(loss_fn: Callable, *args) -> pd.DataFrame:
    """One row per (layer, operand) the rules quantize, one column per statistic, of one step.

    ``loss_fn(*args) -> scalar`` runs the quantized model (e.g. ``lambda p, x, y: loss(q.apply(p, x), y)``);
    it is traced and run once under ``jax.jit``. An operand's gradient statistics (``dgrad_g``, ``wgrad_g``)
    are those of the cotangent its layer's backward receives from this loss.
    """
    values = jax.jit(lambda *a: capture.operand_statistics(loss_fn, *a))(*args)
    return capture.table(values)


def quant_summary(table: pd.DataFrame) -> dict[str, float]:
    """The largest of each of :data:`SUMMARY_STATS` over the rows of a :func:`quant_table` (NaN for no rows),
    keyed ``max_<stat>``."""
    return {f"max_{s}": float(table[s].max()) if len(table) else float("nan") for s in SUMMARY_STATS}


class GradientBias(NamedTuple):
    """The low-precision gradient g̃ against the FP32 one g at the same point; each a float32 scalar.

    Attributes:
      zeta: ‖g̃ − g‖ / ‖g‖ (the proxy's ``zeta_bound``, a lower bound on the operator norm of the paper's ζ).
      error_norm: ‖g̃ − g‖ (global 2-norm over every parameter).
      zeta_paper: ‖g̃ − g‖² / ‖g‖² (the paper's plotted ζ).
      cosine: cos(g̃, g).
      grad_norm, ref_norm: ‖g̃‖, ‖g‖.
      loss, ref_loss: the two losses at the point.
    """

    zeta: jax.Array
    error_norm: jax.Array
    zeta_paper: jax.Array
    cosine: jax.Array
    grad_norm: jax.Array
    ref_norm: jax.Array
    loss: jax.Array
    ref_loss: jax.Array


def gradient_bias(loss_fn: Callable, ref_loss_fn: Callable, params, *args) -> GradientBias:
    """:class:`GradientBias` of ``loss_fn`` (the quantized model's loss) against ``ref_loss_fn`` (the same model
    in FP32: the unquantized ``model.apply``), both ``f(params, *args) -> scalar``, differentiated with respect
    to ``params`` at the same parameters and batch ``args``. Jit it for repeated use.

    Raises:
      ValueError: the two gradients' pytrees differ (not the same model's parameters).
    """
    loss, g = jax.value_and_grad(loss_fn)(params, *args)
    ref_loss, g_ref = jax.value_and_grad(ref_loss_fn)(params, *args)
    return compare_gradients(g, g_ref, loss, ref_loss)


def compare_gradients(g, g_ref, loss=float("nan"), ref_loss=float("nan")) -> GradientBias:
    """:class:`GradientBias` of two gradient pytrees already computed (e.g. inside a training step that uses
    ``g``), ``loss`` and ``ref_loss`` the losses they are gradients of.

    Raises:
      ValueError: the pytrees differ in structure.
    """
    if jax.tree.structure(g) != jax.tree.structure(g_ref):
        raise ValueError(f"gradient_bias: the two gradients have different structures ({jax.tree.structure(g)} "
                         f"vs {jax.tree.structure(g_ref)}); both must be of the same model's parameters")
    zeta, cosine = diagnostics.gradient_error(g, g_ref)
    zeta_paper, _ = diagnostics.paper_zeta(g, g_ref)
    error = diagnostics.global_norm(jax.tree.map(lambda a, b: a - b, g, g_ref))
    return GradientBias(zeta, error, zeta_paper, cosine, diagnostics.global_norm(g), diagnostics.global_norm(g_ref),
                        jnp.float32(loss), jnp.float32(ref_loss))


def _history(losses) -> np.ndarray:
    arr = np.asarray(losses, dtype=float)
    if arr.ndim != 1:
        raise ValueError(f"a loss history is one loss per step (1-D), got shape {arr.shape}")
    return arr


def blowup_at(losses: Sequence[float], *, factor: float = RULE, window: int | None = None,
              spike_factor: float | None = SPIKE_FACTOR) -> int | None:
    """The index of the first step at which the history stops being stable by the ensembles' rule (module
    docstring), or ``None``.

    Args:
      losses: one loss per step (index 0 the first step).
      factor: the rule's factor (:data:`~mx_proxy.experiments.ensemble_result.RULE`).
      window: W, the steps of the running minimum (default: 100, or a tenth of a short history, at least 10:
        :func:`~mx_proxy.experiments.analysis.window_for_steps` of its length).
      spike_factor: the engine's one-step divergence (``None``: not applied).

    Raises:
      ValueError: a history that is not 1-D, a factor or spike factor not above 1, a window below 1.
    """
    loss = _history(losses)
    if not factor > 1:
        raise ValueError(f"factor must be above 1, got {factor!r}")
    if spike_factor is not None and not spike_factor > 1:
        raise ValueError(f"spike_factor must be above 1 (or None), got {spike_factor!r}")
    window = analysis.window_for_steps(len(loss)) if window is None else window
    if not isinstance(window, (int, np.integer)) or window < 1:
        raise ValueError(f"window must be a positive number of steps, got {window!r}")
    onsets = []
    hot = np.flatnonzero(analysis.loss_jump_ratio(loss, int(window)) > factor)
    if len(hot):
        onsets.append(int(hot[0]))
    bad = np.flatnonzero(~np.isfinite(loss))
    if len(bad):
        onsets.append(int(bad[0]))
    if spike_factor is not None and len(loss) > 1:
        with np.errstate(invalid="ignore"):
            spikes = np.flatnonzero(loss[1:] > spike_factor * loss[:-1]) + 1
        if len(spikes):
            onsets.append(int(spikes[0]))
    return min(onsets) if onsets else None


def blowup_rates(histories: Mapping[str, Sequence[Sequence[float]]], confidence: float = 0.95,
                 **rule) -> pd.DataFrame:
    """One row per arm of an ensemble of loss histories ``{arm: [losses of member 0, member 1, ...]}``:
    ``members``, ``blowups`` (by :func:`blowup_at`, ``rule`` its keyword arguments), ``rate`` and its
    Clopper–Pearson interval ``low``, ``high`` (:func:`mx_proxy.experiments.stats.rate`).

    Raises:
      ValueError: an arm with no member (naming it), a bad history or rule.
    """
    rows = []
    for arm, members in histories.items():
        members = list(members)
        if not members:
            raise ValueError(f"arm {arm!r} has no member history")
        k = sum(blowup_at(m, **rule) is not None for m in members)
        r = stats.rate(k, len(members), confidence)
        rows.append({"arm": arm, "members": len(members), "blowups": k, "rate": r.p, "low": r.low,
                     "high": r.high})
    return pd.DataFrame(rows, columns=["arm", "members", "blowups", "rate", "low", "high"])
