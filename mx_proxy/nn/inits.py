"""How a student's weights are initialized: the schemes (:data:`INITS`), the kernel and bias initializers, and
:class:`InitScheme`, a scheme and its gain resolved once (what :class:`~mx_proxy.nn.model_spec.ModelSpec` holds)."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

__all__ = ["INITS", "InitScheme", "kernel_init", "bias_init"]

INITS = ("pytorch", "xavier_normal")


def kernel_init(init: str, gain: float):
    """Kernel (in, out) initializer.

    ``pytorch``: U(±1/sqrt(fan_in)) (torch.nn.Linear's default);
    ``xavier_normal``: N(0, gain²·2/(fan_in+fan_out)).
    """

    def f(key, shape, dtype=jnp.float32):
        fan_in, fan_out = shape
        if init == "pytorch":
            bound = 1.0 / math.sqrt(fan_in)
            return jax.random.uniform(key, shape, dtype, -bound, bound)
        std = gain * math.sqrt(2.0 / (fan_in + fan_out))
        return std * jax.random.normal(key, shape, dtype)

    return f


def bias_init(init: str, fan_in: int):
    """Bias initializer of a layer with ``fan_in`` inputs: ``pytorch``: U(±1/sqrt(fan_in)); ``xavier_normal``: 0."""

    def f(key, shape, dtype=jnp.float32):
        if init == "pytorch":
            bound = 1.0 / math.sqrt(fan_in)
            return jax.random.uniform(key, shape, dtype, -bound, bound)
        return jnp.zeros(shape, dtype)

    return f


@dataclasses.dataclass(frozen=True)
class InitScheme:
    """An initialization scheme (one of :data:`INITS`) and its gain (``xavier_normal``'s; ``pytorch`` has none).

    Raises:
      ValueError: an unknown ``name`` (naming the valid ones).
    """

    name: str = "pytorch"
    gain: float = 0.5

    def __post_init__(self):
        if self.name not in INITS:
            raise ValueError(f"unknown init {self.name!r}; valid: {', '.join(INITS)}")

    def kernel(self):
        """The (in, out) kernel initializer (:func:`kernel_init`)."""
        return kernel_init(self.name, self.gain)

    def bias(self, fan_in: int):
        """The bias initializer of a layer with ``fan_in`` inputs (:func:`bias_init`)."""
        return bias_init(self.name, fan_in)
