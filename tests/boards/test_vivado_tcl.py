"""The Vivado build of a PYNQ overlay (boards/vivado.py) without Vivado.

The generated ``build.tcl`` is sourced in a real Tcl 8.6 interpreter (``tkinter.Tcl()``) in which every
unknown (Vivado) command is recorded and the few commands whose results the script uses are stubbed;
the tests then check the recorded sequence against the board, the generated Verilog and
``accelerator.json``. The small MLP of tests/rtl_gen/test_system.py is elaborated once per module.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import tkinter
from pathlib import Path

import pytest

from boards.vivado import (
    _PS,
    ACCEL_CELL,
    BITSTREAM_STEM,
    DMA_CELL,
    DMA_LENGTH_WIDTH_DEFAULT,
    INTC_CELL,
    VivadoBuildError,
    dma_sizing,
    verilog_top_ports,
    write_vivado_project,
)
from boards.zynq import BOARDS, get_board
from rtl_gen.contract import AcceleratorDescription
from rtl_gen.top import PORT_ATTRS, TOP_NAME
from tests.rtl_gen.test_system import paper_cfg, small_cfg

BOARD_NAMES = ("pynq-z2", "pynq-z1", "zedboard", "zcu104", "kv260")
TIMING_MET = "Design Timing Summary ...\nAll user specified timing constraints are met.\n"
TIMING_FAILED = "Design Timing Summary ...\nTiming constraints are not met.\n"


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """``generate --board pynq-z2 --no-synth`` of the small MLP: the folder, its Verilog and description."""
    from host.generate import generate

    out = tmp_path_factory.mktemp("gen") / "acc"
    generate(small_cfg(), out, synth=False, board="pynq-z2", log=lambda *_: None)
    verilog = (out / f"{TOP_NAME}.v").read_text()
    return out, verilog, AcceleratorDescription.from_json((out / "accelerator.json").read_text())


def _project(tmp_path: Path, generated, board: str, **kw) -> Path:
    """A copy of the generated folder's Verilog with a ``vivado/`` build for ``board``."""
    out, _verilog, desc = generated
    shutil.copy(out / f"{TOP_NAME}.v", tmp_path / f"{TOP_NAME}.v")
    return write_vivado_project(tmp_path / "vivado", board, desc, tmp_path / f"{TOP_NAME}.v", top=TOP_NAME, **kw)


_HARNESS = r"""
set ::calls {}
set ::out {}
rename unknown _xnt_unknown
proc unknown args { lappend ::calls $args; return "" }
rename puts _xnt_puts
proc puts args { lappend ::out [lindex $args end] }
proc _path_stub {cmd args} { lappend ::calls [list $cmd {*}$args]; return [lindex $args end] }
foreach cmd {get_bd_cells get_bd_pins get_bd_intf_pins get_runs get_files} { interp alias {} $cmd {} _path_stub $cmd }
proc get_board_parts args {
    lappend ::calls [list get_board_parts {*}$args]
    return [lsearch -all -inline -glob $::stub(board_parts) [lindex $args end]]
}
proc get_ipdefs args {
    lappend ::calls [list get_ipdefs {*}$args]
    return [list [string map {* 3.4} [lindex $args end]] [string map {* 3.5} [lindex $args end]]]
}
proc report_timing_summary args {
    lappend ::calls [list report_timing_summary {*}$args]
    if {"-return_string" in $args} { return $::stub(timing) }
    return ""
}
proc make_wrapper args { lappend ::calls [list make_wrapper {*}$args]; return /proj/xnortrain_bd_wrapper.v }
proc get_property {name obj} {
    lappend ::calls [list get_property $name $obj]
    if {[info exists ::stub($name,$obj)]} { return $::stub($name,$obj) }
    return $::stub($name)
}
"""


