"""The one file format of a run's tables (``metrics.parquet``, ``branch_history.parquet``): written compact, read
in either of the two formats it has had.

- **compact** (written since format ``compact-1``): Parquet, one column per
  metric in the frame's order and dtypes (int64 ``step``, float32 metrics,
  float64 ``val_loss``, bool ``promoted/…``), floats byte-stream-split and
  integers delta-encoded, zstd level :data:`LEVEL`, no dictionary pages, no
  column statistics, no pandas or Arrow schema metadata (Parquet's own types
  are the dtypes); the file's key-value metadata holds ``mx_proxy.table:
  compact-1``. A missing value (a diagnostic between the
  steps that record it, a NaN loss) is a Parquet null: what a row without
  diagnostics costs is a bit per column, so the loss is stored every step and
  the diagnostics only at the steps that have them. Every value round-trips
  bit for bit (NaN as NaN, at its position).
- **legacy** (what ``DataFrame.to_parquet`` wrote before): snappy Parquet
  with pandas metadata. Read as it is; ``python -m mx_proxy.store.compact``
  rewrites such files compact (:func:`compact_file`).

:func:`read` is the one reader: nothing it returns is unchecked (readable
Parquet of a known format, string column names once each, numeric or bool
columns); what a table must hold beyond that (its steps, its columns) its
caller checks (:func:`mx_proxy.store.files.check_metrics`). Writes are
atomic (:func:`write`, :mod:`mx_proxy.store.durable`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from mx_proxy.store import durable

__all__ = ["FORMAT", "KEY", "LEVEL", "NAMES", "TableError", "encode", "to_file", "write", "read", "format_of",
           "same", "compact_file"]

KEY = b"mx_proxy.table"
FORMAT = b"compact-1"
"""The compact format's name, in the file's metadata under :data:`KEY`."""
LEGACY = "legacy"
LEVEL = 19  # zstd: 1–2 % smaller than level 3, ~50 ms for a 9000-step, 63-column table
NAMES = ("metrics.parquet", "branch_history.parquet")
"""The files that hold a run's tables (a run's or checkpoint's metrics, a branch ensemble's history)."""


class TableError(ValueError):
    """A table file that is missing, unreadable, of an unknown format, or holds what no table of a run holds."""


def _encoding(dtype) -> str:
    kind = np.dtype(dtype).kind
    return {"f": "BYTE_STREAM_SPLIT", "i": "DELTA_BINARY_PACKED", "u": "DELTA_BINARY_PACKED"}.get(kind, "PLAIN")


def _check_columns(frame: pd.DataFrame, where) -> None:
    names = list(frame.columns)
    odd = [c for c in names if not isinstance(c, str)]
    if odd:
        raise TableError(f"{where}: column name {odd[0]!r} is not a string")
    twice = sorted({c for c in names if names.count(c) > 1})
    if twice:
        raise TableError(f"{where}: column {twice[0]!r} appears {names.count(twice[0])} times")
    bad = [c for c in names if frame[c].dtype.kind not in "iufb"]
    if bad:
        raise TableError(f"{where}: column {bad[0]!r} is of type {frame[bad[0]].dtype}, not a number or a flag")


def encode(frame: pd.DataFrame) -> pa.Table:
    """``frame`` (columns of numbers or flags, any index: it is dropped) as the Arrow table the compact
    format stores: NaN as null, no pandas metadata, :data:`KEY` → :data:`FORMAT`."""
    _check_columns(frame, "a table to write")
    return pa.Table.from_pandas(frame, preserve_index=False).replace_schema_metadata({KEY: FORMAT})


def to_file(frame: pd.DataFrame, path) -> None:
    """Write ``frame`` in the compact format to ``path`` as it is (not atomic: for a file inside a folder
    that is itself renamed into place, a checkpoint's); :func:`write` otherwise."""
    table = encode(frame)
    encodings = {f.name: _encoding(f.type.to_pandas_dtype()) for f in table.schema if not pa.types.is_boolean(f.type)}
    # store_schema=False drops the Arrow schema (~40 % of a footer) and with it the schema's metadata: the format
    # key is added to the file's own key-value metadata (pyarrow >= 17)
    with pq.ParquetWriter(str(path), table.schema, compression="zstd", compression_level=LEVEL, use_dictionary=False,
                          write_statistics=False, store_schema=False, column_encoding=encodings) as writer:
        writer.write_table(table)
        writer.add_key_value_metadata({KEY: FORMAT})


def write(path, frame: pd.DataFrame) -> None:
    """Write ``frame`` to ``path`` in the compact format, atomically (:func:`durable.atomic_write`)."""
    durable.atomic_write(path, lambda p: to_file(frame, p))


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"


def format_of(path) -> str:
    """``"compact-1"`` or ``"legacy"``: the format of the table file ``path`` (read from its footer only);
    a :class:`TableError` where it is no Parquet file or names a format this version does not know."""
    path = Path(path)
    try:
        meta = pq.read_metadata(str(path)).metadata or {}
    except Exception as e:  # OSError, or pyarrow's own error types for a truncated file
        raise TableError(f"{path} is damaged ({_first_line(e)})") from None
    if KEY not in meta:
        return LEGACY
    if meta[KEY] != FORMAT:
        raise TableError(f"{path} is a table of format {meta[KEY].decode(errors='replace')!r}; this version "
                         f"reads {FORMAT.decode()!r} and {LEGACY!r} (a newer mx_proxy wrote it?)")
    return FORMAT.decode()


def read(path) -> pd.DataFrame:
    """The table in file ``path``, compact or legacy (see the module docstring), with a fresh RangeIndex;
    a :class:`TableError` naming the file where it is missing, damaged or of an unknown format."""
    path = Path(path)
    if not path.is_file():
        raise TableError(f"{path.parent} is incomplete: {path.name} is missing")
    format_of(path)
    try:
        frame = pq.read_table(str(path)).to_pandas()
    except Exception as e:  # pyarrow's own error types for a damaged page
        raise TableError(f"{path} is damaged ({_first_line(e)})") from None
    _check_columns(frame, f"{path} is damaged")
    return frame.reset_index(drop=True)


def same(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Whether ``a`` and ``b`` hold the same table: the same column names in the same order, the same dtypes,
    the same number of rows, and every value the same bits, NaN where the other is NaN (any NaN)."""
    if list(a.columns) != list(b.columns) or len(a) != len(b):
        return False
    for c in a.columns:
        x, y = a[c].to_numpy(), b[c].to_numpy()
        if x.dtype != y.dtype:
            return False
        if x.dtype.kind == "f":
            nan = np.isnan(x)
            if not np.array_equal(nan, np.isnan(y)) or x[~nan].tobytes() != y[~nan].tobytes():
                return False
        elif not np.array_equal(x, y):
            return False
    return True


def compact_file(path) -> tuple[int, int, bool]:
    """Rewrite the table file ``path`` in the compact format where it is legacy, atomically and only after
    the rewritten table reads back the same (:func:`same`); ``(bytes before, bytes after, rewritten)``.
    A compact file is left as it is; a damaged one is a :class:`TableError` and stays untouched."""
    path = Path(path)
    before = os.path.getsize(path)
    if format_of(path) != LEGACY:
        return before, before, False
    frame = read(path)

    def rewrite(tmp):
        to_file(frame, tmp)
        if not same(read(tmp), frame):
            raise TableError(f"{path}: its compact rewrite does not read back the same table; left as it is")
    durable.atomic_write(path, rewrite)
    return before, os.path.getsize(path), True
