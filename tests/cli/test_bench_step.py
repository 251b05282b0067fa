"""The bookkeeping of ``mx-proxy bench step`` (which GEMMs, which dot, the
roofline's sum) and the CPU line benchmarks print; no timing is asserted."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mx_proxy.cli.bench import machine, step
from mx_proxy.nn import dense
from mx_proxy.training.config import Config
from mx_proxy.training.engine import compiler_options

CFG = Config(width=64, depth=3, batch=32)


def test_cpu_line_says_whether_the_cpu_has_native_bf16_dots():
    epyc = "model name\t: AMD EPYC 9R14\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n"
    info = machine.cpu(epyc)
    assert info["model"] == "AMD EPYC 9R14" and info["flags"] == ["avx2", "avx512_bf16"] and info["native_bf16"]
    assert "native bf16 dots" in machine.describe(info)
    assert machine.cpu("model name : Old Xeon\nflags : sse2 avx2\n")["native_bf16"] is False
    assert machine.cpu("processor : 0\n")["native_bf16"] is None  # no flags line: unknown


def test_student_gemms_are_forward_dgrad_and_wgrad_of_every_layer():
    gemms = step.student_gemms(CFG)
    assert len(gemms) == CFG.depth * 2 * 3
    d, h, b = 64, 256, 32
    for kind in step.KINDS:
        assert sum(step.flops(g) for g in gemms if g[1] == kind) == CFG.depth * 2 * (2 * b * d * h)
    teacher = step.teacher_gemms(CFG)
    assert sum(step.flops(g) for g in teacher) == CFG.depth * 2 * (2 * b * d * d)


def test_wgrad_layouts_are_those_each_dot_computes():
    cfg = Config(width=8, depth=1, batch=64)  # fc2 (32 -> 8) narrows enough for the transposed bf16 wgrad
    f32 = {g[0][1]: g[2:] for g in step.student_gemms(cfg, "f32") if g[1] == "wgrad"}
    bf16 = {g[0][1]: g[2:] for g in step.student_gemms(cfg, "bf16") if g[1] == "wgrad"}
    assert f32 == {"first/fc1": ((64, 8), (64, 32), (0, 0)), "first/fc2": ((64, 32), (64, 8), (0, 0))}
    assert bf16 == {"first/fc1": ((8, 64), (64, 32), (1, 0)), "first/fc2": ((8, 64), (64, 32), (1, 0))}
    assert dense.wgrad_transposed(64, 32, 8) and not dense.wgrad_transposed(64, 8, 32)
    for dtype in step.DTYPES:
        assert list(map(step.flops, step.student_gemms(CFG, dtype))) == list(map(step.flops, step.student_gemms(CFG)))
    with pytest.raises(ValueError, match="'f16'"):
        step.student_gemms(CFG, "f16")


@pytest.mark.parametrize("dtype", step.DTYPES)
def test_gemm_loop_writes_every_product_in_full_and_nothing_else_over_an_operand(dtype):
    gemms = step.student_gemms(Config(width=8, depth=1, batch=64), dtype)
    loop, firsts, seconds = step.gemm_loop(gemms, 2, dtype, compiler_options(Config(dot=dtype)))
    # the loop: the GEMMs, in-place one-element updates and scalar arithmetic; no operation over a whole
    # operand or product beside the GEMMs, which XLA would fuse into them or run beside them and time as theirs
    shapes = {tuple(a.shape) for a in firsts} | {(g[2][1 - g[4][0]], g[3][1 - g[4][1]]) for g in gemms}
    (rounds,) = [e for e in loop.trace(firsts, seconds).jaxpr.eqns if e.primitive.name in ("scan", "while")]
    body = rounds.params.get("jaxpr", rounds.params.get("body_jaxpr")).jaxpr.eqns
    def whole(vs):
        return any(tuple(getattr(v.aval, "shape", ())) in shapes for v in vs)

    written = sorted(e.primitive.name for e in body if whole(e.outvars))
    assert written == sorted(["dot_general", "dynamic_update_slice"] * len(gemms))
    readers = {e.primitive.name for e in body if whole(e.invars)}
    assert readers == {"dot_general", "dynamic_update_slice", "slice"}  # the slice: a product's element [0, 0]
    assert all(e.outvars[0].aval.size == 1 for e in body if e.primitive.name == "slice")
    expect = [jax.lax.dot_general(a.at[0, 0].set(0), c, (((g[4][0],), (g[4][1],)), ((), ())), jax.lax.Precision.HIGHEST,
                                  preferred_element_type=jnp.float32) for g, a, c in zip(gemms, firsts, seconds)]
    acc, _, outs = loop([np.asarray(a) for a in firsts], seconds)
    assert np.isfinite(acc) and len(outs) == len(gemms)
    for got, want in zip(outs, expect):  # the second round's products: one element of each first operand changed
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("recipe,dot,want", [
    ("paper_e4m3", "bf16", ("bf16", "bf16", "bf16")),
    ("paper_e4m3", "f32", ("f32", "f32", "f32")),
    ("fp32", "bf16", ("f32", "f32", "f32")),
    ("paper_forward_only", "bf16", ("bf16", "f32", "f32")),  # the backward in float32
    ("nvfp4", "bf16", ("f32", "f32", "f32")),  # a float32 tensor scale: not bf16 values
])
def test_each_gemm_takes_the_dot_the_step_gives_it(recipe, dot, want):
    names = ("block_0/fc1", "first/fc1")
    assert tuple(step.gemm_dtype(recipe, names, kind, dot) for kind in step.KINDS) == want


def test_roofline_is_the_gemms_at_their_speeds_plus_teacher_and_non_gemm_time():
    per_flop = {("f32", k): 2e-12 for k in step.KINDS} | {("bf16", k): 1e-12 for k in step.KINDS}
    flops = sum(step.flops(g) for g in step.student_gemms(CFG))
    assert step.roofline("paper_e4m3", "bf16", CFG, per_flop, 0.25, 0.5) == pytest.approx(flops * 1e-12 + 0.75)
    assert step.roofline("paper_e4m3", "f32", CFG, per_flop, 0.25, 0.5) == pytest.approx(flops * 2e-12 + 0.75)


def test_interleaved_times_calls_each_function_once_to_warm_up_then_once_per_round_in_turn():
    calls = []
    fns = {k: (lambda k=k: calls.append(k)) for k in ("a", "b")}
    times = step.interleaved_times(fns, 3)
    assert calls == ["a", "b"] * 4
    assert {k: v.shape for k, v in times.items()} == {"a": (3,), "b": (3,)} and (times["a"] >= 0).all()
    medians = step.interleaved_medians(fns, 5)
    assert set(medians) == {"a", "b"} and all(isinstance(v, float) for v in medians.values())


def test_step_roofline_of_one_set_of_timings_is_the_roofline_of_its_gemm_speeds_and_non_gemm_time():
    kind_flops = {k: sum(step.flops(g) for g in step.student_gemms(CFG) if g[1] == k) for k in step.KINDS}
    compiled = {("bf16", "f32"), ("bf16", "bf16")}
    t = {("gemm", "bf16", "f32", "fwd"): 3.0, ("gemm", "bf16", "f32", "dgrad"): 4.0,
         ("gemm", "bf16", "f32", "wgrad"): 5.0, ("gemm", "bf16", "bf16", "fwd"): 1.0,
         ("gemm", "bf16", "bf16", "dgrad"): 1.5, ("gemm", "bf16", "bf16", "wgrad"): 2.0,
         ("teacher", "bf16"): 0.5, ("fp32", "bf16", 0): 14.5}
    # every GEMM of paper_e4m3 is a bf16 dot: 1 + 1.5 + 2 s; FP32's non-GEMM time 14.5 - (3 + 4 + 5 + 0.5) = 2 s
    assert step.step_roofline(t, "paper_e4m3", "bf16", 0, CFG, compiled, kind_flops) == pytest.approx(4.5 + 0.5 + 2)
    t["fp32", "bf16", 0] = 10.0  # an FP32 step faster than its GEMMs alone: no negative non-GEMM time
    assert step.step_roofline(t, "paper_e4m3", "bf16", 0, CFG, compiled, kind_flops) == pytest.approx(4.5 + 0.5)
