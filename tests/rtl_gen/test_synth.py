# amaranth: UnusedElaboratable=no
"""rtl_gen.synth: cell -> resource mapping, fit messages, the build-folder cache (Yosys faked), and real
YoWASP ``synth_xilinx`` runs on small Amaranth designs (marked ``synth``)."""

import json
import time
from pathlib import Path

import pytest
from amaranth import Module, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from boards.devices import get_device
from rtl_gen import synth
from rtl_gen.smoke import XnorPopcount
from rtl_gen.synth import DoesNotFitError, SynthError, SynthReport, check_fit, map_cells, synthesize

# --- Mapping and messages on canned numbers (no Yosys) -----------------------------------------------------


CANNED_CELLS = {
    "LUT1": 3,
    "LUT2": 10,
    "LUT3": 20,
    "LUT4": 30,
    "LUT5": 40,
    "LUT6": 50,
    "LUT6_2": 2,
    "FDRE": 100,
    "FDSE": 5,
    "FDCE": 2,
    "FDPE": 1,
    "RAM32M": 2,  # 4 LUTs each
    "RAM64M": 1,  # 4
    "RAM128X1D": 1,  # 4
    "RAM64X1D": 3,  # 2 each
    "SRLC32E": 6,  # 1 each
    "SRL16E": 1,  # 1
    "RAMB36E1": 3,
    "RAMB18E1": 3,
    "DSP48E1": 4,
    "CARRY4": 7,
    "MUXF7": 8,
    "MUXF8": 2,
    "BUFG": 1,
    "FOO42": 9,
}


def test_map_cells():
    res, unmapped = map_cells(CANNED_CELLS)
    assert res["LUT_logic"] == 3 + 10 + 20 + 30 + 40 + 50 + 2
    assert res["LUTRAM"] == 2 * 4 + 4 + 4 + 3 * 2 + 6 + 1
    assert res["LUT"] == res["LUT_logic"] + res["LUTRAM"]
    assert res["FF"] == 108
    assert res["BRAM36"] == 4.5 and res["RAMB36E1"] == 3 and res["RAMB18E1"] == 3
    assert res["DSP"] == 4 and res["CARRY4"] == 7 and res["MUXF7"] == 8 and res["MUXF8"] == 2 and res["BUFG"] == 1
    assert unmapped == {"FOO42": 9}
    assert isinstance(res["FF"], int) and isinstance(res["BRAM36"], float)


def test_map_cells_accepts_escaped_names_and_empty():
    res, unmapped = map_cells({"\\LUT6": 2})
    assert res["LUT"] == 2 and not unmapped
    res, _ = map_cells({})
    assert all(v == 0 for v in res.values())


def test_report_percent_and_fit():
    report = SynthReport.from_cells(CANNED_CELLS, top="canned")
    assert report.device.name == "xc7z020"
    assert report.percent["BRAM36"] == pytest.approx(100 * 4.5 / 140)
    assert report.percent["DSP"] == pytest.approx(100 * 4 / 220)
    assert set(report.percent) == set(get_device("xc7z020").limits)
    assert report.fits and report.overflows() == []
    assert check_fit(report) is report
    d = report.to_dict()
    json.dumps(d)
    assert d["fits"] and d["resources"]["LUT"] == report.resources["LUT"] and d["unmapped"] == {"FOO42": 9}
    text = report.format_text()
    assert "canned on xc7z020" in text and "BRAM36" in text and "fits" in text and "FOO42 9" in text


def test_overflow_messages():
    cells = {"RAMB36E1": 150, "RAMB18E1": 3, "LUT6": 60_000, "DSP48E1": 220, "FDRE": 106_401}
    report = SynthReport.from_cells(cells, top="big")
    assert not report.fits
    messages = report.overflows()
    assert "BRAM36: needs 151.5 of 140 (+11.5, 108 %)" in messages
    assert "LUT: needs 60000 of 53200 (+6800, 113 %)" in messages
    assert "FF: needs 106401 of 106400 (+1, 100.0 %)" in messages  # never a bare "100 %" for an overflow
    assert not any(m.startswith("DSP") for m in messages)  # exactly full still fits
    with pytest.raises(DoesNotFitError, match=r"big does not fit xc7z020: .*BRAM36: needs 151\.5 of 140"):
        check_fit(report)
    assert "DOES NOT FIT" in report.format_text()


