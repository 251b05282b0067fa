"""Vectorized sweeps: exact equality with single runs, divergence masking,
device sharding, bad input, and the ``mx-proxy sweep`` / ``mx-proxy intervene`` CLI."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import mx_proxy as mxp
from mx_proxy.runner import loop as runner
from mx_proxy.training.sweeps import members

# Tiny, but with every moving part: MX recipe, diagnostics, validation.
BASE = mxp.Config(width=32, depth=2, batch=64, steps=40, diagnostics_every=10, val_every=20,
                    recipe="mxfp8_e4m3")
LRS = [1e-4, 3e-4, 1e-3, 3e-3]
SEEDS = [0, 1]


def assert_same_run(a: mxp.Run, b: mxp.Run):
    """Bit-for-bit equal metrics (NaN where NaN), divergence and parameters."""
    assert a.diverged_at == b.diverged_at
    assert list(a.metrics.columns) == list(b.metrics.columns)
    assert len(a.metrics) == len(b.metrics)
    for c in a.metrics.columns:
        x, y = a.metrics[c].to_numpy(), b.metrics[c].to_numpy()
        assert np.array_equal(x, y, equal_nan=True), f"column {c} differs"
    for k in a.params:
        for leaf in a.params[k]:
            assert np.array_equal(a.params[k][leaf], b.params[k][leaf]), f"params {k}/{leaf} differ"


@pytest.fixture(scope="module")
def singles():
    """Individual mxp.train runs, by config hash (shared by tests)."""
    return {}


def single(singles, cfg):
    if cfg.hash() not in singles:
        singles[cfg.hash()] = mxp.train(cfg, progress=False)
    return singles[cfg.hash()]


def test_vmapped_sweep_equals_individual_runs(singles):
    sw = mxp.sweep(BASE, progress=False, lr=LRS, seed=SEEDS)
    assert len(sw) == 8
    assert [(c.lr, c.seed) for c in sw.configs] == [(lr, s) for lr in LRS for s in SEEDS]
    for cfg, run in zip(sw.configs, sw.runs):
        assert run.config == cfg
        assert run.diverged_at is None
        assert_same_run(run, single(singles, cfg))
    # the diagnostics really ran (not all NaN) and validation was recorded
    m = sw.runs[0].metrics
    assert m["zeta_bound"].notna().sum() == 4 and m["val_loss"].notna().sum() == 2
    frame = sw.to_frame()
    assert len(frame) == 8 * 40
    assert list(frame.columns[:3]) == ["member", "lr", "seed"]
    assert "lr_at_step" in frame and "diverged_at" in frame and "key" in frame
    assert set(frame["lr"]) == set(LRS)
    assert frame.groupby(["lr", "seed"]).size().eq(40).all()


@pytest.mark.parametrize("width", [16, 24, 32])
def test_a_sweep_member_equals_its_single_run_at_small_shapes(width):
    """Shapes where vmapped members once summed in another order than their
    single runs (from step 96 at width 16, an ulp in the norms at 24 and 32):
    on a CPU members run one after another, each the single run's program."""
    c = mxp.Config(width=width, depth=1, batch=32, steps=100, checkpoint_every=20)
    sw = mxp.sweep(c, lr=[1e-3, 2e-3, 3e-3], progress=False)
    assert_same_run(sw.runs[1], mxp.train(c.replace(lr=2e-3), progress=False))


def test_diverging_member_is_masked(singles):
    lrs = [1e-4, 3e-4, 1e-3, 1e4]  # the last one is absurd
    sw = mxp.sweep(BASE, progress=False, lr=lrs, seed=SEEDS)
    for cfg, run in zip(sw.configs, sw.runs):
        if cfg.lr == 1e4:
            assert run.diverged_at is not None and run.diverged_at < BASE.steps
            before = run.metrics[run.metrics["step"] < run.diverged_at]
            assert np.isfinite(before["loss"]).all()
            assert run.metrics["step"].iloc[-1] == run.diverged_at
        else:
            assert_same_run(run, single(singles, cfg))
    frame = sw.to_frame()
    assert frame.loc[frame["lr"] == 1e4, "diverged_at"].notna().all()
    assert frame.loc[frame["lr"] != 1e4, "diverged_at"].isna().all()


SHARDED = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    import mx_proxy as mxp
    assert len(jax.devices()) == 2, jax.devices()
    cfg = mxp.Config(width=32, depth=2, batch=64, steps=20, diagnostics_every=10, val_every=10, recipe="fp32")
    axes = dict(lr=[1e-3, 3e-3, 1e-2], seed=[0])           # 3 members: padded to 4 over 2 devices
    a = mxp.sweep(cfg, progress=False, shard=True, **axes)
    b = mxp.sweep(cfg, progress=False, shard=False, **axes)
    out = []
    for ra, rb in zip(a.runs, b.runs):
        same = all(np.array_equal(ra.metrics[c].to_numpy(), rb.metrics[c].to_numpy(), equal_nan=True)
                   for c in ra.metrics.columns) and list(ra.metrics.columns) == list(rb.metrics.columns)
        out.append(bool(same))
    single = mxp.train(cfg.replace(lr=3e-3), progress=False)
    out.append(bool(np.array_equal(single.metrics["loss"].to_numpy(), a.runs[1].metrics["loss"].to_numpy())))
    print(json.dumps(out))
