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
    with pytest.raises(UnknownBoardError, match="'zybo'.*known boards: zedboard, pynq-z1, pynq-z2"):
        get_board("zybo")
    assert set(BOARDS) == {"zedboard", "pynq-z1", "pynq-z2"}
