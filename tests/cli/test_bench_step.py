"""The bookkeeping of ``mx-proxy bench step`` (which GEMMs, which dot, the
roofline's sum) and the CPU line benchmarks print; no timing is asserted."""

import pytest

from mx_proxy.cli.bench import machine, step
from mx_proxy.training.config import Config

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
