"""Compile Triton IR to NVIDIA machine code with Triton's own compiler, no GPU needed.

Standalone on purpose (it imports ``triton`` and the standard library only,
never jax or this project): ``mx_proxy.pallas.compile_check`` runs it with a Python
that has the ``triton`` package, possibly another environment than jax's.

Input (stdin): a JSON list of jobs ``{"path": TTIR file, "num_warps": int,
"num_stages": int, "capability": 90}``. Output (stdout): one JSON object per
job, in order: ``{"ok": true, "shared": dynamic shared memory bytes (Triton's
allocation), "registers", "spill_stores", "spill_loads", "stack" (bytes,
from ``ptxas -v`` on the PTX Triton produced), "ptxas_smem" (static bytes),
"triton": version, "ptxas": version line}`` or ``{"ok": false, "error": text}``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

_USED = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_SMEM = re.compile(r"(\d+) bytes smem")


def _ptxas_report(ptxas: str, arch: str, ptx: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "kernel.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        proc = subprocess.run([ptxas, "-v", f"--gpu-name={arch}", src, "-o", os.path.join(tmp, "kernel.cubin")],
                              capture_output=True, text=True, check=False)
    log = proc.stdout + proc.stderr
    if proc.returncode:
        raise RuntimeError(f"ptxas failed ({proc.returncode}): {log[-2000:]}")
    used, spill, smem = _USED.search(log), _SPILL.search(log), _SMEM.search(log)
    if not (used and spill):
        raise RuntimeError(f"unexpected ptxas -v output: {log[-2000:]}")
    return {"registers": int(used.group(1)), "stack": int(spill.group(1)), "spill_stores": int(spill.group(2)),
            "spill_loads": int(spill.group(3)), "ptxas_smem": int(smem.group(1)) if smem else 0}


def compile_job(job: dict) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability
    from triton.compiler import compile as triton_compile

    cap = int(job.get("capability", 90))
    kernel = triton_compile(job["path"], target=GPUTarget("cuda", cap, 32),
                            options={"num_warps": int(job["num_warps"]), "num_stages": int(job["num_stages"])})
    ptxas = get_ptxas(cap).path
    version = subprocess.run([ptxas, "--version"], capture_output=True, text=True, check=False).stdout.strip()
    report = _ptxas_report(ptxas, sm_arch_from_capability(cap), kernel.asm["ptx"])
    return {"ok": True, "shared": int(kernel.metadata.shared), **report, "triton": triton.__version__,
            "ptxas": version.splitlines()[-1] if version else ""}


def main() -> int:
    for job in json.loads(sys.stdin.read()):
        try:
            result = compile_job(job)
        except Exception as err:  # noqa: BLE001 - reported per job, the caller decides
            result = {"ok": False, "error": f"{type(err).__name__}: {err}"[-4000:]}
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
