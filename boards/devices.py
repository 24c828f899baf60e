"""FPGA device resource limits, declared once.

Every fit check (synthesis reports, the memory planner, board flows) reads the numbers here rather than
repeating them. A :class:`Device` names a die (``xc7z020``), not a package or speed grade: those do not
change LUT/FF/BRAM/DSP counts. :func:`get_device` also accepts a full part string such as
``xc7z020clg484-1`` or ``LFE5U-85F-6BG381C`` and finds the die in it.

Resource names are the keys of :attr:`Device.limits`; ``rtl_gen.synth`` reports the same names, so a
report and a device can be compared key by key.

Sources: Xilinx DS190 (Zynq-7000 overview, product table) and UG474 (7-series CLBs: 4 LUT6 + 8 FF + 1
CARRY4 + 2 MUXF7 + 1 MUXF8 per slice; only SLICEM LUTs can be distributed RAM or shift registers);
AMD DS891 (Zynq UltraScale+ MPSoC overview, EV device table: XCZU7EV) and DS987 (Kria K26 SOM data sheet:
the XCK26, a ZU5EV-class die) with UG574 (UltraScale CLBs: 8 LUT6 + 16 FF + 1 CARRY8 + 4 MUXF7 + 2 MUXF8 +
1 MUXF9 per CLB; SLICEM LUTs as distributed RAM) and UG573 (36 kbit block RAM, 288 kbit UltraRAM); the CLB,
"LUT as Memory" and mux figures are also the "Available" column of Vivado's utilisation report for these
parts; Lattice ECP5 family data sheet (FPGA-DS-02012).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = ["DEVICES", "URAM_BYTE_WIDTHS", "URAM_DEPTH", "URAM_KBIT", "URAM_RULES", "URAM_WIDTH", "Device",
           "UnknownDeviceError", "UramRule", "get_device", "uram_rule", "xilinx_devices"]


class UnknownDeviceError(ValueError):
    """A device or part name that is not in :data:`DEVICES`."""


@dataclass(frozen=True)
class Device:
    """Resource limits of one FPGA die.

    ``limits`` maps a resource name to how many the die has. For 7-series the names are ``LUT`` (LUT6
    sites, logic and memory together), ``LUTRAM`` (SLICEM LUTs usable as distributed RAM or SRL), ``FF``,
    ``BRAM36`` (36 kbit block RAMs; two RAMB18 make one), ``DSP`` (DSP48E1), ``CARRY4`` (one per slice),
    ``MUXF7``, ``MUXF8`` and ``BUFG``. UltraScale+ (``xcup``) dies have ``LUT``, ``LUTRAM``, ``FF``,
    ``BRAM36`` (RAMB36E2), ``URAM`` (288 kbit UltraRAM, URAM288), ``DSP`` (DSP48E2), ``MUXF7``, ``MUXF8`` and
    ``MUXF9``.
    """

    name: str
    """Die name, lower case for Xilinx (``xc7z020``), as the vendor writes it for Lattice (``LFE5U-85F``)."""
    family: str
    """Synthesis family: ``xc7`` (Yosys ``synth_xilinx -family xc7``), ``xcup`` (``synth_xilinx -family
    xcup``, Zynq UltraScale+) or ``ecp5`` (``synth_ecp5``)."""
    vendor: str
    description: str
    lut_inputs: int
    """6 for 7-series LUT6, 4 for ECP5 LUT4."""
    bram_kbit: int
    """Size of one block RAM in :attr:`limits` (36 for a BRAM36, 18 for an ECP5 EBR)."""
    bram_resource: str
    """The :attr:`limits` key counting block RAMs (``BRAM36`` or ``EBR``)."""
    limits: Mapping[str, int] = field(default_factory=dict)
    packages: Mapping[str, int] = field(default_factory=dict)
    """Package name -> user I/O count (for reference; a PL block behind AXI uses no package pins)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "limits", MappingProxyType(dict(self.limits)))
        object.__setattr__(self, "packages", MappingProxyType(dict(self.packages)))

    @property
    def bram_blocks(self) -> int:
        return self.limits[self.bram_resource]

    @property
    def bram_bits(self) -> int:
        """Total block-RAM bits (data plus parity bits, as the vendor counts them)."""
        return self.bram_blocks * self.bram_kbit * 1024

    @property
    def bram_kib(self) -> float:
        return self.bram_bits / 8 / 1024

    @property
    def uram_bits(self) -> int:
        """Total UltraRAM bits (0 for a die without UltraRAM)."""
        return self.limits.get("URAM", 0) * URAM_KBIT * 1024

    def limit(self, resource: str) -> int:
        try:
            return self.limits[resource]
        except KeyError:
            known = ", ".join(self.limits)
            raise KeyError(f"{self.name} has no resource {resource!r}; known: {known}") from None


