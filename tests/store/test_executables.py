"""Compiled programs kept on disk (mx_proxy.store.executables): keyed without tracing, loaded bit for bit, damaged
entries recompiled, unwritable folders harmless."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mx_proxy as mxp
from mx_proxy.store import executables
from mx_proxy.store.executables import CachedProgram


@pytest.fixture(autouse=True)
def no_jax_cache():
    """JAX's own compilation cache off: every program here is compiled, not loaded by JAX."""
    from jax.experimental.compilation_cache import compilation_cache as cc

    was = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    cc.reset_cache()  # JAX decides once per process whether it uses its cache: decide again
    yield
    jax.config.update("jax_enable_compilation_cache", was)
    cc.reset_cache()


@pytest.fixture
def kept(tmp_path, monkeypatch):
    """A fresh executables folder and zeroed counters."""
    monkeypatch.setattr(executables, "folder", lambda: tmp_path / "kept")
    executables.reset_stats()
    yield tmp_path / "kept"
    executables.reset_stats()


def _program(key="k"):
    def f(x, scale, *, n):
        return jnp.cumsum(jnp.sin(x) * scale)[:n], jnp.sum(x)

    return CachedProgram("f", jax.jit(f, static_argnames=("n",)), key)


X = np.linspace(-3, 3, 16, dtype=np.float32)


def test_a_new_instance_loads_what_another_compiled(kept):
    first = _program()(X, np.float32(2), n=5)
    assert executables.stats["compiled"] == 1 and len(list(kept.iterdir())) == 1
    again = _program()(X, np.float32(2), n=5)  # a new instance: as a new process would see it
    assert executables.stats["loaded"] == 1 and executables.stats["compiled"] == 1
    for a, b in zip(first, again):
        assert np.array_equal(a, b)
    reference = jax.jit(lambda x, s: (jnp.cumsum(jnp.sin(x) * s)[:5], jnp.sum(x)))(X, np.float32(2))
    for a, b in zip(first, reference):
        assert np.array_equal(a, b)


def test_key_static_arguments_and_signature_make_separate_programs(kept):
    p = _program()
    p(X, np.float32(2), n=5)
    p(X, np.float32(3), n=5)  # same signature: the program in memory
    assert executables.stats["compiled"] == 1
    p(X, np.float32(2), n=6)  # another static argument
    p(X[:8], np.float32(2), n=5)  # another shape
    p(X, 2.0, n=5)  # a weak-typed scalar
    _program("other key")(X, np.float32(2), n=5)
    assert executables.stats["compiled"] == 5 and executables.stats["loaded"] == 0
    assert len(list(kept.iterdir())) == 5


def test_a_damaged_entry_is_compiled_again_and_replaced(kept):
    want = _program()(X, np.float32(2), n=5)
    (path,) = kept.iterdir()
    path.write_bytes(b"not an executable")
    got = _program()(X, np.float32(2), n=5)
    assert executables.stats["compiled"] == 2 and executables.stats["loaded"] == 0
    assert all(np.array_equal(a, b) for a, b in zip(want, got))
    executables.reset_stats()
    _program()(X, np.float32(2), n=5)
    assert executables.stats["loaded"] == 1  # the replacement is good


