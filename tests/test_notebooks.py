"""Every notebook runs top to bottom at the smoke scale in a real Jupyter kernel, with the kernel's own
(inline) matplotlib backend, and shows its figures as ``image/png`` outputs."""

import ast
import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

from proxy import plots

NOTEBOOKS = sorted(pathlib.Path(__file__).resolve().parent.parent.joinpath("notebooks").glob("[0-9][0-9]_*.ipynb"))

# calls that create one matplotlib figure each: proxy.plots' figure functions and pyplot's figure makers
PLOT_FUNCTIONS = frozenset(n for n in plots.__all__ if callable(getattr(plots, n))) - {"color"}
PYPLOT_FUNCTIONS = frozenset({"subplots", "figure", "subplot_mosaic"})
_NOT_RUN_HERE = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.If, ast.IfExp, ast.Try)


def plot_calls(source: str) -> int:
    """Figure-making calls a code cell runs at least once: ``plots.<figure>(…)``
    (or ``proxy.plots.<figure>``) and ``plt.subplots/figure/subplot_mosaic(…)``.
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
    assert plot_calls("fig = proxy.plots.ln_clamping(runs)\nplots.color('fp32')") == 1
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


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_at_smoke_scale_and_shows_its_figures(path, tmp_path, tmp_path_factory, monkeypatch):
    # kernels share one compilation cache: the notebooks compile many of the same programs
    monkeypatch.setenv("PROXY_COMPILE_CACHE", str(tmp_path_factory.getbasetemp() / "jax-cache"))
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel must pick its own inline backend
    nb = inject_parameters(nbformat.read(path, as_version=4), SCALE="smoke", STORE=str(tmp_path / "runs"),
                           RESULTS=str(path.parent.parent / "results"))
    client = NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [o for c in code for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    missing = [(i, c.source.splitlines()[0], _images(c), plot_calls(c.source)) for i, c in enumerate(code)
               if _images(c) < plot_calls(c.source)]
    assert not missing, f"code cells (index, first line, images, plot calls) showing too few figures: {missing}"
    assert sum(_images(c) for c in code) >= 1, "the notebook shows no figure"


def test_every_notebook_has_one_parameters_cell_and_a_conclusion():
    assert len(NOTEBOOKS) >= 1
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        tagged = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
        assert len(tagged) == 1, path.name
        assert "SCALE =" in tagged[0].source and "STORE =" in tagged[0].source
        assert "os.environ" not in "".join(c.source for c in nb.cells if c.cell_type == "code")
        assert any(c.cell_type == "markdown" and "What this shows" in c.source for c in nb.cells), path.name


def test_notebook_10_builds_and_drives_the_explorer():
    path = NOTEBOOKS[0].parent / "10_explore.ipynb"
    assert path in NOTEBOOKS  # so the smoke-scale test above executes it
    code = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
    for call in ("proxy.explore(", "panel.train()", "panel.snapshot()", "store=STORE"):
        assert call in code, call


def test_notebook_09_compares_seed_003s_systems():
    path = NOTEBOOKS[0].parent / "09_beyond_the_paper.ipynb"
    assert path in NOTEBOOKS  # so the smoke-scale test above executes it
    nb = nbformat.read(path, as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    for call in ("beyond.runs(SCALE, store=STORE)", "beyond.table(", "plots.beyond(", "proxy.recipes.table()", ".events",
                 "beyond.weight_disagreement("):
        assert call in code, call
    assert "**Runtime**" in text and "quick ≈" in text and "GNMR" in text and "nGPT" in text
