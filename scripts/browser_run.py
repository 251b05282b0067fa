"""Run notebooks in JupyterLab as a person does, for ``scripts/check_notebooks_in_browser.py --run``.

Each notebook is opened, run with Run → Run All Cells, and checked: every
cell ran without an error, and the figures it shows loaded (at least as many
pictures as the committed notebook has figure outputs). In notebook 10 the
explorer is then used through its widgets: a short training (seed and steps
typed into the panel, Train clicked) must end with the panel's results table
showing it; a long one is stopped with Kernel → Interrupt once its progress
bar moves, and the panel must say what it kept, the kernel must be idle and
answer ``1 + 1``. Everything clicked and seen is printed; screenshots go to
the ``--shots`` folder.
"""

from __future__ import annotations

import base64
import difflib
import json
import time
from pathlib import Path

__all__ = ["run_notebook", "use_explorer", "panel_screenshot"]

# open a notebook, Run All, wait until every cell has run; report what shows
RUN_ALL = """
(async () => {
  const app = window.jupyterapp;
  app.shell.collapseLeft();
  const w = await app.commands.execute('docmanager:open', {path: %(path)s, factory: 'Notebook'});
  await w.context.ready;
  await w.sessionContext.ready;
  const kernel = w.sessionContext.session.kernel;
  await kernel.info;
  window.__nb = w;
  app.shell.activateById(w.id);
  const t0 = Date.now();
  app.commands.execute('notebook:run-all-cells', {semanticWidget: w.id});  // Run → Run All Cells
  const cells = () => Array.from(w.content.widgets).filter(c => c.model.type === 'code');
  while (Date.now() - t0 < %(timeout_ms)d) {
    await new Promise(r => setTimeout(r, 1000));
    const running = cells().some(c => (c.node.querySelector('.jp-InputPrompt') || {}).textContent.includes('*'));
    if (!running && kernel.status === 'idle') break;
  }
  await new Promise(r => setTimeout(r, 1500));
  if (%(save)s) { await w.context.save(); }  // File → Save, as a reader would after running it
  const imgs = Array.from(w.node.querySelectorAll('.jp-OutputArea-output img'));
  return JSON.stringify({
    seconds: (Date.now() - t0) / 1000,
    kernel: kernel.status,
    cells: cells().length,
    unrun: cells().filter(c => !c.model.executionCount).length,
    errors: Array.from(w.node.querySelectorAll(
        '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'))
      .map(o => o.textContent).filter(t => /Error|Traceback/.test(t)).map(t => t.slice(0, 300)),
    images: imgs.length,
    images_loaded: imgs.filter(i => i.complete && i.naturalWidth > 0).length,
    progress_lines: Array.from(w.node.querySelectorAll('.jp-OutputArea-output pre'))
      .map(p => p.textContent).filter(t => / steps \\[/.test(t)).slice(0, 4),
  });
})()
"""

# the explorer panel of the open notebook: type into its fields, click its buttons, read what it shows
PANEL = """
(async () => {
  const w = window.__nb;
  const panel = Array.from(w.node.querySelectorAll('.jupyter-widgets.widget-vbox'))
    .find(p => Array.from(p.querySelectorAll('button')).some(b => b.textContent.trim() === 'Train'));
  if (!panel) return JSON.stringify({found: false});
  const act = %(action)s;
  for (const [label, value] of Object.entries(act.type || {})) {
    const box = Array.from(panel.querySelectorAll('.widget-text')).find(
      t => (t.querySelector('.widget-label') || {}).textContent === label);
    const input = box.querySelector('input');
    input.focus(); input.value = value;
    input.dispatchEvent(new Event('input', {bubbles: true}));
    input.dispatchEvent(new Event('change', {bubbles: true}));
    input.blur();
  }
  if (act.click) {
    await new Promise(r => setTimeout(r, 500));
    Array.from(panel.querySelectorAll('button')).find(b => b.textContent.trim() === act.click).click();
  }
  if (act.interrupt) {  // Kernel → Interrupt Kernel
    await window.jupyterapp.commands.execute('notebook:interrupt-kernel', {semanticWidget: w.id});
  }
  await new Promise(r => setTimeout(r, 300));
  const bar = panel.querySelector('.progress-bar');
  const htmls = Array.from(panel.querySelectorAll('.widget-html-content')).map(h => h.textContent);
  const kernel = w.sessionContext.session.kernel;
  let answer = null;
  if (act.ask) {
    const reply = kernel.requestExecute({code: '1 + 1', store_history: false});
    reply.onIOPub = msg => { if (msg.header.msg_type === 'execute_result') answer = msg.content.data['text/plain']; };
    await reply.done;
    for (let i = 0; i < 20 && kernel.status !== 'idle'; i++) { await new Promise(r => setTimeout(r, 100)); }
  }
  panel.scrollIntoView({block: 'start'});
  await new Promise(r => setTimeout(r, 800));  // the notebook's windowed view settles after a scroll
  const box = panel.getBoundingClientRect();
  return JSON.stringify({
    found: true, kernel: kernel.status, answer,
    buttons: Array.from(panel.querySelectorAll('button')).map(b => [b.textContent.trim(), b.disabled]),
    progress: bar ? bar.style.width || bar.style.height : null,
    status: htmls[0] || '', results: htmls.slice(1).join(' ').slice(0, 600),
    figure: Array.from(panel.querySelectorAll('img')).some(i => i.naturalWidth > 0),
    box: {x: box.x, y: box.y + window.scrollY, width: box.width, height: box.height},
  });
})()
"""


