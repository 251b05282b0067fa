#!/usr/bin/env python3
"""The README's test command on a fresh clone, timed, with the machine it ran on.

    python scripts/suite_time.py                 # clone HEAD of this checkout into a temporary folder
    python scripts/suite_time.py --keep DIR      # clone into DIR and keep it (its .venv too)
    python scripts/suite_time.py --reuse-venv    # skip the install: the clone uses this checkout's .venv
    python scripts/suite_time.py --compile-log DIR   # and where the test processes' compilation time went
    python scripts/suite_time.py --pytest-args "--junitxml=/tmp/j.xml --durations=0"   # appended to the command
    python scripts/suite_time.py --tier e2e      # the README's end-to-end tier instead (its unit tier is the default)
    python scripts/suite_time.py --warm          # then the same command again on the caches the first run left

The tiers: ``unit`` is the README's test command (the first line of its opening code block that runs pytest),
``e2e`` its end-to-end command (the line that runs ``pytest … -m e2e``), run in the clone after the unit tier's
install (``--reuse-venv`` skips it for both).

Prints one block: the commit, the CPU (model, cores, AVX2/AVX512-BF16/AMX), its measured float32 and bf16
GEMM speed (2048×512 @ 512×2048, the width-512 batch-2048 step's shape, in GFLOP/s, measured after the
tests), the wall time of the test command (its install included), and pytest's last line
(passed/failed/skipped), and the CPU time the command and all its processes used as a share of the wall time
on this machine's cores: a share well under the core count says the workers waited (on subprocesses, on
disk), not computed. The compilation cache starts empty (a fresh machine's), as in CI, so two machines'
times compare: divide by the GEMM speed to see whether a slower suite is a slower CPU or more work. The exit
status is the test command's.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


TIERS = ("unit", "e2e")
"""The README's two test commands: the unit tier (its default run) and the end-to-end tier (``-m e2e``)."""


def readme_test_command(readme: Path, tier: str = "unit") -> str:
    """The README's command for ``tier`` (one of :data:`TIERS`): ``unit``, the first line of its opening code
    block that runs pytest (install and run the tests); ``e2e``, the first that runs pytest with ``-m e2e``."""
    if tier not in TIERS:
        raise ValueError(f"tier={tier!r}; valid: {', '.join(TIERS)}")
    block = readme.read_text().split("```bash", 1)[1].split("```", 1)[0]
    lines = [line.strip() for line in block.splitlines() if "pytest" in line and not line.lstrip().startswith("#")]
    lines = [line for line in lines if bool(re.search(r"-m\s+['\"]?e2e\b", line)) == (tier == "e2e")]
    if not lines:
        raise SystemExit(f"{readme}: no {tier} pytest command in its opening code block")
    return lines[0]


def gemm_gflops(python: str, env: dict) -> dict:
    """f32 (HIGHEST) and bf16 GEMM speed of this CPU in GFLOP/s, measured in a fresh interpreter of ``python``
    with the GEMM timer and the interleaved medians that ``mx-proxy bench step`` measures its roofline with."""
    code = """
from mx_proxy.cli.bench.step import flops, gemm_timer, interleaved_medians
gemm = (None, None, (2048, 512), (512, 2048), (1, 0))
t = interleaved_medians({d: gemm_timer([gemm], 10, d) for d in ("f32", "bf16")}, 5)
for d, s in t.items():
    print(d, 10 * flops(gemm) / s / 1e9)
"""
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(env, PROXY_COMPILE_CACHE="off")).stdout
    return {k: float(v) for k, v in (line.split() for line in out.splitlines() if line.strip())}


