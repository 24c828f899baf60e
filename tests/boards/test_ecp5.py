"""boards.ecp5: the ECP5 place-and-route proxy (yosys synth_ecp5, nextpnr-ecp5, ecppack) and generate --board ulx3s-85f.

Report parsing, the fit check and the refusal run without any tool (a fake run_yowasp refuses to place and route);
one test runs the real flow end to end on a small XNOR engine (~25 s warm)."""

import json

import pytest

import rtl_gen.toolchain as toolchain
from boards import ecp5
from boards.ecp5 import (
    ULX3S_85F,
    check_ecp5_fit,
    lpf_text,
    parse_nextpnr_report,
    port_bits,
    run_ecp5,
    synth_resources,
)
from rtl_gen.synth import DoesNotFitError
from rtl_gen.toolchain import to_verilog

CLK = "$glbnet$clk$TRELLIS_IO_IN"

#: a small MLP (784-12-10, batch 4) that elaborates in seconds
SMALL_MLP = ["model.input_format=binary", "train.batch_size=4",
             'model.layers=[{type="dense",units=12},{type="dense",units=10}]', "hw.lanes_in=32", "hw.lanes_out=8",
             "hw.lanes_b=2", "hw.update_lanes=8", "hw.dw_passes=4", "hw.dx_passes=2"]


def _step(kind, cell, port, delay, net=None, src=("a", "Q")):
    return {"type": kind, "from": {"cell": src[0], "port": src[1]}, "to": {"cell": cell, "port": port},
            "delay": delay, "net": net}


def _report(achieved=143.2, used_io=40):
    """A nextpnr --report in the shape nextpnr-ecp5 0.11 writes (keys, nesting, clock names)."""
    return {
        "fmax": {CLK: {"achieved": achieved, "constraint": 100}},
        "utilization": {
            "TRELLIS_COMB": {"available": 83640, "used": 1200},
            "TRELLIS_FF": {"available": 83640, "used": 900},
            "DP16KD": {"available": 208, "used": 12},
            "MULT18X18D": {"available": 156, "used": 3},
            "TRELLIS_IO": {"available": 365, "used": used_io},
            "DCCA": {"available": 56, "used": 1},
        },
        "critical_paths": [
            {"from": "<async>", "to": "<async>",
             "path": [_step("source", "in$tr_io", "O", 0.0), _step("routing", "lut", "D", 9.0, "n"),
                      _step("logic", "lut", "F", 0.2)]},
            {"from": f"posedge {CLK}", "to": f"posedge {CLK}",
             "path": [_step("clk-to-q", "r0", "Q", 0.5), _step("routing", "l1", "A", 1.25, "n0"),
                      _step("logic", "l1", "F", 0.25), _step("routing", "l2", "B", 2.0, "n1"),
                      _step("logic", "l2", "F", 0.25), _step("routing", "r1", "M", 1.5, "n2"),
                      _step("setup", "r1", "M", 0.25)]},
        ],
    }


def test_parse_report_fmax_utilisation_and_the_clocks_critical_path():
    fmax, util, cp = parse_nextpnr_report(_report(), io_pins=205)
    assert fmax == {CLK: {"achieved": 143.2, "constraint": 100.0}}
    assert util["LUT4"] == {"used": 1200, "available": 83640}
    assert util["FF"]["used"] == 900 and util["EBR"]["used"] == 12 and util["MULT18"]["used"] == 3
    assert util["IO"] == {"used": 40, "available": 205}  # the package's pins, not the die's 365 pads
    # the clock-to-clock path, not the longer unclocked one
    assert cp["clock_from"] == f"posedge {CLK}"
    assert cp["from"] == "a.Q" and cp["to"] == "r1.M"
    assert cp["delay_ns"] == pytest.approx(6.0)
    assert cp["logic_ns"] == pytest.approx(1.25) and cp["routing_ns"] == pytest.approx(4.75)
    assert cp["levels"] == 2
    assert [s["cell"] for s in cp["steps"]] == ["r0", "l1", "l1", "l2", "l2", "r1", "r1"]


