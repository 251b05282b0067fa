"""``mx-proxy figures``: every figure of the registry is written at the smoke
scale by the real command (every experiment of ``mx_proxy.experiments.paper`` trains), and
a second call loads the stored runs instead of training; plus the run
analysis of ``mx_proxy.experiments.paper`` on hand-made metrics."""

import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mx_proxy import Config
from mx_proxy.experiments import analysis, paper, systems
from mx_proxy.training.result import Run
from mx_proxy.viz import plots
from mx_proxy.viz.figures import FIGURES, HEADLINE

PAPER_FIGURES = {"lr_sweep": 2, "ablations": 3, "gradient_bias": 4, "sawtooth": 5, "ln_clamping": 5, "mitigations": 6,
                 "interventions": 7, "spikes_vs_shape": 9, "sgd_momentum": 10, "init_ablation": 11}


def _figures(out, env, store, *extra):
    return subprocess.run([sys.executable, "-m", "mx_proxy.cli", "figures", "--scale", "smoke", "--out", str(out),
                           "--store", str(store), "--results", str(out / "no-results"), *extra],
                          env=env, capture_output=True, text=True, timeout=1800)


def test_every_paper_proxy_figure_has_an_entry():
    assert set(PAPER_FIGURES) <= set(FIGURES)
    assert next(iter(FIGURES)) == "sawtooth"  # the CLI's error message lists it first


def test_systems_figure_has_an_entry_and_draws_a_table():
    assert "systems" in FIGURES  # notebook 09 (GNMR, 2-D FP4, NVFP4, nGPT)
    rows = [dict(system=s, family=systems.FAMILIES[s], setting=st, seed=seed, final_loss=0.1, vs_fp32=v,
                 vs_own_fp32=v, diverged_at=d, fp32_diverged_at=None, blowup_at=None, steps=100, steps_run=d or 100,
                 low_precision_frac=lp, fp4_frac=0.0, promotions=p)
            for s, st, seed, v, d, lp, p in [("fp32", "base", 0, 1.0, None, 0.0, 0),
                                             ("mxfp8_e4m3", "base", 0, 1.2, None, 1.0, 0),
                                             ("gnmr + mxfp8_e4m3", "base", 0, 1.1, None, 0.9, 3),
                                             ("fp32", "stress", 0, 1.0, 60, 0.0, 0),
                                             ("mxfp8_e4m3", "stress", 0, float("nan"), 40, 1.0, 0),
                                             ("mxfp8_e4m3", "stress", 1, 1.3, None, 1.0, 0)]]
    df = pd.DataFrame(rows)
    for c in ("diverged_at", "fp32_diverged_at", "blowup_at"):
        df[c] = df[c].astype("Int64")
    fig = plots.systems(df, stress_label="lr 2e-2")
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any("LP GEMMs 90.0%, 3 promotions" in t for t in texts)  # GNMR's cost is annotated
    assert any("FP32 seed 0" in t for t in texts)                 # FP32's divergence is the reference line
    plots.plt.close(fig)


