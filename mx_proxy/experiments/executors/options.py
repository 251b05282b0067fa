"""The Slurm executor's options, validated before anything is submitted.

Each option is checked where it is made (:class:`SlurmOptions`), so the API
and every command (``--slurm-time``, ``--slurm-option KEY=VALUE``, …) refuse
a bad value with the same message, naming the value and what is valid.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["SlurmOptions", "parse_time", "parse_extra", "RESERVED"]

_TIME_FORMS = "MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-HOURS, DAYS-HOURS:MINUTES or " \
              "DAYS-HOURS:MINUTES:SECONDS (sbatch --time)"

RESERVED = ("array", "output", "error", "open-mode", "signal", "job-name", "wrap")
"""sbatch options the executor sets itself (the array, the log files, the
preemption signal): ``--slurm-option`` may not set them."""

_OWN = {"partition": "--slurm-partition", "time": "--slurm-time", "gpus-per-task": "--slurm-gpus-per-task",
        "cpus-per-task": "--slurm-cpus-per-task"}


def parse_time(text) -> int:
    """Minutes (rounded up, at least 1) of a Slurm time limit: ``90``,
    ``1:30:00``, ``2-00:00:00``…; a ValueError names the forms."""
    s = str(text).strip()
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", s)
    if not m:
        raise ValueError(f"slurm time {text!r} is not a Slurm time limit; valid forms: {_TIME_FORMS}")
    days, a, b, c = m.groups()
    if days is not None:  # D-H, D-H:M, D-H:M:S
        seconds = int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    elif c is not None:  # H:M:S
        seconds = int(a) * 3600 + int(b) * 60 + int(c)
    elif b is not None:  # M:S
        seconds = int(a) * 60 + int(b)
    else:  # M
        seconds = int(a) * 60
    if seconds <= 0:
        raise ValueError(f"slurm time {text!r} must be longer than 0; valid forms: {_TIME_FORMS}")
    return max(1, -(-seconds // 60))


def parse_extra(items) -> dict[str, str]:
    """``KEY=VALUE`` strings (``mem=8G``, ``--account=proj``, ``exclusive``)
    as sbatch options for submitit's ``additional_parameters``; a bare
    ``KEY`` is a flag. A ValueError names a malformed one, or one the
    executor sets itself."""
    out: dict[str, str] = {}
    for item in items or ():
        key, eq, value = str(item).partition("=")
        key = key.strip().lstrip("-").replace("_", "-")
        if not re.fullmatch(r"[a-z][a-z0-9-]*", key):
            raise ValueError(f"slurm option {item!r} is not KEY=VALUE with an sbatch option name as KEY "
                             f"(e.g. mem=8G, account=proj, qos=high, constraint=a100, exclusive)")
        if key in RESERVED:
            raise ValueError(f"slurm option {key!r} is set by the executor itself; options it sets: "
                             f"{', '.join(RESERVED)}")
        if key in _OWN:
            raise ValueError(f"slurm option {key!r} has its own flag: {_OWN[key]}")
        out[key] = value if eq else True
    return out


def _count(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class SlurmOptions:
    """How each unit's job asks Slurm for resources (one task of one array job per unit).

    Attributes:
      partition: ``--partition`` (``None``: the cluster's default).
      time: the time limit per job, in minutes, or a Slurm time string
        (``"2:00:00"``); a unit longer than it checkpoints at the warning
        signal and is requeued (up to ``max_requeues`` times).
      gpus_per_task: ``--gpus-per-task`` (0: none).
      cpus_per_task: ``--cpus-per-task``; XLA uses that many threads.
      array_parallelism: most tasks of the array running at once.
      setup: shell lines run before each job (``module load cuda``, ``source .venv/bin/activate``).
      extra: any other sbatch options, ``{"mem": "8G", "account": "proj"}``
        (:func:`parse_extra` takes ``KEY=VALUE`` strings).
      signal_delay_s: how long before the time limit Slurm warns the job
        (``SIGUSR2``): at least one segment of training (up to ``val_every``
        or ~100 steps; minutes for a big run on a CPU), so the job can
        checkpoint and requeue before it is killed.
      max_requeues: how often a unit may be requeued after a time limit.
      poll_s: seconds between two looks at the jobs' states.
    """

    partition: str | None = None
    time: int | str = 60
    gpus_per_task: int = 0
    cpus_per_task: int = 1
    array_parallelism: int = 256
    setup: tuple[str, ...] = ()
    extra: Mapping[str, object] = dataclasses.field(default_factory=dict)
    signal_delay_s: int = 300
    max_requeues: int = 20
    poll_s: float = 5.0

    def __post_init__(self):
        if self.partition is not None and not re.fullmatch(r"[A-Za-z0-9_.,-]+", str(self.partition)):
            raise ValueError(f"slurm partition {self.partition!r} is not a partition name (letters, digits, "
                             f"'_', '-', '.'; several separated by ',')")
        object.__setattr__(self, "time", parse_time(self.time))
        _count("slurm gpus per task", self.gpus_per_task, 0)
        _count("slurm cpus per task", self.cpus_per_task, 1)
        _count("slurm array parallelism", self.array_parallelism, 1)
        _count("max_requeues", self.max_requeues, 0)
        _count("slurm signal delay", self.signal_delay_s, 1)
        if self.signal_delay_s >= self.time * 60:
            raise ValueError(f"slurm signal delay ({self.signal_delay_s} s) must be shorter than the time limit "
                             f"({self.time} min)")
        if isinstance(self.poll_s, bool) or not isinstance(self.poll_s, (int, float)) or self.poll_s <= 0:
            raise ValueError(f"poll_s must be a positive number of seconds, got {self.poll_s!r}")
        setup = (self.setup,) if isinstance(self.setup, str) else tuple(self.setup)
        if not all(isinstance(line, str) for line in setup):
            raise ValueError(f"slurm setup must be shell lines (strings), got {self.setup!r}")
        object.__setattr__(self, "setup", setup)
        extra = parse_extra(f"{k}={v}" if v is not True else k for k, v in dict(self.extra).items())
        object.__setattr__(self, "extra", MappingProxyType(extra))

    def parameters(self) -> dict:
        """These options as :meth:`submitit.SlurmExecutor.update_parameters` takes them."""
        out = {"time": self.time, "cpus_per_task": self.cpus_per_task, "array_parallelism": self.array_parallelism,
               "job_name": "mx-proxy", "setup": list(self.setup), "additional_parameters": dict(self.extra),
               "signal_delay_s": self.signal_delay_s}
        if self.partition:
            out["partition"] = self.partition
        if self.gpus_per_task:
            out["gpus_per_task"] = self.gpus_per_task
        return out
