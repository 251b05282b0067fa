"""The package's shape: one package, layers that import only lower layers, nothing lazy, small modules.

``mx_proxy``'s subpackages are the layers, lowest first (docs/architecture.md)::

    numerics -> pallas -> nn -> interop -> training -> store -> runner -> experiments -> viz -> cli

Every module imports, at module level, only modules of its own layer or of a
lower one; package nodes (``__init__.py``) count as modules of their layer, and
importing ``a.b.c`` also runs the package nodes ``a.b`` and ``a``, so those
edges are checked too. ``mx_proxy.version`` is a leaf below every layer. The
package face (``mx_proxy/__init__.py``) is above everything, imports only the
version eagerly and resolves its public names on first use; nothing imports it.
"""

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "mx_proxy"
LAYERS = ("numerics", "pallas", "nn", "interop", "training", "store", "runner", "experiments", "viz", "cli")
LEAVES = ("mx_proxy.version",)  # below every layer; import nothing of the project
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    out = {}
    for f in sorted((ROOT / PACKAGE).rglob("*.py")):
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
            if t.split(".")[0] == PACKAGE:
                yield t, id(node) not in top


def _with_parents(importer: str, target: str) -> list[str]:
    """``target`` and the package nodes importing it runs: its parents, except the importer's own
    (already initialized when the importer runs) and the face (see the face test)."""
    parts = target.split(".")
    parents = [".".join(parts[:k]) for k in range(2, len(parts))]
    return [target] + [p for p in parents if not importer.startswith(p + ".")]


GRAPH = {name: sorted({m for t, _ in _imports(name, p) for m in _with_parents(name, t) if m in MODULES and m != name})
         for name, p in MODULES.items()}


def rank(name: str) -> int:
    if name == PACKAGE:
        return len(LAYERS)  # the face: above everything
    if name in LEAVES:
        return -1
    return LAYERS.index(name.split(".")[1])


def test_every_module_sits_in_a_layer():
    stray = [n for n in MODULES if n != PACKAGE and n not in LEAVES and n.split(".")[1] not in LAYERS]
    assert stray == [], f"modules outside the layers {LAYERS}: {stray}"
    assert all(f"{PACKAGE}.{layer}" in MODULES for layer in LAYERS), "every layer is a package with an __init__.py"


def test_layers_import_only_lower_layers():
    up = sorted(f"{n} → {m}" for n, deps in GRAPH.items() for m in deps if n != PACKAGE and rank(m) > rank(n))
    assert up == [], "imports from a higher layer:\n" + "\n".join(up)


def test_leaves_import_nothing_of_the_project():
    assert {n: GRAPH[n] for n in LEAVES} == {n: [] for n in LEAVES}


def test_no_lazy_imports_of_project_modules():
    lazy = sorted(f"{name} → {t}" for name, p in MODULES.items() for t, is_lazy in _imports(name, p) if is_lazy)
    assert lazy == []


def test_nothing_reaches_up_through_the_package_face():
    face = sorted(name for name, p in MODULES.items() for t, _ in _imports(name, p) if t == PACKAGE)
    assert face == []


def test_the_face_is_lazy_and_names_what_exists():
    tree = ast.parse(MODULES[PACKAGE].read_text())
    eager = sorted({t for t, _ in _imports(PACKAGE, MODULES[PACKAGE])})
    assert eager == list(LEAVES)
    (lazy,) = [ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
               and getattr(n.targets[0], "id", "") == "_LAZY"]
    assert all(module in MODULES for module, _ in lazy.values())
    # a public name equal to a subpackage would be overwritten by the import system (mx_proxy.train vs training/)
    assert not set(lazy) & {n.split(".")[1] for n in MODULES if n.count(".") >= 1}


def test_the_import_graph_has_no_cycle():
    state: dict[str, int] = {}
    cycles = []

    def visit(n, path):
        state[n] = 1
        for m in GRAPH.get(n, ()):
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
    defined in ``mx_proxy.numerics.mx`` only: the XLA quantizer and the Pallas
    kernels both import it. (``mx_proxy.numerics.reference``, the float64
    reference the tests check both against, is written independently on purpose.)"""
    defs = {}
    for name, p in MODULES.items():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef):
                defs.setdefault(node.name, []).append(name)
    for fn in ("_floor_log2", "_round_magnitude", "_scale_exponent", "_max_normal_bits", "_pow2_bits"):
        owners = [m for m in defs.get(fn, []) if not m.startswith("mx_proxy.numerics.mx")
                  and m != "mx_proxy.numerics.reference"]
        assert owners == [], f"{fn} re-implemented in {owners}"
    assert any(t.startswith("mx_proxy.numerics.mx") for t in GRAPH["mx_proxy.pallas.tile"])


def test_one_top_level_package():
    packages = sorted(d.name for d in ROOT.iterdir() if (d / "__init__.py").exists())
    assert packages == [PACKAGE]
    text = (ROOT / "pyproject.toml").read_text()
    assert 'include = ["mx_proxy*"]' in text


def test_importing_the_lower_layers_is_light():
    """``import mx_proxy.numerics`` (and the Pallas kernels and the networks on top of it) pulls in no
    matplotlib, no training code, and leaves JAX's compilation cache as it was."""
    code = textwrap.dedent("""
        import json, sys
        import mx_proxy.numerics, mx_proxy.numerics.quantize, mx_proxy.numerics.recipe, mx_proxy.numerics.recipe_json
        import mx_proxy.numerics.reference, mx_proxy.numerics.formats
        import jax
        seen = {"numerics": dict(mpl="matplotlib" in sys.modules, cache=jax.config.jax_compilation_cache_dir,
                                 training="mx_proxy.training" in sys.modules)}
        import mx_proxy.pallas.matmul, mx_proxy.nn.architectures
        seen["nn"] = dict(mpl="matplotlib" in sys.modules, cache=jax.config.jax_compilation_cache_dir,
                          training="mx_proxy.training" in sys.modules)
        print(json.dumps(seen))
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("PROXY_COMPILE_CACHE", "JAX_COMPILATION_CACHE_DIR")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = __import__("json").loads(out.stdout.strip().splitlines()[-1])
    light = dict(mpl=False, cache=None, training=False)
    assert seen == {"numerics": light, "nn": light}


def test_the_tests_mirror_the_packages():
    """One test folder per layer, named for it, plus ``integration/`` (library
    vectors, notebooks, docs, this file) and ``data/``; no test file at the top."""
    tests = ROOT / "tests"
    folders = {p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    assert folders == set(LAYERS) | {"integration", "data"}, folders
    assert not list(tests.glob("test_*.py"))
    for layer in LAYERS:
        assert list((tests / layer).glob("test_*.py")), f"tests/{layer}/ has no tests"
    names = [p.name for p in tests.glob("*/test_*.py")]
    assert len(names) == len(set(names)), "test file names must be unique (pytest's default import mode)"
