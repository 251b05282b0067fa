"""Both CPU dot paths, and ``Config.dot="bf16"`` against ``"f32"``.

XLA's CPU computes a float32 dot with YNNPACK or with its own kernels
(``--xla_cpu_experimental_ynn_fusion_type=invalid`` switches YNNPACK off);
they sum in different orders, so the tests against vectors made elsewhere
must hold on both (``tests/exactness.py``). ``dot="bf16"`` computes a GEMM of
bf16-exact operands (MX elements times power-of-two scales, bf16 vector
values) as a bfloat16 × bfloat16 → float32 dot, the AVX512-BF16/AMX path:
the same quantized operands, bit for bit, multiplied exactly and accumulated
in float32 in another order. So its outputs are held to the same float32
summation-order bound as any other order, and a run with it replays exactly
on one machine.
"""

import os
import subprocess
import sys
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
import pytest

import mx_proxy as mxp
from mx_proxy.nn import layers
from mx_proxy.numerics import recipe as recipes
from mx_proxy.training.engine import compiler_options

import exactness

ROOT = Path(__file__).resolve().parents[2]
# the XLA options of a dot="f32" run
F32_OPTIONS = compiler_options(mxp.Config(dot="f32"))


# --------------------------------------------------------------------------- both dot paths


@pytest.mark.e2e
def test_library_vectors_hold_with_ynnpack_off():
    """tests/integration/test_library_vectors.py in a fresh process with YNNPACK forced off
    (the suite itself runs them with YNNPACK where it applies): the dot-path-dependent ones, each Linear case
    at its first seed (its other seeds differ in data only)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_cpu_experimental_ynn_fusion_type=invalid".strip()}
    env.pop("PYTEST_XDIST_WORKER", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
           "tests/integration/test_library_vectors.py", "-k", "(linear and s0) or layer_norm or student"]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert " passed" in res.stdout and "exactness:" in res.stdout
    print(next(line for line in res.stdout.splitlines() if line.startswith("exactness:")))


# --------------------------------------------------------------------------- dot="bf16" against dot="f32"


def _fast_path_recipes():
    out = []
    for name, r in recipes.PRESETS.items():
        specs = [getattr(r, operand) for operand in layers.OPERANDS]
        if all(s is None for s in specs) and r.vector != "bf16":
            continue  # fp32: no GEMM is bf16-exact, nothing to compare
        marks = []
        if any(s is not None and s.scale_format != "e8m0" for s in specs):
            marks = [pytest.mark.skip(reason="NVFP4: the float32 tensor scale makes operands not bf16-exact; "
                                             "its GEMMs are float32 dots with either dot")]
        elif r.backend == "pallas":
            marks = [pytest.mark.skip(reason="Pallas MX GEMM: the dot knob is for the XLA backend")]
        out.append(pytest.param(r, id=name, marks=marks))
    return out


def _operands(seed=0, batch=48, fan_in=96, fan_out=64):
    k = jax.random.split(jax.random.key(seed), 4)
    x = jax.random.normal(k[0], (batch, fan_in))
    w = jax.random.normal(k[1], (fan_in, fan_out)) * fan_in**-0.5
    b = jax.random.normal(k[2], (fan_out,)) * 0.1
    g = jax.random.normal(k[3], (batch, fan_out)) * 1e-2
    return x, w, b, g


def _dense(r, key):
    def f(x, w, b, g):
        y, vjp = jax.vjp(lambda x, w, b: layers.mx_dense(x, w, b, r, key=key), x, w, b)
        return (y, *vjp(g))
    return f


# the three GEMMs of mx_dense: (role of a, role of b, a's contraction axis, b's), as in layers._dense2d
GEMMS = {"forward": ("fwd_x", "fwd_w", 1, 0), "dgrad": ("dgrad_g", "dgrad_w", 1, 1),
         "wgrad": ("wgrad_x", "wgrad_g", 0, 0)}


def _gemm_inputs(x, w, g, gemm):
    return {"forward": (x, w), "dgrad": (g, w), "wgrad": (x, g)}[gemm]


@pytest.mark.parametrize("r", _fast_path_recipes())
def test_bf16_dot_has_the_same_operands_and_f32_accumulation_bounds(r):
    key = jax.random.key(7)
    fast, ref = r.with_dot("bf16"), r.with_dot("f32")
    assert all(rr.dot == d for rr, d in ((fast, "bf16"), (ref, "f32"))
               for rr in (rr, *(o for _, o in rr.overrides))) and fast.with_dot("f32") == ref
    x, w, b, g = _operands()
    # the quantized operands: one quantizer, the same bits, and bf16 values (what the bf16 dot multiplies)
    for gemm, (ra, rb, ax_a, ax_b) in GEMMS.items():
        vec = r.vector if gemm == "forward" else r.backward_vector
        for role, axis, v in zip((ra, rb), (ax_a, ax_b), _gemm_inputs(x, w, g, gemm)):
            qs = [np.asarray(layers.quantize_operand(v, getattr(rr, role), axis, vec, layers.operand_key(key, rr, role),
                                       rr.vector_rounding)) for rr in (fast, ref)]
            np.testing.assert_array_equal(qs[0].view(np.uint32), qs[1].view(np.uint32), err_msg=role)
            if layers.bf16_exact(getattr(r, role), vec):
                np.testing.assert_array_equal(qs[0], qs[0].astype(ml_dtypes.bfloat16).astype(np.float32),
                                              err_msg=f"{role} is not bf16-exact")
    # the bare GEMMs of MX operands (float32 out, no vector rounding): one bound for both dots
    gemms = [(gemm, *spec) for gemm, spec in GEMMS.items() if getattr(r, spec[0]) and getattr(r, spec[1])]
    ins = [_gemm_inputs(x, w, g, gemm) for gemm, *_ in gemms]

    def mm(ins, dot):
        return [layers.quantized_matmul(a, b, getattr(r, ra), getattr(r, rb), "fp32", a_axis=ax_a, b_axis=ax_b,
                                 a_key=layers.operand_key(key, r, ra), b_key=layers.operand_key(key, r, rb),
                                 rounding=r.vector_rounding, dot=dot)
                for (a, b), (_, ra, rb, ax_a, ax_b) in zip(ins, gemms)]

    if gemms:
        fast_mm = jax.jit(lambda ins: mm(ins, "bf16"))  # XLA's default options: YNNPACK where it applies
        if all(layers.bf16_exact(getattr(r, role), "fp32") for _, ra, rb, *_ in gemms for role in (ra, rb)):
            assert "bf16[" in fast_mm.lower(ins).compile().as_text(), "no bf16 dot compiled"
        cert = exactness.certify(lambda ins: mm(ins, "f32"), ins)
        got_ref = jax.jit(lambda ins: mm(ins, "f32"), compiler_options=F32_OPTIONS)(ins)
        for i, (gemm, *_) in enumerate(gemms):
            exactness.check(fast_mm(ins)[i], got_ref[i], cert[i], f"{r.name}: {gemm} GEMM")
    # mx_dense forward, dgrad, wgrad and the bias gradient, jitted as in training
    f_fast, f_ref = _dense(fast, key), _dense(ref, key)
    cert = exactness.certify(f_ref, x, w, b, g)
    got_fast = jax.jit(f_fast)(x, w, b, g)
    got_ref = jax.jit(f_ref, compiler_options=F32_OPTIONS)(x, w, b, g)
    for i, name in enumerate(("y", "dx", "dw", "db")):
        bf16 = (r.vector if name == "y" else r.backward_vector) == "bf16"
        exactness.check(got_fast[i], got_ref[i], cert[i], f"{r.name}: {name}", bf16=bf16,
                        unknown_atol=2.0**-8)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the transposed wgrad is the CPU's bf16 dot path")
@pytest.mark.parametrize("name", ["paper_e4m3", "mxfp8_e4m3"])
def test_a_narrowing_layer_takes_its_wgrad_transposed_within_the_bound(name):
    # fan_out 16 < fan_in 128 at batch 256: the CPU's bf16 wgrad is computed as (g^T x)^T, copying the narrow g
    r = recipes.get(name)
    x, w, b, g = _operands(seed=3, batch=256, fan_in=128, fan_out=16)
    fast, ref = _dense(r.with_dot("bf16"), None), _dense(r.with_dot("f32"), None)
    hlo = jax.jit(fast).lower(x, w, b, g).compile().as_text()
    assert "f32[16,128]" in hlo and " conditional(" in hlo, "the transposed wgrad product was not compiled"
    cert = exactness.certify(ref, x, w, b, g)
    got_fast = jax.jit(fast)(x, w, b, g)
    got_ref = jax.jit(ref, compiler_options=F32_OPTIONS)(x, w, b, g)
    for i, out in enumerate(("y", "dx", "dw", "db")):
        exactness.check(got_fast[i], got_ref[i], cert[i], f"{name}: {out}", bf16=True, unknown_atol=2.0**-8)
    assert got_fast[2].shape == (128, 16)


# --------------------------------------------------------------------------- training with dot="bf16"

TINY = mxp.Config(width=32, depth=2, batch=64, steps=20, recipe="mxfp8_e4m3", dot="bf16", diagnostics_every=10,
                    val_every=10)


def assert_same_run(a: mxp.Run, b: mxp.Run):
    """Bit-for-bit equal metrics (NaN where NaN), divergence and parameters."""
    assert a.diverged_at == b.diverged_at
    assert list(a.metrics.columns) == list(b.metrics.columns) and len(a.metrics) == len(b.metrics)
    for c in a.metrics.columns:
        assert np.array_equal(a.metrics[c].to_numpy(), b.metrics[c].to_numpy(), equal_nan=True), c
    for k in a.params:
        for leaf in a.params[k]:
            assert np.array_equal(a.params[k][leaf], b.params[k][leaf]), (k, leaf)


@pytest.fixture(scope="module")
def bf16_run():
    return mxp.train(TINY, progress=False)


def test_a_bf16_dot_run_replays_bit_for_bit(bf16_run):
    assert bf16_run.config.dot == "bf16" and bf16_run.diverged_at is None
    assert_same_run(mxp.train(TINY, progress=False), bf16_run)


def test_a_bf16_dot_sweep_member_equals_its_single_run(bf16_run):
    sw = mxp.sweep(TINY, progress=False, lr=[TINY.lr, 3 * TINY.lr])
    assert [c.lr for c in sw.configs] == [TINY.lr, 3 * TINY.lr]
    assert_same_run(sw.runs[0], bf16_run)
    assert sw.runs[1].metrics["loss"].iloc[-1] != bf16_run.metrics["loss"].iloc[-1]
