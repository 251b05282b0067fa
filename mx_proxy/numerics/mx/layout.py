"""Where the blocks are: 1-D blocks of ``bs`` elements along an axis, or 2-D
``bs x bs`` tiles over the last two axes.

The quantizer goes one way for every layout: :meth:`Layout.pad`, :meth:`Layout.block_max` (the amax each block scale is
chosen from), :meth:`Layout.split` into the view that the element stage
rounds, then :meth:`Layout.unview` (merge and cut back).

A length that is not a multiple of the block size is zero-padded to whole
blocks and cut back afterwards (zeros never change a block's amax). 2-D tiles
(``MXSpec(block_dims=2)``) give one scale per square tile over the last two
axes (rank >= 2; leading axes are batch axes); the tiling is symmetric, so for
deterministic roundings ``quantize(w.T) == quantize(w).T`` exactly. A "view"
splits the padded array so that each block's elements lie along the view's
``red`` axes.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["normalize_axis", "pad_blocks", "split_blocks", "block_view", "Layout"]


def normalize_axis(axis, ndim: int) -> int:
    """``axis`` as a non-negative int for an array of rank ``ndim``.

    Raises:
      ValueError: not an integer, or out of range (naming the valid range).
    """
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise ValueError(f"axis must be an integer, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for an array of rank {ndim} (valid: {-ndim}..{ndim - 1})")
    return int(axis) % ndim


def pad_blocks(x, axis: int, block_size: int):
    """Zero-pad ``axis`` to whole blocks; returns (padded x, pad)."""
    pad = -x.shape[axis] % block_size
    if pad:
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, pad)
        x = jnp.pad(x, widths)
    return x, pad


def split_blocks(x, axis: int, block_size: int):
    """Split a whole number of blocks along ``axis`` into (blocks, block_size)."""
    shape = x.shape[:axis] + (x.shape[axis] // block_size, block_size) + x.shape[axis + 1:]
    return x.reshape(shape)


def block_view(x, axis: int, block_size: int):
    """Pad ``axis`` to whole blocks and split it into (blocks, block_size); returns (view, pad)."""
    x, pad = pad_blocks(x, axis, block_size)
    return split_blocks(x, axis, block_size), pad


class Layout(NamedTuple):
    """Where the blocks are: ``dims`` 1 (``bs`` elements along ``axis``) or 2
    (``bs x bs`` tiles over the last two axes)."""

    dims: int
    axis: int
    bs: int

    @property
    def red(self) -> tuple[int, ...]:
        """The block-element axes of the view."""
        return (self.axis + 1,) if self.dims == 1 else (-3, -1)

    def pad(self, x):
        """Zero-pad to whole blocks (1-D: along ``axis``; 2-D: the last two axes)."""
        if self.dims == 1:
            return pad_blocks(x, self.axis, self.bs)[0]
        widths = [(0, 0)] * (x.ndim - 2) + [(0, -n % self.bs) for n in x.shape[-2:]]
        return jnp.pad(x, widths) if any(w[1] for w in widths) else x

    def split(self, xp):
        """The view of a padded array (1-D: (.., blocks, bs, ..); 2-D: (.., row
        tiles, bs, column tiles, bs))."""
        if self.dims == 1:
            return split_blocks(xp, self.axis, self.bs)
        r, c = xp.shape[-2:]
        return xp.reshape(xp.shape[:-2] + (r // self.bs, self.bs, c // self.bs, self.bs))

    def view(self, x):
        """Zero-pad to whole blocks and split: ``split(pad(x))``."""
        return self.split(self.pad(x))

    def block_max(self, ap):
        """Per-block maximum of a padded array ``ap`` (as :meth:`pad` gives;
        e.g. magnitude bits), shaped like the view with the ``red`` axes at
        size 1 (broadcastable against it).

        1-D blocks along the last axis reduce over (.., blocks, bs / 2, 2):
        XLA:CPU then emits a vectorized reduction, 2-4x faster than over
        (.., blocks, bs). It reads the padded array, not the view, so that the
        reduction and the element loop each read ``x`` on their own (sharing
        one magnitude array between them costs XLA:CPU an extra pass).
        """
        if self.dims == 1 and self.axis == ap.ndim - 1 and self.bs % 2 == 0 and self.bs >= 4:
            halves = ap.reshape(ap.shape[:-1] + (ap.shape[-1] // self.bs, self.bs // 2, 2))
            return jnp.max(halves, axis=(-2, -1))[..., None]
        return jnp.max(self.split(ap), axis=self.red, keepdims=True)

    def unview(self, v, shape):
        """Inverse of :meth:`view` for an array of the original ``shape``."""
        if self.dims == 1:
            padded = shape[:self.axis] + (v.shape[self.axis] * self.bs,) + shape[self.axis + 1:]
        else:
            padded = shape[:-2] + (v.shape[-4] * self.bs, v.shape[-2] * self.bs)
        x = v.reshape(padded)
        if padded != tuple(shape):
            x = jax.lax.slice(x, (0,) * len(shape), tuple(shape))
        return x

    def squeeze(self, per_block):
        """A per-block array of the view (size-1 ``red`` axes) without those axes."""
        return jnp.squeeze(per_block, axis=self.red)
