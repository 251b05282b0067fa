"""``mx_proxy.numerics.registry``: one lookup per kind, naming the valid choices on a miss; live views."""

import dataclasses

import pytest

from mx_proxy.nn.activations import ACTIVATIONS
from mx_proxy.nn.norms import NORMS
from mx_proxy.numerics import formats
from mx_proxy.numerics.operands import OPERAND_INFO, OPERANDS
from mx_proxy.numerics.registry import Registry
from mx_proxy.numerics.scale_rules import RULES
from mx_proxy.training.config import CHOICES, Config


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    doc: str = "an entry"
    order: int = 100


def test_lookup_order_and_a_miss_naming_the_valid_choices():
    reg = Registry("widget", "widgets of a test")
    for e in (Entry("b"), Entry("a", order=1), Entry("c")):
        reg.register(e)
    assert reg.names() == ("a", "b", "c") and list(reg) == ["a", "b", "c"] and len(reg) == 3
    assert reg.get("b") == Entry("b") and reg["c"].name == "c" and "a" in reg and "z" not in reg
    assert reg.get(reg["a"]) is reg["a"]  # an entry passes through
    assert reg.keys() == ("a", "b", "c") and [e.name for e in reg.values()] == ["a", "b", "c"]
    assert dict(reg.items()) == {n: reg[n] for n in ("a", "b", "c")} and dict(reg) == dict(reg.items())
    with pytest.raises(ValueError, match=r"unknown widget 'z'; valid: a, b, c"):
        reg.get("z")
    with pytest.raises(ValueError, match="unknown widget 3"):
        reg.get(3)
    with pytest.raises(KeyError):
        reg["z"]


@pytest.mark.parametrize("bad, message", [
    (Entry("a"), "widget 'a' is already registered"),
    (Entry(""), "needs a non-empty name"),
    (Entry(" x "), "without surrounding spaces"),
    (Entry("x", doc=None), "needs a one-line doc"),
])
def test_register_refuses_bad_entries(bad, message):
    reg = Registry("widget", "widgets of a test")
    reg.register(Entry("a"))
    with pytest.raises(ValueError, match=message):
        reg.register(bad)
    assert reg.names() == ("a",)


def test_added_is_valid_inside_the_block_only_even_when_it_raises():
    reg = Registry("widget", "widgets of a test")
    with pytest.raises(RuntimeError):
        with reg.added(Entry("tmp")):
            assert reg.names() == ("tmp",)
            raise RuntimeError
    assert reg.names() == ()
    reg.register(Entry("kept"))
    reg.remove("kept")
    with pytest.raises(ValueError, match="unknown widget 'kept'"):
        reg.remove("kept")


def test_a_subset_is_a_live_view():
    reg = Registry("widget", "widgets of a test")
    reg.register(Entry("a", doc="small"))
    big = reg.subset(lambda e: e.doc == "big", "big widget")
    assert big.names() == () and "a" not in big
    with reg.added(Entry("b", doc="big")):
        assert big.names() == ("b",) and "b" in big and len(big) == 1 and big.get("b") == Entry("b", doc="big")
        with pytest.raises(ValueError, match="unknown big widget 'a'; valid: b"):
            big.get("a")
    assert "b" not in big


def test_the_registries_hold_the_workbenchs_entries_and_config_reads_them():
    assert ACTIVATIONS.names() == ("gelu", "relu", "swiglu", "tanh", "linear", "relu2", "silu")
    assert NORMS.names() == ("layernorm", "none", "rmsnorm", "layernorm_noaffine")
    assert RULES.names() == ("floor", "rceil", "ceil", "even", "paper_bump")
    assert formats.names() == ("fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1", "int8", "bf16", "fp32")
    assert formats.MX_ELEMENTS.names() == formats.names()[:6]
    assert OPERANDS == OPERAND_INFO.names() == ("fwd_x", "fwd_w", "dgrad_g", "dgrad_w", "wgrad_x", "wgrad_g")
    assert CHOICES["act"] is ACTIVATIONS and CHOICES["norm"] is NORMS
    assert CHOICES["diagnostic_format"] is formats.MX_ELEMENTS
    assert ACTIVATIONS["swiglu"].gated and ACTIVATIONS["swiglu"].hidden_width(48) == 128
    assert ACTIVATIONS["gelu"].hidden_width(48) == 192 and ACTIVATIONS["swiglu"].fc1_width(128) == 256
    for field, bad, valid in (("act", "elu", ACTIVATIONS), ("norm", "batchnorm", NORMS)):
        with pytest.raises(ValueError, match=f"unknown {field} '{bad}'; valid: " + ", ".join(valid)):
            Config(**{field: bad})
    with pytest.raises(ValueError, match="not 'bf16'; valid: fp8_e4m3, fp8_e5m2, fp6_e3m2, fp6_e2m3, fp4_e2m1, int8"):
        Config(diagnostic_format="bf16")


def test_a_format_registered_at_run_time_is_valid_everywhere_and_gone_after():
    import ml_dtypes

    e3m4 = formats.float_format("fp8_e3m4", ml_dtypes.float8_e3m4, has_inf=True, has_nan=True, doc="E3M4")
    assert (e3m4.emax, e3m4.emin, e3m4.mantissa_bits, e3m4.max_normal) == (3, -2, 4, 15.5)
    with formats.FORMATS.added(e3m4):
        assert formats.get("fp8_e3m4") is e3m4 and "fp8_e3m4" in formats.MX_ELEMENTS
        assert Config(diagnostic_format="fp8_e3m4").diagnostic_format == "fp8_e3m4"
    with pytest.raises(ValueError, match="unknown element format 'fp8_e3m4'"):
        formats.get("fp8_e3m4")
    with pytest.raises(ValueError, match=r"alias\(es\) \['e4m3'\] of format 'x' already name another format"):
        formats.register(dataclasses.replace(e3m4, name="x"), ("e4m3",))
    assert "x" not in formats.FORMATS


@pytest.mark.parametrize("rule", ["floor", "rceil", "ceil", "even"])
def test_a_format_registered_at_run_time_quantizes_as_the_float64_reference(rule):
    import ml_dtypes
    import numpy as np

    from mx_proxy.numerics.quantize import MXSpec, quantize
    from mx_proxy.numerics.reference import reference_quantize

    rng = np.random.default_rng(0)
    x = (rng.standard_normal((8, 64)) * np.exp2(rng.integers(-12, 12, (8, 1)))).astype(np.float32)
    e3m4 = formats.float_format("fp8_e3m4", ml_dtypes.float8_e3m4, has_inf=True, has_nan=True, doc="E3M4")
    with formats.FORMATS.added(e3m4):
        spec = MXSpec("fp8_e3m4", scale_rule=rule)
        got, want = np.asarray(quantize(x, spec)), reference_quantize(x, spec)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    if rule == "floor":  # each block's elements on E3M4's grid times 2**(floor(log2 amax) - emax)
        blocks = x.reshape(8, 2, 32)
        e = np.floor(np.log2(np.abs(blocks).max(axis=2, keepdims=True))) - 3
        scaled = want.reshape(8, 2, 32) / np.exp2(e)
        assert np.array_equal(scaled.astype(ml_dtypes.float8_e3m4).astype(np.float64), scaled)
        assert np.abs(scaled).max() == 15.5 and len(np.unique(scaled)) > 100
