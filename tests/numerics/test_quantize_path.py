"""The shape of the quantize path: one way for every spec, each stage entered once.

``quantize`` goes layout (pad, block max, split) -> block scale -> element
rounding -> back (unview), with no second route for any layout or scale
format. These tests trace one quantization per kind of spec and count the
calls of each stage; that the values are right is the business of
test_quantize*.py and test_nvfp4.py.
"""

import collections
import functools

import jax
import jax.numpy as jnp
import pytest

from mx_proxy.numerics import quantize as Q
from mx_proxy.numerics.mx import layout as L
from mx_proxy.numerics.mx import nvfp4

SPECS = {
    "1-D floor, last axis": (Q.MXSpec("fp8_e4m3"), -1),
    "1-D rceil, first axis": (Q.MXSpec("fp4_e2m1", scale_rule="rceil"), 0),
    "1-D paper_bump": (Q.MXSpec("fp8_e4m3", scale_rule="paper_bump"), -1),
    "2-D tiles": (Q.MXSpec("fp6_e3m2", block_dims=2), -1),
    "NVFP4": (Q.NVFP4, -1),
    "NVFP4 2-D": (Q.NVFP4_2D, -1),
}


def _counting(monkeypatch, owner, name, counts):
    original = getattr(owner, name)

    @functools.wraps(original)
    def counted(*args, **kwargs):
        counts[name] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)


@pytest.fixture
def stages(monkeypatch):
    counts = collections.Counter()
    for name in ("pad", "split", "block_max", "unview"):
        _counting(monkeypatch, L.Layout, name, counts)
    for name in ("per_block_quantities", "quantize_magnitudes"):
        _counting(monkeypatch, Q, name, counts)
    _counting(monkeypatch, nvfp4, "quantize_view", counts)
    return counts


@pytest.mark.parametrize("case", list(SPECS))
def test_each_stage_of_quantize_is_entered_once(case, stages):
    spec, axis = SPECS[case]
    x = jnp.zeros((40, 48), jnp.float32)  # ragged against 32: padding on the way in, a cut on the way out
    jax.make_jaxpr(Q._quantize_ste, static_argnums=(1, 2))(x, spec, axis % x.ndim, None)
    # (a split is a reshape: the block max may read its own of the padded array)
    assert stages["pad"] == stages["unview"] == 1 and stages["split"] >= 1, dict(stages)
    if spec.scale_format == "e4m3":  # NVFP4: scales and elements in one record-keeping pass on the view
        assert stages["quantize_view"] == 1 and stages["per_block_quantities"] == 0, dict(stages)
    else:
        assert stages["block_max"] == stages["per_block_quantities"] == stages["quantize_magnitudes"] == 1
        assert stages["quantize_view"] == 0


@pytest.mark.parametrize("case", ["1-D floor, last axis", "2-D tiles", "NVFP4"])
def test_the_statistics_walk_the_same_path(case, stages):
    spec, axis = SPECS[case]
    x = jnp.zeros((40, 48), jnp.float32)
    jax.make_jaxpr(Q._quantize_stats_jit.__wrapped__, static_argnums=(1, 2))(x, spec, axis)
    scale_stage = "quantize_view" if spec.scale_format == "e4m3" else "quantize_magnitudes"
    assert stages[scale_stage] == 1 and stages["unview"] == 0, dict(stages)
