"""How the kernels' packed forms are declared (:class:`~mx_proxy.pallas.quantize.MXTensor`,
:class:`~mx_proxy.pallas.operand.MXOperand`): frozen dataclasses whose arrays are pytree leaves, so they cross
``jax.jit`` and ``vmap``, and whose other fields (format name, block size, sizes) are static metadata."""

from __future__ import annotations

import dataclasses

import jax

__all__ = ["array_record"]


def array_record(*, data: tuple[str, ...], meta: tuple[str, ...]):
    """Class decorator: a frozen dataclass registered as a pytree with the ``data`` fields as leaves and the
    ``meta`` fields as static metadata."""

    def declare(cls):
        return jax.tree_util.register_dataclass(dataclasses.dataclass(frozen=True)(cls), data_fields=list(data),
                                                meta_fields=list(meta))

    return declare
