"""The MX bit arithmetic, written once: pure ``jax.numpy`` functions over
arrays or kernel tiles, shared by the XLA path of :mod:`mx_proxy.numerics.quantize` and
the Pallas kernel bodies in ``mx_proxy/pallas/``.

Everything works on the IEEE-754 bit patterns of float32 (as uint32; the
element stage also on bfloat16 as uint16, :class:`~mx_proxy.numerics.mx.bits.Word`) with
integer operations, so it is exact where float arithmetic is not (XLA on CPU
flushes float32 subnormals and cannot compile FP6 casts), and every function
lowers to Pallas Triton as well as to XLA: shift amounts are kept in [0, 31]
(wider shifts are undefined in PTX), leading zeros are counted on int32 (the
``__nv_clz`` intrinsic), and no function gathers from a table.

Modules, in the order a quantization uses them:

* :mod:`mx_proxy.numerics.mx.bits` -- float32 bit patterns: shifts, powers of two,
  ``max_normal * 2**e``, exact floor(log2), composing ``k * 2**j``.
* :mod:`mx_proxy.numerics.mx.block_scale` -- scale choice: from a block's amax, the shared exponent per
  rule (``floor``, ``rceil``), the per-block quantities of that exponent
  (saturation bound, grid step), and E8M0 scale bytes.
* :mod:`mx_proxy.numerics.mx.element` -- element rounding (ties to even, away, stochastic)
  with saturation, and element codes: encode (ml_dtypes layout or an FP8
  container) and exact decode.
* :mod:`mx_proxy.numerics.mx.layout` -- where the blocks are: 1-D blocks along an axis and
  2-D ``bs x bs`` tiles over the last two axes (pad and split into a view, the
  per-block maximum, merge and cut back).
* :mod:`mx_proxy.numerics.mx.nvfp4` -- NVFP4: E2M1 elements, E4M3 block scales and one
  float32 scale per tensor (NVIDIA Transformer Engine's recipe).

The float64 reference that checks all of it bit for bit is
:mod:`mx_proxy.numerics.reference`, written independently of these modules.
"""
