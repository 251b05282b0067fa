"""Compiled programs kept on disk, so that a rerun skips tracing, lowering and compiling.

JAX's persistent compilation cache (:mod:`mx_proxy.training.compile_cache`) saves the
XLA compile, but a rerun still traces the Python model and lowers it to
StableHLO before it can look the program up: seconds for a training segment
with MX quantization and diagnostics. A :class:`CachedProgram` instead keys
each program by what decides it *without tracing*:

- its name and the static key (a :class:`~mx_proxy.training.config.Config` with the
  traced fields zeroed, as :func:`mx_proxy.training.engine.static_key` gives) and any
  static arguments;
- the abstract signature of its arguments (tree structure, shapes, dtypes,
  weak types);
- the code version (:mod:`mx_proxy.training.code_version`: every source
  that is traced into a program; an edit there is a new key), and the
  fingerprint of every registered activation, normalization, scale rule and
  element format (:mod:`mx_proxy.numerics.fingerprint`: their data and code,
  so an entry registered at run time that changes its code under the same
  name is a new key too);
- the JAX and jaxlib versions, the platform and device kind, the JAX options
  that change programs (x64, PRNG implementation, default matmul precision),
  ``$XLA_FLAGS`` and the program's compiler options;

and stores the serialized executable (``jax.experimental.serialize_executable``)
in ``<compilation cache folder>/proxy-executables/``. A second process asking
for the same key loads the executable (tens of milliseconds) and runs it:
bit for bit the program it would have compiled. The folder follows the
compilation cache (``PROXY_COMPILE_CACHE=off`` turns both off); with more
than one JAX device (sharded sweeps) programs are compiled as usual.

A damaged entry (one that does not load, or fails on its first call) is
deleted and compiled again; a folder that cannot be written only warns
once. A program JAX loaded from its own compilation cache is not kept here
(re-serialized, such an executable lacks its code): the next process traces
it and loads it from JAX's cache again.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
from jax.experimental.serialize_executable import deserialize_and_load, serialize

from mx_proxy.nn.activations import ACTIVATIONS
from mx_proxy.nn.norms import NORMS
from mx_proxy.numerics.fingerprint import fingerprint
from mx_proxy.numerics.formats import FORMATS
from mx_proxy.numerics.scale_rules import RULES
from mx_proxy.training import compile_cache
from mx_proxy.training.code_version import code_version

__all__ = ["CachedProgram", "folder", "stats", "reset_stats", "SUBDIR", "make_room", "release_all", "map_usage",
           "MAP_SHARE", "MAX_LIVE"]

SUBDIR = "proxy-executables"
_lock = threading.Lock()
_warned = False

stats: dict[str, float] = {"loaded": 0, "compiled": 0, "load_s": 0.0, "compile_s": 0.0, "released": 0,
                           "cleared": 0}
"""Counters of this process: executables loaded from disk and compiled
(traced, lowered, compiled, written), with the seconds each took, and
programs whose executables were released to stay within the mapping budget,
and the times JAX's own caches were cleared for it (when no program of ours
was left to release)."""


def reset_stats() -> None:
    stats.update(loaded=0, compiled=0, load_s=0.0, compile_s=0.0, released=0, cleared=0)


def folder() -> Path | None:
    """Where executables are kept: ``proxy-executables`` inside the active
    compilation cache folder, or ``None`` when that cache is off."""
    d = compile_cache.active_dir()
    return None if d is None else d / SUBDIR


def _entries() -> str:
    """The fingerprint of the registries a program is traced with."""
    return fingerprint(ACTIVATIONS, NORMS, RULES, FORMATS)


def _environment() -> tuple:
    dev = jax.devices()[0]
    return (jax.__version__, dev.client.platform_version, dev.platform, getattr(dev, "device_kind", ""),
            bool(jax.config.jax_enable_x64), str(jax.config.jax_default_prng_impl),
            str(jax.config.jax_default_matmul_precision), os.environ.get("XLA_FLAGS", ""))


def _signature(args) -> tuple:
    leaves, tree = jax.tree.flatten(args)
    return str(tree), tuple(str(jax.typeof(x)) for x in leaves)


class CachedProgram:
    """``jitted`` (a ``jax.jit`` function) compiled once per argument
    signature and static arguments, in this process and across processes.

    ``key``: what the traced function depends on besides its arguments (a
    static Config, a recipe…): anything with a stable ``repr``. Call it like
    ``jitted``, static arguments by keyword.
    """

    def __init__(self, name: str, jitted: Callable, key: Any, compiler_options: dict | None = None):
        self.name, self.jitted, self.key = name, jitted, repr(key)
        self.options = tuple(sorted((compiler_options or {}).items()))
        self._memory: dict[tuple, Any] = {}

    def __call__(self, *args, **static):
        sig = (_signature(args), tuple(sorted(static.items())))
        entry = self._memory.get(sig)
        if entry is None:
            make_room(keep=self)
            entry = self._memory[sig] = self._compiled(args, static, sig)
        _LIVE[id(self)] = self
        _LIVE.move_to_end(id(self))
        compiled, path = entry
        if path is None:
            return compiled(*args)
        try:  # the first call of a loaded executable: one that cannot run is replaced
            out = compiled(*args)
        except jax.errors.JaxRuntimeError:
            _unlink(path)
            compiled = self._fresh(args, static, path)
            out = compiled(*args)
        self._memory[sig] = (compiled, None)
        return out

    @property
    def ready(self) -> bool:
        """Whether this process holds an executable of it (a call need not compile or load one)."""
        return bool(self._memory)

    def release(self) -> None:
        """Drop this program's executables (the next call compiles or loads them again).
        JAX keeps the executables it compiled for a jitted function too (its
        lowering caches), so those are cleared with them."""
        self._memory.clear()
        self.jitted.clear_cache()
        _LIVE.pop(id(self), None)

    def _digest(self, sig) -> str:
        blob = repr((self.name, self.key, sig, self.options, code_version(), _entries(), _environment()))
        return hashlib.sha256(blob.encode()).hexdigest()[:32]

    def _compiled(self, args, static, sig):
        """(executable, its file when it was loaded from one, else None)."""
        where = folder() if jax.device_count() == 1 else None
        path = None if where is None else where / f"{self.name}-{self._digest(sig)}.bin"
        if path is not None and path.exists():
            t0 = time.perf_counter()
            loaded = _load(path)
            if loaded is not None:
                stats["loaded"] += 1
                stats["load_s"] += time.perf_counter() - t0
                return loaded, path
        return self._fresh(args, static, path), None

    def _fresh(self, args, static, path):
        t0 = time.perf_counter()
        hits = _cache_hits[0]
        compiled = self.jitted.trace(*args, **static).lower().compile()
        # An executable that JAX itself loaded from its compilation cache
        # serializes without its code (it would fail when run): keep only
        # programs compiled here.
        if path is not None and _cache_hits[0] == hits:
            _save(path, compiled)
        stats["compiled"] += 1
        stats["compile_s"] += time.perf_counter() - t0
        return compiled


# -- the live executables --------------------------------------------------------
# Every compiled XLA:CPU executable keeps its machine code in memory mappings of
# its own: about a thousand for a paired training run's three programs. Linux caps
# a process at vm.max_map_count mappings (65530 by default), and XLA aborts or
# crashes when a compile, a load or a cache write cannot map more. So the
# programs holding executables are kept least recently used first, and before
# a new executable is made the oldest are released while the process uses more
# than MAP_SHARE of its mappings (elsewhere than Linux: until at most
# MAX_LIVE programs, the new one included, hold one). When only JAX's own
# cached executables are left, JAX's caches are cleared. A released program
# compiles or loads again when called.
_LIVE: OrderedDict[int, CachedProgram] = OrderedDict()
MAP_SHARE = 0.5
MAX_LIVE = 48
_MAP_LIMIT = Path("/proc/sys/vm/max_map_count")
_MAPS = Path("/proc/self/maps")


def map_usage() -> tuple[int, int] | None:
    """(memory mappings of this process, the kernel's limit), or ``None`` where /proc does not tell."""
    try:
        limit = int(_MAP_LIMIT.read_text())
        with open(_MAPS, "rb") as f:
            used = sum(1 for _ in f)
    except (OSError, ValueError):
        return None
    return used, limit


def make_room(keep: CachedProgram | None = None) -> int:
    """Release the least recently used programs' executables (never ``keep``'s)
    while this process is over its mapping budget; returns how many were released."""
    released = 0
    while True:
        others = [p for p in _LIVE.values() if p is not keep]
        usage = map_usage()
        over = len(others) >= MAX_LIVE if usage is None else usage[0] > MAP_SHARE * usage[1]
        if not over:
            return released
        if not others:  # the rest is JAX's own: executables cached for jitted functions (ours hold theirs)
            if usage is not None:
                jax.clear_caches()
                stats["cleared"] += 1
            return released
        others[0].release()
        released += 1
        stats["released"] += 1


def release_all() -> None:
    """Drop every live executable of this process (programs compile or load again when called)."""
    for program in list(_LIVE.values()):
        program.release()


_cache_hits = [0]  # programs JAX has loaded from its persistent compilation cache in this process


def _count_cache_hit(event: str, **_) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        _cache_hits[0] += 1


jax.monitoring.register_event_listener(_count_cache_hit)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def _load(path: Path):
    try:
        payload, in_tree, out_tree = pickle.loads(path.read_bytes())
        return deserialize_and_load(payload, in_tree, out_tree)
    except Exception:  # damaged or unloadable: compile again (and overwrite it)
        _unlink(path)
        return None


def _save(path: Path, compiled) -> None:
    global _warned
    tmp = None
    try:
        blob = pickle.dumps(serialize(compiled), protocol=pickle.HIGHEST_PROTOCOL)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, path)  # atomic: a concurrent reader sees the old file or the new one
    except Exception as err:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)  # an unwritable folder or an unserializable program costs a recompile, nothing else
        with _lock:
            if not _warned:
                _warned = True
                warnings.warn(f"proxy: cannot keep compiled programs in {path.parent} ({err}); "
                              f"reruns will compile again", stacklevel=3)
