"""The training engine: a jitted step, segments of steps in one loop, divergence.

Everything static about a config (model definitions, recipe, optimizer kind,
diagnostics period) lives in a cached :class:`Program`; everything a sweep may
vary without recompiling (the ``kind=DYNAMIC`` fields: learning rate, seeds,
noise, spike factor, number of steps) is a traced
:class:`~mx_proxy.training.dynamic.Dynamic`. One segment of steps is one
compiled call, a loop over one step body whose trip count is traced
(:func:`~mx_proxy.training.segments.run_steps`): one program serves every
segment length. Every ``diagnostics_every``-th step is a diagnostic step
(reference gradient, ‖ζ‖ bound, cosine, clamp statistics, and with
``Config.quant_stats`` per-operand quantization statistics:
:mod:`mx_proxy.training.diagnostic_step`): the diagnostics sit in a
``lax.cond`` on ``t % P == 0`` whose other branch gives NaN of the same
shapes, so the plain steps skip their cost (under a sweep's ``vmap`` too: its
predicate, the step, is the same for every member, so it stays a cond). A run with a controller
has one more ``lax.cond``: the step with some unit promoted, or the plain
step (see :meth:`Program._step`).

A step that produces a non-finite loss, or a loss above ``spike_factor`` ×
the previous one, marks the run diverged at that step; from then on the
parameters are frozen (masked updates), which keeps a diverged member of a
vmapped sweep from poisoning the others.

Beyond the paper: recipes that round stochastically get a key per step,
``fold_in(fold_in(key(seed), ROUNDING_STREAM), t)`` (the model folds in the
block and layer, the layer the operand role), so a run replays exactly; the
``ngpt`` student's weights are renormalized after init and after every
optimizer step; a stability controller (``Config.controller``) keeps its
state in the :class:`TrainState` and switches the precision of each unit as
traced state inside the loop (see :mod:`mx_proxy.training.controllers`).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from mx_proxy.nn import architectures
from mx_proxy.nn.model_spec import ModelSpec, model_spec
from mx_proxy.nn.resmlp import Teacher
from mx_proxy.numerics.recipe import PRESETS, Recipe
from mx_proxy.training import controllers, data, diagnostics, optimizer
from mx_proxy.training.config import Config
from mx_proxy.training.diagnostic_step import DiagnosticStep
from mx_proxy.training.dynamic import DYNAMIC_FIELDS, HOST_FIELDS, Dynamic, dynamic_for, static_key
from mx_proxy.training.segments import nan_like, run_steps

__all__ = ["Dynamic", "TrainState", "Program", "program_for", "model_spec_of", "dynamic_for", "static_key",
           "compiler_options", "run_steps", "DYNAMIC_FIELDS", "HOST_FIELDS"]

# Folded into the seed's key to make the stochastic-rounding stream (apart from init).
ROUNDING_STREAM = 0x5EED
_VAL_STEP = 0x7FFFFFFF  # the rounding "step" of validation passes (training steps never reach it)


def compiler_options(config: Config | None = None) -> dict | None:
    """XLA options of every compiled piece of a run (and of a vmapped sweep).

    On CPU, copy insertion uses region analysis, which leaves out most of the
    copies of the training loop's carried state (parameters, optimizer
    moments) that its default analysis makes each step: the same values,
    ~3-5 % less time per step at width 512.
    XLA's YNNPACK library fusions reduce in an order that depends on
    the shape around them, so a member of a vmapped sweep would differ from
    its single run in the last bits; plain XLA loop fusions reduce each row
    in the same order whatever the leading (member) axes, which keeps sweeps
    bit-for-bit equal to individual runs. ``Config.dot="bf16"`` needs
    YNNPACK (it runs the bf16 GEMMs on the AVX512-BF16/AMX units), so such a
    run keeps XLA's YNNPACK fusions. Other backends: XLA's defaults.
    """
    if jax.default_backend() != "cpu":
        return None
    options = {"xla_cpu_copy_insertion_use_region_analysis": True}
    if config is None or config.dot != "bf16":
        options["xla_cpu_experimental_ynn_fusion_type"] = ""
    return options


class TrainState(NamedTuple):
    """Everything that evolves. ``ref_params``/``ref_opt`` hold the paired
    reference run when the config has one (``Config.has_paired_run``)."""

    params: Any
    opt_state: Any
    prev_loss: jax.Array
    diverged: jax.Array
    diverged_at: jax.Array
    ref_params: Any = None
    ref_opt: Any = None
    ctrl: Any = None


def _per_member(x, dyn: Dynamic):
    """``x`` itself, through a no-op select on a per-run value: under a
    sweep's vmap a batch shared by all members becomes a per-member copy, so
    every member's first LayerNorm (and its backward) compiles, and rounds,
    exactly as in a single run."""
    return jnp.where(dyn.lr == dyn.lr, x, jnp.nan)


def _where(cond, new, old):
    return jax.tree.map(lambda a, b: jnp.where(cond, a, b), new, old)


def model_spec_of(config: Config, recipe: Recipe, high_recipe: Recipe | None = None) -> ModelSpec:
    """The student's :class:`~mx_proxy.nn.model_spec.ModelSpec` of ``config`` (its width, depth, act, norm,
    init and init_gain resolved to objects) running ``recipe`` (``high_recipe``: a promoted unit's)."""
    return model_spec(config.width, config.depth, config.act, config.norm, config.init, config.init_gain, recipe,
                      high_recipe)


class Program:
    """The pure functions of one static configuration (:func:`static_key`;
    :func:`program_for` caches one per key), which the runner jits and compiles.

    It holds the student and reference networks (Flax modules of the recipe
    and reference recipe), the frozen teacher, the optimizer direction
    (:mod:`mx_proxy.training.optimizer`), the controller and the metrics of
    its diagnostic steps (:class:`~mx_proxy.training.diagnostic_step.DiagnosticStep`);
    its methods are :meth:`init` (state and teacher of one run), :meth:`segment`
    (``n`` steps in one loop), :meth:`val_loss`, the loss and its gradient
    (:meth:`loss`, :meth:`loss_grad`), and the step's parts that
    :mod:`mx_proxy.training.twins` reuses (:meth:`reference_step`,
    :meth:`student_step`, :meth:`finish_step`). The batches come from
    :mod:`mx_proxy.training.data`.
    """

    def __init__(self, config: Config):
        c = self.config = static_key(config)
        self.recipe = c.recipe.with_dot(c.dot)
        # a controller plugs in as a per-unit precision selector (the mask the student reads)
        self.selector = controllers.selector(c.controller, c.depth)
        high = PRESETS[self.selector.high_recipe].with_dot(c.dot) if self.selector is not None else None
        self.spec = model_spec_of(c, self.recipe, high)
        self.student = architectures.student(c.arch, self.spec)
        self.reference = architectures.student(c.arch, self.spec.replace(recipe=c.reference_recipe.with_dot(c.dot),
                                                                          high_recipe=None))
        self.normalize = architectures.weight_projection(c.arch)
        self.stochastic = c.recipe.stochastic
        tw, td, ta = c.teacher
        self.teacher = Teacher(width=c.width, hidden=tw, depth=td, act=ta)
        self.tx = optimizer.direction(c)
        self.period = c.diagnostics_every
        self.paired = c.has_paired_run
        self.ref_own_data = c.reference_data_seed is not None
        self.diagnostic_step = DiagnosticStep(self)

    # -- pieces ---------------------------------------------------------------
    def init(self, dyn: Dynamic):
        """(initial TrainState, teacher params) of one run (pure)."""
        c = self.config
        x0 = jnp.zeros((1, c.width), jnp.float32)
        params = self.reference.init(jax.random.wrap_key_data(dyn.seed), x0)["params"]
        if self.normalize is not None:
            params = self.normalize(params)
        teacher = self.teacher.init(jax.random.wrap_key_data(dyn.teacher_seed), x0)["params"]
        opt = self.tx.init(params)
        state = TrainState(params, opt, jnp.float32(jnp.inf), jnp.bool_(False), jnp.int32(-1))
        if self.paired:
            ref = self.reference.init(jax.random.wrap_key_data(dyn.reference_seed), x0)["params"]
            if self.normalize is not None:
                ref = self.normalize(ref)
            state = state._replace(ref_params=ref, ref_opt=self.tx.init(ref))
        if self.selector is not None:
            state = state._replace(ctrl=self.selector.init())
        return state, teacher

    def lr_at(self, dyn: Dynamic, t):
        """Learning rate of step t (:func:`mx_proxy.training.optimizer.learning_rate`)."""
        return optimizer.learning_rate(self.config, dyn.lr, dyn.lr_min, dyn.steps, t)

    def _batch(self, dyn, teacher, t, reference: bool = False):
        """(x, y) of step t; ``reference``: the paired run's batch (its own data key)."""
        c = self.config
        key = dyn.reference_data_seed if reference else dyn.data_seed
        x, noise = data.train_inputs(jax.random.wrap_key_data(key), t, c.batch, c.width)
        y = data.targets(lambda v: self.teacher.apply({"params": teacher}, v), x, noise, dyn.noise)
        return _per_member(x, dyn), y

    def loss(self, model, params, x, y, key=None, promote=None, perturbations=None):
        """(mean squared error of ``model`` on batch (x, y), its intermediates);
        ``perturbations``: zeros added to the GEMM outputs (:mod:`mx_proxy.training.quant_stats`)."""
        variables = {"params": params} if perturbations is None else {"params": params, "perturbations": perturbations}
        pred, inter = model.apply(variables, x, key, promote, mutable=["intermediates"])
        return jnp.mean(jnp.square(pred - y)), inter["intermediates"]

    def loss_grad(self, model, params, x, y, key=None, promote=None):
        """(loss, gradient with respect to ``params``, intermediates) of ``model`` on batch (x, y)."""
        (loss, inter), grads = jax.value_and_grad(
            lambda p: self.loss(model, p, x, y, key, promote), has_aux=True)(params)
        return loss, grads, inter

    def rounding_key(self, dyn: Dynamic, t):
        """The stochastic-rounding key of step t (``None`` for deterministic recipes)."""
        if not self.stochastic:
            return None
        base = jax.random.fold_in(jax.random.wrap_key_data(dyn.seed), ROUNDING_STREAM)
        return jax.random.fold_in(base, t)

    def _update(self, tx_state, params, grads, lr):
        return optimizer.apply(self.tx, tx_state, params, grads, lr, self.normalize)

    def _promote(self, state: TrainState):
        """The (depth, 2) promotion mask in force for this step, or ``None``."""
        return None if self.selector is None else self.selector.mask(state.ctrl)

    def _step(self, state: TrainState, t, dyn: Dynamic, teacher):
        """One training step at (traced) step ``t``; a diagnostic step when
        ``t`` is a multiple of the diagnostics period. Both kinds share one
        compiled body: the diagnostics sit in a ``lax.cond`` whose other
        branch gives NaN of the same shapes."""
        promote = self._promote(state)
        lr = self.lr_at(dyn, t)

        def body(mask):
            """Batch, paired reference, forward/backward, update, diagnostics."""
            x, y = self._batch(dyn, teacher, t)
            ref = None
            if self.paired:
                xr, yr = self._batch(dyn, teacher, t, reference=True) if self.ref_own_data else (x, y)
                ref = self.reference_step(state.ref_params, state.ref_opt, xr, yr, lr)
            return self.student_step(state, t, dyn, x, y, lr, ref, mask)

        if promote is None:
            out = body(None)
        else:
            # One cond around everything that touches the batch: with no unit
            # promoted, the plain branch is the very program of a run without a
            # controller, bit for bit (finer conds move fusion boundaries, and
            # with them the roundings).
            out = jax.lax.cond(jnp.any(promote), lambda: body(promote), lambda: body(None))
        return self.finish_step(state, t, dyn, lr, promote, out)

    def reference_step(self, ref_params, ref_opt, x, y, lr):
        """The paired reference run's step on batch (x, y): (loss, gradients,
        new parameters, new optimizer state)."""
        ref_loss, ref_grads, _ = self.loss_grad(self.reference, ref_params, x, y)
        new_params, new_opt, _ = self._update(ref_opt, ref_params, ref_grads, lr)
        return ref_loss, ref_grads, new_params, new_opt

    def student_step(self, state: TrainState, t, dyn: Dynamic, x, y, lr, ref, mask=None):
        """The student's forward/backward and update on batch (x, y), its
        paper's ζ against ``ref`` (a :meth:`reference_step` result, or
        ``None``) and, on diagnostic steps, its diagnostics; the tuple
        :meth:`finish_step` takes."""
        key = self.rounding_key(dyn, t)
        loss, grads, inter = self.loss_grad(self.student, state.params, x, y, key, mask)
        new_params, new_opt, updates = self._update(state.opt_state, state.params, grads, lr)
        ref_out = ref_grads = diag_metrics = None
        if ref is not None:
            ref_loss, ref_grads, rp, ro = ref
            # the paper's ζ every step: the paired gradient is at hand, and the paper logged it every 5 steps
            ref_out = (ref_loss, diagnostics.global_norm(ref_grads), diagnostics.paper_zeta(grads, ref_grads), rp, ro)
        if self.period:
            def measure():
                return self.diagnostic_step(state.params, grads, ref_grads, inter, x, y, key, mask)

            diag_metrics = jax.lax.cond(t % self.period == 0, measure, lambda: nan_like(jax.eval_shape(measure)))
        return loss, grads, new_params, new_opt, updates, ref_out, diag_metrics

    def finish_step(self, state: TrainState, t, dyn: Dynamic, lr, promote, out):
        """(new TrainState, metrics) from a :meth:`student_step` result:
        divergence check and masked updates, the controller, the paired run."""
        loss, grads, new_params, new_opt, updates, ref, diag_metrics = out
        bad = diagnostics.is_spike(loss, state.prev_loss, dyn.spike_factor)
        ok = ~state.diverged & ~bad
        new_state = TrainState(
            params=_where(ok, new_params, state.params),
            opt_state=_where(ok, new_opt, state.opt_state),
            prev_loss=jnp.where(ok, loss, state.prev_loss),
            diverged=state.diverged | bad,
            diverged_at=jnp.where(~state.diverged & bad, t, state.diverged_at),
        )
        metrics = {
            "loss": loss,
            "lr": lr,
            "grad_norm": diagnostics.global_norm(grads),
            "update_norm": diagnostics.global_norm(updates),
            "grad_norm/block": diagnostics.per_block(diagnostics.global_norm, grads),
        }
        if self.selector is not None:
            ctrl, selected = self.selector.update(state.ctrl, grads, promote)
            new_state = new_state._replace(ctrl=_where(ok, ctrl, state.ctrl))
            metrics.update(selected)
        if ref is not None:
            ref_loss, ref_norm, (zeta_paper, cosine_paper), rp, ro = ref
            ref_ok = jnp.isfinite(ref_loss)
            new_state = new_state._replace(ref_params=_where(ref_ok, rp, state.ref_params),
                                           ref_opt=_where(ref_ok, ro, state.ref_opt))
            metrics["ref_loss"] = ref_loss
            metrics["ref_grad_norm"] = ref_norm
            metrics["zeta_paper"] = zeta_paper
            metrics["cosine_paper"] = cosine_paper
        if self.period:
            metrics.update(diag_metrics)
        return new_state, metrics

    def segment(self, state, dyn, teacher, start, n, *, size: int):
        """Run ``n`` steps from step ``start`` (both traced int32, ``n`` ≤
        ``size``; :func:`~mx_proxy.training.segments.run_steps`). Returns the
        new state and the metrics stacked over ``size`` rows, the first ``n``
        of them the steps'."""
        return run_steps(lambda s, t: self._step(s, t, dyn, teacher), state, start, n, size)

    def val_loss(self, params, dyn, teacher):
        """Mean loss over the config's held-out batches (pure)."""
        c = self.config
        key = jax.random.wrap_key_data(dyn.data_seed)

        def batch_loss(i, total):  # a loop, not unrolled: one copy of the forward pass to compile
            x, noise = data.val_inputs(key, i, c.batch, c.width)
            y = data.targets(lambda v: self.teacher.apply({"params": teacher}, v), x, noise, dyn.noise)
            pred = self.student.apply({"params": params}, _per_member(x, dyn), self.rounding_key(dyn, _VAL_STEP))
            return total + jnp.mean(jnp.square(pred - y))

        return jax.lax.fori_loop(0, c.val_batches, batch_loss, jnp.float32(0)) / c.val_batches


@functools.lru_cache(maxsize=64)
def _program(key: Config) -> Program:
    return Program(key)


def program_for(config: Config) -> Program:
    """The (cached) Program of a config; configs that differ only in dynamic
    fields share one, and so share compiled code."""
    return _program(static_key(config))
