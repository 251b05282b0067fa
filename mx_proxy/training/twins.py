"""One FP32 twin for several MX runs: paired runs that differ only in their recipe.

A paired run (``Config.paired_run``) trains its reference run (FP32 by
default) alongside, from the same init, on the same batches, at the same LR.
When k such runs differ only in ``recipe``, their reference runs are one and
the same run; a :class:`TwinProgram` trains it once beside the k students
(k MX recipes cost 1 + k runs, not 2k). Every step draws the batch once,
takes the reference step once (:meth:`mx_proxy.training.engine.Program.reference_step`)
and then each student's step against it with that student's own
:class:`~mx_proxy.training.engine.Program` (:meth:`~mx_proxy.training.engine.Program.student_step`,
:meth:`~mx_proxy.training.engine.Program.finish_step`), so each member's metrics and
state are those of its separately paired run (``tests/training/test_twins.py``
checks them bit for bit). Member ``i`` of a :class:`TwinState` is an ordinary
paired :class:`~mx_proxy.training.engine.TrainState` (:func:`member`): its checkpoints,
store entries, resumption and interventions are those of a paired run.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from mx_proxy.training.config import Config
from mx_proxy.training.engine import TrainState, program_for, run_steps, static_key

__all__ = ["TwinState", "TwinProgram", "shareable", "twin_key", "member", "twin_state"]


class TwinState(NamedTuple):
    """k students (``TrainState`` without their reference fields) and the one reference run."""

    students: tuple
    ref_params: Any
    ref_opt: Any

    @property
    def diverged(self):
        """(k,) divergence flags of the students."""
        return jnp.stack([s.diverged for s in self.students])


def twin_key(config: Config) -> Config:
    """What members of one twin group share: the config with its recipe set aside."""
    return static_key(config).replace(recipe="fp32")


def shareable(configs: list[Config]) -> bool:
    """True when ``configs`` (two or more) are paired runs that differ only in
    ``recipe`` and can share one reference run: no controller (its promoted
    branch is a ``lax.cond`` around the whole step), the batches of the
    reference are the student's own, and no two share a recipe."""
    if len(configs) < 2 or any(not c.has_paired_run or c.controller is not None
                               or c.reference_data_seed is not None for c in configs):
        return False
    first = configs[0].replace(recipe="fp32")
    return (all(c.replace(recipe="fp32") == first for c in configs)
            and len({c.recipe for c in configs}) == len(configs))


def member(state: TwinState, i: int) -> TrainState:
    """Member ``i`` as the paired :class:`TrainState` of its separate run."""
    return state.students[i]._replace(ref_params=state.ref_params, ref_opt=state.ref_opt)


def twin_state(states: list[TrainState]) -> TwinState:
    """The :class:`TwinState` of the members' paired states (all at one step:
    their reference fields are equal, the first one's are kept)."""
    return TwinState(tuple(s._replace(ref_params=None, ref_opt=None) for s in states),
                     states[0].ref_params, states[0].ref_opt)


class TwinProgram:
    """The compiled pieces of a twin group: ``segment`` and ``val_loss`` over
    a :class:`TwinState` (pure; one :class:`Program` per member recipe)."""

    def __init__(self, configs: tuple[Config, ...]):
        if not shareable(list(configs)):
            raise ValueError("a twin group needs two or more paired configs that differ only in recipe, without a "
                             "controller or reference_data_seed")
        self.programs = tuple(program_for(c) for c in configs)

    def _step(self, state: TwinState, t, dyn, teacher):
        first = self.programs[0]
        lr = first.lr_at(dyn, t)
        x, y = first._batch(dyn, teacher, t)
        ref = first.reference_step(state.ref_params, state.ref_opt, x, y, lr)
        students, metrics = [], []
        for i, program in enumerate(self.programs):
            s = member(state, i)
            new, m = program.finish_step(s, t, dyn, lr, None, program.student_step(s, t, dyn, x, y, lr, ref))
            students.append(new._replace(ref_params=None, ref_opt=None))
            metrics.append(m)
        # each member's finish_step masked the same reference update the same way; keep one copy
        ref_ok = jnp.isfinite(ref[0])
        ref_params = jax.tree.map(lambda a, b: jnp.where(ref_ok, a, b), ref[2], state.ref_params)
        ref_opt = jax.tree.map(lambda a, b: jnp.where(ref_ok, a, b), ref[3], state.ref_opt)
        return TwinState(tuple(students), ref_params, ref_opt), tuple(metrics)

    def segment(self, state: TwinState, dyn, teacher, start, n, *, size: int):
        """``n`` steps from ``start`` (:func:`~mx_proxy.training.engine.run_steps`);
        a tuple of each member's metrics stacked over ``size`` rows (members
        may record different columns)."""
        return run_steps(lambda s, t: self._step(s, t, dyn, teacher), state, start, n, size)

    def val_loss(self, state: TwinState, dyn, teacher):
        """(k,) held-out losses of the students."""
        return jnp.stack([p.val_loss(s.params, dyn, teacher) for p, s in zip(self.programs, state.students)])
