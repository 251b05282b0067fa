#!/usr/bin/env python
"""Execute the notebooks in place, so the committed copies show their figures and tables.

    python scripts/run_notebooks.py                 # every notebooks/[0-9][0-9]_*.ipynb at its own SCALE (quick)
    python scripts/run_notebooks.py 02 04 --scale smoke --store /tmp/runs

Each notebook runs top to bottom in a real Jupyter kernel (its inline matplotlib
backend: figures are embedded as PNG), from the notebooks/ folder, so its
``STORE = "../runs"`` is the repository's run store and a rerun loads what is
already trained. ``--scale`` / ``--store`` override the parameters cell (as
papermill would). Outputs are kept; metadata is normalized (no execution
timestamps, cells numbered from 1) so that a rerun changes only what the runs
changed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


def normalize(nb) -> None:
    """Drop volatile metadata: execution timestamps, widget state; renumber cells."""
    nb.metadata.pop("widgets", None)
    n = 0
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        cell.pop("id", None)
        if cell.cell_type == "code":
            n += 1
            cell.execution_count = n
            for out in cell.get("outputs", []):
                if "execution_count" in out:
                    out["execution_count"] = n
                out.get("metadata", {}).pop("execution", None)


def inject(nb, **values) -> None:
    (cell,) = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    lines = [f"{k} = {v!r}" for k, v in values.items() if v is not None and f"{k} =" in cell.source]
    if lines:
        cell.source = cell.source.rstrip() + "\n# injected by scripts/run_notebooks.py\n" + "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("only", nargs="*", help="notebook number prefixes (default: all)")
    p.add_argument("--scale", help="override SCALE (smoke, quick, medium, paper)")
    p.add_argument("--store", help="override STORE (a run-store folder)")
    p.add_argument("--timeout", type=int, default=7200, help="seconds per cell")
    args = p.parse_args(argv)
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if args.only:
        paths = [q for q in paths if any(q.name.startswith(o) for o in args.only)]
        if not paths:
            print(f"no notebook matches {args.only}", file=sys.stderr)
            return 2
    for path in paths:
        t0 = time.perf_counter()
        nb = nbformat.read(path, as_version=4)
        original = [c.source for c in nb.cells]
        inject(nb, SCALE=args.scale, STORE=args.store)
        NotebookClient(nb, timeout=args.timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
        for cell, src in zip(nb.cells, original):  # keep the committed parameters cell as written
            cell.source = src
        normalize(nb)
        nbformat.write(nb, path)
        print(f"{path.name}: {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
