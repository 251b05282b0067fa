"""No result lost, round 2 (issue 32): the families of the fault probes that are not the store's own
files (those: tests/store/test_validation.py, tests/store/test_promote_faults.py). Each test covers a
family for every member the commands and the API have: every string option given an empty value,
every integer option an absurd one, every path option a symbolic-link loop, an unknown ~user or a
file on the way; an output that cannot be written; a checkpoint that cannot be written; orbax's
noise on a failed checkpoint read or write; wrongly typed API arguments; the memory estimate."""

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pandas as pd
import pytest

import mx_proxy as mxp
from mx_proxy.cli import main as cli
from mx_proxy.cli.experiment_commands import main as exp_main
from mx_proxy.store import checkpoint as C
from mx_proxy.store import durable
from mx_proxy.store import run_store as S
from mx_proxy.training import memory
from mx_proxy.training.config import BOUNDS
from mx_proxy.training.values import ArgumentTypeError

BASE = mxp.Config(width=8, depth=1, batch=16, steps=20, diagnostics_every=0, val_every=0, checkpoint_every=5)
TINY = ["--width", "8", "--depth", "1", "--batch", "16", "--steps", "5", "--diagnostics-every", "0",
        "--val-every", "0", "--quiet"]


def status(main, argv) -> int:
    """The exit status of ``main(argv)``: returned (a guarded failure) or raised (argparse's SystemExit)."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def last_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and not any("Traceback" in line for line in err), err
    return err[-1]


# --------------------------------------------------------------------------- every option, absurd values


def _subcommands():
    parser = cli.build_parser()
    (action,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    return action.choices


def _needs(command, tmp_path) -> dict:
    """The required arguments of ``command``, as a valid value each."""
    return {"campaign": {"--scale": "smoke", "--out": str(tmp_path / "c")},
            "intervene": {"run_dir": str(tmp_path / "nowhere"), "--at-step": "10"},
            "bench": {"name": "quantize"},
            "transformer": {"--scale": "smoke"},
            "ensemble": {"--out": str(tmp_path / "e"), "--kind": "seed", "--arms": "fp32", "--members": "2",
                         "--horizon": "5"}}.get(command, {})


def _argv(command, tmp_path, option, value):
    argv = [command]
    for name, v in dict(_needs(command, tmp_path), **{option: value}).items():
        argv += [v] if not name.startswith("-") else [name, v]
    return argv


def _options(kind):
    """(command, option, its name in messages) of every option taking a value of ``kind`` (str or int),
    positionals included."""
    out = []
    for command, sub in _subcommands().items():
        for action in sub._actions:
            takes = action.nargs != 0 and action.nargs != "..." and action.dest != "help"
            if takes and (action.type or str) is kind:
                option = action.option_strings[0] if action.option_strings else action.dest
                out.append((command, option, "/".join(action.option_strings) or action.metavar or action.dest))
    return out


def _dest(command, option) -> str:
    (action,) = [a for a in _subcommands()[command]._actions if option in a.option_strings or a.dest == option]
    return action.dest


def _ids(case):
    return case if isinstance(case, str) and " " not in case and "/" not in case else None


@pytest.mark.parametrize("command, option, shown", _options(str), ids=_ids)
def test_every_name_or_path_option_refuses_an_empty_value(command, option, shown, tmp_path, capsys, trained):
    assert status(cli.main, _argv(command, tmp_path, option, "")) == 2
    line = last_error(capsys)
    assert f"{shown} was given an empty value" in line or "invalid choice: ''" in line, line
    assert trained == []


@pytest.mark.parametrize("command, option, shown", _options(int), ids=_ids)
def test_every_integer_option_refuses_an_absurd_value_naming_the_range(command, option, shown, tmp_path, capsys,
                                                                       trained):
    start = time.perf_counter()
    code = status(cli.main, _argv(command, tmp_path, option, str(10 ** 20)))
    line = last_error(capsys)
    assert code == 2 and "Traceback" not in line and time.perf_counter() - start < 5
    field = _dest(command, option)
    if field in BOUNDS:  # a Config field's own option: its declared range
        lo, hi = BOUNDS[field]
        assert f"[{lo}, {hi}]" in line, line
    assert trained == []


def test_bounds_cover_every_integer_field():
    ints = [f for f in mxp.Config.field_names() if str(mxp.Config.__dataclass_fields__[f].type).startswith("int")]
    assert set(ints) == set(BOUNDS)
    for field, (lo, hi) in BOUNDS.items():
        for bad in (lo - 1, hi + 1):
            with pytest.raises(ValueError, match=rf"{field} must be .*\[{lo}, {hi}\], got {bad}"):
                BASE.replace(**{field: bad})


def test_an_empty_controller_is_not_the_default_controller():
    with pytest.raises(ValueError, match="controller must not be an empty string"):
        BASE.replace(controller="")
    assert BASE.replace(controller="none").controller is None


# --------------------------------------------------------------------------- paths


def _bad_paths(tmp_path):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "file").write_text("")
    return {"loop": str(tmp_path / "loop" / "x"), "user": "~no_such_user_proxy/x", "file": str(tmp_path / "file/x")}


PATH_ARGS = [("train", ["--store", "{}"] + TINY), ("sweep", ["--store", "{}"] + TINY),
             ("sweep", ["--store", "off", "--out", "{}.parquet"] + TINY), ("intervene", ["{}", "--at-step", "10"]),
             ("figures", ["--only", "sawtooth", "--out", "{}"]), ("campaign", ["--scale", "smoke", "--out", "{}"]),
             ("report", ["{}"])]


@pytest.mark.parametrize("command, args", PATH_ARGS, ids=lambda a: a if isinstance(a, str) else a[0])
def test_a_bad_path_is_one_line_naming_it(command, args, tmp_path, capsys, trained):
    for kind, path in _bad_paths(tmp_path).items():
        argv = [command] + [a.format(path) for a in args]
        assert status(cli.main, argv) == 2, kind
        line = last_error(capsys)
        assert path.split("/")[-2] in line or path in line, (kind, line)
    assert trained == []


# --------------------------------------------------------------------------- outputs that cannot be written


def _full_disk_at(monkeypatch, target_suffix):
    write = durable.atomic_write

    def full(path, fn):
        if str(path).endswith(target_suffix):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        write(path, fn)

    monkeypatch.setattr(durable, "atomic_write", full)


@pytest.mark.parametrize("store", ["off", "runs"])
def test_sweep_out_on_a_full_disk_keeps_the_results_and_says_where(store, tmp_path, monkeypatch, capsys):
    _full_disk_at(monkeypatch, "out.parquet")
    out = tmp_path / "out.parquet"
    store_arg = "off" if store == "off" else str(tmp_path / store)
    assert status(exp_main, ["sweep", "--lr", "1e-3", "2e-3", "--store", store_arg, "--out", str(out)] + TINY) == 2
    line = last_error(capsys)
    kept = line.split("written to ")[1].split(" instead")[0]
    assert not out.exists() and "No space left" in line, line
    frame = pd.read_parquet(kept)
    os.unlink(kept)
    assert len(frame) == 2 * 5 and sorted(frame["lr"].unique()) == [1e-3, 2e-3]
    assert (store == "off") != (f"run store {tmp_path / store}" in line), line


def test_a_figure_that_cannot_be_written_is_kept_elsewhere(tmp_path, monkeypatch, capsys):
    _full_disk_at(monkeypatch, "sawtooth.png")
    argv = ["figures", "--only", "sawtooth", "--out", str(tmp_path / "figs"), "--store", "off", "--quiet"]
    assert status(cli.main, argv) == 2
    line = last_error(capsys)
    kept = line.split("written to ")[1].split(" instead")[0]
    assert not (tmp_path / "figs" / "sawtooth.png").exists() and open(kept, "rb").read(4) == b"\x89PNG", line
    os.unlink(kept)


def test_a_report_that_cannot_be_written_is_kept_elsewhere(tmp_path, monkeypatch, capsys):
    _full_disk_at(monkeypatch, "README.md")
    shutil.copytree("results/medium", tmp_path / "results/medium")
    readme = tmp_path / "README.md"
    readme.write_text("<!-- mx-proxy report results/medium -->\nold\n<!-- end of report -->\n")
    monkeypatch.chdir(tmp_path)
    assert status(cli.main, ["report", "--update", str(readme)]) == 2
    line = last_error(capsys)
    kept = line.split("written to ")[1].split(" instead")[0]
    assert readme.read_text().endswith("old\n<!-- end of report -->\n") and "Width 128" in open(kept).read()
    os.unlink(kept)


def test_a_damaged_campaign_result_is_one_warning_naming_it_and_the_rest_is_reported(tmp_path, capsys):
    shutil.copytree("results/medium", tmp_path / "medium")
    (meta,) = (tmp_path / "medium").glob("paired-*paper_e4m3*/run.json")
    meta.write_text(json.dumps(dict(json.loads(meta.read_text()), steps_run="7000")))
    with pytest.warns(UserWarning) as caught:
        assert status(cli.main, ["report", str(tmp_path / "medium")]) == 0
    (line,) = [str(w.message) for w in caught if "ignored, not counted" in str(w.message)]
    assert str(meta) in line and "'steps_run' must be an integer" in line, line
    out = capsys.readouterr().out
    assert "`mxfp8_e4m3`" in out and "`paper_e4m3`" not in out  # the damaged run is left out, the rest reported


# --------------------------------------------------------------------------- checkpoints that cannot be written


def test_a_checkpoint_that_cannot_be_written_is_one_warning_and_the_run_goes_on(tmp_path, monkeypatch):
    plain = mxp.train(BASE.replace(checkpoint_every=0), progress=False)
    save = C.save

    def full_at_10(directory, step, *a, **k):
        if step == 10:
            raise OSError(errno.ENOSPC, f"could not write checkpoint {C.step_dir(directory, step)} (No space left)")
        return save(directory, step, *a, **k)

    monkeypatch.setattr(C, "save", full_at_10)
    with pytest.warns(S.StoreWarning, match="step_000000010.*goes on without it") as caught:
        run = mxp.train(BASE, store=tmp_path, progress=False)
    assert len(caught) == 1 and C.steps(run.path + "/checkpoints") == [5, 15, 20]
    np.testing.assert_array_equal(run.metrics["loss"].to_numpy(), plain.metrics["loss"].to_numpy())


ORBAX_NOISE = textwrap.dedent("""
    import resource, shutil, signal, sys, time, warnings
    from pathlib import Path
    import mx_proxy as mxp
    from mx_proxy.runner import loop
    from mx_proxy.store import checkpoint as C
    out = Path(sys.argv[1])
    state, _ = loop.init_state(mxp.Config(width=8, depth=1, batch=16, steps=20, diagnostics_every=0))
    C.save(out / "good", 5, state)
    for f in (out / "good" / "step_000000005" / "state").rglob("*"):
        if f.is_file() and "/d/" in str(f):
            f.unlink()  # its data gone: tensorstore fails inside orbax's event loop
    try:
        C.restore(out / "good", 5, state)
    except C.CheckpointError as e:
        print("restore:", str(e)[:60])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100, resource.RLIM_INFINITY))  # every write past 100 bytes fails
    try:
        C.save(out / "full", 5, state)
    except OSError as e:
        print("save:", e.strerror[:60])
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    time.sleep(1)  # tensorstore's late callbacks
""")


def test_orbax_noise_of_a_failed_checkpoint_read_or_write_is_held_back(tmp_path):
    done = subprocess.run([sys.executable, "-c", ORBAX_NOISE, str(tmp_path)], capture_output=True, text=True,
                          timeout=300)
    assert "restore: checkpoint" in done.stdout and "save: could not write checkpoint" in done.stdout, done
    assert done.stderr.strip() == "", done.stderr[-3000:]
    assert not [p for p in (tmp_path / "full").iterdir()]  # nothing half written left


# --------------------------------------------------------------------------- API arguments, memory


@pytest.mark.parametrize("call, name", [
    (lambda r: mxp.train(BASE, force="yes"), "force"), (lambda r: mxp.train(BASE, on_segment=3), "on_segment"),
    (lambda r: mxp.sweep(BASE, lr=[1e-3], group_size=2.5), "group_size"), (lambda r: mxp.train("cfg"), "config"),
    (lambda r: mxp.intervene(r, 10, apply=5), "apply"), (lambda r: mxp.intervene(r, 10, apply=[5]), "apply"),
    (lambda r: mxp.intervene(r, "10"), "at_step"), (lambda r: mxp.intervene(r, 10, recipe=3), "recipe"),
    (lambda r: mxp.intervene(3, 10), "intervene needs"),
    (lambda r: mxp.with_checkpoint(r, 10, paired_run=1), "paired_run"),
    (lambda r: mxp.load(3), "run folder"), (lambda r: BASE.replace(width="8"), "width")])
def test_wrongly_typed_api_arguments_name_the_argument(call, name, trained):
    run = mxp.Run(BASE, pd.DataFrame({"step": np.arange(20)}), None)
    with pytest.raises(TypeError, match=name) as err:
        call(run)
    assert isinstance(err.value, ValueError) and isinstance(err.value, ArgumentTypeError) and trained == []


def test_absurd_sizes_are_refused_from_the_config_alone(monkeypatch):
    monkeypatch.setattr(memory, "estimate", lambda *a, **k: pytest.fail("traced an absurd model"))
    for cfg in (BASE.replace(width=2 ** 20), BASE.replace(depth=256, teacher_width=2 ** 20),
                BASE.replace(batch=2 ** 24, width=4096)):
        start = time.perf_counter()
        with pytest.raises(ValueError, match="needs at least"):
            memory.check(cfg)
        assert time.perf_counter() - start < 5


def test_the_estimate_counts_metric_buffers_and_in_memory_checkpoints():
    long = BASE.replace(steps=10 ** 7, val_every=10 ** 8, checkpoint_every=0)
    assert long.chunk == long.steps and BASE.replace(val_every=10 ** 8).chunk == BASE.steps
    assert memory.estimate(long) - memory.estimate(BASE.replace(checkpoint_every=0)) >= 4 * 6 * (10 ** 7 - 20)
    kept = BASE.replace(steps=1000, checkpoint_every=5)
    assert (memory.estimate(kept, checkpoints_in_memory=True)
            > memory.estimate(kept) + 199 * memory.parameter_floor(kept))