def run_script(script: Path, board: str, *, board_files: bool | str, wns: float = 0.25, whs: float = 0.05,
               synth_status: str = "synth_design Complete!", fake_outputs: bool = True, timing: str = TIMING_MET):
    """Source ``script``; returns (calls, printed lines, error text or None). ``board_files``: the board's
    own board part installed (True), none (False) or the names of the installed board parts (a string).
    ``fake_outputs`` puts a bitstream in the stubbed impl_1 folder and a handoff where Vivado 2020+ writes it."""
    folder = script.parent
    run_dir = folder / "project" / "xnortrain.runs" / "impl_1"
    if fake_outputs:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "xnortrain_bd_wrapper.bit").write_bytes(b"BIT")
        hwh = folder / "project" / "xnortrain.gen" / "sources_1" / "bd" / "xnortrain_bd" / "hw_handoff"
        hwh.mkdir(parents=True, exist_ok=True)
        (hwh / "xnortrain_bd.hwh").write_text("<HWH/>")
    board = get_board(board)
    tcl = tkinter.Tcl()
    tcl.eval(_HARNESS)
    stubs = {
        "board_parts": board_files if isinstance(board_files, str) else board.vivado_board_part if board_files else "",
        "timing": timing,
        "STATUS,synth_1": synth_status, "STATUS,impl_1": "write_bitstream Complete!", "PROGRESS": "100%",
        "DIRECTORY": str(run_dir), "STATS.WNS": str(wns), "STATS.WHS": str(whs),
        "CONFIG.PCW_ACT_FPGA0_PERIPHERAL_FREQMHZ": "100.000000",
    }
    for k, v in stubs.items():
        tcl.call("set", f"::stub({k})", v)
    error = None
    try:
        tcl.call("source", str(script))
    except tkinter.TclError as e:
        error = str(e)
    calls = [list(tcl.splitlist(c)) for c in tcl.splitlist(tcl.eval("set ::calls"))]
    out = list(tcl.splitlist(tcl.eval("set ::out")))
    return calls, out, error


def _index(calls, pred, what):
    for i, c in enumerate(calls):
        if pred(c):
            return i
    raise AssertionError(f"no {what} in the recorded commands")


def _dict_settings(calls, cell):
    """Every ``set_property -dict`` applied to ``cell``, merged in order."""
    got = {}
    for c in calls:
        if c[:2] == ["set_property", "-dict"] and c[-1] == cell:
            items = tkinter.Tcl().splitlist(c[2])
            got.update({items[i].removeprefix("CONFIG."): items[i + 1] for i in range(0, len(items), 2)})
    return got


def _connections(calls):
    return [(c[0], c[1:]) for c in calls if c[0] in ("connect_bd_net", "connect_bd_intf_net")]


# --- the script, per board ----------------------------------------------------------------------------------