""")


def test_sharded_sweep_equals_single_device():
    env = dict(os.environ,
               XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2".strip(),
               JAX_PLATFORMS="cpu")
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run([sys.executable, "-c", SHARDED], env=env, cwd=root, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout.strip().splitlines()[-1]) == [True, True, True, True]


@pytest.mark.parametrize("axes, match", [
    (dict(learning_rate=[1e-3]), "unknown sweep axis 'learning_rate'; valid: width, depth"),
    (dict(lr=[]), "sweep axis 'lr' has no values"),
    (dict(recipe=["fp32", "mxfp9"]), "unknown recipe 'mxfp9'; valid: fp32"),
    (dict(width=[0]), "width must be a positive integer"),
])
def test_sweep_bad_input(axes, match):
    with pytest.raises(ValueError, match=match):
        mxp.sweep(BASE, progress=False, **axes)


def test_sweep_scalar_axis_and_group_key():
    axes, configs = members(BASE, dict(lr=3e-4, recipe=["fp32", "mxfp8_e4m3"]))
    assert axes == {"lr": [3e-4], "recipe": ["fp32", "mxfp8_e4m3"]}
    assert [c.recipe.name for c in configs] == ["fp32", "mxfp8_e4m3"]
    # dynamic fields share a group; a recipe starts a new one
    assert runner._group_key(BASE.replace(lr=1.0, seed=3)) == runner._group_key(BASE)
    assert runner._group_key(BASE.replace(recipe="fp32")) != runner._group_key(BASE)


# ----------------------------------------------------------------------------- CLI

def _parser():
    import argparse

    from mx_proxy.cli.experiment_commands import add_experiment_commands

    p = argparse.ArgumentParser(prog="mx-proxy", exit_on_error=False)
    sub = p.add_subparsers(dest="command", required=True)
    add_experiment_commands(sub)
    return p


def test_cli_sweep_parses_axes():
    args = _parser().parse_args(["sweep", "--lr", "1e-4", "3e-4", "--seed", "0", "1", "--recipe", "fp32",
                                 "--width", "32", "--no-store"])
    from mx_proxy.cli.experiment_commands import sweep_axes

    base, axes = sweep_axes(args)
    assert axes == {"lr": [1e-4, 3e-4], "seed": [0, 1]}
    assert base.width == 32 and base.recipe.name == "fp32"


@pytest.mark.parametrize("argv, match", [
    (["sweep", "--lr"], "expected at least one argument"),
    (["sweep", "--lr", "abc"], "invalid float value"),
    (["sweep", "--recipe", "mxfp9"], "unknown recipe 'mxfp9'"),
    (["sweep", "--width", "0"], "width must be a positive integer"),
    (["intervene", "/nonexistent/run", "--at-step", "10"], "not a complete stored run"),
    (["intervene", "/nonexistent/run", "--at-step", "10", "--apply", "nope"], "invalid choice: 'nope'"),
])
def test_cli_bad_input_exits_2(argv, match, capsys):
    from mx_proxy.cli.experiment_commands import main

    assert main(argv) == 2
    assert match in capsys.readouterr().err


def test_cli_sweep_and_intervene_end_to_end(tmp_path, capsys):
    from mx_proxy.cli.experiment_commands import main

    store = tmp_path / "runs"
    argv = ["sweep", "--width", "32", "--depth", "2", "--batch", "64", "--steps", "40", "--diagnostics-every",
            "10", "--val-every", "20", "--recipe", "mxfp8_e4m3", "--checkpoint-at", "20", "--lr", "1e-4", "3e-4",
            "--store", str(store), "--quiet"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "2 members" in out
    entries = [p for p in store.iterdir() if (p / "run.json").exists()]
    run_dir = next(p for p in entries if json.loads((p / "config.json").read_text())["lr"] == 3e-4)
    assert main(["intervene", str(run_dir), "--at-step", "20", "--quiet"]) == 0
    child = [p for p in store.iterdir() if (p / "run.json").exists() and p != run_dir and
             json.loads((p / "run.json").read_text())["info"].get("parent")]
    assert len(child) == 1
    parent, kid = mxp.load(run_dir), mxp.load(child[0])
    assert_same_run(parent, kid)
    assert kid.info["intervention"]["at_step"] == 20
    capsys.readouterr()
    assert main(["intervene", str(run_dir), "--at-step", "30", "--quiet"]) == 2  # no checkpoint there
    assert "mxp.with_checkpoint(run, 30)" in capsys.readouterr().err
    assert main(["intervene", str(run_dir), "--at-step", "30", "--replay", "--quiet"]) == 0
    assert "replayed from step 20 to 30: losses identical to the parent's" in capsys.readouterr().out
    late = [mxp.load(p) for p in store.iterdir() if (p / "run.json").exists()
            and json.loads((p / "run.json").read_text())["info"].get("intervention", {}).get("at_step") == 30]
    assert len(late) == 1 and late[0].info["intervention"]["replay"]["from_step"] == 20
    assert_same_run(parent, late[0])
