"""``scripts/gpu_fig7.sh`` end to end at width 16 (on whatever device this is): from a committed branch ensemble
it replays the state, trains the replica ensemble into ``$OUT`` and prints its report; a second call trains
nothing."""

import dataclasses

import gpu_scripts
import numpy as np
import pytest

import mx_proxy as mxp
from mx_proxy.experiments import ensemble as E
from mx_proxy.experiments import report

pytestmark = pytest.mark.e2e  # runs the real GPU script end to end on the CPU

PARENT = mxp.Config(width=16, depth=2, batch=32, steps=30, lr=3e-3, recipe="paper_e4m3", paired_run=True,
                    diagnostics_every=5, checkpoint_at=(20,))


def _call(work, out, results):
    return gpu_scripts.call("gpu_fig7.sh", 900, work, out, NAME="tiny-gpu", RESULTS=str(results))


def test_gpu_fig7_script_replicates_the_committed_ensemble_and_reports(tmp_path):
    parent = mxp.train(PARENT, store=tmp_path / "parent", progress=False)
    spec = E.Ensemble("tiny", "branch", parent.config, ("unchanged", "twin", "fp32"), 2, 10, branch_at=20,
                      checkpoint_every=10)
    E.run(spec, tmp_path / "old", source=parent, progress=False, log=lambda *_: None)
    committed, out, work = tmp_path / "old" / "results", tmp_path / "out", tmp_path / "work"
    done = _call(work, out, committed)
    gpu_scripts.assert_trained(done, "fig7 replica")
    dest = out / "results" / "ensembles" / "tiny-gpu"
    new, old = mxp.load_ensemble(dest), mxp.load_ensemble(committed)
    assert new.spec == dataclasses.replace(old.spec, name="tiny-gpu")
    for arm in old.runs:  # on this device the replay is the run: the replica equals the committed members
        for a, b in zip(new.runs[arm], old.runs[arm], strict=True):
            np.testing.assert_array_equal(a.metrics["loss"], b.metrics["loss"])
    text = (work / "report.md").read_text()
    assert text == report.for_folder(dest) and text in done.stdout
    again = _call(work, out, committed)  # everything exported: loaded, nothing trained
    assert again.returncode == 0 and "member-step/s" not in again.stderr
