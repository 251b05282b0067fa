"""JAX's persistent compilation cache, on by default for proxy.

Every changed setting of a run (another activation, norm, recipe, width…)
is another XLA program, and on a small CPU compiling it costs more than
training it. importing :mod:`mx_proxy.training` therefore calls
:func:`enable`, which points
JAX's persistent compilation cache at a user cache folder, so a program
compiled once (in any process) is loaded from disk the next time.

Where the cache lives, first match wins:

1. ``enable(path)`` called with a folder;
2. ``$PROXY_COMPILE_CACHE``: a folder path, or ``off`` (also ``0``,
   ``false``, ``no``, ``none``) to leave JAX's configuration alone (JAX then
   caches only if you configured it yourself, e.g. ``$JAX_COMPILATION_CACHE_DIR``); a value that is no
   folder path (a file, empty, an unknown ``~user``) is one warning naming it, and the next rule decides;
3. a folder already configured in JAX (``$JAX_COMPILATION_CACHE_DIR`` or
   ``jax.config.update("jax_compilation_cache_dir", ...)`` before importing mx_proxy.training);
4. ``$XDG_CACHE_HOME/proxy/jax``, else ``~/.cache/proxy/jax``.

Every program that takes ``MIN_COMPILE_TIME_S`` (0.1 s) or more to
compile is cached (``jax_persistent_cache_min_compile_time_secs``; JAX's
default is 1 s, which would leave the small programs of a run, its init and
validation loss, to be recompiled on every rerun), however small its entry
(``jax_persistent_cache_min_entry_size_bytes`` = 0). Quicker ones, mostly
single operations run eagerly (tens of milliseconds each), are not: JAX
scans the whole folder under its lock at every write (to evict the least
recently used entries), so each entry makes every later write slower, and
a full test run that cached its ~3700 eager operations spent ~0.3 s per
write by its end. The cache is capped at
``MAX_SIZE_BYTES`` (16 GiB; JAX evicts the least recently used entries):
the cap is what makes JAX lock each entry while it is read or written
(``filelock``), so that processes sharing the folder never read a
half-written entry; delete the folder to clear it. Entries are keyed by the program, the compile options, the JAX
and XLA versions and the device, so a stale entry is never used. As JAX
warns, a compilation cache is trusted code: do not share its folder with
users you do not trust. :mod:`mx_proxy.store.executables` keeps a run's whole
compiled programs in a subfolder, so that a rerun need not even trace them.
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import jax

from mx_proxy.training.paths import checked_path, env_path

__all__ = ["ENV", "OFF", "MIN_COMPILE_TIME_S", "MIN_ENTRY_SIZE_BYTES", "default_dir", "resolve", "enable", "active_dir",
           "entries"]

ENV = "PROXY_COMPILE_CACHE"
OFF = ("off", "0", "false", "no", "none")
MIN_COMPILE_TIME_S = 0.1  # not the eager single operations (JAX's default: 1 s; see the module docstring)
MIN_ENTRY_SIZE_BYTES = 0  # and however small
# A size cap turns on JAX's file lock around every cache read and write. Without one JAX writes an entry in
# place, unlocked, and a process reading an entry that another is still writing (two pytest-xdist workers, the
# figures command's worker processes) can crash deserializing the half-written file.
MAX_SIZE_BYTES = 16 * 2 ** 30


def default_dir() -> Path:
    """``$XDG_CACHE_HOME/proxy/jax``, else ``~/.cache/proxy/jax``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "proxy" / "jax"


def _valid() -> str:
    return f"a folder path, or {ENV}=off to turn the cache off"


def _env_folder() -> Path | None:
    """``$PROXY_COMPILE_CACHE`` as a folder (:func:`mx_proxy.training.paths.env_path`), ``None`` for off; a
    ValueError naming the variable and its value for one that is no folder."""
    return env_path(ENV, "the compilation cache folder", off=OFF)


