"""No result lost, no raw traceback (issue 21): the run store, checkpoints,
direct loads, the CLI and the inputs of Config and quantize under faults and
bad input. Faults are injected by editing files under tmp_path or by
monkeypatching where a real one (a full disk) is not possible."""

import errno
import json
import os
import shutil
import signal

import jax
import ml_dtypes
import numpy as np
import pandas as pd
import pytest

import mx_proxy as mxp
from mx_proxy.cli import main as cli
from mx_proxy.cli.experiment_commands import main as exp_main
from mx_proxy.numerics.quantize import MXSpec, quantize, quantize_stats
from mx_proxy.runner import loop as runner
from mx_proxy.store import checkpoint as C
from mx_proxy.store import run_store as S
from mx_proxy.training import memory

from conftest import dead_pid

# the cheapest program: one narrow block, no diagnostics, checkpoints every 5 steps
BASE = mxp.Config(width=8, depth=1, batch=16, steps=20, diagnostics_every=0, val_every=0, checkpoint_every=5)


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A run trained once into a store; tests copy its entry."""
    root = tmp_path_factory.mktemp("src")
    run = mxp.train(BASE, store=root, progress=False)
    return run


def fresh_store(tmp_path, stored):
    """A copy of the stored entry in a new store: (store root, entry folder)."""
    root = tmp_path / "runs"
    root.mkdir()
    d = root / BASE.hash()
    shutil.copytree(stored.path, d)
    return root, d


# 1 ------------------------------------------------------------------------ damaged newest checkpoint


def test_a_damaged_newest_checkpoint_falls_back_to_the_newest_good_one(tmp_path, stored, trained):
    root, d = fresh_store(tmp_path, stored)
    part = root / f"{BASE.hash()}.partial-{dead_pid()}"  # as left by a process killed after step 15
    shutil.copytree(d / "checkpoints", part / "checkpoints")
    shutil.rmtree(d)
    shutil.rmtree(part / "checkpoints" / "step_000000020")
    for f in (part / "checkpoints" / "step_000000015").rglob("*"):
        if f.is_file():
            f.write_bytes(b"")  # emptied, meta.json included
    for f in (part / "checkpoints" / "step_000000010").rglob("*"):
        if f.is_file() and f.name != "meta.json":
            f.write_bytes(b"")  # the orbax state and metrics emptied, meta.json intact
    (part / "checkpoints" / "step_junk").mkdir()  # junk beside them
    (part / "checkpoints" / "step_junk" / "meta.json").write_text("{}")
    with pytest.warns(UserWarning) as rec:
        run = mxp.train(BASE, store=root, progress=False)
    messages = " | ".join(str(w.message) for w in rec)
    assert "step_000000015" in messages and "step_000000010" in messages and "step_junk" in messages
    assert "damaged" in messages and run.info["resumed_from"] == 5 and len(trained) == 1
    np.testing.assert_array_equal(run.metrics["loss"].to_numpy(), stored.metrics["loss"].to_numpy())


def test_marks_of_another_host_are_never_taken_for_dead(tmp_path):
    pid = dead_pid()
    theirs = [tmp_path / f".tmp-{pid}@otherhost-cafe-x", tmp_path / f"{BASE.hash()}.partial-{pid}@otherhost"]
    ours = [tmp_path / f".tmp-{pid}@{S.durable._HOST}-cafe-x", tmp_path / f"{BASE.hash()}.partial-{pid}"]
    for p in theirs + ours:
        p.mkdir()
    st = S.Store(tmp_path)
    assert st._orphans(BASE.hash()) == [ours[1]]
    st.clean()
    assert all(p.exists() for p in theirs) and not any(p.exists() for p in ours)
    assert st.partial(BASE.hash()).name.endswith(f"{os.getpid()}@{S.durable._HOST}")


# 2, 3 --------------------------------------------------------------------- one verified reader


@pytest.mark.parametrize("damage", ["null", "[]", "info-list", "diverged-text", "few-rows", "no-params",
                                    "config-list"])
def test_a_wrongly_typed_or_incomplete_entry_is_never_served(tmp_path, stored, damage):
    root, d = fresh_store(tmp_path, stored)
    meta = json.loads((d / "run.json").read_text())
    if damage in ("null", "[]"):
        (d / "run.json").write_text(damage)
    elif damage == "info-list":
        (d / "run.json").write_text(json.dumps(dict(meta, info=[])))
    elif damage == "diverged-text":
        (d / "run.json").write_text(json.dumps(dict(meta, diverged_at="abc")))
    elif damage == "few-rows":
        pd.read_parquet(d / "metrics.parquet").head(10).to_parquet(d / "metrics.parquet", index=False)
    elif damage == "no-params":
        (d / "params.npz").unlink()
    else:
        (d / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="damaged|incomplete"):
        mxp.load(d)
    with pytest.warns(S.StoreWarning, match="damaged or incomplete.*moved aside"):
        assert S.Store(root).load(BASE.hash()) is None
    (aside,) = root.glob(f"{BASE.hash()}.damaged-*")  # kept for inspection, out of the way
    assert not d.exists() and (aside / "run.json").exists() and C.steps(aside / "checkpoints") == [5, 10, 15, 20]


def test_a_poisoned_entry_is_retrained(tmp_path, stored, trained):
    root, d = fresh_store(tmp_path, stored)
    (d / "run.json").write_text("null")
    with pytest.warns(S.StoreWarning):
        run = mxp.train(BASE, store=root, progress=False)
    assert len(trained) == 1 and run.params is not None and len(run.metrics) == BASE.steps
    assert mxp.load(d).diverged_at is None  # repaired


# 4 ------------------------------------------------------------------------ destinations, saves


def test_sweep_out_is_checked_before_any_training(tmp_path, trained, capsys):
    argv = ["sweep", "--width", "8", "--depth", "1", "--batch", "16", "--steps", "5", "--diagnostics-every", "0",
            "--val-every", "0", "--lr", "1e-3", "2e-3", "--store", "off", "--quiet"]
    assert exp_main(argv + ["--out", str(tmp_path / "nowhere" / "x.parquet")]) == 2
    assert exp_main(argv + ["--out", str(tmp_path / "x.txt")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and ".parquet or .csv" in err and trained == []


def test_a_locks_file_fails_before_training(tmp_path, trained):
    (tmp_path / ".locks").write_text("")
    with pytest.raises(ValueError, match=r"\.locks"):
        mxp.train(BASE, store=tmp_path, progress=False)
    (tmp_path / ".locks").unlink()
    (tmp_path / BASE.hash()).write_text("")  # the entry's path is a file
    with pytest.raises(ValueError, match=BASE.hash()):
        mxp.train(BASE, store=tmp_path, progress=False)
    assert trained == []


def test_a_failed_save_keeps_the_result_and_says_where(tmp_path, monkeypatch, trained):
    write = S._write_entry
    fsyncs = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd))[1])

    def full_disk(d, run, meta):
        if str(d).startswith(str(tmp_path)):
            raise OSError(errno.ENOSPC, "No space left on device", str(d))
        write(d, run, meta)

    monkeypatch.setattr(S, "_write_entry", full_disk)
    cfg = BASE.replace(checkpoint_every=0)
    with pytest.raises(S.SaveError, match="No space left") as err:
        mxp.train(cfg, store=tmp_path, progress=False)
    assert err.value.kept is not None and str(err.value.kept) in str(err.value) and len(trained) == 1
    kept = mxp.load(err.value.kept)
    np.testing.assert_array_equal(kept.metrics["loss"].to_numpy(), err.value.run.metrics["loss"].to_numpy())
    shutil.rmtree(err.value.kept)
    monkeypatch.setattr(S, "_write_entry", write)
    mxp.train(cfg.replace(seed=1), store=tmp_path, progress=False)
    assert fsyncs  # files are fsync'ed before their rename


# 5 ------------------------------------------------------------------------ direct loads are checked


def test_direct_loads_refuse_an_edited_config(tmp_path, stored):
    root, d = fresh_store(tmp_path, stored)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(dict(cfg, lr=0.5)))
    with pytest.raises(ValueError, match="edited"):
        mxp.load(d)
    with pytest.raises(ValueError, match="edited"):
        mxp.intervene(d, at_step=10, lr=1e-4, progress=False)


def test_direct_loads_of_stale_code_warn_and_intervene_refuses(tmp_path, stored, monkeypatch, trained):
    root, d = fresh_store(tmp_path, stored)
    monkeypatch.setattr(S, "code_version", lambda: "0000000000000000")  # as if the numerics code had changed
    with pytest.warns(S.StoreWarning, match="other numerics code"):
        parent = mxp.load(d)
    with pytest.raises(ValueError, match="other numerics code"):
        mxp.intervene(parent, at_step=10, lr=1e-4, progress=False)
    assert trained == []


# 6 ------------------------------------------------------------------------ the CLI: one line, exit 2

TRAIN = ["train", "--width", "8", "--depth", "1", "--batch", "16", "--steps", "5", "--diagnostics-every", "0",
         "--val-every", "0", "--quiet"]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def test_cli_train_store_at_a_file_or_unwritable(tmp_path, capsys):
    (tmp_path / "f").write_text("")
    assert cli.main(TRAIN + ["--store", str(tmp_path / "f")]) == 2
    assert "is a file, not a folder" in one_error_line(capsys)
    assert cli.main(TRAIN + ["--store", "/proc/proxy-runs"]) == 2
    assert "not writable" in one_error_line(capsys)


def test_cli_out_of_memory_is_one_line(monkeypatch, capsys):
    def oom(*a, **k):
        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 9e12 bytes.\n"
                                         "BufferAssignment stats: ...")
    monkeypatch.setattr(runner, "train", oom)
    assert cli.main(TRAIN + ["--store", "off"]) == 2
    assert "out of memory" in one_error_line(capsys)


def test_cli_damaged_checkpoint_names_the_file(tmp_path, stored, capsys):
    root, d = fresh_store(tmp_path, stored)
    for f in (d / "checkpoints" / "step_000000010" / "state").rglob("*METADATA"):
        f.write_bytes(b"")
    assert exp_main(["intervene", str(d), "--at-step", "10", "--lr", "1e-4", "--quiet"]) == 2
    assert "step_000000010" in one_error_line(capsys)


def test_ctrl_c_during_a_checkpoint_waits_until_it_is_whole(tmp_path, monkeypatch):
    """Ctrl-C as a terminal delivers it to a Python program: SIGINT with Python's
    default handler (a pytest-xdist worker starts with SIGINT ignored, so the
    test installs the default handler for its duration)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _interrupt_a_checkpoint(tmp_path, monkeypatch)
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupt_a_checkpoint(tmp_path, monkeypatch):
    state, _ = runner.init_state(BASE)
    real = C.ocp.StandardCheckpointer.save

    def interrupted(self, *a, **k):
        os.kill(os.getpid(), signal.SIGINT)
        return real(self, *a, **k)

    monkeypatch.setattr(C.ocp.StandardCheckpointer, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        C.save(tmp_path, 5, state)
    assert C.steps(tmp_path) == [5]  # written whole before the interrupt took effect
    restored, _ = C.restore(tmp_path, 5, state)
    assert jax.tree.structure(restored) == jax.tree.structure(state)


# 7 ------------------------------------------------------------------------ memory estimate before compiling


def test_an_absurd_size_is_refused_before_compiling(monkeypatch):
    with pytest.raises(ValueError, match=r"needs at least [\d.]+ GiB"):
        mxp.train(BASE.replace(width=200000), progress=False)
    monkeypatch.setattr(memory, "available", lambda: 1 << 10)
    with pytest.raises(ValueError, match="needs at least"):
        mxp.sweep(BASE, lr=[1e-3, 2e-3], progress=False)
    assert memory.estimate(BASE, 2) > memory.estimate(BASE) > 0


# 8, 9 --------------------------------------------------------------------- Config types, --store ""


@pytest.mark.parametrize("bad", [dict(beta1="0.9"), dict(act=3), dict(lr="1e-3"), dict(diagnostic_format=8),
                                 dict(noise=[0.1]), dict(teacher_act=1), dict(width=8.0)])
def test_config_values_of_the_wrong_type_are_value_errors_naming_the_field(bad):
    (name,) = bad
    with pytest.raises(ValueError, match=name):
        BASE.replace(**bad)


def test_equal_configs_have_one_hash():
    assert BASE.replace(lr=1).hash() == BASE.replace(lr=1.0).hash()
    assert BASE.replace(width=np.int64(8), noise=np.float32(0.5)).hash() == BASE.replace(noise=0.5).hash()
    assert BASE.replace(noise=-0.0).hash() == BASE.replace(noise=0.0).hash()
    assert isinstance(BASE.replace(lr=1).lr, float)


def test_an_empty_store_is_an_error(capsys):
    with pytest.raises(ValueError, match="empty"):
        mxp.train(BASE, store="", progress=False)
    with pytest.raises(ValueError, match="empty"):
        S.resolve("  ")
    with pytest.raises(SystemExit) as exit_:  # refused by the parser, as every empty value is
        cli.main(TRAIN + ["--store", ""])
    assert exit_.value.code == 2 and "empty" in one_error_line(capsys)


# 11 ----------------------------------------------------------------------- quantize inputs


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
                                   np.bool_, np.float16, ml_dtypes.bfloat16, np.float32])
