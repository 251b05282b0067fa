"""The run tables' file format (store/tables.py) and its converter (store/compact.py): every table round-trips
bit for bit, NaN at its positions; legacy (snappy, pandas) files read as they are and are rewritten compact only
after the rewrite reads back the same; damaged, unknown and foreign files are named, never touched."""

import os

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mx_proxy.store import compact, tables

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True)

# any float32 bit pattern: NaNs (of any payload), ±inf, ±0, subnormals
float32_bits = hnp.arrays(np.uint32, st.integers(0, 40), elements=st.integers(0, 2**32 - 1))


def _bits_equal(x: np.ndarray, y: np.ndarray) -> bool:
    """Independent of tables.same: NaN where the other is NaN, every other value the same bit pattern."""
    nx, ny = np.isnan(x), np.isnan(y)
    return bool((nx == ny).all()) and x[~nx].view(np.uint8).tobytes() == y[~ny].view(np.uint8).tobytes()


@st.composite
def frames(draw):
    bits = draw(float32_bits)
    n = len(bits)
    names = draw(st.lists(st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=12)
                          .filter(lambda s: s not in ("step", "val_loss")), min_size=0, max_size=3, unique=True))
    cols = {"step": np.cumsum(draw(hnp.arrays(np.int64, n, elements=st.integers(1, 1000)))) - 1,
            "loss": bits.view(np.float32)}
    for name in names:
        kind = draw(st.sampled_from(["f32", "f64", "bool", "sparse"]))
        if kind == "f64":
            cols[name] = draw(hnp.arrays(np.float64, n))
        elif kind == "bool":
            cols[name] = draw(hnp.arrays(np.bool_, n))
        else:
            v = draw(hnp.arrays(np.uint32, n, elements=st.integers(0, 2**32 - 1))).view(np.float32)
            if kind == "sparse":  # a diagnostic at every k-th step only
                v = np.where(np.arange(n) % draw(st.integers(1, 7)) == 0, v, np.float32(np.nan))
            cols[name] = v
    return pd.DataFrame(cols)


@SETTINGS
@given(frame=frames())
def test_every_table_round_trips_bit_for_bit(tmp_path_factory, frame):
    path = tmp_path_factory.mktemp("t") / "metrics.parquet"
    tables.write(path, frame)
    back = tables.read(path)
    assert tables.format_of(path) == "compact-1"
    assert list(back.columns) == list(frame.columns) and len(back) == len(frame)
    assert isinstance(back.index, pd.RangeIndex) and back.index.start == 0
    for c in frame.columns:
        x, y = frame[c].to_numpy(), back[c].to_numpy()
        assert x.dtype == y.dtype, c
        assert (_bits_equal(x, y) if x.dtype.kind == "f" else np.array_equal(x, y)), c
    assert tables.same(back, frame)


@SETTINGS
@given(frame=frames())
def test_a_legacy_table_reads_as_written_and_converts_to_the_same_table(tmp_path_factory, frame):
    path = tmp_path_factory.mktemp("t") / "metrics.parquet"
    frame.to_parquet(path, index=False)  # how every table was written before the compact format
    assert tables.format_of(path) == "legacy"
    legacy = tables.read(path)
    assert tables.same(legacy, frame)
    before, after, rewritten = tables.compact_file(path)
    assert rewritten and before > 0 and after == os.path.getsize(path)
    assert tables.format_of(path) == "compact-1" and tables.same(tables.read(path), frame)
    assert tables.compact_file(path) == (after, after, False)  # a compact file is left as it is


def test_same_tells_tables_apart():
    a = pd.DataFrame({"step": np.arange(3), "loss": np.float32([1, np.nan, 0.0])})
    assert tables.same(a, a.copy())
    for b in (a.assign(loss=np.float32([1, np.nan, -0.0])),  # -0.0 is not 0.0's bits
              a.assign(loss=np.float32([1, 2, 0.0])),  # a value where the other is NaN
              a.assign(loss=a["loss"].astype(np.float64)), a[["loss", "step"]], a.iloc[:2]):
        assert not tables.same(a, b) and not tables.same(b, a)


