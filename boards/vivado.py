"""Vivado batch build of a PYNQ overlay for a generated accelerator (ZedBoard, PYNQ-Z1, PYNQ-Z2; ZCU104, KV260).

:func:`write_vivado_project` writes ``DIR/vivado/build.tcl`` and ``DIR/vivado/Makefile`` next to the
generated Verilog. ``make -C DIR/vivado`` runs ``vivado -mode batch -source build.tcl``, which

- creates a project for the board's part, with the board part when its board files are installed (every name
  the board has had is probed; ``--board-repo DIR`` adds a folder of board files, ``set_param
  board.repoPaths``) and the PS then takes the board preset; otherwise the PS7's explicit ``PCW_*`` values of
  :attr:`ZynqBoard.ps7_config` (PYNQ-Z1/Z2; the Z2's from TUL's board file), the PS7's own ``ZedBoard`` preset,
  or on the Zynq UltraScale+ only the PL side of the ``zynq_ultra_ps_e``; the script prints which it used;
- builds a block design: the PS (Zynq-7000: GP0 master, HP0 slave, ``FCLK_CLK0``, ``IRQ_F2P``; UltraScale+:
  HPM0_FPD master, HP0_FPD slave, ``pl_clk0``, ``pl_ps_irq0``) with PL clock 0 at ``--clock-mhz`` (default the
  description's 100 MHz), the Verilog top as a module reference ``xnortrain_0``, one AXI DMA ``axi_dma_0`` in
  simple mode with 32-bit streams and a buffer length register wide enough for the largest transfer of
  ``accelerator.json``, a ``proc_sys_reset`` and two AXI interconnects (the PS master -> the accelerator's, the
  DMA's and the interrupt controller's AXI4-Lite; the DMA's two masters -> the PS slave port); MM2S ->
  ``s_axis``, ``m_axis`` -> S2MM, ``irq`` -> AXI interrupt controller ``axi_intc_0`` -> the PS (pynq sees an
  interrupt only behind one); the cell names are :class:`host.transports.pynq.PynqTransport`'s defaults;
- assigns addresses, validates, makes the HDL wrapper, runs synthesis and implementation to the bitstream
  and checks each run's status; writes utilisation, timing and power reports; stops unless every user timing
  constraint is met (setup, hold and pulse width: Vivado's "All user specified timing constraints are met", as
  PYNQ's own overlays check), and on a negative WNS names the clock at which the worst path would meet,
  1000 / (1000/F - WNS) MHz, with the ``xnortrain generate`` command that rebuilds at it; copies the bitstream
  and the hardware handoff to ``xnortrain.bit`` and ``xnortrain.hwh`` side by side in ``DIR/vivado/`` (the names
  PYNQ's ``Overlay`` needs).

No Vivado is needed to write the files; ``tests/boards/test_vivado_tcl.py`` sources the script in a Tcl
interpreter with the Vivado commands recorded.
"""

# ruff: noqa: E501  (the build.tcl template keeps each Vivado command on one line)
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from boards.zynq import ZynqBoard, get_board

__all__ = [
    "ACCEL_CELL",
    "BITSTREAM_STEM",
    "DMA_CELL",
    "INTC_CELL",
    "DmaSizing",
    "VivadoBuildError",
    "dma_sizing",
    "render_build_tcl",
    "render_makefile",
    "write_vivado_project",
]

ACCEL_CELL = "xnortrain_0"
"""Block-design name of the accelerator (``PynqTransport(ip=...)``'s default)."""
DMA_CELL = "axi_dma_0"
"""Block-design name of the AXI DMA (``PynqTransport(dma=...)``'s default)."""
INTC_CELL = "axi_intc_0"
"""The AXI interrupt controller between the accelerator's ``irq`` and the PS (pynq sees interrupts only there)."""
BITSTREAM_STEM = "xnortrain"
"""``xnortrain.bit`` and ``xnortrain.hwh``: PYNQ finds the handoff next to the bitstream by its stem."""
BD_NAME = "xnortrain_bd"

