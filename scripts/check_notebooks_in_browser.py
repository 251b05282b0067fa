#!/usr/bin/env python
"""Open the committed notebooks in JupyterLab in a headless Chromium, save them, and check nothing changed.

    python scripts/check_notebooks_in_browser.py                    # every notebooks/[0-9][0-9]_*.ipynb
    python scripts/check_notebooks_in_browser.py 10 --shots /tmp/shots

What a reader does who only looks: each notebook is opened (its kernel starts,
nothing is run), left to settle, and saved through JupyterLab's own document
model. Reported per notebook: whether JupyterLab marked it modified before the
save, whether the saved file differs from the committed one (a diff if so),
and, for notebooks with saved widget state, how many widget views rendered and
whether a ``VBox(...)`` text shows instead, and whether the pictures of markdown
cells loaded. ``--shots`` keeps a screenshot of each. Works on copies in a
temporary folder: the repository is not touched, except by ``--panel-picture``.

A freshly opened notebook is untrusted, and JupyterLab renders no widget of an
untrusted notebook (it falls back to the output's text). ``--panel-picture``
also opens a *trusted* copy of notebook 10, checks that its panel renders from
the saved widget state (controls, Train button, the figure in its Output
widget), and stores a screenshot of the panel as the ``panel.png`` attachment
of notebook 10's picture cell: the picture a reader sees before running the
cells. Rerun it after ``scripts/run_notebooks.py 10``.

Needs the ``notebooks`` extra (JupyterLab, ipykernel, ipywidgets) and a
Chromium (Debian: ``apt-get install chromium``; ``--chromium`` names another
binary). The server listens on 127.0.0.1 only, without a token, for the few
seconds of the check, and both processes are stopped at the end. Not part of
the pytest suite (a browser start and one kernel per notebook: about a minute);
``tests/integration/test_notebooks.py`` checks the metadata this relies on.
"""

from __future__ import annotations

import argparse
import difflib
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

from run_notebooks import NOTEBOOKS, ROOT, selected  # scripts/ is this script's first sys.path entry

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


# run in the page: open a (trusted) notebook, wait until its panel widget has rendered with its figure
RENDER_PANEL = """
(async () => {
  const app = window.jupyterapp;
  app.shell.collapseLeft();  // the panel at the width of a notebook without the file browser beside it
  const w = await app.commands.execute('docmanager:open', {path: %(path)s, factory: 'Notebook'});
  await w.context.ready;
  await w.sessionContext.ready;
  const t0 = Date.now();
  let panel = null;
  while (Date.now() - t0 < %(timeout_ms)d) {
    panel = w.node.querySelector('.jp-OutputArea-output .jupyter-widgets.widget-vbox');
    const img = panel && panel.querySelector('img');
    if (img && img.complete && img.naturalWidth > 0) break;
    await new Promise(r => setTimeout(r, 250));
  }
  if (!panel) { return JSON.stringify({rendered: false}); }
  // the picture shows the panel, not ipywidgets' mark of a widget without a kernel (the note beside it says so)
  const style = document.createElement('style');
  style.textContent = '.jupyter-widgets-disconnected::before { content: none !important; }';
  document.head.appendChild(style);
  const disconnected = panel.querySelectorAll('.jupyter-widgets-disconnected').length;
  panel.scrollIntoView({block: 'start'});
  await new Promise(r => setTimeout(r, 1000));
  const box = panel.getBoundingClientRect();
  return JSON.stringify({
    rendered: true, disconnected,
    buttons: Array.from(panel.querySelectorAll('button')).map(b => b.textContent.trim()),
    controls: panel.querySelectorAll('input, select').length,
    figure: Array.from(panel.querySelectorAll('img')).some(i => i.naturalWidth > 0),
    status: (panel.querySelector('.widget-html-content') || {}).textContent || '',
    box: {x: box.x, y: box.y, width: box.width, height: box.height},
  });
})()
"""
PICTURE = "panel.png"  # the attachment of notebook 10's picture cell


def panel_picture(page, work: Path, env: dict, args) -> int:
    """Render notebook 10's saved panel in a trusted copy; store its screenshot in notebook 10. 1 on failure."""
    import base64

    import nbformat

    name = "10_explore.ipynb"
    trusted = work / "trusted"
    trusted.mkdir()
    shutil.copy2(NOTEBOOKS / name, trusted / name)
    subprocess.run([sys.executable, "-m", "nbformat.sign", str(trusted / name)], env=env, check=True,
                   capture_output=True)
    page.call("Emulation.setDeviceMetricsOverride", width=1400, height=1600, deviceScaleFactor=1, mobile=False)
    report = json.loads(page.evaluate(RENDER_PANEL % {"path": json.dumps(f"trusted/{name}"),
                                                      "timeout_ms": int(1000 * args.timeout)}))
    ok = report["rendered"] and "Train" in report["buttons"] and report["figure"] and report["controls"] >= 9
    print(f"{name} (trusted copy): panel rendered from the saved widget state: {report.get('rendered')}, "
          f"buttons {report.get('buttons')}, {report.get('controls')} controls, figure shown: {report.get('figure')}, "
          f"{report.get('disconnected')} widgets marked as without a kernel (as expected before running), "
          f"status: {report.get('status', '')[:100]!r}")
    if not ok:
        return 1
    b = report["box"]
    shot = page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                     clip={"x": b["x"], "y": b["y"], "width": b["width"], "height": b["height"], "scale": 1})["data"]
    if args.shots:
        Path(args.shots).mkdir(parents=True, exist_ok=True)
        (Path(args.shots) / "10_explore_panel.png").write_bytes(base64.b64decode(shot))
    path = NOTEBOOKS / name
    nb = nbformat.read(path, as_version=4)
    (cell,) = [c for c in nb.cells if c.cell_type == "markdown" and f"attachment:{PICTURE}" in c.source]
    cell["attachments"] = {PICTURE: {"image/png": shot}}
    nbformat.write(nb, path)
    print(f"stored the panel's picture ({len(base64.b64decode(shot)) // 1024} KiB) in {path.relative_to(ROOT)}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("only", nargs="*", help="notebook number prefixes (default: all)")
    p.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser") or "chromium")
    p.add_argument("--shots", help="a folder for one screenshot per notebook")
    p.add_argument("--panel-picture", action="store_true",
                   help="check that notebook 10's panel renders from its saved state when trusted, and store its "
                        "screenshot in notebook 10 (the only change this script makes to the repository)")
    p.add_argument("--settle", type=float, default=4.0, help="seconds to wait after the kernel is up, before saving")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds for the server, the browser and each step")
    args = p.parse_args(argv)
    paths = selected(args.only)
    if not paths:
        print(f"no notebook matches {args.only}", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="nb-browser-"))
    work = tmp / "notebooks"
    work.mkdir()
    for q in paths:
        shutil.copy2(q, work / q.name)
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp / "config"), JUPYTER_DATA_DIR=str(tmp / "data"), JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(tmp / "settings"), JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"))
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
        for q in paths:
            t1 = time.perf_counter()
            report = json.loads(page.evaluate(OPEN_AND_SAVE % {"path": json.dumps(q.name),
                                                               "settle_ms": int(1000 * args.settle)}))
            if args.shots:
                Path(args.shots).mkdir(parents=True, exist_ok=True)
                shot = page.call("Page.captureScreenshot", format="png")["data"]
                import base64

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
        if args.panel_picture:
            failures += panel_picture(page, work, env, args)
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