def test_bad_files_are_named_and_bad_frames_refused(tmp_path):
    path = tmp_path / "metrics.parquet"
    with pytest.raises(tables.TableError, match=f"{tmp_path} is incomplete: metrics.parquet is missing"):
        tables.read(path)
    path.write_bytes(b"PAR1 truncated")
    with pytest.raises(tables.TableError, match="metrics.parquet is damaged"):
        tables.read(path)
    with pytest.raises(tables.TableError, match="is damaged"):
        tables.compact_file(path)
    assert path.read_bytes() == b"PAR1 truncated"  # left as it is
    good = pd.DataFrame({"step": np.arange(4), "loss": np.float32([4, 3, 2, 1])})
    pq.write_table(tables.encode(good).replace_schema_metadata({tables.KEY: b"compact-9"}), path)
    with pytest.raises(tables.TableError, match="format 'compact-9'; this version reads 'compact-1' and 'legacy'"):
        tables.read(path)
    good.assign(note=["a", "b", "c", "d"]).to_parquet(path, index=False)
    with pytest.raises(tables.TableError, match=r"damaged: column 'note' is of type \w+, not a number or a flag"):
        tables.read(path)
    with pytest.raises(tables.TableError, match=r"column 'note' is of type \w+, not a number"):
        tables.write(tmp_path / "new.parquet", good.assign(note="x"))
    with pytest.raises(tables.TableError, match="column 'loss' appears 2 times"):
        tables.write(tmp_path / "new.parquet", pd.concat([good, good[["loss"]]], axis=1))
    assert not (tmp_path / "new.parquet").exists()


def test_a_rewrite_that_reads_back_otherwise_leaves_the_legacy_file(tmp_path, monkeypatch):
    path = tmp_path / "metrics.parquet"
    frame = pd.DataFrame({"step": np.arange(5), "loss": np.float32([5, 4, 3, 2, 1])})
    frame.to_parquet(path, index=False)
    old = path.read_bytes()
    real = tables.to_file
    monkeypatch.setattr(tables, "to_file", lambda f, p: real(f.assign(loss=f["loss"] + 1), p))
    with pytest.raises(tables.TableError, match="does not read back the same table; left as it is"):
        tables.compact_file(path)
    assert path.read_bytes() == old and sorted(p.name for p in tmp_path.iterdir()) == ["metrics.parquet"]


def test_the_converter_checks_every_path_first_then_rewrites_legacy_tables_only(tmp_path, capsys):
    frame = pd.DataFrame({"step": np.arange(50), "loss": np.linspace(1, 0, 50, dtype=np.float32)})
    run = tmp_path / "results" / "fp32-m00"
    run.mkdir(parents=True)
    frame.to_parquet(run / "metrics.parquet", index=False)
    frame.to_parquet(tmp_path / "results" / "branch_history.parquet", index=False)
    frame.to_parquet(run / "other.parquet", index=False)  # not a table file: never touched
    (tmp_path / "results" / "bad").mkdir()
    (tmp_path / "results" / "bad" / "metrics.parquet").write_bytes(b"x")
    legacy = (run / "metrics.parquet").read_bytes()
    assert compact.main([str(run), str(tmp_path / "nowhere")]) == 2
    assert compact.main([str(run / "other.parquet")]) == 2
    err = capsys.readouterr().err
    assert "'" + str(tmp_path / "nowhere") + "' does not exist" in err and "is not a table file; valid:" in err
    assert compact.main([str(tmp_path / "results"), "--dry-run"]) == 1  # the damaged file is named
    assert (run / "metrics.parquet").read_bytes() == legacy
    assert "would rewrite 2 file(s)" in capsys.readouterr().out
    assert compact.main([str(tmp_path / "results")]) == 1
    out = capsys.readouterr().out
    assert "rewrote 2 file(s)" in out and "1 damaged file(s) left as they are" in out and "bad/metrics.parquet" in out
    for p in (run / "metrics.parquet", tmp_path / "results" / "branch_history.parquet"):
        assert tables.format_of(p) == "compact-1" and tables.same(tables.read(p), frame)
    assert tables.format_of(run / "other.parquet") == "legacy"
    assert (tmp_path / "results" / "bad" / "metrics.parquet").read_bytes() == b"x"
    assert compact.main([str(run)]) == 0 and "rewrote 0 file(s)" in capsys.readouterr().out
