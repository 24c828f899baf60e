"""boards.devices and boards.zynq: resource limits declared once, board lookup by name."""

import pytest

from boards.devices import DEVICES, UnknownDeviceError, get_device
from boards.zynq import BOARDS, UnknownBoardError, get_board


def test_xc7z020_limits():
    dev = get_device("xc7z020")
    assert dev.family == "xc7"
    assert dev.limits["LUT"] == 53_200
    assert dev.limits["FF"] == 106_400
    assert dev.limits["BRAM36"] == 140
    assert dev.limits["DSP"] == 220
    assert dev.limits["CARRY4"] == 13_300  # one per slice
    assert dev.limits["LUTRAM"] == 17_400
    assert dev.bram_blocks * 2 == 280  # RAMB18 halves
    assert dev.bram_kib == 630
    assert round(dev.bram_bits / 1e6, 1) == 5.2 and round(dev.bram_bits / 2**20, 1) == 4.9


@pytest.mark.parametrize(
    "die, lut, lutram, ff, bram36, uram, dsp",
    [
        # DS987 (K26 SOM) and Vivado's "Available" column for xck26-sfvc784-2lv-c
        ("xck26", 117_120, 57_600, 234_240, 144, 64, 1_248),
        # DS891 (ZU7EV) and Vivado's "Available" column for xczu7ev-ffvc1156-2-e
        ("xczu7ev", 230_400, 101_760, 460_800, 312, 96, 1_728),
    ],
)
def test_ultrascale_plus_limits(die, lut, lutram, ff, bram36, uram, dsp):
    dev = get_device(die)
    assert dev.family == "xcup"
    want = {"LUT": lut, "LUTRAM": lutram, "FF": ff, "BRAM36": bram36, "URAM": uram, "DSP": dsp}
    assert {k: dev.limits[k] for k in want} == want
    clbs = lut // 8  # UG574: 8 LUT6, 16 FF, 4 MUXF7, 2 MUXF8, 1 MUXF9 per CLB
    assert (dev.limits["MUXF7"], dev.limits["MUXF8"], dev.limits["MUXF9"]) == (4 * clbs, 2 * clbs, clbs)
    assert "CARRY4" not in dev.limits  # Yosys emits CARRY4, the die has CARRY8: reported, not limited
    assert dev.uram_bits == uram * 288 * 1024 and dev.bram_bits == bram36 * 36 * 1024
    assert round(dev.uram_bits / 2**20) == {"xck26": 18, "xczu7ev": 27}[die]  # "18 Mb" / "27 Mb" in the tables


def test_xc7z020_has_no_ultraram():
    assert get_device("xc7z020").uram_bits == 0 and "URAM" not in get_device("xc7z020").limits


def test_ecp5_limits():
    dev = get_device("LFE5U-85F")
    assert dev.family == "ecp5"
    assert dev.limits["LUT4"] == 83_640
    assert dev.limits["EBR"] == 208
    assert dev.limits["MULT18"] == 156
    assert dev.bram_kbit == 18


@pytest.mark.parametrize(
    "part, die",
    [
        ("xc7z020clg484-1", "xc7z020"),
        ("XC7Z020CLG400-1", "xc7z020"),
        ("xc7z020-clg400-1", "xc7z020"),
        ("lfe5u-85f", "LFE5U-85F"),
        ("LFE5U-85F-6BG381C", "LFE5U-85F"),
        ("xck26-sfvc784-2LV-c", "xck26"),
        ("XCZU7EV-FFVC1156-2-E", "xczu7ev"),
        ("xczu7evffvc1156", "xczu7ev"),
    ],
)
def test_device_from_part_string(part, die):
    assert get_device(part).name == die


@pytest.mark.parametrize("name", ["xc7z010", "xc7z0201", "", "LFE5U-45F"])
def test_unknown_device_lists_known(name):
    with pytest.raises(UnknownDeviceError, match="known: xc7z020, xck26, xczu7ev, LFE5U-85F"):
        get_device(name)


def test_device_limits_are_read_only():
    with pytest.raises(TypeError):
        DEVICES["xc7z020"].limits["LUT"] = 1


def test_boards_as_data():
    zed, z1, z2 = get_board("zedboard"), get_board("pynq-z1"), get_board("pynq-z2")
    assert zed.part == "xc7z020clg484-1" and zed.package == "clg484"
    assert z1.part == z2.part == "xc7z020clg400-1" and z2.package == "clg400"
    for board in (zed, z1, z2):
        assert board.device.name == "xc7z020"
        assert board.pl_clock_mhz == 100.0
        assert board.ddr_mib == 512
        assert board.ps7_preset and board.vivado_board_part
        assert board.to_dict()["device"] == "xc7z020"
    # Only the PYNQ boards have official images; the ZedBoard needs one built.
    assert z1.pynq_image and z2.pynq_image
    assert not zed.pynq_image and zed.needs_pynq_image_build
    assert "PYNQ" in zed.host_access and "build" in zed.host_access


