"""The training engine: a jitted step, segments of steps in one loop, divergence.

Everything static about a config (model definitions, recipe, optimizer kind,
diagnostics period) lives in a cached :class:`Program`; everything a sweep may
vary without recompiling (the ``kind=DYNAMIC`` fields: learning rate, seeds,
noise, spike factor, number of steps) is a traced :class:`Dynamic`. One
segment of steps is one compiled call, a loop over one step body whose trip
count is traced (:func:`run_steps`): one program serves every segment length.
Every ``diagnostics_every``-th step is a diagnostic step (reference
gradient, ‖ζ‖ bound, cosine, clamp statistics): the diagnostics sit in a
``lax.cond`` on ``t % P == 0`` whose other branch gives NaN of the same
shapes, so the plain steps skip their cost on one device (under a sweep's
``vmap`` a cond runs both branches and selects). A run with a controller
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
import numpy as np

from mx_proxy.nn import architectures
from mx_proxy.nn.resmlp import Teacher
from mx_proxy.numerics.quantize import MXSpec
from mx_proxy.numerics.recipe import PRESETS
from mx_proxy.training import controllers, data, diagnostics, optimizer
from mx_proxy.training.config import DYNAMIC, HOST, Config, fields_of_kind

__all__ = ["Dynamic", "TrainState", "Program", "program_for", "dynamic_for", "static_key", "compiler_options",
           "run_steps"]

# Config fields a sweep varies inside one compiled program, and those only the host loop reads
# (checkpointing; they never change the compiled program): the kinds their knob() declarations give.
DYNAMIC_FIELDS = fields_of_kind(DYNAMIC)
HOST_FIELDS = fields_of_kind(HOST)
# Folded into the seed's key to make the stochastic-rounding stream (apart from init).
ROUNDING_STREAM = 0x5EED
_VAL_STEP = 0x7FFFFFFF  # the rounding "step" of validation passes (training steps never reach it)


def compiler_options(config: Config | None = None) -> dict | None:
    """XLA options of every compiled piece of a run (and of a vmapped sweep).

    On CPU, XLA's YNNPACK library fusions reduce in an order that depends on
    the shape around them, so a member of a vmapped sweep would differ from
    its single run in the last bits; plain XLA loop fusions reduce each row
    in the same order whatever the leading (member) axes, which keeps sweeps
    bit-for-bit equal to individual runs. ``Config.dot="bf16"`` needs
    YNNPACK (it runs the bf16 GEMMs on the AVX512-BF16/AMX units), so such a
    run keeps XLA's default options.
    """
    if jax.default_backend() != "cpu" or (config is not None and config.dot == "bf16"):
        return None
    return {"xla_cpu_experimental_ynn_fusion_type": ""}


class Dynamic(NamedTuple):
    """Per-run traced values (scalars; a sweep stacks them along axis 0)."""

    lr: jax.Array
    lr_min: jax.Array
    noise: jax.Array
    spike_factor: jax.Array
    total_steps: jax.Array
    init_key: jax.Array
    data_key: jax.Array
    teacher_key: jax.Array
    ref_init_key: jax.Array
    ref_data_key: jax.Array


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


def _key_data(seed: int):
    """``jax.random.key_data(jax.random.key(seed))`` for a seed in [0, 2**32):
    with the default threefry implementation that is ``[0, seed]`` (uint32),
    built on the host instead of by a tiny compiled program."""
    if jax.config.jax_default_prng_impl == "threefry2x32":
        return np.array([0, seed], np.uint32)
    return jax.random.key_data(jax.random.key(seed))


def dynamic_for(config: Config) -> Dynamic:
    """The traced values of ``config`` (host arrays: nothing is compiled to make them)."""
    f32 = functools.partial(np.asarray, dtype=np.float32)
    return Dynamic(
        lr=f32(config.lr), lr_min=f32(config.lr_min), noise=f32(config.noise),
        spike_factor=f32(config.spike_factor), total_steps=f32(config.steps),
        init_key=_key_data(config.seed), data_key=_key_data(config.data_seed),
        teacher_key=_key_data(config.teacher_seed),
        ref_init_key=_key_data(config.seed if config.reference_seed is None else config.reference_seed),
        ref_data_key=_key_data(config.data_seed if config.reference_data_seed is None
                               else config.reference_data_seed),
    )


def static_key(config: Config) -> Config:
    """The config with every dynamic field at its default: equal keys share a Program."""
    defaults = Config()
    key = config.replace(**{f: getattr(defaults, f) for f in DYNAMIC_FIELDS + HOST_FIELDS})
    if config.reference_data_seed is not None:  # the paired run draws its own batches: a different program
        key = key.replace(reference_data_seed=0)
    return key


def _per_member(x, dyn: Dynamic):
    """``x`` itself, through a no-op select on a per-run value: under a
    sweep's vmap a batch shared by all members becomes a per-member copy, so
    every member's first LayerNorm (and its backward) compiles, and rounds,
    exactly as in a single run."""
    return jnp.where(dyn.lr == dyn.lr, x, jnp.nan)


def _diagnostic_spec(spec: MXSpec, keep_tiles: bool = False) -> MXSpec:
    """The spec clamp statistics are counted with: deterministic rounding (the
    counts do not depend on it), and 1-D blocks for vectors and activations."""
    spec = spec.replace(rounding="even") if spec.rounding == "stochastic" else spec
    if spec.rule is not None and spec.rule.per_element:  # the authors count clamping with the block's floor scale
        spec = spec.replace(scale_rule="floor")
    return spec if keep_tiles else spec.replace(block_dims=1)


def _where(cond, new, old):
    return jax.tree.map(lambda a, b: jnp.where(cond, a, b), new, old)


class Program:
    """The pure functions of one static configuration (:func:`static_key`;
    :func:`program_for` caches one per key), which the runner jits and compiles.

    It holds the student and reference networks (Flax modules of the recipe
    and reference recipe), the frozen teacher, the optimizer direction
    (:mod:`mx_proxy.training.optimizer`), the controller and the clamp-counting
    specs; its methods are :meth:`init` (state and teacher of one run),
    :meth:`segment` (``n`` steps in one loop), :meth:`val_loss`, and
    the step's parts that :mod:`mx_proxy.training.twins` reuses
    (:meth:`reference_step`, :meth:`student_step`, :meth:`finish_step`). The
    batches come from :mod:`mx_proxy.training.data`, the diagnostic metrics
    from :mod:`mx_proxy.training.diagnostics`.
    """

    def __init__(self, config: Config):
        c = self.config = static_key(config)
        self.recipe = c.recipe.with_dot(c.dot)
        kw = dict(width=c.width, depth=c.depth, act=c.act, norm=c.norm, init_scheme=c.init, init_gain=c.init_gain)
        # a controller plugs in as a per-unit precision selector (the mask the student reads)
        self.selector = controllers.selector(c.controller, c.depth)
        high = PRESETS[self.selector.high_recipe].with_dot(c.dot) if self.selector is not None else None
        self.student = architectures.student(c.arch, recipe=self.recipe, high_recipe=high, **kw)
        self.reference = architectures.student(c.arch, recipe=c.reference_recipe.with_dot(c.dot), **kw)
        self.normalize = architectures.weight_projection(c.arch)
        self.stochastic = c.recipe.stochastic
        tw, td, ta = c.teacher
        self.teacher = Teacher(width=c.width, hidden=tw, depth=td, act=ta)
        self.tx = optimizer.direction(c)
        self.period = c.diagnostics_every
        self.paired = c.has_paired_run
        self.same_point = c.gradient_reference == "same_point"
        self.ref_own_data = c.reference_data_seed is not None
        # the run is its own same-point reference: reuse its gradient (ζ exactly 0, cosine exactly 1)
        self.self_reference = c.recipe == c.reference_recipe and self.selector is None
        rs = self.recipe
        self.ln_spec = _diagnostic_spec(rs.weight_spec or MXSpec(c.diagnostic_format))
        self.act_spec = _diagnostic_spec(rs.fwd_x or rs.weight_spec or MXSpec(c.diagnostic_format))
        self.weight_spec = _diagnostic_spec(rs.weight_spec or MXSpec(c.diagnostic_format), keep_tiles=True)
    # -- pieces ---------------------------------------------------------------
    def init(self, dyn: Dynamic):
        """(initial TrainState, teacher params) of one run (pure)."""
        c = self.config
        x0 = jnp.zeros((1, c.width), jnp.float32)
        params = self.reference.init(jax.random.wrap_key_data(dyn.init_key), x0)["params"]
        if self.normalize is not None:
            params = self.normalize(params)
        teacher = self.teacher.init(jax.random.wrap_key_data(dyn.teacher_key), x0)["params"]
        opt = self.tx.init(params)
        state = TrainState(params, opt, jnp.float32(jnp.inf), jnp.bool_(False), jnp.int32(-1))
        if self.paired:
            ref = self.reference.init(jax.random.wrap_key_data(dyn.ref_init_key), x0)["params"]
            if self.normalize is not None:
                ref = self.normalize(ref)
            state = state._replace(ref_params=ref, ref_opt=self.tx.init(ref))
        if self.selector is not None:
            state = state._replace(ctrl=self.selector.init())
        return state, teacher

    def lr_at(self, dyn: Dynamic, t):
        """Learning rate of step t (:func:`mx_proxy.training.optimizer.learning_rate`)."""
        return optimizer.learning_rate(self.config, dyn.lr, dyn.lr_min, dyn.total_steps, t)

    def _batch(self, dyn, teacher, t, reference: bool = False):
        """(x, y) of step t; ``reference``: the paired run's batch (its own data key)."""
        c = self.config
        key = dyn.ref_data_key if reference else dyn.data_key
        x, noise = data.train_inputs(jax.random.wrap_key_data(key), t, c.batch, c.width)
        y = data.targets(lambda v: self.teacher.apply({"params": teacher}, v), x, noise, dyn.noise)
        return _per_member(x, dyn), y

    def _loss_grad(self, model, params, x, y, key=None, promote=None):
        def loss_fn(p):
            pred, inter = model.apply({"params": p}, x, key, promote, mutable=["intermediates"])
            return jnp.mean(jnp.square(pred - y)), inter["intermediates"]

        (loss, inter), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        return loss, grads, inter

    def rounding_key(self, dyn: Dynamic, t):
        """The stochastic-rounding key of step t (``None`` for deterministic recipes)."""
        if not self.stochastic:
            return None
        base = jax.random.fold_in(jax.random.wrap_key_data(dyn.init_key), ROUNDING_STREAM)
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
        ref_loss, ref_grads, _ = self._loss_grad(self.reference, ref_params, x, y)
        new_params, new_opt, _ = self._update(ref_opt, ref_params, ref_grads, lr)
        return ref_loss, ref_grads, new_params, new_opt

    def student_step(self, state: TrainState, t, dyn: Dynamic, x, y, lr, ref, mask=None):
        """The student's forward/backward and update on batch (x, y), its
        paper's ζ against ``ref`` (a :meth:`reference_step` result, or
        ``None``) and, on diagnostic steps, its diagnostics; the tuple
        :meth:`finish_step` takes."""
        loss, grads, inter = self._loss_grad(self.student, state.params, x, y, self.rounding_key(dyn, t), mask)
        new_params, new_opt, updates = self._update(state.opt_state, state.params, grads, lr)
        ref_out = ref_grads = diag_metrics = None
        if ref is not None:
            ref_loss, ref_grads, rp, ro = ref
            # the paper's ζ every step: the paired gradient is at hand, and the paper logged it every 5 steps
            ref_out = (ref_loss, diagnostics.global_norm(ref_grads), diagnostics.paper_zeta(grads, ref_grads), rp, ro)
        if self.period:
            def measure():
                return self._diagnostics(state.params, grads, ref_grads, inter, x, y)

            diag_metrics = jax.lax.cond(t % self.period == 0, measure, lambda: _nan_like(jax.eval_shape(measure)))
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

    def _diagnostics(self, params, grads, paired_grads, inter, x, y):
        """Diagnostic-step metrics. ``paired_grads``: the paired run's gradient
        at this step (``None`` without one)."""
        out = {}
        if not self.same_point:
            ref_grads = paired_grads
        elif self.self_reference:
            ref_grads = grads
        else:  # same point: the reference recipe's gradient at these weights and batch
            _, ref_grads, _ = self._loss_grad(self.reference, params, x, y)
        zeta, cos = diagnostics.gradient_error(grads, ref_grads)
        per = {k: diagnostics.gradient_error(grads[k], ref_grads[k]) for k in grads}
        order = sorted((k for k in grads if k.startswith("block_")), key=lambda k: int(k.split("_")[-1]))
        out |= {
            "zeta_bound": zeta,
            "cosine": cos,
            "zeta_bound/block": jnp.stack([per[k][0] for k in order]),
            "cosine/block": jnp.stack([per[k][1] for k in order]),
            "weight_clamp_frac/block": diagnostics.weight_clamp(params, self.weight_spec),
            "act_clamp_frac/block": diagnostics.activation_clamp(inter, self.act_spec),
        }
        r = self.recipe
        if r.fwd_w is not None and r.dgrad_w is not None:
            out["weight_fwd_dgrad_diff/block"] = diagnostics.weight_transpose_mismatch(params, r.fwd_w, r.dgrad_w)
        ln = diagnostics.ln_statistics(params, self.ln_spec)
        out.update({f"{k}/block": v for k, v in ln.items()})
        if ln:
            out["ln_clamp_frac"] = jnp.mean(ln["ln_clamp_frac"])
        out["weight_clamp_frac"] = jnp.mean(out["weight_clamp_frac/block"])
        out["act_clamp_frac"] = jnp.mean(out["act_clamp_frac/block"])
        return out

    def segment(self, state, dyn, teacher, start, n, *, size: int):
        """Run ``n`` steps from step ``start`` (both traced int32, ``n`` ≤
        ``size``; :func:`run_steps`). Returns the new state and the metrics
        stacked over ``size`` rows, the first ``n`` of them the steps'."""
        return run_steps(lambda s, t: self._step(s, t, dyn, teacher), state, start, n, size)

    def val_loss(self, params, dyn, teacher):
        """Mean loss over the config's held-out batches (pure)."""
        c = self.config
        key = jax.random.wrap_key_data(dyn.data_key)

        def batch_loss(i, total):  # a loop, not unrolled: one copy of the forward pass to compile
            x, noise = data.val_inputs(key, i, c.batch, c.width)
            y = data.targets(lambda v: self.teacher.apply({"params": teacher}, v), x, noise, dyn.noise)
            pred = self.student.apply({"params": params}, _per_member(x, dyn), self.rounding_key(dyn, _VAL_STEP))
            return total + jnp.mean(jnp.square(pred - y))

        return jax.lax.fori_loop(0, c.val_batches, batch_loss, jnp.float32(0)) / c.val_batches


