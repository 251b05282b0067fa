"""A user's path resolved once, early: an argument, a flag or an environment variable.

:func:`checked_path` turns a path into an absolute one, or a ValueError that
quotes it as given and says what is wrong: not a path, empty, an unknown
``~user``, a symbolic-link loop, a file where a folder should be (or the
other way round), a file on the way to it. Every command resolves its paths
with it before any work starts, and a command's ``--status`` resolves the
same flag the same way (``~/x`` is the home folder's ``x`` for both).

:func:`env_path` reads an environment variable that names a folder the same
way, naming the variable in its error: ``$PROXY_ENSEMBLES`` (where
ensembles go: a bad value is an error) and ``$PROXY_COMPILE_CACHE`` (which
only tunes: a bad value is one warning and the default,
:mod:`mx_proxy.training.compile_cache`).
"""

from __future__ import annotations

import os
from pathlib import Path

from mx_proxy.training.values import ArgumentTypeError

__all__ = ["checked_path", "env_path"]


def checked_path(path, what: str, *, folder: bool | None = None) -> Path:
    """``path`` as an absolute path (``~`` expanded, links resolved), or a
    ValueError naming ``what`` it is for and quoting ``path``: not a path,
    empty, an unknown ``~user``, a symbolic-link loop, or (``folder``
    True/False) a file where a folder should be or the other way round;
    also a file on the way to it."""
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentTypeError(f"{what} must be a path (str or os.PathLike), got {type(path).__name__}")
    text = os.fspath(path)
    if not str(text).strip():
        raise ValueError(f"{what} must name a path, got an empty one")
    try:
        p = Path(text).expanduser()
    except RuntimeError:  # ~unknownuser, or no home folder at all
        user = str(text)[1:].replace(os.sep, "/").split("/")[0]
        why = f"no such user {user!r}" if user else "no home folder to expand '~' to ($HOME is unset)"
        raise ValueError(f"{what} {str(text)!r}: {why}") from None
    try:
        p = p.resolve()
    except (RuntimeError, OSError) as e:  # a symbolic-link loop
        raise ValueError(f"{what} {str(text)!r}: a symbolic-link loop ({e})") from None
    up = p
    while not up.exists() and up != up.parent:
        up = up.parent
    if up != p and not up.is_dir():
        raise ValueError(f"{what} {str(text)!r}: {str(up)!r} is a file, not a folder")
    if folder is True and p.exists() and not p.is_dir():
        raise ValueError(f"{what} {str(text)!r} is a file, not a folder")
    if folder is False and p.is_dir():
        raise ValueError(f"{what} {str(text)!r} is a folder, not a file")
    return p


def env_path(variable: str, what: str, *, folder: bool = True, off=()) -> Path | None:
    """The path in environment variable ``variable`` (:func:`checked_path`,
    a folder unless ``folder`` is False), ``None`` where it is unset or one
    of ``off`` (compared case-blind); a ValueError naming ``$variable``, its
    value and the valid choices otherwise (an empty or blank value too)."""
    value = os.environ.get(variable)
    if value is None or value.strip().lower() in off:
        return None
    valid = "a folder path" if folder else "a file path"
    valid += f", or one of {', '.join(off)}" if off else ", or leave it unset for the default"
    if not value.strip():
        raise ValueError(f"${variable} ({what}) is empty ({value!r}); valid: {valid}")
    try:
        return checked_path(value, f"${variable} ({what})", folder=folder)
    except ValueError as e:
        raise ValueError(f"{e}; valid: {valid}") from None