@pytest.mark.parametrize("board_files", [True, False], ids=["board-files", "no-board-files"])
@pytest.mark.parametrize("name", BOARD_NAMES)
def test_build_tcl_sequence(tmp_path, generated, name, board_files):
    board = get_board(name)
    ps = _PS[board.family]
    _out, verilog, desc = generated
    ports = verilog_top_ports(verilog, TOP_NAME)
    script = _project(tmp_path, generated, name)
    calls, out, error = run_script(script, name, board_files=board_files)
    assert error is None, error

    # part and board
    cp = calls[_index(calls, lambda c: c[0] == "create_project", "create_project")]
    assert cp[cp.index("-part") + 1] == board.part
    set_bp = [c for c in calls if c[:2] == ["set_property", "board_part"]]
    assert set_bp == ([["set_property", "board_part", board.vivado_board_part, ""]] if board_files else [])
    said = {True: "from the board files", False: "explicit values" if board.ps7_config and not
            board.ps_builtin_preset else "preset" if board.ps_builtin_preset else "the PL side only"}[board_files]
    assert any(said in line for line in out), out
    auto = calls[_index(calls, lambda c: c[0] == "apply_bd_automation", "PS block automation")]
    assert auto[auto.index("-rule") + 1] == ps.automation
    conf = tkinter.Tcl().splitlist(auto[auto.index("-config") + 1])
    assert dict(zip(conf[::2], conf[1::2], strict=True))["apply_board_preset"] == ("1" if board_files else "0")

    # cells
    cells = {c[-1]: c for c in calls if c[0] == "create_bd_cell"}
    assert set(cells) == {ps.cell, ACCEL_CELL, DMA_CELL, INTC_CELL, "rst_ps_0", "ps_axi_periph", "axi_mem_intercon"}
    assert cells[ACCEL_CELL][1:] == ["-type", "module", "-reference", TOP_NAME, ACCEL_CELL]
    ps_ip = "xilinx.com:ip:processing_system7:5.5" if board.family == "zynq7" else "xilinx.com:ip:zynq_ultra_ps_e:3.5"
    assert cells[ps.cell][4] == ps_ip  # on the UltraScale+: the newest zynq_ultra_ps_e of this Vivado
    assert "xilinx.com:ip:axi_dma:" in cells[DMA_CELL][4]
    assert "xilinx.com:ip:axi_intc:" in cells[INTC_CELL][4]
    assert "xilinx.com:ip:proc_sys_reset:" in cells["rst_ps_0"][4]
    add = [c for c in calls if c[0] == "add_files"]
    assert Path(add[0][-1]).resolve() == (tmp_path / f"{TOP_NAME}.v").resolve()
    assert _index(calls, lambda c: c[0] == "add_files", "add_files") < _index(
        calls, lambda c: c[-1] == ACCEL_CELL and c[0] == "create_bd_cell", "module reference")

    # PS: the board's explicit values (or the PS's own preset) only without board files; the AXI ports, PL clock 0
    # and the interrupt always
    settings = _dict_settings(calls, ps.cell)
    preset = [c for c in calls if c[:2] == ["set_property", "CONFIG.preset"]]
    assert preset == ([["set_property", "CONFIG.preset", board.ps_builtin_preset, ps.cell]]
                      if board.ps_builtin_preset and not board_files else [])
    explicit = dict(board.ps7_config) if not board.ps_builtin_preset else {}
    for k, v in explicit.items():
        assert (settings.get(k) == v) == (not board_files), k
    if board.ps_builtin_preset:
        assert not set(board.ps7_config) & set(settings) - {"PCW_USE_M_AXI_GP0"}
    if board.family == "zynq7":
        assert float(settings["PCW_FPGA0_PERIPHERAL_FREQMHZ"]) == desc.clock_mhz
        assert settings["PCW_USE_S_AXI_HP0"] == settings["PCW_USE_M_AXI_GP0"] == settings["PCW_EN_CLK0_PORT"] == "1"
        assert settings["PCW_IRQ_F2P_INTR"] == "1"
    else:
        assert float(settings["PSU__CRL_APB__PL0_REF_CTRL__FREQMHZ"]) == desc.clock_mhz
        assert settings["PSU__USE__M_AXI_GP0"] == settings["PSU__USE__S_AXI_GP2"] == "1"
        assert settings["PSU__FPGA_PL0_ENABLE"] == settings["PSU__USE__IRQ0"] == "1"
        assert settings["PSU__USE__M_AXI_GP1"] == "0"  # HPM1_FPD off: its clock pin would be left unconnected

    # DMA: simple mode, 32-bit streams, a length register covering the largest transfer of the description
    dma = _dict_settings(calls, DMA_CELL)
    assert dma["c_include_sg"] == "0"
    assert dma["c_m_axis_mm2s_tdata_width"] == dma["c_s_axis_s2mm_tdata_width"] == "32"
    assert dma["c_addr_width"] == ("32" if board.family == "zynq7" else "64")
    largest = 4 * max([desc.batch_layout.beats + desc.label_layout.beats] + [q.beats for q in desc.quantities])
    assert 2 ** int(dma["c_sg_length_width"]) - 1 >= largest
    assert int(dma["c_sg_length_width"]) == max(DMA_LENGTH_WIDTH_DEFAULT, largest.bit_length())

    # connections: every accelerator pin is a port (or an interface of ports) of the generated Verilog top
    conns = _connections(calls)
    for kind, pins in conns:
        for pin in pins:
            cell, port = pin.split("/")
            if cell != ACCEL_CELL:
                continue
            if kind == "connect_bd_intf_net":
                assert {f"{port}_tdata", f"{port}_tvalid"} <= set(ports) or f"{port}_awaddr" in ports, pin
            else:
                assert port in ports, pin
    intf = {tuple(p) for k, p in conns if k == "connect_bd_intf_net"}
    assert (f"{DMA_CELL}/M_AXIS_MM2S", f"{ACCEL_CELL}/s_axis") in intf
    assert (f"{ACCEL_CELL}/m_axis", f"{DMA_CELL}/S_AXIS_S2MM") in intf
    assert (f"{ps.cell}/{ps.master}", "ps_axi_periph/S00_AXI") in intf
    assert ("ps_axi_periph/M00_AXI", f"{ACCEL_CELL}/s_axi") in intf
    assert ("ps_axi_periph/M01_AXI", f"{DMA_CELL}/S_AXI_LITE") in intf
    assert ("ps_axi_periph/M02_AXI", f"{INTC_CELL}/s_axi") in intf
    assert _dict_settings(calls, "ps_axi_periph")["NUM_MI"] == "3"
    assert ("axi_mem_intercon/M00_AXI", f"{ps.cell}/{ps.slave}") in intf
    assert {(f"{DMA_CELL}/M_AXI_MM2S", "axi_mem_intercon/S00_AXI"),
            (f"{DMA_CELL}/M_AXI_S2MM", "axi_mem_intercon/S01_AXI")} <= intf
    nets = {p[0]: set(p[1:]) for k, p in conns if k == "connect_bd_net"}
    assert f"{ACCEL_CELL}/clk" in nets[f"{ps.cell}/{ps.clk}"]
    assert nets["rst_ps_0/peripheral_reset"] == {f"{ACCEL_CELL}/rst"}  # active high, like the Verilog's rst
    # the interrupt reaches the PS through the AXI interrupt controller (where pynq looks for it)
    assert nets[f"{ACCEL_CELL}/irq"] == {f"{INTC_CELL}/intr"}
    assert nets[f"{INTC_CELL}/irq"] == {f"{ps.cell}/{ps.irq}"}
    assert not any(f"{ps.cell}/{ps.irq}" in pins for src, pins in nets.items() if src != f"{INTC_CELL}/irq")
    clocked = {p.split("/")[1] for p in nets[f"{ps.cell}/{ps.clk}"]}
    assert {*ps.aclks, "s_axi_lite_aclk", "m_axi_mm2s_aclk", "m_axi_s2mm_aclk", "slowest_sync_clk"} <= clocked
    assert f"{INTC_CELL}/s_axi_aclk" in nets[f"{ps.cell}/{ps.clk}"]
    assert f"{INTC_CELL}/s_axi_aresetn" in nets["rst_ps_0/peripheral_aresetn"]

    # order: connections, addresses, validation, wrapper, synthesis, implementation, reports, outputs
    last_conn = max(i for i, c in enumerate(calls) if c[0].startswith("connect_bd"))
    order = [_index(calls, lambda c, w=w: c[:len(w)] == w, " ".join(w)) for w in
             (["assign_bd_address"], ["validate_bd_design"], ["make_wrapper"], ["launch_runs", "synth_1"],
              ["wait_on_run", "synth_1"], ["launch_runs", "impl_1"], ["wait_on_run", "impl_1"],
              ["report_utilization"], ["report_timing_summary"], ["report_power"])]
    assert last_conn < order[0] and order == sorted(order)
    assert ["get_property", "STATUS", "synth_1"] in calls and ["get_property", "STATUS", "impl_1"] in calls
    launch = calls[order[5]]
    assert launch[launch.index("-to_step") + 1] == "write_bitstream"
    folder = script.parent
    assert (folder / f"{BITSTREAM_STEM}.bit").read_bytes() == b"BIT"
    assert (folder / f"{BITSTREAM_STEM}.hwh").read_text() == "<HWH/>"


