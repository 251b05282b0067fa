"""The metrics of a diagnostic step: the reference gradient, ‖ζ‖ bounds, cosines, clamp and quantization statistics.

Every ``diagnostics_every``-th training step the engine calls a
:class:`DiagnosticStep` (inside a ``lax.cond``, so the other steps skip its
cost); the functions it combines are :mod:`mx_proxy.training.diagnostics`
(gradients, clamp fractions) and :mod:`mx_proxy.training.quant_stats` (the
per-operand quantization statistics of ``Config.quant_stats``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mx_proxy.numerics.quantize import MXSpec
from mx_proxy.training import diagnostics, quant_stats

__all__ = ["DiagnosticStep", "diagnostic_spec"]


def diagnostic_spec(spec: MXSpec, keep_tiles: bool = False) -> MXSpec:
    """The spec clamp statistics are counted with: deterministic rounding (the
    counts do not depend on it), and 1-D blocks for vectors and activations."""
    spec = spec.replace(rounding="even") if spec.rounding == "stochastic" else spec
    if spec.rule is not None and spec.rule.per_element:  # the authors count clamping with the block's floor scale
        spec = spec.replace(scale_rule="floor")
    return spec if keep_tiles else spec.replace(block_dims=1)


class DiagnosticStep:
    """The diagnostic metrics of one :class:`~mx_proxy.training.engine.Program`
    (its config, recipe, networks and loss): ``step(params, grads,
    paired_grads, inter, x, y, key, mask) -> {name: array}``."""

    def __init__(self, program):
        self.program = program
        c, rs = program.config, program.recipe
        self.same_point = c.gradient_reference == "same_point"
        # the run is its own same-point reference: reuse its gradient (ζ exactly 0, cosine exactly 1)
        self.self_reference = c.recipe == c.reference_recipe and program.selector is None
        self.ln_spec = diagnostic_spec(rs.weight_spec or MXSpec(c.diagnostic_format))
        self.act_spec = diagnostic_spec(rs.fwd_x or rs.weight_spec or MXSpec(c.diagnostic_format))
        self.weight_spec = diagnostic_spec(rs.weight_spec or MXSpec(c.diagnostic_format), keep_tiles=True)
        self.quant_columns = quant_stats.operand_columns(rs, c.depth) if c.quant_stats else ()

    def __call__(self, params, grads, paired_grads, inter, x, y, key=None, mask=None) -> dict:
        """Diagnostic-step metrics at ``params`` on batch (x, y). ``grads``,
        ``inter``: the training step's gradient and intermediates;
        ``paired_grads``: the paired run's gradient at this step (``None``
        without one); ``key``, ``mask``: the step's rounding key and promotion
        mask (read only by the quantization statistics)."""
        out = {}
        p = self.program
        if not self.same_point:
            ref_grads = paired_grads
        elif self.self_reference:
            ref_grads = grads
        else:  # same point: the reference recipe's gradient at these weights and batch
            _, ref_grads, _ = p.loss_grad(p.reference, params, x, y)
        zeta, cos = diagnostics.gradient_error(grads, ref_grads)
        per = {k: diagnostics.gradient_error(grads[k], ref_grads[k]) for k in grads}
        order = diagnostics.block_keys(grads)
        out |= {
            "zeta_bound": zeta,
            "cosine": cos,
            "zeta_bound/block": jnp.stack([per[k][0] for k in order]),
            "cosine/block": jnp.stack([per[k][1] for k in order]),
            "weight_clamp_frac/block": diagnostics.weight_clamp(params, self.weight_spec),
            "act_clamp_frac/block": diagnostics.activation_clamp(inter, self.act_spec),
        }
        r = p.recipe
        if r.fwd_w is not None and r.dgrad_w is not None:
            out["weight_fwd_dgrad_diff/block"] = diagnostics.weight_transpose_mismatch(params, r.fwd_w, r.dgrad_w)
        ln = diagnostics.ln_statistics(params, self.ln_spec)
        out.update({f"{k}/block": v for k, v in ln.items()})
        if ln:
            out["ln_clamp_frac"] = jnp.mean(ln["ln_clamp_frac"])
        out["weight_clamp_frac"] = jnp.mean(out["weight_clamp_frac/block"])
        out["act_clamp_frac"] = jnp.mean(out["act_clamp_frac/block"])
        if self.quant_columns:
            output_grads = self._output_grads(params, x, y, key, mask)
            out |= quant_stats.metrics(r, self.quant_columns, params, inter, output_grads)
        return out

    def _output_grads(self, params, x, y, key, mask):
        """The loss's gradient with respect to every GEMM output, as the training step's backward receives it
        (``None`` when no quantized operand is one)."""
        if not quant_stats.needs_output_grads(self.quant_columns):
            return None
        p = self.program

        def loss(perturbations):
            return p.loss(p.student, params, x, y, key, mask, perturbations)[0]

        return jax.grad(loss)(quant_stats.output_perturbations(params, x.shape[0]))
