"""The optimizer and LR schedule (mx_proxy.training.optimizer) against optax's own."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import mx_proxy as mxp
from mx_proxy.training import optimizer


def _tree(seed):
    r = np.random.default_rng(seed)
    return {"a": jnp.asarray(r.normal(size=(8, 16)), jnp.float32),
            "b": {"c": jnp.asarray(r.normal(size=(16,)) * 1e-3, jnp.float32)}}


def _run(tx, steps=6):
    params = _tree(0)
    state = tx.init(params)
    out = []
    for i in range(steps):
        u, state = tx.update(_tree(i + 1), state, params)
        out.append(u)
    return out


def test_adam_is_optaxs_adam_to_float32_rounding():
    ours, theirs = _run(optimizer.scale_by_adam(0.9, 0.999, 1e-8)), _run(optax.scale_by_adam(0.9, 0.999, 1e-8))
    for a, b in zip(ours, theirs):
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-6, atol=0)


def test_adam_under_vmap_equals_each_member_bit_for_bit():
    """The reason for the product form of the bias corrections: a sweep member's
    update is its single run's, to the last bit (elementwise arithmetic)."""
    tx = optimizer.scale_by_adam(0.9, 0.999, 1e-8)
    params = [_tree(0), _tree(10)]
    grads = [_tree(1), _tree(11)]
    stack = lambda ts: jax.tree.map(lambda *xs: jnp.stack(xs), *ts)  # noqa: E731

    def three(p, g):
        s = tx.init(p)
        for _ in range(3):
            u, s = tx.update(g, s, p)
        return u

    batched = jax.jit(jax.vmap(three))(stack(params), stack(grads))
    for i in range(2):
        single = jax.jit(three)(params[i], grads[i])
        for x, y in zip(jax.tree.leaves(single), jax.tree.leaves(batched)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y)[i])


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_sgd_is_optaxs_sgd(momentum):
    cfg = mxp.Config(optimizer="sgd", momentum=momentum)
    params = _tree(0)
    ours, theirs = optimizer.direction(cfg), optax.sgd(0.1, momentum=momentum or None)
    so, st = ours.init(params), theirs.init(params)
    p_ours = p_theirs = params
    for i in range(4):
        g = _tree(i + 1)
        p_ours, so, _ = optimizer.apply(ours, so, p_ours, g, jnp.float32(0.1))
        u, st = theirs.update(g, st, p_theirs)
        p_theirs = optax.apply_updates(p_theirs, u)
    for x, y in zip(jax.tree.leaves(p_ours), jax.tree.leaves(p_theirs)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


def test_the_schedule_is_optaxs_cosine_and_linear_warmup():
    steps, lr, lr_min = 200, 1e-3, 1e-5
    t = np.arange(steps + 1)
    cos = mxp.Config(schedule="cosine", lr=lr, lr_min=lr_min, steps=steps)
    ours = np.asarray(optimizer.learning_rate(cos, lr, lr_min, float(steps), t))
    theirs = np.asarray(optax.cosine_decay_schedule(lr, steps, alpha=lr_min / lr)(t))
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    warm = mxp.Config(lr=lr, warmup_steps=20, steps=steps)
    ours = np.asarray(optimizer.learning_rate(warm, lr, 0.0, float(steps), t))
    theirs = np.asarray(optax.linear_schedule(lr / 20, lr, 19)(t))  # (t + 1) / 20 until t = 19, then lr
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)
    const = optimizer.learning_rate(mxp.Config(lr=lr), np.float32(lr), np.float32(0), np.float32(steps), t)
    assert const == np.float32(lr)  # a constant schedule is the traced lr itself


def test_the_engine_steps_with_this_optimizer():
    """A run's recorded LR is the schedule's, and its first Adam update has
    norm lr·‖sign-like direction‖ (m̂/√v̂ = ±1 at step 1, up to ε)."""
    cfg = mxp.Config(width=16, depth=1, batch=32, steps=6, schedule="cosine", lr=1e-3, lr_min=1e-4,
                     diagnostics_every=0, val_every=0)
    run = mxp.train(cfg, progress=False)
    t = np.arange(cfg.steps)
    want = optimizer.learning_rate(cfg, np.float32(1e-3), np.float32(1e-4), np.float32(6), t)
    np.testing.assert_allclose(run.metrics["lr"].to_numpy(), np.asarray(want), rtol=1e-6)  # compiled vs eager cos
    n = sum(x.size for x in jax.tree.leaves(run.params))
    np.testing.assert_allclose(run.metrics["update_norm"].iloc[0], 1e-3 * np.sqrt(n), rtol=1e-3)
