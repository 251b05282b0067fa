"""The ``proxy`` command line: real runs, exit status 2 with a clear message on bad input."""

import json
import subprocess
import sys

import pytest

from proxy.cli import main


def _cli(*args, tmp_path=None):
    env_store = ["--out", str(tmp_path)] if tmp_path is not None else []
    return subprocess.run([sys.executable, "-m", "proxy.cli", *args, *env_store], capture_output=True, text=True,
                          timeout=600)


def test_train_writes_the_run_and_reloads_it(tmp_path):
    args = ("train", "--width", "32", "--depth", "2", "--batch", "32", "--steps", "20", "--val-every", "10",
            "--recipe", "mxfp8_mixed", "--quiet")
    first = _cli(*args, tmp_path=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "mxfp8_mixed" in first.stdout and "20 steps" in first.stdout
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith(".")]
    config = json.loads((folder / "config.json").read_text())
    assert config["recipe"] == "mxfp8_mixed" and config["width"] == 32
    assert (folder / "metrics.parquet").exists()
    again = _cli(*args, tmp_path=tmp_path)
    assert again.returncode == 0 and again.stdout == first.stdout


@pytest.mark.parametrize("args, message", [
    (["train", "--recipe", "mxfp9"], "invalid choice: 'mxfp9'"),
    (["train", "--width", "0"], "width must be a positive integer"),
    (["train", "--lr", "fast"], "invalid float value"),
    (["train", "--val-every", "15"], "multiple of diagnostics_every"),
    (["train", "--act", "elu"], "choose from 'gelu'"),
    (["bench", "nope"], "valid: quantize"),
    (["figures", "--only", "nope"], "valid: sawtooth"),
    (["figures", "--scale", "huge"], "invalid choice"),
])
def test_bad_input_exits_2_naming_valid_choices(args, message, capsys):
    with pytest.raises(SystemExit) as exc:
        code = main(args)
        raise SystemExit(code)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