def _nets(calls):
    return {p[0]: set(p[1:]) for k, p in _connections(calls) if k == "connect_bd_net"}


def test_zedboard_probes_both_board_part_names(tmp_path, generated):
    """Older board stores name the ZedBoard em.avnet.com:zed:part0:1.x: found, and the newest one used."""
    script = _project(tmp_path, generated, "zedboard")
    calls, out, error = run_script(script, "zedboard", board_files="em.avnet.com:zed:part0:1.2 "
                                   "em.avnet.com:zed:part0:1.3 digilentinc.com:zybo:part0:1.0")
    assert error is None, error
    assert ["set_property", "board_part", "em.avnet.com:zed:part0:1.3", ""] in calls
    probed = [c[-1] for c in calls if c[0] == "get_board_parts"]
    assert probed == ["avnet.com:zedboard:part0:1.4", "em.avnet.com:zed:part0:*"]
    assert not any(c[:2] == ["set_property", "CONFIG.preset"] for c in calls)


def test_pynq_z2_without_board_files_takes_tuls_ddr_and_mio(tmp_path, generated):
    """The PYNQ-Z2's fallback is its board file's (XilinxBoardStore boards/TUL/pynq-z2/A.0/preset.xml), not the
    PYNQ-Z1's DDR part with Vivado's default timings."""
    script = _project(tmp_path, generated, "pynq-z2")
    calls, _out, error = run_script(script, "pynq-z2", board_files=False)
    assert error is None, error
    ps7 = _dict_settings(calls, "processing_system7_0")
    assert ps7["PCW_UIPARAM_DDR_PARTNO"] == "MT41J256M16 RE-125"
    assert ps7["PCW_UIPARAM_DDR_SPEED_BIN"] == "DDR3_1066F"
    assert (ps7["PCW_UIPARAM_DDR_CL"], ps7["PCW_UIPARAM_DDR_CWL"]) == ("7", "6")
    assert [ps7[f"PCW_UIPARAM_DDR_BOARD_DELAY{i}"] for i in range(4)] == ["0.279", "0.260", "0.085", "0.092"]
    assert ps7["PCW_QSPI_GRP_FBCLK_IO"] == "MIO 8" and ps7["PCW_ENET0_RESET_IO"] == "MIO 9"
    (tmp_path / "z1").mkdir()
    z1_calls = run_script(_project(tmp_path / "z1", generated, "pynq-z1"), "pynq-z1", board_files=False)[0]
    assert _dict_settings(z1_calls, "processing_system7_0")["PCW_UIPARAM_DDR_PARTNO"] == "MT41K256M16 RE-125"


