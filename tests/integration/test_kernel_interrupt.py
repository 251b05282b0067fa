"""Kernel → Interrupt, as JupyterLab sends it (SIGINT to the kernel's process group), in a real Jupyter kernel:
training stops at the end of its segment, keeps its checkpoint, says so in one line, and the kernel answers the
next cell. Once for ``mxp.train`` running in a cell, once for the explorer's Train button (its training runs in
a thread of its own while the kernel is idle)."""

import json
import queue
import time

import pytest
from jupyter_client.manager import start_new_kernel

# the suite's cheapest program, far too many steps to finish: segments of 100 steps
SETUP = """
import glob, json
import mx_proxy as mxp
CHEAP = dict(width=8, depth=1, batch=16, diagnostics_every=0, val_every=0)
STORE = {store!r}
"""
TRAIN = "run = mxp.train(mxp.Config(steps=10 ** 7, **CHEAP), store=STORE)"
PANEL = """
panel = mxp.explore(store=STORE, recipe=(), steps=2 * 10 ** 7, **CHEAP)
panel.button.click()  # what pressing Train does
"""


@pytest.fixture
def kernel(tmp_path, monkeypatch):
    monkeypatch.delenv("MPLBACKEND", raising=False)
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    try:
        yield km, kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _run(kc, code: str, timeout: float = 120.0) -> dict:
    """Execute ``code``; (reply content, stdout text, text/plain results)."""
    out, results = [], []

    def hook(msg):
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "execute_result":
            results.append(msg["content"]["data"]["text/plain"])

    reply = kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    return {"reply": reply["content"], "stdout": "".join(out), "results": results}


def _probe(kc, expression: str):
    r = _run(kc, f"print(json.dumps({expression}))")
    assert r["reply"]["status"] == "ok", r["reply"]
    return json.loads(r["stdout"])


def test_interrupt_stops_training_in_a_cell_and_the_explorers_train_and_the_kernel_answers(kernel, tmp_path):
    km, kc = kernel
    assert _run(kc, SETUP.format(store=str(tmp_path / "runs")))["reply"]["status"] == "ok"

    # 1. mxp.train in a cell: interrupt once its progress line shows a trained segment
    msg_id = kc.execute(TRAIN)
    t0 = time.monotonic()
    while True:
        assert time.monotonic() - t0 < 180, "the run never showed progress"
        try:
            msg = kc.get_iopub_msg(timeout=1)
        except queue.Empty:
            continue
        text = msg["content"].get("data", {}).get("text/plain", "")
        if msg["parent_header"].get("msg_id") == msg_id and text.startswith("fp32: ") and not text.startswith(
                "fp32: 0/"):
            break
    km.interrupt_kernel()
    t_int = time.monotonic()
    while True:
        reply = kc.get_shell_msg(timeout=60)
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    assert time.monotonic() - t_int < 30  # one segment of 100 cheap steps, not the 10 million
    content = reply["content"]
    assert content["status"] == "error" and content["ename"] == "Interrupted", content
    (line,) = content["traceback"]  # one line, no traceback
    assert line.startswith("Interrupted: fp32 stopped at step ") and "checkpointed in" in line, line
    assert _run(kc, "1 + 1")["results"] == ["2"]  # the kernel answers the next cell
    assert _probe(kc, "[len(glob.glob(STORE + '/*.partial-*/checkpoints/*'))]") == [1]

    # 2. the explorer's Train button: its thread trains while the kernel is idle; Kernel → Interrupt stops it
    assert _run(kc, PANEL)["reply"]["status"] == "ok"
    t0 = time.monotonic()
    while not _probe(kc, "len(panel.updates)"):
        assert time.monotonic() - t0 < 180, "the panel never trained a segment"
        time.sleep(0.2)
    km.interrupt_kernel()
    time.sleep(0.5)
    assert _run(kc, "1 + 1")["results"] == ["2"]
    done, status, value, total, runs = _probe(
        kc, "[panel.wait(60), panel.status.value, panel.progress.value, panel.progress.max, len(panel.runs)]")
    assert done and status.startswith("stopped: fp32 stopped at step ") and "checkpointed in" in status, status
    assert 0 < value < total and runs == 0
    assert _run(kc, "1 + 1")["results"] == ["2"]
