"""Every file of a stored entry and of a checkpoint, damaged every way (issue 32): missing, empty,
truncated, a JSON value of another type at any nesting level, a metrics column dropped or of
another dtype, rows missing, a parameter array dropped or of another shape or dtype. Whatever the
damage, no exception escapes and the run returned equals the undamaged one bit for bit: a damaged
entry is moved aside and the run resumes from its newest good checkpoint or trains again; a damaged
checkpoint is moved aside and the next newest is tried."""

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mx_proxy as mxp
from mx_proxy.store import checkpoint as C
from mx_proxy.store import files
from mx_proxy.store import run_store as S

from conftest import dead_pid

BASE = mxp.Config(width=8, depth=1, batch=16, steps=20, diagnostics_every=0, val_every=0, checkpoint_every=5)
CHILD = dict(at_step=10, lr=1e-3)
SETTINGS = settings(max_examples=14, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A parent run and an intervention on it, stored once; examples damage copies."""
    root = tmp_path_factory.mktemp("src")
    parent = mxp.train(BASE, store=root, progress=False)
    child = mxp.intervene(parent, CHILD["at_step"], lr=CHILD["lr"], progress=False)
    return root, parent, child


def copy_store(source, tmp_path: Path):
    """(a fresh copy of the source store under ``tmp_path``, the source's parent run, its child run)."""
    dst = tmp_path / "runs"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(source[0], dst, ignore=shutil.ignore_patterns(".locks"))
    return dst, source[1], source[2]


def same_run(a, b):
    assert a.diverged_at == b.diverged_at and list(a.metrics.columns) == list(b.metrics.columns)
    for c in a.metrics:
        assert a.metrics[c].dtype == b.metrics[c].dtype, c
        assert np.array_equal(a.metrics[c].to_numpy(), b.metrics[c].to_numpy(), equal_nan=True), c
    fa, fb = files.flatten(a.params), files.flatten(b.params)
    assert fa.keys() == fb.keys() and all(np.array_equal(fa[k], fb[k]) for k in fa)
    assert a.info.get("parent") == b.info.get("parent") and a.info.get("intervention") == b.info.get("intervention")


# --------------------------------------------------------------------------- the damages

JSON_VALUES = [None, "text", 7, 2.5, True, [], {}, [1, "x"], {"k": 1}]


def json_paths(value, prefix=()):
    """Every path into a JSON value (the value itself included)."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from json_paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from json_paths(v, prefix + (i,))


def json_kind(v):
    return "number" if isinstance(v, (int, float)) and not isinstance(v, bool) else type(v).__name__


def retype(value, path, new):
    if not path:
        return new
    value[path[0]] = retype(value[path[0]], path[1:], new)
    return value


def damage(data, path: Path) -> str:
    """Damage file ``path`` in a way drawn from ``data``; returns what was done."""
    how = ["missing", "empty", "truncated"]
    how += {".json": ["retype"], ".parquet": ["drop column", "retype column", "rows"],
            ".npz": ["drop array", "reshape array", "retype array"]}.get(path.suffix, [])
    raw = path.read_bytes()
    kind = data.draw(st.sampled_from(how if len(raw) > 1 else ["missing"]), label="damage")
    if kind == "missing":
        path.unlink()
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        path.write_bytes(raw[: data.draw(st.integers(1, len(raw) - 1), label="bytes kept")])
    elif kind == "retype":
        value = json.loads(raw)
        where = data.draw(st.sampled_from(list(json_paths(value))), label="field")
        old = value
        for k in where:
            old = old[k]
        new = data.draw(st.sampled_from([v for v in JSON_VALUES if json_kind(v) != json_kind(old)]), label="to")
        path.write_text(json.dumps(retype(value, where, new)))
        kind = f"retype {'.'.join(map(str, where))} to {new!r}"
    elif kind in ("drop column", "retype column", "rows"):
        frame = pd.read_parquet(path)
        col = data.draw(st.sampled_from(list(frame.columns)), label="column")
        if kind == "drop column":
            frame = frame.drop(columns=[col])
        elif kind == "retype column":
            to = data.draw(st.sampled_from(["float64", "int32", "str"]), label="dtype")
            frame[col] = frame[col].fillna(0).astype(to) if to != "str" else frame[col].astype(str)
        else:
            frame = frame.iloc[:-1] if data.draw(st.booleans(), label="drop last") else pd.concat([frame, frame[:1]])
        frame.to_parquet(path, index=False)
        kind = f"{kind} {col}"
    else:
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
        name = data.draw(st.sampled_from(sorted(arrays)), label="array")
        if kind == "drop array":
            del arrays[name]
        elif kind == "reshape array":
            arrays[name] = arrays[name].reshape(-1)[:-1] if arrays[name].size > 1 else arrays[name][None]
        else:
            arrays[name] = arrays[name].astype(np.float64)
        with open(path, "wb") as f:
            np.savez(f, **arrays)
        kind = f"{kind} {name}"
    return f"{path.name}: {kind}"


def damage_a_file(data, folder: Path, names) -> str:
    """Damage one file of ``folder`` drawn from ``names`` (for a folder among them, a file drawn from inside it)
    with :func:`damage`; returns what was done."""
    name = data.draw(st.sampled_from(names), label="file")
    target = folder / name
    if target.is_dir():
        target = data.draw(st.sampled_from(sorted(p for p in target.rglob("*") if p.is_file())), label=f"{name} file")
    return damage(data, target)


def quietly(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
    assert all(issubclass(w.category, S.StoreWarning) for w in caught), [str(w.message) for w in caught]
    return out


# --------------------------------------------------------------------------- entries


@SETTINGS
@given(data=st.data())
def test_a_damaged_entry_never_escapes_and_the_run_equals_the_undamaged_one(source, tmp_path, data):
    root, parent, child = copy_store(source, tmp_path)
    which = data.draw(st.sampled_from(["parent", "child"]), label="entry")
    entry = root / (parent if which == "parent" else child).info["key"]
    done = damage_a_file(data, entry, ["run.json", "config.json", "metrics.parquet", "params.npz"])
    if which == "parent":
        again = quietly(lambda: mxp.train(BASE, store=root, progress=False))
        same_run(again, parent)
    else:
        again = quietly(lambda: mxp.intervene(mxp.load(root / parent.info["key"]), progress=False, **CHILD))
        same_run(again, child)
    assert S.Store(root).load(again.info["key"]) is not None, done  # repaired: served as it is from now on


def test_a_damaged_entry_resumes_from_its_own_newest_checkpoint(source, tmp_path, trained):
    root, parent, _ = copy_store(source, tmp_path)
    (root / parent.info["key"] / "params.npz").write_bytes(b"")
    with pytest.warns(S.StoreWarning, match=r"params\.npz.*moved aside"):
        again = mxp.train(BASE, store=root, progress=False)
    assert again.info["resumed_from"] == 20 and trained == [BASE]
    same_run(again, parent)


# --------------------------------------------------------------------------- checkpoints


def killed_run(source, root: Path) -> Path:
    """The store as a process killed after its last checkpoint left it: the
    checkpoints in its training folder, no entry."""
    key = BASE.hash()
    cdir = root / f"{key}.partial-{dead_pid()}" / "checkpoints"
    shutil.move(str(root / key / "checkpoints"), cdir)
    shutil.rmtree(root / key)
    return cdir


@SETTINGS
@given(data=st.data())
def test_a_damaged_checkpoint_never_escapes_and_the_resumed_run_equals_the_undamaged_one(source, tmp_path, data):
    root, parent, _ = copy_store(source, tmp_path)
    cdir = killed_run(source, root)
    step = data.draw(st.sampled_from([10, 15, 20]), label="step")
    done = damage_a_file(data, C.step_dir(cdir, step), ["meta.json", "metrics.parquet", "state"])
    again = quietly(lambda: mxp.train(BASE, store=root, progress=False))
    same_run(again, parent)
    assert again.info["resumed_from"] in (15, 20), done  # never further back than the damage needs


def test_a_checkpoint_without_its_metrics_is_not_resumed_from(source, tmp_path):
    """The issue's example: a resumed run used to return only the rows after the checkpoint."""
    root, parent, _ = copy_store(source, tmp_path)
    cdir = killed_run(source, root)
    (C.step_dir(cdir, 20) / "metrics.parquet").unlink()
    with pytest.warns(S.StoreWarning, match="step_000000020.*metrics.parquet is missing.*moved aside"):
        again = mxp.train(BASE, store=root, progress=False)
    assert again.info["resumed_from"] == 15 and len(again.metrics) == BASE.steps
    same_run(again, parent)
    assert [p.name.split("-", 2)[2] for p in cdir.parent.parent.glob(f"{BASE.hash()}/checkpoints/.damaged-*")] \
        == ["step_000000020"]


@pytest.mark.parametrize("meta", [[], "text", {"step": "20"}, {"step": 15}, {"step": 20, "config_hash": 3},
                                  {"step": 20, "wall_time_s": -1}])
def test_a_checkpoint_meta_of_the_wrong_type_is_moved_aside_not_a_crash(source, tmp_path, meta):
    """A meta.json holding a list used to raise AttributeError on every rerun."""
    root, parent, _ = copy_store(source, tmp_path)
    cdir = killed_run(source, root)
    (C.step_dir(cdir, 20) / "meta.json").write_text(json.dumps(meta))
    with pytest.warns(S.StoreWarning, match="step_000000020.*meta.json"):
        again = mxp.train(BASE, store=root, progress=False)
    assert again.info["resumed_from"] == 15
    same_run(again, parent)


@pytest.mark.parametrize("field, value", [("parent", 5), ("parent", ["x"]), ("intervention", []),
                                          ("intervention", {"at_step": "10"}), ("replay", 3)])
def test_nested_info_of_the_wrong_type_is_reported_not_a_crash(source, tmp_path, field, value):
    """A run.json whose info.parent / info.intervention had the wrong type used to crash every rerun."""
    root, parent, child = copy_store(source, tmp_path)
    d = root / child.info["key"]
    meta = json.loads((d / "run.json").read_text())
    meta["info"][field] = value if field != "intervention" or not isinstance(value, dict) \
        else dict(meta["info"][field], **value)
    (d / "run.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=f"info.{field}"):
        mxp.load(d)
    with pytest.warns(S.StoreWarning, match=f"info.{field}"):
        again = mxp.intervene(mxp.load(root / parent.info["key"]), progress=False, **CHILD)
    same_run(again, child)