def test_board_repo_is_searched_before_the_project(tmp_path, generated):
    repo = tmp_path / "board_files"
    repo.mkdir()
    script = _project(tmp_path, generated, "kv260", board_repo=str(repo))
    calls, out, error = run_script(script, "kv260", board_files=True)
    assert error is None, error
    i = _index(calls, lambda c: c[:2] == ["set_param", "board.repoPaths"], "set_param board.repoPaths")
    assert i < _index(calls, lambda c: c[0] == "create_project", "create_project")
    assert str(repo) in calls[i][2]
    (tmp_path / "none").mkdir()
    plain = run_script(_project(tmp_path / "none", generated, "kv260"), "kv260", board_files=True)[0]
    assert not any(c[0] == "set_param" for c in plain)


@pytest.mark.parametrize("wns,whs,figure", [(-0.321, 0.05, "WNS -0.321"), (0.5, -0.012, "WHS -0.012")])
def test_build_tcl_fails_when_timing_is_not_met(tmp_path, generated, wns, whs, figure):
    script = _project(tmp_path, generated, "pynq-z2")
    calls, _out, error = run_script(script, "pynq-z2", board_files=True, wns=wns, whs=whs, timing=TIMING_FAILED)
    assert error is not None and "timing not met" in error and figure in error
    assert ["report_timing_summary"] == calls[_index(calls, lambda c: c[0] == "report_timing_summary", "rpt")][:1]
    assert not (script.parent / f"{BITSTREAM_STEM}.bit").exists()  # no overlay from a failed build