@pytest.mark.parametrize("alias, name", [("ZedBoard", "zedboard"), ("PYNQ-Z2", "pynq-z2"), ("pynq_z1", "pynq-z1")])
def test_board_aliases(alias, name):
    assert get_board(alias).name == name


def test_unknown_board_lists_known():
    with pytest.raises(UnknownBoardError, match="'zybo'.*known boards: zedboard, pynq-z1, pynq-z2, zcu104, kv260"):
        get_board("zybo")
    assert set(BOARDS) == {"zedboard", "pynq-z1", "pynq-z2", "zcu104", "kv260"}


def test_ultrascale_plus_boards_as_data():
    """Parts and board parts of XilinxBoardStore's zcu104/1.1 and kv260_som/1.4 board files."""
    zcu, kv = get_board("zcu104"), get_board("KV260")
    assert (zcu.part, zcu.device.name, zcu.package) == ("xczu7ev-ffvc1156-2-e", "xczu7ev", "ffvc1156")
    assert (kv.part, kv.device.name, kv.package) == ("xck26-sfvc784-2LV-c", "xck26", "sfvc784")
    assert zcu.vivado_board_part == "xilinx.com:zcu104:part0:1.1"
    assert kv.vivado_board_part == "xilinx.com:kv260_som:part0:1.4"
    for b in (zcu, kv):
        assert b.family == "zynqmp" and b.to_dict()["family"] == "zynqmp" and b.pynq_image
        assert not b.ps7_config  # without board files only the PL side of the PS is set


def _generate_cli(tmp_path, *extra):
    from host.cli import main
    from tests.rtl_gen.test_system import small_cfg

    cfg = tmp_path / "small.toml"
    cfg.write_text(small_cfg().to_toml())
    return main(["generate", "--config", str(cfg), "--no-synth", "--out", str(tmp_path / "acc"), *extra])


@pytest.mark.parametrize("clock", ["0", "-5", "nan", "inf", "251", "1e300"])
def test_generate_refuses_a_clock_outside_the_ps_range(tmp_path, capsys, clock):
    from host.cli import EXIT_USER_ERROR

    assert _generate_cli(tmp_path, "--board", "pynq-z2", f"--clock-mhz={clock}") == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert "--clock-mhz" in err and "250" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "acc").exists()


def test_generate_refuses_a_board_repo_that_is_no_folder_or_has_no_zynq_board(tmp_path, capsys):
    from host.cli import EXIT_USER_ERROR

    assert _generate_cli(tmp_path, "--board", "kv260", "--board-repo", str(tmp_path / "nope")) == EXIT_USER_ERROR
    assert "--board-repo" in capsys.readouterr().err
    assert _generate_cli(tmp_path, "--board-repo", str(tmp_path)) == EXIT_USER_ERROR
    assert "--board-repo" in capsys.readouterr().err and not (tmp_path / "acc").exists()


def test_generate_clock_sets_fclk0_description_and_throughput(tmp_path):
    """--clock-mhz F: FCLK0 of the Vivado build, accelerator.json's clock_mhz, and report.json's images per second
    (cycles per image, clock and images/s side by side); the failed-timing message's command rebuilds the folder."""
    import json

    from host.cli import EXIT_OK

    assert _generate_cli(tmp_path, "--board", "zcu104", "--clock-mhz", "80") == EXIT_OK
    out = tmp_path / "acc"
    rep = json.loads((out / "report.json").read_text())
    thr = rep["throughput"]
    assert thr["clock_mhz"] == 80.0 and thr["cycles_per_image"] == rep["cycles"]["per_image"]
    assert f"at 80 MHz = {thr['images_per_s']:,.0f} images per second" in (out / "report.txt").read_text()
    assert thr["images_per_s"] == pytest.approx(80e6 / rep["cycles"]["per_image"], rel=1e-3)
    assert json.loads((out / "accelerator.json").read_text())["clock_mhz"] == 80.0
    tcl = (out / "vivado" / "build.tcl").read_text()
    assert "CONFIG.PSU__CRL_APB__PL0_REF_CTRL__FREQMHZ {80}" in tcl and "set xnt_fclk_mhz 80\n" in tcl
    assert f"--config {out / 'config.toml'} --board zcu104 --out {out} --force --no-synth" in tcl
    from host.generate import check_clock_mhz

    assert check_clock_mhz(None) == 100.0  # without --clock-mhz
