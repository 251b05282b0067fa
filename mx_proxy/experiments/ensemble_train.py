"""The notebook's entry point to ensembles: :func:`ensemble` (``mxp.ensemble``) trains, resumes or loads N
perturbed members per arm and returns their :class:`~mx_proxy.experiments.ensemble_result.EnsembleResult`."""

from __future__ import annotations

from mx_proxy.experiments import branch as _branch
from mx_proxy.experiments import ensemble as _ens
from mx_proxy.experiments import lean as _lean
from mx_proxy.experiments.ensemble import Ensemble
from mx_proxy.experiments.ensemble_result import EnsembleResult, load
from mx_proxy.runner import loop as runner
from mx_proxy.training.config import Config
from mx_proxy.training.paths import checked_path

__all__ = ["ensemble"]


def _quiet(*_args) -> None:
    pass


def _default_name(base: Config, kind: str, branch_at: int | None) -> str:
    where = f"-at{branch_at}" if kind == "branch" else ""
    return f"{base.recipe.name}-w{base.width}-s{base.seed}-{kind}{where}"


def ensemble(source, *, arms, members: int, horizon: int, branch_at: int | None = None, kind: str | None = None,
             name: str | None = None, out=None, epsilon: float = 0.0, first_seed: int = 1,
             diagnostics_every: int | None = None, checkpoint_every: int = 100, jobs: int = 1,
             group_size: int | None = None, lean: bool = False, progress: bool = True) -> EnsembleResult:
    """Train ``members`` replicas per arm and return their rates.

    Args:
      source: a :class:`Config` (``seed``/``data`` kinds: the members' base;
        ``branch``: trained, or loaded, in ``out/runs`` and branched at
        ``branch_at``, replayed there when it kept no checkpoint), a
        :class:`Run` or a stored run's folder (``branch``), or a branch
        state's folder.
      kind: ``seed``, ``data`` or ``branch`` (default: ``branch`` when
        ``branch_at`` is given, else ``seed``).
      out: the ensemble's folder (default ``~/.cache/proxy/ensembles/<name>``);
        an interrupted ensemble resumes there.
      jobs, group_size: worker processes, and members per unit of work
        (:func:`mx_proxy.experiments.ensemble.run`).
      lean: the lean mode for rates (:mod:`mx_proxy.experiments.lean`): diagnostics only every
        ``diagnostics_every`` steps if given (the signals to score), else never; the loss every step either way.
      progress: progress bars and a line per finished unit; ``False`` trains
        silently (a notebook's output then stays the same when a rerun loads
        the members instead of training them).
      Other arguments: see :class:`mx_proxy.experiments.ensemble.Ensemble`.

    Example::

        ens = mxp.ensemble(run, branch_at=4000, members=16, arms=["unchanged", "fp32", "rceil"], horizon=1500)
        ens.rates()
    """
    kind = kind or ("branch" if branch_at is not None else "seed")
    if kind not in _ens.KINDS:
        raise ValueError(f"unknown ensemble kind {kind!r}; valid: {', '.join(_ens.KINDS)}")
    if kind == "branch":  # the base, read without writing or training anything: the spec is checked first
        base = source if isinstance(source, Config) else _branch.source_config(source)
    elif isinstance(source, Config):
        base = source
    else:
        raise TypeError(f"a {kind} ensemble needs a mxp.Config as its source, got {type(source).__name__}")
    name = name or _default_name(base, kind, branch_at)
    spec = Ensemble(name, kind, base, tuple([arms] if isinstance(arms, str) else arms), members, horizon,
                    branch_at=branch_at, epsilon=epsilon, first_seed=first_seed, diagnostics_every=diagnostics_every,
                    checkpoint_every=checkpoint_every)
    if lean:
        spec = _lean.lean(spec, signals=diagnostics_every is not None, twin=True,
                          period=diagnostics_every or _lean.SIGNAL_PERIOD)
    out = checked_path(_ens.default_out(name) if out is None else out, "the ensemble's folder (out)", folder=True)
    if kind == "branch" and isinstance(source, Config):
        source = runner.train(source, store=out / "runs", progress=progress)
    _ens.run(spec, out, source=source if kind == "branch" else None, jobs=jobs, group_size=group_size,
             progress=progress, log=print if progress else _quiet)
    return load(out / "results")