# AXI DMA (PG021): the buffer length register is 8 to 26 bits wide; 14 is the IP's default.
DMA_LENGTH_WIDTH_MIN = 8
DMA_LENGTH_WIDTH_MAX = 26
DMA_LENGTH_WIDTH_DEFAULT = 14
STREAM_BYTES = 4  # one 32-bit beat of s_axis / m_axis

# IP versions present in Vivado 2018.3 through 2024.x
VLNV = {
    "ps7": "xilinx.com:ip:processing_system7:5.5",
    "zynqmp": "xilinx.com:ip:zynq_ultra_ps_e:*",  # 3.x, by Vivado release: the newest installed is used
    "intc": "xilinx.com:ip:axi_intc:4.1",
    "dma": "xilinx.com:ip:axi_dma:7.1",
    "reset": "xilinx.com:ip:proc_sys_reset:5.0",
    "interconnect": "xilinx.com:ip:axi_interconnect:2.1",
}


class VivadoBuildError(ValueError):
    """The accelerator cannot be put into the board's block design as generated (one line: what and why)."""


@dataclass(frozen=True)
class DmaSizing:
    """The largest DMA transfers of an accelerator and the buffer length width that covers them."""

    send_bytes: int
    """Largest MM2S transfer: the batch upload (images then labels) or a restore of a quantity."""
    receive_bytes: int
    """Largest S2MM transfer: a read-back of a quantity."""
    length_width: int
    """``c_sg_length_width``: transfers up to ``2**length_width - 1`` bytes."""

    @property
    def largest_bytes(self) -> int:
        return max(self.send_bytes, self.receive_bytes)

    @property
    def max_bytes(self) -> int:
        return (1 << self.length_width) - 1


def dma_sizing(desc) -> DmaSizing:
    """Transfer sizes of an :class:`rtl_gen.contract.AcceleratorDescription` (as :meth:`PynqTransport.attach`
    sizes its buffers: one MM2S transfer per batch upload or restore, one S2MM transfer per read-back) and
    the smallest AXI DMA length width (at least the IP's default of 14 bits) that covers the largest.
    Raises :class:`VivadoBuildError` when a transfer exceeds the DMA's 26-bit limit."""
    qs = desc.quantities
    send_words = max([desc.batch_layout.beats + desc.label_layout.beats] + [q.beats for q in qs if q.access != "ro"])
    recv_words = max([1] + [q.beats for q in qs if q.access != "wo"])
    send, recv = send_words * STREAM_BYTES, recv_words * STREAM_BYTES
    width = max(DMA_LENGTH_WIDTH_DEFAULT, max(send, recv).bit_length())
    if width > DMA_LENGTH_WIDTH_MAX:
        raise VivadoBuildError(f"accelerator.json: the largest DMA transfer is {max(send, recv):,} bytes; the AXI "
                               f"DMA moves at most {(1 << DMA_LENGTH_WIDTH_MAX) - 1:,} bytes per transfer (26-bit "
                               f"length)")
    return DmaSizing(send, recv, width)


_PORT_RE = re.compile(r"^\s*(?:\(\*[^*]*\*\)\s*)*(input|output|inout)\b[^;]*?(\\?[\w$.]+)\s*;", re.M)


def verilog_top_ports(verilog: str, top: str) -> dict[str, str]:
    """Port name -> direction of module ``top`` in Verilog text written by Amaranth (one declaration a line)."""
    m = re.search(rf"^module {re.escape(top)}\((.*?)\);(.*?)^endmodule", verilog, re.M | re.S)
    if m is None:
        raise VivadoBuildError(f"the generated Verilog has no module {top!r}")
    return {name: d for d, name in _PORT_RE.findall(m.group(2))}


def _check_ports(ports: dict[str, str]) -> bool:
    """The accelerator's ports the block design connects; returns whether it has an interrupt."""
    need = ["clk", "rst", "s_axi_awaddr", "s_axi_rdata", "s_axis_tdata", "s_axis_tlast", "s_axis_tvalid",
            "s_axis_tready", "m_axis_tdata", "m_axis_tlast", "m_axis_tvalid", "m_axis_tready"]
    missing = [p for p in need if p not in ports]
    if missing:
        raise VivadoBuildError(f"the generated Verilog top lacks the port(s) {', '.join(missing)} the block design "
                               f"connects")
    return ports.get("irq") == "output"


