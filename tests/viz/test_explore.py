"""The live explorer, driven headless: controls → configs, a live training with FP32 alongside, the store."""


import time

import numpy as np
import pandas as pd
import pytest

import mx_proxy as mxp
import mx_proxy.viz.explore as explore_module
from mx_proxy.store import checkpoint as ckpt
from mx_proxy.store import executables
from mx_proxy.training.engine import static_key
from mx_proxy.training.result import Run
from mx_proxy.viz.explore import Explorer, base_config, train_live
from mx_proxy.viz.explore_controls import CompileTimes

SMALL = dict(width=32, depth=2, batch=32, steps=20, diagnostics_every=5, val_every=10, val_batches=1)
CHEAP = dict(width=8, depth=1, batch=16, diagnostics_every=0, val_every=0)  # the suite's cheapest program


def test_defaults_and_controls_make_the_configs():
    panel = mxp.explore(recipe=("mxfp8_e4m3", "fp32", "mxfp6_e2m3"), width=32, lr=1e-3)
    assert isinstance(panel, Explorer)
    assert panel.controls["recipes"].value == ("mxfp8_e4m3", "mxfp6_e2m3")  # FP32 is not a choice: it always trains
    assert "fp32" not in panel.controls["recipes"].options
    assert panel.controls["width"].value == "32" and float(panel.controls["lr"].value) == 1e-3
    panel.controls["norm"].value = "layernorm_noaffine"
    panel.controls["act"].value = "silu"
    panel.controls["diagnostics_every"].value = 7
    configs = panel.configs()
    assert [c.recipe.name for c in configs] == ["fp32", "mxfp8_e4m3", "mxfp6_e2m3"]
    assert all(c.replace(recipe="fp32") == configs[0] for c in configs)  # identical but for the recipe
    c = configs[0]
    assert (c.norm, c.act, c.width, c.lr, c.diagnostics_every) == ("layernorm_noaffine", "silu", 32, 1e-3, 7)
    assert c.val_every == 105  # the quick scale's 100, rounded up to a multiple of the diagnostics period


def test_bad_defaults_and_values_name_what_is_wrong():
    with pytest.raises(ValueError, match="unknown config field.*valid:"):
        mxp.explore(widht=32)
    with pytest.raises(ValueError, match="unknown recipe 'mxfp9'; valid: fp32, bf16"):
        mxp.explore(recipe="mxfp9")
    with pytest.raises(ValueError, match="unknown norm 'batchnorm'"):
        mxp.explore(norm="batchnorm")
    panel = mxp.explore(**SMALL)
    panel.controls["lr"].value = -1.0
    with pytest.raises(ValueError, match=r"LR must be a positive finite number \(e.g. 3e-3\), got '-1.0'"):
        panel.train()
    panel._on_click(panel.button)  # the button shows the message instead of raising
    assert "LR must be a positive" in panel.status.value and panel.runs == [] and not panel.training


@pytest.mark.parametrize("field, value, message", [
    ("width", -5, "width must be a whole number from 1 to 65536, got -5"),
    ("width", "wide", "width must be a whole number from 1 to 65536, got 'wide'"),
    ("steps", 0, "steps must be a whole number from 1 to 100000000, got 0"),
    ("depth", "2.5", "depth must be a whole number from 1 to 256, got '2.5'"),
    ("seed", 2 ** 32, "seed must be a whole number from 0 to 4294967295, got 4294967296"),
    ("diagnostics_every", "", "diagnostics every must be a whole number from 0 to 1000000, got ''"),
    ("lr", "fast", "LR must be a positive finite number (e.g. 3e-3), got 'fast'"),
])
def test_a_value_out_of_range_is_refused_naming_the_field_and_its_range_not_clamped(field, value, message):
    panel = mxp.explore(**SMALL)
    panel.controls[field].value = value
    assert str(panel.controls[field].value) == str(value)  # kept as typed, not clamped into the range
    assert message in panel.status.value  # said as soon as it is typed
    with pytest.raises(ValueError) as err:
        panel.configs()
    assert str(err.value) == message
    panel.button.click()
    assert panel.wait(5) and panel.runs == [] and f"not trained: {message}" in panel.status.value
    panel.controls[field].value = SMALL.get(field, {"lr": "3e-3"}.get(field, 0))
    assert "color:#b00" not in panel.status.value  # a valid value clears the message


