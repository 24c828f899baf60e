"""Command-line behaviour that does not need training: errors and config printing."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

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


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def test_exit_codes_are_the_shared_scheme_and_documented():
    import host.cli as cli
    import host.common as common

    assert (common.EXIT_OK, common.EXIT_INTERNAL, common.EXIT_USER_ERROR, common.EXIT_DOES_NOT_FIT,
            common.EXIT_MISMATCH, common.EXIT_TOOL, common.EXIT_INTERRUPTED) == (0, 1, 2, 3, 4, 5, 130)
    text = cli.make_parser().format_help()
    for code, _ in common.EXIT_CODES:
        assert f"\n  {code} " in text, text
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for code, _ in cli.EXIT_CODES:
        assert f"| {code} |" in readme


def test_version_comes_from_the_package_metadata(capsys):
    import importlib.metadata

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"xnortrain {importlib.metadata.version('xnortrain')}"


@pytest.fixture
def paths(tmp_path):
    (tmp_path / "folder").mkdir()
    (tmp_path / "file.json").write_text("{}")
    (tmp_path / "latin1.toml").write_bytes('name = "caf\xe9"\n'.encode("latin-1"))
    (tmp_path / "listed.toml").write_text('preset = ["mlp"]\n')
    return tmp_path


@pytest.mark.parametrize("argv, words", [
    (["config", "--config", "{t}/folder"], ["{t}/folder", "is a folder"]),
    (["config", "--config", "{t}/file.json/x.toml"], ["{t}/file.json/x.toml"]),
    (["config", "--config", "{t}/latin1.toml"], ["{t}/latin1.toml", "UTF-8"]),
    (["config", "--config", "{t}/listed.toml"], ["{t}/listed.toml", "preset = ['mlp']"]),
    (["memory", "--json", "{t}/folder"], ["--json {t}/folder", "is a folder"]),
    (["energy", "--json", "{t}/folder"], ["--json {t}/folder", "is a folder"]),
    (["memory", "--json", "{t}/file.json/x.json"], ["{t}/file.json is a file"]),
    (["energy", "--json", "{t}/file.json/sub/x.json"], ["{t}/file.json is a file"]),
    (["generate", "--no-synth", "--out", "{t}/file.json"], ["--out {t}/file.json", "is a file"]),
    (["generate", "--no-synth", "--out", "{t}/file.json/acc"], ["{t}/file.json is a file"]),
    (["config", "--set", "approx=0"], ["approx is a section"]),
    (["config", "--set", "hw=[1]"], ["hw is a section"]),
    (["config", "--set", "train.epochs={a=1}"], ["train.epochs"]),
    (["config", "--set", "optimizer.lr=1e300"], ["optimizer.lr", "10.0"]),
    (["config", "--set", "optimizer.lr=1e-300"], ["optimizer.lr", "2**-63"]),
    (["config", "--set", "hw.lanes_in=3"], ["hw.lanes_in = 3"]),
])
def test_wrong_inputs_are_one_line_errors_with_status_2(paths, capsys, argv, words):
    argv = [a.replace("{t}", str(paths)) for a in argv]
    assert main(argv) == 2
    line = _one_error_line(capsys)
    for w in words:
        assert w.replace("{t}", str(paths)) in line, line
    assert sorted(p.name for p in paths.iterdir()) == ["file.json", "folder", "latin1.toml", "listed.toml"]


def test_generate_refuses_a_non_empty_folder_and_creates_nothing_when_refused(tmp_path, capsys):
    built = tmp_path / "built"
    built.mkdir()
    (built / "accelerator.json").write_text('{"bitstream": "mine"}')
    assert main(["generate", "--no-synth", "--out", str(built)]) == 2
    line = _one_error_line(capsys)
    assert "not empty (accelerator.json)" in line and "--force" in line
    assert (built / "accelerator.json").read_text() == '{"bitstream": "mine"}'
    # --force passes the folder check; a configuration the generator refuses still writes nothing
    assert main(["generate", "--no-synth", "--force", "--out", str(built), "--set", "hw.input=int8"]) == 2
    assert "hw.input = 'int8'" in _one_error_line(capsys)
    assert [p.name for p in built.iterdir()] == ["accelerator.json"]
    for over in (["--set", "hw.input=int8"], ["--set", "hw.lanes_in=3"], ["--set", "model.layers=[{type='conv'}]"]):
        out = tmp_path / "new" / "acc"
        assert main(["generate", "--no-synth", "--out", str(out), *over]) == 2
        _one_error_line(capsys)
        assert not (tmp_path / "new").exists()


def test_generate_refuses_a_design_over_the_memory_budget_before_elaborating(tmp_path, capsys):
    """784-2048-2048-10 with iir: 5.8 M weights x 19 bits of weight and state, far over the xc7z020's block RAM
    (and its LUTRAM): exit 3 at once, saying by how much, with no output folder."""
    import time

    out = tmp_path / "big"
    t0 = time.monotonic()
    code = main(["generate", "--no-synth", "--out", str(out), "--set", "hw.optimizer=iir",
                 "--set", 'model.layers=[{type="dense",units=2048},{type="dense",units=2048},{type="dense",units=10}]'])
    assert code == 3
    line = _one_error_line(capsys)
    assert "xc7z020" in line and "over by 12,733.6 KiB" in line and "5,820,416 weights x 19 bits" in line, line
    assert time.monotonic() - t0 < 10 and not out.exists()


def test_generate_and_verify_exit_with_the_does_not_fit_and_mismatch_codes(monkeypatch, tmp_path):
    import host.generate as g
    import host.verify as v

    monkeypatch.setattr(g, "generate", lambda *a, **k: {"fits": False})
    assert main(["generate", "--out", str(tmp_path / "a")]) == 3
    monkeypatch.setattr(g, "generate", lambda *a, **k: {"fits": True})
    assert main(["generate", "--out", str(tmp_path / "a")]) == 0
    monkeypatch.setattr(v, "verify", lambda *a, **k: v.VerifyResult(ok=False, message="first mismatch"))
    assert main(["verify", "--steps", "1"]) == 4
    monkeypatch.setattr(v, "verify", lambda *a, **k: v.VerifyResult(ok=True))
    assert main(["verify", "--steps", "1"]) == 0


def test_os_errors_on_named_files_are_status_2_and_bugs_keep_their_traceback(monkeypatch, capsys):
    import host.cli as cli

    def raising(exc):
        def run(args):
            raise exc
        return run

    for exc, words in ((IsADirectoryError(21, "Is a directory", "/some/dir"), "/some/dir: is a folder"),
                       (NotADirectoryError(20, "Not a directory", "/a/file/x"), "/a/file/x: a part of the path"),
                       (PermissionError(13, "Permission denied", "/root/x"), "/root/x: permission denied"),
                       (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), "not UTF-8")):
        monkeypatch.setattr(cli, "cmd_config", raising(exc))
        assert main(["config"]) == 2
        assert words in _one_error_line(capsys)
    monkeypatch.setattr(cli, "cmd_config", raising(KeyError("a bug")))
    assert main(["config"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "KeyError" in err and "internal error" in err
    monkeypatch.setattr(cli, "cmd_config", raising(OSError(28, "No space left on device")))
    assert main(["config"]) == 1


def test_a_failing_tool_is_status_5_with_its_log_and_no_traceback(monkeypatch, capsys):
    """Yosys crashing on a part (seen: an assertion in ABC9's reintegration on a 64 x 64-lane dW array), nextpnr
    failing, the simulator's build failing: the tool's message and log, status 5, not 'a bug'."""
    import boards.ecp5
    import host.cli as cli
    import host.simboard
    import rtl_gen.synth

    for exc in (rtl_gen.synth.SynthError("yosys synth_xilinx of xnt_part_1 failed (exit 1); log: /b/yosys.log\n"
                                         "ERROR: Assert `GetSize(conn.first) == GetSize(conn.second)' failed"),
                boards.ecp5.Ecp5Error("nextpnr-ecp5 failed; log: /b/nextpnr.log"),
                host.simboard.SimBoardBuildError("verilator failed; log: /b/build.log")):
        monkeypatch.setattr(cli, "cmd_config", lambda args, exc=exc: (_ for _ in ()).throw(exc))
        assert main(["config"]) == 5
        err = capsys.readouterr().err
        assert err.startswith(f"xnortrain: error: {str(exc).splitlines()[0]}") and "Traceback" not in err, err
        assert "/b/" in err and "internal error" not in err


def test_verify_checks_its_data_path_before_elaborating(tmp_path, capsys):
    import numpy as np

    (tmp_path / "folder.npz").mkdir()
    (tmp_path / "data.txt").write_text("x")
    (tmp_path / "garbage.npz").write_text("not a zip")
    np.savez(tmp_path / "only_x.npz", x=np.zeros(3))
    for name, words in (("folder.npz", "is a folder"), ("missing.npz", "no such .npz file"),
                        ("data.txt", "is a file"), ("nowhere", "no such folder"),
                        ("garbage.npz", "not a readable .npz"), ("only_x.npz", "the .npz has no array 'y'")):
        assert main(["verify", "--steps", "1", "--data", str(tmp_path / name)]) == 2
        line = _one_error_line(capsys)
        assert f"--data {tmp_path / name}: {words}" in line, line


def test_version_falls_back_to_pyproject_when_not_installed(monkeypatch):
    import importlib.metadata
    import tomllib

    import host.cli as cli

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    root = Path(__file__).resolve().parents[2]
    assert cli.package_version() == tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]


@pytest.mark.parametrize("field", ["div_steps", "mul_steps"])
def test_generate_refuses_unit_bounded_fields_before_elaborating_and_creates_nothing(tmp_path, capsys, field):
    """div_steps / mul_steps are bounded by the widths the units derive from the whole configuration (quotient
    and multiplier bits): refused by the plan before any elaboration, naming the hw field and the limit, with no
    folder."""
    out = tmp_path / "acc"
    small = ['model.layers=[{type="dense",units=8},{type="dense",units=10}]', "train.batch_size=2",
             "hw.lanes_in=32", "hw.lanes_out=8", "hw.update_lanes=8", f"hw.{field}=64"]
    assert main(["generate", "--no-synth", "--out", str(out), *[a for s in small for a in ("--set", s)]]) == 2
    line = _one_error_line(capsys)
    assert f"hw.{field} = 64: " in line and re.search(rf"set hw\.{field} <= \d+$", line), line
    assert not out.exists()


def test_generate_refuses_an_out_folder_it_cannot_write_before_elaborating(tmp_path, capsys, monkeypatch):
    import os

    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **k: False if Path(p) == locked else real(p, mode, **k))
    assert main(["generate", "--no-synth", "--out", str(locked / "acc")]) == 2
    assert f"--out {locked / 'acc'}: folder {locked} is not writable" in _one_error_line(capsys)


def test_verify_checks_its_data_before_building(tmp_path, capsys, monkeypatch):
    import numpy as np

    import host.verify as v

    monkeypatch.setattr(v, "verify", lambda *a, **k: pytest.fail("verify ran on bad data"))
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (150, 1, 28, 28), dtype=np.uint8)
    y = rng.integers(0, 10, 150)
    cases = {
        "float.npz": (dict(x=x.astype(np.float32) / 255, y=y), "x holds float32 values"),
        "neg.npz": (dict(x=x, y=np.where(y == 3, -1, y)), "label -1 in y is outside 0..9"),
        "big.npz": (dict(x=x, y=np.where(y == 3, 10, y)), "label 10 in y is outside 0..9"),
        "onehot.npz": (dict(x=x, y=np.eye(10, dtype=np.int64)[y]), "one-hot?"),
        "cifar.npz": (dict(x=rng.integers(0, 256, (150, 3, 32, 32), dtype=np.uint8), y=y), "x has shape [150, 3, 32"),
        "flat.npz": (dict(x=x.reshape(150, -1), y=y), "x has shape [150, 784]"),
        "fewer.npz": (dict(x=x, y=y[:120]), "150 images in x but 120 labels in y"),
        "few.npz": (dict(x=x[:50], y=y[:50]), "50 training images; 1 steps of 100 need 100"),
        "floaty.npz": (dict(x=x, y=y.astype(float)), "y holds float64 values"),
    }
    for name, (arrays, _) in cases.items():
        np.savez(tmp_path / name, **arrays)
    np.savez(tmp_path / "object.npz", x=np.array([x[0], "a"], dtype=object), y=y)
    cases["object.npz"] = (None, "cannot read x and y")
    for name, (_, msg) in cases.items():
        assert main(["verify", "--steps", "1", "--data", str(tmp_path / name)]) == 2, name
        line = _one_error_line(capsys)
        assert f"--data {tmp_path / name}: " in line and msg in line, (name, line)
