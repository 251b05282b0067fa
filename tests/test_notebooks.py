"""Every notebook runs top to bottom at the smoke scale in a real Jupyter kernel."""

import os
import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted(pathlib.Path(__file__).resolve().parent.parent.joinpath("notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_at_smoke_scale(path, tmp_path, tmp_path_factory, monkeypatch):
    monkeypatch.setenv("PROXY_SCALE", "smoke")
    # Kernels share XLA's persistent compilation cache: notebooks compile many of the same programs.
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "jax-cache"))
    monkeypatch.setenv("PROXY_STORE", str(tmp_path / "runs"))  # a fresh run store per notebook
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors


def test_every_notebook_has_one_parameters_cell_and_a_conclusion():
    assert len(NOTEBOOKS) >= 1
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        tagged = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
        assert len(tagged) == 1, path.name
        assert "PROXY_SCALE" in tagged[0].source
        assert any(c.cell_type == "markdown" and "What this shows" in c.source for c in nb.cells), path.name


def test_notebook_09_compares_seed_003s_systems_and_is_committed_without_outputs():
    path = NOTEBOOKS[0].parent / "09_beyond_the_paper.ipynb"
    assert path in NOTEBOOKS  # so the smoke-scale test above executes it
    nb = nbformat.read(path, as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert not any(c.get("outputs") or c.get("execution_count") for c in nb.cells if c.cell_type == "code")
    for call in ("beyond.runs(SCALE)", "beyond.table(", "plots.beyond(", "proxy.recipes.table()", ".events",
                 "beyond.weight_disagreement("):
        assert call in code, call
    assert "**Runtime**" in text and "quick ≈" in text and "GNMR" in text and "nGPT" in text