def _shot(page, shots: Path | None, name: str) -> None:
    if shots is None:
        return
    shots.mkdir(parents=True, exist_ok=True)
    (shots / f"{name}.png").write_bytes(base64.b64decode(page.call("Page.captureScreenshot", format="png")["data"]))


def run_notebook(page, name: str, committed_images: int, timeout: float, shots: Path | None,
                 saved: Path | None = None, committed: Path | None = None) -> tuple[bool, dict]:
    """Run All in notebook ``name`` (already in the server's root); (passed, report). With ``saved`` (its
    file in the server's root) and ``committed``: saved after running, and compared with the committed file."""
    r = json.loads(page.evaluate(RUN_ALL % {"path": json.dumps(name), "timeout_ms": int(1000 * timeout),
                                            "save": "true" if saved else "false"}))
    _shot(page, shots, f"{Path(name).stem}_run_all")
    ok = (r["kernel"] == "idle" and not r["unrun"] and not r["errors"] and r["images_loaded"] >= committed_images
          and r["images_loaded"] == r["images"])
    print(f"{name}: clicked Run → Run All Cells; after {r['seconds']:.0f} s the kernel is {r['kernel']}, "
          f"{r['cells'] - r['unrun']} of {r['cells']} code cells ran, {len(r['errors'])} errors, "
          f"{r['images_loaded']} of {r['images']} pictures shown (the committed notebook has {committed_images} "
          f"figures); progress lines seen: {r['progress_lines'] or 'none'}")
    for e in r["errors"]:
        print(f"  error output: {e}")
    if saved is not None and committed is not None:
        before, after = committed.read_text(encoding="utf-8"), saved.read_text(encoding="utf-8")
        changed = [line for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
                   if line[:1] in "+-" and line[:3] not in ("+++", "---")]
        r["changed_on_save"] = len(changed)
        print("  saved after running: "
              f"{'the same file as committed' if not changed else f'{len(changed)} lines differ'}"
              + ("".join(f"\n    {line[:160]}" for line in changed[:12])))
    return ok, r


def _panel(page, **action) -> dict:
    return json.loads(page.evaluate(PANEL % {"action": json.dumps(action)}))


def _until(page, test, timeout: float, **action) -> dict:
    t0 = time.monotonic()
    while True:
        r = _panel(page, **action)
        if test(r) or time.monotonic() - t0 > timeout:
            return r
        time.sleep(1.0)


def use_explorer(page, timeout: float, shots: Path | None) -> bool:
    """Notebook 10, open and run: train briefly with other settings, then interrupt a long training."""
    r = _panel(page, type={"seed": "1", "steps": "300"}, click="Train")
    if not r.get("found"):
        print("notebook 10: no explorer panel rendered")
        return False
    print(f"notebook 10: typed seed 1, steps 300 into the panel and clicked Train; the status reads "
          f"{r['status'][:120]!r}")
    _shot(page, shots, "10_explore_training")
    def trained(r):  # the status line's summary of the runs, Train enabled, the table of the new runs
        return "final loss" in r["status"] and not dict(r["buttons"])["Train"] and "seed 1, 300 steps" in r["results"]

    r = _until(page, trained, timeout)
    short_ok = trained(r) and r["kernel"] == "idle"
    print(f"  then the status reads {r['status'][:160]!r}, "
          f"the panel's results {' '.join(r['results'].split())[:300]!r}… "
          f"(the table followed Train: {short_ok}); buttons (name, disabled) {r['buttons']}")
    _shot(page, shots, "10_explore_trained")
    r = _panel(page, type={"seed": "2", "steps": "1000000"}, click="Train")
    print(f"  typed seed 2, steps 1000000 and clicked Train; the status reads {r['status'][:120]!r}")
    r = _until(page, lambda r: r["progress"] not in (None, "0%", ""), timeout)
    print(f"  the progress bar moved to {r['progress']}; clicked Kernel → Interrupt")
    t0 = time.monotonic()
    _panel(page, interrupt=True)
    r = _until(page, lambda r: r["status"].startswith("stopped"), 60)
    waited = time.monotonic() - t0
    r = _panel(page, ask=True)
    _shot(page, shots, "10_explore_interrupted")
    stop_ok = r["status"].startswith("stopped") and r["kernel"] == "idle" and r["answer"] == "2"
    print(f"  {waited:.1f} s later the status reads {r['status'][:200]!r}; the kernel is {r['kernel']} and "
          f"answers 1 + 1 = {r['answer']}; buttons {r['buttons']}")
    return short_ok and stop_ok


def panel_screenshot(page) -> bytes:
    """A picture of the open notebook's explorer panel as it shows now."""
    _panel(page)  # the panel laid out once before it is measured
    time.sleep(1.0)
    b = _panel(page)["box"]
    shot = page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                     clip={"x": b["x"], "y": b["y"], "width": b["width"], "height": b["height"], "scale": 1})["data"]
    return base64.b64decode(shot)
