"""The workbench against vectors from the MX library and the authors' code.

The ``.npz`` files under ``tests/data/`` were made by
``tests/data/make_mx_library_vectors.py`` running microsoft/microxcaling's
``Linear`` and the authors' fork (Hither1/systems-scaling, ``olmo/mx``) with
their proxy student (``olmo/synthetic/student_teacher.py``) on the CPU with
torch; the commits are stored in each file. Weights there are torch's (out,
in); the workbench stores kernels as (in, out).

What is compared how (``tests/exactness.py``): every value that does not
depend on a summation order — quantized operands, elementwise float32 and
bf16 math, and a bf16 rounding of a float32 accumulation wherever the
rounding is decisive (the whole float32 summation-order interval around the
exact sum rounds to one bf16 value) — bit for bit; an unrounded float32
accumulation (the forward-only recipe's backward GEMMs, a float32 sum)
within the float32 summation-order bound γ_K·Σ|a_k b_k|; an undecided bf16
rounding within that bound and one bf16 ulp. Torch's CPU kernels and XLA's
(YNNPACK or its own) sum in different orders, so nothing tighter holds on
every CPU.
"""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiers import unit_and_e2e

from mx_proxy.nn import layers
from mx_proxy.nn import resmlp as model
from mx_proxy.numerics import recipe as recipes
from mx_proxy.numerics.quantize import MXSpec, quantize
from mx_proxy.training.optimizer import scale_by_adam

import exactness

DATA = Path(__file__).resolve().parents[1] / "data"


def _load(name):
    return np.load(DATA / name)


def _cases(d):
    """The cases of a vector file, each case's later seeds (``…_s1``, ``…_s2``: the same specs on other data, so
    the same code path) in the end-to-end tier only."""
    return unit_and_e2e(sorted({k.split("/")[0] for k in d.files if "/" in k}),
                        lambda n: n.rsplit("_", 1)[-1] not in ("s1", "s2"))


def _specs(d, case):
    return json.loads(str(d[f"{case}/specs_json"][0]))


def _recipe_for(specs) -> recipes.Recipe:
    """The recipe the library's specs describe (mx_specs keys → GEMM operands)."""
    rounding = "away" if specs["round"] == "nearest" else "even"
    fmt = lambda f: None if f is None else MXSpec(f, rounding=rounding)  # noqa: E731
    r = recipes.Recipe("library", fmt(specs["a_elem_format"]), fmt(specs["w_elem_format"]),
                       fmt(specs["a_elem_format_bp_os"]), fmt(specs["w_elem_format_bp"]),
                       fmt(specs["a_elem_format_bp"]), fmt(specs["a_elem_format_bp_ex"]), vector="bf16",
                       vector_rounding=rounding)
    if not specs["quantize_backprop"]:
        r = r.replace(dgrad_g=None, dgrad_w=None, wgrad_x=None, wgrad_g=None, backward_precision="fp32")
    return r


LINEAR = _load("mx_linear_upstream.npz")
# a tolerance, not a bound, relative to a tensor's largest magnitude: for the few elements whose
# summation-order interval crosses zero and so reaches ties-away rounding's bit trick with both signs
UNBOUNDED_ATOL = 2.0**-8


def _linear(r):
    def f(x, w, b, g):
        y, vjp = jax.vjp(lambda x, w, b: layers.mx_dense(x, w.T, b, r), x, w, b)
        return (y, *vjp(g))
    return f


@pytest.mark.parametrize("case", _cases(LINEAR))
def test_mx_dense_equals_the_libraries_linear(case):
    """The library's ``Linear``: y, dx, dw, db bit for bit where the arithmetic is
    order-independent (MX operands, elementwise math, decisive bf16
    roundings); the forward-only recipe's float32 backward GEMMs and bias sum
    within the float32 summation-order bound (``tests/exactness.py``)."""
    d = LINEAR
    r = _recipe_for(_specs(d, case))
    args = tuple(jnp.asarray(d[f"{case}/{k}"]) for k in "xwbg")
    cert = exactness.certify(_linear(r), *args)
    got = jax.jit(_linear(r))(*args)
    for i, name in enumerate(("y", "dx", "dw", "db")):
        bf16 = (r.vector if name == "y" else r.backward_vector) == "bf16"
        exactness.check(got[i], d[f"{case}/{name}"], cert[i], f"{case}: {name}", bf16=bf16,
                        unknown_atol=UNBOUNDED_ATOL)
    if not r.quantizes_backward:  # the float32 backward: every element is a float32 accumulation
        assert cert[1].lo is not None and cert[2].lo is not None