def test_parse_report_without_paths_or_clocks():
    data = _report()
    data["critical_paths"] = []
    del data["fmax"]
    fmax, util, cp = parse_nextpnr_report(data)
    assert fmax == {} and cp is None
    assert util["IO"]["available"] == 365


def test_synth_resources_weights_and_ports():
    res = synth_resources({"LUT4": 10, "CCU2C": 3, "TRELLIS_DPR16X4": 2, "TRELLIS_FF": 7, "DP16KD": 4,
                           "MULT18X18D": 1, "VHI": 1})
    assert res["LUT4"] == 10 + 2 * 3 + 6 * 2
    assert (res["FF"], res["EBR"], res["MULT18"], res["other"]) == (7, 4, 1, 1)
    text = "module t(a, b, c);\n  input clk;\n  input [31:0] a;\n  output [0:3] b;\n  output c;\nendmodule\n"
    assert port_bits(text, "t") == 1 + 32 + 4 + 1
    with pytest.raises(ValueError, match="'u' is not defined"):
        port_bits(text, "u")


def test_fit_check_names_every_resource_over_the_limit():
    limits = ULX3S_85F.limits
    assert limits == {"LUT4": 83_640, "FF": 83_640, "EBR": 208, "MULT18": 156, "IO": 205}
    assert check_ecp5_fit({"LUT4": 83_640, "EBR": 208, "IO": 205}, limits, what="x") == []
    problems = check_ecp5_fit({"LUT4": 90_000, "EBR": 290, "MULT18": 156, "IO": 300}, limits, what="x")
    assert problems == ["LUT4: needs 90,000 of 83,640 (+6,360, 108 %)", "EBR: needs 290 of 208 (+82, 139 %)",
                        "IO: needs 300 of 205 (+95, 146 %)"]


def test_lpf_places_only_the_clock():
    text = lpf_text(ULX3S_85F)
    assert 'LOCATE COMP "clk" SITE "G2";' in text
    assert text.count("LOCATE") == 1


def _fake_yosys(cells, calls):
    """A run_yowasp that plays yosys (writes design.json and stats.json with ``cells``) and fails the test if any
    other tool is asked for."""
    def run(tool, args, *, cwd, capture=True, check=True):
        calls.append(tool)
        assert tool == "yosys", f"{tool} ran although the design does not fit"
        (cwd / "design.json").write_text("{}")
        (cwd / "stats.json").write_text(json.dumps({"design": {"num_cells_by_type": cells}}))
        import subprocess

        return subprocess.CompletedProcess([tool], 0, "", "")
    return run


