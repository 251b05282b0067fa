"""Whether a tracking server answers, asked with a bounded timeout before any run streams to it.

MLflow's client retries an unreachable server with exponential backoff
(``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` 7 times, ``MLFLOW_HTTP_REQUEST_TIMEOUT``
120 s each by default): with ``--track mlflow`` pointed at a host that is
down, a 20-step run stalled about four minutes, and every run again. So
:func:`unreachable` opens one TCP connection to an ``http(s)://`` tracking
URI within :data:`CONNECT_TIMEOUT_S` first (:func:`mx_proxy.experiments.tracking.active`
then warns once and trains untracked), and :func:`bound_requests` caps
MLflow's own timeout and retries for a server that goes away later (unless
the user set them).
"""

from __future__ import annotations

import os
import re
import socket
import urllib.parse
import warnings

__all__ = ["TrackingWarning", "CONNECT_TIMEOUT_S", "REQUESTS", "is_uri", "unreachable", "reachable",
           "bound_requests"]

class TrackingWarning(UserWarning):
    """A tracker failed; the run trains on without streaming to it."""


CONNECT_TIMEOUT_S = 5.0
"""Seconds :func:`unreachable` waits for the server to accept a connection."""

REQUESTS = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2"}
"""MLflow's HTTP settings :func:`bound_requests` sets where they are unset: at most ~40 s per failing call."""


def is_uri(where: str) -> bool:
    """Whether ``where`` is a URI (``scheme://…``), not a folder."""
    return re.match(r"^[a-z][a-z0-9+.-]*://", where) is not None


def unreachable(uri: str, timeout: float = CONNECT_TIMEOUT_S) -> str | None:
    """Why the tracking server at ``uri`` (``http://host:port``, ``https://…``) accepts no connection within
    ``timeout`` seconds, or ``None`` where it does (or ``uri`` is no HTTP URI: a folder, a database)."""
    parts = urllib.parse.urlsplit(str(uri))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as e:  # a port that is no number
        return f"a bad port ({e})"
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout).close()
    except OSError as e:
        return f"{type(e).__name__}: {e.strerror or e}"
    return None


def bound_requests() -> None:
    """Set :data:`REQUESTS` in this process's environment where unset (worker processes inherit them)."""
    for name, value in REQUESTS.items():
        os.environ.setdefault(name, value)


def reachable(uri: str) -> bool:
    """Whether runs may stream to the tracking store ``uri``: a folder, or a server that accepts a connection
    within :data:`CONNECT_TIMEOUT_S` (its MLflow requests then bounded, :func:`bound_requests`); a server that
    does not is one :class:`TrackingWarning` (naming it and why) and ``False``."""
    down = unreachable(uri)
    if down is not None:
        warnings.warn(f"--track mlflow: the tracking server {uri} accepts no connection within "
                      f"{CONNECT_TIMEOUT_S:g} s ({down}); training goes on untracked", TrackingWarning, stacklevel=4)
        return False
    if is_uri(uri):
        bound_requests()
    return True