def test_reference_mixed_is_the_libraries_mixed_specs():
    specs = _specs(LINEAR, "mixed_s0")
    assert specs["a_elem_format_bp"] == "fp8_e4m3"  # inherited from the forward activation format
    assert recipes.get("reference_mixed") == _recipe_for(specs).replace(name="reference_mixed")


def test_rounding_mode_matters_for_most_outputs():
    """With ties to even instead of the library's ties away, most outputs of
    the mixed case change: why ``vector_rounding`` exists."""
    d = LINEAR
    r = recipes.get("reference_mixed")
    even = r.replace(vector_rounding="even").map_specs(lambda s: s.replace(rounding="even"))
    x, w, b = (jnp.asarray(d[f"mixed_s0/{k}"]) for k in "xwb")
    assert np.mean(np.asarray(layers.mx_dense(x, w.T, b, even)) != d["mixed_s0/y"]) > 0.5


LAYERNORM = _load("mx_layernorm_fork.npz")


@pytest.mark.parametrize("case", _cases(LAYERNORM))
def test_layer_norm_equals_the_authors_layernorm(case):
    """Forward, dx and dgain of the fork's LayerNormFunction; it returns no bias
    gradient, which is what ``train_ln_bias=False`` reproduces. Bit for bit
    where order-independent; a float32 sum (the unrounded statistics, a float32
    backward) within the summation-order bound."""
    d = LAYERNORM
    s = _specs(d, case)
    r = recipes.get("paper_e4m3")
    if s["dont_quantize_layernorm"]:
        r = r.replace(ln_precision="stats_fp32")
    if not s["quantize_backprop"]:
        r = r.replace(backward_precision="fp32")
    x, gain, bias, g = (jnp.asarray(d[f"{case}/{k}"]) for k in ("x", "gain", "bias", "g"))

    def f(x, gain, bias, g):
        y, vjp = jax.vjp(lambda x, gn, b: layers.layer_norm(x, gn, b, r, eps=float(d["eps"])), x, gain, bias)
        return (y, *vjp(g))

    cert = exactness.certify(f, x, gain, bias, g)
    y, dx, dgain, dbias = jax.jit(f)(x, gain, bias, g)
    assert not bool(d[f"{case}/has_dbias"]) and np.all(np.asarray(dbias) == 0)
    _, rest, bwd = layers.ln_precisions(r)
    for i, (name, got) in enumerate((("y", y), ("dx", dx), ("dgain", dgain))):
        exactness.check(got, d[f"{case}/{name}"], cert[i], f"{case}: {name}",
                        bf16=(rest if name == "y" else bwd) == "bf16", unknown_atol=UNBOUNDED_ATOL)
    if s["quantize_backprop"] and not s["dont_quantize_layernorm"]:  # every op rounded: all of it decided
        assert all(cert[i].exact for i in range(3)), case


STUDENT = _load("mx_student_fork.npz")
_PARAMS = (("ln_gain", "ln.weight", False), ("ln_bias", "ln.bias", False), ("fc1", "fc1.weight", True),
           ("fc2", "fc2.weight", True), ("fc2_bias", "fc2.bias", False))


def _student_params(prefix):
    d = STUDENT
    depth = len({k.split(".")[1] for k in d.files if k.startswith("init/layers.")})
    return {f"block_{i}": {ours: jnp.asarray(d[f"{prefix}layers.{i}.{theirs}"]).T if t
                           else jnp.asarray(d[f"{prefix}layers.{i}.{theirs}"]) for ours, theirs, t in _PARAMS}
            for i in range(depth)}


# The student chains GEMMs through MX quantizers: a bf16 rounding that the summation-order bound leaves
# undecided feeds a quantizer block, and no bound survives that. Elements downstream of one are held to a
# tolerance (relative to the tensor's largest magnitude) and to a small fraction differing at all (a wrong
# rounding mode, say, changes most of them); the rest bit for bit.
STUDENT_ATOL = 2.0**-7
STUDENT_MAX_DIFFER = 0.05


