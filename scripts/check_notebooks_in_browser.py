#!/usr/bin/env python
"""Open the committed notebooks in JupyterLab in a headless Chromium: save them unchanged, or run and use them.

    python scripts/check_notebooks_in_browser.py                    # every notebook: opened, saved, compared
    python scripts/check_notebooks_in_browser.py --run --shots DIR  # 01, 04, 10: Run All, the explorer, Interrupt
    python scripts/check_notebooks_in_browser.py --run 10 --panel-picture   # and store the panel's picture

What a reader does who only looks: each notebook is opened (its kernel starts,
nothing is run), left to settle, and saved through JupyterLab's own document
model. Reported per notebook: whether JupyterLab marked it modified before the
save, whether the saved file differs from the committed one (a diff if so),
whether a widget failed or a ``VBox(...)`` text shows, and whether the
pictures of markdown cells loaded.

``--run`` does what a reader does who runs them (notebooks 01, 04 and 10 by
default; ``scripts/browser_run.py``): Run → Run All Cells at the notebook's
own scale, then checks every cell ran without an error and its figures
show; in notebook 10 it types other settings into the explorer panel, clicks
Train and checks the panel's results table follows, then starts a long
training, clicks Kernel → Interrupt once the progress bar moves, and checks
that the panel says what it kept, the kernel is idle and answers ``1 + 1``.
It prints what it clicked and what it saw. The notebooks run in a temporary
folder beside a copy of the run store (``--store``, default the notebooks'
``runs/``: runs already there load instead of training) and the committed
``results/``. ``--panel-picture`` (with ``--run`` of notebook 10) stores a
screenshot of the panel, as notebook 10's own run left it, as the
``panel.png`` attachment of its picture cell: the one change this script
makes to the repository. ``--shots`` keeps screenshots.

Needs the ``notebooks`` extra (JupyterLab, ipykernel, ipywidgets) and a
Chromium (Debian: ``apt-get install chromium``; ``--chromium`` names another
binary). The server listens on 127.0.0.1 only, without a token, and both
processes are stopped at the end. Not part of the pytest suite (a browser and
one kernel per notebook: a minute to open and save all, a few more to run
three); ``tests/integration/test_notebooks.py`` and
``tests/integration/test_kernel_interrupt.py`` check what it relies on.
"""

from __future__ import annotations

import argparse
import base64
import difflib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import browser_run  # scripts/ is this script's first sys.path entry
from run_notebooks import NOTEBOOKS, ROOT, selected

# run in the page: open one notebook, wait for its kernel and widgets, report, save
OPEN_AND_SAVE = """
(async () => {
  const app = window.jupyterapp;
  const w = await app.commands.execute('docmanager:open', {path: %(path)s, factory: 'Notebook'});
  await w.context.ready;
  await w.sessionContext.ready;
  const kernel = w.sessionContext.session && w.sessionContext.session.kernel;
  if (kernel) { await kernel.info; }
  await new Promise(r => setTimeout(r, %(settle_ms)d));
  const dirty = w.context.model.dirty;
  const outputs = Array.from(w.node.querySelectorAll('.jp-OutputArea-output'));
  const report = {
    dirty,
    kernel: kernel ? kernel.name : null,
    widget_views: w.node.querySelectorAll('.jupyter-widgets.widget-container, .lm-Widget.jupyter-widgets').length,
    buttons: Array.from(w.node.querySelectorAll('.jupyter-widgets button')).map(b => b.textContent.trim()),
    pictures: Array.from(w.node.querySelectorAll('.jp-MarkdownCell img')).map(i => i.complete && i.naturalWidth > 0),
    vbox_text: outputs.some(o => o.textContent.includes('VBox(children=')),
    widget_errors: outputs.filter(o => o.textContent.includes('Error displaying widget')).length,
  };
  const panel = w.node.querySelector('.jupyter-widgets.widget-vbox');
  if (panel) { panel.scrollIntoView(); }
  await new Promise(r => setTimeout(r, 500));
  await w.context.save();
  return JSON.stringify(report);
})()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float, proc=None) -> bytes:
    t0 = time.monotonic()
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the process serving {url} exited ({proc.returncode})")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return r.read()
        except OSError:
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{url} did not answer within {timeout:.0f} s") from None
            time.sleep(0.5)


class Page:
    """A minimal Chrome DevTools Protocol client for one page (websocket-client, a jupyter_server dependency)."""

    def __init__(self, debug_port: int, timeout: float):
        import websocket

        targets = json.loads(wait_http(f"http://127.0.0.1:{debug_port}/json/list", timeout))
        url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        self.ws = websocket.create_connection(url, timeout=timeout, suppress_origin=True)
        self.n = 0

    def call(self, method: str, **params):
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.n:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    def evaluate(self, expression: str):
        r = self.call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(r["exceptionDetails"].get("exception", {}).get("description", r["exceptionDetails"]))
        return r["result"].get("value")


PICTURE = "panel.png"  # the attachment of notebook 10's picture cell
RUN_BY_DEFAULT = ("01", "04", "10")


def store_picture(png: bytes) -> None:
    """``png`` as the ``panel.png`` attachment of notebook 10's picture cell."""
    import nbformat

    path = NOTEBOOKS / "10_explore.ipynb"
    nb = nbformat.read(path, as_version=4)
    (cell,) = [c for c in nb.cells if c.cell_type == "markdown" and f"attachment:{PICTURE}" in c.source]
    cell["attachments"] = {PICTURE: {"image/png": base64.b64encode(png).decode()}}
    nbformat.write(nb, path)
    print(f"stored the panel's picture ({len(png) // 1024} KiB) in {path.relative_to(ROOT)}")


