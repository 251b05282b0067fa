"""``mx-proxy bench diagnostics``: it times a diagnostics step with quantization statistics off and on in one run
and prints their ratio; its whole-run estimate is plain arithmetic. No timing is asserted."""

import re

import pytest

from mx_proxy.cli.bench import BENCHMARKS, describe, diagnostics


def test_run_cost_weighs_one_diagnostics_step_per_period():
    assert diagnostics.run_cost(1.0, 2.0, 4.0, 10) == pytest.approx((9 + 4) / (9 + 2))
    assert diagnostics.run_cost(1.0, 2.0, 4.0, 1) == pytest.approx(2.0)


def test_it_prints_the_ratio_of_quant_stats_on_to_off(capsys):
    assert "diagnostics" in BENCHMARKS and "quantization statistics" in describe("diagnostics")
    assert diagnostics.main(["--width", "16", "--depth", "1", "--batch", "16", "--steps", "2", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"mxfp8_e4m3 .*quant stats on / off +\d+\.\d\d; a run with diagnostics every 10: +\d+\.\d\dx", out)