@pytest.mark.parametrize("case,recipe", [("e4m3", "paper_e4m3"), ("mix", "paper_mix")])
def test_paper_recipes_reproduce_the_authors_student_step(case, recipe):
    """The authors' whole MX student (two residual blocks, their fork injected
    into torch): the output, the loss and every parameter gradient; bit for bit
    where order-independent, and else as stated above (``tests/exactness.py``)."""
    d = STUDENT
    p0 = _student_params("init/")
    st = model.Student(model.model_spec(width=p0["block_0"]["ln_gain"].shape[0], depth=len(p0),
                                     recipe=recipes.get(recipe)))
    x, y = jnp.asarray(d["batch0/x"]), jnp.asarray(d["batch0/y"])

    def loss_fn(p):
        out = st.apply({"params": p}, x)
        return jnp.mean(jnp.square(out - y)), out

    f = jax.value_and_grad(loss_fn, has_aux=True)
    cert = exactness.certify(f, p0)
    (loss, out), grads = jax.jit(f)(p0)
    assert set(str(n) for n in d[f"{case}/none_grads"]) == {f"layers.{i}.ln.bias" for i in range(len(p0))}
    want = {"loss": d[f"{case}/loss"], "out": d[f"{case}/out"]}
    for i in range(len(p0)):
        for ours, theirs, t in _PARAMS:
            w = d[f"{case}/grad/layers.{i}.{theirs}"]
            want[f"block_{i}/{ours}"] = w.T if t else w
    got = {"loss": loss, "out": out, **{f"{k}/{n}": v for k, g in grads.items() for n, v in g.items()}}
    flat = dict(zip(["loss", "out", *(f"{k}/{n}" for k in sorted(grads) for n in sorted(grads[k]))], cert.vals))
    for name in want:
        exactness.check(np.asarray(got[name]), want[name], flat[name], f"{case}: {name}",
                        bf16=name not in ("loss", "out"), unknown_atol=STUDENT_ATOL,
                        max_unknown_differ=STUDENT_MAX_DIFFER)


@pytest.mark.parametrize("case,recipe", [("e4m3", "paper_e4m3"), ("mix", "paper_mix")])
def test_three_adam_steps_track_the_authors_run(case, recipe):
    """Three Adam steps: the losses agree to float32 print precision; the
    parameters to Adam's last-bit arithmetic (torch's ``addcdiv`` order differs
    from the engine's), which can flip an MX rounding now and then."""
    d = STUDENT
    p = _student_params("init/")
    st = model.Student(model.model_spec(width=p["block_0"]["ln_gain"].shape[0], depth=len(p),
                                     recipe=recipes.get(recipe)))
    tx = scale_by_adam(0.9, 0.999, 1e-8)
    state = tx.init(p)
    losses = []
    for i in range(3):
        xs, ys = jnp.asarray(d["steps/x"][i]), jnp.asarray(d["steps/y"][i])
        loss, g = jax.value_and_grad(lambda q, xs=xs, ys=ys: jnp.mean(jnp.square(st.apply({"params": q}, xs) - ys)))(p)
        u, state = tx.update(g, state, p)
        p = jax.tree.map(lambda a, b: a - 6e-4 * b, p, u)
        losses.append(float(loss))
    np.testing.assert_allclose(losses, d[f"{case}/step_losses"], rtol=2e-6)
    final = _student_params(f"{case}/final/")
    for k in p:
        for name in p[k]:
            np.testing.assert_allclose(np.asarray(p[k][name]), np.asarray(final[k][name]), rtol=0, atol=5e-5)
        assert np.all(np.asarray(p[k]["ln_bias"]) == 0)


BUMP = _load("mx_bump_fork.npz")


@pytest.mark.parametrize("case", _cases(BUMP))
def test_paper_bump_equals_the_authors_exponent_bump(case):
    """``scale_rule="paper_bump"`` against the fork's ``quantize_mx_op`` with
    ``bump_up_overflow_exponent``: a position's exponent is bumped by the
    maximum over the blocks axis, bit for bit (and ``floor`` without it)."""
    d = BUMP
    x, axis = d[f"{case}/x"], int(str(d[f"{case}/axis"][0]))
    for rule, key in (("floor", "floor"), ("paper_bump", "bump")):
        got = quantize(x, MXSpec("fp8_e4m3", scale_rule=rule, rounding="away"), axis=axis)
        np.testing.assert_array_equal(np.asarray(got), d[f"{case}/{key}"], err_msg=rule)
    assert np.any(d[f"{case}/bump"] != d[f"{case}/floor"])


def test_paper_bump_is_e4m3_only_as_in_the_authors_code():
    with pytest.raises(ValueError, match="fp8_e4m3 elements in 1-D blocks only"):
        MXSpec("fp8_e5m2", scale_rule="paper_bump")
    with pytest.raises(ValueError, match="E4M3-only exponent bump; recipe 'paper_mix' also has fp8_e5m2"):
        recipes.mitigate("paper_mix", "paper_bump")
    bumped = recipes.mitigate("paper_e4m3", "paper_bump")
    assert bumped.fwd_x.scale_rule.name == "paper_bump" and bumped.name == "paper_e4m3+paper_bump"
    with pytest.raises(ValueError, match="paper_bump rule"):
        bumped.replace(backend="pallas")