def test_refuses_before_place_and_route(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(toolchain, "run_yowasp", _fake_yosys({"LUT4": 1000, "DP16KD": 300, "MULT18X18D": 200}, calls))
    verilog = "module big(clk, d, q);\n  input clk;\n  input [299:0] d;\n  output q;\nendmodule\n"
    with pytest.raises(DoesNotFitError) as info:
        run_ecp5(verilog, "big", workdir=tmp_path / "w", freq_mhz=100)
    msg = str(info.value)
    assert "big does not fit the LFE5U-85F (CABGA381)" in msg
    assert "EBR: needs 300 of 208" in msg and "MULT18: needs 200 of 156" in msg and "IO: needs 302 of 205" in msg
    assert "LUT4" not in msg
    assert calls == ["yosys"]


@pytest.mark.rtl  # elaborates a small accelerator (~10 s)
def test_generate_ulx3s_refuses_with_exit_3_and_a_report(tmp_path, monkeypatch, capsys):
    from host.cli import main
    from host.common import EXIT_DOES_NOT_FIT
    monkeypatch.setenv("XNORTRAIN_BUILD_DIR", str(tmp_path / "build"))
    calls = []
    monkeypatch.setattr(toolchain, "run_yowasp", _fake_yosys({"LUT4": 90_000, "DP16KD": 12}, calls))
    out = tmp_path / "acc"
    args = ["generate", "--model", "mlp", *[a for s in SMALL_MLP for a in ("--set", s)], "--board", "ulx3s-85f",
            "--out", str(out)]
    assert main(args) == EXIT_DOES_NOT_FIT
    rep = json.loads((out / "report.json").read_text())
    assert rep["fits"] is False and rep["device"] == "LFE5U-85F"
    assert rep["overflows"] == ["LUT4: needs 90,000 of 83,640 (+6,360, 108 %)"]
    assert "DOES NOT FIT the LFE5U-85F" in capsys.readouterr().out
    assert not (out / "ecp5" / "xnortrain.bit").exists()
    assert calls == ["yosys"]


def test_runs_on_one_work_folder_take_turns(tmp_path, monkeypatch):
    """Two runs of the same design in one work folder at once (two commands, two test workers): the second waits
    for the first and takes its cached netlist; yosys runs once and nobody reads a half-written design.json."""
    import threading
    import time

    calls = []
    fake = _fake_yosys({"LUT4": 1000}, calls)

    def slow(tool, args, *, cwd, capture=True, check=True):
        time.sleep(0.5)  # the first run is still synthesising when the second starts
        return fake(tool, args, cwd=cwd, capture=capture, check=check)

    monkeypatch.setattr(toolchain, "run_yowasp", slow)
    verilog = "module m(clk, q);\n  input clk;\n  output q;\nendmodule\n"
    reps = []
    runs = [threading.Thread(target=lambda: reps.append(run_ecp5(verilog, "m", workdir=tmp_path / "w", place=False)))
            for _ in range(2)]
    for t in runs:
        t.start()
        time.sleep(0.1)
    for t in runs:
        t.join()
    assert calls == ["yosys"]
    assert sorted(r.cached for r in reps) == [False, True]


def test_run_rejects_bad_options(tmp_path):
    v = "module m(clk);\n  input clk;\nendmodule\n"
    with pytest.raises(ValueError, match="freq_mhz 0"):
        run_ecp5(v, "m", workdir=tmp_path, freq_mhz=0)
    with pytest.raises(ValueError, match="no bitstream"):
        run_ecp5(v, "m", workdir=tmp_path, out_of_context=True, bitstream=True)
    with pytest.raises(ValueError, match="unknown ECP5 board 'ulx3s-12f'"):
        run_ecp5(v, "m", workdir=tmp_path, board="ulx3s-12f")
    with pytest.raises(ValueError, match="router 'router3': expected one of router1, router2"):
        run_ecp5(v, "m", workdir=tmp_path, router="router3")


def test_generate_refuses_nextpnr_seeds_without_the_ecp5_flow(tmp_path):
    """--pnr-seed is for --board ulx3s-85f with synthesis: refused (before elaboration) elsewhere."""
    from pathlib import Path

    from host.generate import generate
    from sim.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "timing_small.toml")
    for kw in ({}, {"board": "pynq-z2"}, {"board": "ulx3s-85f", "synth": False}):
        with pytest.raises(ValueError, match="--pnr-seed 1, 2: nextpnr seeds are for the ECP5"):
            generate(cfg, tmp_path / "acc", seeds=[1, 2], log=lambda _m: None, **kw)
    with pytest.raises(ValueError, match="--pnr-seed must be whole numbers >= 1"):
        generate(cfg, tmp_path / "acc", board="ulx3s-85f", seeds=[0], log=lambda _m: None)
    assert not (tmp_path / "acc").exists()


