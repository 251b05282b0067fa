"""``python -m mx_proxy.store.compact PATH …``: rewrite the run tables under each PATH in the compact format.

Every table file (:data:`mx_proxy.store.tables.NAMES`: ``metrics.parquet``, ``branch_history.parquet``) in a
PATH folder, at any depth (a campaign's or an ensemble's results, a run store, a checkout's ``results/``), or
PATH itself where it is such a file, that is in the legacy format is rewritten compact
(:func:`mx_proxy.store.tables.compact_file`: atomically, and only once the rewrite reads back the same table,
bit for bit). Compact files are left as they are, so a second run changes nothing. ``--dry-run`` only says
what would be rewritten. Prints one line per rewritten file and a total; a damaged file is named, left as
it is, and makes the exit status 1; a PATH that does not exist, or a file of another name, is exit status 2
before any file is touched.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from mx_proxy.store import durable, tables

__all__ = ["table_files", "convert", "main"]


def table_files(paths) -> list[Path]:
    """The table files named by ``paths`` (folders searched at any depth, files as they are), sorted, once
    each; a ValueError naming the first path that does not exist or is a file of another name."""
    found: set[Path] = set()
    for p in map(Path, paths):
        if p.is_dir():
            found.update(f for name in tables.NAMES for f in p.rglob(name)
                         if f.is_file() and not durable.is_tmp(f.name))
        elif p.is_file():
            if p.name not in tables.NAMES:
                raise ValueError(f"{str(p)!r} is not a table file; valid: a folder, or a file named "
                                 f"{' or '.join(tables.NAMES)}")
            found.add(p)
        else:
            raise ValueError(f"{str(p)!r} does not exist")
    return sorted(found)


def convert(paths, dry_run: bool = False, out=None) -> tuple[int, int, int, list[tuple[Path, str]]]:
    """Rewrite the legacy table files under ``paths`` compact (see the module docstring); returns
    ``(files, bytes before, bytes after, damaged)`` over the files rewritten (or, ``dry_run``, those that
    would be: bytes after is then bytes before), ``damaged``: (file, why) of each that could not be read,
    left as it is."""
    out = sys.stdout if out is None else out
    count = before = after = 0
    damaged = []
    for f in table_files(paths):
        try:
            if dry_run:
                if tables.format_of(f) == tables.LEGACY:
                    size = os.path.getsize(f)
                    count, before, after = count + 1, before + size, after + size
                    print(f"would rewrite {f} ({size} bytes)", file=out)
                continue
            b, a, rewritten = tables.compact_file(f)
        except tables.TableError as e:
            damaged.append((f, str(e)))
            print(f"left as it is: {e}", file=out)
            continue
        if rewritten:
            count, before, after = count + 1, before + b, after + a
            print(f"{f}: {b} -> {a} bytes ({b / a:.2f}x)", file=out)
    return count, before, after, damaged


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mx_proxy.store.compact", description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", metavar="PATH", help="folders to search, or table files")
    ap.add_argument("--dry-run", action="store_true", help="only list the files that would be rewritten")
    args = ap.parse_args(argv)
    try:
        table_files(args.paths)  # every path checked before any file is touched
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    count, before, after, damaged = convert(args.paths, args.dry_run)
    if args.dry_run:
        done = f"would rewrite {count} file(s) of {before} bytes"
    else:
        done = f"rewrote {count} file(s): {before} -> {after} bytes" + (f" ({before / after:.2f}x)" if after else "")
    print(f"{done}; {len(damaged)} damaged file(s) left as they are")
    return 1 if damaged else 0


if __name__ == "__main__":
    sys.exit(main())
