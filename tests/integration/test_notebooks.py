"""Every notebook runs top to bottom at the smoke scale in a real Jupyter kernel, with the kernel's own
(inline) matplotlib backend, and shows its figures as ``image/png`` outputs; notebook 10's results follow
its panel's Train button; every committed notebook is saved as JupyterLab saves it (so that opening and
saving one leaves it unchanged), and notebook 10 carries its panel's widget state."""

import ast
import base64
import functools
import json
import pathlib
import re
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient

from mx_proxy.viz import plots
from mx_proxy.viz.explore import TEXT_REPR

NOTEBOOKS = sorted(pathlib.Path(__file__).resolve().parents[2].joinpath("notebooks").glob("[0-9][0-9]_*.ipynb"))

# calls that create one matplotlib figure each: mxp.plots' figure functions and pyplot's figure makers
PLOT_FUNCTIONS = frozenset(n for n in plots.__all__ if callable(getattr(plots, n))) - {"color"}
PYPLOT_FUNCTIONS = frozenset({"subplots", "figure", "subplot_mosaic"})
_NOT_RUN_HERE = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.If, ast.IfExp, ast.Try)


def plot_calls(source: str) -> int:
    """Figure-making calls a code cell runs at least once: ``plots.<figure>(…)``
    (or ``mxp.plots.<figure>``) and ``plt.subplots/figure/subplot_mosaic(…)``.
    Calls inside a def, lambda, class, if or try are not counted (they may
    not run in this cell); a call in a loop counts once (a lower bound)."""
    from IPython.core.inputtransformer2 import TransformerManager

    tree = ast.parse(TransformerManager().transform_cell(source))

    def count(node) -> int:
        if isinstance(node, _NOT_RUN_HERE):
            return 0
        n = 0
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner, name = node.func.value, node.func.attr
            owner_name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", None)
            if (owner_name == "plots" and name in PLOT_FUNCTIONS) or (owner_name == "plt" and name in PYPLOT_FUNCTIONS):
                n = 1
        return n + sum(count(child) for child in ast.iter_child_nodes(node))

    return sum(count(stmt) for stmt in tree.body)


def test_plot_calls_counts_what_runs():
    assert plot_calls("plots.sawtooth('fp8_e4m3');") == 1
    assert plot_calls("fig = mxp.plots.ln_clamping(runs)\nplots.color('fp32')") == 1
    assert plot_calls("for r in runs:\n    plt.subplots()\nfig, ax = plt.subplots(2)") == 2
    assert plot_calls("def f():\n    plots.lr_sweep(runs)\nif x:\n    plt.figure()") == 0
    assert plot_calls("%matplotlib inline\nplots.ablations(runs);") == 1


def inject_parameters(nb, **values):
    """``nb`` with ``values`` assigned at the end of its parameters cell (as
    papermill does): the notebook's own knobs, overridden for a test run."""
    (cell,) = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    names = {n for n in values if f"{n} =" in cell.source}
    cell.source += "\n# injected by the test\n" + "\n".join(f"{n} = {values[n]!r}" for n in values if n in names)
    return nb


def _images(cell) -> int:
    return sum("image/png" in o.get("data", {}) for o in cell.get("outputs", []))


def _smoke_client(path, tmp_path, monkeypatch):
    """(notebook, client): ``path`` with its parameters set to the smoke scale and a tmp store, and an
    nbclient client for it."""
    # the kernels inherit the suite's compilation cache ($PROXY_COMPILE_CACHE, else the user's): the notebooks
    # compile many of the programs that the figures command and the other notebooks compile, on either worker
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel must pick its own inline backend
    nb = inject_parameters(nbformat.read(path, as_version=4), SCALE="smoke", STORE=str(tmp_path / "runs"),
                           RESULTS=str(path.parent.parent / "results"))
    return nb, NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})


def _assert_ran_and_shows_its_figures(nb):
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [o for c in code for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    missing = [(i, c.source.splitlines()[0], _images(c), plot_calls(c.source)) for i, c in enumerate(code)
               if _images(c) < plot_calls(c.source)]
    assert not missing, f"code cells (index, first line, images, plot calls) showing too few figures: {missing}"
    assert sum(_images(c) for c in code) >= 1, "the notebook shows no figure"


EXPLORE = NOTEBOOKS[0].parent / "10_explore.ipynb"


@pytest.mark.e2e
@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p != EXPLORE], ids=lambda p: p.stem)
def test_notebook_runs_at_smoke_scale_and_shows_its_figures(path, tmp_path, monkeypatch):
    nb, client = _smoke_client(path, tmp_path, monkeypatch)
    client.execute()
    _assert_ran_and_shows_its_figures(nb)


def _results_cell(nb) -> int:
    (i,) = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "panel.table()" in c.source]
    return i


