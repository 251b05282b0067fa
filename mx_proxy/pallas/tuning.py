"""GEMM launch configurations: MMA path, tile sizes, Triton warps/stages, program order.

:class:`GemmConfig` is one configuration. Its ``mma`` is the kernel's path
(:mod:`mx_proxy.pallas.gemm`): ``"fp8"`` (FP8 codes into the ``dot``, per-32-chunk
rescaling) or ``"bf16"`` (codes decoded to bf16 with their scales folded in).
Which paths a pair of operands allows is its mode (:data:`MODES`): ``"fp8"``
(both E4M3 codes or both E5M2, block sizes multiples of 32), ``"fp8_fp4"``
(the same with a packed-FP4 operand, whose register lookup table costs
registers) or ``"bf16"`` (any other pair: bf16 only). :func:`config_for`
picks one per mode and shape class, from

1. the measured table ``mx_proxy/pallas/gemm_tuning.json`` if present -- written by
   :func:`autotune` on a GPU (``python scripts/gpu_kernels.py`` does it for the
   benchmark shapes), one entry per (mode, shape class) with the TFLOP/s it
   measured; else
2. :data:`DEFAULTS`: starting points from Triton's Hopper GEMM configurations,
   each checked on CPU to compile to sm_90 without register spills and within
   the Hopper shared-memory budget (``mx_proxy/pallas/compile_check.py``). Not yet
   measured on a GPU. They take the bf16 path: Pallas Triton emits its FP8
   ``dot`` without Triton's ``maxNumImpreciseAcc`` attribute, and Triton then
   refuses Hopper's FP8 ``wgmma`` and lowers it to ``mma.sync`` on f16
   (upcast in registers) -- seen in the compiled PTX -- while the bf16 path
   gets ``wgmma``. The autotuner measures both on a GPU.

Interpreted kernels (CPU) take large tiles instead (the interpreter pays per
grid step, not per FLOP) and the fp8 path wherever the pair allows it, so the
CPU tests exercise it; both paths give the same exact products.

Program order: a 1-D grid walked in groups of ``group_m`` row tiles (each
group sweeps all column tiles of its rows before the next group starts), so
the A tiles of a group and the B tiles stay in L2 -- Triton's "grouped
ordering".
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

__all__ = ["GemmConfig", "MODES", "MMA_PATHS", "SIZE_CLASSES", "DEFAULTS", "TABLE_PATH", "size_class", "config_for",
           "candidates", "autotune", "load_table"]

SIZE_CLASSES = ("small", "medium", "large")
MODES = ("fp8", "fp8_fp4", "bf16")  # pairs allowing FP8 MMA; the same with packed FP4; bf16 only
MMA_PATHS = ("fp8", "bf16")
TABLE_PATH = os.path.join(os.path.dirname(__file__), "gemm_tuning.json")
_WARPS = (1, 2, 4, 8, 16)


@dataclasses.dataclass(frozen=True)
class GemmConfig:
    """One launch configuration of the MX GEMM kernel.

    Attributes:
      bm, bn: output tile (powers of two >= 16).
      mma: ``"bf16"`` or ``"fp8"`` (the kernel's path; "fp8" needs a pair whose mode allows it).
      bk: K per loop step (a power of two, multiple of 32: 32-element chunks).
      num_warps: Triton warps per program (1, 2, 4, 8 or 16).
      num_stages: Triton software-pipelining depth (1..8).
      group_m: row tiles per program group (>= 1; program order, module docstring).
    """

    bm: int
    bn: int
    bk: int
    num_warps: int = 8
    num_stages: int = 3
    group_m: int = 8
    mma: str = "bf16"

    def __post_init__(self):
        for name in ("bm", "bn", "bk"):
            v = getattr(self, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 16 and v & (v - 1) == 0):
                raise ValueError(f"GemmConfig {name}={v!r} is invalid; valid: a power of two >= 16 (16, 32, 64, ...)")
        if self.bk % 32:
            raise ValueError(f"GemmConfig bk={self.bk} must be a multiple of 32 (the scaled MMA chunk); "
                             "valid: 32, 64, 128, ...")
        if self.num_warps not in _WARPS:
            raise ValueError(f"GemmConfig num_warps={self.num_warps!r}; valid: {', '.join(map(str, _WARPS))}")
        if not (isinstance(self.num_stages, int) and 1 <= self.num_stages <= 8):
            raise ValueError(f"GemmConfig num_stages={self.num_stages!r}; valid: 1..8")
        if not (isinstance(self.group_m, int) and self.group_m >= 1):
            raise ValueError(f"GemmConfig group_m={self.group_m!r}; valid: a positive integer")
        if self.mma not in MMA_PATHS:
            raise ValueError(f"GemmConfig mma={self.mma!r}; valid: {', '.join(map(repr, MMA_PATHS))}")

    def replace(self, **changes) -> GemmConfig:
        return dataclasses.replace(self, **changes)


def size_class(m: int, n: int, k: int) -> str:
    """"small" (min(M, N) <= 256), "medium" (<= 2048) or "large"."""
    side = min(m, n)
    return "small" if side <= 256 else "medium" if side <= 2048 else "large"


DEFAULTS: dict[tuple[str, str], GemmConfig] = {
    (mode, cls): GemmConfig(*((64, 64, 64, 4) if cls == "small" else (128, 128, 32 if mode == "fp8_fp4" else 64, 8)),
                            num_stages=3, group_m=8, mma="bf16")
    for mode in MODES for cls in SIZE_CLASSES
}
"""Compiled defaults: the bf16 path (module docstring), 64 x 64 x 64 tiles with 4
warps for small problems, 128 x 128 x 64 (x 32 with a packed-FP4 operand) with
8 warps otherwise, 3 stages, groups of 8 row tiles. Unmeasured on a GPU; each
compiles to sm_90 without spills (Triton 3.6 + ptxas, up to 236 of 255
registers); 128 x 256 tiles, bk = 128 and 16 warps spill."""

_INTERPRET_CAP = (256, 256, 128)


def load_table(path: str = TABLE_PATH) -> dict[tuple[str, str], GemmConfig]:
    """The measured table at ``path`` ({} when absent).

    Raises:
      ValueError: a malformed file (naming what is wrong).
    """
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        raw = json.load(f)
    table = {}
    for entry in raw.get("entries", []):
        mode, cls = entry.get("mode"), entry.get("size_class")
        if mode not in MODES or cls not in SIZE_CLASSES:
            raise ValueError(f"{path}: entry {entry!r} needs mode in {MODES} and size_class in {SIZE_CLASSES}")
        table[mode, cls] = GemmConfig(**entry["config"])
    return table


def _pow2_at_least(n: int, lo: int) -> int:
    return max(lo, 1 << max(int(n) - 1, 0).bit_length())


def config_for(m: int, n: int, k: int, mode: str, interpret: bool, table=None) -> GemmConfig:
    """The configuration for an (M, N, K) GEMM in ``mode`` (see the module docstring).

    Tiles never exceed the problem (rounded up to powers of two >= 16).
    """
    if mode not in MODES:
        raise ValueError(f"unknown MMA mode {mode!r}; valid: {', '.join(MODES)}")
    if interpret:
        cap_m, cap_n, cap_k = _INTERPRET_CAP
        return GemmConfig(min(cap_m, _pow2_at_least(m, 16)), min(cap_n, _pow2_at_least(n, 16)),
                          min(cap_k, _pow2_at_least(k, 32)), num_warps=4, num_stages=1, group_m=8,
                          mma="bf16" if mode == "bf16" else "fp8")
    table = load_table() if table is None else table
    cls = size_class(m, n, k)
    cfg = table.get((mode, cls), DEFAULTS[mode, cls])
    return cfg.replace(bm=min(cfg.bm, _pow2_at_least(m, 16)), bn=min(cfg.bn, _pow2_at_least(n, 16)),
                       bk=min(cfg.bk, _pow2_at_least(k, 32)))


def candidates(mode: str) -> list[GemmConfig]:
    """The search space of :func:`autotune` for a pair of ``mode``: the
    configurations of each path the pair allows that compile to sm_90 without
    spills (``python -m mx_proxy.pallas.compile_check`` checks all of them)."""
    if mode not in MODES:
        raise ValueError(f"unknown MMA mode {mode!r}; valid: {', '.join(MODES)}")
    out = []
    for mma in (("bf16", "fp8") if mode != "bf16" else ("bf16",)):
        big_bk = (32,) if mode == "fp8_fp4" else (32, 64)
        for (bm, bn, warps), bks in (((64, 64, 4), (32, 64)), ((128, 128, 8), big_bk)):
            for bk in bks:
                for stages in (2, 3, 4):
                    for group in (8, 16):
                        out.append(GemmConfig(bm, bn, bk, num_warps=warps, num_stages=stages, group_m=group, mma=mma))
    return out


def autotune(run, configs, *, iters: int = 5, budget_s: float = 60.0) -> list[tuple[GemmConfig, float]]:
    """Time ``run(config)`` (a blocking call) for each configuration; returns
    ``[(config, best seconds)]`` sorted fastest first. Configurations that fail
    to compile or run (shared memory, registers) are left out; the search stops
    after ``budget_s`` seconds."""
    results = []
    start = time.perf_counter()
    for cfg in configs:
        if time.perf_counter() - start > budget_s:
            break
        try:
            run(cfg)  # compile
            best = float("inf")
            for _ in range(iters):
                t0 = time.perf_counter()
                run(cfg)
                best = min(best, time.perf_counter() - t0)
        except Exception as err:  # noqa: BLE001 - a failing candidate is skipped, and said so
            print(f"# autotune: {cfg} failed: {type(err).__name__}: {str(err).splitlines()[0][:120]}")
            continue
        results.append((cfg, best))
    return sorted(results, key=lambda r: r[1])
