"""Paths and environment variables resolved once, early, with one error path (issue 63): a symbolic-link loop, an
unknown ``~user``, a file where a folder is needed; ``$PROXY_COMPILE_CACHE`` only tunes (one warning, the
default), ``$PROXY_ENSEMBLES`` decides where results go (a ValueError naming it)."""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import mx_proxy as mxp
from mx_proxy.experiments import ensemble_spec
from mx_proxy.training import compile_cache, paths

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bad(tmp_path):
    """Every kind of bad path, by name: a symbolic-link loop, an unknown user, a file, a file on the way, empty."""
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "file").write_text("")
    return {"loop": (str(tmp_path / "loop" / "x"), "a symbolic-link loop"),
            "user": ("~no_such_user_proxy/x", "no such user 'no_such_user_proxy'"),
            "file": (str(tmp_path / "file"), "is a file, not a folder"),
            "under-a-file": (str(tmp_path / "file" / "x"), f"'{tmp_path / 'file'}' is a file, not a folder"),
            "empty": ("", "must name a path, got an empty one")}


def test_checked_path_names_what_is_wrong_quoting_the_path_as_given(bad):
    for kind, (path, why) in bad.items():
        with pytest.raises(ValueError, match="the thing") as err:
            paths.checked_path(path, "the thing", folder=True)
        assert why in str(err.value) and (not path or repr(path) in str(err.value)), (kind, err.value)


def test_checked_path_expands_the_home_folder_like_every_command(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert paths.checked_path("~/x", "out", folder=True) == tmp_path / "x"
    assert paths.checked_path(tmp_path / "link-free", "out") == tmp_path / "link-free"


@pytest.mark.parametrize("value", ["file", "", "   ", "~no_such_user_proxy/c", "loop"])
def test_env_path_names_the_variable_and_its_value(bad, tmp_path, monkeypatch, value):
    value = {"file": bad["file"][0], "loop": bad["loop"][0]}.get(value, value)
    monkeypatch.setenv("PROXY_TEST_FOLDER", value)
    with pytest.raises(ValueError, match=r"^\$PROXY_TEST_FOLDER \(the test folder\) .*; valid: a folder path"):
        paths.env_path("PROXY_TEST_FOLDER", "the test folder")
    monkeypatch.setenv("PROXY_TEST_FOLDER", "OFF")
    assert paths.env_path("PROXY_TEST_FOLDER", "the test folder", off=("off",)) is None
    monkeypatch.delenv("PROXY_TEST_FOLDER")
    assert paths.env_path("PROXY_TEST_FOLDER", "the test folder") is None


@pytest.mark.parametrize("value", ["file", "", "   ", "~no_such_user_proxy/c", "loop", "under-a-file"])
def test_a_bad_compile_cache_variable_is_one_warning_and_the_default(bad, monkeypatch, value):
    value = bad[value][0] if value in ("file", "loop", "under-a-file") else value
    monkeypatch.setenv("PROXY_COMPILE_CACHE", value)
    before = compile_cache.active_dir()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        folder = compile_cache.enable()
    (w,) = caught
    assert "$PROXY_COMPILE_CACHE" in str(w.message) and repr(value) in str(w.message), w.message
    assert folder == before  # the folder already configured (else the default), kept
    with pytest.raises(ValueError, match=r"\$PROXY_COMPILE_CACHE"):
        compile_cache.resolve()  # the API's answer: an error naming it


def test_every_command_starts_under_a_bad_compile_cache_variable(bad):
    """Was: a traceback at import, even for ``mx-proxy list``."""
    for value in (bad["file"][0], "", " ", "~no_such_user_proxy/c"):
        env = dict(os.environ, PROXY_COMPILE_CACHE=value, PYTHONPATH=str(ROOT))
        out = subprocess.run([sys.executable, "-m", "mx_proxy.cli", "list", "recipes"], env=env, cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
        assert "$PROXY_COMPILE_CACHE" in out.stderr and "mxfp8_e4m3" in out.stdout


@pytest.mark.parametrize("kind", ["file", "user", "loop"])
def test_a_bad_ensembles_variable_is_a_value_error_before_any_training(bad, kind, monkeypatch, trained):
    monkeypatch.setenv(ensemble_spec.ENSEMBLES_ENV, bad[kind][0])
    with pytest.raises(ValueError, match=r"\$PROXY_ENSEMBLES \(where ensembles are kept\)") as err:
        mxp.ensemble(mxp.Config(width=16, depth=2, batch=32), arms=["fp32"], members=1, horizon=5, progress=False)
    assert bad[kind][1] in str(err.value) and trained == []


def test_the_ensembles_variable_moves_the_default_folder(tmp_path, monkeypatch):
    monkeypatch.setenv(ensemble_spec.ENSEMBLES_ENV, str(tmp_path / "ens"))
    assert ensemble_spec.default_out("a") == tmp_path / "ens" / "a"
    monkeypatch.delenv(ensemble_spec.ENSEMBLES_ENV)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert ensemble_spec.default_out("a") == tmp_path / ".cache" / "proxy" / "ensembles" / "a"