def _tcl_braced(value) -> str:
    text = str(value)
    if any(c in text for c in "{}\\\n"):
        raise VivadoBuildError(f"cannot quote {text!r} for Tcl")
    return "{" + text + "}"


def _dict_lines(settings: dict, indent: str = "    ") -> str:
    return "\n".join(f"{indent}CONFIG.{k} {_tcl_braced(v)} \\" for k, v in settings.items())


def _fmt_mhz(mhz: float) -> str:
    return f"{float(mhz):.6g}"


@dataclass(frozen=True)
class _Ps:
    """The PS IP of a board family and the names of its pins the block design uses."""

    vlnv: str
    cell: str
    master: str  # AXI master to the AXI4-Lite slaves
    slave: str  # AXI slave port the DMA writes and reads the DDR through
    clk: str  # PL clock 0
    resetn: str  # its reset, active low
    aclks: tuple[str, ...]  # clock pins of the two AXI ports
    irq: str  # fabric interrupt input
    automation: str  # apply_bd_automation rule
    max_fclk_mhz: float


_PS = {
    "zynq7": _Ps(VLNV["ps7"], "processing_system7_0", "M_AXI_GP0", "S_AXI_HP0", "FCLK_CLK0", "FCLK_RESET0_N",
                 ("M_AXI_GP0_ACLK", "S_AXI_HP0_ACLK"), "IRQ_F2P", "xilinx.com:bd_rule:processing_system7", 250.0),
    # zynq_ultra_ps_e (PG201): HPM0_FPD master, HP0_FPD slave (saxigp2), pl_clk0 / pl_resetn0, pl_ps_irq0
    "zynqmp": _Ps(VLNV["zynqmp"], "zynq_ultra_ps_e_0", "M_AXI_HPM0_FPD", "S_AXI_HP0_FPD", "pl_clk0", "pl_resetn0",
                  ("maxihpm0_fpd_aclk", "saxihp0_fpd_aclk"), "pl_ps_irq0", "xilinx.com:bd_rule:zynq_ultra_ps_e",
                  250.0),
}


def _ps_settings(board: ZynqBoard, fclk: float, has_irq: bool) -> dict:
    """The PS settings every build sets (board files or not): the two AXI ports, PL clock 0, the interrupt."""
    if board.family == "zynq7":
        return {
            "PCW_USE_M_AXI_GP0": "1",
            "PCW_USE_S_AXI_HP0": "1",
            "PCW_S_AXI_HP0_DATA_WIDTH": "64",
            "PCW_EN_CLK0_PORT": "1",
            "PCW_EN_RST0_PORT": "1",
            "PCW_FPGA0_PERIPHERAL_FREQMHZ": _fmt_mhz(fclk),
            "PCW_USE_FABRIC_INTERRUPT": "1" if has_irq else "0",
            "PCW_IRQ_F2P_INTR": "1" if has_irq else "0",
        }
    return {  # zynq_ultra_ps_e: GP0 = HPM0_FPD, GP1 = HPM1_FPD (off: its clock would need a source), GP2 = HP0_FPD
        "PSU__USE__M_AXI_GP0": "1",
        "PSU__USE__M_AXI_GP1": "0",
        "PSU__USE__M_AXI_GP2": "0",
        "PSU__USE__S_AXI_GP2": "1",
        "PSU__SAXIGP2__DATA_WIDTH": "64",
        "PSU__FPGA_PL0_ENABLE": "1",
        "PSU__CRL_APB__PL0_REF_CTRL__FREQMHZ": _fmt_mhz(fclk),
        "PSU__USE__IRQ0": "1" if has_irq else "0",
    }


