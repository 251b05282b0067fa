"""GPU lowering check without a GPU: every supported kernel configuration is
lowered for CUDA on this (CPU) machine, so Pallas-Triton lowering errors fail CI.

What this covers (jaxlib <= 0.10.2): Pallas lowers the kernel jaxpr to a
Triton-dialect (TTIR) module in Python, which catches unsupported primitives,
non-power-of-two load/store shapes, dtype and layout mistakes; the module is
embedded in an XLA custom call ``__gpu$xla.gpu.triton`` and only compiled to
PTX by XLA:GPU when the program is compiled on a GPU. The tests additionally
parse the embedded TTIR back and run the MLIR verifier on it.

What it cannot cover: Triton's own TTIR -> TTGIR -> PTX passes (register
allocation, shared memory limits, tensor-core layouts) need a GPU build; those
run in ``tests/test_kernels_gpu.py`` on a GPU. From jaxlib 0.10.3 on, Pallas
compiles TTIR to PTX during lowering through a handler the CUDA plugin
registers (``jax._src.lib.triton.register_compilation_handler``); on a
CPU-only install of such a jaxlib the check is skipped with that reason.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

import proxy
from kernels import backend
from kernels import mx_matmul as mm
from kernels import mx_quantize as mxq

TRITON_CALL = "__gpu$xla.gpu.triton"


def _lowering_possible() -> tuple[bool, str]:
    from jax._src.lib import triton as triton_lib
    from jax._src.lib import version as jaxlib_version

    if jaxlib_version <= (0, 10, 2) or triton_lib.has_compilation_handler(backend.LOWERING_PLATFORM):
        return True, ""
    return False, (f"jaxlib {'.'.join(map(str, jaxlib_version))} compiles Triton IR during lowering and no CUDA "
                   "Triton compilation handler is registered (install jax[cuda12] / jax-cuda12-plugin)")


_POSSIBLE, _WHY_NOT = _lowering_possible()
pytestmark = pytest.mark.skipif(not _POSSIBLE, reason=_WHY_NOT)


def _triton_modules(lowered):
    """(kernel name, TTIR bytes) of every Triton custom call in a lowered module."""
    from jax._src.lib.mlir import ir

    found = []

    def walk(op):
        for region in op.regions:
            for block in region.blocks:
                for child in block.operations:
                    child = child.operation
                    if child.name == "stablehlo.custom_call":
                        attrs = child.attributes
                        if ir.StringAttr(attrs["call_target_name"]).value == TRITON_CALL:
                            cfg = ir.DictAttr(attrs["mhlo.backend_config"])
                            found.append((ir.StringAttr(cfg["name"]).value, ir.StringAttr(cfg["ir"]).value_bytes))
                    walk(child)

    walk(lowered.compiler_ir("stablehlo").operation)
    return found


def lower_for_cuda(f, *args) -> list[str]:
    """Lower ``f(*args)`` for CUDA, verify every embedded TTIR module; returns the kernel names."""
    lowered = jax.jit(f).trace(*args).lower(lowering_platforms=(backend.LOWERING_PLATFORM,))
    from jax._src.lib import version as jaxlib_version

    if jaxlib_version > (0, 10, 2):  # newer jaxlib: PTX is embedded instead, already compiled
        assert "triton_kernel_call" in lowered.as_text()
        return []
    modules = _triton_modules(lowered)
    assert modules, "no Triton kernel in the lowered program"
    from jax._src.lib.mlir import ir
    from jax._src.pallas.triton import lowering as triton_lowering  # its context registers the tt dialect

    with triton_lowering._new_ir_context():
        for name, ttir in modules:
            module = ir.Module.parse(ttir)
            assert module.operation.verify(), name
            text = str(module)
            assert "tt.func" in text
    return [name for name, _ in modules]


SPECS = [proxy.MXSpec(f, scale_rule=r, rounding=m) for f in mxq.MX_FORMATS for r in ("floor", "rceil")
         for m in ("even", "away")]
A = jax.ShapeDtypeStruct((256, 320), jnp.float32)  # ragged K: padded to whole tiles
B = jax.ShapeDtypeStruct((320, 192), jnp.float32)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_fused_matmul_lowers(spec):
    f = functools.partial(mm.mx_matmul, a_spec=spec, b_spec=spec, interpret=False)
    assert lower_for_cuda(f, A, B) in ([], ["mx_matmul"])


@pytest.mark.parametrize("a_spec,b_spec,kw", [
    (proxy.MXSpec("fp8_e4m3"), proxy.MXSpec("fp8_e5m2"), {}),
    (proxy.MXSpec("fp8_e4m3"), None, {}),
    (None, proxy.MXSpec("fp4_e2m1"), {}),
    (proxy.MXSpec("fp8_e4m3"), proxy.MXSpec("fp8_e4m3"), {"block_sizes": (128, 128, 64)}),
    (proxy.MXSpec("fp8_e4m3"), proxy.MXSpec("int8", block_size=64), {"block_sizes": (32, 64, 128)}),
    (proxy.MXSpec("fp8_e4m3"), proxy.MXSpec("fp8_e4m3"), {"out_dtype": jnp.bfloat16}),
], ids=["mixed", "b_none", "a_none", "tiles128", "bs64", "out_bf16"])
def test_fused_matmul_variants_lower(a_spec, b_spec, kw):
    f = functools.partial(mm.mx_matmul, a_spec=a_spec, b_spec=b_spec, interpret=False, **kw)
    lower_for_cuda(f, A, B)


@pytest.mark.parametrize("a_layout,b_layout", [("mk", "nk"), ("km", "kn"), ("km", "nk")])
def test_fused_matmul_layouts_lower(a_layout, b_layout):
    f = functools.partial(mm.mx_matmul, a_spec=proxy.MXSpec("fp8_e4m3"), b_spec=proxy.MXSpec("fp8_e5m2"),
                          interpret=False, a_layout=a_layout, b_layout=b_layout)
    a = A if a_layout == "mk" else jax.ShapeDtypeStruct((320, 256), jnp.float32)
    b = B if b_layout == "kn" else jax.ShapeDtypeStruct((192, 320), jnp.bfloat16)
    lower_for_cuda(f, a, b)


def _packed_operand(other: int, layout: str, k: int = 320, bs: int = 32):
    u8 = jnp.uint8
    if layout.index("k") == 0:
        return jax.ShapeDtypeStruct((k, other), u8), jax.ShapeDtypeStruct((k // bs, other), u8)
    return jax.ShapeDtypeStruct((other, k), u8), jax.ShapeDtypeStruct((other, k // bs), u8)


@pytest.mark.parametrize("fmt", mxq.MX_FORMATS)
@pytest.mark.parametrize("a_layout,b_layout", [("mk", "kn"), ("mk", "nk"), ("km", "kn")])
def test_scaled_matmul_lowers(fmt, a_layout, b_layout):
    ac, asc = _packed_operand(256, a_layout)
    bc, bsc = _packed_operand(192, b_layout)
    f = functools.partial(mm.mx_scaled_matmul, a_format=fmt, b_format="fp8_e4m3", interpret=False,
                          a_layout=a_layout, b_layout=b_layout)
    assert lower_for_cuda(f, ac, asc, bc, bsc) in ([], ["mx_scaled_matmul"])


@pytest.mark.parametrize("spec", [proxy.MXSpec(f, scale_rule=r) for f in mxq.MX_FORMATS for r in ("floor", "rceil")],
                         ids=lambda s: s.name)
def test_quantize_and_dequantize_lower(spec):
    x = jax.ShapeDtypeStruct((96, 200), jnp.float32)
    q = functools.partial(mxq.quantize_packed, spec=spec, interpret=False)
    lower_for_cuda(functools.partial(q, axis=1), x)
    lower_for_cuda(functools.partial(q, axis=0), x)
    t = jax.eval_shape(functools.partial(mxq.quantize_packed, spec=spec, axis=1, interpret=True), x)
    lower_for_cuda(functools.partial(mxq.dequantize, interpret=False), t)


def test_rank3_quantize_lowers():
    x = jax.ShapeDtypeStruct((4, 96, 40), jnp.bfloat16)
    lower_for_cuda(functools.partial(mxq.quantize_packed, spec=proxy.MXSpec("fp8_e5m2"), axis=1, interpret=False), x)


def test_two_pass_mx_dot_lowers():
    f = functools.partial(mm.mx_dot, a_spec=proxy.MXSpec("fp8_e4m3"), b_spec=proxy.MXSpec("fp8_e4m3"),
                          method="two_pass", interpret=False)
    names = lower_for_cuda(f, jax.ShapeDtypeStruct((4, 64, 320), jnp.float32), B)
    assert names in ([], ["mx_quantize", "mx_quantize", "mx_scaled_matmul"])


def test_the_check_catches_lowering_errors():
    # a 48-wide load is not a power of two: Triton cannot express it, and lowering must say so
    from jax.experimental import pallas as pl

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[pl.ds(0, 48)] * 2

    def f(x):
        return backend.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((48,), jnp.float32), grid=(1,),
                                   in_specs=[pl.BlockSpec((64,), lambda i: (0,))],
                                   out_specs=pl.BlockSpec((48,), lambda i: (0,)), interpret=False)(x)

    with pytest.raises(Exception, match="power of 2"):
        lower_for_cuda(f, jax.ShapeDtypeStruct((64,), jnp.float32))
