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


def import_submitit() -> ModuleType:
    """``submitit`` with ``submitit.helpers`` and ``submitit.slurm.slurm``
    loaded (raises ``ModuleNotFoundError`` without it). Only the call that
    imports it first, with ``SUBMITIT_LOG_LEVEL`` unset, configures its
    logger: where submitit was imported already, it configured itself."""
    quiet = "submitit" not in sys.modules and os.environ.get(LOG_VARIABLE) is None
    if quiet:
        os.environ[LOG_VARIABLE] = "NOCONFIG"
    try:
        import submitit
        import submitit.helpers
        import submitit.slurm.slurm
    finally:
        if quiet:
            os.environ.pop(LOG_VARIABLE, None)
    if quiet:
        _configure_logger()
    return submitit


def _configure_logger() -> None:
    """The two handlers of submitit's own configuration, on its logger only."""
    logger = logging.getLogger("submitit")
    for stream, level in ((sys.stdout, logging.DEBUG), (sys.stderr, logging.WARNING)):
        handler = logging.StreamHandler(stream)
        handler.setLevel(level)
        handler.setFormatter(logging.Formatter(_FORMAT))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
