"""The runs on a member axis and where each starts: :class:`Member` (its config, train state, teacher,
checkpoint sink and history), a fresh one from its seed or one resumed from its newest valid checkpoint in the
run store (:func:`prepare_member`)."""

from __future__ import annotations

import dataclasses

from mx_proxy.runner import programs
from mx_proxy.store import checkpoint as ckpt
from mx_proxy.store import run_store as _store
from mx_proxy.training.config import Config
from mx_proxy.training.engine import TrainState, dynamic_for, program_for, static_key

__all__ = ["Member", "init_state", "prepare_member"]


@dataclasses.dataclass
class Member:
    """One run on the member axis: its config, train state and teacher, its
    checkpoint sink, the step it starts from, the metrics it already has (an
    intervention's parent history, a resumed run's past), its provenance and
    the wall seconds it already spent (a resumed run's, from its checkpoint)."""

    config: Config
    state: TrainState
    teacher: object
    sink: ckpt.CheckpointSink
    start: int = 0
    frames: list = dataclasses.field(default_factory=list)
    info: dict = dataclasses.field(default_factory=dict)
    wall_before: float = 0.0


def init_state(config: Config):
    """(initial TrainState, teacher params) of ``config``."""
    return programs.init(static_key(config))(dynamic_for(config))


def prepare_member(config: Config, st: _store.Store | None, key: str, force: bool,
                   at: int | None = None) -> Member:
    """A fresh member of ``config``, resumed from its last checkpoint in the
    store's training folder when there is one of this code and config (the
    last one at or before step ``at`` when given); a checkpoint that fails
    its checks is moved aside and the next newest tried."""
    state, teacher = init_state(config)
    info = {"key": key}
    if st is None:
        return Member(config, state, teacher, ckpt.CheckpointSink(memory={}), info=info)
    st.prepare(key, fresh=force)
    sink = ckpt.CheckpointSink(st.checkpoint_dir(key))
    for step in reversed([s for s in sink.steps() if s <= (config.steps if at is None else at)]):
        try:
            meta = sink.meta(step)
            if meta.get("config_hash") != config.hash():
                continue
            state, past = sink.restore(step, ckpt.template(program_for(config), dynamic_for(config)), config)
        except ckpt.CheckpointError as e:
            ckpt.set_aside(sink.directory, step, str(e))
            continue
        info["resumed_from"] = step
        if meta.get("device"):
            info["device"] = meta["device"]  # the machines of the stretches before this one
        wall = float(meta.get("wall_time_s", 0.0))  # the stretches before this one
        return Member(config, state, teacher, sink, step, [past], info, wall)
    return Member(config, state, teacher, sink, 0, [], info, 0.0)
