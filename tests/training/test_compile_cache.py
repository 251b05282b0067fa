"""JAX's persistent compilation cache, on by default: where it lives, the opt-out, and that a second process
loads every program the first one compiled. Each case runs in fresh Python processes (the cache is
process-global) with a temporary cache folder."""

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

from mx_proxy.store import executables
from mx_proxy.training import compile_cache

ROOT = pathlib.Path(__file__).resolve().parents[2]

# one small training run in a fresh process; prints what JAX compiled and loaded
TRAIN = textwrap.dedent("""
    import json, os, jax
    counts = {"programs": 0, "hits": 0, "backend_s": 0.0}
    def on_duration(event, duration, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            counts["programs"] += 1
            counts["backend_s"] += duration
    def on_event(event, **_):
        if event == "/jax/compilation_cache/cache_hits":
            counts["hits"] += 1
    jax.monitoring.register_event_duration_secs_listener(on_duration)
    jax.monitoring.register_event_listener(on_event)
    import mx_proxy as mxp
    from mx_proxy.store import executables
    from mx_proxy.training import compile_cache
    run = mxp.train(mxp.Config(width=16, depth=1, batch=8, steps=4, diagnostics_every=2, val_every=2,
                                   val_batches=1, recipe="mxfp8_e4m3"), progress=False)
    trained = dict(counts)
    if os.environ.get("EAGER_TOO"):
        (jax.numpy.ones(3) + 1).block_until_ready()  # eager single operations: compiled in milliseconds
    print("RESULT", json.dumps(dict(trained, all_programs=counts["programs"], dir=str(compile_cache.active_dir()),
                                    loss=run.final_loss,
                                    min_time=jax.config.jax_persistent_cache_min_compile_time_secs,
                                    min_size=jax.config.jax_persistent_cache_min_entry_size_bytes,
                                    max_size=jax.config.jax_compilation_cache_max_size,
                                    loaded=executables.stats["loaded"], compiled=executables.stats["compiled"])))
""")


# one small jitted program in a fresh process
JIT = textwrap.dedent("""
    import json, jax, jax.numpy as jnp
    import mx_proxy as mxp
    from mx_proxy.training import compile_cache
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # this tiny program is written too
    jax.jit(lambda x: jnp.tanh(x) * 7)(jnp.ones(11)).block_until_ready()
    print("RESULT", json.dumps(dict(dir=str(compile_cache.active_dir()))))
""")