@pytest.mark.parametrize("clock,wns,meet", [(100.0, -2.5, 80.0), (100.0, -0.321, 96.8), (150.0, -1.0, 130.4)])
def test_failed_timing_names_the_clock_that_meets_and_the_command(tmp_path, generated, clock, wns, meet):
    """1000 / (1000/F - WNS), rounded down to 0.1 MHz, and the generate command to rebuild at it."""
    cmd = "xnortrain generate --config build/z2/config.toml --board pynq-z2 --out build/z2 --force"
    script = _project(tmp_path, generated, "pynq-z2", clock_mhz=clock, rebuild_command=cmd)
    _calls, _out, error = run_script(script, "pynq-z2", board_files=True, wns=wns, timing=TIMING_FAILED)
    assert error is not None
    assert f"timing not met at {clock:g} MHz" in error
    assert f"would meet at {meet:.1f} MHz: rebuild with `{cmd} --clock-mhz {meet:.1f}`" in error
    assert meet <= 1000 / (1000 / clock - wns) < meet + 0.1


def test_pulse_width_or_any_unmet_constraint_stops_the_build(tmp_path, generated):
    """WNS and WHS positive, but Vivado does not say every user constraint is met (pulse width, as PYNQ's
    check_timing.tcl checks): no overlay."""
    script = _project(tmp_path, generated, "zcu104")
    _calls, _out, error = run_script(script, "zcu104", board_files=False, wns=0.2, whs=0.01, timing=TIMING_FAILED)
    assert error is not None and "pulse-width" in error
    assert not (script.parent / f"{BITSTREAM_STEM}.bit").exists()


def test_build_tcl_stops_on_a_failed_run(tmp_path, generated):
    script = _project(tmp_path, generated, "zedboard")
    calls, _out, error = run_script(script, "zedboard", board_files=False, synth_status="synth_design ERROR")
    assert error is not None and "synth_1" in error and "synth_design ERROR" in error
    assert not any(c[:2] == ["launch_runs", "impl_1"] for c in calls)


def test_build_tcl_refuses_missing_verilog(tmp_path, generated):
    script = _project(tmp_path, generated, "pynq-z1")
    (tmp_path / f"{TOP_NAME}.v").unlink()
    calls, _out, error = run_script(script, "pynq-z1", board_files=True, fake_outputs=False)
    assert error is not None and f"{TOP_NAME}.v" in error and "missing" in error
    assert not any(c[0] == "create_project" for c in calls)


# --- the generated Verilog carries the interface attributes -------------------------------------------------

def test_top_ports_carry_xilinx_interface_attributes(generated):
    _out, verilog, _desc = generated
    top = re.search(rf"^module {TOP_NAME}\(.*?^endmodule", verilog, re.M | re.S).group(0)
    ports = verilog_top_ports(verilog, TOP_NAME)
    for port, attrs in PORT_ATTRS.items():
        m = re.search(rf"((?:^\s*\(\*[^\n]*\*\)\s*\n)+)\s*(?:input|output) {port};", top, re.M)
        assert m, f"no attributes on port {port}"
        for key, value in attrs.items():
            assert f'(* {key} = "{value}" *)' in m.group(1), (port, key)
    # the names inside the attributes are real interfaces and ports of the top
    busif = PORT_ATTRS["clk"]["X_INTERFACE_PARAMETER"].split("ASSOCIATED_BUSIF ")[1].split(",")[0].split(":")
    for bus in busif:
        assert any(p.startswith(f"{bus}_t" if bus.endswith("axis") else f"{bus}_aw") for p in ports), bus
    assert ports["rst"] == "input" and ports["clk"] == "input" and ports["irq"] == "output"