def test_a_custom_recipe_becomes_a_choice():
    mine = mxp.recipes.get("mxfp8_e4m3").replace(name="my_e4m3", ln_affine=None)
    panel = mxp.explore(recipe=mine)
    assert panel.controls["recipes"].value == ("my_e4m3",)
    assert panel.configs()[1].recipe == mine
    with pytest.raises(ValueError, match="differs from the preset"):
        mxp.explore(recipe=mine.replace(name="mxfp8_e4m3"))


def test_a_norm_without_gains_gets_a_note_instead_of_a_clamp_curve():
    panel = mxp.explore(**SMALL)
    cfg = panel.configs()[0].replace(norm="layernorm_noaffine")
    m = pd.DataFrame({"step": np.arange(4), "loss": [1.0, 0.5, 0.4, 0.3]})
    panel.runs = [Run(cfg, m, None)]
    panel.draw()
    loss_ax, _, _, clamp_ax = panel.axes
    assert len(loss_ax.lines) == 1 and list(loss_ax.lines[0].get_ydata()) == [1.0, 0.5, 0.4, 0.3]
    assert not clamp_ax.lines and "norm=layernorm_noaffine" in clamp_ax.texts[0].get_text()
    assert panel.png().startswith(b"\x89PNG")


def test_train_live_reports_every_segment_and_the_end():
    cfg = mxp.Config(recipe="fp32", **SMALL)
    seen = []
    run = train_live(cfg, None, lambda step, r: seen.append((step, len(r.metrics))))
    assert seen == [(10, 10), (20, 20), (20, 20)] and len(run.metrics) == 20


@pytest.mark.e2e
def test_train_button_path_trains_fp32_alongside_live_and_stores(tmp_path):
    store = tmp_path / "runs"
    panel = mxp.explore(store=store, **SMALL)
    panel.controls["recipes"].value = ("mxfp8_e4m3",)
    panel.controls["act"].value = "relu2"
    panel.controls["norm"].value = "rmsnorm"
    runs = panel.train()
    assert [r.config.recipe.name for r in runs] == ["fp32", "mxfp8_e4m3"] and panel.runs == runs
    assert runs[1].config == runs[0].config.replace(recipe="mxfp8_e4m3")
    assert all(len(r.metrics) == 20 and r.diverged_at is None for r in runs)
    assert all(str(r.path).startswith(str(store)) for r in runs)
    # live: each run reported after its first segment (step 10), before it finished
    assert ("fp32", 10) in panel.updates and ("mxfp8_e4m3", 10) in panel.updates
    assert panel.progress.value == panel.progress.max == 40 and not panel.button.disabled
    loss_ax, zeta_ax, cos_ax, clamp_ax = panel.axes
    assert [len(line.get_xdata()) for line in loss_ax.lines] == [20, 20]
    assert [line.get_label() for line in zeta_ax.lines] == ["mxfp8_e4m3"]  # FP32 against itself is trivial
    np.testing.assert_array_equal(zeta_ax.lines[0].get_xdata(), [0, 5, 10, 15])
    assert np.all(np.asarray(zeta_ax.lines[0].get_ydata()) > 0) and len(cos_ax.lines) == 1
    assert len(clamp_ax.lines) == 2  # RMSNorm has gains to clamp
    assert "final loss" in panel.status.value and "mxfp8_e4m3" in panel.status.value
    assert panel.snapshot().data.startswith(b"\x89PNG")
    # pressing Train again loads both runs from the store: no segments, one final update each
    again = panel.train()
    assert panel.updates == [("fp32", 20), ("mxfp8_e4m3", 20)]
    for a, b in zip(runs, again):
        pd.testing.assert_frame_equal(a.metrics, b.metrics)


