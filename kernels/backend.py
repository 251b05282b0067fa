"""Where the Pallas kernels run: the one place that holds backend choice.

* ``interpret=None`` (the default of every kernel) means: interpret the kernel
  on the host when JAX's default backend is the CPU, compile it otherwise.
  ``interpret=True`` forces the interpreter anywhere; ``interpret=False``
  forces compilation (on a CPU backend Pallas then refuses at lowering time
  with "Only interpret mode is supported on CPU backend"; lowering *for* CUDA
  from a CPU machine works, see ``tests/test_kernels_lowering.py``).
* Compiled kernels use the **Pallas Triton lowering**, pinned explicitly with
  ``pltriton.CompilerParams``: since jax 0.10 an unpinned ``pallas_call`` on
  an NVIDIA GPU goes to Mosaic GPU, which has no ``jnp.dot`` lowering and
  could not lower these kernels. Why Triton and not Mosaic GPU is argued in
  ``kernels/README.md`` ("Backend").

Nothing here changes numerics: the interpreter and the compiled kernel run the
same kernel body; only where it executes differs.
"""

from __future__ import annotations

import functools

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

__all__ = ["BACKEND", "LOWERING_PLATFORM", "resolve_interpret", "pallas_call", "is_pow2", "next_pow2"]

BACKEND = "triton"  # the Pallas GPU lowering these kernels are written for
LOWERING_PLATFORM = "cuda"  # the platform compiled kernels target


def resolve_interpret(interpret: bool | None) -> bool:
    """``interpret`` as given, or (``None``) True on a CPU backend, False on a GPU.

    Raises:
      ValueError: for anything but ``None``, ``True`` or ``False``, and for
        ``None`` on a backend that is neither (e.g. TPU).
    """
    if interpret is None:
        platform = jax.default_backend()
        if platform not in ("cpu", "gpu"):
            raise ValueError(f"the MX kernels are compiled for NVIDIA GPUs (Pallas {BACKEND}) or interpreted; "
                             f"on backend {platform!r} pass interpret=True")
        return platform == "cpu"
    if isinstance(interpret, bool):
        return interpret
    raise ValueError(f"interpret must be None (auto: True on CPU, False on GPU), True or False; got {interpret!r}")


def pallas_call(kernel, *, out_shape, grid, in_specs, out_specs, interpret: bool, num_warps: int = 4,
                num_stages: int = 3, name: str | None = None):
    """``pl.pallas_call`` with this project's backend settings.

    Args:
      kernel: the kernel body ``kernel(*in_refs, *out_refs)``.
      out_shape, grid, in_specs, out_specs: as for ``pl.pallas_call``.
      interpret: already resolved (see :func:`resolve_interpret`).
      num_warps, num_stages: Triton launch parameters (ignored when interpreted).
      name: kernel name shown in profiles.
    """
    return pl.pallas_call(
        kernel,
        out_shape=out_shape,
        grid=grid,
        in_specs=in_specs,
        out_specs=out_specs,
        interpret=interpret,
        compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        name=name,
    )


def is_pow2(n) -> bool:
    """True for a positive integer power of two (1, 2, 4, ...); bools are not integers here."""
    return isinstance(n, int) and not isinstance(n, bool) and n > 0 and n & (n - 1) == 0


@functools.lru_cache(maxsize=None)
def next_pow2(n: int) -> int:
    """Smallest power of two >= n (n >= 1)."""
    return 1 << max(int(n) - 1, 0).bit_length()