@pytest.mark.e2e
def test_figures_command_writes_every_png_at_smoke_and_reuses_runs(tmp_path):
    store = tmp_path / "runs"
    env = dict(os.environ, MPLBACKEND="Agg")  # the suite's compilation cache, shared with the notebooks' kernels
    out = tmp_path / "figs"
    first = _figures(out, env, store)
    assert first.returncode == 0, first.stderr[-4000:]
    trained = [name for name in FIGURES if name not in HEADLINE]  # no campaign results here: headline figures skip
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{name}.png" for name in trained)
    assert "skipping headline_zeta" in first.stdout
    for name in trained:
        assert (out / f"{name}.png").stat().st_size > 10_000, name
    keys = sorted(p.name for p in store.iterdir() if not p.name.startswith("."))
    assert len(keys) >= 20  # every experiment stored its runs

    again = _figures(tmp_path / "again", env, store, "--only", "lr_sweep", "interventions", "--pdf")
    assert again.returncode == 0, again.stderr[-4000:]
    assert "to train)" not in again.stderr  # nothing retrained: every run came from the store
    assert sorted(p.name for p in store.iterdir() if not p.name.startswith(".")) == keys
    assert {p.name for p in (tmp_path / "again").iterdir()} == {"lr_sweep.png", "lr_sweep.pdf", "interventions.png",
                                                                "interventions.pdf"}

    # notebook 09's figure: every (system, setting, seed) of the smoke scale was stored, and is loaded again
    smoke = paper.scale("smoke")
    for system in systems.systems_for(smoke):
        assert systems.config(system, smoke).hash() in keys, system
        for seed in smoke.stress_seeds:
            assert systems.config(system, smoke, "stress").replace(seed=seed).hash() in keys, system
    third = _figures(tmp_path / "systems", env, store, "--only", "systems")
    assert third.returncode == 0, third.stderr[-4000:]
    assert "to train)" not in third.stderr
    assert (tmp_path / "systems" / "systems.png").stat().st_size > 10_000


def _run(losses, diverged_at=None, steps=None):
    losses = np.asarray(losses, dtype=float)
    n = len(losses)
    cfg = Config(width=32, depth=2, steps=steps or n, diagnostics_every=10, val_every=10)
    m = pd.DataFrame({"step": np.arange(n), "loss": losses,
                      "zeta_bound": np.where(np.arange(n) % 10 == 0, 0.5, np.nan),
                      "cosine": np.where(np.arange(n) % 10 == 0, 0.9, np.nan),
                      "ln_clamp_frac": np.where(np.arange(n) % 10 == 0, np.linspace(0, 1, n), np.nan)})
    return Run(cfg, m, diverged_at)


def test_instability_finds_slow_blowups_spikes_and_divergence():
    calm = _run(np.full(300, 0.1))
    assert analysis.instability(calm) == {"diverged_at": None, "blowup_at": None, "spikes": 0, "max_jump": 1.0,
                                          "max_jump_at": 0, "blowups": []}
    loss = np.full(300, 0.1)
    loss[150:160] = np.geomspace(0.2, 2.0, 10)  # a multi-step blow-up past 10x at step 157, never 100x in one step
    loss[250] = 5.0  # and an isolated spike
    s = analysis.instability(_run(loss))
    assert s["blowup_at"] == 157 and s["spikes"] == 2 and s["diverged_at"] is None and s["blowups"] == [157, 250]
    assert s["max_jump"] == pytest.approx(50.0) and s["max_jump_at"] == 250
    first_steps = np.full(300, 0.1)
    first_steps[:30] = 1.0  # the initial transient is skipped
    assert analysis.instability(_run(first_steps))["blowup_at"] is None
    div = np.full(200, 0.1)
    div[-1] = np.inf
    d = analysis.instability(_run(div, diverged_at=199, steps=300))
    assert d["diverged_at"] == 199 and d["spikes"] == 1


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(st.floats(1e-4, 1e3), st.just(np.inf), st.just(np.nan), st.just(0.0)), min_size=11,
                max_size=160))
def test_jump_ratio_is_each_loss_over_the_minimum_of_the_window_before_it(losses):
    run = _run(losses)
    w = analysis.blowup_window(run)
    loss = [np.float64(x if np.isfinite(x) else np.inf) for x in losses]  # a non-finite loss counts as +inf
    with np.errstate(divide="ignore", invalid="ignore"):  # the definition, one step at a time
        expect = [1.0 if i < w else x / min(loss[i - w:i]) for i, x in enumerate(loss)]
    np.testing.assert_array_equal(analysis.jump_ratio(run), np.asarray(expect, float))


