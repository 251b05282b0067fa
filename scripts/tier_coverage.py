#!/usr/bin/env python3
"""Line coverage of ``mx_proxy`` per package, for the unit tier and for both tiers together.

    python scripts/tier_coverage.py                       # run both tiers under coverage.py, print the table
    python scripts/tier_coverage.py --data DIR            # keep the data files in DIR (default: a temporary folder)
    python scripts/tier_coverage.py --from DIR            # only print the table of an earlier run's DIR
    python scripts/tier_coverage.py --pytest-args "-n 2"  # instead of the README's "-n 3 --dist worksteal"

Runs the README's two test commands' pytest part (the unit tier, then ``-m e2e``) with pytest-cov
(``--cov=mx_proxy``), the unit tier into ``DIR/unit.coverage`` and both into ``DIR/both.coverage`` (the
unit data combined with the end-to-end tier's), and prints a Markdown table: per package (``mx_proxy/<pkg>``,
the top-level modules as ``mx_proxy``) its statements, the covered share in the unit tier and in both, and
the difference, then every module the unit tier leaves at 0 % that both tiers cover. Lines run only in
subprocesses the tests start (the CLI in a fresh interpreter, notebook kernels, the GPU scripts) are not
measured by either: the table compares the tiers, it is not the suite's whole coverage. The exit status is
1 when a package loses more than ``--max-loss`` points (default 5) to the split or a module drops to 0 %.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIERS = {"unit": [], "e2e": ["-m", "e2e"]}


def run_tier(tier: str, data: Path, pytest_args: list[str], append: bool) -> int:
    """pytest for ``tier`` under coverage into the data file ``data`` (appending to it: ``append``)."""
    cmd = [sys.executable, "-m", "pytest", "-q", *pytest_args, *TIERS[tier], "--cov=mx_proxy", "--cov-report=",
           *(["--cov-append"] if append else [])]
    env = {**os.environ, "COVERAGE_FILE": str(data)}
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


def per_file(data: Path) -> dict[str, tuple[int, int]]:
    """``{path relative to the repo: (statements, statements executed)}`` of the data file ``data``."""
    import coverage

    cov = coverage.Coverage(data_file=str(data))
    cov.load()
    out = {}
    for name in cov.get_data().measured_files():
        rel = Path(name).resolve().relative_to(ROOT) if Path(name).resolve().is_relative_to(ROOT) else None
        if rel is None or rel.parts[0] != "mx_proxy":
            continue
        _, statements, _, missing, _ = cov.analysis2(name)
        out[str(rel)] = (len(statements), len(statements) - len(missing))
    return out


def package(rel: str) -> str:
    parts = Path(rel).parts
    return "mx_proxy" if len(parts) == 2 else f"mx_proxy/{parts[1]}"


def table(unit: dict, both: dict, max_loss: float) -> tuple[str, bool]:
    """The Markdown table of the two tiers' coverage per package, and whether the split stays within
    ``max_loss`` points everywhere with no module at 0 % in the unit tier that both tiers cover."""
    sums = collections.defaultdict(lambda: [0, 0, 0])
    for rel, (n, hit) in both.items():
        s = sums[package(rel)]
        s[0] += n
        s[1] += unit.get(rel, (n, 0))[1]
        s[2] += hit
    lines = ["| package | statements | unit tier | both tiers | lost to the split |", "|---|---:|---:|---:|---:|"]
    ok = True
    for pkg in sorted(sums):
        n, u, b = sums[pkg]
        pu, pb = (100 * u / n, 100 * b / n) if n else (100.0, 100.0)
        ok &= pb - pu <= max_loss
        lines.append(f"| `{pkg}` | {n} | {pu:.1f} % | {pb:.1f} % | {pb - pu:.1f} points |")
    zero = [rel for rel, (n, hit) in sorted(both.items()) if n and hit and unit.get(rel, (n, 0))[1] == 0]
    lines.append("")
    lines.append("Modules at 0 % in the unit tier that the end-to-end tier covers: "
                 + (", ".join(f"`{z}`" for z in zero) if zero else "none") + ".")
    return "\n".join(lines), ok and not zero


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", metavar="DIR", help="where the coverage data files go (default: a temporary folder)")
    p.add_argument("--from", dest="source", metavar="DIR", help="print the table of an earlier run's data only")
    p.add_argument("--pytest-args", default="-n 3 --dist worksteal", help="pytest options of both runs")
    p.add_argument("--max-loss", type=float, default=5.0, help="points a package may lose to the split")
    args = p.parse_args(argv)
    if args.source:
        folder = Path(args.source)
        missing = [f for f in ("unit.coverage", "both.coverage") if not (folder / f).is_file()]
        if missing:
            p.error(f"--from {args.source}: no {' or '.join(missing)} there (a run of this script writes both)")
    else:
        folder = Path(args.data or tempfile.mkdtemp(prefix="tier-coverage-"))
        folder.mkdir(parents=True, exist_ok=True)
        extra = args.pytest_args.split()
        rc = run_tier("unit", folder / "unit.coverage", extra, append=False)
        (folder / "both.coverage").write_bytes((folder / "unit.coverage").read_bytes())
        rc = run_tier("e2e", folder / "both.coverage", extra, append=True) or rc
        if rc:
            print(f"tier coverage: a tier failed (exit status {rc}); the table counts what ran", file=sys.stderr)
    text, ok = table(per_file(folder / "unit.coverage"), per_file(folder / "both.coverage"), args.max_loss)
    print(f"coverage data: {folder}\n\n{text}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
