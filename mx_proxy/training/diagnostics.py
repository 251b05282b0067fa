"""Gradient and quantization diagnostics (pure functions over pytrees).

The paper's multiplicative-noise model writes the low-precision gradient as
g̃ = (1 + ζ) g. Its deviation ε = g̃ − g bounds the operator norm from below:
‖ζ‖_op ≥ ‖ε‖ / ‖g‖ (``zeta_bound``); divergence follows once that bound
nears 2. The cosine between g̃ and g says how much of the descent direction
survives. Clamp fractions say how much of a tensor the MX scale saturates.

Parameters are the student's ``{"block_i": {...}}`` dicts; "per layer" means
per residual block.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mx_proxy.numerics.quantize import MXSpec, quantize, quantize_stats

__all__ = ["sq_norm", "global_norm", "gradient_error", "paper_zeta", "block_keys", "per_block", "ln_statistics",
           "weight_clamp", "activation_clamp", "weight_transpose_mismatch", "is_spike"]


def sq_norm(tree) -> jax.Array:
    """Σ x² over every leaf (float32 scalar)."""
    return sum((jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree)), jnp.float32(0))


def global_norm(tree) -> jax.Array:
    return jnp.sqrt(sq_norm(tree))


def gradient_error(g_low, g_ref) -> tuple[jax.Array, jax.Array]:
    """(‖g̃ − g‖/‖g‖, cos(g̃, g)) for two gradient pytrees of the same structure.

    Exactly (0, 1) when the trees are equal (the norm ratio's numerator is an
    exact zero and the cosine is computed as 1 − ‖ĝ̃ − ĝ‖²/2 on unit vectors,
    which rounds to exactly 1 for identical inputs).
    """
    diff = jax.tree.map(jnp.subtract, g_low, g_ref)
    n_ref = global_norm(g_ref)
    n_low = global_norm(g_low)
    zeta = global_norm(diff) / n_ref
    unit_diff = jax.tree.map(lambda a, b: a / n_low - b / n_ref, g_low, g_ref)
    cosine = 1.0 - sq_norm(unit_diff) / 2.0
    return zeta, cosine


def paper_zeta(g_low, g_ref) -> tuple[jax.Array, jax.Array]:
    """(‖g̃ − g_ref‖² / ‖g_ref‖², cos(g̃, g_ref)): the quantity the paper plots as
    its ζ (``stab/zeta_norm`` in the authors' code, squared), against the
    gradient of the separately trained reference run at the same step.

    Note what it measures: for two gradients of equal norm it is
    2·(1 − cos), so two *uncorrelated* gradients give exactly 2 whether or
    not anything was quantized; the paper's "divergence near 2" is also the
    value of two decorrelated runs (see the controls in notebook 04).
    """
    diff = jax.tree.map(jnp.subtract, g_low, g_ref)
    _, cosine = gradient_error(g_low, g_ref)
    return sq_norm(diff) / sq_norm(g_ref), cosine


def block_keys(tree) -> list[str]:
    """The ``block_i`` keys of a student's pytree, sorted by index (other top-level entries, such as the
    nGPT student's ``head``, are not blocks)."""
    return sorted((k for k in tree if k.startswith("block_")), key=lambda k: int(k.split("_")[-1]))


def per_block(fn, *trees) -> jax.Array:
    """Stack ``fn(*subtrees)`` over the student's blocks (:func:`block_keys` of the first tree)."""
    return jnp.stack([jnp.asarray(fn(*(t[k] for t in trees))) for k in block_keys(trees[0])])


def _fraction(stats_list, field):
    return sum(getattr(s, field) * n for s, n in stats_list) / max(sum(n for _, n in stats_list), 1)


def ln_statistics(params, spec: MXSpec) -> dict[str, jax.Array]:
    """Normalization gain/bias diagnostics, each a (depth,) array over blocks:
    the fraction of gains the spec clamps (and lands in the last bin) in
    blocks along the feature axis, and the mean/variance of gains and biases.

    Reads ``ln_gain``/``ln_bias`` of every ``block_i``. Empty (``{}``) when a
    block has no gain (``norm="none"`` or ``"layernorm_noaffine"``: nothing
    to clamp); without biases (``norm="rmsnorm"``) the ``ln_bias_*`` entries
    are omitted."""
    blocks = [params[k] for k in params if k.startswith("block_")]
    if not all("ln_gain" in b for b in blocks):
        return {}
    out = {
        "ln_clamp_frac": per_block(lambda b: quantize_stats(b["ln_gain"], spec).clamped_frac, params),
        "ln_last_bin_frac": per_block(lambda b: quantize_stats(b["ln_gain"], spec).last_bin_frac, params),
        "ln_gain_mean": per_block(lambda b: jnp.mean(b["ln_gain"]), params),
        "ln_gain_var": per_block(lambda b: jnp.var(b["ln_gain"]), params),
    }
    if all("ln_bias" in b for b in blocks):
        out["ln_bias_mean"] = per_block(lambda b: jnp.mean(b["ln_bias"]), params)
        out["ln_bias_var"] = per_block(lambda b: jnp.var(b["ln_bias"]), params)
    return out


def weight_clamp(params, spec: MXSpec) -> jax.Array:
    """Per block: fraction of fc1/fc2 weights clamped by ``spec`` along in-features."""

    def block(b):
        s1, s2 = quantize_stats(b["fc1"], spec, axis=0), quantize_stats(b["fc2"], spec, axis=0)
        return _fraction([(s1, b["fc1"].size), (s2, b["fc2"].size)], "clamped_frac")

    return per_block(block, params)


def activation_clamp(intermediates, spec: MXSpec) -> jax.Array:
    """Per block: fraction of the GEMM inputs (LN output into fc1, activation
    output into fc2) clamped by ``spec`` along features."""

    def block(b):
        a1, a2 = b["fc1_in"][0], b["fc2_in"][0]
        s1, s2 = quantize_stats(a1, spec), quantize_stats(a2, spec)
        return _fraction([(s1, a1.size), (s2, a2.size)], "clamped_frac")

    return per_block(block, intermediates)


def weight_transpose_mismatch(params, fwd_spec: MXSpec, dgrad_spec: MXSpec) -> jax.Array:
    """Per block: how far the weight the forward GEMM sees differs from the one
    the dgrad GEMM sees, ‖Q_fwd(W) − Q_dgrad(W)‖ / ‖W‖ over fc1 and fc2.

    The forward GEMM quantizes W in blocks along in-features (axis 0), dgrad
    along out-features (axis 1): with 1-D blocks the two quantized weights
    differ (the transposition inconsistency of 2-D-scaling FP4 training);
    with one 2-D-tiled spec for both they are the same and this is exactly 0.
    Stochastic specs are compared at their round-to-nearest-even variant."""

    def det(spec):
        return spec.replace(rounding="even") if spec.rounding == "stochastic" else spec

    f, g = det(fwd_spec), det(dgrad_spec)

    def block(b):
        diff = sum(jnp.sum(jnp.square(quantize(b[n], f, axis=0) - quantize(b[n], g, axis=1))) for n in ("fc1", "fc2"))
        return jnp.sqrt(diff / (jnp.sum(jnp.square(b["fc1"])) + jnp.sum(jnp.square(b["fc2"]))))

    return per_block(block, params)


def is_spike(loss, prev_loss, factor) -> jax.Array:
    """Divergence test of one step: non-finite loss, or loss > factor × previous."""
    return ~jnp.isfinite(loss) | (loss > factor * prev_loss)
