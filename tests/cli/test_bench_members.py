"""``mx-proxy bench members``: the roofline's arithmetic against hand computations for known GEMMs, and the table's
columns from a tiny configuration. No timing is asserted."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mx_proxy.cli.bench import BENCHMARKS, describe, members
from mx_proxy.cli.bench import roofline as R

PEAKS = {"bf16": 8e6, "tf32": 4e6, "f32": 1e6, "bandwidth": 1e4}  # made up: the arithmetic is what is tested


def test_a_float32_gemm_costs_what_a_hand_count_says():
    a, b = jnp.ones((64, 32)), jnp.ones((32, 16))
    c = R.cost(lambda a, b: jax.lax.dot(a, b, precision=jax.lax.Precision.HIGHEST), a, b)
    assert c["flops"] == 2 * 64 * 32 * 16
    assert c["bytes"] == 4 * (64 * 32 + 32 * 16 + 64 * 16)
    assert c["dots"] == {"bf16": 0, "tf32": 0, "f32": 2 * 64 * 32 * 16}
    r = R.roofline_seconds(c, PEAKS)
    assert r["compute"] == pytest.approx(65536 / 1e6) and r["memory"] == pytest.approx(14336 / 1e4)
    assert r["seconds"] == r["memory"] and r["bound"] == "memory"


def test_gemms_are_counted_at_their_dot_precision_and_the_rest_at_f32():
    c = {"flops": 1000.0 + 3e6, "bytes": 10.0, "dots": {"bf16": 2e6, "tf32": 0, "f32": 1e6}}
    r = R.roofline_seconds(c, PEAKS)
    assert r["compute"] == pytest.approx(2e6 / 8e6 + 1e6 / 1e6 + 1000 / 1e6) and r["bound"] == "compute"
    # bf16 operands (the MX recipes' exact dots) vs default-precision float32 (TF32 on a GPU)
    x = jnp.ones((8, 4), jnp.bfloat16)
    jaxpr = jax.make_jaxpr(lambda x: jax.lax.dot(x, x.T, preferred_element_type=jnp.float32)
                           + jnp.dot(x.astype(jnp.float32), x.T.astype(jnp.float32)))(x)
    assert R.dot_flops(jaxpr) == {"bf16": 2 * 8 * 4 * 8, "tf32": 2 * 8 * 4 * 8, "f32": 0}


def test_dot_flops_through_batch_dims_gradients_scans_and_conds():
    a, b = jnp.ones((3, 5, 4)), jnp.ones((3, 4, 2))
    batched = jax.make_jaxpr(lambda a, b: jnp.einsum("bij,bjk->bik", a, b, precision="highest"))(a, b)
    assert R.dot_flops(batched)["f32"] == 2 * 3 * 5 * 4 * 2
    w = jnp.ones((4, 4))

    def loss(w):  # forward x @ w, backward: dx and dw GEMMs of the same size
        return jnp.sum(jnp.dot(jnp.ones((6, 4)), w, precision="highest") ** 2)

    assert R.dot_flops(jax.make_jaxpr(jax.grad(loss))(w))["f32"] == 2 * (2 * 6 * 4 * 4)
    scanned = jax.make_jaxpr(lambda w: jax.lax.scan(lambda c, _: (jnp.dot(c, w, precision="highest"), None),
                                                    w, None, length=7)[0])(w)
    assert R.dot_flops(scanned)["f32"] == 7 * 2 * 4 * 4 * 4
    cond = jax.make_jaxpr(lambda w: jax.lax.cond(w[0, 0] > 0, lambda: jnp.dot(w, w, precision="highest"),
                                                 lambda: w))(w)
    assert R.dot_flops(cond)["f32"] == 2 * 4 * 4 * 4


def test_segment_cost_weighs_the_diagnostic_steps():
    plain = {"flops": 10.0, "bytes": 1.0, "dots": {"bf16": 4, "tf32": 0, "f32": 0}}
    diag = {"flops": 30.0, "bytes": 2.0, "dots": {"bf16": 8, "tf32": 0, "f32": 2}}
    c = members.segment_cost(plain, diag, steps=12, every=5, members=3)  # diagnostic steps 0, 5, 10
    assert c["flops"] == 3 * (9 * 10 + 3 * 30) and c["bytes"] == 3 * (9 + 6)
    assert c["dots"] == {"bf16": 3 * (9 * 4 + 3 * 8), "tf32": 0, "f32": 3 * 3 * 2}
    assert members.segment_cost(plain, diag, steps=12, every=0, members=1)["flops"] == 120


def test_known_gpus_have_peaks_and_the_cpu_is_measured():
    assert R.peaks_for("NVIDIA H100 80GB HBM3")["f32"] == 67e12
    assert R.peaks_for("NVIDIA H200")["bandwidth"] == 4.8e12 and R.peaks_for("TPU v4") is None
    p = R.measure_cpu(n=64, stream_mib=1, repeats=1)
    assert set(p) == {"bf16", "tf32", "f32", "bandwidth"} and all(np.isfinite(v) and v > 0 for v in p.values())


def test_the_table_has_a_row_per_configuration_and_size(capsys):
    assert "members" in BENCHMARKS and "roofline" in describe("members")
    shape = dict(width=16, depth=1, batch=16, dot="f32")
    t = members.measure(shape, ["fp32"], [False], ["5", "never"], [1, 2], steps=5, repeats=1, peaks=PEAKS,
                        log=lambda *_: None)
    assert list(t.columns) == members.COLUMNS
    assert t[["diagnostics", "members"]].values.tolist() == [["5", 1], ["5", 2], ["never", 1], ["never", 2]]
    assert t["program"].tolist() == ["one", "lax.map"] * 2  # a one-device CPU maps its members
    assert (t["member_steps_per_s"] > 0).all() and (t["fraction"] > 0).all()
    # the fraction is the roofline's speed over the measured one
    assert np.allclose(t["fraction"], t["member_steps_per_s"] / t["roofline_member_steps_per_s"])
    assert members.fastest(t)["diagnostics"].tolist() == ["5", "never"]


def test_bad_options_exit_2_naming_the_value(capsys):
    with pytest.raises(SystemExit) as e:
        members.main(["--members", "1,x"])
    assert e.value.code == 2 and "'1,x'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        members.main(["--steps", "500"])
    assert e.value.code == 2 and "500" in capsys.readouterr().err
