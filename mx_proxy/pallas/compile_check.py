"""The GPU path checked without a GPU, as deep as the toolchain allows.

For every kernel configuration in :func:`configurations`:

1. **Lowering for CUDA** on this (CPU) machine:
   ``jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",))``. Pallas
   turns each kernel into Triton IR (TTIR), embedded in an XLA custom call
   (``__gpu$xla.gpu.triton``) with its launch parameters. This catches
   unsupported primitives, non-power-of-two shapes, dtype mistakes.
2. **Machine code**: the TTIR is handed to Triton's own compiler (the
   ``triton`` package from PyPI, the version the GPU image carries) targeting
   sm_90 -- TTIR -> TTGIR (layouts, pipelining, shared memory) -> LLVM -> PTX
   -> cubin with ``ptxas`` -- and ``ptxas -v`` reports registers, spills and
   stack; Triton reports the dynamic shared memory. :func:`violations` flags
   spills, stack frames and shared memory over Hopper's 227 KB.

What stays unchecked: XLA compiles the TTIR with the Triton bundled in
jaxlib, not the PyPI one (same dialect, possibly different passes); the
numerics and speed on a real card (``scripts/gpu_kernels.py``). Mosaic GPU
kernels compile only inside the CUDA plugin at run time, so they cannot be
taken past MLIR here at all. From jaxlib 0.10.3 on, Pallas compiles TTIR to
PTX during lowering through a handler only the CUDA plugin registers; on a
CPU-only install of such a jaxlib step 1 is impossible and the checks skip
with that reason (:func:`lowering_possible`).

Command line: ``python -m mx_proxy.pallas.compile_check [--quick] [--python PY]``
prints one row per kernel and exits 1 on any violation, 2 when the toolchain
is missing. ``PY`` (default: ``$PROXY_TRITON_PYTHON``, else this interpreter
if it can import ``triton``) is the Python that runs :mod:`mx_proxy.pallas.ptx_worker`.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp

from mx_proxy.numerics.quantize import MXSpec
from mx_proxy.pallas import backend, tuning
from mx_proxy.pallas import gemm as mx_gemm
from mx_proxy.pallas import operand as mx_operand
from mx_proxy.pallas import quantize as mx_quantize

__all__ = ["HOPPER_SMEM_BYTES", "TRITON_CALL", "KernelIR", "lowering_possible", "lower_for_cuda", "triton_kernels",
           "triton_python", "compile_kernels", "violations", "configurations", "main"]

HOPPER_SMEM_BYTES = 227 * 1024  # largest dynamic shared memory per block on sm_90
TRITON_CALL = "__gpu$xla.gpu.triton"
_WORKER = os.path.join(os.path.dirname(__file__), "ptx_worker.py")


@dataclasses.dataclass(frozen=True)
class KernelIR:
    """One Triton kernel of a lowered program: its name, TTIR text and launch parameters."""

    name: str
    ttir: str
    num_warps: int
    num_stages: int


def lowering_possible() -> tuple[bool, str]:
    """Whether this jaxlib can lower Pallas Triton kernels for CUDA here (and why not)."""
    from jax._src.lib import triton as triton_lib
    from jax._src.lib import version as jaxlib_version

    if jaxlib_version <= (0, 10, 2) or triton_lib.has_compilation_handler(backend.LOWERING_PLATFORM):
        return True, ""
    return False, (f"jaxlib {'.'.join(map(str, jaxlib_version))} compiles Triton IR during lowering and no CUDA "
                   "Triton compilation handler is registered (install jax[cuda12] / jax-cuda12-plugin)")


def lower_for_cuda(f, *args):
    """``f(*args)`` (ShapeDtypeStructs welcome) lowered for CUDA on any machine."""
    return jax.jit(f).trace(*args).lower(lowering_platforms=(backend.LOWERING_PLATFORM,))


def triton_kernels(lowered) -> list[KernelIR]:
    """Every Triton kernel embedded in a lowered program, TTIR verified and printed as text.

    Raises:
      ValueError: the program holds no Triton TTIR (newer jaxlibs embed PTX
        instead; see :func:`lowering_possible`).
    """
    from jax._src.lib.mlir import ir
    from jax._src.pallas.triton import lowering as triton_lowering  # its context knows the tt dialect

    found = []

    def walk(op):
        for region in op.regions:
            for block in region.blocks:
                for child in block.operations:
                    child = child.operation
                    if child.name == "stablehlo.custom_call" and \
                            ir.StringAttr(child.attributes["call_target_name"]).value == TRITON_CALL:
                        cfg = ir.DictAttr(child.attributes["mhlo.backend_config"])
                        found.append((ir.StringAttr(cfg["name"]).value, ir.StringAttr(cfg["ir"]).value_bytes,
                                      ir.IntegerAttr(cfg["num_warps"]).value, ir.IntegerAttr(cfg["num_stages"]).value))
                    walk(child)

    walk(lowered.compiler_ir("stablehlo").operation)
    if not found:
        raise ValueError("no Triton IR in the lowered program (a jaxlib that embeds PTX, or no Pallas kernel)")
    out = []
    with triton_lowering._new_ir_context():
        for name, ttir, warps, stages in found:
            module = ir.Module.parse(ttir)
            if not module.operation.verify():
                raise ValueError(f"kernel {name}: Triton IR fails the MLIR verifier")
            out.append(KernelIR(name, module.operation.get_asm(enable_debug_info=False), warps, stages))
    return out


def triton_python(explicit: str | None = None) -> str | None:
    """The Python that runs :mod:`mx_proxy.pallas.ptx_worker`: ``explicit``, else the
    environment variable ``PROXY_TRITON_PYTHON``, else this interpreter if it
    can import ``triton``, else None."""
    if explicit or os.environ.get("PROXY_TRITON_PYTHON"):
        return explicit or os.environ["PROXY_TRITON_PYTHON"]
    return sys.executable if importlib.util.find_spec("triton") is not None else None


def compile_kernels(kernels: list[KernelIR], python: str, capability: int = 90, timeout_s: int = 1800) -> list[dict]:
    """Compile each kernel to sm_``capability`` cubin with Triton + ptxas (:mod:`mx_proxy.pallas.ptx_worker`).

    Returns one dict per kernel (the worker's report plus ``name``, ``num_warps``, ``num_stages``).
    """
    with tempfile.TemporaryDirectory() as tmp:
        jobs = []
        for i, k in enumerate(kernels):
            path = os.path.join(tmp, f"{i}_{k.name}.ttir")
            with open(path, "w") as f:
                f.write(k.ttir)
            jobs.append({"path": path, "num_warps": k.num_warps, "num_stages": k.num_stages, "capability": capability})
        proc = subprocess.run([python, _WORKER], input=json.dumps(jobs), capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or len(lines) != len(kernels):
        raise RuntimeError(f"ptx_worker failed (exit {proc.returncode}): {proc.stderr[-3000:]}")
    return [{"name": k.name, "num_warps": k.num_warps, "num_stages": k.num_stages, **json.loads(ln)}
            for k, ln in zip(kernels, lines)]


def violations(report: dict) -> list[str]:
    """What is wrong with one compiled kernel: failure, spills, stack, shared memory over budget."""
    if not report.get("ok"):
        return [f"did not compile: {report.get('error', '?').splitlines()[-1][:300]}"]
    bad = []
    if report["spill_stores"] or report["spill_loads"]:
        bad.append(f"register spills ({report['spill_stores']} B stored, {report['spill_loads']} B loaded)")
    if report["stack"]:
        bad.append(f"{report['stack']} B stack frame")
    smem = report["shared"] + report["ptxas_smem"]
    if smem > HOPPER_SMEM_BYTES:
        bad.append(f"shared memory {smem} B > {HOPPER_SMEM_BYTES} B")
    return bad


# ----------------------------------------------------------------------------
# the configurations


def _sds(shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def configurations(quick: bool = False) -> list[tuple[str, object, tuple]]:
    """(label, f, abstract args) of every kernel configuration to check; ``quick``: a representative subset."""
    out = []
    formats = mx_quantize.MX_FORMATS
    quant_formats = ("fp8_e4m3", "fp4_e2m1") if quick else formats
    for fmt in quant_formats:
        for rule in (("floor",) if quick else mx_quantize.kernel_rules()):
            spec = MXSpec(fmt, scale_rule=rule)
            for k_axis in (0, 1):
                shape = (512, 256) if k_axis == 1 else (256, 512)
                out.append((f"operand {spec.name} k_axis={k_axis}",
                            functools.partial(mx_operand.quantize_operand, spec=spec, k_axis=k_axis, interpret=False),
                            (_sds(shape),)))
    if not quick:
        for fmt in formats:
            spec = MXSpec(fmt)
            out.append((f"quantize_packed {spec.name}",
                        functools.partial(mx_quantize.quantize_packed, spec=spec, axis=1, interpret=False),
                        (_sds((96, 256)),)))
            t = jax.eval_shape(functools.partial(mx_quantize.quantize_packed, spec=spec, axis=1, interpret=True),
                               _sds((96, 256)))
            out.append((f"dequantize {spec.name}", functools.partial(mx_quantize.dequantize, interpret=False), (t,)))

    pairs = [("fp8_e4m3", "fp8_e4m3", 32), ("fp4_e2m1", "fp4_e2m1", 32), ("fp8_e4m3", "fp8_e5m2", 32)]
    if not quick:
        pairs += [("fp8_e5m2", "fp8_e5m2", 32), ("fp6_e2m3", "fp4_e2m1", 32), ("int8", "int8", 32),
                  ("fp8_e4m3", "fp8_e4m3", 16)]
    size = 1024
    for fa, fb, bs in pairs:
        sa, sb = MXSpec(fa, block_size=bs), MXSpec(fb, block_size=bs)
        a_op = jax.eval_shape(functools.partial(mx_operand.quantize_operand, spec=sa, k_axis=1, row_multiple=256,
                                                k_multiple=128, interpret=True), _sds((size, size)))
        b_op = jax.eval_shape(functools.partial(mx_operand.quantize_operand, spec=sb, k_axis=1, row_multiple=256,
                                                k_multiple=128, interpret=True), _sds((size, size)))
        mode = mx_gemm.tuning_mode(a_op.gemm_dtype, bs, b_op.gemm_dtype, bs)
        configs = [tuning.DEFAULTS[mode, "small"], tuning.DEFAULTS[mode, "large"]]
        if not quick:
            configs += [c for cls in tuning.SIZE_CLASSES for c in (tuning.DEFAULTS[mode, cls],)]
            configs += tuning.candidates(mode)
        for cfg in dict.fromkeys(configs):  # unique, in order
            out.append((f"gemm {fa} x {fb} bs{bs} [{mode}/{cfg.mma}] {cfg.bm}x{cfg.bn}x{cfg.bk} w{cfg.num_warps} "
                        f"s{cfg.num_stages} g{cfg.group_m}",
                        functools.partial(mx_gemm.gemm, config=cfg, interpret=False), (a_op, b_op)))
    return out


def _row(label: str, r: dict) -> str:
    if not r.get("ok"):
        return f"{label:<66} FAILED  {violations(r)[0]}"
    return (f"{label:<66} {r['registers']:>4} {r['spill_stores'] + r['spill_loads']:>6} {r['stack']:>5} "
            f"{(r['shared'] + r['ptxas_smem']) // 1024:>7}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mx_proxy.pallas.compile_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a representative subset of the configurations")
    p.add_argument("--python", default=None, help="Python with the triton package (default: this one, if it has it)")
    p.add_argument("--json", default=None, help="also write the reports to this file")
    args = p.parse_args(argv)
    ok, why = lowering_possible()
    python = triton_python(args.python)
    if not ok or python is None:
        print(f"compile_check: cannot run here: {why or 'no Python with the triton package (pip install triton)'}",
              file=sys.stderr)
        return 2
    labels, kernels = [], []
    for label, f, fargs in configurations(args.quick):
        for k in triton_kernels(lower_for_cuda(f, *fargs)):
            labels.append(label)
            kernels.append(k)
    unique = {}
    for label, k in zip(labels, kernels):
        unique.setdefault((k.ttir, k.num_warps, k.num_stages), (label, k))
    reports = compile_kernels([k for _, k in unique.values()], python)
    print(f"# sm_90 via Triton {reports[0].get('triton', '?')}, {reports[0].get('ptxas', '?')}; "
          f"{len(reports)} distinct kernels")
    print(f"{'kernel configuration':<66} {'regs':>4} {'spillB':>6} {'stack':>5} {'smem KB':>7}")
    bad = 0
    for (label, _), r in zip(unique.values(), reports):
        print(_row(label, r))
        for v in violations(r):
            bad += 1
            print(f"    !! {v}")
    if args.json:
        tmp = f"{args.json}.tmp-{os.getpid()}"  # whole or not at all (this layer sits below mx_proxy.store.durable)
        with open(tmp, "w") as f:
            json.dump([{"label": lb, **r} for (lb, _), r in zip(unique.values(), reports)], f, indent=1)
        os.replace(tmp, args.json)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
