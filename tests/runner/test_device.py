"""The machine a run trained on: named by model (a CPU) or device kind (a GPU), recorded by the host loop in each
checkpoint and in the run, carried over a resume, and written into every exported member's run.json."""

import dataclasses
import json

import jax

from mx_proxy.experiments import campaign
from mx_proxy.runner import device
from mx_proxy.runner import loop as runner
from mx_proxy.training.config import Config

CPUINFO = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13 64-Core Processor\nflags\t: avx2\n"


def test_a_cpu_is_named_by_its_model_and_a_gpu_by_its_device_kind():
    assert device.cpu_model(CPUINFO) == "AMD EPYC 7B13 64-Core Processor"
    assert device.describe("gpu", "NVIDIA H100 80GB HBM3") == "gpu: NVIDIA H100 80GB HBM3"
    if jax.default_backend() == "cpu":
        assert device.describe() == f"cpu: {device.cpu_model()}" and device.describe() != "cpu: cpu"


def test_a_resumed_run_names_each_machine_once():
    assert device.joined(None, "gpu: H100") == "gpu: H100"
    assert device.joined("gpu: H100", "gpu: H100") == "gpu: H100"
    assert device.joined("cpu: EPYC", "gpu: H100") == "cpu: EPYC, then gpu: H100"
    assert device.joined("cpu: EPYC, then gpu: H100", "gpu: H100") == "cpu: EPYC, then gpu: H100"


def test_runs_checkpoints_and_exports_record_the_machine(tmp_path):
    c = Config(width=8, depth=1, batch=8, steps=4, diagnostics_every=2, val_every=0, checkpoint_every=2)
    run = runner.train(c, store=tmp_path / "store", progress=False)
    assert run.info["device"] == device.describe()
    metas = [json.loads(p.read_text()) for p in (tmp_path / "store").rglob("meta.json")]
    assert metas and all(m["device"] == device.describe() for m in metas)
    meta = json.loads((campaign.export(run, "m", "ensemble", tmp_path / "out") / "run.json").read_text())
    assert meta["device"] == device.describe()
    elsewhere = dataclasses.replace(run, info=dict(run.info, device="gpu: NVIDIA H200"))  # trained elsewhere
    assert json.loads((campaign.export(elsewhere, "g", "ensemble", tmp_path / "out") / "run.json")
                      .read_text())["device"] == "gpu: NVIDIA H200"