def _run(code: str, tmp_path, **env) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in ("PROXY_COMPILE_CACHE", "JAX_COMPILATION_CACHE_DIR")}
    base.update(HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "xdg"), **env)
    out = subprocess.run([sys.executable, "-c", code], env=base, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def test_resolve_order(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_cache.default_dir() == tmp_path / "xdg" / "proxy" / "jax"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert compile_cache.default_dir() == tmp_path / ".cache" / "proxy" / "jax"
    for off in ("off", "OFF", "0", "false", "none"):
        monkeypatch.setenv("PROXY_COMPILE_CACHE", off)
        assert compile_cache.resolve() is None
    monkeypatch.setenv("PROXY_COMPILE_CACHE", str(tmp_path / "mine"))
    assert compile_cache.resolve() == tmp_path / "mine"
    assert compile_cache.resolve(tmp_path / "explicit") == tmp_path / "explicit"  # an argument wins
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="'.*file' is a file, not a folder; valid: a folder path, or "
                                         "PROXY_COMPILE_CACHE=off"):
        compile_cache.resolve(tmp_path / "file")
    monkeypatch.setenv("PROXY_COMPILE_CACHE", str(tmp_path / "file"))
    with pytest.raises(ValueError, match=r"\$PROXY_COMPILE_CACHE"):
        compile_cache.resolve()
    monkeypatch.setenv("PROXY_COMPILE_CACHE", " ")
    with pytest.raises(ValueError, match=r"\$PROXY_COMPILE_CACHE \(the compilation cache folder\) is empty "
                                         r"\(' '\); valid: a folder path"):
        compile_cache.resolve()


def test_entries_counts_cache_files(tmp_path):
    assert compile_cache.entries(tmp_path / "missing") == (0, 0)
    (tmp_path / "jit_f-abc-cache").write_bytes(b"12345")
    (tmp_path / "other.txt").write_bytes(b"1")
    assert compile_cache.entries(tmp_path) == (1, 5)


@pytest.mark.e2e
def test_a_second_process_loads_every_program_from_the_cache(tmp_path):
    cache = tmp_path / "cache"
    first = _run(TRAIN, tmp_path, PROXY_COMPILE_CACHE=str(cache), EAGER_TOO="1")
    assert (first["dir"] == str(cache) and first["min_time"] == compile_cache.MIN_COMPILE_TIME_S
            and first["min_size"] == 0)
    assert first["max_size"] == compile_cache.MAX_SIZE_BYTES > 0  # a cap: JAX locks entries while it reads or writes
    n, size = compile_cache.entries(cache)
    assert first["hits"] == 0 and n >= 1 and size > 0  # the segment program at least (0.1 s or more to compile)
    names = [p.name.split("-")[0] for p in cache.iterdir() if p.is_file()]
    # the training programs are kept, not every eager single operation: which of those pass the 0.1 s bar is the
    # machine's (on a 2-core AVX2-only CPU under load an eager add can take longer to compile), so only the count
    assert "jit_segment" in names and "jit_val_loss" in names and n < first["all_programs"]
    assert first["compiled"] == 3 and first["loaded"] == 0  # init, segment, validation
    kept = sorted(p.name.split("-")[0] for p in (cache / executables.SUBDIR).iterdir())
    assert kept == ["init", "segment", "val_loss"]
    second = _run(TRAIN, tmp_path, PROXY_COMPILE_CACHE=str(cache))
    # the run's programs come back as executables: nothing is traced, lowered or compiled
    assert second["loaded"] == 3 and second["compiled"] == 0 and second["programs"] == 0
    assert second["loss"] == first["loss"]  # the kept programs compute the same numbers
    assert compile_cache.entries(cache)[0] == n
    third = _run(TRAIN, tmp_path, PROXY_COMPILE_CACHE="off")  # off: everything compiles, nothing is kept
    assert third["loaded"] == 0 and third["compiled"] == 3 and third["loss"] == first["loss"]


def test_default_folder_and_off(tmp_path):
    on = _run(JIT, tmp_path)
    default = tmp_path / "xdg" / "proxy" / "jax"
    assert on["dir"] == str(default) and compile_cache.entries(default)[0] >= 1
    off = _run(JIT, tmp_path / "off", PROXY_COMPILE_CACHE="off")
    assert off["dir"] == "None"
    assert not (tmp_path / "off" / "xdg" / "proxy").exists()
    assert not (tmp_path / "off" / "home" / ".cache" / "proxy").exists()


def test_jax_folder_is_kept_and_enable_moves_the_cache(tmp_path):
    moved_dir = str(tmp_path / "moved")
    code = textwrap.dedent(f"""
        import json, jax, jax.numpy as jnp
        import mx_proxy as mxp
        from mx_proxy.training import compile_cache
        kept = str(compile_cache.active_dir())
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # the tiny programs are written too
        jax.jit(lambda x: jnp.sin(x) * 3)(jnp.ones(3)).block_until_ready()
        moved = compile_cache.enable({moved_dir!r})
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.jit(lambda x: jnp.cos(x) + 2)(jnp.ones(5)).block_until_ready()
        print("RESULT", json.dumps(dict(kept=kept, moved=str(moved))))
    """)
    out = _run(code, tmp_path, JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jaxdir"))
    assert out == {"kept": str(tmp_path / "jaxdir"), "moved": str(tmp_path / "moved")}
    assert compile_cache.entries(tmp_path / "jaxdir")[0] >= 1  # the first program, before the move
    assert compile_cache.entries(tmp_path / "moved")[0] >= 1  # the second, after it


def test_bench_compile_rejects_bad_arguments(capsys):
    from mx_proxy.cli.bench import compile as bench

    for argv, message in ((["--steps", "150"], "multiple of the config's segment length 100"),
                          (["--steps", "100"], "at least 2 segments"),
                          (["--act", "gelu"], "the config's own activation"),
                          (["--act", "swish"], "unknown activation 'swish'; valid: gelu")):
        with pytest.raises(SystemExit) as exit_:
            bench.main(argv)
        assert exit_.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.e2e
def test_bench_compile_measures_cold_warm_and_a_new_program(tmp_path):
    out = subprocess.run([sys.executable, "-m", "mx_proxy.cli", "bench", "compile", "--steps", "200", "--cache",
                          str(tmp_path / "cache")], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    rows = [line.split()[0] for line in text.splitlines() if " overhead " in line and "|" in line]
    assert rows == ["cold", "warm", "act=relu"], text
    counts = [tuple(map(int, re.search(r"(\d+) programs, (\d+) from the cache", line).groups()))
              for line in text.splitlines() if "from the cache" in line]
    (cold_n, cold_hits), (warm_n, warm_hits), (new_n, new_hits) = counts
    kept = [tuple(map(int, re.search(r"kept executables: (\d+) loaded .*, (\d+) traced and compiled", line).groups()))
            for line in text.splitlines() if "kept executables" in line]
    assert cold_hits == 0 and cold_n > 0 and kept[0] == (0, 3), text  # cold: compiled, and kept
    assert warm_n == 0 and kept[1] == (3, 0), text  # warm: the three executables, nothing compiled
    # a new activation: new programs (init from JAX's cache)
    assert kept[2] == (0, 3) and 0 < new_n - new_hits < new_n, text
    assert "target: warm rerun adds <= 1 s:" in text and "target: a new program compiles in <= 8 s cold:" in text
    # those of the cold and the new programs that took 0.1 s or more to compile
    assert 0 < compile_cache.entries(tmp_path / "cache")[0] <= cold_n + new_n - new_hits
