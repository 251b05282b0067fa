"""The scale search's CSV record (``results/scale_search.csv``): each row is appended by rewriting the whole file
atomically, an older header is upgraded with its rows kept, and a file that is not the search's is refused."""

import csv
import subprocess
import sys

import pytest

from mx_proxy.experiments import scale_search as S


def _read_raw(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_rows_append_under_the_full_header(tmp_path):
    path = tmp_path / "search.csv"
    S.append_row({"experiment": "e1", "label": "a", "width": 64, "lr": 3e-3, "diverged_at": None}, path)
    S.append_row({"experiment": "e1", "label": "b", "width": 128, "note": "with, a comma"}, path)
    raw = _read_raw(path)
    assert tuple(raw[0]) == S.COLUMNS and len(raw) == 3
    rows = S.read_rows(path)
    assert [(r["label"], r["width"], r["lr"], r["diverged_at"], r["note"]) for r in rows] == [
        ("a", "64", "0.003", "", ""), ("b", "128", "", "", "with, a comma")]


def test_a_file_started_before_columns_were_added_gets_the_new_header_and_keeps_its_rows(tmp_path):
    path = tmp_path / "search.csv"
    old = ["time", "experiment", "label", "width", "note"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(old)
        w.writerow(["2026-11-29T08:52:09", "e01", "lr0.001/fp32", "64", "stable"])
    S.append_row({"experiment": "e02", "label": "x", "width": 32, "max_jump": 12.5}, path)
    raw = _read_raw(path)
    assert tuple(raw[0]) == S.COLUMNS
    rows = S.read_rows(path)
    first = rows[0]
    assert (first["experiment"], first["width"], first["note"], first["max_jump"]) == ("e01", "64", "stable", "")
    assert (rows[1]["experiment"], rows[1]["max_jump"]) == ("e02", "12.5")


def test_appending_to_the_committed_record_keeps_every_byte_of_it(tmp_path):
    committed = open(S.CSV_PATH, "rb").read()
    copy = tmp_path / "scale_search.csv"
    copy.write_bytes(committed)
    S.append_row({"experiment": "e99", "label": "new"}, copy)
    grown = copy.read_bytes()
    assert grown.startswith(committed) and grown.count(b"\r\n") == committed.count(b"\r\n") + 1
    assert S.read_rows(copy)[-1]["label"] == "new" and len(S.read_rows(copy)) == len(S.read_rows(S.CSV_PATH)) + 1


@pytest.mark.parametrize(("content", "message"), [
    ("time,experiment,colour\r\n1,e,red\r\n", r"\['colour'\]"),
    ("", r"\(none\)"),
    ("time,experiment\r\n1,e,extra\r\n", "line 2"),
])
def test_a_file_that_is_not_the_searchs_is_refused_and_left_as_it_was(tmp_path, content, message):
    path = tmp_path / "search.csv"
    path.write_bytes(content.encode())
    with pytest.raises(ValueError, match=message):
        S.append_row({"experiment": "e"}, path)
    assert path.read_bytes() == content.encode()


_KILLED_WHILE_APPENDING = """
import os, sys
from mx_proxy.experiments import scale_search as S
from mx_proxy.store import durable
for k in range(3):  # killed before writing, before the fsync, before the rename
    pid = os.fork()  # this process has started no thread: JAX is imported, not initialized
    if pid == 0:
        steps = iter(range(k + 1))
        durable.FAULT_HOOK = lambda step: os._exit(17) if next(steps) == k else None
        S.append_row({"experiment": "e2", "label": "b"}, sys.argv[1])
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status))
"""


def test_a_kill_while_appending_leaves_the_old_file(tmp_path):
    """Each child is killed at one file-system step; it forks from a fresh process, not from this one, whose
    JAX threads a fork could deadlock."""
    path = tmp_path / "search.csv"
    S.append_row({"experiment": "e1", "label": "a"}, path)
    before = path.read_bytes()
    out = subprocess.run([sys.executable, "-c", _KILLED_WHILE_APPENDING, str(path)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["17", "17", "17"]
    assert path.read_bytes() == before
    S.append_row({"experiment": "e2", "label": "b"}, path)  # a leftover temporary file is no obstacle
    assert [r["label"] for r in S.read_rows(path)] == ["a", "b"]