def test_ecp5_device_is_not_an_xc7_target():
    with pytest.raises(ValueError, match="family 'ecp5'"):
        synthesize("module t; endmodule", "t", device="LFE5U-85F")
    with pytest.raises(ValueError, match="family must be one of"):
        synthesize("module t; endmodule", "t", family="ice40")


def test_top_must_exist():
    with pytest.raises(ValueError, match="'other' is not defined"):
        synthesize("module top(); endmodule", "other")
    with pytest.raises(ValueError, match="Verilog identifier"):
        synthesize("module top(); endmodule", "../top")


# --- Build folder and cache, with Yosys replaced by a stub ---------------------------------------------------

CANNED_STAT = {
    "creator": "Yosys (stub)",
    "modules": {"\\stub": {"num_cells_by_type": {"LUT4": 5, "FDRE": 3, "RAMB18E1": 1}}},
    "design": {"num_cells_by_type": {"LUT4": 5, "FDRE": 3, "RAMB18E1": 1}},
}


@pytest.fixture
def fake_yosys(monkeypatch):
    calls = []

    def run(tool, args, *, cwd, check=True, capture=True):
        calls.append((tool, list(args), Path(cwd)))
        cwd = Path(cwd)
        assert (cwd / "design.v").is_file() and "synth_xilinx -family xc7 -top stub" in (cwd / "synth.ys").read_text()
        assert not any(a.startswith("/") for a in args)  # YoWASP only sees relative paths
        (cwd / "stats.json").write_text(json.dumps(CANNED_STAT))
        (cwd / "yosys.log").write_text(
            "Warning: something odd\nmapping memory stub.mem via $__XILINX_BLOCKRAM_SDP_\n"
            "using FF mapping for memory stub.tiny\n"
        )

        class Done:
            returncode = 0
            stderr = ""

        return Done()

    monkeypatch.setattr(synth, "run_yowasp", run)
    return calls


def test_cache_by_verilog_hash(tmp_path, monkeypatch, fake_yosys):
    monkeypatch.setenv("XNORTRAIN_BUILD_DIR", str(tmp_path))
    verilog = "module stub(input clk); endmodule\n"
    first = synthesize(verilog, "stub")
    assert not first.cached and len(fake_yosys) == 1
    assert first.workdir.parent == tmp_path / "synth" and first.workdir.name.startswith("stub-")
    assert first.log_path == first.workdir / "yosys.log" and first.stats_path.is_file()
    assert first.resources["LUT"] == 5 and first.resources["BRAM36"] == 0.5
    assert first.warnings == ["Warning: something odd"]
    assert first.memories == {"stub.mem": "BRAM SDP", "stub.tiny": "FF"}

    again = synthesize(verilog, "stub")
    assert again.cached and len(fake_yosys) == 1 and again.workdir == first.workdir
    assert again.resources == first.resources and again.elapsed_s == first.elapsed_s

    changed = synthesize(verilog + "// edit\n", "stub")
    assert not changed.cached and len(fake_yosys) == 2 and changed.workdir != first.workdir


def test_explicit_workdir(tmp_path, fake_yosys):
    report = synthesize("module stub(); endmodule", "stub", workdir=tmp_path / "here")
    assert report.workdir == tmp_path / "here" and fake_yosys[0][2] == tmp_path / "here"


def test_yosys_failure_names_log(tmp_path, monkeypatch):
    def run(tool, args, *, cwd, check=True, capture=True):
        (Path(cwd) / "yosys.log").write_text("ERROR: Module `stub' not found!\n")

        class Failed:
            returncode = 1
            stderr = ""

        return Failed()

    monkeypatch.setattr(synth, "run_yowasp", run)
    with pytest.raises(SynthError, match=r"(?s)yosys\.log.*Module `stub' not found"):
        synthesize("module stub(); endmodule", "stub", workdir=tmp_path)