def test_results_follow_the_latest_press_of_train(monkeypatch):
    """Pressing Train twice with other settings: table() and conclusions() describe panel.runs of the second
    press (the notebook's results cell calls them). Training is replaced by a fake that makes a run from its
    config, so this checks the button → runs → results path, not the engine."""
    def fake_train_live(config, store, on_update):
        steps = np.arange(config.steps)
        loss = (1.0 + config.seed) / (1.0 + steps) * (1.1 if config.recipe.name != "fp32" else 1.0)
        zeta = np.where(steps % config.diagnostics_every == 0, 0.1 * (1 + config.seed), np.nan)
        m = pd.DataFrame({"step": steps, "loss": loss, "zeta_bound": zeta, "cosine": 1 - zeta,
                          "ln_clamp_frac": np.full(config.steps, 0.25)})
        run = Run(config, m, None)
        on_update(config.steps, run)
        return run

    monkeypatch.setattr(explore_module, "train_live", fake_train_live)  # the module, not mxp.explore()
    panel = mxp.explore(**SMALL)
    assert panel.table().empty and "Nothing trained yet" in panel.conclusions()
    assert panel._repr_mimebundle_()["text/plain"].startswith("mxp.explore() panel")  # not VBox(children=...)

    seen = []
    for seed, steps in ((0, 20), (1, 30)):
        panel.controls["seed"].value, panel.controls["steps"].value = seed, steps
        panel.button.click()  # what pressing Train does: it trains in a thread of its own
        assert panel.wait(30)
        assert panel.results.value == explore_module._results.results_html(panel.runs)  # the panel shows them
        table, text = panel.table(), panel.conclusions()
        assert [r.config.seed for r in panel.runs] == [seed, seed] and len(panel.runs[0].metrics) == steps
        assert list(table.index) == ["fp32", "mxfp8_e4m3"]
        np.testing.assert_allclose(table["final_loss"], [r.final_loss for r in panel.runs])
        np.testing.assert_allclose(table["vs_fp32"], [1.0, 1.1])
        assert table.loc["mxfp8_e4m3", "zeta_median"] == pytest.approx(0.1 * (1 + seed))
        assert f"seed {seed}, {steps} steps:" in text and "**mxfp8_e4m3** stayed stable" in text
        seen.append((table, text))
    assert not seen[0][0].equals(seen[1][0]) and seen[0][1] != seen[1][1]


def _until(condition, timeout: float = 120.0) -> None:
    t0 = time.monotonic()
    while not condition():
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.02)


def test_the_stop_button_stops_within_one_segment_and_keeps_the_checkpoint(tmp_path):
    """Train (in the panel's thread) a run far too long to finish, press Stop after its first segment: it stops
    at the end of the segment it is in, checkpointed in the store, the status line says so, and the buttons
    are back."""
    panel = mxp.explore(store=tmp_path, recipe=(), steps=10 ** 7, **CHEAP)
    assert panel.stop_button.disabled
    panel.button.click()
    _until(lambda: panel.updates)
    assert panel.training and panel.button.disabled and not panel.stop_button.disabled
    panel.stop_button.click()
    asked_at = len(panel.updates)
    assert panel.wait(60)
    assert len(panel.updates) <= asked_at + 1  # at most the segment it was in
    step = panel.updates[-1][1]
    assert panel.status.value.startswith(f"stopped: fp32 stopped at step {step} of 10000000, checkpointed in ")
    (part,) = tmp_path.glob("*.partial-*")
    assert ckpt.steps(part / "checkpoints") == [step]
    assert panel.runs == [] and not panel.button.disabled and panel.stop_button.disabled
    assert panel.progress.value == step < panel.progress.max


def test_a_new_shape_says_it_compiles_and_how_long_the_last_one_took(tmp_path, monkeypatch):
    """The status line while a program of a new shape compiles, then the time it took, recorded for the next
    new shape. Training is a fake that counts one compile and reports one segment (the engine is not under
    test here); the shape is one no test compiles."""
    base = base_config(width=24, depth=3, batch=16, steps=10, diagnostics_every=0, val_every=0)
    times = CompileTimes(tmp_path)
    shape = static_key(base.replace(recipe="fp32")).hash()

    def fake_train_live(config, store, on_update):
        executables.stats["compiled"] += 1
        time.sleep(0.3)
        run = Run(config, pd.DataFrame({"step": np.arange(config.steps), "loss": np.ones(config.steps)}), None)
        on_update(config.steps, run)
        return run

    monkeypatch.setattr(explore_module, "train_live", fake_train_live)
    seen = []
    panel = Explorer(None, base, recipes=(), compile_times=times)
    panel.status.observe(lambda change: seen.append(change["new"]), names="value")
    panel.train()
    assert "<b>fp32</b>: compiling (first run of this shape, not measured before)…" in seen
    assert seen.index("training <b>fp32</b> (10 steps)…") > seen.index(
        "<b>fp32</b>: compiling (first run of this shape, not measured before)…")
    assert 0.3 <= times.expected(shape) < 30 and times.expected("another shape") == times.expected(shape)
    times.record(shape, 12.3)
    seen.clear()
    panel.train()
    assert "<b>fp32</b>: compiling (first run of this shape, ~12 s measured last time)…" in seen
    assert CompileTimes(tmp_path).expected(shape) < 12  # kept in the file, measured again