#: One UltraRAM block (URAM288): 4K x 72 bits (UG573).
URAM_DEPTH = 4096
URAM_WIDTH = 72
URAM_KBIT = URAM_DEPTH * URAM_WIDTH // 1024  # 288
#: Byte-lane widths of a URAM288 word (9 lanes of 8 bits or 8 of 9, each with its own write enable).
URAM_BYTE_WIDTHS = (8, 9)


@dataclass(frozen=True)
class UramRule:
    """Which inferred memories synthesis puts into UltraRAM on a family that has it.

    Yosys ``memory_libmap`` never picks UltraRAM by itself (``urams.txt`` declares it a ``huge`` memory, used only
    for a memory whose ``ram_style`` attribute asks for it), and without it a deep memory can fail to map at all
    (Yosys 0.70 on ``xcup``: a 16,384 x 64 single-port memory goes to LUTRAM, which ``lutrams_xc5v_map.v`` refuses).
    The rule marks a memory ``ram_style = "ultra"`` when its depth and width reach one of :attr:`clauses`
    (``(min_depth, min_width)`` pairs, any one enough); ``rtl_gen.synth`` turns the same clauses into the Yosys
    selection of ``$mem_v2`` cells (parameters ``SIZE`` and ``WIDTH``), ``rtl_gen.resource_model`` counts the
    memories they select in URAM288 blocks, so synthesis and the model cannot disagree on which memory goes where.

    The clauses pick the memories where one URAM288 does the work of several 36 kbit block RAMs: deeper than 2,048
    words a RAMB36 holds 9 bits of 4K rows (a URAM 72), so from 36 bits wide; deeper than 1,024 words a RAMB36 holds
    18 bits of 2K rows, so from 72 bits wide. A whole 4K x 72 block replaces four to eight RAMB36, a selected memory
    never fewer than two per URAM288 (tests/rtl_gen/test_uram.py). The K26 has 64 URAM for 144 BRAM36 and the ZU7EV
    96 for 312: a URAM is worth two to three block RAMs there.
    """

    clauses: tuple[tuple[int, int], ...]
    block_depth: int
    """Memories deeper than this that the clauses leave out are marked ``ram_style = "block"``: Yosys 0.70's
    ``lutrams_xcu.txt`` offers a single-port LUTRAM up to 64K deep that ``lutrams_xc5v_map.v`` cannot build (the
    deepest UltraScale+ LUTRAM primitive is RAM512X1S), so a deep single-port memory would otherwise fail."""

    def selects(self, width: int, depth: int) -> bool:
        """Whether a ``width x depth`` memory goes to UltraRAM."""
        return any(depth >= d and width >= w for d, w in self.clauses)

    @staticmethod
    def blocks(width: int, depth: int, gran: int | None = None) -> int:
        """URAM288 blocks of a ``width x depth`` memory with one write and one read port, as Yosys 0.70's
        ``memory_libmap`` maps it. A URAM288 word is eight 9-bit or nine 8-bit byte lanes with their own write
        enables (``urams.txt``: ``BYTEWIDTH`` 8 or 9), and the lanes of one block may hold different 4K-row slices of
        a deeper memory: the memory needs ``ceil(width / b)`` lanes (per write group of ``gran`` bits) in each of
        ``ceil(depth / 4096)`` row slices, packed ``72 / b`` to a block, the better byte width taken. 24,576 x 112
        takes 10 (not 2 columns x 6); checked against Yosys on 17 shapes (tests/rtl_gen/test_uram.py)."""
        rows = -(-depth // URAM_DEPTH)
        g = width if gran is None else gran
        best = None
        for b in URAM_BYTE_WIDTHS:
            lanes = (width // g) * -(-g // b) * rows
            n = -(-lanes // (URAM_WIDTH // b))
            best = n if best is None else min(best, n)
        return best


#: Per synthesis family: the memories that go to UltraRAM (families without UltraRAM have none).
URAM_RULES: Mapping[str, UramRule] = MappingProxyType({
    "xcup": UramRule(clauses=((2 * 1024 + 1, 36), (1024 + 1, 72)), block_depth=512),
})


def uram_rule(family: str) -> UramRule | None:
    """The :class:`UramRule` of a synthesis family (``xcup``), or None for a family without UltraRAM."""
    return URAM_RULES.get(family)

_XC7Z020_SLICES = 13_300

XC7Z020 = Device(
    name="xc7z020",
    family="xc7",
    vendor="Xilinx",
    description="Zynq-7020 programmable logic (Artix-7 fabric), dual Cortex-A9 PS",
    lut_inputs=6,
    bram_kbit=36,
    bram_resource="BRAM36",
    limits={
        "LUT": 53_200,
        # 4,350 SLICEM x 4 LUTs: the "LUT as Memory" limit in Vivado's utilisation report.
        "LUTRAM": 17_400,
        "FF": 106_400,
        # 140 x 36 kbit = 280 RAMB18 = 5,040 kbit ("4.9 Mb" in DS190) = 630 KiB.
        "BRAM36": 140,
        "DSP": 220,
        "CARRY4": _XC7Z020_SLICES,
        "MUXF7": 2 * _XC7Z020_SLICES,
        "MUXF8": _XC7Z020_SLICES,
        "BUFG": 32,
    },
    packages={"clg400": 125, "clg484": 200},
)

LFE5U_85F = Device(
    name="LFE5U-85F",
    family="ecp5",
    vendor="Lattice",
    description="ECP5 85k (ULX3S); fully open flow with Yosys + nextpnr-ecp5",
    lut_inputs=4,
    bram_kbit=18,
    bram_resource="EBR",
    limits={
        "LUT4": 83_640,
        "FF": 83_640,  # two LUT4 and two FF per slice
        "EBR": 208,  # 208 x 18 kbit = 3,744 kbit
        "MULT18": 156,  # 18x18 multipliers in the sysDSP slices
        "SLICE": 41_820,
    },
    packages={"CABGA381": 205},
)


def _ultrascale_plus(name: str, description: str, *, clbs: int, lutram: int, bram36: int, uram: int,
                     dsp: int) -> Device:
    """A Zynq UltraScale+ die from its CLB count (UG574: 8 LUT6, 16 FF, 4 MUXF7, 2 MUXF8, 1 MUXF9 per CLB).

    No CARRY limit: Yosys maps adders to CARRY4 even for ``xcup`` (Vivado retargets them to the CARRY8, one
    per CLB, two 4-bit halves each); every carry bit also takes a LUT, so the ``LUT`` limit binds first."""
    return Device(
        name=name,
        family="xcup",
        vendor="AMD Xilinx",
        description=description,
        lut_inputs=6,
        bram_kbit=36,
        bram_resource="BRAM36",
        limits={
            "LUT": 8 * clbs,
            "LUTRAM": lutram,  # Vivado's "LUT as Memory": SLICEM LUTs
            "FF": 16 * clbs,
            "BRAM36": bram36,
            "URAM": uram,
            "DSP": dsp,
            "MUXF7": 4 * clbs,
            "MUXF8": 2 * clbs,
            "MUXF9": clbs,
        },
    )


# DS987: 117,120 LUT, 234,240 FF, 144 BRAM36 (5.1 Mb), 64 URAM (18 Mb), 1,248 DSP48E2; 3.5 Mb of LUTRAM.
XCK26 = _ultrascale_plus(
    "xck26", "Kria K26 SOM (KV260 / KR260): Zynq UltraScale+ EV die, quad Cortex-A53 PS",
    clbs=14_640, lutram=57_600, bram36=144, uram=64, dsp=1_248,
)

# DS891 (ZU7EV): 230,400 LUT, 460,800 FF, 312 BRAM36 (11.0 Mb), 96 URAM (27.0 Mb), 1,728 DSP48E2; 6.2 Mb of LUTRAM.
XCZU7EV = _ultrascale_plus(
    "xczu7ev", "Zynq UltraScale+ ZU7EV (ZCU104), quad Cortex-A53 PS",
    clbs=28_800, lutram=101_760, bram36=312, uram=96, dsp=1_728,
)

DEVICES: Mapping[str, Device] = MappingProxyType(
    {d.name.lower(): d for d in (XC7Z020, XCK26, XCZU7EV, LFE5U_85F)}
)
"""Known dies by lower-case name."""


def get_device(name: str | Device) -> Device:
    """The :class:`Device` for a die name or a full part string (case-insensitive).

    ``"xc7z020"``, ``"xc7z020clg484-1"`` and ``"XC7Z020-CLG400-1"`` all give the Zynq-7020;
    ``"lfe5u-85f"`` and ``"LFE5U-85F-6BG381C"`` the ECP5-85.
    """
    if isinstance(name, Device):
        return name
    known = ", ".join(d.name for d in DEVICES.values())
    if not isinstance(name, str) or not name.strip():
        raise UnknownDeviceError(f"device must be a die or part name, not {name!r}; known: {known}")
    key = name.strip().lower()
    # Longest die name first, so a future "xc7z020" never loses to a shorter prefix like "xc7z02".
    for die in sorted(DEVICES, key=len, reverse=True):
        if key == die or (key.startswith(die) and not key[len(die)].isalnum()) or _xilinx_part(key, die):
            return DEVICES[die]
    raise UnknownDeviceError(f"unknown device {name!r}; known: {known}")


def xilinx_devices() -> tuple[str, ...]:
    """Names of the dies Yosys ``synth_xilinx`` estimates (``generate --device``)."""
    return tuple(d.name for d in DEVICES.values() if d.family in ("xc7", "xcup"))


def _xilinx_part(key: str, die: str) -> bool:
    # Xilinx parts glue the package straight onto the die name: xc7z020clg484-1.
    return die.startswith("xc") and key.startswith(die) and key[len(die)].isalpha()
