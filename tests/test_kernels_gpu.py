"""Compiled kernels on a real NVIDIA GPU (skipped cleanly elsewhere).

Run on a GPU machine: ``python -m pytest tests/test_kernels_gpu.py -m gpu -v``.
Same checks as the interpreted tests, at sizes that span many tiles, plus a
benchmark smoke run.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import proxy
from kernels import bench
from kernels import mx_matmul as mm
from kernels import mx_quantize as mxq

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs an NVIDIA GPU (jax.default_backend() == 'gpu')"),
]

E4M3, E5M2 = proxy.MXSpec("fp8_e4m3"), proxy.MXSpec("fp8_e5m2")


def _rand(shape, seed, scale=1.0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * scale)


def _check(out, a, b, a_spec, b_spec):
    out = np.asarray(out)
    ref = np.asarray(mm.mx_matmul_reference(a, b, a_spec, b_spec))
    qa = a if a_spec is None else proxy.quantize(a, a_spec, 1)
    qb = b if b_spec is None else proxy.quantize(b, b_spec, 0)
    tol = mm.accumulation_tolerance(qa, qb)
    assert np.array_equal(np.isnan(out), np.isnan(ref))
    ok = ~np.isnan(ref)
    assert np.all(np.abs(out - ref)[ok] <= tol[ok]), float(np.max((np.abs(out - ref) / tol)[ok]))


@pytest.mark.parametrize("a_spec,b_spec", [
    (E4M3, E4M3), (E4M3, E5M2), (proxy.MXSpec("fp4_e2m1"), proxy.MXSpec("fp4_e2m1")),
    (proxy.MXSpec("fp6_e2m3", scale_rule="rceil"), proxy.MXSpec("int8", rounding="away")), (E4M3, None),
], ids=["e4m3", "mixed", "e2m1", "fp6_int8", "e4m3_none"])
def test_fused_compiled(a_spec, b_spec):
    a, b = _rand((300, 520), 0, 3.0), _rand((520, 200), 1)
    a = a.at[3, 40].set(jnp.nan)
    _check(mm.mx_matmul(a, b, a_spec, b_spec), a, b, a_spec, b_spec)


def test_fused_compiled_tile_sizes_and_layout():
    a, b = _rand((256, 512), 2), _rand((512, 384), 3)
    for bs in [(64, 64, 32), (128, 128, 32), (128, 64, 64)]:
        _check(mm.mx_matmul(a, b, E4M3, E4M3, block_sizes=bs), a, b, E4M3, E4M3)
    nk = mm.mx_matmul(a, b.T, E4M3, E4M3, b_layout="nk")
    assert np.array_equal(np.asarray(nk), np.asarray(mm.mx_matmul(a, b, E4M3, E4M3)))


@pytest.mark.parametrize("fmt", mxq.MX_FORMATS)
def test_quantize_dequantize_compiled(fmt):
    spec = proxy.MXSpec(fmt)
    x = _rand((130, 300), 4) * jnp.exp2(jnp.arange(300) % 40 - 20.0)
    t = mxq.quantize_packed(x, spec, 1)
    ref = mxq.quantize_packed_reference(np.asarray(x), spec, 1)
    assert np.array_equal(np.asarray(t.codes), np.asarray(ref.codes))
    assert np.array_equal(np.asarray(t.scales), np.asarray(ref.scales))
    fq = np.asarray(proxy.quantize(x, spec, 1))
    assert np.array_equal(np.asarray(mxq.dequantize(t)).view(np.uint32), fq.view(np.uint32))


def test_scaled_compiled_matches_lax_scaled_dot_and_fused():
    a, b = _rand((256, 512), 5), _rand((512, 128), 6)
    pa, pb = mxq.quantize_packed(a, E4M3, 1), mxq.quantize_packed(b, E4M3, 0)
    out = mm.mx_scaled_matmul(pa.codes, pa.scales, pb.codes, pb.scales, "fp8_e4m3", "fp8_e4m3")
    f8 = lambda c: jax.lax.bitcast_convert_type(c, jnp.float8_e4m3fn)  # noqa: E731
    ref = jax.lax.scaled_dot(f8(pa.codes), f8(pb.codes), lhs_scale=pa.scales_as_e8m0(),
                             rhs_scale=pb.scales_as_e8m0(), preferred_element_type=jnp.float32)
    tol = mm.accumulation_tolerance(mxq.dequantize(pa), mxq.dequantize(pb))
    assert np.all(np.abs(np.asarray(out) - np.asarray(ref)) <= tol)
    _check(out, a, b, E4M3, E4M3)


def test_bench_smoke(capsys):
    assert bench.main(["--sizes", "512", "--formats", "fp8_e4m3", "--iters", "2"]) == 0
    assert "fp8_e4m3" in capsys.readouterr().out