def run_steps(step, state, start, n, size: int):
    """``n`` steps of ``step(state, t) -> (state, metrics)`` from step
    ``start`` (both traced int32, 0 ≤ ``n`` ≤ ``size``), one after another in
    a loop whose trip count is traced: the segments of every length a run
    needs (to the next validation step, a checkpoint, the end) share one
    compiled program per ``size`` (the config's ``chunk``), and with it one
    compiled step body. Returns the new state and each metric stacked over
    ``size`` rows, the first ``n`` of them the steps' (the rest NaN, or 0
    for integer metrics)."""
    shapes = jax.eval_shape(step, state, start)[1]
    rows = jax.tree.map(lambda a: jnp.full((size, *a.shape), jnp.nan if jnp.issubdtype(a.dtype, jnp.floating) else 0,
                                           a.dtype), shapes)

    def body(i, carry):
        s, rows = carry
        s, m = step(s, start + i)
        return s, jax.tree.map(lambda r, v: jax.lax.dynamic_update_index_in_dim(r, v, i, 0), rows, m)

    return jax.lax.fori_loop(0, n, body, (state, rows))


def _nan_like(shapes):
    """NaN arrays of the shapes and dtypes ``shapes`` (a pytree of ``ShapeDtypeStruct``):
    the diagnostic metrics of a non-diagnostic step."""
    return jax.tree.map(lambda a: jnp.full(a.shape, jnp.nan, a.dtype), shapes)


@functools.lru_cache(maxsize=64)
def _program(key: Config) -> Program:
    return Program(key)


def program_for(config: Config) -> Program:
    """The (cached) Program of a config; configs that differ only in dynamic
    fields share one, and so share compiled code."""
    return _program(static_key(config))
