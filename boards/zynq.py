"""Zynq boards the generated accelerators target: the Zynq-7020 ZedBoard, PYNQ-Z1 and PYNQ-Z2, and the Zynq
UltraScale+ ZCU104 (xczu7ev) and KV260 (the K26 SOM, xck26).

Plain data, looked up by name with :func:`get_board`. The accelerator sits in the programmable logic
behind the PS7's AXI ports and is clocked by ``FCLK_CLK0``; nothing here depends on Vivado being
installed (there is none in the development environment), the fields are what a Vivado block-design
script or the host transport needs.

How the host reaches a board: PYNQ-Z1 and PYNQ-Z2 have official PYNQ SD-card images (pynq.io), so the
``pynq`` package loads the bitstream and maps the AXI-Lite registers and DMA buffers directly. The
ZedBoard has no official PYNQ image: it needs a PYNQ image built for it with PYNQ's ``sdbuild`` flow
(PetaLinux and Vivado on a Linux host, plus a board spec and base design), or a bare-metal/PetaLinux
host of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from boards.devices import Device, get_device

__all__ = ["BOARDS", "UnknownBoardError", "ZynqBoard", "get_board"]


class UnknownBoardError(ValueError):
    """A board name that is not in :data:`BOARDS`."""


@dataclass(frozen=True)
class ZynqBoard:
    """One Zynq board: part, clocks, PS configuration source, DDR and host access."""

    name: str
    """Lookup key, lower case (``zedboard``, ``pynq-z1``, ``pynq-z2``)."""
    title: str
    maker: str
    part: str
    """Vivado part string (die, package, speed grade)."""
    vivado_board_part: str
    """Vivado board-file identifier (the board file must be installed in Vivado's board store)."""
    ps7_preset: str
    """Where the PS7 (DDR, MIO, clocks) configuration comes from."""
    ps_clk_mhz: float
    """Oscillator on the PS_CLK pin."""
    ddr_mib: int
    ddr_bus_bits: int
    pynq_image: bool
    """True if an official PYNQ SD-card image exists for the board."""
    host_access: str
    family: str = "zynq7"
    """``zynq7`` (the PS7, ``processing_system7``) or ``zynqmp`` (Zynq UltraScale+, ``zynq_ultra_ps_e``)."""
    board_part_patterns: tuple[str, ...] = ()
    """Further board-file names probed when :attr:`vivado_board_part` is not installed (``get_board_parts``
    patterns, the newest match used): older board stores name some boards differently."""
    ps_builtin_preset: str | None = None
    """Without board files: the PS IP's own preset (``CONFIG.preset``) instead of :attr:`ps7_config`."""
    pl_clock_mhz: float = 100.0
    """Default ``FCLK_CLK0`` frequency for the accelerator (the PS7 presets' default)."""
    aliases: tuple[str, ...] = ()
    notes: Mapping[str, str] = field(default_factory=dict)
    ps7_config: Mapping[str, str] = field(default_factory=dict)
    """Explicit ``processing_system7`` settings (``PCW_*`` name -> value) for a Vivado without the board's
    board files: PS_CLK, MIO bank voltages, the DDR part and width, and the PS peripherals the board's boot
    image uses (UART, SD, Ethernet, USB, QSPI) on the board's MIO pins. DDR training delays stay at Vivado's
    defaults where the board file gives none: a PYNQ image's boot loader configures the DDR, the overlay's bitstream
    only sets the PL side. Empty for the Zynq UltraScale+ boards: without board files their build sets only the PL
    side of the PS (clock, ports, interrupt), for the same reason."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "notes", MappingProxyType(dict(self.notes)))
        object.__setattr__(self, "ps7_config", MappingProxyType(dict(self.ps7_config)))
        get_device(self.part)  # every board's part must be a declared device

    @property
    def device(self) -> Device:
        return get_device(self.part)

    @property
    def package(self) -> str:
        """Package code inside :attr:`part` (``clg484``)."""
        rest = self.part.lower().removeprefix(self.device.name).lstrip("-")  # xczu7ev-ffvc1156-2-e
        return rest.split("-")[0]

    @property
    def needs_pynq_image_build(self) -> bool:
        return not self.pynq_image

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "title": self.title,
            "maker": self.maker,
            "part": self.part,
            "device": self.device.name,
            "package": self.package,
            "vivado_board_part": self.vivado_board_part,
            "family": self.family,
            "board_part_patterns": list(self.board_part_patterns),
            "ps_builtin_preset": self.ps_builtin_preset,
            "ps7_preset": self.ps7_preset,
            "ps_clk_mhz": self.ps_clk_mhz,
            "pl_clock_mhz": self.pl_clock_mhz,
            "ddr_mib": self.ddr_mib,
            "ddr_bus_bits": self.ddr_bus_bits,
            "pynq_image": self.pynq_image,
            "host_access": self.host_access,
            "ps7_config": dict(self.ps7_config),
        }


# PS-side settings the three boards share: MIO bank 0 at 3.3 V and bank 1 at 1.8 V, a quad-SPI flash on one
# chip select, Gigabit Ethernet on MIO 16-27 with MDIO on MIO 52-53.
_ZYNQ_BOARD_PS7 = {
    "PCW_PRESET_BANK0_VOLTAGE": "LVCMOS 3.3V",
    "PCW_PRESET_BANK1_VOLTAGE": "LVCMOS 1.8V",
    "PCW_QSPI_PERIPHERAL_ENABLE": "1",
    "PCW_QSPI_GRP_SINGLE_SS_ENABLE": "1",
    "PCW_ENET0_PERIPHERAL_ENABLE": "1",
    "PCW_ENET0_ENET0_IO": "MIO 16 .. 27",
    "PCW_ENET0_GRP_MDIO_ENABLE": "1",
    "PCW_ENET0_GRP_MDIO_IO": "MIO 52 .. 53",
}

# PS-side settings of the PYNQ-Z1 and PYNQ-Z2 (same PS wiring: 50 MHz PS_CLK, a 16-bit DDR3
# MT41K256M16, UART0 on MIO 14-15, SD0 with card detect on MIO 47, Ethernet on MIO 16-27 with MDIO on 52-53,
# USB0 with its PHY reset on MIO 46); from the boards' schematics and PYNQ's base designs.
_PYNQ_PS7 = {
    **_ZYNQ_BOARD_PS7,
    "PCW_CRYSTAL_PERIPHERAL_FREQMHZ": "50",
    "PCW_APU_PERIPHERAL_FREQMHZ": "650",
    "PCW_UIPARAM_DDR_PARTNO": "MT41K256M16 RE-125",
    "PCW_UIPARAM_DDR_BUS_WIDTH": "16 Bit",
    "PCW_UIPARAM_DDR_FREQ_MHZ": "525",
    "PCW_SD0_PERIPHERAL_ENABLE": "1",
    "PCW_SD0_GRP_CD_ENABLE": "1",
    "PCW_SD0_GRP_CD_IO": "MIO 47",
    "PCW_UART0_PERIPHERAL_ENABLE": "1",
    "PCW_UART0_UART0_IO": "MIO 14 .. 15",
    "PCW_USB0_PERIPHERAL_ENABLE": "1",
    "PCW_USB0_RESET_ENABLE": "1",
    "PCW_USB0_RESET_IO": "MIO 46",
}


ZEDBOARD = ZynqBoard(
    name="zedboard",
    title="ZedBoard",
    maker="Avnet/Digilent",
    part="xc7z020clg484-1",
    vivado_board_part="avnet.com:zedboard:part0:1.4",
    # older board stores (and scripts written for them) call it em.avnet.com:zed:part0:1.x
    board_part_patterns=("em.avnet.com:zed:part0:*",),
    ps7_preset="ZedBoard (built-in PS7 preset; also applied by the board file's block automation)",
    # without board files: the PS7 IP's own ZedBoard preset (DDR, MIO, clocks), not the values below
    ps_builtin_preset="ZedBoard",
    ps_clk_mhz=33.333,
    ddr_mib=512,
    ddr_bus_bits=32,
    pynq_image=False,
    host_access=(
        "no official PYNQ image: build one with PYNQ sdbuild (Vivado + PetaLinux, a ZedBoard board spec and "
        "base design), then use the pynq package on the board; otherwise a PetaLinux/bare-metal host"
    ),
    aliases=("zed", "zedboard-z7020"),
    # ZedBoard hardware user guide: 33.333 MHz PS_CLK, 32-bit DDR3 (two MT41J128M16 HA-15E), UART1 on MIO
    # 48-49, SD0 on MIO 40-45 (card detect 47, write protect 46), Ethernet MIO 16-27, USB0 MIO 28-39.
    ps7_config={
        **_ZYNQ_BOARD_PS7,
        "PCW_CRYSTAL_PERIPHERAL_FREQMHZ": "33.333333",
        "PCW_APU_PERIPHERAL_FREQMHZ": "666.666667",
        "PCW_UIPARAM_DDR_PARTNO": "MT41J128M16 HA-15E",
        "PCW_UIPARAM_DDR_BUS_WIDTH": "32 Bit",
        "PCW_UIPARAM_DDR_FREQ_MHZ": "533.333333",
        "PCW_SD0_PERIPHERAL_ENABLE": "1",
        "PCW_SD0_SD0_IO": "MIO 40 .. 45",
        "PCW_SD0_GRP_CD_ENABLE": "1",
        "PCW_SD0_GRP_CD_IO": "MIO 47",
        "PCW_SD0_GRP_WP_ENABLE": "1",
        "PCW_SD0_GRP_WP_IO": "MIO 46",
        "PCW_UART1_PERIPHERAL_ENABLE": "1",
        "PCW_UART1_UART1_IO": "MIO 48 .. 49",
        "PCW_USB0_PERIPHERAL_ENABLE": "1",
        "PCW_USB0_USB0_IO": "MIO 28 .. 39",
    },
)

# PYNQ-Z2 without board files: TUL's own board file for it (XilinxBoardStore boards/TUL/pynq-z2/A.0/preset.xml):
# a 16-bit DDR3 MT41J256M16 RE-125 (4 Gbit, DDR3_1066F, CL 7 / CWL 6, the timings and board delays below), the
# QSPI feedback clock on MIO 8, Ethernet 0's PHY reset on MIO 9 (shared with USB0's on MIO 46), USB0 on MIO 28-39.
_PYNQ_Z2_PS7 = {
    **_PYNQ_PS7,
    "PCW_UIPARAM_DDR_PARTNO": "MT41J256M16 RE-125",
    "PCW_UIPARAM_DDR_MEMORY_TYPE": "DDR 3",
    "PCW_UIPARAM_DDR_DRAM_WIDTH": "16 Bits",
    "PCW_UIPARAM_DDR_DEVICE_CAPACITY": "4096 MBits",
    "PCW_UIPARAM_DDR_SPEED_BIN": "DDR3_1066F",
    "PCW_UIPARAM_DDR_BANK_ADDR_COUNT": "3",
    "PCW_UIPARAM_DDR_ROW_ADDR_COUNT": "15",
    "PCW_UIPARAM_DDR_COL_ADDR_COUNT": "10",
    "PCW_UIPARAM_DDR_CL": "7",
    "PCW_UIPARAM_DDR_CWL": "6",
    "PCW_UIPARAM_DDR_T_RCD": "13.125",
    "PCW_UIPARAM_DDR_T_RP": "13.125",
    "PCW_UIPARAM_DDR_T_RC": "50.625",
    "PCW_UIPARAM_DDR_T_RAS_MIN": "35.0",
    "PCW_UIPARAM_DDR_T_FAW": "40.0",
    "PCW_UIPARAM_DDR_AL": "0",
    "PCW_UIPARAM_DDR_DQS_TO_CLK_DELAY_0": "-0.051",
    "PCW_UIPARAM_DDR_DQS_TO_CLK_DELAY_1": "-0.006",
    "PCW_UIPARAM_DDR_DQS_TO_CLK_DELAY_2": "-0.009",
    "PCW_UIPARAM_DDR_DQS_TO_CLK_DELAY_3": "-0.033",
    "PCW_UIPARAM_DDR_BOARD_DELAY0": "0.279",
    "PCW_UIPARAM_DDR_BOARD_DELAY1": "0.260",
    "PCW_UIPARAM_DDR_BOARD_DELAY2": "0.085",
    "PCW_UIPARAM_DDR_BOARD_DELAY3": "0.092",
    "PCW_UIPARAM_DDR_TRAIN_WRITE_LEVEL": "1",
    "PCW_UIPARAM_DDR_TRAIN_READ_GATE": "1",
    "PCW_UIPARAM_DDR_TRAIN_DATA_EYE": "1",
    "PCW_QSPI_GRP_FBCLK_ENABLE": "1",
    "PCW_QSPI_GRP_FBCLK_IO": "MIO 8",
    "PCW_ENET_RESET_ENABLE": "1",
    "PCW_ENET_RESET_SELECT": "Share reset pin",
    "PCW_ENET0_RESET_ENABLE": "1",
    "PCW_ENET0_RESET_IO": "MIO 9",
    "PCW_USB0_USB0_IO": "MIO 28 .. 39",
}


PYNQ_Z1 = ZynqBoard(
    name="pynq-z1",
    title="PYNQ-Z1",
    maker="Digilent",
    part="xc7z020clg400-1",
    vivado_board_part="www.digilentinc.com:pynq-z1:part0:1.0",
    ps7_preset="pynq_revC.tcl (Digilent PYNQ-Z1 PS7 preset; Presets > Apply Configuration)",
    ps_clk_mhz=50.0,
    ddr_mib=512,
    ddr_bus_bits=16,
    pynq_image=True,
    host_access="official PYNQ SD-card image; the pynq package on the board loads the overlay",
    aliases=("pynqz1", "pynq_z1", "z1"),
    ps7_config=_PYNQ_PS7,
)

PYNQ_Z2 = ZynqBoard(
    name="pynq-z2",
    title="PYNQ-Z2",
    maker="TUL",
    part="xc7z020clg400-1",
    vivado_board_part="tul.com.tw:pynq-z2:part0:1.0",
    ps7_preset="board preset of tul.com.tw:pynq-z2:part0:1.0 (block automation with apply_board_preset)",
    ps_clk_mhz=50.0,
    ddr_mib=512,
    ddr_bus_bits=16,
    pynq_image=True,
    host_access="official PYNQ SD-card image; the pynq package on the board loads the overlay",
    aliases=("pynqz2", "pynq_z2", "z2"),
    ps7_config=_PYNQ_Z2_PS7,
)

# Zynq UltraScale+ (zynq_ultra_ps_e): the PL clock 0, HPM0_FPD to the AXI4-Lite slaves, HP0_FPD for the DMA.
# Board part and part: XilinxBoardStore boards/Xilinx/zcu104/1.1/board.xml (xczu7ev-ffvc1156-2-e) and
# boards/Xilinx/kv260_som/1.4 (the KV260's K26 SOM, xck26-sfvc784-2LV-c).
def _zynqmp_board(name: str, title: str, part: str, board_part: str, ddr_mib: int, host_access: str,
                  aliases: tuple[str, ...]) -> ZynqBoard:
    """A Zynq UltraScale+ board: 33.333 MHz PS reference clock, 64-bit DDR4, a PYNQ image, any version of its
    board files probed."""
    return ZynqBoard(name=name, title=title, maker="AMD/Xilinx", part=part, vivado_board_part=board_part,
                     family="zynqmp", board_part_patterns=(board_part.rsplit(":", 1)[0] + ":*",),
                     ps7_preset=f"board preset of {board_part} (block automation with apply_board_preset)",
                     ps_clk_mhz=33.333, ddr_mib=ddr_mib, ddr_bus_bits=64, pynq_image=True, host_access=host_access,
                     aliases=aliases)


ZCU104 = _zynqmp_board("zcu104", "ZCU104", "xczu7ev-ffvc1156-2-e", "xilinx.com:zcu104:part0:1.1", 2048,
                       "official PYNQ image for the ZCU104; PMBus power rails readable with pynq.get_rails()",
                       ("zcu-104",))
KV260 = _zynqmp_board("kv260", "KV260", "xck26-sfvc784-2LV-c", "xilinx.com:kv260_som:part0:1.4", 4096,
                      "Kria-PYNQ on the Ubuntu image; pynq loads the overlay (its power sensors are not configured "
                      "in pynq)", ("kria", "kv-260", "k26"))

BOARDS: Mapping[str, ZynqBoard] = MappingProxyType({b.name: b for b in (ZEDBOARD, PYNQ_Z1, PYNQ_Z2, ZCU104,
                                                                          KV260)})
"""Known Zynq boards by canonical name."""

_LOOKUP = {key: b for b in BOARDS.values() for key in (b.name, b.title.lower(), *b.aliases)}


def get_board(name: str | ZynqBoard) -> ZynqBoard:
    """The board called ``name`` (case-insensitive; ``"PYNQ-Z2"``, ``"pynq_z2"`` and ``"pynqz2"`` all work).

    Raises :class:`UnknownBoardError` listing the known boards.
    """
    if isinstance(name, ZynqBoard):
        return name
    key = name.strip().lower() if isinstance(name, str) else None
    if key in _LOOKUP:
        return _LOOKUP[key]
    raise UnknownBoardError(f"unknown board {name!r}; known boards: {', '.join(BOARDS)}")
