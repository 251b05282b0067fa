#!/usr/bin/env python
"""Execute the notebooks in place, so the committed copies show their figures and tables; or check them.

    python scripts/run_notebooks.py                 # every notebooks/[0-9][0-9]_*.ipynb at its own SCALE (quick)
    python scripts/run_notebooks.py 02 04 --scale smoke --store /tmp/runs
    python scripts/run_notebooks.py --check         # rerun each at its stated scale, compare, write nothing

``--check`` executes each notebook as it is committed (its own SCALE and
STORE; runs already in the store load, others train) and compares the
result, normalized the same way, with the committed file: every output but
the figures must be identical, and every figure must match what the current
code draws in every pixel but those of text (``scripts/notebook_figures.py``:
font rendering is not a difference, a moved legend, a colour, a line style or
other data is). It exits 1 naming each difference, 0 if a rerun and save
would leave ``git diff`` empty.

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
A live widget is not kept: a widget's view and saved state render nothing
but a placeholder without its kernel, so a widget output keeps only its
text (notebook 10's panel: a line pointing at the picture under it) and no
widget state is saved. Text streams are stored as JupyterLab stores them
(a carriage return overwrites the line). After rerunning notebook 10,
refresh the picture of its panel (a screenshot of the live panel in
JupyterLab): ``python scripts/check_notebooks_in_browser.py 10
--panel-picture`` (docs/notebooks.md).
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from notebook_figures import RECORD_TEXTLESS, compare, textless_path  # scripts/ is this script's sys.path[0]

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
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


def overwrite_carriage_returns(text: str) -> str:
    """``text`` as a terminal (and JupyterLab, when it stores a stream) shows
    it: on each line, what follows a carriage return overwrites the line
    from its start."""
    lines = []
    for line in text.split("\n"):
        shown = ""
        for part in line.split("\r"):
            shown = part + shown[len(part):]
        lines.append(shown)
    return "\n".join(lines)


def merged_streams(outputs: list) -> list:
    """``outputs`` with consecutive outputs of one stream joined into one (as JupyterLab stores them)."""
    merged = []
    for out in outputs:
        last = merged[-1] if merged else None
        if (out.get("output_type") == "stream" and last is not None and last.get("output_type") == "stream"
                and last.get("name") == out.get("name")):
            last["text"] += out["text"]
            continue
        merged.append(out)
    return merged


def without_widgets(outputs: list) -> list:
    """``outputs`` with every widget view dropped (its other representations kept; an output left empty goes)."""
    kept = []
    for out in outputs:
        data = out.get("data")
        if data is not None and WIDGET_VIEW in data:
            data.pop(WIDGET_VIEW)
            if not data:
                continue
        kept.append(out)
    return kept


def normalize(nb, stem: str = "notebook", kernel: dict | None = None, widgets: bool = False):
    """``nb`` normalized as JupyterLab saves it (see the module docstring):
    no execution timestamps, code cells numbered from 1, cell ids kept
    (added where missing), kernelspec from the installed kernel spec
    (``kernel`` overrides it), streams joined and with carriage returns
    applied, and no widget views or widget state (``widgets=True`` keeps them, model ids
    renumbered)."""
    nb.nbformat, nb.nbformat_minor = 4, max(nb.get("nbformat_minor", 0), NBFORMAT_MINOR)
    nb.metadata["kernelspec"] = kernel or kernelspec(nb.metadata.get("kernelspec", {}).get("name", "python3"))
    if not widgets:
        nb.metadata.pop("widgets", None)
    n = 0
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if not cell.get("id"):
            cell["id"] = uuid.uuid4().hex[:8]
        if cell.cell_type == "code":
            n += 1
            cell.execution_count = n
            cell.outputs = merged_streams(cell.get("outputs", []))
            if not widgets:
                cell.outputs = without_widgets(cell.outputs)
            for out in cell.get("outputs", []):
                if "execution_count" in out:
                    out["execution_count"] = n
                out.get("metadata", {}).pop("execution", None)
                if out.get("output_type") == "stream":
                    out["text"] = overwrite_carriage_returns(out["text"])
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


def execute(path: Path, timeout: int, textless: str | None = None, **values):
    """``path`` executed top to bottom from notebooks/ (``values`` injected
    into its parameters cell, which keeps its committed source), normalized.
    ``textless``: a folder where every figure is also kept without its text
    (``scripts/notebook_figures.py``)."""
    nb = nbformat.read(path, as_version=4)
    original = [c.source for c in nb.cells]
    inject(nb, **values)
    if textless is not None:
        nb.cells.insert(0, nbformat.v4.new_code_cell(RECORD_TEXTLESS.format(folder=textless)))
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    if textless is not None:
        nb.cells.pop(0)
    for cell, src in zip(nb.cells, original):  # keep the committed parameters cell as written
        cell.source = src
    return normalize(nb, path.stem)


def differences(committed, rerun, textless: Path) -> list[str]:
    """What differs between the committed notebook and its rerun (figures compared but for their text)."""
    if [c.source for c in committed.cells] != [c.source for c in rerun.cells]:
        return ["the cells' sources differ (edited since the run?)"]
    found = []
    if committed.metadata != rerun.metadata:
        found.append(f"metadata: {sorted(committed.metadata)} committed, {sorted(rerun.metadata)} now")
    for i, (a, b) in enumerate(zip(committed.cells, rerun.cells)):
        if a.cell_type != "code":
            continue
        outs_a, outs_b = a.get("outputs", []), b.get("outputs", [])
        if [o.output_type for o in outs_a] != [o.output_type for o in outs_b]:
            found.append(f"cell {i}: outputs {[o.output_type for o in outs_a]} committed, "
                         f"{[o.output_type for o in outs_b]} now")
            continue
        for j, (oa, ob) in enumerate(zip(outs_a, outs_b)):
            da, db = oa.get("data", {}), ob.get("data", {})
            for mime in sorted(set(da) | set(db)):
                if mime == "image/png" and mime in da and mime in db:
                    drawn = base64.b64decode(db[mime])
                    bare = textless_path(textless, drawn)
                    same, why = compare(base64.b64decode(da[mime]), drawn, bare.read_bytes() if bare.exists() else None)
                    if not same:
                        found.append(f"cell {i}, output {j}: the figure differs: {why}")
                elif da.get(mime) != db.get(mime):
                    found.append(f"cell {i}, output {j}: {mime} differs: {str(da.get(mime))[:160]!r} committed, "
                                 f"{str(db.get(mime))[:160]!r} now")
            for key in ("text", "name", "ename", "evalue"):
                if oa.get(key) != ob.get(key):
                    found.append(f"cell {i}, output {j}: {key} differs: {str(oa.get(key))[:160]!r} committed, "
                                 f"{str(ob.get(key))[:160]!r} now")
    return found


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("only", nargs="*", help="notebook number prefixes (default: all)")
    p.add_argument("--scale", help="override SCALE (smoke, quick, medium, unstable, paper)")
    p.add_argument("--store", help="override STORE (a run-store folder)")
    p.add_argument("--timeout", type=int, default=7200, help="seconds per cell")
    p.add_argument("--check", action="store_true",
                   help="rerun at the stated scale and compare with the committed files instead of writing them")
    args = p.parse_args(argv)
    paths = selected(args.only)
    if not paths:
        print(f"no notebook matches {args.only}", file=sys.stderr)
        return 2
    if args.check and (args.scale or args.store):
        print("--check reruns each notebook as committed: no --scale or --store", file=sys.stderr)
        return 2
    failed = 0
    for path in paths:
        t0 = time.perf_counter()
        if not args.check:
            nbformat.write(execute(path, args.timeout, SCALE=args.scale, STORE=args.store), path)
            print(f"{path.name}: {time.perf_counter() - t0:.0f} s")
            continue
        with tempfile.TemporaryDirectory(prefix="nb-textless-") as textless:
            rerun = execute(path, args.timeout, textless=textless)
            committed = nbformat.read(path, as_version=4)
            found = differences(committed, rerun, Path(textless))
            same_file = nbformat.writes(rerun) + "\n" == path.read_text(encoding="utf-8")
        failed += bool(found)
        print(f"{path.name}: {'same as committed' if not found else f'{len(found)} difference(s)'}"
              + ("" if same_file or found else " (figures equal but for text: the file would change)")
              + f" ({time.perf_counter() - t0:.0f} s)")
        for line in found:
            print(f"  {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