def test_quantize_inputs_convert_exactly(dtype):
    x = np.array([0, 1, 3, 7, 100, 127, 1, 0] * 4).astype(dtype)
    want = quantize(x.astype(np.float32), MXSpec("fp8_e4m3"))
    np.testing.assert_array_equal(np.asarray(quantize(x, MXSpec("fp8_e4m3"))), np.asarray(want))


def test_quantize_float64_rounds_to_float32_first():
    x = np.random.default_rng(0).normal(size=64) * (1 + 2 ** -40)
    spec = MXSpec("fp8_e4m3")
    np.testing.assert_array_equal(np.asarray(quantize(x, spec)), np.asarray(quantize(x.astype(np.float32), spec)))
    assert float(quantize_stats(x, spec).nan_frac) == 0.0


@pytest.mark.parametrize("x", [np.array([2 ** 24 + 1] * 32, np.int32), np.array([2 ** 31 + 5] * 32, np.int64),
                               np.array([2 ** 32 + 1] * 32, np.uint64), np.array([-(2 ** 40)] * 32, np.int64)])
def test_quantize_refuses_integers_float32_cannot_hold(x):
    with pytest.raises(ValueError, match="2\\*\\*24"):
        quantize(x, MXSpec("fp8_e4m3"))
    with pytest.raises(ValueError, match="2\\*\\*24"):
        quantize_stats(x, MXSpec("fp8_e4m3"))
    with pytest.raises(ValueError, match="traced"):
        jax.jit(lambda v: quantize(v, MXSpec("fp8_e4m3")))(x.astype(np.int32))
    with pytest.raises(ValueError, match="real array"):
        quantize(np.array(["a"] * 32), MXSpec("fp8_e4m3"))
