"""Which member programs vmap, and that a vmapped group of bf16-dot members lowers for an NVIDIA GPU."""

import jax
import jax.numpy as jnp
import pytest

import mx_proxy as mxp
from mx_proxy.runner import programs
from mx_proxy.training.dynamic import dynamic_for
from mx_proxy.training.engine import program_for

BASE = mxp.Config(width=16, depth=2, batch=32, steps=30, lr=3e-3, recipe="paper_e4m3", paired_run=True,
                  diagnostics_every=5)


@pytest.mark.parametrize("dot, controller, backend, devices, expected", [
    ("f32", None, "cpu", 1, False),  # one CPU device: one member after another, each the single run's program
    ("bf16", None, "cpu", 1, False),
    ("f32", None, "cpu", 4, True),  # CPU devices: the member axis sharded over them
    ("bf16", None, "cpu", 4, False),  # YNNPACK's batched bf16 GEMMs
    ("f32", None, "gpu", 1, True),
    ("bf16", None, "gpu", 1, True),  # a GPU's bf16 dots are its tensor cores' GEMMs, batched or not
    ("bf16", None, "tpu", 1, True),
    ("f32", "gnmr", "gpu", 1, False),  # a controller's cond would become a select of both branches
    ("f32", "gnmr", "cpu", 4, False),
])
def test_members_vmap_where_the_device_and_the_program_allow(dot, controller, backend, devices, expected):
    assert programs.vmaps(BASE.replace(dot=dot, controller=controller), backend, devices) is expected


def test_a_vmapped_group_of_bf16_dot_members_lowers_for_cuda():
    cfg = BASE.replace(dot="bf16")
    prog, dyn = program_for(cfg), dynamic_for(cfg)
    state, teacher = jax.eval_shape(prog.init, dyn)
    members = jax.tree.map(lambda a: jax.ShapeDtypeStruct((4, *a.shape), a.dtype), state)
    dyns = jax.tree.map(lambda a: jnp.stack([a] * 4), dyn)

    def segment(s, d, te):
        return jax.vmap(lambda s, d: prog.segment(s, d, te, jnp.int32(0), jnp.int32(10), size=10))(s, d)

    text = jax.jit(segment).trace(members, dyns, teacher).lower(lowering_platforms=("cuda",)).as_text()
    dots = [line for line in text.splitlines() if "stablehlo.dot_general" in line]
    assert dots and any("bf16" in line.split("->")[0] for line in dots)  # the tensor-core GEMMs, batched