def test_real_flow_on_a_small_xnor_engine(tmp_path, monkeypatch):
    """yosys synth_ecp5 -> nextpnr-ecp5 -> ecppack on a 32x8 XNOR engine: a bitstream for the 85k die, an Fmax,
    and utilisation that agrees with the synthesised netlist."""
    from rtl_gen.xnor_engine import XnorEngine

    verilog = to_verilog(XnorEngine(n_in=32, n_out=8, lanes_in=8, lanes_out=2), "xnor_small")
    rep = run_ecp5(verilog, "xnor_small", workdir=tmp_path / "w", freq_mhz=50)
    assert not rep.cached
    assert rep.fmax_mhz is not None and 50 < rep.fmax_mhz < 500 and rep.timing_met
    assert set(rep.elapsed_s) == {"synth", "pnr", "pack"}
    u = rep.utilisation
    assert u["IO"]["used"] == port_bits(verilog, "xnor_small") and u["IO"]["available"] == 205
    assert 0 < rep.synth["LUT4"] <= u["LUT4"]["used"] <= 2 * rep.synth["LUT4"]
    assert u["FF"]["used"] == rep.synth["FF"] > 0
    assert u["EBR"]["used"] == 0 and u["MULT18"]["used"] == 0
    cp = rep.critical_path
    assert cp["clock_from"].startswith("posedge") and cp["levels"] >= 1
    assert cp["delay_ns"] == pytest.approx(1000 / rep.fmax_mhz, rel=0.02)
    bit = rep.bitstream.read_bytes()
    assert b"\xff\xff\xbd\xb3" in bit[:4096]  # ECP5 preamble
    assert b"\x41\x11\x30\x43" in bit[:4096]  # IDCODE of the LFE5U-85F
    text = rep.format_text()
    assert "timing proxy for another family" in text and "Fmax" in text
    again = run_ecp5(verilog, "xnor_small", workdir=tmp_path / "w", freq_mhz=50)
    assert again.cached and again.fmax_mhz == rep.fmax_mhz
    assert ecp5.BOARDS["ulx3s-85f"] is ULX3S_85F


def test_the_global_buffer_becomes_a_dcca_on_the_ecp5(tmp_path):
    """The pass-through module of the generated Verilog (boards/primitives.py) is read over by a DCCA in the ECP5
    flow: its output drives the flip-flops' synchronous resets from a clock network, and the design places,
    routes and packs. Other families' versions are a wire; an unknown family is refused by name."""
    from boards.primitives import GLOBAL_BUFFER, global_buffer_verilog

    verilog = "\n".join([
        "module gbuf_demo(input clk, input a, input [15:0] d, output [15:0] q);",
        "  reg r = 1'b1; wire r_g; reg [15:0] s [0:7];",
        "  always @(posedge clk) r <= a;",
        f"  {GLOBAL_BUFFER} buffer (.i(r), .o(r_g));",
        "  genvar k;",
        "  generate for (k = 0; k < 8; k = k + 1) begin : g",
        "    always @(posedge clk) if (r_g) s[k] <= 16'd0; else s[k] <= (k == 0 ? d : s[k - 1]) + 16'd1;",
        "  end endgenerate",
        "  assign q = s[7];",
        "endmodule",
        global_buffer_verilog(),
    ])
    assert "assign o = i;" in global_buffer_verilog() and "DCCA" in global_buffer_verilog("ecp5")
    with pytest.raises(ValueError, match="no global buffer for the family 'xc7'"):
        global_buffer_verilog("xc7")
    rep = run_ecp5(verilog, "gbuf_demo", workdir=tmp_path / "w", freq_mhz=50)
    assert rep.fmax_mhz is not None and rep.bitstream.exists()
    cells = json.loads((rep.workdir / "design.json").read_text())["modules"]["gbuf_demo"]["cells"]
    dcca = [c for c in cells.values() if c["type"] == "DCCA"]
    assert len(dcca) == 1
    out = dcca[0]["connections"]["CLKO"]
    lsr = [c for c in cells.values() if c["type"] == "TRELLIS_FF" and c["connections"]["LSR"] == out]
    assert len(lsr) == 8 * 16