def test_summary_names_varying_fields_and_diagnostics():
    a, b = _run(np.full(100, 0.1)), _run(np.full(100, 0.2))
    b.config = b.config.replace(lr=1e-2, recipe="mxfp8_e4m3")
    df = analysis.summary([a, b])
    assert list(df["recipe"]) == ["fp32", "mxfp8_e4m3"] and list(df["lr"]) == [6e-4, 1e-2]
    assert df["zeta_median"].tolist() == [0.5, 0.5] and df["final_loss"].tolist() == pytest.approx([0.1, 0.2])
    assert analysis.clamp_window(a) is not None
    split = analysis.zeta_by_clamping(a)
    assert split["steps_clamping"] + split["steps_other"] == 10


def test_interventions_plot_shows_losses_on_a_log_axis_where_the_parent_blows_up():
    calm = np.full(600, 0.1)
    blown = calm.copy()
    blown[450:] = 30.0  # 300× its recent minimum from step 450
    for parent_loss, log in ((calm, False), (blown, True)):
        parent = _run(parent_loss)
        child = _run(np.r_[parent_loss[:300], np.full(300, 0.09)])
        child.info = {"intervention": {"at_step": 300, "apply": ["fp32"]}}
        fig = plots.interventions(parent, [child])
        top = fig.axes[0]
        assert (top.get_yscale() == "log") is log
        assert top.get_ylabel().startswith("training loss" if log else "loss relative to")
        lines = {ln.get_label(): ln for ln in top.get_lines()}
        if log:  # the child's own losses, not its ratio to the parent's
            assert np.allclose(lines["fp32"].get_ydata()[-10:], 0.09)
            assert any("blew up at step 450" in k for k in lines)
        plots.plt.close(fig)


def test_paper_metric_gives_every_control_a_style_of_its_own():
    """Notebook 04's controls (FP32 against FP32 with another seed, with other batches, bf16 against FP32) are
    told apart by colour and dash pattern, in every panel they appear in, and named in the legend."""
    steps = np.arange(200)
    m = pd.DataFrame({"step": steps, "loss": 1 / (1 + steps), "ref_loss": 1 / (1 + steps),
                      "zeta_paper": np.full(200, 0.5), "zeta_bound": np.full(200, 0.2), "cosine": np.full(200, 0.9),
                      "cosine_paper": np.full(200, 0.7)})
    base = Config(width=8, depth=1, steps=200, paired_run=True)
    mx = Run(base.replace(recipe="mxfp8_e4m3"), m, None)
    controls = [Run(base.replace(recipe="fp32", reference_seed=1), m, None),
                Run(base.replace(recipe="fp32", reference_data_seed=1), m, None),
                Run(base.replace(recipe="bf16"), m, None)]
    fig = plots.paper_metric([mx], controls)
    a_loss, a_paper = fig.axes[:2]
    names = [plots.reference_name(r) for r in controls]
    for ax in (a_loss, a_paper):
        lines = {line.get_label(): line for line in ax.lines if line.get_label() in names}
        assert sorted(lines) == sorted(names)
        looks = {(line.get_color(), repr(line._dash_pattern)) for line in lines.values()}
        assert len(looks) == 3, looks  # three controls, three looks
        assert lines[names[0]].get_color() != lines[names[1]].get_color()  # seed and batches: other colours
    assert set(names) <= {t.get_text() for t in fig.legends[0].get_texts()}
    plots.plt.close(fig)


def test_figures_name_a_normalization_by_its_entrys_label():
    from mx_proxy.nn.norms import NORMS, Norm
    from mx_proxy.viz.plots import norm_label

    assert [norm_label(n) for n in NORMS] == ["LayerNorm", "no norm", "RMSNorm", "LayerNorm, no affine"]
    with NORMS.added(Norm(name="scalenorm", doc="x / ||x||", label="ScaleNorm")):
        assert norm_label("scalenorm") == "ScaleNorm"
    assert norm_label("scalenorm") == "scalenorm"  # unknown: the name as is