# --- Real synthesis (YoWASP Yosys; ~15-30 s per design on 2 cores, instant when cached) ----------------------


class MemMulBlock(wiring.Component):
    """Two block-RAM-sized memories with synchronous reads (one transparent, one not) and a multiplier."""

    addr: In(10)
    wdata: In(32)
    we: In(1)
    rdata_a: Out(32)
    rdata_b: Out(32)
    a: In(signed(16))
    b: In(signed(16))
    p: Out(signed(32))

    def elaborate(self, platform):
        m = Module()
        # 1024 x 32 = 32 kbit: one RAMB36 (1K x 36); 512 x 32 = 16 kbit: one RAMB18 (512 x 36).
        m.submodules.mem_a = mem_a = Memory(shape=32, depth=1024, init=[])
        m.submodules.mem_b = mem_b = Memory(shape=32, depth=512, init=[])
        for mem, out, transparent in ((mem_a, self.rdata_a, False), (mem_b, self.rdata_b, True)):
            wp = mem.write_port()
            rp = mem.read_port(transparent_for=[wp] if transparent else [])
            m.d.comb += [
                wp.addr.eq(self.addr),
                wp.data.eq(self.wdata),
                wp.en.eq(self.we),
                rp.addr.eq(self.addr),
                out.eq(rp.data),
            ]
        product = Signal(signed(32))
        m.d.sync += [product.eq(self.a * self.b), self.p.eq(product)]
        return m


def _timed(component, top):
    start = time.perf_counter()
    report = synth.synthesize_component(component, top)
    wall = time.perf_counter() - start
    print(f"\n{report.format_text()}\n  wall time this call: {wall:.2f} s")
    return report, wall


@pytest.mark.synth
def test_synth_xnor_popcount():
    report, _ = _timed(XnorPopcount(width=64), "synth_xnor64")
    r = report.resources
    assert 30 < r["LUT"] < 1000  # a 64-input popcount: tens to a few hundred LUT6
    assert r["FF"] >= 7  # the registered 7-bit count (valid may merge)
    assert r["BRAM36"] == 0 and r["DSP"] == 0 and r["LUTRAM"] == 0
    assert not report.unmapped and report.fits
    assert report.log_path.is_file() and "Executing SYNTH_XILINX pass" in report.log_path.read_text()

    again, wall = _timed(XnorPopcount(width=64), "synth_xnor64")
    assert again.cached and again.resources == report.resources


@pytest.mark.synth
def test_synth_memory_and_multiplier():
    report, _ = _timed(MemMulBlock(), "synth_memmul")
    r = report.resources
    assert r["BRAM36"] >= 1 and r["RAMB36E1"] + r["RAMB18E1"] >= 2
    assert r["DSP"] >= 1  # 16 x 16 signed fits one DSP48E1
    assert r["LUT"] < 200 and r["FF"] < 200  # nothing fell back to registers
    assert set(report.memories.values()) <= {"BRAM SDP", "BRAM TDP"} and len(report.memories) == 2
    assert not report.unmapped and report.fits
    check_fit(report)


def test_synthesize_parts_selects_units_and_the_top_level(monkeypatch):
    texts = {}

    def fake(text, alias, device="xc7z020"):
        texts[alias] = text
        return synth.SynthReport.from_cells({"LUT4": 1}, top=alias)

    monkeypatch.setattr(synth, "synthesize", fake)
    v = "module t(input clk);\nendmodule\nmodule \\t.a (input clk);\nendmodule\nmodule \\t.b (input clk);\nendmodule\n"

    def names(**kw):
        return [name for name, *_ in synth.synthesize_parts(v, "t", **kw)]

    assert names() == ["a", "b", synth.TOP_PART]
    assert names(only=lambda n: n == "a") == ["a"]  # a selection leaves the top level out by default
    assert names(only=lambda n: n != "a", include_top=True) == ["b", synth.TOP_PART]
    assert names(include_top=False) == ["a", "b"]
    top_text = [t for t in texts.values() if "blackbox" in t]
    assert top_text and all("module \\t.a" in t for t in top_text)  # the units are black boxes in the top's part


