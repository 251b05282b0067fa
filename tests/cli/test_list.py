"""``mx-proxy list KIND``: each registry's entries, read from the registry; the docs' tables are its output."""

import pathlib
import re

import pytest

from mx_proxy.cli.list_command import KINDS, markdown
from mx_proxy.cli.main import main
from mx_proxy.nn.activations import ACTIVATIONS, Activation
from mx_proxy.numerics import recipe as recipes

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def _run(argv, capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main(argv))
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def _names(text: str) -> list[str]:
    return [line.split()[0] for line in text.splitlines()[1:]]


def test_scale_rules_lists_the_five_rules_in_order(capsys):
    code, out, _ = _run(["list", "scale-rules"], capsys)
    assert code == 0
    assert _names(out) == ["floor", "rceil", "ceil", "even", "paper_bump"]
    assert out.splitlines()[0].split() == ["name", "Pallas", "kernels", "elements", "what"]
    assert "torchao CEIL" in out and "OCP MX v1.0" in out


@pytest.mark.parametrize("kind, names", [
    ("acts", ["gelu", "relu", "swiglu", "tanh", "linear", "relu2", "silu"]),
    ("norms", ["layernorm", "none", "rmsnorm", "layernorm_noaffine"]),
    ("formats", ["fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1", "int8", "bf16", "fp32"]),
    ("operands", ["fwd_x", "fwd_w", "dgrad_g", "dgrad_w", "wgrad_x", "wgrad_g"]),
    ("recipes", list(recipes.PRESETS)),
])
def test_every_kind_lists_its_entries(kind, names, capsys):
    code, out, _ = _run(["list", kind], capsys)
    assert code == 0 and _names(out) == names
    code, md, _ = _run(["list", kind, "--markdown"], capsys)
    assert code == 0 and md.startswith("| recipe |" if kind == "recipes" else "| name |")
    assert md.count("\n| `") == len(names)


def test_a_bad_kind_exits_2_naming_the_valid_kinds(capsys):
    code, _, err = _run(["list", "activations"], capsys)
    assert code == 2
    assert "invalid choice: 'activations'" in err
    assert all(repr(k) in err for k in ("acts", "norms", "scale-rules", "formats", "recipes"))
    assert KINDS == ("acts", "norms", "scale-rules", "formats", "operands", "recipes")


def test_an_entry_added_at_run_time_is_listed_and_gone_after(capsys):
    with ACTIVATIONS.added(Activation(name="softsign", doc="x / (1 + |x|)", fn=lambda x, r: r(x / (1 + abs(x))))):
        code, out, _ = _run(["list", "acts"], capsys)
        assert code == 0 and "softsign" in _names(out) and "x / (1 + |x|)" in out
    code, out, _ = _run(["list", "acts"], capsys)
    assert "softsign" not in _names(out)


def test_the_docs_tables_are_the_listings():
    text = DOCS.read_text()
    blocks = dict(re.findall(r"<!-- mx-proxy list ([\w-]+) -->\n(.*?)\n<!-- end of list -->", text, re.S))
    assert set(blocks) == {"acts", "norms", "scale-rules", "formats"}
    for kind, table in blocks.items():
        assert table == markdown(kind), f"docs/architecture.md's {kind} table is stale: paste `mx-proxy list " \
                                        f"{kind} --markdown`"
