"""Command-line behaviour that does not need training: errors and config printing."""

import subprocess
import sys

from host.cli import main


def test_user_errors_are_one_line_with_status_2(capsys):
    assert main(["config", "--model", "mlp", "--set", "train.batch_size=-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train.batch_size = -1" in err[0] and "Traceback" not in err[0]
    assert main(["config", "--config", "does/not/exist.toml"]) == 2
    assert "not found" in capsys.readouterr().err


def test_config_prints_the_resolved_configuration(capsys):
    assert main(["config", "--model", "mlp", "--scheme", "standard", "--optimizer", "bop", "--batch-size", "50"]) == 0
    out = capsys.readouterr().out
    assert 'bn = "l2"' in out and 'name = "bop"' in out and "batch_size = 50" in out


def test_console_script_entry_point_runs():
    r = subprocess.run([sys.executable, "-m", "host.cli", "--help"], capture_output=True, text=True, check=True)
    assert "train" in r.stdout and "memory" in r.stdout
