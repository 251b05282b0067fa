"""mx_proxy.experiments.systems (notebook 09): systems, the scales' stress setting, the GEMM
precision accounting, the table on real smoke runs and on hand-made runs,
the forward/dgrad weight disagreement, the figure, and bad input."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

import mx_proxy as mxp
from mx_proxy.experiments import scales, systems
from mx_proxy.experiments.systems import Key
from mx_proxy.training import controllers
from mx_proxy.training.result import Run
from mx_proxy.viz import plots

# ----------------------------------------------------------------------------- scales: the stress setting


def test_every_scale_has_a_valid_stress_setting():
    for name in scales.names():
        s = scales.get(name)
        assert s.stress_seeds and len(set(s.stress_seeds)) == len(s.stress_seeds)
        assert not set(s.stress) & set(scales.STRESS_RESERVED)
        assert s.stress_config == s.config.replace(**s.stress)
        assert s.stress_note
    q = scales.get("quick")
    assert dict(q.stress) == {"lr": 2e-2, "beta2": 0.9, "diagnostics_every": 0} and q.stress_seeds == (0, 1, 2)
    # smoke: only a dynamic field changes, so the stress runs share the base runs' compiled program
    from mx_proxy.training.engine import static_key

    sm = scales.get("smoke")
    assert static_key(sm.stress_config) == static_key(sm.config) and len(sm.stress_seeds) == 1


def test_stress_is_read_only_and_defaults_keep_old_scales_working():
    s = scales.get("quick")
    with pytest.raises(TypeError):
        s.stress["lr"] = 1.0
    old = scales.ExperimentScale(name="x", config=mxp.Config(steps=100), lr_grid=(1e-3,),
                                 intervention_steps=(10, 20), depths=(2,), widths=(32,), sgd_lr=0.1)
    assert dict(old.stress) == {} and old.stress_seeds == (0,) and old.stress_config == old.config
    hash(old)  # still hashable (stress is left out of the hash)


@pytest.mark.parametrize("changes, match", [
    (dict(stress={"learning_rate": 1.0}), "unknown stress field.*valid: width"),
    (dict(stress={"recipe": "mxfp4"}), "may not set"),
    (dict(stress={"seed": 3}), "may not set"),
    (dict(stress={"lr": -1.0}), "invalid config.*lr"),
    (dict(stress=[("lr", 1.0)]), "mapping"),
    (dict(stress_seeds=()), "stress_seeds"),
    (dict(stress_seeds=(0, 0)), "stress_seeds"),
    (dict(stress_seeds=(-1,)), "stress_seeds"),
    (dict(stress_seeds=5), "stress_seeds"),
])
def test_bad_stress_settings_are_rejected(changes, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(scales.get("smoke"), **changes)


# ----------------------------------------------------------------------------- systems


def test_systems_build_valid_configs_at_every_scale():
    assert set(systems.FAMILIES) == set(systems.SYSTEMS)
    smoke = scales.get("smoke").systems
    assert set(smoke) <= set(systems.SYSTEMS)
    # the smoke scale keeps the reference and one system per family
    assert sorted(systems.FAMILIES[s] for s in smoke) == sorted(set(systems.FAMILIES.values()))
    assert systems.systems_for("smoke") == smoke and systems.systems_for("quick") == tuple(systems.SYSTEMS)
    for name in scales.names():
        for system in systems.SYSTEMS:
            base = systems.config(system, name)
            stress = systems.config(system, name, "stress")
            assert stress == base.replace(**scales.get(name).stress)
    c = systems.config("gnmr + mxfp4", "quick")
    assert c.controller == mxp.GNMR(action="bf16") == systems.GNMR_SETTINGS  # the controller's defaults
    assert systems.config("ngpt + nvfp4", "quick").arch == "ngpt"
    assert systems.config("fp32", "quick") == scales.get("quick").config  # shares stored runs with notebooks 02-08
    assert set(systems.NEW_RECIPES) <= set(mxp.recipes.names())


def test_unknown_system_or_setting_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown system.*'mxfp3'.*valid: fp32, mxfp8_e4m3"):
        systems.config("mxfp3", "smoke")
    with pytest.raises(ValueError, match="unknown system.*valid: fp32"):
        systems.runs("smoke", systems=["fp32", "gnmr"], progress=False)  # raises before training anything
    with pytest.raises(ValueError, match="unknown setting 'hot'; valid: base, stress"):
        systems.runs("smoke", systems=["fp32"], settings=["hot"], progress=False)
    with pytest.raises(ValueError, match="twice"):
        systems.runs("smoke", systems=["fp32", "fp32"], progress=False)


# ----------------------------------------------------------------------------- GEMM precision accounting


def _lp(system, **kw):
    return systems.gemm_precision(systems.config(system, "quick").replace(**kw))


def test_gemm_precision_counts_gemms_with_both_operands_block_scaled():
    assert (_lp("mxfp8_e4m3")["low"] == 1).all() and (_lp("mxfp8_e4m3")["fp4"] == 0).all()
    assert (_lp("fp32")["low"] == 0).all()
    assert np.allclose(_lp("forward_only")["low"], 1 / 3)     # forward GEMMs only
    assert (_lp("bf16_activations")["low"] == 0).all()         # weights MX, activations bf16: bf16 GEMMs
    assert (_lp("nvfp4")["fp4"] == 1).all() and (_lp("mxfp4")["fp4"] == 1).all()
    g = _lp("mxfp4_2d")                                        # sensitive GEMMs kept in MXFP8
    assert (g["low"] == 1).all()
    assert g.set_index("layer")["fp4"].to_dict() == {
        "block_0/fc1": 0.0, "block_0/fc2": 1.0, "block_1/fc1": 1.0, "block_1/fc2": 1.0, "block_2/fc1": 1.0,
        "block_2/fc2": 1.0, "block_3/fc1": 1.0, "block_3/fc2": 0.0}
    assert (g["flops"] == 64 * 256).all()
    sw = _lp("mxfp8_e4m3", act="swiglu")                       # fc1 of SwiGLU is twice fc2's size
    assert list(sw["flops"][:2]) == [64 * 2 * 171, 171 * 64]


def _synthetic(config, losses, diverged_at=None, promoted_gemm=None):
    n = len(losses)
    m = {"step": np.arange(n), "loss": np.asarray(losses, float)}
    if config.controller is not None:
        names = controllers.unit_names(config.depth)
        for u in names:
            p = np.zeros(n, bool)
            if promoted_gemm is not None and u.endswith("/gemm"):
                p = promoted_gemm[int(u.split("/")[0].split("_")[1])]
            m[f"promoted/{u}"] = p
            m[f"gnmr/{u}"] = np.ones(n)
            m[f"delta_gnmr/{u}"] = np.ones(n)
    return Run(config, pd.DataFrame(m), diverged_at)


def test_low_precision_frac_counts_promoted_gemm_units_per_step():
    cfg = mxp.Config(width=32, depth=2, steps=8, recipe="mxfp4_2d", controller="gnmr")
    # block 0's GEMM unit promoted on steps 2-5 (half the run); block 1's never
    promoted = {0: np.isin(np.arange(8), [2, 3, 4, 5]), 1: np.zeros(8, bool)}
    run = _synthetic(cfg, np.full(8, 0.1), promoted_gemm=promoted)
    assert systems.low_precision_frac(run) == pytest.approx(1 - 0.5 * 0.5)
    # FP4: block 0's fc1 and block 1's fc2 are the MXFP8 sensitive GEMMs: 2 of 4 layers are FP4, block 0's
    # fc2 promoted half the time
    assert systems.low_precision_frac(run, "fp4") == pytest.approx((0.5 + 1) / 4)
    assert len(run.events[run.events["event"] == "promote"]) == 1
    with pytest.raises(ValueError, match="valid: low, fp4"):
        systems.low_precision_frac(run, "fp8")
    # a diverged run counts the steps before its divergence only
    cut = _synthetic(cfg, np.full(8, 0.1), diverged_at=2, promoted_gemm=promoted)
    assert systems.low_precision_frac(cut) == 1.0


# ----------------------------------------------------------------------------- the table on hand-made runs


def _hand_made():
    cfg = mxp.Config(width=32, depth=2, steps=10)
    fp32, mx = cfg.replace(recipe="fp32"), cfg.replace(recipe="mxfp8_e4m3")
    ngpt = cfg.replace(arch="ngpt", recipe="fp32")
    return {
        Key("fp32", "base", 0): _synthetic(fp32, np.full(10, 0.1)),
        Key("mxfp8_e4m3", "base", 0): _synthetic(mx, np.full(10, 0.2)),
        Key("ngpt (fp32)", "base", 0): _synthetic(ngpt, np.full(10, 0.01)),
        Key("ngpt + nvfp4", "base", 0): _synthetic(ngpt.replace(recipe="nvfp4"), np.full(10, 0.03)),
        Key("fp32", "stress", 1): _synthetic(fp32, np.r_[np.full(6, 0.1), np.inf], diverged_at=6),
        Key("mxfp8_e4m3", "stress", 1): _synthetic(mx, np.r_[np.full(3, 0.3), np.inf], diverged_at=3),
        Key("forward_only", "stress", 1): _synthetic(mx.replace(recipe="forward_only"), np.full(10, 0.2)),
    }


def test_table_on_hand_made_runs():
    df = systems.table(_hand_made())
    assert list(df["system"]) == ["fp32", "fp32", "mxfp8_e4m3", "mxfp8_e4m3", "forward_only", "ngpt (fp32)",
                                  "ngpt + nvfp4"]  # SYSTEMS order, then setting, then seed
    row = df.set_index(["system", "setting"])
    assert row.loc[("mxfp8_e4m3", "base"), "vs_fp32"] == pytest.approx(2.0)
    assert row.loc[("ngpt + nvfp4", "base"), "vs_fp32"] == pytest.approx(0.3)
    assert row.loc[("ngpt + nvfp4", "base"), "vs_own_fp32"] == pytest.approx(3.0)  # against nGPT in FP32
    s = row.loc[("mxfp8_e4m3", "stress")]
    assert s["diverged_at"] == 3 and s["fp32_diverged_at"] == 6 and s["steps_run"] == 3 and s["steps"] == 10
    assert np.isnan(s["vs_fp32"])  # a diverged run (or reference) has no comparable final loss
    assert np.isnan(row.loc[("forward_only", "stress"), "vs_fp32"])
    assert row.loc[("forward_only", "stress"), "low_precision_frac"] == pytest.approx(1 / 3)
    assert pd.isna(row.loc[("fp32", "base"), "diverged_at"]) and str(df["diverged_at"].dtype) == "Int64"
    assert (df["promotions"] == 0).all()


def test_table_rejects_bad_input():
    with pytest.raises(ValueError, match="mapping"):
        systems.table(list(_hand_made().values()))
    bad = {Key("mx9", "base", 0): _hand_made()[Key("fp32", "base", 0)]}
    with pytest.raises(ValueError, match="unknown system.*valid: fp32"):
        systems.table(bad)
    with pytest.raises(ValueError, match="unknown setting"):
        systems.table({("fp32", "warm", 0): _hand_made()[Key("fp32", "base", 0)]})
    with pytest.raises(ValueError, match="mxp.Run"):
        systems.table({("fp32", "base", 0): 0.1})


def test_figure_from_a_table_or_runs():
    runs = _hand_made()
    for arg in (runs, systems.table(runs)):
        fig = plots.systems(arg, stress_label="lr 2e-2")
        assert len(fig.axes) == 2 and "stress" in fig.axes[1].get_title()
        plots.plt.close(fig)


# ----------------------------------------------------------------------------- real smoke runs


@pytest.fixture(scope="module")
def smoke_runs():
    return systems.runs("smoke", systems=["fp32", "mxfp4", "mxfp4_2d", "gnmr + mxfp4"], progress=False)


@pytest.mark.e2e
def test_table_on_smoke_runs(smoke_runs):
    s = scales.get("smoke")
    assert set(smoke_runs) == {Key(n, st, seed) for n in ("fp32", "mxfp4", "mxfp4_2d", "gnmr + mxfp4")
                               for st, seeds in (("base", (0,)), ("stress", s.stress_seeds)) for seed in seeds}
    assert smoke_runs[Key("mxfp4", "stress", 0)].config.lr == s.stress["lr"]
    df = systems.table(smoke_runs)
    assert list(df.columns) == ["system", "family", "setting", "seed", "final_loss", "vs_fp32", "vs_own_fp32",
                                "diverged_at", "fp32_diverged_at", "blowup_at", "steps", "steps_run",
                                "low_precision_frac", "fp4_frac", "promotions"]
    assert len(df) == len(smoke_runs)
    fp32 = df[df["system"] == "fp32"]
    assert (fp32["vs_fp32"] == 1.0).all() and (fp32["low_precision_frac"] == 0.0).all()
    mx = df[df["system"] == "mxfp4"]
    assert (mx["low_precision_frac"] == 1.0).all() and (mx["fp4_frac"] == 1.0).all()
    assert (df[df["system"] == "mxfp4_2d"]["fp4_frac"] == 0.5).all()  # depth 2: first/fc1, last/fc2 in MXFP8
    for key, run in smoke_runs.items():
        row = df[(df["system"] == key.system) & (df["setting"] == key.setting) & (df["seed"] == key.seed)].iloc[0]
        assert row["final_loss"] == run.final_loss
        assert row["promotions"] == len(run.events[run.events["event"] == "promote"])
        if key.system.startswith("gnmr"):
            # the engine's own column: the fraction of GEMM units not promoted, per step
            assert row["low_precision_frac"] == pytest.approx(run.metrics["low_precision_frac"].mean())


@pytest.mark.e2e
def test_forward_and_dgrad_weights_agree_only_with_2d_tiles(smoke_runs):
    one_d = smoke_runs[Key("mxfp4", "base", 0)]
    assert (systems.transpose_mismatch(one_d) > 0).all()
    assert (systems.transpose_mismatch(one_d, "mxfp4_2d") == 0).all()  # same weights, one 2-D tile spec
    during = one_d.metrics["weight_fwd_dgrad_diff/block_0"].dropna()
    # 0 at init (every 1-D block of the uniform init gets the same power-of-two scale in both orientations),
    # then the two GEMMs' weights drift apart as the weights take structure
    assert during.iloc[0] == 0 and during.iloc[-1] > 0.01
    two_d = smoke_runs[Key("mxfp4_2d", "base", 0)]
    assert (two_d.metrics["weight_fwd_dgrad_diff/block_0"].dropna() == 0).all()
    w = systems.weight_disagreement(smoke_runs)
    assert set(zip(w["weights_of"], w["specs_of"])) == {("mxfp4", "mxfp4"), ("mxfp4", "mxfp4_2d"),
                                                        ("mxfp4_2d", "mxfp4"), ("mxfp4_2d", "mxfp4_2d")}
    assert (w[w["specs_of"] == "mxfp4_2d"]["final"] == 0).all() and (w[w["specs_of"] == "mxfp4"]["final"] > 0).all()
    with pytest.raises(ValueError, match="does not quantize the weight"):
        systems.transpose_mismatch(one_d, "forward_only")
