"""``--executor`` and ``--slurm-*`` on every command that trains several runs: a bad value is one message naming
it and what is valid, exit status 2, before any work starts (nothing written)."""

import pytest

from mx_proxy.cli.main import main

COMMANDS = {"campaign": ["campaign", "--scale", "smoke", "--quiet"], "sweep": ["sweep", "--steps", "10", "--quiet"],
            "figures": ["figures", "--scale", "smoke", "--only", "gradient_bias", "--quiet"]}
OUT = {"campaign": "--out", "sweep": "--store", "figures": "--store"}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("extra, message", [
    (["--executor", "pbs"], "invalid choice: 'pbs' (choose from 'local', 'slurm')"),
    (["--slurm-partition", "gpu"], "--slurm-partition: Slurm options, which need --executor slurm"),
    (["--executor", "slurm", "--slurm-time", "2h"], "slurm time '2h' is not a Slurm time limit; valid forms:"),
    (["--executor", "slurm", "--slurm-cpus-per-task", "0"], "slurm cpus per task must be an integer >= 1, got 0"),
    (["--executor", "slurm", "--slurm-gpus-per-task", "one"], "argument --slurm-gpus-per-task: invalid int value"),
    (["--executor", "slurm", "--slurm-option", "output=x.log"], "'output' is set by the executor itself"),
])
def test_bad_executor_options_exit_2_before_any_work(command, extra, message, tmp_path, capsys):
    where = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        code = main([*COMMANDS[command], OUT[command], str(where), *extra])
        raise SystemExit(code)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not where.exists()


@pytest.mark.parametrize("argv", [COMMANDS["campaign"] + ["--out", "OUT", "--no-store"],
                                  COMMANDS["sweep"] + ["--store", "off"], COMMANDS["figures"] + ["--store", "off"]])
def test_slurm_needs_a_run_store(argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        code = main([a.replace("OUT", str(tmp_path / "out")) for a in argv] + ["--executor", "slurm"])
        raise SystemExit(code)
    assert exc.value.code == 2
    assert "--executor slurm trains into the run store" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_slurm_needs_sbatch_on_this_machine(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch, no sacct
    with pytest.raises(SystemExit) as exc:
        main(["campaign", "--scale", "smoke", "--out", str(tmp_path / "out"), "--executor", "slurm"])
    assert exc.value.code == 2
    assert "--executor slurm needs Slurm's sbatch and sacct on the PATH" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
