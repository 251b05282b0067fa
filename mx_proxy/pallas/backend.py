"""Where the Pallas kernels run: the one place that holds backend choice.

* ``interpret=None`` (the default of every kernel) means: interpret the kernel
  on the host when JAX's default backend is the CPU, compile it otherwise.
  ``interpret=True`` forces the interpreter anywhere; ``interpret=False``
  forces compilation (on a CPU backend Pallas then refuses at lowering time
  with "Only interpret mode is supported on CPU backend"; lowering *for* CUDA
  from a CPU machine works, see ``tests/pallas/test_kernels_lowering.py``).
* The Pallas GPU lowering is chosen per jax version by :func:`gpu_backend`
  (table :data:`BACKEND_BY_VERSION`; the reasoning is in ``mx_proxy/pallas/README.md``,
  "Backend"). It is Triton on every jax this project supports: jax 0.10
  (Mosaic GPU cannot lower these kernels' register-level ``dot`` and integer
  arithmetic without a rewrite around shared-memory refs and ``wgmma``) and
  jax 0.11 (Triton is deprecated there but present; it is the only one of
  the two whose output can be compiled to machine code and checked for
  spills and shared memory without a GPU). A jax without
  ``jax.experimental.pallas.triton`` gets a ``ValueError`` naming the choices,
  never a silent fallback.
* Since jax 0.10 an unpinned ``pallas_call`` on an NVIDIA GPU goes to Mosaic
  GPU, so every call pins the chosen lowering with its ``CompilerParams``.

Nothing here changes numerics: the interpreter and the compiled kernel run the
same kernel body; only where it executes differs.
"""

from __future__ import annotations

import functools

import jax
from jax.experimental import pallas as pl

__all__ = [
    "BACKENDS", "BACKEND_BY_VERSION", "BACKEND", "LOWERING_PLATFORM", "gpu_backend", "jax_version",
    "resolve_interpret", "pallas_call", "is_pow2", "next_pow2",
]

BACKENDS = ("triton", "mosaic_gpu")  # the Pallas GPU lowerings
LOWERING_PLATFORM = "cuda"  # the platform compiled kernels target

BACKEND_BY_VERSION = (  # (first jax version, first version past it, backend, why)
    ((0, 10), (0, 11), "triton",
     "Mosaic GPU lowers only kernels written against shared-memory refs and wgmma, not register-level "
     "dot/integer tiles; Triton compiles these kernels and can be checked to cubin without a GPU"),
    ((0, 11), (0, 12), "triton",
     "Triton is deprecated in jax 0.11 but present; Mosaic GPU is the supported backend, yet it compiles "
     "only in the CUDA plugin at run time (no CPU-side check) and would need these kernels rewritten "
     "(mx_proxy/pallas/README.md, 'Backend'); the GPU script probes Mosaic GPU FP8 wgmma first"),
)


def jax_version(text: str | None = None) -> tuple[int, int, int]:
    """(major, minor, patch) of ``text`` or of the installed jax (suffixes like ``.dev`` ignored)."""
    parts = (text or jax.__version__).split(".")[:3]
    nums = []
    for p in parts:
        digits = "".join(ch for ch in p if ch.isdigit()) or "0"
        nums.append(int(digits))
    return tuple(nums + [0] * (3 - len(nums)))  # type: ignore[return-value]


def _triton_available() -> bool:
    try:
        from jax.experimental.pallas import triton as _  # noqa: F401
    except ImportError:
        return False
    return True


def gpu_backend(version: tuple[int, ...] | None = None, triton_available: bool | None = None) -> str:
    """The Pallas GPU lowering these kernels use on jax ``version`` (default: the installed one).

    Raises:
      ValueError: a jax outside :data:`BACKEND_BY_VERSION`, or one without the
        Triton lowering -- naming the supported versions (and ``backend="xla"``).
    """
    version = tuple(version or jax_version())[:2]
    triton_ok = _triton_available() if triton_available is None else triton_available
    for lo, hi, name, _ in BACKEND_BY_VERSION:
        if lo <= version < hi:
            if name == "triton" and not triton_ok:
                break
            return name
    supported = ", ".join(f"{lo[0]}.{lo[1]}.x" for lo, *_ in BACKEND_BY_VERSION)
    raise ValueError(f"the MX kernels support jax {supported} (Pallas Triton); jax {'.'.join(map(str, version))} "
                     f"{'has no Pallas Triton lowering' if not triton_ok else 'is not in the table'}: pin a "
                     "supported jax or use Recipe(backend='xla')")


def _backend_or_none() -> str | None:
    try:
        return gpu_backend()
    except ValueError:
        return None


BACKEND = _backend_or_none()  # the lowering of this process's jax; None: compiled kernels refuse (interpret works)


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


def _compiler_params(num_warps: int, num_stages: int):
    from jax.experimental.pallas import triton as pltriton

    return pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def pallas_call(kernel, *, out_shape, grid, in_specs, out_specs, interpret: bool, num_warps: int = 4,
                num_stages: int = 3, name: str | None = None):
    """``pl.pallas_call`` with this project's backend settings.

    Args:
      kernel: the kernel body ``kernel(*in_refs, *out_refs)``.
      out_shape, grid, in_specs, out_specs: as for ``pl.pallas_call``.
      interpret: already resolved (see :func:`resolve_interpret`).
      num_warps, num_stages: Triton launch parameters (ignored when interpreted).
      name: kernel name shown in profiles and in the lowered IR.
    """
    params = None
    if not interpret:
        gpu_backend()  # raises on a jax without a supported lowering
        params = _compiler_params(num_warps, num_stages)
    return pl.pallas_call(kernel, out_shape=out_shape, grid=grid, in_specs=in_specs, out_specs=out_specs,
                          interpret=interpret, compiler_params=params, name=name)


def is_pow2(n) -> bool:
    """True for a positive integer power of two (1, 2, 4, ...); bools are not integers here."""
    return isinstance(n, int) and not isinstance(n, bool) and n > 0 and n & (n - 1) == 0


@functools.cache
def next_pow2(n: int) -> int:
    """Smallest power of two >= n (n >= 1)."""
    return 1 << max(int(n) - 1, 0).bit_length()