def render_build_tcl(board: ZynqBoard | str, desc, *, top: str, verilog_file: str, has_irq: bool = True,
                     clock_mhz: float | None = None, board_repo: str | None = None,
                     rebuild_command: str | None = None) -> str:
    """The text of ``build.tcl`` for ``board`` and the accelerator described by ``desc``.

    ``verilog_file`` is relative to the script's folder; ``clock_mhz`` defaults to ``desc.clock_mhz``;
    ``board_repo``: a folder of board files Vivado searches first (``set_param board.repoPaths``, as FINN's
    ``make_zynq_proj`` does); ``rebuild_command``: the ``xnortrain generate`` command that wrote the folder, without
    ``--clock-mhz``: a failed timing check prints it with the clock at which the worst path would meet."""
    board = get_board(board)
    ps = _PS[board.family]
    sizing = dma_sizing(desc)
    fclk = float(desc.clock_mhz if clock_mhz is None else clock_mhz)
    if not 1.0 <= fclk <= ps.max_fclk_mhz:
        raise VivadoBuildError(f"--clock-mhz {fclk:g}: PL clock 0 of the {board.title}'s PS runs at 1 to "
                               f"{ps.max_fclk_mhz:g} MHz")
    dma = {
        "c_include_sg": "0",
        "c_sg_length_width": str(sizing.length_width),
        "c_sg_include_stscntrl_strm": "0",
        "c_include_mm2s": "1",
        "c_include_s2mm": "1",
        "c_m_axi_mm2s_data_width": "32",
        "c_m_axis_mm2s_tdata_width": "32",
        "c_m_axi_s2mm_data_width": "32",
        "c_s_axis_s2mm_tdata_width": "32",
        "c_mm2s_burst_size": "16",
        "c_s2mm_burst_size": "16",
        # the DMA's masters address the whole 64-bit space of the UltraScale+ PS (32 bits on the Zynq-7000)
        "c_addr_width": "64" if board.family == "zynqmp" else "32",
    }
    if has_irq:
        # pynq registers an interrupt only behind an AXI interrupt controller (pynq/interrupt.py reads the
        # axi_intc of the .hwh): irq -> axi_intc_0 (level, active high, as the port's attribute says) -> the PS
        intc_cell = f"""create_bd_cell -type ip -vlnv {VLNV['intc']} {INTC_CELL}
set_property -dict [list CONFIG.C_IRQ_CONNECTION {{1}} CONFIG.C_KIND_OF_INTR.VALUE_SRC {{USER}} CONFIG.C_KIND_OF_INTR {{0x00000000}}] [get_bd_cells {INTC_CELL}]"""
        irq_lines = f"""connect_bd_intf_net [get_bd_intf_pins ps_axi_periph/M02_AXI] [get_bd_intf_pins {INTC_CELL}/s_axi]
connect_bd_net [get_bd_pins {ACCEL_CELL}/irq] [get_bd_pins {INTC_CELL}/intr]
connect_bd_net [get_bd_pins {INTC_CELL}/irq] [get_bd_pins {ps.cell}/{ps.irq}]"""
        n_mi = 3
        intc_clk = " \\\n    " + f"[get_bd_pins {INTC_CELL}/s_axi_aclk] [get_bd_pins ps_axi_periph/M02_ACLK]"
        intc_rst = " \\\n    " + f"[get_bd_pins {INTC_CELL}/s_axi_aresetn] [get_bd_pins ps_axi_periph/M02_ARESETN]"
    else:
        intc_clk = intc_rst = ""
        intc_cell = "# no interrupt controller: the accelerator has no interrupt output"
        irq_lines = "# the accelerator has no interrupt output: the host polls its status register"
        n_mi = 2
    if board.family == "zynq7":
        ps_ip = f"create_bd_cell -type ip -vlnv {ps.vlnv} {ps.cell}"
    else:  # the zynq_ultra_ps_e version differs between Vivado releases: the newest installed
        ps_ip = f"create_bd_cell -type ip -vlnv [xnt_newest_ip {ps.vlnv}] {ps.cell}"
    if board.ps_builtin_preset:
        fallback = f"""    set_property CONFIG.preset {_tcl_braced(board.ps_builtin_preset)} [get_bd_cells {ps.cell}]
    xnt_say "PS settings: the PS IP's own {board.ps_builtin_preset} preset (board files for $xnt_board_part not installed)\""""
    elif board.ps7_config:
        fallback = f"""    set_property -dict [list \\
{_dict_lines(dict(board.ps7_config), "        ")}
    ] [get_bd_cells {ps.cell}]
    xnt_say "PS settings: explicit values written by xnortrain (board files for $xnt_board_part not installed)\""""
    else:
        fallback = """    xnt_say "PS settings: the PL side only, set by xnortrain (board files for $xnt_board_part not installed; the board's boot configures the PS)\""""
    patterns = " ".join(_tcl_braced(p) for p in (board.vivado_board_part, *board.board_part_patterns))
    repo = (f"set_param board.repoPaths [concat [list [file normalize {_tcl_braced(board_repo)}]] "
            f"[get_param board.repoPaths]]\nxnt_say \"board files: also searched in {board_repo}\""
            if board_repo else "# no --board-repo: Vivado's own board store")
    rebuild = rebuild_command or f"xnortrain generate --board {board.name} ..."
    aclk_pins = " ".join(f"[get_bd_pins {ps.cell}/{p}]" for p in ps.aclks)
    return f"""\
# Vivado batch build of the xnortrain accelerator {top} for the {board.title} ({board.part}).
# Written by `xnortrain generate --board {board.name}`; run it with `make` in this folder, or
#   vivado -mode batch -source build.tcl
# Outputs in this folder: {BITSTREAM_STEM}.bit and {BITSTREAM_STEM}.hwh (a PYNQ overlay), utilization.rpt,
# timing_summary.rpt, power.rpt; the Vivado project in ./project.

set xnt_dir [file dirname [file normalize [info script]]]
set xnt_top {top}
set xnt_verilog [file normalize [file join $xnt_dir {verilog_file}]]
set xnt_project_dir [file join $xnt_dir project]
set xnt_part {board.part}
set xnt_board_part {board.vivado_board_part}
set xnt_board_part_patterns [list {patterns}]
set xnt_bd {BD_NAME}
set xnt_fclk_mhz {_fmt_mhz(fclk)}
set xnt_rebuild {_tcl_braced(rebuild)}
# largest DMA transfers (accelerator.json): {sizing.send_bytes} bytes to the accelerator, {sizing.receive_bytes} back
set xnt_largest_transfer {sizing.largest_bytes}
set xnt_dma_length_width {sizing.length_width}
if {{[info exists ::env(XNT_JOBS)]}} {{ set xnt_jobs $::env(XNT_JOBS) }} else {{ set xnt_jobs 2 }}

proc xnt_say {{msg}} {{ puts "xnortrain: $msg" }}

proc xnt_check_run {{run}} {{
    set status [get_property STATUS [get_runs $run]]
    set progress [get_property PROGRESS [get_runs $run]]
    if {{$progress ne "100%" || [string match -nocase "*error*" $status] || [string match -nocase "*fail*" $status]}} {{
        error "xnortrain: run $run did not complete: status '$status', progress $progress; see [get_property DIRECTORY [get_runs $run]]/runme.log"
    }}
    xnt_say "$run: $status"
}}

proc xnt_newest_ip {{vlnv}} {{
    set defs [lsort -dictionary [get_ipdefs -all -quiet $vlnv]]
    if {{[llength $defs] == 0}} {{ error "xnortrain: this Vivado has no IP $vlnv (install the Zynq UltraScale+ device support)" }}
    return [lindex $defs end]
}}

if {{![file exists $xnt_verilog]}} {{
    error "xnortrain: the generated Verilog $xnt_verilog is missing (run xnortrain generate again)"
}}

# --- project: the board part when its board files are installed (every name it has had is probed), else the
# bare part with the settings below
{repo}
create_project -force xnortrain $xnt_project_dir -part $xnt_part
set xnt_use_board_files 0
foreach xnt_pattern $xnt_board_part_patterns {{
    set xnt_found [lsort -dictionary [get_board_parts -quiet $xnt_pattern]]
    if {{[llength $xnt_found] > 0}} {{
        set xnt_board_part [lindex $xnt_found end]
        set xnt_use_board_files 1
        break
    }}
}}
if {{$xnt_use_board_files}} {{
    set_property board_part $xnt_board_part [current_project]
    xnt_say "PS settings: from the board files ($xnt_board_part)"
}}
add_files -norecurse $xnt_verilog
update_compile_order -fileset sources_1

create_bd_design $xnt_bd

# --- the PS: DDR and fixed I/O, the AXI master to the slaves, the slave port for the DMA, PL clock 0, interrupt
{ps_ip}
apply_bd_automation -rule {ps.automation} -config [list make_external "FIXED_IO, DDR" apply_board_preset $xnt_use_board_files Master Disable Slave Disable] [get_bd_cells {ps.cell}]
if {{!$xnt_use_board_files}} {{
{fallback}
}}
set_property -dict [list \\
{_dict_lines(_ps_settings(board, fclk, has_irq))}
] [get_bd_cells {ps.cell}]
xnt_say "PL clock 0: $xnt_fclk_mhz MHz requested"

# --- the accelerator (module reference of the generated Verilog) and the AXI DMA (simple mode)
create_bd_cell -type module -reference $xnt_top {ACCEL_CELL}
create_bd_cell -type ip -vlnv {VLNV['dma']} {DMA_CELL}
set_property -dict [list \\
{_dict_lines(dma)}
] [get_bd_cells {DMA_CELL}]
xnt_say "AXI DMA: $xnt_dma_length_width-bit buffer length, [expr {{(1 << $xnt_dma_length_width) - 1}}] bytes per transfer (largest needed: $xnt_largest_transfer)"

# --- reset and interconnects
create_bd_cell -type ip -vlnv {VLNV['reset']} rst_ps_0
create_bd_cell -type ip -vlnv {VLNV['interconnect']} ps_axi_periph
set_property -dict [list CONFIG.NUM_SI {{1}} CONFIG.NUM_MI {{{n_mi}}}] [get_bd_cells ps_axi_periph]
create_bd_cell -type ip -vlnv {VLNV['interconnect']} axi_mem_intercon
set_property -dict [list CONFIG.NUM_SI {{2}} CONFIG.NUM_MI {{1}}] [get_bd_cells axi_mem_intercon]
{intc_cell}

# --- AXI connections
connect_bd_intf_net [get_bd_intf_pins {ps.cell}/{ps.master}] [get_bd_intf_pins ps_axi_periph/S00_AXI]
connect_bd_intf_net [get_bd_intf_pins ps_axi_periph/M00_AXI] [get_bd_intf_pins {ACCEL_CELL}/s_axi]
connect_bd_intf_net [get_bd_intf_pins ps_axi_periph/M01_AXI] [get_bd_intf_pins {DMA_CELL}/S_AXI_LITE]
connect_bd_intf_net [get_bd_intf_pins {DMA_CELL}/M_AXI_MM2S] [get_bd_intf_pins axi_mem_intercon/S00_AXI]
connect_bd_intf_net [get_bd_intf_pins {DMA_CELL}/M_AXI_S2MM] [get_bd_intf_pins axi_mem_intercon/S01_AXI]
connect_bd_intf_net [get_bd_intf_pins axi_mem_intercon/M00_AXI] [get_bd_intf_pins {ps.cell}/{ps.slave}]
connect_bd_intf_net [get_bd_intf_pins {DMA_CELL}/M_AXIS_MM2S] [get_bd_intf_pins {ACCEL_CELL}/s_axis]
connect_bd_intf_net [get_bd_intf_pins {ACCEL_CELL}/m_axis] [get_bd_intf_pins {DMA_CELL}/S_AXIS_S2MM]

# --- one clock (PL clock 0) and its reset for everything in the programmable logic
connect_bd_net [get_bd_pins {ps.cell}/{ps.clk}] {aclk_pins} \\
    [get_bd_pins {ACCEL_CELL}/clk] [get_bd_pins rst_ps_0/slowest_sync_clk] \\
    [get_bd_pins {DMA_CELL}/s_axi_lite_aclk] [get_bd_pins {DMA_CELL}/m_axi_mm2s_aclk] [get_bd_pins {DMA_CELL}/m_axi_s2mm_aclk] \\
    [get_bd_pins ps_axi_periph/ACLK] [get_bd_pins ps_axi_periph/S00_ACLK] \\
    [get_bd_pins ps_axi_periph/M00_ACLK] [get_bd_pins ps_axi_periph/M01_ACLK] \\
    [get_bd_pins axi_mem_intercon/ACLK] [get_bd_pins axi_mem_intercon/S00_ACLK] \\
    [get_bd_pins axi_mem_intercon/S01_ACLK] [get_bd_pins axi_mem_intercon/M00_ACLK]{intc_clk}
connect_bd_net [get_bd_pins {ps.cell}/{ps.resetn}] [get_bd_pins rst_ps_0/ext_reset_in]
connect_bd_net [get_bd_pins rst_ps_0/interconnect_aresetn] \\
    [get_bd_pins ps_axi_periph/ARESETN] [get_bd_pins axi_mem_intercon/ARESETN]
connect_bd_net [get_bd_pins rst_ps_0/peripheral_aresetn] [get_bd_pins {DMA_CELL}/axi_resetn] \\
    [get_bd_pins ps_axi_periph/S00_ARESETN] [get_bd_pins ps_axi_periph/M00_ARESETN] \\
    [get_bd_pins ps_axi_periph/M01_ARESETN] [get_bd_pins axi_mem_intercon/S00_ARESETN] \\
    [get_bd_pins axi_mem_intercon/S01_ARESETN] [get_bd_pins axi_mem_intercon/M00_ARESETN]{intc_rst}
# the accelerator's reset is active high
connect_bd_net [get_bd_pins rst_ps_0/peripheral_reset] [get_bd_pins {ACCEL_CELL}/rst]
{irq_lines}

# --- addresses, validation, wrapper
assign_bd_address
validate_bd_design
save_bd_design
set xnt_bd_file [get_files $xnt_bd.bd]
generate_target all $xnt_bd_file
set xnt_wrapper [make_wrapper -files $xnt_bd_file -top]
add_files -norecurse $xnt_wrapper
set_property top ${{xnt_bd}}_wrapper [current_fileset]
update_compile_order -fileset sources_1

# --- synthesis, implementation, bitstream; each run's status checked
launch_runs synth_1 -jobs $xnt_jobs
wait_on_run synth_1
xnt_check_run synth_1
launch_runs impl_1 -to_step write_bitstream -jobs $xnt_jobs
wait_on_run impl_1
xnt_check_run impl_1

# --- reports, then the timing verdict: every user constraint met (setup, hold and pulse width), the sentence
# PYNQ's own overlays require (boards/Pynq-Z2/base/check_timing.tcl in the PYNQ sources)
open_run impl_1
report_utilization -file [file join $xnt_dir utilization.rpt]
report_timing_summary -max_paths 20 -file [file join $xnt_dir timing_summary.rpt]
report_power -file [file join $xnt_dir power.rpt]
set xnt_timing [report_timing_summary -no_detailed_paths -return_string]
set xnt_wns [get_property STATS.WNS [get_runs impl_1]]
set xnt_whs [get_property STATS.WHS [get_runs impl_1]]
set xnt_met [string match "*All user specified timing constraints are met*" $xnt_timing]
if {{!$xnt_met || $xnt_wns < 0 || $xnt_whs < 0}} {{
    set xnt_why "timing not met at $xnt_fclk_mhz MHz: WNS $xnt_wns ns, WHS $xnt_whs ns (see [file join $xnt_dir timing_summary.rpt])"
    if {{$xnt_wns < 0}} {{
        # the worst path takes 1000/F - WNS ns: it meets at 1000 / (1000/F - WNS) MHz (rounded down to 0.1 MHz)
        set xnt_meet [format %.1f [expr {{floor(10.0 * 1000.0 / (1000.0 / $xnt_fclk_mhz - $xnt_wns)) / 10.0}}]]
        error "xnortrain: $xnt_why; the worst path would meet at $xnt_meet MHz: rebuild with `$xnt_rebuild --clock-mhz $xnt_meet` and make"
    }} elseif {{$xnt_whs < 0}} {{
        error "xnortrain: $xnt_why; a hold violation does not go away at a lower clock: see the report's hold paths"
    }}
    error "xnortrain: $xnt_why; a pulse-width or other user constraint fails (Vivado does not report 'All user specified timing constraints are met')"
}}
xnt_say "timing met at $xnt_fclk_mhz MHz: WNS $xnt_wns ns, WHS $xnt_whs ns"

# --- the overlay: bitstream and hardware handoff side by side, same stem
set xnt_bits [glob -nocomplain [file join [get_property DIRECTORY [get_runs impl_1]] *.bit]]
if {{[llength $xnt_bits] != 1}} {{
    error "xnortrain: expected one bitstream in the impl_1 run folder, found [llength $xnt_bits]"
}}
set xnt_hwh [glob -nocomplain [file join $xnt_project_dir xnortrain.gen sources_1 bd $xnt_bd hw_handoff $xnt_bd.hwh] \\
    [file join $xnt_project_dir xnortrain.srcs sources_1 bd $xnt_bd hw_handoff $xnt_bd.hwh]]
if {{[llength $xnt_hwh] < 1}} {{
    error "xnortrain: no hardware handoff $xnt_bd.hwh under $xnt_project_dir"
}}
file copy -force [lindex $xnt_bits 0] [file join $xnt_dir {BITSTREAM_STEM}.bit]
file copy -force [lindex $xnt_hwh 0] [file join $xnt_dir {BITSTREAM_STEM}.hwh]
xnt_say "wrote [file join $xnt_dir {BITSTREAM_STEM}.bit] and [file join $xnt_dir {BITSTREAM_STEM}.hwh]"
"""


