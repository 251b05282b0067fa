"""proxy: a workbench for training instabilities in microscaling (MX) formats.

The public API a notebook sees::

    import proxy
    spec = proxy.MXSpec("fp8_e4m3")          # block 32, OCP floor scale, ties to even
    q = proxy.quantize(x, spec, axis=-1)      # float32 values on the MX grid
    s = proxy.quantize_stats(x, spec)         # clamped / last-bin / flushed fractions
"""

from proxy import formats
from proxy.formats import ElementFormat
from proxy.quantize import MXSpec, QuantStats, quantize, quantize_stats

__all__ = ["formats", "ElementFormat", "MXSpec", "QuantStats", "quantize", "quantize_stats"]
__version__ = "0.1.0"
