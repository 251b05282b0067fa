"""The Mosaic GPU probe without a GPU: it lowers for CUDA to one Mosaic GPU custom call holding a wgmma, and where
it cannot run (here: the CPU backend) it reports what failed and where, instead of raising."""

import re

import jax
import pytest

from mx_proxy.pallas import mosaic_probe


def test_the_probe_lowers_for_cuda_to_one_mosaic_gpu_call_with_a_wgmma():
    text = mosaic_probe.lower_probe()
    calls = re.findall(r"stablehlo.custom_call @(\w+)", text)
    assert len(calls) == 1 and calls[0].startswith("mosaic_gpu"), calls
    assert "wgmma" in text


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="on a GPU the probe runs (tests/pallas/test_kernels_gpu.py)")
def test_a_probe_that_cannot_run_says_what_failed_and_where():
    ok, message = mosaic_probe.run_probe()
    assert not ok
    assert message.startswith("Mosaic GPU FP8 wgmma did not compile/run: ValueError: ")
    assert re.search(r"\(at \w+\.py:\d+ ", message), message  # the frames a bare assertion would be known by
