"""Importing submitit without it resetting the process's logging.

On its first import submitit configures its logger with
``logging.config.dictConfig``, which first shuts down and closes every
handler the process already has: a notebook's, a user's, absl's (whose
stream can be a test runner's captured ``sys.stderr``, closed under it).
:func:`import_submitit` imports it with that configuration switched off
(``SUBMITIT_LOG_LEVEL=NOCONFIG``, for the import only, unless the user set
the variable) and gives the ``submitit`` logger the handlers submitit's own
configuration would (everything to ``sys.stdout``, warnings also to
``sys.stderr``), leaving every other logger and handler as it was.
"""

from __future__ import annotations

import logging
import os
import sys
from types import ModuleType

__all__ = ["import_submitit", "LOG_VARIABLE"]

LOG_VARIABLE = "SUBMITIT_LOG_LEVEL"
_FORMAT = "%(name)s %(levelname)s (%(asctime)s) - %(message)s"
_OURS = "_mx_proxy_submitit_handler"


def import_submitit() -> ModuleType:
    """``submitit`` with ``submitit.helpers`` and ``submitit.slurm.slurm``
    loaded (raises ``ModuleNotFoundError`` without it)."""
    chosen = os.environ.get(LOG_VARIABLE)
    if chosen is None:
        os.environ[LOG_VARIABLE] = "NOCONFIG"
    try:
        import submitit
        import submitit.helpers
        import submitit.slurm.slurm
    finally:
        if chosen is None:
            os.environ.pop(LOG_VARIABLE, None)
    if chosen is None:
        _configure_logger()
    return submitit


def _configure_logger() -> None:
    """The two handlers of submitit's own configuration, on its logger only (once)."""
    logger = logging.getLogger("submitit")
    if any(getattr(h, _OURS, False) for h in logger.handlers):
        return
    for stream, level in ((sys.stdout, logging.DEBUG), (sys.stderr, logging.WARNING)):
        handler = logging.StreamHandler(stream)
        handler.setLevel(level)
        handler.setFormatter(logging.Formatter(_FORMAT))
        setattr(handler, _OURS, True)
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
