"""No library module chooses a matplotlib backend; the ``mx-proxy`` command chooses Agg unless MPLBACKEND names one.
Each case runs in a fresh process without MPLBACKEND (the test process itself sets it in conftest)."""

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
BACKEND = "import matplotlib; print('BACKEND', matplotlib.rcParams._get_backend_or_none())"


def _backend(code: str, **env) -> str:
    base = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    base.update(PROXY_COMPILE_CACHE="off", **env)
    out = subprocess.run([sys.executable, "-c", f"{code}\n{BACKEND}"], env=base, cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return [line for line in out.stdout.splitlines() if line.startswith("BACKEND ")][-1].split()[1]


def test_importing_the_library_leaves_the_backend_unchosen():
    code = ("import mx_proxy as mxp, mx_proxy.viz.plots, mx_proxy.viz.figures, mx_proxy.viz.explore; "
            "import matplotlib.pyplot")
    assert _backend(code) == "None"


def test_the_command_chooses_agg_unless_mplbackend_says_otherwise():
    code = "from mx_proxy.cli import main as cli; assert cli.main(['bench', 'no-such-benchmark']) == 2"
    assert _backend(code).lower() == "agg"
    assert _backend(code, MPLBACKEND="svg") == "svg"
