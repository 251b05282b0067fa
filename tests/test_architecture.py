"""The package's shape: imports flow one way, nothing imports lazily, modules stay small.

Data flows formats → mx → quantize → recipe → layers → model → engine →
runner → experiments → plots → figures → cli (see docs/architecture.md);
every import is a module-level import of a *lower* module, so the import
graph of ``proxy`` and ``kernels`` has no cycle, and no module reaches up
through the package face (``import proxy``).
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("proxy", "kernels")
MAX_LINES = 450


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            name = ".".join(f.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = f
    return out


MODULES = _modules()


def _imports(name: str, path: Path):
    """(target, lazy) for every import of a project module in ``path``."""
    tree = ast.parse(path.read_text())
    top = set(map(id, tree.body))
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for t in targets:
            if t.split(".")[0] in PACKAGES:
                yield t, id(node) not in top


GRAPH = {name: sorted({t for t, _ in _imports(name, p) if t in MODULES and t != name}) for name, p in MODULES.items()}


def test_no_lazy_imports_of_project_modules():
    lazy = sorted(f"{name} → {t}" for name, p in MODULES.items() for t, is_lazy in _imports(name, p) if is_lazy)
    assert lazy == []


def test_nothing_reaches_up_through_the_package_face():
    face = sorted(name for name, deps in GRAPH.items() for t in deps if t in PACKAGES and name not in PACKAGES)
    assert face == []


def test_the_import_graph_has_no_cycle():
    state: dict[str, int] = {}
    cycles = []

    def visit(n, path):
        state[n] = 1
        for m in GRAPH.get(n, ()):
            if m in PACKAGES:
                continue
            if state.get(m) == 1:
                cycles.append(" → ".join(path[path.index(m):] + [m]))
            elif m not in state:
                visit(m, path + [m])
        state[n] = 2

    for n in GRAPH:
        if n not in state:
            visit(n, [n])
    assert cycles == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_stay_small(name):
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name}: {lines} lines (split it by what it holds)"


def test_mx_arithmetic_lives_once():
    """The MX bit arithmetic (scale exponent, rounding, encode/decode) is
    defined in ``proxy.mx`` only: the XLA quantizer and the Pallas kernels
    both import it. (``proxy.reference``, the float64 reference the tests
    check both against, is written independently on purpose.)"""
    defs = {}
    for name, p in MODULES.items():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef):
                defs.setdefault(node.name, []).append(name)
    for fn in ("_floor_log2", "_round_magnitude", "_scale_exponent", "_max_normal_bits", "_pow2_bits"):
        owners = [m for m in defs.get(fn, []) if not m.startswith("proxy.mx") and m != "proxy.reference"]
        assert owners == [], f"{fn} re-implemented in {owners}"
    assert any(t.startswith("proxy.mx") for t in GRAPH["kernels.mx_quantize"])
