"""Synthetic data: the batch of step t is a pure function of (data key, t).

Every run of a config — FP32 or MX, first try or resumed from a checkpoint,
alone or inside a sweep — sees the same batches in the same order, and no
dataset is stored. Inputs are x ~ N(0, I) of the model width; targets are
``teacher(x) + noise · N(0, I)``; validation batches come from a separate
stream of the same key.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["train_inputs", "val_inputs", "targets"]

_VAL_STREAM = 0x7FFFFFFF  # fold-in tag of the held-out stream (training steps never reach it)


def _draw(key, shape):
    kx, kn = jax.random.split(key)
    return jax.random.normal(kx, shape, jnp.float32), jax.random.normal(kn, shape, jnp.float32)


def train_inputs(data_key, step, batch: int, width: int):
    """(x, noise) of training step ``step``: two (batch, width) float32 N(0, 1) arrays."""
    return _draw(jax.random.fold_in(data_key, step), (batch, width))


def val_inputs(data_key, index, batch: int, width: int):
    """(x, noise) of held-out batch ``index``, disjoint from every training batch."""
    return _draw(jax.random.fold_in(jax.random.fold_in(data_key, _VAL_STREAM), index), (batch, width))


def targets(teacher_fn, x, noise, noise_std):
    """``teacher(x) + noise_std · noise`` (the teacher is never differentiated)."""
    return jax.lax.stop_gradient(teacher_fn(x)) + noise_std * noise