def _output(cell, mime: str) -> str:
    (text,) = [o["data"][mime] for o in cell.outputs if mime in o.get("data", {})]
    return text


@pytest.mark.e2e
def test_notebook_10_runs_and_its_results_follow_the_train_button(tmp_path, monkeypatch):
    """Notebook 10 top to bottom at the smoke scale (as the other notebooks), then, in the same kernel, Train
    pressed with another seed and step count and the results cell rerun: it shows the new runs (panel.runs)."""
    nb, client = _smoke_client(EXPLORE, tmp_path, monkeypatch)
    results = _results_cell(nb)
    with client.setup_kernel():
        for i, cell in enumerate(nb.cells):
            client.execute_cell(cell, i)
        _assert_ran_and_shows_its_figures(nb)
        first = (_output(nb.cells[results], "text/html"), _output(nb.cells[results], "text/markdown"))
        press = nbformat.v4.new_code_cell('panel.controls["seed"].value = 1\n'
                                          'panel.controls["steps"].value = 60\n'
                                          'panel.button.click()  # pressing Train: it trains in its own thread\n'
                                          'assert panel.wait(600)')
        probe = nbformat.v4.new_code_cell("import json\nprint(json.dumps(dict(html=panel.table()._repr_html_(), "
                                          "markdown=panel.conclusions(), status=panel.status.value, "
                                          "shown=panel.results.value, "
                                          "runs=[(r.config.seed, len(r.metrics)) for r in panel.runs])))")
        nb.cells += [press, probe]
        client.execute_cell(press, len(nb.cells) - 2)
        client.execute_cell(nb.cells[results], results)  # the reader reruns the results cell
        client.execute_cell(probe, len(nb.cells) - 1)
    assert not [o for c in (press, probe, nb.cells[results]) for o in c.outputs if o.output_type == "error"]
    latest = json.loads("".join(o["text"] for o in probe.outputs if o.output_type == "stream"))
    assert latest["runs"] == [[1, 60], [1, 60]], latest["status"]  # FP32 and the MX recipe, seed 1, 60 steps
    second = (_output(nb.cells[results], "text/html"), _output(nb.cells[results], "text/markdown"))
    assert second == (latest["html"], latest["markdown"])  # the results cell shows panel.runs
    assert "seed 0, 100 steps:" in first[1] and "seed 1, 60 steps:" in second[1]
    assert first[0] != second[0]
    assert "seed 1, 60 steps:" in latest["shown"]  # the panel itself shows the new results


def test_every_notebook_has_one_parameters_cell_and_a_conclusion():
    assert len(NOTEBOOKS) >= 1
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        tagged = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
        assert len(tagged) == 1, path.name
        assert "SCALE =" in tagged[0].source and "STORE =" in tagged[0].source
        assert "os.environ" not in "".join(c.source for c in nb.cells if c.cell_type == "code")
        assert any(c.cell_type == "markdown" and "What this shows" in c.source for c in nb.cells), path.name
        first = nb.cells[0]  # states its runtime at its default scale, measured on a 2-core CPU
        assert first.cell_type == "markdown" and "**Runtime**" in first.source, path.name
        assert re.search(r"measured on a 2-core CPU.*quick ≈ \d", first.source, flags=re.S), path.name


