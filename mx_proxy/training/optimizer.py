"""The optimizer and the learning-rate schedule of a run, on optax.

SGD (with or without momentum) is optax's own. Adam is optax's
``scale_by_adam`` state and maths with one change, for bit-exactness: the
bias corrections are multiplications by per-step scalars. Written as
divisions by a broadcast scalar (optax's form), XLA rewrites them
differently with and without a sweep's vmapped member axis (a reciprocal in
one case, a merged divisor in the other), so a sweep member would differ
from its single run in the last bit of its updates. ``tests/training/test_optimizer.py``
checks both against optax (equal to float32 rounding) and the schedule
against optax's schedules.

Units: ``lr`` is the step size α the update direction is multiplied by;
steps ``t`` count from 0.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

__all__ = ["scale_by_adam", "direction", "learning_rate", "apply"]


def scale_by_adam(b1: float, b2: float, eps: float) -> optax.GradientTransformation:
    """Adam's update direction m̂ / (√v̂ + ε) (optax's ``ScaleByAdamState``),
    the bias corrections as products (see the module docstring)."""

    def init(params):
        return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32), mu=jax.tree.map(jnp.zeros_like, params),
                                      nu=jax.tree.map(jnp.zeros_like, params))

    def update(grads, state, params=None):
        del params
        mu = jax.tree.map(lambda g, m: (1 - b1) * g + b1 * m, grads, state.mu)
        nu = jax.tree.map(lambda g, v: (1 - b2) * (g * g) + b2 * v, grads, state.nu)
        count = optax.safe_increment(state.count)
        c1 = 1.0 / (1.0 - b1 ** count.astype(jnp.float32))
        c2 = 1.0 / (1.0 - b2 ** count.astype(jnp.float32))
        updates = jax.tree.map(lambda m, v: (m * c1) / (jnp.sqrt(v * c2) + eps), mu, nu)
        return updates, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(init, update)


def direction(config) -> optax.GradientTransformation:
    """The update direction of ``config.optimizer``: Adam (``beta1``, ``beta2``,
    ``adam_eps``), SGD with ``momentum`` (optax's ``trace``), or plain SGD."""
    if config.optimizer == "adam":
        return scale_by_adam(config.beta1, config.beta2, config.adam_eps)
    if config.momentum:
        return optax.trace(decay=config.momentum)
    return optax.identity()


def learning_rate(config, lr, lr_min, total_steps, t):
    """The learning rate of step ``t``: ``lr`` (constant) or a cosine from
    ``lr`` at t = 0 to ``lr_min`` at t = ``total_steps``, times a linear
    warm-up (t + 1) / ``warmup_steps`` for the first steps. ``lr``, ``lr_min``,
    ``total_steps`` may be traced (a sweep's per-member values); the schedule
    kind and warm-up length are ``config``'s (static)."""
    t = jnp.asarray(t, jnp.float32)
    if config.schedule == "cosine":
        frac = jnp.clip(t / jnp.maximum(total_steps, 1.0), 0.0, 1.0)
        lr = lr_min + 0.5 * (lr - lr_min) * (1.0 + jnp.cos(math.pi * frac))
    if config.warmup_steps:
        lr = lr * jnp.minimum(1.0, (t + 1.0) / config.warmup_steps)
    return lr


def apply(tx: optax.GradientTransformation, tx_state, params, grads, lr, project=None):
    """One step θ ← θ − lr · direction: (new params, new optimizer state, the
    updates −lr · direction). ``project``: applied to the new parameters
    (nGPT's weight normalization), or ``None``."""
    updates, tx_state = tx.update(grads, tx_state, params)
    updates = jax.tree.map(lambda u: -lr * u, updates)
    new = optax.apply_updates(params, updates)
    return (new if project is None else project(new)), tx_state, updates