# -- memory initial contents through files ------------------------------------------------------------------------


def _init_verilog(values: dict[str, list[int]], width: int = 17) -> str:
    """A module with one memory per entry of ``values``, initialised word by word as Amaranth writes it."""
    lines = ["module meminit_t(input clk, input [5:0] a, output reg [63:0] q);"]
    for name, vals in values.items():
        lines.append(f"  reg [{width - 1}:0] {name} [{len(vals) - 1}:0];")
        lines.append("  initial begin")
        # both of Amaranth's literal forms: hexadecimal and decimal
        lines += [f"    {name}[{i}] = {width}'h{v:x};" if i % 2 else f"    {name}[{i}] = {width}'d{v};"
                  for i, v in enumerate(vals)]
        lines.append("  end")
    names = list(values)
    lines.append("  always @(posedge clk) q <= {" + ", ".join(f"{n}[a]" for n in names) + "};")
    lines.append("endmodule")
    return "\n".join(lines) + "\n"


def test_memory_init_files_keep_every_word():
    import numpy as np

    rng = np.random.default_rng(3)
    values = {"tab": [int(v) for v in rng.integers(0, 1 << 17, 40)], "\\u.m ": [0, (1 << 17) - 1, 5]}
    v = _init_verilog(values)
    same, files = synth.memory_init_files(v)  # small: left as it is
    assert same == v and files == {}
    text, files = synth.memory_init_files(v, min_words=0)
    assert "initial begin" not in text and len(files) == 2
    assert 'initial $readmemh("meminit0.hex", tab);' in text
    assert 'initial $readmemh("meminit1.hex", \\u.m );' in text
    for name, content in zip(values, files.values(), strict=True):
        assert [int(x, 16) for x in content.split()] == values[name]
    # a gap in the addresses is written as an @address line; the words after it follow from there
    gap = v.replace("    tab[3] = ", "    tab[99] = ").replace("reg [16:0] tab [39:0]", "reg [16:0] tab [99:0]")
    _, files = synth.memory_init_files(gap, min_words=0)
    words = files["meminit0.hex"].split()
    assert words[3] == "@4" and words[4] == f"{values['tab'][4]:x}" and words[-2:] == ["@63", f"{values['tab'][3]:x}"]
    # a block that is not one memory's words stays
    mixed = v.replace("    tab[1] = ", "    other[1] = ")
    text, files = synth.memory_init_files(mixed, min_words=0)
    assert "other[1] = " in text and len(files) == 1


def test_memory_init_files_give_yosys_the_same_contents(tmp_path):
    """Yosys reads the same initial words from the files as from the assignments: the memories' INIT
    parameters after ``proc; memory_collect`` are equal."""
    import numpy as np

    from rtl_gen.toolchain import run_yowasp

    rng = np.random.default_rng(4)
    v = _init_verilog({"tab": [int(x) for x in rng.integers(0, 1 << 17, 64)], "two": [int(x) for x in
                                                                                     rng.integers(0, 1 << 17, 48)]})
    inits = []
    for form, (text, files) in (("flat", (v, {})), ("files", synth.memory_init_files(v, min_words=0))):
        d = tmp_path / form
        d.mkdir()
        (d / "design.v").write_text(text)
        for name, content in files.items():
            (d / name).write_text(content)
        run_yowasp("yosys", ["-q", "-p", "read_verilog design.v; proc; memory_collect; write_json out.json"], cwd=d)
        cells = json.loads((d / "out.json").read_text())["modules"]["meminit_t"]["cells"]
        inits.append({c["parameters"]["MEMID"]: c["parameters"]["INIT"] for c in cells.values()
                      if c["type"] == "$mem_v2"})
    assert len(inits[0]) == 2 and inits[0] == inits[1]
