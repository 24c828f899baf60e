"""What a board runs works in the board's environment (the pynq venv: Python 3.10 where the machine has it, numpy
1.x as pynq pins it): the host modules import, configurations load (tomllib, or tomli on 3.10), the driver loads
the configuration an accelerator.json carries, and the CLI answers."""

import importlib
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.pynq

BOARD_MODULES = ["host.cli", "host.common", "host.board",
                 "host.driver", "host.train_target", "host.energy", "sim.config",
                 "sim.schema", "sim.hw.model", "sim.hw.engine", "sim.train_loop", "rtl_gen.regmap"]


def test_numpy_is_the_board_images_major_version():
    assert int(np.__version__.split(".")[0]) == 1, f"the pynq venv has numpy {np.__version__}; pynq pins numpy<2"


@pytest.mark.parametrize("name", BOARD_MODULES)
def test_board_module_imports(name):
    importlib.import_module(name)


def test_configurations_load_and_the_driver_reads_the_descriptions_configuration(tmp_path):
    from test_pynq_driver import small

    from host.board import check_config
    from host.driver import Driver
    from host.transports.base import BlockingTransport
    from rtl_gen.contract import AcceleratorDescription
    from sim.config import apply_overrides, load_config, tomllib

    assert tomllib.__name__ == ("tomllib" if sys.version_info >= (3, 11) else "tomli")
    cfg, desc = small()
    path = desc.write_json(tmp_path / "accelerator.json")
    drv = Driver(AcceleratorDescription.from_json(path), BlockingTransport(), check=False)
    assert drv.model_config() is not None and drv.model_config().to_toml() == cfg.to_toml()
    check_config(cfg, desc)  # the same configuration: accepted
    with pytest.raises(ValueError, match="hw.lanes_out"):
        check_config(apply_overrides(cfg, ["hw.lanes_out=4"]), desc)
    assert load_config("mlp").train.batch_size == 100


def test_the_cli_answers(capsys):
    from host.cli import EXIT_OK, main

    assert main(["config", "--model", "mlp"]) == EXIT_OK
    assert "[model]" in capsys.readouterr().out


def test_train_on_the_board_as_a_user_who_is_not_root_is_one_line(tmp_path, monkeypatch, capsys):
    """pynq needs root (it raises EnvironmentError("Root permissions required.")): `train --target board` says so,
    with what to do on the image, before pynq touches the overlay."""
    import pynq
    from test_pynq_driver import small

    from host.cli import EXIT_USER_ERROR, main

    cfg, desc = small()
    desc.write_json(tmp_path / "accelerator.json")
    (tmp_path / "small.toml").write_text(cfg.to_toml())
    vivado = tmp_path / "vivado"
    vivado.mkdir()
    for ext in (".bit", ".hwh"):
        (vivado / f"xnortrain{ext}").write_bytes(b"\0")

    def no_overlay(*a, **k):
        raise AssertionError("pynq.Overlay called by a user who is not root")

    monkeypatch.setattr(pynq, "Overlay", no_overlay)
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    rc = main(["train", "--target", "board", "--bitstream", str(vivado / "xnortrain.bit"), "--config",
               str(tmp_path / "small.toml"), "--epochs", "1", "--no-checkpoint", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == EXIT_USER_ERROR, err
    assert err == ["xnortrain: error: --target board: pynq needs root on the board; run `sudo -i`, then `source "
                   "/etc/profile.d/pynq_venv.sh` (the pynq venv) and this command again"]