def run_timed(command: str, **kwargs) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run the shell ``command`` (``subprocess.run`` keyword arguments ``kwargs``); return (the completed
    process, its wall seconds, the user + system CPU seconds of it and every descendant it waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(command, shell=True, executable="/bin/bash", capture_output=True, text=True, **kwargs)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return proc, wall, cpu


def pytest_summary(stdout: str) -> str:
    """pytest's last line (passed/failed/skipped) in ``stdout``."""
    lines = [line for line in stdout.splitlines() if re.search(r"\b(passed|failed|error)", line)]
    return lines[-1].strip("= ") if lines else "(no summary line)"


def cpu_share(cpu: float, wall: float, cores: int) -> str:
    """``cpu`` CPU-seconds over ``wall`` seconds as cores busy, and as a share of the ``cores`` there are."""
    busy = cpu / wall if wall > 0 else 0.0
    return f"{busy:.2f} of {cores} cores busy on average ({100 * busy / cores:.0f} %; {cpu / 60:.1f} CPU-min)"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keep", metavar="DIR", help="clone into DIR (must not exist) and keep it")
    p.add_argument("--reuse-venv", action="store_true", help="use this checkout's .venv instead of installing")
    p.add_argument("--compile-log", metavar="DIR", help="record compile time per test and per program into DIR "
                   "(new or empty; tests/compile_log.py) and print the summary")
    p.add_argument("--pytest-args", default="", help="extra arguments appended to the README's pytest command")
    p.add_argument("--tier", choices=TIERS, default="unit", help="which of the README's test commands (default unit)")
    p.add_argument("--warm", action="store_true", help="then run the command again on the caches the first left")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from mx_proxy.cli.bench import machine

    where = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="suite-time-")) / "clone"
    if where.exists():
        p.error(f"--keep {where}: the folder exists; name a new one")
    log_dir = Path(args.compile_log).resolve() if args.compile_log else None
    if log_dir is not None and any(log_dir.glob("*.json")):
        p.error(f"--compile-log {args.compile_log}: the folder holds logs of an earlier run (its summary would add "
                f"them up with this one's); name a new or empty folder")
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()
    subprocess.run(["git", "clone", "-q", str(ROOT), str(where)], check=True)
    cache = tempfile.mkdtemp(prefix="suite-time-cache-")
    env = dict(os.environ, PROXY_COMPILE_CACHE=cache)
    env.pop("VIRTUAL_ENV", None)
    command = f"{readme_test_command(where / 'README.md', args.tier)} {args.pytest_args}".strip()
    if log_dir is not None:
        env["MX_PROXY_TEST_COMPILE_LOG"] = str(log_dir)
    if args.reuse_venv:
        python = str(ROOT / ".venv" / "bin" / "python")
        command = command.split("&&")[-1].strip().replace("python ", f"{python} ", 1)
        # the venv's editable install points at this checkout: the clone's sources first, in subprocesses too
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(where), env.get("PYTHONPATH")]))
    else:
        python = str(where / ".venv" / "bin" / "python")
        if args.tier == "e2e":  # the end-to-end command runs in the unit tier's environment: install it first
            unit = readme_test_command(where / "README.md", "unit")
            install = unit.rsplit("&&", 1)[0]
            subprocess.run(install, shell=True, executable="/bin/bash", cwd=where, env=env, check=True,
                           capture_output=True)
            command = f". .venv/bin/activate && {command}"
    try:
        proc, wall, cpu = run_timed(command, cwd=where, env=env)
        # warm: the test run again (not the install), on the compilation caches the cold run filled
        again = command if args.reuse_venv else f". .venv/bin/activate && {command.split('&&')[-1].strip()}"
        warm = run_timed(again, cwd=where, env=env) if args.warm else None
        speed = gemm_gflops(python, env)  # after the command: it installed the clone into its venv
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    what = ("pytest only, this checkout's venv" if args.reuse_venv
            else "pytest only, after the unit tier's install" if args.tier == "e2e" else "venv, install, pytest")
    here = machine.cpu()
    print(f"commit: {commit}\ncpu: {machine.describe(here)}\n"
          f"gemm 2048x512x2048: f32 {speed['f32']:.0f} GFLOP/s, bf16 {speed['bf16']:.0f} GFLOP/s\n"
          f"README {args.tier} tier, cold ({what}; empty compilation cache): {wall / 60:.1f} min\n"
          f"cpu used: {cpu_share(cpu, wall, here['cores'])}\n"
          f"pytest: {pytest_summary(proc.stdout)}")
    if warm is not None:
        wproc, wwall, wcpu = warm
        print(f"README {args.tier} tier, warm (pytest again on the caches of the cold run): {wwall / 60:.1f} min\n"
              f"cpu used: {cpu_share(wcpu, wwall, here['cores'])}\n"
              f"pytest: {pytest_summary(wproc.stdout)}")
        proc = proc if proc.returncode else wproc
    if log_dir is not None:
        sys.path.insert(0, str(where / "tests"))
        from compile_log import summary as compile_summary

        print(compile_summary(log_dir))
    if proc.returncode:
        print(proc.stdout[-4000:] + proc.stderr[-2000:], file=sys.stderr)
    if not args.keep:
        shutil.rmtree(where.parent, ignore_errors=True)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
