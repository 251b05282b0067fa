"""Number formats described as data.

Each element format of the OCP Microscaling (MX) v1.0 specification, plus the
two "vector" precisions (bf16, fp32), is one frozen, hashable
:class:`ElementFormat`. Everything the quantizer needs (mantissa bits, the
smallest normal exponent, the largest normal value) is a field or a derived
property, so a format can be a static argument of ``jax.jit``.

Float formats are checked against ``ml_dtypes.finfo`` in the tests; MXINT8 is
the reference library's sign-magnitude fixed point: step 2**-6, max 127/64.

:data:`FORMATS` is the registry (``mx-proxy list formats``): each format is
declared once below, and :func:`get` finds one by name or alias. Adding a
float format that ml_dtypes stores is one :func:`register` line here (its
fields follow from ``ml_dtypes.finfo``); the quantizer's bit arithmetic is
written for any such format, and ``tests/numerics/test_registry.py`` runs
one added at run time through the float64 reference.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import ml_dtypes
import numpy as np

from mx_proxy.numerics.registry import Registry

__all__ = ["ElementFormat", "FORMATS", "MX_ELEMENTS", "get", "names", "register", "float_format", "positive_codes",
           "relative_gaps"]


@dataclasses.dataclass(frozen=True)
class ElementFormat:
    """One element format.

    Attributes:
      name: canonical name, e.g. ``"fp8_e4m3"``.
      dtype: the ml_dtypes / numpy dtype that stores its codes (``np.int8`` for
        MXINT8, whose codes are sign-magnitude integers k meaning k/64).
      exponent_bits: exponent field width (0 for MXINT8).
      mantissa_bits: explicit mantissa (fraction) bits; MXINT8 has 6, its
        fixed-point fraction bits.
      emax: exponent of the largest normal binade (paper: emax_elem); the OCP
        "floor" scale is ``2**(floor(log2 amax) - emax)``.
      emin: exponent of the smallest normal binade (``1 - bias``); below it the
        grid step stays ``2**(emin - mantissa_bits)`` (subnormals).
      max_normal: largest finite magnitude (448 for E4M3).
      has_inf, has_nan: whether the format encodes infinities / NaN.
      is_integer: True for MXINT8 (fixed point, constant step).
      vector: True for bf16/fp32, the precisions of non-GEMM ("vector")
        math, which no MX block holds.
      doc: one line on it (``mx-proxy list formats``).
    """

    name: str
    dtype: Any
    exponent_bits: int
    mantissa_bits: int
    emax: int
    emin: int
    max_normal: float
    has_inf: bool
    has_nan: bool
    is_integer: bool = False
    vector: bool = False
    doc: str = dataclasses.field(default="", compare=False)

    @property
    def bits(self) -> int:
        """Storage width in bits, sign included."""
        return 1 + self.exponent_bits + self.mantissa_bits + (1 if self.is_integer else 0)

    @property
    def min_normal(self) -> float:
        """Smallest positive normal value, ``2**emin`` (for MXINT8: one step)."""
        if self.is_integer:
            return self.min_subnormal
        return 2.0 ** self.emin

    @property
    def min_subnormal(self) -> float:
        """Smallest positive value, the grid step of the lowest binade."""
        return 2.0 ** (self.emin - self.mantissa_bits)

    @property
    def eps(self) -> float:
        """Gap between 1.0 and the next value (for MXINT8: the constant step)."""
        return 2.0 ** -self.mantissa_bits if not self.is_integer else self.min_subnormal

    @property
    def max_significand(self) -> int:
        """``max_normal / 2**(emax - mantissa_bits)`` as an integer (14 for E4M3)."""
        return int(self.max_normal / 2.0 ** (self.emax - self.mantissa_bits))

    @property
    def is_vector(self) -> bool:
        """True for bf16/fp32, the precisions of non-GEMM ("vector") math."""
        return self.vector

    def __repr__(self) -> str:  # short, readable in notebooks
        return f"ElementFormat({self.name})"


def float_format(name: str, dtype: Any, *, has_inf: bool, has_nan: bool, doc: str,
                 vector: bool = False) -> ElementFormat:
    """The :class:`ElementFormat` of a float type ml_dtypes (or numpy) stores, its fields from ``ml_dtypes.finfo``."""
    fi = ml_dtypes.finfo(dtype)
    mant = int(fi.nmant)
    emin = int(fi.minexp)
    max_normal = float(fi.max)
    emax = int(math.floor(math.log2(max_normal)))
    exp_bits = int(fi.nexp)
    return ElementFormat(name, np.dtype(dtype), exp_bits, mant, emax, emin, max_normal, has_inf, has_nan,
                         vector=vector, doc=doc)


FORMATS: Registry[ElementFormat] = Registry("element format", "element formats of MX blocks, and the vector precisions")
"""Every format, by canonical name (MX element formats first, then bf16 and fp32)."""

_ALIASES: dict[str, str] = {}


def register(fmt: ElementFormat, aliases: tuple[str, ...] = ()) -> ElementFormat:
    """Add a format to :data:`FORMATS` (and names :func:`get` also takes for it)."""
    if not isinstance(fmt, ElementFormat):
        raise ValueError(f"register takes an ElementFormat, got {type(fmt).__name__}")
    taken = [a for a in aliases if a in _ALIASES or a in FORMATS]
    if taken:
        raise ValueError(f"alias(es) {taken} of format {fmt.name!r} already name another format")
    FORMATS.register(fmt)
    _ALIASES.update({a: fmt.name for a in aliases})
    return fmt


register(float_format("fp8_e4m3", ml_dtypes.float8_e4m3fn, has_inf=False, has_nan=True,
                      doc="MXFP8 E4M3: max 448, no Inf, S.1111.111 is NaN"),
         ("e4m3", "mxfp8_e4m3", "float8_e4m3fn"))
register(float_format("fp8_e5m2", ml_dtypes.float8_e5m2, has_inf=True, has_nan=True,
                      doc="MXFP8 E5M2: max 57344, IEEE-like Inf and NaN"),
         ("e5m2", "mxfp8_e5m2", "float8_e5m2"))
register(float_format("fp6_e3m2", ml_dtypes.float6_e3m2fn, has_inf=False, has_nan=False,
                      doc="MXFP6 E3M2: max 28, no Inf or NaN"), ("e3m2", "mxfp6_e3m2", "float6_e3m2fn"))
register(float_format("fp6_e2m3", ml_dtypes.float6_e2m3fn, has_inf=False, has_nan=False,
                      doc="MXFP6 E2M3: max 7.5, no Inf or NaN"), ("e2m3", "mxfp6_e2m3", "float6_e2m3fn"))
register(float_format("fp4_e2m1", ml_dtypes.float4_e2m1fn, has_inf=False, has_nan=False,
                      doc="MXFP4 E2M1: max 6, no Inf or NaN"), ("e2m1", "mxfp4", "mxfp4_e2m1", "float4_e2m1fn"))
register(ElementFormat("int8", np.dtype(np.int8), 0, 6, 0, 0, 127 / 64, False, False, is_integer=True,
                       doc="MXINT8: sign-magnitude fixed point, step 1/64, max 127/64"), ("mxint8",))
register(float_format("bf16", ml_dtypes.bfloat16, has_inf=True, has_nan=True, vector=True,
                      doc="bfloat16: the reference library's vector precision (not an MX element)"), ("bfloat16",))
register(float_format("fp32", np.float32, has_inf=True, has_nan=True, vector=True,
                      doc="float32: full precision (not an MX element)"), ("float32",))

MX_ELEMENTS = FORMATS.subset(lambda f: not f.is_vector, "MX element format")
"""The formats an MX block can hold (every one but bf16 and fp32), read live."""


def names() -> tuple[str, ...]:
    """Canonical names of every format in the catalogue."""
    return FORMATS.names()


def get(name: str | ElementFormat) -> ElementFormat:
    """Look a format up by name (or pass an :class:`ElementFormat` through).

    Raises:
      ValueError: naming the unknown value and the valid names.
    """
    if isinstance(name, ElementFormat):
        return name
    if isinstance(name, str):
        key = name.strip().lower()
        key = _ALIASES.get(key, key)
        if key in FORMATS:
            return FORMATS.get(key)
    raise ValueError(f"unknown element format {name!r}; valid formats: {', '.join(FORMATS)}")


def positive_codes(fmt: str | ElementFormat) -> np.ndarray:
    """Every positive finite value of a format, ascending, as float64.

    Zero and NaN/Inf codes are excluded (E4M3 has 126 positive finite codes
    including the subnormals; the paper's 125 excludes the smallest). Vector
    formats are refused: they have too many codes to be useful here.
    """
    f = get(fmt)
    if f.is_vector:
        raise ValueError(f"positive_codes needs an MX element format, not {f.name!r}")
    if f.is_integer:
        return np.arange(1, 128, dtype=np.float64) / 64.0
    nbits = f.bits
    raw = np.arange(2 ** (nbits - 1), dtype=np.uint8)  # sign bit clear
    values = raw.view(f.dtype).astype(np.float64) if nbits == 8 else _sub_byte_values(f, raw)
    values = values[np.isfinite(values) & (values > 0)]
    return np.unique(values)


def _sub_byte_values(f: ElementFormat, raw: np.ndarray) -> np.ndarray:
    # ml_dtypes stores sub-byte floats one per byte, code in the low bits.
    return raw.view(f.dtype).astype(np.float64)


def relative_gaps(fmt: str | ElementFormat) -> tuple[np.ndarray, np.ndarray]:
    """The paper's Figure 5 (left) "sawtooth".

    Returns ``(codes, gaps)``: each positive code x_t but the largest, and its
    relative gap to the next code, ``(x_{t+1} - x_t) / x_t`` (dimensionless).
    Within a normal binade of E4M3 the gap falls from 12.5% to 6.7%.
    """
    codes = positive_codes(fmt)
    return codes[:-1], np.diff(codes) / codes[:-1]
