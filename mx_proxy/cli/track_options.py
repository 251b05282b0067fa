"""``--track tensorboard|mlflow`` and ``--track-dir``: every command that trains streams its runs' metrics with them.

``train``, ``sweep``, ``campaign``, ``ensemble`` and ``figures`` take them
(:func:`add_track_options`); :func:`tracking_from_args` turns them into a
:class:`~mx_proxy.experiments.tracking.Tracking` before any work starts, and
the command trains inside ``tracking.active(...)``, which its worker
processes and Slurm jobs inherit. A tracker whose package is not installed,
``--track-dir`` without ``--track``, or ``--track`` with no run store and no
``--track-dir`` is one message naming what to do (exit status 2).
"""

from __future__ import annotations

import argparse

from mx_proxy.experiments import tracking

__all__ = ["add_track_options", "tracking_from_args"]


def add_track_options(p: argparse.ArgumentParser) -> None:
    """Add ``--track`` and ``--track-dir`` to ``p``."""
    g = p.add_argument_group("following the runs in a tracker (off by default)")
    g.add_argument("--track", choices=tracking.KINDS,
                   help="stream each run's metrics (every column: loss, ζ, cosine, clamp fractions, GNMR signals) as "
                        "it trains: TensorBoard event files (pip install 'mx-proxy[tensorboard]') or an MLflow store "
                        "(pip install 'mx-proxy[mlflow]'); worker processes and Slurm jobs stream too")
    g.add_argument("--track-dir", metavar="DIR",
                   help="where: a folder (default: RUN_STORE/tensorboard or RUN_STORE/mlruns, beside the runs; on "
                        "a cluster, on the shared filesystem); for mlflow also a tracking URI (http://host:5000)")


def tracking_from_args(args, store, experiment: str = "mx-proxy") -> tracking.Tracking | None:
    """The tracking the options ask for (``None``: none), beside the run
    ``store`` unless ``--track-dir`` says where; ``experiment``: the MLflow
    experiment. Raises a ValueError naming a bad combination or the pip extra
    a tracker needs."""
    kind, where = getattr(args, "track", None), getattr(args, "track_dir", None)
    if kind is None:
        if where is not None:
            raise ValueError(f"--track-dir {where}: it says where --track writes; add --track "
                             f"{' or '.join(tracking.KINDS)}")
        return None
    spec = tracking.Tracking.beside(kind, store, where, experiment)
    tracking.check_installed(kind)
    return spec
