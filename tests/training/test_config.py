"""``Config``'s JSON and hash (the run store's key), the rule that keeps every key when a field is added, and the
traced values the engine derives from the field declarations."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from mx_proxy.training import config_json, dynamic, engine
from mx_proxy.training.config import DYNAMIC, Config, fields_of_kind

RESULTS = Path(__file__).resolve().parents[2] / "results" / "paper"

# every field of schema 2: always in the dict; a field added since is keyed_when_set (config_json.SCHEMA)
SCHEMA_2_FIELDS = (
    "act", "adam_eps", "arch", "batch", "beta1", "beta2", "checkpoint_at", "checkpoint_every", "controller",
    "data_seed", "depth", "diagnostic_format", "diagnostics_every", "dot", "gradient_reference", "init", "init_gain",
    "lr", "lr_min", "momentum", "noise", "norm", "optimizer", "paired_run", "recipe", "reference_data_seed",
    "reference_recipe", "reference_seed", "schedule", "seed", "spike_factor", "steps", "teacher_act",
    "teacher_depth", "teacher_seed", "teacher_width", "val_batches", "val_every", "warmup_steps", "width")


@pytest.mark.parametrize("run", ["paired-w512-mxfp8_e4m3-lr6e-4-s0", "paired-w512-paper_e4m3-lr6e-4-s0"])
def test_the_committed_runs_keep_their_keys(run):
    """The headline runs' config.json, read back, hashes to the key they were stored under."""
    config = Config.from_dict(json.loads((RESULTS / run / "config.json").read_text()))
    key = json.loads((RESULTS / run / "run.json").read_text())["key"]
    assert config.hash() == key == {"paired-w512-mxfp8_e4m3-lr6e-4-s0": "9af1c692f612e073",
                                    "paired-w512-paper_e4m3-lr6e-4-s0": "2c37f4e1bbfbb668"}[run]
    assert json.loads(config.to_json()) == json.loads((RESULTS / run / "config.json").read_text())


def test_pinned_hashes_of_known_configs():
    assert Config().hash() == "5207c0c16a0efb4b"
    assert Config(width=16, depth=2, recipe="mxfp8_e4m3", controller="gnmr", reference_seed=3, paired_run=True,
                  checkpoint_at=(10,), steps=20, diagnostics_every=5, val_every=10).hash() == "41e0ef72498c252a"


def test_fields_added_after_schema_2_enter_the_key_only_when_set():
    fields = {f.name: f for f in dataclasses.fields(Config)}
    added = {n for n, f in fields.items() if f.metadata["keyed_when_set"]}
    assert set(fields) == set(SCHEMA_2_FIELDS) | added and not added & set(SCHEMA_2_FIELDS)
    assert "quant_stats" in added
    base = Config()
    assert set(base.to_dict()) == set(SCHEMA_2_FIELDS) | {"schema"}
    on = base.replace(quant_stats=True)
    assert on.to_dict()["quant_stats"] is True and on.hash() != base.hash()
    assert Config.from_dict(on.to_dict()) == on and Config.from_dict(base.to_dict()) == base
    old = base.to_dict()
    assert "quant_stats" not in old and Config.from_dict(old).quant_stats is False
    assert config_json.SCHEMA == 2


def test_dynamic_has_one_slot_per_dynamic_field_filled_from_the_declarations():
    assert engine.Dynamic is dynamic.Dynamic and engine.Dynamic._fields == fields_of_kind(DYNAMIC)
    c = Config(lr=3e-3, steps=70, seed=5, data_seed=6, teacher_seed=7, paired_run=True)
    d = engine.dynamic_for(c)
    assert d.lr.dtype == np.float32 and float(d.lr) == np.float32(3e-3) and float(d.steps) == 70.0
    for name, seed in (("seed", 5), ("data_seed", 6), ("teacher_seed", 7)):
        np.testing.assert_array_equal(getattr(d, name), np.array([0, seed], np.uint32))
    # the paired run's seeds default to the student's (their none_means)
    np.testing.assert_array_equal(d.reference_seed, d.seed)
    np.testing.assert_array_equal(d.reference_data_seed, d.data_seed)
    np.testing.assert_array_equal(engine.dynamic_for(c.replace(reference_seed=9)).reference_seed, [0, 9])