def test_units_run_out_of_context_one_folder_each(tmp_path, monkeypatch):
    """run_ecp5_units: one cached out-of-context run per direct submodule, named by the submodule (fake tools)."""
    from boards.ecp5 import run_ecp5_units

    monkeypatch.setenv("XNORTRAIN_BUILD_DIR", str(tmp_path / "build"))
    seen = []

    def run(tool, args, *, cwd, capture=True, check=True):
        import subprocess

        seen.append((tool, cwd.name, "--out-of-context" in args, "--textcfg" in args))
        if tool == "yosys":
            (cwd / "design.json").write_text("{}")
            (cwd / "stats.json").write_text(json.dumps({"design": {"num_cells_by_type": {"LUT4": 5}}}))
        else:
            (cwd / "pnr.json").write_text(json.dumps(_report(achieved=90.0)))
        return subprocess.CompletedProcess([tool], 0, "", "")

    monkeypatch.setattr(toolchain, "run_yowasp", run)
    verilog = "".join(
        f"module {name}(clk, o);\n  input clk;\n  output [511:0] o;\nendmodule\n"
        for name in ("top", "top.alpha", "top.alpha.inner", "top.beta"))
    reps = dict(run_ecp5_units(verilog, "top", freq_mhz=100))
    assert list(reps) == ["alpha", "beta"]
    assert all(r.out_of_context and r.bitstream is None and r.synth["IO"] == 0 for r in reps.values())
    assert reps["alpha"].top == "alpha" and reps["alpha"].fmax_mhz == 90.0 and not reps["alpha"].timing_met
    assert [(t, ooc, cfg) for t, _, ooc, cfg in seen] == [("yosys", False, False), ("nextpnr-ecp5", True, False)] * 2
    assert len({folder for _, folder, _, _ in seen}) == 2
    assert "inner" in (reps["alpha"].workdir / "design.v").read_text()  # a unit brings its own submodules
    seen.clear()
    again = dict(run_ecp5_units(verilog, "top", freq_mhz=100))
    assert seen == [] and all(r.cached for r in again.values())


def test_nextpnr_utilisation_overflow_becomes_a_fit_refusal():
    from boards.ecp5 import _log_overflows

    log = ["Info: Device utilisation:", "Info: \t          TRELLIS_IO:     185/    365    50%",
           "Info: \t              DP16KD:     230/    208   110%",
           "Info: \t        TRELLIS_COMB:   49152/  83640    58%"]
    assert _log_overflows(log, ULX3S_85F) == ["EBR: needs 230 of 208 (+22, 111 %)"]
    log[1] = "Info: \t          TRELLIS_IO:     210/    365    57%"  # over the package's 205 pins, under the die's pads
    assert _log_overflows(log, ULX3S_85F) == ["IO: needs 210 of 205 (+5, 102 %)", "EBR: needs 230 of 208 (+22, 111 %)"]


