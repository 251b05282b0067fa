"""The GPU path to machine code without a GPU: Triton IR of the kernels compiled
to sm_90 cubin with Triton's own compiler and ptxas, checked for register
spills and shared memory over Hopper's 227 KB (``mx_proxy.pallas.compile_check``).

Needs a Python with the ``triton`` package (this one, or the one named by
``PROXY_TRITON_PYTHON``); skipped with that reason otherwise. The full table
of every configuration: ``python -m mx_proxy.pallas.compile_check``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

import mx_proxy as mxp
from mx_proxy.pallas import compile_check as cc
from mx_proxy.pallas import gemm as mx_gemm
from mx_proxy.pallas import operand as mop
from mx_proxy.pallas import tuning

_LOWER, _WHY_NOT = cc.lowering_possible()
_PYTHON = cc.triton_python()
pytestmark = [
    pytest.mark.skipif(not _LOWER, reason=_WHY_NOT),
    pytest.mark.skipif(_PYTHON is None, reason="no Python with the triton package (pip install triton, or set "
                                               "PROXY_TRITON_PYTHON); the PTX/cubin check needs Triton's compiler"),
]


def _kernels(f, *args):
    return cc.triton_kernels(cc.lower_for_cuda(f, *args))


def _operand(fmt, size=1024):
    f = functools.partial(mop.quantize_operand, spec=mxp.MXSpec(fmt), k_axis=1, row_multiple=256, k_multiple=128,
                          interpret=True)
    return jax.eval_shape(f, jax.ShapeDtypeStruct((size, size), jnp.float32))


def test_default_configurations_compile_without_spills():
    kernels = []
    x = jax.ShapeDtypeStruct((512, 256), jnp.float32)
    for fmt, k_axis in (("fp8_e4m3", 1), ("fp4_e2m1", 0)):
        kernels += _kernels(functools.partial(mop.quantize_operand, spec=mxp.MXSpec(fmt), k_axis=k_axis,
                                              interpret=False), x)
    pairs = {"fp8": ("fp8_e4m3", "fp8_e4m3"), "fp8_fp4": ("fp4_e2m1", "fp8_e4m3"), "bf16": ("fp8_e4m3", "fp8_e5m2")}
    for mode, (fa, fb) in pairs.items():
        a, b = _operand(fa), _operand(fb)
        assert mx_gemm.tuning_mode(a.gemm_dtype, 32, b.gemm_dtype, 32) == mode
        cfg = tuning.DEFAULTS[mode, "large"]
        for path in ("bf16", "fp8") if mode != "bf16" else ("bf16",):
            kernels += _kernels(functools.partial(mx_gemm.gemm, config=cfg.replace(mma=path), interpret=False), a, b)
    reports = cc.compile_kernels(kernels, _PYTHON)
    for k, r in zip(kernels, reports):
        assert cc.violations(r) == [], (k.name, r)
        assert r["registers"] <= 255 and r["shared"] <= cc.HOPPER_SMEM_BYTES
    gemm = [r for k, r in zip(kernels, reports) if k.name == "mx_gemm"]
    assert len(gemm) == 5 and all(r["shared"] > 0 for r in gemm)  # the operand tiles are staged in shared memory


def test_the_check_sees_spills():
    # 16 warps cap a thread at 128 registers: a 256 x 128 fp8 tile spills, and the check must say so
    cfg = tuning.GemmConfig(256, 128, 64, num_warps=16, num_stages=3)
    kernels = _kernels(functools.partial(mx_gemm.gemm, config=cfg, interpret=False), _operand("fp8_e4m3"),
                       _operand("fp8_e4m3"))
    [report] = cc.compile_kernels(kernels, _PYTHON)
    assert any("spills" in v for v in cc.violations(report)), report
