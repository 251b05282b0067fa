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

The metadata is what JupyterLab itself writes when it saves a notebook (the
kernelspec's name, display name and language from the kernel's own spec,
``language_info`` from the kernel's info reply, nbformat 4.5 with cell ids),
so that opening and saving a committed notebook in JupyterLab leaves it
unchanged (``tests/integration/test_notebooks.py`` checks the committed files;
``scripts/check_notebooks_in_browser.py`` does it in a real JupyterLab).
Widget state (ipywidgets' saved state, as nbclient records it) is kept, so a
widget such as notebook 10's panel renders when the notebook is opened
without running it; its model ids are renumbered deterministically. After
rerunning notebook 10, refresh the picture of its panel (what a reader sees
before running it): ``python scripts/check_notebooks_in_browser.py 10
--panel-picture`` (docs/notebooks.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
NBFORMAT_MINOR = 5  # what JupyterLab 4 writes (it raises older minor versions to 5 and adds cell ids)


def kernelspec(name: str = "python3") -> dict:
    """The ``kernelspec`` metadata JupyterLab writes for kernel ``name``: its
    name and the display name and language of its installed spec."""
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec(name)
    return {"display_name": spec.display_name, "language": spec.language, "name": name}


def widget_ids(nb) -> list[str]:
    """The widget model ids of ``nb``'s saved widget state, in order."""
    return list(nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {}))


def renumber_widgets(nb, stem: str):
    """``nb`` with its widget model ids (state keys, ``IPY_MODEL_`` references,
    widget-view outputs) replaced by ids derived from ``stem`` and their
    order, so that a rerun does not rewrite them all."""
    ids = widget_ids(nb)
    if not ids:
        return nb
    text = json.dumps(nb)
    for i, old in enumerate(ids):
        text = text.replace(old, uuid.uuid5(uuid.NAMESPACE_URL, f"mx-proxy/notebooks/{stem}/widget/{i}").hex)
    return nbformat.from_dict(json.loads(text))


def normalize(nb, stem: str = "notebook", kernel: dict | None = None):
    """``nb`` normalized as JupyterLab saves it (see the module docstring):
    no execution timestamps, code cells numbered from 1, cell ids kept
    (added where missing), kernelspec from the installed kernel spec
    (``kernel`` overrides it), widget model ids renumbered."""
    nb.nbformat, nb.nbformat_minor = 4, max(nb.get("nbformat_minor", 0), NBFORMAT_MINOR)
    nb.metadata["kernelspec"] = kernel or kernelspec(nb.metadata.get("kernelspec", {}).get("name", "python3"))
    n = 0
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if not cell.get("id"):
            cell["id"] = uuid.uuid4().hex[:8]
        if cell.cell_type == "code":
            n += 1
            cell.execution_count = n
            for out in cell.get("outputs", []):
                if "execution_count" in out:
                    out["execution_count"] = n
                out.get("metadata", {}).pop("execution", None)
    return renumber_widgets(nb, stem)


def inject(nb, **values) -> None:
    (cell,) = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    lines = [f"{k} = {v!r}" for k, v in values.items() if v is not None and f"{k} =" in cell.source]
    if lines:
        cell.source = cell.source.rstrip() + "\n# injected by scripts/run_notebooks.py\n" + "\n".join(lines)


def selected(only) -> list[Path]:
    """The committed notebooks whose names start with one of ``only`` (all of them when empty)."""
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    return [q for q in paths if any(q.name.startswith(o) for o in only)] if only else paths


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("only", nargs="*", help="notebook number prefixes (default: all)")
    p.add_argument("--scale", help="override SCALE (smoke, quick, medium, paper)")
    p.add_argument("--store", help="override STORE (a run-store folder)")
    p.add_argument("--timeout", type=int, default=7200, help="seconds per cell")
    args = p.parse_args(argv)
    paths = selected(args.only)
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
        nbformat.write(normalize(nb, path.stem), path)
        print(f"{path.name}: {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