def resolve(path: str | os.PathLike | None = None) -> Path | None:
    """The folder :func:`enable` would use (see the module docstring for the
    order), or ``None`` when ``$PROXY_COMPILE_CACHE`` turns the cache off.

    Raises:
      ValueError: ``path`` or ``$PROXY_COMPILE_CACHE`` is no folder path (a
        file, empty, an unknown ``~user``, a symbolic-link loop), naming the
        value and the valid choices.
    """
    if path is not None:
        try:
            return checked_path(path, "compilation cache path", folder=True)
        except ValueError as e:
            raise ValueError(f"{e}; valid: {_valid()}") from None
    if ENV in os.environ:
        return _env_folder()
    configured = jax.config.jax_compilation_cache_dir
    if configured:
        return Path(configured)
    return default_dir()


def _fallback() -> Path:
    configured = jax.config.jax_compilation_cache_dir
    return Path(configured) if configured else default_dir()


def enable(path: str | os.PathLike | None = None) -> Path | None:
    """Turn on JAX's persistent compilation cache in ``path`` (or the folder
    :func:`resolve` picks) with the thresholds above.

    Returns the cache folder, or ``None`` when ``$PROXY_COMPILE_CACHE`` says
    ``off`` (then JAX's configuration is left as it was). Safe to call again:
    pointing it at another folder takes effect for the next compile. The
    variable only tunes, so a bad ``$PROXY_COMPILE_CACHE`` (a file, empty,
    an unknown ``~user``, a folder that cannot be created) is one warning
    naming it, and the default folder is used; a default folder that cannot
    be created only warns (and leaves the cache off); a ``path`` you pass
    must work.

    Raises:
      ValueError: a bad ``path`` (see :func:`resolve`).
      OSError: a ``path`` whose folder cannot be created.
    """
    folder = resolve(path) if path is not None else None
    if path is None:
        try:
            folder = resolve()
        except ValueError as err:
            folder = _fallback()
            warnings.warn(f"proxy: {err}; using {folder}", stacklevel=2)
        if folder is None:
            return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        if path is not None:
            raise
        where = f"${ENV} {os.environ[ENV]!r}" if ENV in os.environ else "the default"
        warnings.warn(f"proxy: cannot create the compilation cache folder {str(folder)!r} ({where}: "
                      f"{err.strerror or err}); compiling without a persistent cache. Set {ENV} to a writable "
                      f"folder, or to 'off'.", stacklevel=2)
        return None
    from jax.experimental.compilation_cache import compilation_cache as cc

    previous = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_TIME_S)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", MIN_ENTRY_SIZE_BYTES)
    jax.config.update("jax_compilation_cache_max_size", MAX_SIZE_BYTES)
    _stamp_unstamped(folder)
    if previous and Path(previous) != folder:
        cc.reset_cache()  # JAX opens its cache folder once; reopen it at the new place
    return folder


def _stamp_unstamped(folder: Path) -> None:
    """Give every entry without one the access-time file that JAX's capped
    cache keeps beside each entry (entries written without a cap have none,
    and JAX's eviction would fail on them at every write)."""
    now = time.time_ns().to_bytes(8, "little")
    for entry in folder.glob("*-cache"):
        stamp = entry.with_name(entry.name[: -len("-cache")] + "-atime")
        if not stamp.exists():
            try:
                stamp.write_bytes(now)
            except OSError:
                return  # a read-only cache folder: JAX then cannot write entries either


def active_dir() -> Path | None:
    """The folder JAX caches compiled programs in now, or ``None``."""
    d = jax.config.jax_compilation_cache_dir
    return Path(d) if d and jax.config.jax_enable_compilation_cache else None


def entries(folder: str | os.PathLike | None = None) -> tuple[int, int]:
    """(number of cached programs, their total bytes) in ``folder`` (default:
    :func:`active_dir`); (0, 0) for a missing folder or none."""
    folder = Path(folder) if folder is not None else active_dir()
    if folder is None or not folder.is_dir():
        return 0, 0
    files = [p for p in folder.iterdir() if p.is_file() and p.name.endswith("-cache")]
    return len(files), sum(p.stat().st_size for p in files)
