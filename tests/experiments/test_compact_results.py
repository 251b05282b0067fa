"""Committed results read the same in either table format (store/tables.py): copies of three committed result
folders (a branch ensemble with its history and twin, a seed ensemble, a campaign) are written back in the legacy
format they were committed in, reported and loaded, converted with ``python -m mx_proxy.store.compact``'s
function, and reported and loaded again: the report's text is the same string, and every table a report or a
figure is drawn from (each member's metrics, the outcomes, rates, survival curves, warning signals) the same
values, NaN at the same positions."""

import io
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mx_proxy.experiments import campaign, ensemble_result, report, signals
from mx_proxy.experiments.ensemble_spec import read_history
from mx_proxy.store import compact, tables

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ["results/ensembles/fig7-6000-gpu", "results/unstable_search/w256-d4-lr0.003", "results/medium"]


def _legacy_copy(src: Path, dst: Path) -> Path:
    """``src`` copied to ``dst`` with every table file written as ``DataFrame.to_parquet`` wrote it before."""
    shutil.copytree(src, dst)
    for f in compact.table_files([dst]):
        tables.read(f).to_parquet(f, index=False)
        assert tables.format_of(f) == "legacy"
    return dst


def _what_is_drawn(folder: Path) -> dict:
    """Every table the report and the figures of ``folder`` are computed from, by name."""
    if not (folder / "ensemble.json").exists():
        return {f"run {r.info['label']}": r.metrics for r in campaign.load_results(folder)}
    result = ensemble_result.load(folder)
    history = read_history(folder)
    out = {f"member {arm} {i}": r.metrics for arm, runs in result.runs.items() for i, r in enumerate(runs)
           if r is not None}
    out.update(outcomes=result.table, rates=result.rates(), signals=signals.labelled(result, history))
    out.update({f"survival {arm}": result.survival(arm) for arm in result.rates()["arm"]})
    if history is not None:
        out["history"] = history
    return out


@pytest.mark.parametrize("name", FOLDERS)
def test_a_committed_result_reports_and_draws_the_same_after_conversion(tmp_path, name):
    folder = _legacy_copy(ROOT / name, tmp_path / Path(name).name)
    text, drawn = report.for_folder(folder), _what_is_drawn(folder)
    count, before, after, damaged = compact.convert([folder], out=io.StringIO())
    assert count == len(compact.table_files([folder])) > 0 and damaged == [] and after < before
    assert {tables.format_of(f) for f in compact.table_files([folder])} == {"compact-1"}
    assert report.for_folder(folder) == text
    again = _what_is_drawn(folder)
    assert again.keys() == drawn.keys()
    for key, frame in drawn.items():
        numeric = [c for c in frame.columns if isinstance(frame[c].dtype, np.dtype) and frame[c].dtype.kind in "fiu"]
        assert tables.same(again[key][numeric].reset_index(drop=True), frame[numeric].reset_index(drop=True)), key
        pd.testing.assert_frame_equal(again[key], frame, check_exact=True, obj=key)
