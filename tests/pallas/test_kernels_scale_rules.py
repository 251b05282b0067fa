"""The Pallas kernels take every scale rule with one exponent per block and refuse the rest.

The kernels evaluate a rule through the same ``block_exponent`` as
``mxp.quantize`` (``mx_proxy/numerics/scale_rules/``), so a new rule reaches
them without kernel code; here torchao's ``ceil`` and ``even`` go through the
packed quantize kernel and the fused MX GEMM (interpreted on the CPU) bit
for bit against ``mxp.quantize``, and lower for CUDA where this jaxlib can
lower without a GPU. ``paper_bump`` (an exponent per element, which no E8M0
byte stores) is refused with the rules that are valid.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mx_proxy as mxp
from mx_proxy.pallas import compile_check as cc
from mx_proxy.pallas import matmul as mm
from mx_proxy.pallas import quantize as mxq

NEW_RULES = [mxp.MXSpec(f, scale_rule=r) for f, r in (("fp8_e4m3", "ceil"), ("fp4_e2m1", "even"),
                                                       ("fp6_e2m3", "even"), ("int8", "ceil"))]


def _x(shape=(16, 128), seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-8, 8, (shape[0], 1)))
    x[0, :32] = 1.875 * 2.0 ** 3  # a block max that rounds up under even, and a non-power of two for ceil
    x[1, :32] = 2.0 ** -5  # a power of two: ceil keeps the floor exponent
    return x.astype(np.float32)


def test_kernels_implement_every_per_block_rule():
    assert {"floor", "rceil", "ceil", "even"} <= set(mxq.kernel_rules())
    assert "paper_bump" not in mxq.kernel_rules()


@pytest.mark.parametrize("spec", NEW_RULES, ids=lambda s: s.name)
def test_packed_kernel_equals_quantize(spec):
    x = _x()
    t = mxq.quantize_packed(jnp.asarray(x), spec, 1, interpret=True)
    got = np.asarray(mxq.dequantize(t, interpret=True))
    want = np.asarray(mxp.quantize(x, spec, axis=1))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_fused_gemm_with_ceil_and_even_operands():
    a, b = _x((32, 128), 1), _x((128, 32), 2)
    a_spec, b_spec = mxp.MXSpec("fp8_e4m3", scale_rule="ceil"), mxp.MXSpec("fp8_e5m2", scale_rule="even")
    got = np.asarray(mm.mx_matmul(a, b, a_spec, b_spec, interpret=True))
    qa, qb = mxp.quantize(a, a_spec, axis=1), mxp.quantize(b, b_spec, axis=0)
    want = np.asarray(jnp.dot(qa, qb, precision="highest"))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


def test_per_element_rule_is_refused_naming_the_valid_ones():
    spec = mxp.MXSpec("fp8_e4m3", scale_rule="paper_bump")
    with pytest.raises(ValueError, match="scale_rule 'paper_bump'.*valid: floor, rceil, ceil, even"):
        mxq.check_spec(spec, "a_spec")
    with pytest.raises(ValueError, match="paper_bump rule"):
        mxp.recipes.get("paper_e4m3").replace(fwd_x=spec, backend="pallas")


_POSSIBLE, _WHY_NOT = cc.lowering_possible()


@pytest.mark.skipif(not _POSSIBLE, reason=_WHY_NOT)
@pytest.mark.parametrize("rule", ["ceil", "even"])
def test_new_rules_lower_for_cuda(rule):
    spec = mxp.MXSpec("fp8_e4m3", scale_rule=rule)
    f = functools.partial(mm.mx_matmul, a_spec=spec, b_spec=spec, interpret=False)
    kernels = cc.triton_kernels(cc.lower_for_cuda(f, jax.ShapeDtypeStruct((256, 320), jnp.float32),
                                                  jax.ShapeDtypeStruct((320, 192), jnp.float32)))
    assert [k.name for k in kernels] == ["mx_quantize_operand", "mx_quantize_operand", "mx_gemm"]