def test_notebook_10_builds_and_drives_the_explorer():
    assert EXPLORE in NOTEBOOKS  # so the smoke-scale test above executes it
    nb = nbformat.read(EXPLORE, as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    for call in ("mxp.explore(", "panel.train()", "panel.snapshot()", "store=STORE", "panel.table()",
                 "panel.conclusions()"):
        assert call in code, call
    # the results cell reads the panel, not a variable an earlier cell set
    names = {n.id for n in ast.walk(ast.parse(nb.cells[_results_cell(nb)].source)) if isinstance(n, ast.Name)}
    assert names <= {"display", "Markdown", "panel"}, names


WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def test_notebook_10_as_committed_shows_its_panel():
    """The committed panel needs no kernel: its cell keeps the panel's one-line text (no widget view, no saved
    widget state: without a kernel they render a placeholder or a disconnected widget), and the markdown cell
    under it shows a picture of the live panel (scripts/check_notebooks_in_browser.py --panel-picture)."""
    nb = json.loads(EXPLORE.read_text(encoding="utf-8"))
    assert "widgets" not in nb["metadata"]
    (i,) = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code" and "mxp.explore(" in "".join(c["source"])]
    (out,) = nb["cells"][i]["outputs"]
    assert out["data"] == {"text/plain": [TEXT_REPR]} or "".join(out["data"]["text/plain"]) == TEXT_REPR
    assert set(out["data"]) == {"text/plain"}
    picture = nb["cells"][i + 1]
    source = "".join(picture["source"])
    assert picture["cell_type"] == "markdown" and "](attachment:panel.png)" in source
    assert "run the cells to use it" in source
    png = base64.b64decode(picture["attachments"]["panel.png"]["image/png"])
    assert png.startswith(b"\x89PNG") and len(png) > 20_000


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_committed_output_needs_a_kernel_or_shows_an_unfinished_bar(path):
    """What a reader sees without running anything: no widget (views or saved state render a placeholder, a
    "0/3000" bar or a disconnected widget without their kernel), and every progress line finished, as the
    runner writes it in a kernel ("fp32: 3000/3000 steps [02:10]")."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    assert "widgets" not in nb["metadata"]
    texts = []
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            assert WIDGET_VIEW not in out.get("data", {}), cell["source"][:2]
            texts += ["".join(out.get("text", []))] + ["".join(v) for k, v in out.get("data", {}).items()
                                                        if k.startswith("text/")]
    shown = "\n".join(texts)
    for placeholder in ("HBox(children", "VBox(children", "FloatProgress", "IntProgress", "model not found",
                        "Loading widget"):
        assert placeholder not in shown
    bars = re.findall(r"^(.+?): (\d+)/(\d+) steps \[([\d:]+)\](, \d+ diverged)?$", shown, flags=re.M)
    for desc, done, total, _, diverged in bars:
        assert done == total or diverged, (desc, done, total)
    assert not re.search(r"(?<![\d.])0/\d+ ?(steps)? ?\[", shown)


_METADATA = """
import json
from ipykernel.ipkernel import IPythonKernel
from ipykernel.kernelspec import get_kernel_dict
spec = get_kernel_dict()
print(json.dumps({"kernelspec": {"display_name": spec["display_name"], "language": spec["language"],
                                 "name": "python3"}, "language_info": dict(IPythonKernel.language_info)}))
"""


@functools.cache
def _metadata_json() -> str:
    # asked of a fresh interpreter, as a kernel would start: another test in this worker may have swapped or
    # removed modules (ipywidgets, ipykernel) in sys.modules
    out = subprocess.run([sys.executable, "-c", _METADATA], capture_output=True, text=True, timeout=300, check=True)
    return out.stdout.strip().splitlines()[-1]


def _jupyterlab_metadata() -> dict:
    """The notebook metadata JupyterLab 4 writes for the python3 kernel: the kernelspec with ipykernel's display
    name and language, and ipykernel's ``language_info`` (its ``version`` is the kernel's Python's)."""
    return json.loads(_metadata_json())


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_as_jupyterlab_saves_it(path):
    """What JupyterLab 4.6 writes when a reader opens and saves a notebook (found by doing it:
    scripts/check_notebooks_in_browser.py): the kernelspec and language_info of the running ipykernel,
    nbformat 4.5 with an id on every cell, nbformat's own serialization. A committed notebook that
    differs from it is marked modified on opening and rewritten on saving."""
    text = path.read_text(encoding="utf-8")
    nb = json.loads(text)
    expected = _jupyterlab_metadata()
    assert (nb["nbformat"], nb["nbformat_minor"]) == (4, 5)
    assert set(nb["metadata"]) <= {"kernelspec", "language_info", "widgets"}, sorted(nb["metadata"])
    assert nb["metadata"]["kernelspec"] == expected["kernelspec"]
    info = dict(nb["metadata"]["language_info"])
    version = info.pop("version")
    assert re.fullmatch(r"3\.\d+\.\d+", version), version
    assert info == {k: v for k, v in expected["language_info"].items() if k != "version"}
    ids = [c.get("id") for c in nb["cells"]]
    assert all(ids) and len(set(ids)) == len(ids), "every cell has its own id"
    assert all(re.fullmatch(r"[a-zA-Z0-9-_]{1,64}", i) for i in ids)
    assert not [c for c in nb["cells"] if "execution" in c.get("metadata", {})], "no execution timestamps"
    assert text == nbformat.writes(nbformat.reads(text, as_version=nbformat.NO_CONVERT)) + "\n"


def test_notebooks_were_executed_by_one_python():
    """language_info's version is the executing kernel's Python (JupyterLab rewrites it to the reader's):
    one version across the committed notebooks, so a reader on that Python gets no diff anywhere."""
    versions = {json.loads(p.read_text(encoding="utf-8"))["metadata"]["language_info"]["version"] for p in NOTEBOOKS}
    assert len(versions) == 1, versions


def test_normalize_writes_the_jupyterlab_metadata(tmp_path):
    """scripts/run_notebooks.py's normalize: the installed kernelspec, cell ids kept or added, cells numbered
    from 1, streams as JupyterLab stores them (a carriage return overwrites the line), no widget view or widget
    state (they render nothing but a placeholder without a kernel), or with ``widgets=True`` their model ids
    renumbered the same way on every run."""
    sys.path.insert(0, str(EXPLORE.parent.parent / "scripts"))
    try:
        import run_notebooks
    finally:
        sys.path.pop(0)
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"display_name": "Python 3", "language": "python",
                                                           "name": "python3"}})
    nb.nbformat_minor = 4
    a, b = "a" * 32, "b" * 32
    nb.metadata["widgets"] = {WIDGET_STATE: {"state": {a: {"model_name": "LayoutModel", "state": {}},
                                                       b: {"model_name": "VBoxModel",
                                                           "state": {"layout": f"IPY_MODEL_{a}"}}},
                                             "version_major": 2, "version_minor": 0}}
    cell = nbformat.v4.new_code_cell("panel", execution_count=7, outputs=[nbformat.v4.new_output(
        "execute_result", {WIDGET_VIEW: {"model_id": b, "version_major": 2, "version_minor": 0}, "text/plain": "x"},
        execution_count=7)])
    del cell["id"]
    bar = nbformat.v4.new_code_cell("train()", outputs=[nbformat.v4.new_output(
        "stream", name="stderr", text="fp32:  10%|#  | 10/100\rfp32: 100%|###| 100/100\ndone\r\n")])
    nb.cells = [nbformat.v4.new_markdown_cell("# t"), cell, bar]
    plain = run_notebooks.normalize(nbformat.from_dict(json.loads(json.dumps(nb))), "t",
                                    kernel=_jupyterlab_metadata()["kernelspec"])
    assert "widgets" not in plain.metadata and WIDGET_VIEW not in json.dumps(plain.cells)
    assert plain.cells[1].outputs[0].data == {"text/plain": "x"}
    assert plain.cells[2].outputs[0].text == "fp32: 100%|###| 100/100\ndone\n"
    out = run_notebooks.normalize(nb, "t", kernel=_jupyterlab_metadata()["kernelspec"], widgets=True)
    assert out.metadata.kernelspec == _jupyterlab_metadata()["kernelspec"] and out.nbformat_minor == 5
    assert all(c.get("id") for c in out.cells)
    assert out.cells[1].execution_count == out.cells[1].outputs[0].execution_count == 1
    new_a, new_b = run_notebooks.widget_ids(out)
    assert {new_a, new_b}.isdisjoint({a, b})
    assert out.metadata.widgets[WIDGET_STATE]["state"][new_b]["state"]["layout"] == f"IPY_MODEL_{new_a}"
    assert out.cells[1].outputs[0].data[WIDGET_VIEW]["model_id"] == new_b
    again = run_notebooks.normalize(nbformat.from_dict(json.loads(json.dumps(out))), "t",
                                    kernel=_jupyterlab_metadata()["kernelspec"], widgets=True)
    assert run_notebooks.widget_ids(again) == [new_a, new_b]  # stable: a rerun does not rewrite the ids


