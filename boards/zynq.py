"""Zynq-7020 boards the generated accelerators target: ZedBoard, PYNQ-Z1, PYNQ-Z2.

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
    """One Zynq-7000 board: part, clocks, PS7 configuration source, DDR and host access."""

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
    pl_clock_mhz: float = 100.0
    """Default ``FCLK_CLK0`` frequency for the accelerator (the PS7 presets' default)."""
    aliases: tuple[str, ...] = ()
    notes: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "notes", MappingProxyType(dict(self.notes)))
        get_device(self.part)  # every board's part must be a declared device

    @property
    def device(self) -> Device:
        return get_device(self.part)

    @property
    def package(self) -> str:
        """Package code inside :attr:`part` (``clg484``)."""
        rest = self.part.lower().removeprefix(self.device.name)
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
            "ps7_preset": self.ps7_preset,
            "ps_clk_mhz": self.ps_clk_mhz,
            "pl_clock_mhz": self.pl_clock_mhz,
            "ddr_mib": self.ddr_mib,
            "ddr_bus_bits": self.ddr_bus_bits,
            "pynq_image": self.pynq_image,
            "host_access": self.host_access,
        }


ZEDBOARD = ZynqBoard(
    name="zedboard",
    title="ZedBoard",
    maker="Avnet/Digilent",
    part="xc7z020clg484-1",
    vivado_board_part="avnet.com:zedboard:part0:1.4",
    ps7_preset="ZedBoard (built-in PS7 preset; also applied by the board file's block automation)",
    ps_clk_mhz=33.333,
    ddr_mib=512,
    ddr_bus_bits=32,
    pynq_image=False,
    host_access=(
        "no official PYNQ image: build one with PYNQ sdbuild (Vivado + PetaLinux, a ZedBoard board spec and "
        "base design), then use the pynq package on the board; otherwise a PetaLinux/bare-metal host"
    ),
    aliases=("zed", "zedboard-z7020"),
)

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
)

BOARDS: Mapping[str, ZynqBoard] = MappingProxyType({b.name: b for b in (ZEDBOARD, PYNQ_Z1, PYNQ_Z2)})
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
