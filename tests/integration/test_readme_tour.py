"""The README's "A short tour" runs as written: its Python block and its
command lines are executed here, top to bottom, shrunk to a small size (the
same calls, flags and checkpoint/intervention steps, on a width-16 model for
40 steps), in a temporary folder, so the tour cannot drift from the code."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from mx_proxy.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
TOUR = (ROOT / "README.md").read_text().split("## A short tour", 1)[1].split("\n## ", 1)[0]
PYTHON = TOUR.split("```python\n", 1)[1].split("```", 1)[0]
BASH = TOUR.split("```bash\n", 1)[1].split("```", 1)[0]

# the tour's sizes and steps → a small size (whole words only, so every other value stays as written)
SMALL_PY = [(r"\bwidth=128\b", "width=16"), (r"\bdepth=4\b", "depth=2"),
            (r"\bsteps=3000\b", "steps=40, batch=32, val_every=20"), (r"\b1500\b", "20"),
            (r"\bmembers=8\b", "members=2, progress=False"), (r"\bhorizon=1000\b", "horizon=10")]
SMALL_CLI = [(r"--width 128\b", "--width 16 --depth 2 --batch 32 --val-every 20"), (r"--steps 3000\b", "--steps 40"),
             (r"\b1500\b", "20"), (r"--members 8\b", "--members 2"), (r"--horizon 3000\b", "--horizon 20"),
             (r"/tmp/ens\b", "ens"), (r"transformer --scale quick\b", "transformer --scale smoke"),
             (r"/tmp/transformer.csv\b", "transformer.csv")]


def _shrink(text, rules):
    for pattern, repl in rules:
        text, n = re.subn(pattern, repl, text)
    return text


def test_the_tour_names_the_checkpoint_its_intervention_needs():
    at = re.search(r"at_step=(\d+)", PYTHON).group(1)
    assert re.search(rf"checkpoint_at=\({at},?\)", PYTHON)
    at = re.search(r"--at-step (\d+)", BASH).group(1)
    assert f"--checkpoint-at {at}" in BASH


@pytest.mark.e2e
def test_python_tour_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = _shrink(PYTHON, SMALL_PY).replace("mxp.train(cfg,", "mxp.train(cfg, progress=False,")
    scope = {}
    exec(compile(code, "README.md (tour)", "exec"), scope)  # noqa: S102 -- the README's own code
    run, sw, child, ens = scope["run"], scope["sw"], scope["child"], scope["ens"]
    assert run.config.paired_run and run.config.width == 16 and (tmp_path / "runs" / run.config.hash()).is_dir()
    assert {"ref_loss", "zeta_paper", "ln_clamp_frac"} <= set(run.metrics.columns)
    assert len(sw) == 6
    assert child.info["intervention"]["at_step"] == 20 and child.info["parent"] == run.config.hash()
    assert (ens.rates()["members"] == 2).all() and list(ens.rates()["arm"]) == ["unchanged", "twin", "rceil"]
    assert (tmp_path / "ens" / "results" / "ensemble.json").exists()


def _commands():
    for line in BASH.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line.startswith(build_parser().prog + " "):  # the console command's name
            yield shlex.split(_shrink(line, SMALL_CLI))[1:]


@pytest.mark.e2e
def test_command_line_tour_runs_as_written(tmp_path):
    commands = list(_commands())
    assert [c[0] for c in commands] == ["train", "intervene", "sweep", "campaign", "ensemble", "transformer"]
    key = None
    for argv in commands:
        if argv[0] == "campaign":  # hours at its scale: its flags and values must parse (test_campaign runs one)
            args = build_parser().parse_args(argv)
            assert args.scale == "medium"
            continue
        if argv[0] == "intervene":
            argv = [a.replace("runs/<key>", key) for a in argv]
        if argv[0] == "sweep":
            argv += ["--width", "16", "--depth", "2", "--batch", "32", "--steps", "40", "--val-every", "20"]
        if argv[0] in ("train", "sweep", "intervene", "ensemble"):
            argv += ["--quiet"]
        done = subprocess.run([sys.executable, "-m", "mx_proxy.cli", *argv], cwd=tmp_path, capture_output=True,
                              text=True, timeout=900)
        assert done.returncode == 0, f"proxy {' '.join(argv)}\n{done.stdout}\n{done.stderr}"
        if argv[0] == "transformer":
            assert argv[:3] == ["transformer", "--scale", "smoke"] and (tmp_path / "transformer.csv").is_file()
        if argv[0] == "train":
            key = done.stdout.rsplit(" -> ", 1)[1].strip()
            assert Path(tmp_path, key).resolve().parent == (tmp_path / "runs").resolve()


@pytest.mark.parametrize("argv, hint", [
    (["intervene", "RUN", "--at-step", "20", "--apply", "ln_exempt", "--quiet"], "--checkpoint-at 20"),
])
def test_intervene_hint_speaks_the_command_line(tmp_path, argv, hint):
    train = subprocess.run([sys.executable, "-m", "mx_proxy.cli", "train", "--width", "16", "--depth", "2", "--batch",
                            "32", "--steps", "40", "--val-every", "20", "--store", "runs", "--quiet"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert train.returncode == 0, train.stderr
    key = train.stdout.rsplit(" -> ", 1)[1].strip()
    argv = [key if a == "RUN" else a for a in argv]
    done = subprocess.run([sys.executable, "-m", "mx_proxy.cli", *argv], cwd=tmp_path, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 2
    assert hint in done.stderr and "checkpoint_at=" not in done.stderr
