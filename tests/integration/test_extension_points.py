"""Every registry takes a new entry at run time, and the command line trains with it.

A throw-away activation (softplus), normalization (mean centring), scale
rule (always one binade above floor) and element format (ml_dtypes'
float8_e3m4, in a throw-away MX preset) are added to their registries inside
the test only -- no module of the package is edited -- and one width-16 run
trains with all four through ``mx_proxy.cli.main.main``. Each entry's code
must have run (its function is traced), the run's config must record it,
and once the registries are restored the same command is refused with exit
status 2 naming the valid choices.
"""

import contextlib
import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pandas as pd
import pytest

from mx_proxy.cli.main import main
from mx_proxy.nn.activations import ACTIVATIONS, Activation
from mx_proxy.nn.norms import NORMS, Norm
from mx_proxy.numerics import formats
from mx_proxy.numerics import recipe as recipes
from mx_proxy.numerics.formats import FORMATS
from mx_proxy.numerics.scale_rules import RULES, ScaleRule
from mx_proxy.store import executables

ARGS = ["train", "--width", "16", "--depth", "1", "--batch", "32", "--steps", "6", "--diagnostics-every", "3",
        "--val-every", "0", "--act", "softplus", "--norm", "meancenter", "--recipe", "mxfp8_e3m4+up_one",
        "--diagnostic-format", "fp8_e3m4", "--quiet"]


@contextlib.contextmanager
def _throw_away_entries(traced: list):
    """The four entries (and a preset using the format), registered inside the block only."""

    def softplus(x, r):
        traced.append("softplus")
        return r(jax.nn.softplus(x))

    def center(z, params, recipe):
        traced.append("meancenter")
        return z - jnp.mean(z, axis=-1, keepdims=True)

    def up_one(amax, field, e0, fmt):
        traced.append("up_one")
        return field >= fmt.emax  # every block one binade above floor (where floor is not clamped at -127)

    e3m4 = formats.float_format("fp8_e3m4", ml_dtypes.float8_e3m4, has_inf=True, has_nan=True,
                                doc="FP8 E3M4 (IEEE-like, max 15.5): a throw-away format")
    with contextlib.ExitStack() as stack:
        stack.enter_context(ACTIVATIONS.added(Activation(name="softplus", doc="softplus, log(1 + e^x)",
                                                         fn=softplus)))
        stack.enter_context(NORMS.added(Norm(name="meancenter", doc="subtract the feature mean (no scaling)",
                                             label="mean centring", apply=center)))
        stack.enter_context(RULES.added(ScaleRule(name="up_one", doc="one binade above floor", bump=up_one)))
        stack.enter_context(FORMATS.added(e3m4))
        preset = recipes.PRESETS["mxfp8_e4m3"].map_specs(lambda s: s.replace(element="fp8_e3m4"))
        recipes.PRESETS["mxfp8_e3m4"] = preset.replace(name="mxfp8_e3m4")
        stack.callback(recipes.PRESETS.pop, "mxfp8_e3m4")
        yield


def test_a_run_trains_with_a_new_entry_of_every_registry(tmp_path, capsys, monkeypatch):
    # programs are compiled here, not loaded from disk: a run of the suite before this one kept them, and a
    # loaded program traces nothing
    monkeypatch.setattr(executables, "folder", lambda: None)
    traced = []
    before = {r.kind: r.names() for r in (ACTIVATIONS, NORMS, RULES, FORMATS)}
    with _throw_away_entries(traced):
        assert "fp8_e3m4" in formats.MX_ELEMENTS and formats.get("fp8_e3m4").max_normal == 15.5
        assert main(ARGS + ["--store", str(tmp_path)]) == 0
    assert {"softplus", "meancenter", "up_one"} <= set(traced)

    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith(".")]
    config = json.loads((folder / "config.json").read_text())
    assert (config["act"], config["norm"], config["diagnostic_format"]) == ("softplus", "meancenter", "fp8_e3m4")
    specs = [config["recipe"][op] for op in ("fwd_x", "fwd_w", "dgrad_g", "dgrad_w", "wgrad_x", "wgrad_g")]
    assert {(s["element"], s["scale_rule"]) for s in specs} == {("fp8_e3m4", "up_one")}
    loss = pd.read_parquet(folder / "metrics.parquet")["loss"].to_numpy()
    assert len(loss) == 6 and np.all(np.isfinite(loss))

    # cleaned up: the registries are as before, and the command line no longer knows the entries
    assert {r.kind: r.names() for r in (ACTIVATIONS, NORMS, RULES, FORMATS)} == before
    assert "mxfp8_e3m4" not in recipes.PRESETS
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main(ARGS + ["--no-store"]))
    assert exc.value.code == 2
    assert "unknown act 'softplus'; valid: " + ", ".join(ACTIVATIONS) in capsys.readouterr().err


def _docs_example(heading: str) -> str:
    """The Python block under ``heading`` in docs/architecture.md."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()
    section = text[text.index(heading):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_docs_examples_are_one_file_each_and_work():
    """The activation and scale-rule files docs/architecture.md shows, run as written (then removed again)."""
    from mx_proxy.nn.activations import apply
    from mx_proxy.numerics.mx import block_scale
    from mx_proxy.numerics.quantize import MXSpec, quantize

    try:
        exec(compile(_docs_example("### Add an activation"), "softplus.py", "exec"), {})
        exec(compile(_docs_example("### Add a scale rule"), "top_half.py", "exec"), {})
        x = jnp.linspace(-4, 4, 64, dtype=jnp.float32)
        got = apply("softplus", x, recipes.get("fp32"))
        assert np.allclose(np.asarray(got), np.log1p(np.exp(np.asarray(x, np.float64))), rtol=1e-6)
        # amax 1.5 * 2**k bumps, 1.25 * 2**k does not (E4M3: emax 8)
        amax = jnp.asarray(np.array([1.5, 1.25, 3.0, 2.5], np.float32).view(np.uint32))
        e, nan = block_scale.block_exponent(amax, formats.get("fp8_e4m3"), RULES.get("top_half"))
        assert np.asarray(e).tolist() == [1 - 8, 0 - 8, 2 - 8, 1 - 8] and not np.asarray(nan).any()
        y = np.asarray(quantize(np.full((1, 32), 1.75, np.float32), MXSpec("fp8_e4m3", scale_rule="top_half")))
        assert np.all(y == 1.75)
    finally:
        for registry, name in ((ACTIVATIONS, "softplus"), (RULES, "top_half")):
            if name in registry:
                registry.remove(name)
    assert "softplus" not in ACTIVATIONS and "top_half" not in RULES