def test_notebook_09_compares_the_systems():
    path = NOTEBOOKS[0].parent / "09_beyond_the_paper.ipynb"
    assert path in NOTEBOOKS  # so the smoke-scale test above executes it
    nb = nbformat.read(path, as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    for call in ("systems.runs(SCALE, store=STORE)", "systems.table(", "plots.systems(", "mxp.recipes.table()",
                 ".events", "systems.weight_disagreement("):
        assert call in code, call
    assert "**Runtime**" in text and "quick ≈" in text and "GNMR" in text and "nGPT" in text


def test_the_figure_check_ignores_text_and_nothing_else():
    """scripts/notebook_figures.compare, what ``run_notebooks.py --check`` judges a committed figure by: another
    title or label (font rendering, a changed number) is no difference; a moved legend, another colour or a line
    with other data is."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sys.path.insert(0, str(EXPLORE.parent.parent / "scripts"))
    try:
        import notebook_figures
    finally:
        sys.path.pop(0)

    def draw(title="loss", loc="upper right", color="C0", y=(3, 2, 1.5, 1.2)):
        fig, ax = plt.subplots(figsize=(4, 3))
        ax.plot([0, 1, 2, 3], y, color=color, label="mxfp8_e4m3")
        ax.plot([0, 1, 2, 3], [3, 2.5, 2, 1.9], color="k", label="fp32")
        ax.legend(loc=loc)
        ax.set_title(title)
        png, bare = notebook_figures.render(fig), notebook_figures.render(fig, textless=True)
        plt.close(fig)
        return png, bare

    committed, _ = draw()
    assert notebook_figures.compare(committed, *draw())[0]
    assert notebook_figures.compare(committed, *draw(title="LOSS"))[0]  # text alone
    for change in (dict(loc="lower left"), dict(color="C3"), dict(y=(3, 2, 1.5, 1.3))):
        same, why = notebook_figures.compare(committed, *draw(**change))
        assert not same and "pixels outside text differ" in why, change
    assert not notebook_figures.compare(committed, draw(title="LOSS")[0], None)[0]  # unmasked, text counts too
