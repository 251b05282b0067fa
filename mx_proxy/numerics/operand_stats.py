"""Per-tensor statistics of one MX quantization, like Transformer Engine's quantized-tensor debug statistics.

:func:`operand_stats` quantizes a tensor as :func:`~mx_proxy.numerics.quantize.quantize`
does and says what that did: how much underflowed to zero, saturated at
the format's largest value or landed on its top code, which binades the
shared scales span, and how large the error is against the unquantized
tensor. The counts come from :func:`~mx_proxy.numerics.quantize.quantize_stats`
(the same code path), so they agree with what the quantizer did.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from mx_proxy.numerics.mx.layout import Layout, normalize_axis
from mx_proxy.numerics.quantize import (
    NAN_SCALE_EXP,
    ZERO_SCALE_EXP,
    MXSpec,
    quantize,
    quantize_stats,
)

__all__ = ["OperandStats", "STATS", "operand_stats"]


class OperandStats(NamedTuple):
    """What quantizing one tensor did; each a float32 scalar.

    Attributes:
      underflow_frac: of the non-zero elements, the fraction that quantized
        to zero (0 for an all-zero tensor).
      clamp_frac: of all elements, the fraction whose scaled magnitude
        |x| / scale lies above the format's ``max_normal`` and was clipped to
        it (saturated; the LN clamp fraction ``ln_clamp_frac``, generalised).
      last_bin_frac: of all elements, the fraction that landed on the top
        code ±``max_normal`` · scale, clipped or rounded there (the paper's
        "last bin", ``ln_last_bin_frac``, generalised).
      scale_exp_min, scale_exp_max: the smallest and largest shared scale
        exponent over the blocks holding a non-zero value: e of the E8M0 scale
        2**e (the block's floor exponent for the per-element ``paper_bump``
        rule), or for E4M3 scales (NVFP4) floor(log2) of the decoded block
        scale; NaN when no block holds a non-zero finite scale.
      rel_mse: ‖q(x) − x‖² / ‖x‖², the relative mean squared error against
        the unquantized tensor (0 for an all-zero tensor, NaN where a block
        quantized to NaN).
      snr_db: the signal-to-quantization-noise ratio, −10·log10(rel_mse)
        in dB (+inf for an exact quantization).
    """

    underflow_frac: jnp.ndarray
    clamp_frac: jnp.ndarray
    last_bin_frac: jnp.ndarray
    scale_exp_min: jnp.ndarray
    scale_exp_max: jnp.ndarray
    rel_mse: jnp.ndarray
    snr_db: jnp.ndarray


STATS: tuple[str, ...] = OperandStats._fields
"""The statistics' names, in order (the ``quant/…/<stat>`` metrics columns)."""


def _live_blocks(x, spec: MXSpec, axis: int):
    """Per block (shaped like ``QuantStats.scale_exponent``): whether it holds a non-zero value."""
    lay = Layout(spec.block_dims, axis, spec.block_size)
    return lay.squeeze(jnp.max(jnp.abs(lay.view(x)), axis=lay.red, keepdims=True)) > 0


def operand_stats(x, spec: MXSpec, axis: int = -1) -> OperandStats:
    """The :class:`OperandStats` of ``quantize(x, spec, axis)`` (traceable; jit it or call it inside a jitted step).

    Args:
      x: float32 array of rank >= 1 (rank >= 2 for 2-D tiles): the tensor as
        the quantizer receives it (a GEMM operand already rounded to the
        recipe's vector precision).
      spec: its :class:`MXSpec`, any kind (1-D blocks, 2-D tiles, NVFP4). A
        stochastic spec is measured at round-to-nearest-even: the statistics
        need no key, and rounding moves at most one element per grid step.
      axis: the block axis (the GEMM's contraction axis); ignored by 2-D tiles.
    """
    if spec.rounding == "stochastic":
        spec = spec.replace(rounding="even")
    x = jnp.asarray(x, jnp.float32)
    axis = normalize_axis(axis, x.ndim)
    q = quantize(x, spec, axis)
    st = quantize_stats(x, spec, axis)
    nonzero = x != 0
    n_nonzero = jnp.sum(nonzero, dtype=jnp.float32)
    underflow = jnp.sum(nonzero & (q == 0), dtype=jnp.float32) / jnp.maximum(n_nonzero, 1.0)
    e = st.scale_exponent
    live = _live_blocks(x, spec, axis) & (e != NAN_SCALE_EXP) & (e != ZERO_SCALE_EXP)
    none_live = ~jnp.any(live)
    e_min = jnp.min(jnp.where(live, e, jnp.iinfo(jnp.int32).max)).astype(jnp.float32)
    e_max = jnp.max(jnp.where(live, e, jnp.iinfo(jnp.int32).min)).astype(jnp.float32)
    # in units of the tensor's amax, so that neither tiny gradients nor huge values under- or overflow the squares
    amax = jnp.max(jnp.abs(x))
    unit = jnp.where(amax > 0, amax, 1.0)
    signal = jnp.sum(jnp.square(x / unit))
    noise = jnp.sum(jnp.square((q - x) / unit))
    rel_mse = jnp.where(signal > 0, noise / jnp.where(signal > 0, signal, 1.0), 0.0)
    rel_mse = jnp.where(jnp.isnan(noise) | ~jnp.isfinite(signal), jnp.nan, rel_mse).astype(jnp.float32)
    return OperandStats(
        underflow_frac=underflow,
        clamp_frac=st.clamped_frac,
        last_bin_frac=st.last_bin_frac,
        scale_exp_min=jnp.where(none_live, jnp.nan, e_min),
        scale_exp_max=jnp.where(none_live, jnp.nan, e_max),
        rel_mse=rel_mse,
        snr_db=-10.0 * jnp.log10(rel_mse),
    )