# --- DMA sizing -----------------------------------------------------------------------------------------------

def test_paper_preset_dma_width_covers_its_largest_transfer():
    from rtl_gen.top import SystemPlan

    desc = SystemPlan(paper_cfg()).description()  # no elaboration
    s = dma_sizing(desc)
    # the paper's MLP: layer 0 is 784 x 256; its accumulators (the largest quantity) and weights must pass
    transfers = [4 * q.beats for q in desc.quantities] + [4 * (desc.batch_layout.beats + desc.label_layout.beats)]
    assert max(transfers) <= s.max_bytes
    assert 784 * 256 // 8 <= s.max_bytes  # one layer's binary weights, above the DMA's 14-bit default
    assert s.length_width > DMA_LENGTH_WIDTH_DEFAULT
    assert max(transfers) > (1 << (s.length_width - 1)) - 1  # the smallest width that covers it


def test_dma_sizing_refuses_a_transfer_over_26_bits():
    from types import SimpleNamespace as NS

    def desc(words, access):
        return NS(batch_layout=NS(beats=10), label_layout=NS(beats=1), quantities=[NS(beats=words, access=access)])

    assert dma_sizing(desc((1 << 24) - 1, "rw")).length_width == 26  # 64 MiB - 4 bytes: the most the DMA moves
    assert dma_sizing(desc(1 << 20, "ro")).send_bytes == 44  # a read-back is no MM2S transfer
    for access in ("rw", "ro", "wo"):
        with pytest.raises(VivadoBuildError, match="67,108,864 bytes"):
            dma_sizing(desc(1 << 24, access))  # 64 MiB


# --- Makefile -------------------------------------------------------------------------------------------------

def test_makefile_without_vivado_says_what_to_install(tmp_path, generated):
    script = _project(tmp_path, generated, "pynq-z2")
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    assert shutil.which("vivado", path=env["PATH"]) is None
    r = subprocess.run(["make", "-C", str(script.parent)], env=env, capture_output=True, text=True)
    assert r.returncode != 0
    assert "Vivado" in r.stderr and "settings64.sh" in r.stderr
    assert "vivado -mode batch" in r.stderr and "-source build.tcl" in r.stderr


def test_makefile_runs_vivado_in_batch_mode(tmp_path, generated):
    script = _project(tmp_path, generated, "zedboard")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "vivado"
    fake.write_text('#!/bin/sh\necho "$PWD" "$@" > "$XNT_FAKE_LOG"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "vivado_args.txt"
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "XNT_FAKE_LOG": str(log)}
    r = subprocess.run(["make", "-C", str(script.parent)], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    cwd, *args = log.read_text().split()
    assert Path(cwd).resolve() == script.parent.resolve()
    assert args[:2] == ["-mode", "batch"] and args[-2:] == ["-source", "build.tcl"]


# --- the CLI --------------------------------------------------------------------------------------------------

def test_cli_generate_board_option():
    from host.cli import make_parser

    p = make_parser()
    for name in BOARD_NAMES:
        assert p.parse_args(["generate", "--model", "mlp", "--out", "x", "--board", name]).board == name
    args = p.parse_args(["generate", "--model", "mlp", "--out", "x", "--board", "kv260", "--board-repo", "B",
                         "--clock-mhz", "80.5"])
    assert (args.board_repo, args.clock_mhz) == ("B", 80.5)
    assert set(BOARD_NAMES) == set(BOARDS)
    with pytest.raises(SystemExit) as e:
        p.parse_args(["generate", "--model", "mlp", "--out", "x", "--board", "arty"])
    assert e.value.code == 2


def test_generate_writes_the_vivado_folder(generated):
    out, _verilog, _desc = generated
    tcl = (out / "vivado" / "build.tcl").read_text()
    assert "xc7z020clg400-1" in tcl and f"../{TOP_NAME}.v" in tcl
    assert (out / "vivado" / "Makefile").is_file()
