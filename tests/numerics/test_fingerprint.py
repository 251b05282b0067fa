"""mx_proxy.numerics.fingerprint: registry entries hashed by their data and code, the same in every process."""

import dataclasses
import os
import subprocess
import sys

import ml_dtypes

from mx_proxy.nn.activations import ACTIVATIONS, Activation
from mx_proxy.numerics import formats
from mx_proxy.numerics.fingerprint import fingerprint
from mx_proxy.numerics.formats import FORMATS
from mx_proxy.numerics.scale_rules import RULES


def test_the_same_entries_give_the_same_fingerprint_in_another_process():
    code = ("from mx_proxy.numerics.fingerprint import fingerprint; from mx_proxy.numerics.formats import FORMATS; "
            "from mx_proxy.numerics.scale_rules import RULES; from mx_proxy.nn.activations import ACTIVATIONS; "
            "print(fingerprint(ACTIVATIONS, RULES, FORMATS))")
    here = fingerprint(ACTIVATIONS, RULES, FORMATS)
    for seed in ("0", "12345"):  # string hashing (a frozenset constant's order) differs between processes
        env = {**os.environ, "PYTHONHASHSEED": seed}
        other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
        assert other.stdout.strip() == here


def _with(entry, registry=ACTIVATIONS):
    with registry.added(entry):
        return fingerprint(registry)


def _scaled(k):
    return lambda x, r: r(x * k)  # closes over k


def _helper(x):
    return x + 1


def test_code_closures_helpers_and_data_each_change_it():
    base = fingerprint(ACTIVATIONS)
    twice = lambda x, r: r(x * 2)  # noqa: E731
    a = _with(Activation(name="tmp", doc="d", fn=twice))
    assert a != base
    assert _with(Activation(name="tmp", doc="d", fn=twice)) == a  # the same entry registered again
    assert _with(Activation(name="tmp", doc="d", fn=lambda x, r: r(x * 3))) != a  # other code, same name
    assert _with(Activation(name="tmp", doc="d", fn=_scaled(2))) != _with(Activation(name="tmp", doc="d",
                                                                                      fn=_scaled(3)))
    uses = Activation(name="tmp", doc="d", fn=lambda x, r: r(_helper(x)))
    before = _with(uses)
    global _helper
    saved = _helper
    _helper = lambda x: x + 2  # noqa: E731 -- the helper redefined under its name, as a notebook cell does
    try:
        assert _with(uses) != before
    finally:
        _helper = saved
    e3m4 = formats.float_format("fp8_e3m4", ml_dtypes.float8_e3m4, has_inf=True, has_nan=True, doc="E3M4")
    changed = dataclasses.replace(e3m4, max_normal=15.0)
    assert _with(e3m4, FORMATS) != _with(changed, FORMATS)


def test_a_scale_rule_registered_twice_with_other_code_differs():
    from mx_proxy.numerics.scale_rules import ScaleRule

    one = _with(ScaleRule(name="tmp_rule", doc="d", bump=lambda amax, field, e0, fmt: field >= fmt.emax), RULES)
    two = _with(ScaleRule(name="tmp_rule", doc="d", bump=lambda amax, field, e0, fmt: field > fmt.emax), RULES)
    assert one != two