@pytest.mark.rtl  # elaborates a small accelerator (~10 s)
def test_generate_ulx3s_report_and_bitstream(tmp_path, monkeypatch, capsys):
    """generate --board ulx3s-85f with stand-in tools: report.json's ecp5 block, the printed proxy label, the
    bitstream and logs copied to DIR/ecp5, the requested clock = the description's, no xc7 estimate; with two
    nextpnr seeds (--pnr-seed) the lowest Fmax is report.json's fmax_mhz, priced in images per second beside the
    cycles per image, and its bitstream is the one copied."""
    from host.cli import EXIT_OK, main

    monkeypatch.setenv("XNORTRAIN_BUILD_DIR", str(tmp_path / "build"))
    calls = []

    def run(tool, args, *, cwd, capture=True, check=True):
        import subprocess

        calls.append(tool)
        if tool == "yosys":
            (cwd / "design.json").write_text("{}")
            (cwd / "stats.json").write_text(json.dumps({"design": {"num_cells_by_type": {"LUT4": 900}}}))
        elif tool == "nextpnr-ecp5":
            assert args[args.index("--freq") + 1] == "100" and ("--lpf" in args) != ("--out-of-context" in args)
            assert args[args.index("--router") + 1] == "router2"
            seed = int(args[args.index("--seed") + 1])
            (cwd / "pnr.json").write_text(json.dumps(_report(achieved={1: 61.5, 2: 58.25}[seed], used_io=185)))
            (cwd / "design.config").write_text(f".device LFE5U-85F seed {seed}\n")
        else:
            assert tool == "ecppack"
            (cwd / "xnortrain.bit").write_bytes(b"\xff\x00bit" + (cwd / "design.config").read_bytes()[-2:-1])
        return subprocess.CompletedProcess([tool], 0, "", "")

    monkeypatch.setattr(toolchain, "run_yowasp", run)
    out = tmp_path / "acc"
    args = ["generate", "--model", "mlp", *[a for s in SMALL_MLP for a in ("--set", s)], "--board", "ulx3s-85f",
            "--out", str(out), "--synth-by-unit", "--pnr-seed", "1", "--pnr-seed", "2"]
    assert main(args) == EXIT_OK
    assert calls[:5] == ["yosys", "nextpnr-ecp5", "ecppack", "nextpnr-ecp5", "ecppack"]  # seed 2: the same netlist
    assert calls[5:] == ["yosys", "nextpnr-ecp5"] * ((len(calls) - 5) // 2)  # units: out of context, no bitstream
    rep = json.loads((out / "report.json").read_text())
    e = rep["ecp5"]
    assert rep["fits"] is True and rep["device"] == "LFE5U-85F" and "resources" not in rep
    assert e["fmax_mhz"] == 58.25 and e["freq_mhz"] == 100.0 and e["timing_met"] is False
    assert e["seeds"] == {"1": 61.5, "2": 58.25} and e["seed"] == 2 and e["router"] == "router2"
    thr = rep["throughput"]
    assert rep["fmax_mhz"] == thr["fmax_mhz"] == 58.25 and thr["clock_mhz"] == 100.0
    assert thr["images_per_s_at_fmax"] == pytest.approx(58.25e6 / rep["cycles"]["per_image"], rel=1e-4)
    assert f"{thr['images_per_s_at_fmax']:,.0f} images per second" in (out / "report.txt").read_text()
    assert e["utilisation"]["IO"] == {"used": 185, "available": 205}
    assert e["utilisation"]["LUT4"]["used"] == 1200 and e["synth_resources"]["LUT4"] == 900
    assert "another family" in e["note"] and e["critical_path"]["to"] == "r1.M"
    assert e["bitstream"] == str(out / "ecp5" / "xnortrain.bit")
    assert (out / "ecp5" / "xnortrain.bit").read_bytes() == b"\xff\x00bit2"  # the lowest seed's
    assert (out / "ecp5" / "pins.lpf").is_file()
    text = (out / "report.txt").read_text()
    assert "Fmax 58.2 MHz (requested 100 MHz: NOT met)" in text and "timing proxy for another family" in text
    assert "the lowest of seeds 1, 2" in capsys.readouterr().out
    units = e["units"]
    assert {"engine0", "engine1", "csr", "wmem0", "bn_param0_1"} <= set(units) and len(calls) == 5 + 2 * len(units)
    assert all(u["out_of_context"] and u["fmax_mhz"] == 61.5 for u in units.values())
    assert "units out of context" in text and "  engine0" in text


def test_synthesis_only_stops_before_place_and_route(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(toolchain, "run_yowasp", _fake_yosys({"LUT4": 1000, "DP16KD": 20}, calls))
    verilog = "module small(clk, q);\n  input clk;\n  output [7:0] q;\nendmodule\n"
    rep = run_ecp5(verilog, "small", workdir=tmp_path / "w", place=False)
    assert calls == ["yosys"] and rep.fmax_mhz is None and not rep.timing_met
    assert (rep.synth["LUT4"], rep.synth["EBR"], rep.synth["IO"]) == (1000, 20, 9)


def test_large_initial_contents_reach_yosys_as_readmemh_files(tmp_path, monkeypatch):
    """A memory with more initial words than rtl_gen.synth.MEMINIT_FILE_WORDS goes to synth_ecp5 as $readmemh of a
    file (the word-per-line form keeps YoWASP Yosys' reader busy for minutes); a small one stays as it is."""
    from rtl_gen.synth import MEMINIT_FILE_WORDS

    def design(words):
        body = "".join(f"    mem[{i}] = 8'h{i % 251:02x};\n" for i in range(words))
        return ("module rom(clk, a, q);\n  input clk;\n  input [15:0] a;\n  output reg [7:0] q;\n"
                f"  reg [7:0] mem [0:{words - 1}];\n  initial begin\n{body}  end\n"
                "  always @(posedge clk) q <= mem[a];\nendmodule\n")

    calls = []
    monkeypatch.setattr(toolchain, "run_yowasp", _fake_yosys({"LUT4": 10, "DP16KD": 2}, calls))
    big = MEMINIT_FILE_WORDS + 5
    run_ecp5(design(big), "rom", workdir=tmp_path / "big", place=False)
    text = (tmp_path / "big" / "design.v").read_text()
    assert 'initial $readmemh("meminit0.hex", mem);' in text and "mem[3] = " not in text
    words = (tmp_path / "big" / "meminit0.hex").read_text().split()
    assert len(words) == big and [int(w, 16) for w in words[:3]] == [0, 1, 2] and int(words[251], 16) == 0
    run_ecp5(design(100), "rom", workdir=tmp_path / "small", place=False)
    assert "mem[99] = 8'h63;" in (tmp_path / "small" / "design.v").read_text()
    assert not list((tmp_path / "small").glob("meminit*.hex"))


SHELL_DEMO = """module demo(clk, rst, a, b, q, v);
  input clk;
  input rst;
  input [7:0] a;
  input [7:0] b;
  output reg [7:0] q;
  output v;
  always @(posedge clk) q <= rst ? 8'd0 : (a ^ b);
  assign v = ^a;
endmodule
"""


def test_the_ps_shell_keeps_every_port_bit_on_a_flip_flop_of_its_own(tmp_path):
    """The stand-in for the PS: four pins, every input bit from a flip-flop of the input chain, every output bit
    folded into a flip-flop of the output chain, and nothing of the design optimised away (real synth_ecp5)."""
    from boards.ecp5 import PS_CORE, ps_shell_verilog, top_ports

    assert top_ports(SHELL_DEMO, "demo") == [("input", "clk", 1), ("input", "rst", 1), ("input", "a", 8),
                                             ("input", "b", 8), ("output", "q", 8), ("output", "v", 1)]
    text, shell = ps_shell_verilog(SHELL_DEMO, "demo")
    assert shell == "demo_ps_shell" and port_bits(text, shell) == 4
    rep = run_ecp5(SHELL_DEMO, "demo", workdir=tmp_path / "w", place=False, ps_shell=True)
    # 16 input-chain, 9 output-chain and the design's own 8 flip-flops; the IO count is the shell's pins
    assert (rep.synth["FF"], rep.synth["IO"]) == (16 + 9 + 8, 4)
    cells = json.loads((rep.workdir / "design.json").read_text())["modules"][shell]["cells"]
    assert any(name.startswith(PS_CORE + ".") for name in cells)
    with pytest.raises(ValueError, match="no port 'rst'"):
        ps_shell_verilog(SHELL_DEMO.replace("rst", "reset"), "demo")
    with pytest.raises(ValueError, match="out_of_context"):
        run_ecp5(SHELL_DEMO, "demo", workdir=tmp_path / "x", out_of_context=True, bitstream=False, ps_shell=True)
