"""``mx-proxy transformer``: a bad scale, recipe or --out exits 2 naming the choices before any training; a run
prints one line per recipe and writes its history; the smoke scale end to end (e2e tier)."""

import dataclasses

import pandas as pd
import pytest

from mx_proxy.cli.main import main
from mx_proxy.experiments import transformer


def _run(argv, capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main(argv))
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


@pytest.mark.parametrize("argv, match", [(["--scale", "big"], "choose from 'smoke', 'quick', 'gpu'"),
                                         (["--scale", "smoke", "--recipes", "mxfp9"], "unknown recipe 'mxfp9'"),
                                         (["--scale", "smoke", "--out", "/nonexistent/h.csv"], "does not exist"),
                                         (["--scale", "smoke", "--out", "h.txt"], ".parquet or .csv")])
def test_bad_input_exits_2_before_any_training(argv, match, capsys, monkeypatch):
    monkeypatch.setattr(transformer, "compare", lambda *a, **k: pytest.fail("trained"))
    code, _, err = _run(["transformer", *argv], capsys)
    assert code == 2 and match in err, err


def test_prints_each_recipe_and_writes_the_history(tmp_path, capsys, monkeypatch):
    tiny = dataclasses.replace(transformer.SCALES["smoke"], depth=1, heads=1, vocab=8, seq_len=8, batch=4, steps=2)
    monkeypatch.setitem(transformer.SCALES, "smoke", tiny)
    out = tmp_path / "h.csv"
    code, text, _ = _run(["transformer", "--scale", "smoke", "--recipes", "fp32", "paper_e4m3", "--out", str(out)],
                         capsys)
    assert code == 0
    lines = [line for line in text.splitlines() if line.split()[:1] in (["fp32"], ["paper_e4m3"])]
    assert len(lines) == 2 and "blow-up none" in lines[0] and "zeta mean -" in lines[0]
    assert "zeta mean 0." in lines[1] and "clamp" not in lines[1]
    history = pd.read_csv(out)
    assert list(history.groupby("recipe", sort=False).size().items()) == [("fp32", 2), ("paper_e4m3", 2)]


@pytest.mark.e2e
def test_smoke_scale_end_to_end(tmp_path, capsys):
    out = tmp_path / "h.parquet"
    code, text, _ = _run(["transformer", "--scale", "smoke", "--quant-stats", "--out", str(out)], capsys)
    assert code == 0
    for name in transformer.RECIPES:
        assert any(line.startswith(name) for line in text.splitlines()), name
    assert "clamp" in text and len(pd.read_parquet(out)) == len(transformer.RECIPES) * transformer.SCALES["smoke"].steps
