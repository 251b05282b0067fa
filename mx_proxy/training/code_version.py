"""The code version: one hash of every source file that can change a run's numbers.

A compiled training program is traced from the numerics (formats, MX bits,
quantize, recipes), the Pallas kernels (the ``"pallas"`` backend), the
networks, the training layer (config, data, engine, diagnostics,
controllers, twins) and the host loop's program wrappers
(``runner/programs.py``: a sweep's member axis, ``lax.map`` or ``vmap``);
the host loop also decides each segment's steps and checkpoints. Nothing
else (store, experiments, figures, CLI) is traced into a program or decides
its inputs. So the version hashes every ``.py`` file of those five
subpackages (read as bytes: this module imports none of them), and it is the
one key both places that must notice a code change use: the run store (a
run made by other code is stale and trains again, a checkpoint of other
code is not continued) and the on-disk compiled programs
(:mod:`mx_proxy.store.executables`)."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

__all__ = ["code_version", "digest", "SOURCES"]

SOURCES = ("numerics", "pallas", "nn", "training", "runner")
"""The subpackages of ``mx_proxy`` whose source decides a run's numbers."""


def digest(package: Path, sources: tuple[str, ...] = SOURCES) -> str:
    """16 hex digits of a SHA-256 over the path (relative to ``package``) and
    bytes of every ``.py`` file under ``package/<source>`` for each of ``sources``."""
    h = hashlib.sha256()
    for sub in sources:
        for f in sorted((package / sub).rglob("*.py")):
            h.update(f.relative_to(package).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


@functools.cache
def code_version() -> str:
    """The :func:`digest` of this installation's ``mx_proxy`` (computed once per process)."""
    return digest(Path(__file__).resolve().parents[1])
