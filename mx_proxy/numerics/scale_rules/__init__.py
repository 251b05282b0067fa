"""Scale rules: how a block's shared E8M0 exponent follows from its amax.

Each rule is one :class:`ScaleRule` in a module of this package (the
package imports them all, so a new file is a new rule); :data:`RULES` is the
registry, :func:`get` its lookup. A rule is data: which blocks get an
exponent one above the OCP ``floor`` exponent, written as integer operations
on the float32 bit pattern of the block's amax, so that the XLA quantizer's
tables and the Pallas kernel bodies (:mod:`mx_proxy.numerics.mx.block_scale`)
evaluate the same definition exactly.

Shared by every rule (OCP MX v1.0, the MX library, torchao): the exponent is
the floor exponent ``e0 = floor(log2 amax) - emax`` (from the amax's
exponent field; a zero or float32-subnormal amax counts as field 0), plus
the rule's ``bump`` (0 or 1), clamped below at -127 -- the bump applies only
where ``e0`` itself is not below -127, i.e. where the exponent field of amax
is at least ``emax`` -- and the block is NaN where amax is Inf or NaN or the
exponent exceeds 127. The rules (``mx-proxy list scale-rules``):

=============  ==================================================================
``floor``      OCP v1.0: ``e0``. With E4M3 the scaled block max lies in [256, 512):
               scaled values above 448 saturate.
``rceil``      the smallest exponent with ``amax <= max_normal * 2**e`` (NVIDIA's
               MXFP8 recipe, cuBLAS, Transformer Engine, torchao's RCEIL): never
               saturates.
``ceil``       torchao's CEIL: ``ceil(log2 amax) - emax`` (``e0`` + 1 unless amax
               is a power of two).
``even``       torchao's EVEN: amax first rounded to the element's mantissa bits
               (half up, on the bit pattern), then ``floor``; a carry past the
               largest float32 binade makes the block NaN, as there.
``paper_bump`` the authors' bump (per element, E4M3 1-D blocks only).
=============  ==================================================================

Adding a rule: a new module here holding ``RULE = register(ScaleRule(name=...,
doc=..., bump=...))`` and its test (docs/architecture.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from mx_proxy.numerics.registry import Registry, load_entries

__all__ = ["ScaleRule", "RULES", "register", "get", "names"]


@dataclasses.dataclass(frozen=True)
class ScaleRule:
    """One E8M0 scale rule (frozen; see the module docstring).

    Attributes:
      name: what ``MXSpec(scale_rule=...)``, recipes and the command line call it.
      doc: one line on what it does (``mx-proxy list scale-rules``, the docs).
      bump: ``bump(amax, field, e0, fmt) -> bool array``, where the exponent
        is one above the clamped floor exponent ``e0`` (int32): ``amax`` the
        block maximum's magnitude bits (uint32), ``field`` its exponent field
        (int32), ``fmt`` the :class:`~mx_proxy.numerics.formats.ElementFormat`.
        Integer ``jax.numpy`` operations only (they run in Pallas kernels).
        ``None``: never (``floor``).
      carries_amax: the bump is the carry of rounding amax up (``even``): where
        it carries out of the largest float32 binade the rounded amax is Inf
        and the block NaN.
      element_bump: ``element_bump(a, axis) -> int32 array``: a bump that
        differs between the elements of a block (``paper_bump``), from the
        split view ``a`` of magnitude bits (blocks along ``axis``, elements
        along ``axis + 1``). Such a rule has no per-block exponent: the XLA
        path of 1-D blocks only, not the Pallas kernels.
      elements: the element formats it is defined for (``None``: every MX format).
      scope: what it is, where ``elements`` limits it (the message of a recipe
        change that would apply it to other formats).
      order: its place in listings (lower first).

    Specs hold the rule itself (``MXSpec.scale_rule``): it hashes and compares
    by its data fields (not its functions), and its ``repr`` is its name, so
    the text of a spec is the same in every process.
    """

    name: str
    doc: str
    bump: Callable | None = dataclasses.field(default=None, compare=False)
    carries_amax: bool = False
    element_bump: Callable | None = dataclasses.field(default=None, compare=False)
    elements: tuple[str, ...] | None = None
    scope: str = ""
    order: int = 100

    def __repr__(self) -> str:  # short, readable in notebooks, the same in every process
        return f"ScaleRule({self.name})"

    @property
    def per_element(self) -> bool:
        """True when the exponent varies within a block (no E8M0 byte stores it)."""
        return self.element_bump is not None

    @property
    def kernels(self) -> bool:
        """True when the Pallas kernels implement it (one exponent per block)."""
        return not self.per_element

    @property
    def block_dims(self) -> tuple[int, ...]:
        """The block shapes it is defined for: 1-D blocks and 2-D tiles, or 1-D only (per element)."""
        return (1,) if self.per_element else (1, 2)

    def check(self, element: str, block_dims: int) -> None:
        """Refuse an element format or block shape the rule is not defined for.

        Raises:
          ValueError: naming the rule, the value and what it is defined for.
        """
        if (self.elements is None or element in self.elements) and block_dims in self.block_dims:
            return
        defined = "every MX element format" if self.elements is None else f"{', '.join(self.elements)} elements"
        shape = " in 1-D blocks only" if self.block_dims == (1,) else ""
        raise ValueError(f"scale_rule={self.name!r} is defined for {defined}{shape}, got {element!r} with "
                         f"block_dims={block_dims}")


RULES: Registry[ScaleRule] = Registry("scale_rule", "E8M0 scale rules: the block exponent from the block's amax",
                                      ScaleRule)
"""Every scale rule, by name (``floor`` first: the default)."""

register = RULES.register  # a module of this package adds its rule with it, once
get = RULES.get  # the rule called ``name``; a ValueError names the valid ones
names = RULES.names  # every rule's name, ``floor`` first


load_entries(__name__, __path__)