def figures_in(path: Path) -> int:
    """Figure outputs (image/png) of the committed notebook at ``path``."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    return sum("image/png" in o.get("data", {}) for c in nb["cells"] for o in c.get("outputs", []))


def run_and_use(page, paths, args) -> int:
    """``--run``: Run All in each notebook, the explorer in notebook 10 (scripts/browser_run.py); failures."""
    shots = Path(args.shots) if args.shots else None
    page.call("Emulation.setDeviceMetricsOverride", width=1400, height=1600, deviceScaleFactor=1, mobile=False)
    failures = 0
    for q in paths:
        ok, report = browser_run.run_notebook(page, q.name, figures_in(q), args.run_timeout, shots,
                                              saved=args.work / q.name, committed=q)
        if not q.name.startswith("10_"):  # notebook 10's saved file also holds its live panel's widget view
            ok = ok and report.get("changed_on_save") == 0
        if q.name.startswith("10_"):
            if args.panel_picture and ok:
                store_picture(browser_run.panel_screenshot(page))
            ok = browser_run.use_explorer(page, args.run_timeout, shots) and ok
        print(f"{q.name}: {'PASSED' if ok else 'FAILED'}")
        failures += not ok
        page.evaluate("(async () => { const w = window.__nb; await w.sessionContext.shutdown(); "
                      "w.context.model.dirty = false; w.dispose(); })()")
    return failures


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("only", nargs="*", help="notebook number prefixes (default: all)")
    p.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser") or "chromium")
    p.add_argument("--shots", help="a folder for screenshots (one per notebook; --run: a few more)")
    p.add_argument("--run", action="store_true",
                   help=f"run the notebooks (default {', '.join(RUN_BY_DEFAULT)}) and use notebook 10's explorer "
                        "instead of opening and saving them")
    p.add_argument("--store", default=str(ROOT / "runs"),
                   help="with --run: the run store the notebooks' STORE = '../runs' reads (copied; default runs/)")
    p.add_argument("--run-timeout", type=float, default=1800.0, help="with --run: seconds for each Run All")
    p.add_argument("--panel-picture", action="store_true",
                   help="with --run of notebook 10: store a screenshot of its panel in notebook 10 (the only change "
                        "this script makes to the repository)")
    p.add_argument("--settle", type=float, default=4.0, help="seconds to wait after the kernel is up, before saving")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds for the server, the browser and each step")
    args = p.parse_args(argv)
    if args.panel_picture and not (args.run and (not args.only or any("10".startswith(o) for o in args.only))):
        p.error("--panel-picture needs --run of notebook 10")
    missing = [m for m in ("jupyterlab", "ipykernel", "ipywidgets") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"{', '.join(missing)} not installed in {sys.executable}; install the notebooks extra: "
              "pip install -e '.[notebooks]'", file=sys.stderr)
        return 2
    if shutil.which(args.chromium) is None:
        print(f"--chromium {args.chromium!r}: not found; install Debian's chromium (apt-get install chromium) or "
              "name the browser", file=sys.stderr)
        return 2
    paths = selected(args.only or (RUN_BY_DEFAULT if args.run else ()))
    if not paths:
        print(f"no notebook matches {args.only}", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="nb-browser-"))
    work = args.work = tmp / "notebooks"
    work.mkdir()
    for q in paths:
        shutil.copy2(q, work / q.name)
    if args.run:  # the notebooks' ../runs and ../results
        if Path(args.store).is_dir():
            shutil.copytree(args.store, tmp / "runs", symlinks=True)
        (tmp / "results").symlink_to(ROOT / "results")
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp / "config"), JUPYTER_DATA_DIR=str(tmp / "data"),
               JUPYTER_RUNTIME_DIR=str(tmp / "runtime"), JUPYTERLAB_SETTINGS_DIR=str(tmp / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"))
    news = tmp / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text('{"fetchNews": "false"}')  # no "get notified about Jupyter news?" toast over the screenshots
    port, debug_port = free_port(), free_port()
    procs = []
    failures = 0
    try:
        lab = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
             "--IdentityProvider.token=", "--ServerApp.password=", "--ServerApp.disable_check_xsrf=True",
             f"--ServerApp.root_dir={work}", "--LabApp.expose_app_in_browser=True",
             "--LabApp.news_url=", "--ServerApp.port_retries=0"]
            + (["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []),
            env=env, stdout=open(tmp / "lab.log", "w"), stderr=subprocess.STDOUT)
        procs.append(lab)
        wait_http(f"http://127.0.0.1:{port}/api/status", args.timeout, lab)
        chrome = subprocess.Popen(
            [args.chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             f"--remote-debugging-port={debug_port}", "--remote-allow-origins=*", f"--user-data-dir={tmp / 'chrome'}",
             "--window-size=1400,1000", "about:blank"],
            stdout=open(tmp / "chrome.log", "w"), stderr=subprocess.STDOUT)
        procs.append(chrome)
        page = Page(debug_port, args.timeout)
        page.call("Page.enable")
        page.call("Emulation.setDeviceMetricsOverride", width=1400, height=1000, deviceScaleFactor=1, mobile=False)
        page.call("Page.navigate", url=f"http://127.0.0.1:{port}/lab")
        t0 = time.monotonic()
        while not page.evaluate("!!(window.jupyterapp && window.jupyterapp.shell)"):
            if time.monotonic() - t0 > args.timeout:
                raise TimeoutError("JupyterLab did not start in the browser")
            time.sleep(0.5)
        page.evaluate("window.jupyterapp.started")
        if args.run:
            failures += run_and_use(page, paths, args)
            paths = []
        for q in paths:
            t1 = time.perf_counter()
            report = json.loads(page.evaluate(OPEN_AND_SAVE % {"path": json.dumps(q.name),
                                                               "settle_ms": int(1000 * args.settle)}))
            if args.shots:
                Path(args.shots).mkdir(parents=True, exist_ok=True)
                shot = page.call("Page.captureScreenshot", format="png")["data"]
                (Path(args.shots) / f"{q.stem}.png").write_bytes(base64.b64decode(shot))
            page.evaluate("window.jupyterapp.commands.execute('application:close-all')")
            before, after = q.read_text(encoding="utf-8"), (work / q.name).read_text(encoding="utf-8")
            changed = before != after
            bad = (changed or report["dirty"] or report["vbox_text"] or report["widget_errors"]
                   or not all(report["pictures"]))
            failures += bool(bad)
            print(f"{q.name}: {'CHANGED' if changed else 'unchanged'} on save, "
                  f"{'marked modified' if report['dirty'] else 'not marked modified'} on open, kernel "
                  f"{report['kernel']}, {report['widget_views']} widget views {report['buttons']}, "
                  f"VBox text: {report['vbox_text']}, widget errors: {report['widget_errors']}, markdown pictures "
                  f"loaded: {report['pictures']} "
                  f"({time.perf_counter() - t1:.0f} s)")
            if changed:
                diff = difflib.unified_diff(before.splitlines(), after.splitlines(), "committed", "saved", lineterm="",
                                            n=2)
                print("\n".join(line[:200] for line in list(diff)[:60]))
    except Exception:
        for log in ("lab.log", "chrome.log"):
            if (tmp / log).exists():
                print(f"--- {log} (last lines)", file=sys.stderr)
                print("\n".join((tmp / log).read_text(errors="replace").splitlines()[-25:]), file=sys.stderr)
        raise
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in reversed(procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
