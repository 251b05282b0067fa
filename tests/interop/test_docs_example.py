"""docs/interop.md's Python blocks run as written, top to bottom, and say what their comments say."""

import re
from pathlib import Path

import numpy as np
import pytest

DOC = (Path(__file__).resolve().parents[2] / "docs" / "interop.md").read_text()


@pytest.mark.e2e  # a tour of the guide, as the README's (its quant_table compiles for a minute on a CPU)
def test_the_guides_examples_run_as_written(capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOC, re.S)
    assert len(blocks) == 2
    scope = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/interop.md (block {i + 1})", "exec"), scope)  # noqa: S102 -- the guide's code
    out = capsys.readouterr().out
    assert list(scope["q"].table()["recipe"]) == ["mxfp8_e4m3", "paper_e4m3", "mxfp8_e4m3"]
    assert 0 < float(scope["bias"].zeta) < 1 and float(scope["bias"].cosine) > 0.9
    assert set(scope["table"]["layer"]) == {"norm", "hidden", "out"}
    assert "\n200\n" in out
    rates = scope["instruments"].blowup_rates({"a": [scope["losses"]]})
    assert rates["blowups"].tolist() == [1] and np.isfinite(rates["high"]).all()