def test_an_unwritable_folder_warns_once_and_still_computes(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("a file where the folder should be")
    monkeypatch.setattr(executables, "folder", lambda: blocked / "sub")
    monkeypatch.setattr(executables, "_warned", False)
    with pytest.warns(UserWarning, match="cannot keep compiled programs"):
        out = _program()(X, np.float32(2), n=5)
    assert np.allclose(out[1], np.sum(X), atol=1e-5)


def test_no_folder_compiles_in_memory_only(monkeypatch):
    monkeypatch.setattr(executables, "folder", lambda: None)
    executables.reset_stats()
    p = _program()
    p(X, np.float32(2), n=5)
    p(X, np.float32(2), n=5)
    assert executables.stats["compiled"] == 1 and executables.stats["loaded"] == 0


def test_one_code_version_keys_programs_and_stored_runs():
    from mx_proxy.store import run_store
    from mx_proxy.training import code_version as cv

    v = cv.code_version()
    assert len(v) == 16 and v == run_store.code_version() == cv.digest(Path(mxp.__file__).parent)


def test_the_code_version_covers_every_source_that_changes_numbers(tmp_path):
    """An edit to the kernels, the numerics, the networks, the training layer or
    the host loop (whose program wrappers are traced) is a new version; an
    edit to the CLI or the figures is not."""
    import shutil

    from mx_proxy.training import code_version as cv

    tree = tmp_path / "mx_proxy"
    shutil.copytree(Path(mxp.__file__).parent, tree, ignore=shutil.ignore_patterns("__pycache__"))
    before = cv.digest(tree)
    for edited, changes in (("cli/main.py", False), ("viz/figures.py", False), ("pallas/quantize.py", True),
                            ("numerics/mx/bits.py", True), ("nn/layers.py", True), ("training/twins.py", True),
                            ("runner/programs.py", True), ("store/run_store.py", False)):
        f = tree / edited
        original = f.read_bytes()
        f.write_bytes(original + b"\n# edited\n")
        assert (cv.digest(tree) != before) == changes, edited
        f.write_bytes(original)
    assert cv.digest(tree) == before


def test_an_executable_failing_its_first_call_is_replaced(kept, monkeypatch):
    want = _program()(X, np.float32(2), n=5)

    def broken(*args):
        raise jax.errors.JaxRuntimeError("NOT_FOUND: Function fusion not found")

    real_load = executables._load
    monkeypatch.setattr(executables, "_load", lambda path: broken)
    got = _program()(X, np.float32(2), n=5)
    assert all(np.array_equal(a, b) for a, b in zip(want, got))
    assert executables.stats["loaded"] == 1 and executables.stats["compiled"] == 2
    monkeypatch.setattr(executables, "_load", real_load)
    executables.reset_stats()
    _program()(X, np.float32(2), n=5)
    assert executables.stats["loaded"] == 1 and executables.stats["compiled"] == 0  # the rewritten file loads


def test_a_program_jax_loaded_from_its_cache_is_not_kept(kept, tmp_path, monkeypatch):
    monkeypatch.setattr(executables, "_cache_hits", [0])
    real = jax.stages.Lowered.compile

    def hit(self, *a, **k):  # as JAX reports a persistent-cache hit
        executables._count_cache_hit("/jax/compilation_cache/cache_hits")
        return real(self, *a, **k)

    monkeypatch.setattr(jax.stages.Lowered, "compile", hit)
    _program()(X, np.float32(2), n=5)
    assert executables.stats["compiled"] == 1 and not kept.exists()


def test_the_least_recently_used_programs_are_released_over_the_mapping_budget(monkeypatch):
    """Each XLA:CPU executable holds memory mappings of its own and Linux caps them
    per process (vm.max_map_count): over the budget, the oldest programs give
    theirs up before a new one is made, and compile again, equal, when called."""
    monkeypatch.setattr(executables, "folder", lambda: None)
    executables.release_all()
    executables.reset_stats()
    a, b, c = _program("a"), _program("b"), _program("c")
    want = a(X, np.float32(2), n=5)
    b(X, np.float32(2), n=5)
    assert executables.stats["released"] == 0
    monkeypatch.setattr(executables, "map_usage", lambda: (10, 10))  # over any budget
    c(X, np.float32(2), n=5)
    assert executables.stats["released"] == 2 and list(executables._LIVE.values()) == [c]
    got = a(X, np.float32(2), n=5)  # compiled again, and the same program
    assert executables.stats["compiled"] == 4
    for x, y in zip(want, got):
        assert np.array_equal(x, y)
    cleared, before = [], executables.stats["cleared"]
    monkeypatch.setattr(jax, "clear_caches", lambda: cleared.append(1))
    executables.make_room(keep=a)  # nothing of ours left to release: JAX's own caches go
    assert cleared == [1] and executables.stats["cleared"] == before + 1
    monkeypatch.setattr(executables, "map_usage", lambda: None)  # no /proc: at most MAX_LIVE programs
    monkeypatch.setattr(executables, "MAX_LIVE", 1)
    b(X, np.float32(2), n=5)
    assert list(executables._LIVE.values()) == [b]


def test_a_long_session_of_distinct_runs_stays_within_the_mapping_budget(monkeypatch):
    """Without the budget, a worker process that had trained some sixty
    distinct configs crashed inside XLA (no mappings left). Here the budget is
    set just above this process's mappings: the runs keep training, their
    mappings stay bounded, and the oldest programs were released."""
    usage = executables.map_usage()
    if usage is None:
        pytest.skip("needs /proc/self/maps (Linux)")
    import mx_proxy as mxp

    monkeypatch.setattr(executables, "folder", lambda: None)
    executables.reset_stats()
    budget = usage[0] + 1500  # one paired run's programs hold ~950-1400 mappings: the second run passes it
    monkeypatch.setattr(executables, "MAP_SHARE", budget / usage[1])
    peak = 0
    for width in (8, 12, 16):
        run = mxp.train(mxp.Config(width=width, depth=1, batch=16, steps=10, recipe="mxfp8_e4m3", paired_run=True,
                                   diagnostics_every=5, val_every=5), progress=False)
        assert np.isfinite(run.final_loss)
        peak = max(peak, executables.map_usage()[0])
    assert executables.stats["released"] > 0
    assert peak < budget + 1500  # the budget plus one paired run's programs


def test_an_entry_that_changes_its_code_under_the_same_name_is_a_new_program(kept):
    """A notebook re-registers its activation with other code: the program on disk traced with the old code
    is not loaded (the key holds the registries' fingerprint), and the result is the new code's."""
    from mx_proxy.nn.activations import ACTIVATIONS, Activation

    def program():
        return CachedProgram("act", jax.jit(lambda x: ACTIVATIONS.get("twice").fn(x, lambda y: y)), "same key")

    with ACTIVATIONS.added(Activation(name="twice", doc="x times 2", fn=lambda x, r: r(x * 2))):
        first = program()(X)
        assert np.array_equal(program()(X), first) and executables.stats["loaded"] == 1  # same code: loaded
    with ACTIVATIONS.added(Activation(name="twice", doc="x times 2", fn=lambda x, r: r(x * 3))):
        second = program()(X)
    assert executables.stats["compiled"] == 2 and executables.stats["loaded"] == 1
    np.testing.assert_array_equal(second, X * 3)