def render_makefile(board: ZynqBoard | str) -> str:
    """``make`` runs Vivado in batch mode on ``build.tcl``; without ``vivado`` on PATH it says what to install
    and the command it would run, and fails (status 127)."""
    board = get_board(board)
    cmd = "$(VIVADO) -mode batch -notrace -nojournal -log vivado.log -source build.tcl"
    edition = (f"the free ML Standard edition includes the Zynq-7000 {board.device.name}" if board.family == "zynq7"
               else f"check that your edition lists the {board.part}")
    return f"""\
# Vivado build of the xnortrain overlay for the {board.title} ({board.part}); written by xnortrain generate.
#   make            bitstream: xnortrain.bit + xnortrain.hwh (a PYNQ overlay) and the reports
#   make clean      remove the project and the outputs
# VIVADO=/path/to/vivado picks another Vivado; XNT_JOBS=N runs N parallel jobs (default 2).
VIVADO ?= vivado

.PHONY: all clean

all:
\t@if ! command -v $(VIVADO) >/dev/null 2>&1; then \\
\t  echo "xnortrain: '$(VIVADO)' is not on PATH. Install AMD/Xilinx Vivado (2018.3 or later;" >&2; \\
\t  echo "  {edition}) and load its environment, e.g." >&2; \\
\t  echo "  'source /tools/Xilinx/Vivado/<version>/settings64.sh'; board files for {board.vivado_board_part}" >&2; \\
\t  echo "  are optional (without them the script sets the PS itself). Then run in $(CURDIR):" >&2; \\
\t  echo "  {cmd.replace('$(VIVADO)', 'vivado')}" >&2; \\
\t  exit 127; \\
\tfi
\tcd "$(CURDIR)" && {cmd}

clean:
\trm -rf project .Xil vivado.log vivado*.jou vivado*.log {BITSTREAM_STEM}.bit {BITSTREAM_STEM}.hwh \\
\t  utilization.rpt timing_summary.rpt power.rpt
"""


def write_vivado_project(out_dir, board: ZynqBoard | str, desc, verilog_path, *, top: str,
                         clock_mhz: float | None = None, board_repo: str | None = None,
                         rebuild_command: str | None = None) -> Path:
    """Write ``build.tcl`` and ``Makefile`` into ``out_dir`` (created) for the accelerator described by
    ``desc`` whose Verilog (module ``top``) is ``verilog_path``. Returns the path of ``build.tcl``."""
    out = Path(out_dir)
    verilog_path = Path(verilog_path)
    has_irq = _check_ports(verilog_top_ports(verilog_path.read_text(), top))
    rel = Path("..") / verilog_path.name if verilog_path.parent.resolve() == out.resolve().parent else \
        verilog_path.resolve()
    tcl = render_build_tcl(board, desc, top=top, verilog_file=rel.as_posix(), has_irq=has_irq, clock_mhz=clock_mhz,
                           board_repo=board_repo, rebuild_command=rebuild_command)
    out.mkdir(parents=True, exist_ok=True)
    (out / "build.tcl").write_text(tcl)
    (out / "Makefile").write_text(render_makefile(board))
    return out / "build.tcl"
