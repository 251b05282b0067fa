"""GPU lowering check without a GPU: every supported kernel configuration is
lowered for CUDA on this (CPU) machine, so Pallas-Triton lowering errors fail CI.

Pallas lowers each kernel to a Triton-dialect (TTIR) module, embedded in an
XLA custom call ``__gpu$xla.gpu.triton``; ``mx_proxy.pallas.compile_check.triton_kernels``
pulls every module out, runs the MLIR verifier and returns its text. That
catches unsupported primitives, non-power-of-two shapes, dtype and layout
mistakes. Taking the TTIR on to PTX and cubin (registers, spills, shared
memory) needs Triton's own compiler: ``tests/pallas/test_kernels_ptx.py``. From
jaxlib 0.10.3 on, Pallas compiles TTIR during lowering through a handler only
the CUDA plugin registers; on a CPU-only install of such a jaxlib these tests
skip with that reason.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

import mx_proxy as mxp
from mx_proxy.pallas import backend, tuning
from mx_proxy.pallas import compile_check as cc
from mx_proxy.pallas import gemm as mx_gemm
from mx_proxy.pallas import matmul as mm
from mx_proxy.pallas import operand as mop
from mx_proxy.pallas import quantize as mxq

_POSSIBLE, _WHY_NOT = cc.lowering_possible()
pytestmark = pytest.mark.skipif(not _POSSIBLE, reason=_WHY_NOT)

FUSED = ["mx_quantize_operand", "mx_quantize_operand", "mx_gemm"]


def kernel_names(f, *args) -> list[str]:
    """Lower ``f(*args)`` for CUDA, verify every embedded TTIR module; returns the kernel names."""
    kernels = cc.triton_kernels(cc.lower_for_cuda(f, *args))
    assert all("tt.func" in k.ttir for k in kernels)
    return [k.name for k in kernels]


SPECS = [mxp.MXSpec(f, scale_rule=r, rounding=m) for f in mxq.MX_FORMATS for r in ("floor", "rceil")
         for m in ("even", "away")]
A = jax.ShapeDtypeStruct((256, 320), jnp.float32)  # ragged K: padded to whole tiles
B = jax.ShapeDtypeStruct((320, 192), jnp.float32)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_fused_matmul_lowers(spec):
    f = functools.partial(mm.mx_matmul, a_spec=spec, b_spec=spec, interpret=False)
    assert kernel_names(f, A, B) == FUSED


@pytest.mark.parametrize("a_spec,b_spec,kw", [
    (mxp.MXSpec("fp8_e4m3"), mxp.MXSpec("fp8_e5m2"), {}),
    (mxp.MXSpec("fp8_e4m3"), mxp.MXSpec("fp4_e2m1"), {"block_sizes": (64, 64, 32)}),
    (mxp.MXSpec("fp8_e4m3"), mxp.MXSpec("fp8_e4m3"), {"block_sizes": (128, 128, 64)}),
    (mxp.MXSpec("fp8_e4m3"), mxp.MXSpec("int8", block_size=64), {"block_sizes": (32, 64, 128)}),
    (mxp.MXSpec("fp6_e2m3", block_size=16), mxp.MXSpec("fp8_e5m2"), {}),
    (mxp.MXSpec("fp8_e4m3"), mxp.MXSpec("fp8_e4m3"), {"out_dtype": jnp.bfloat16}),
], ids=["mixed", "fp4_bk32", "tiles128", "bs64", "bs16", "out_bf16"])
def test_fused_matmul_variants_lower(a_spec, b_spec, kw):
    f = functools.partial(mm.mx_matmul, a_spec=a_spec, b_spec=b_spec, interpret=False, **kw)
    assert kernel_names(f, A, B) == FUSED


@pytest.mark.parametrize("a_spec,b_spec", [(mxp.MXSpec("fp8_e4m3"), None), (None, mxp.MXSpec("fp4_e2m1")),
                                           (None, None)], ids=["b_none", "a_none", "both_none"])
def test_unquantized_gemms_never_go_through_pallas(a_spec, b_spec):
    f = functools.partial(mm.mx_matmul, a_spec=a_spec, b_spec=b_spec, interpret=False)
    with pytest.raises(ValueError, match="no Triton IR"):
        cc.triton_kernels(cc.lower_for_cuda(f, A, B))


@pytest.mark.parametrize("a_layout,b_layout", [("mk", "nk"), ("km", "kn"), ("km", "nk")])
def test_fused_matmul_layouts_lower(a_layout, b_layout):
    f = functools.partial(mm.mx_matmul, a_spec=mxp.MXSpec("fp8_e4m3"), b_spec=mxp.MXSpec("fp4_e2m1"),
                          interpret=False, a_layout=a_layout, b_layout=b_layout)
    a = A if a_layout == "mk" else jax.ShapeDtypeStruct((320, 256), jnp.float32)
    b = B if b_layout == "kn" else jax.ShapeDtypeStruct((192, 320), jnp.bfloat16)
    assert kernel_names(f, a, b) == FUSED


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
    assert kernel_names(f, ac, asc, bc, bsc) == ["mx_gemm"]


def _operand(fmt: str, bs: int = 32, size: int = 512):
    spec = mxp.MXSpec(fmt, block_size=bs)
    f = functools.partial(mop.quantize_operand, spec=spec, k_axis=1, row_multiple=128, k_multiple=128, interpret=True)
    return jax.eval_shape(f, jax.ShapeDtypeStruct((size, size), jnp.float32))


@pytest.mark.parametrize("mode", tuning.MODES)
def test_every_tuning_candidate_and_default_lowers(mode):
    fa, fb = {"fp8": ("fp8_e4m3", "fp8_e4m3"), "fp8_fp4": ("fp4_e2m1", "fp8_e4m3"), "bf16": ("int8", "fp8_e5m2")}[mode]
    a, b = _operand(fa), _operand(fb)
    assert mx_gemm.tuning_mode(a.gemm_dtype, a.block_size, b.gemm_dtype, b.block_size) == mode
    configs = set(tuning.candidates(mode)) | {c for (m, _), c in tuning.DEFAULTS.items() if m == mode}
    tiles = {(c.bm, c.bn, c.bk): c for c in sorted(configs, key=str)}  # stages and warps do not change the IR
    for cfg in tiles.values():
        assert kernel_names(functools.partial(mx_gemm.gemm, config=cfg, interpret=False), a, b) == ["mx_gemm"]


@pytest.mark.parametrize("spec", [mxp.MXSpec(f, scale_rule=r) for f in mxq.MX_FORMATS for r in ("floor", "rceil")],
                         ids=lambda s: s.name)
def test_quantize_kernels_lower(spec):
    x = jax.ShapeDtypeStruct((96, 200), jnp.float32)
    for axis in (0, 1):
        assert kernel_names(functools.partial(mxq.quantize_packed, spec=spec, axis=axis, interpret=False), x) == \
            ["mx_quantize"]
        assert kernel_names(functools.partial(mop.quantize_operand, spec=spec, k_axis=axis, interpret=False), x) == \
            ["mx_quantize_operand"]
    t = jax.eval_shape(functools.partial(mxq.quantize_packed, spec=spec, axis=1, interpret=True), x)
    assert kernel_names(functools.partial(mxq.dequantize, interpret=False), t) == ["mx_dequantize"]


def test_rank3_quantize_lowers():
    x = jax.ShapeDtypeStruct((4, 96, 40), jnp.bfloat16)
    f = functools.partial(mxq.quantize_packed, spec=mxp.MXSpec("fp8_e5m2"), axis=1, interpret=False)
    assert kernel_names(f, x) == ["mx_quantize"]


def test_two_pass_mx_dot_lowers():
    f = functools.partial(mm.mx_dot, a_spec=mxp.MXSpec("fp8_e4m3"), b_spec=mxp.MXSpec("fp8_e4m3"),
                          method="two_pass", interpret=False)
    assert kernel_names(f, jax.ShapeDtypeStruct((4, 64, 320), jnp.float32), B) == \
        ["mx_quantize", "mx_quantize", "mx_gemm"]


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
        kernel_names(f, jax.ShapeDtypeStruct((64,), jnp.float32))
