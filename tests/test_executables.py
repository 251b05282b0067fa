"""Compiled programs kept on disk (mx_proxy.store.executables): keyed without tracing, loaded bit for bit, damaged
entries recompiled, unwritable folders harmless."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

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


def test_source_version_hashes_the_packages():
    v = executables.source_version()
    assert len(v) == 16 and v == executables.source_version()


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
