# amaranth: UnusedElaboratable=no
"""The UltraScale+ memory rule (boards.devices.uram_rule): which memories synthesis puts into UltraRAM on ``xcup``,
the same rule in the Yosys script (rtl_gen.synth) and in the resource model (rtl_gen.resource_model), and the
``xc7`` flow left byte for byte as it was. ``synth``: a small Amaranth design synthesised for the xck26."""

import hashlib
import json

import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

import boards.devices
from benchmarks.calibrate_resources import PINNED
from boards.devices import UramRule, get_device, uram_rule
from rtl_gen import resource_model as rm
from rtl_gen import synth
from rtl_gen.synth import cache_key, synth_script

XC7_FLAGS = ["-flatten", "-noiopad", "-noclkbuf"]
XCUP_FLAGS = [*XC7_FLAGS, "-uram"]


# -- the xc7 flow is unchanged --------------------------------------------------------------------------------


def test_xc7_script_and_cache_key_are_what_they_were():
    """The script and cache folder of an xc7 synthesis are those of the flow before the memory rule (computed with
    the code at 5002965), so every cached xc7 result and the calibration's runs stay valid. Checked once on all 25
    xc7 entries of a shared build/synth cache: folder name, key and synth.ys reproduced."""
    script = synth_script("xc7", "stub", XC7_FLAGS)
    assert script == ("read_verilog design.v\nsynth_xilinx -family xc7 -top stub -flatten -noiopad -noclkbuf\n"
                      "tee -o stats.json stat -json\n")
    assert hashlib.sha256(script.encode()).hexdigest() == \
        "ccdcac3d82a76aedf943e8cc627e2be28c3628b34395db0d07d1670bcc1af49e"
    key, digest = cache_key("module stub(input clk); endmodule\n", "stub", "xc7", XC7_FLAGS, "0.70.0.0.post1234")
    assert "script" not in key and digest == "843e9b1a2e3cf083"


def test_xcup_script_marks_the_rule_memories(monkeypatch):
    script = synth_script("xcup", "t", XCUP_FLAGS).splitlines()
    synth_line = "synth_xilinx -family xcup -top t -flatten -noiopad -noclkbuf -uram"
    assert script == [
        "read_verilog design.v",
        f"{synth_line} -run :map_memory",
        'setattr -set ram_style "block" t:$mem_v2 r:SIZE>512 %i',
        'setattr -set ram_style "ultra" t:$mem_v2 r:SIZE>=2049 %i r:WIDTH>=36 %i t:$mem_v2 r:SIZE>=1025 %i '
        'r:WIDTH>=72 %i %u',
        f"{synth_line} -run map_memory:",
        "tee -o stats.json stat -json",
    ]
    # the key follows the rule: another rule is another cached result
    key, digest = cache_key("module t; endmodule\n", "t", "xcup", XCUP_FLAGS, "v")
    assert key["script"] == hashlib.sha256("\n".join(script).encode() + b"\n").hexdigest()
    monkeypatch.setattr(boards.devices, "URAM_RULES", {"xcup": UramRule(clauses=((4097, 72),), block_depth=512)})
    assert "r:SIZE>=4097 %i r:WIDTH>=72 %i" in synth_script("xcup", "t", XCUP_FLAGS)
    assert cache_key("module t; endmodule\n", "t", "xcup", XCUP_FLAGS, "v")[1] != digest


def test_uram_rule_and_blocks():
    rule = uram_rule("xcup")
    assert uram_rule("xc7") is None and uram_rule("ecp5") is None
    assert get_device("xck26").family == get_device("xczu7ev").family == "xcup"  # one synthesis serves both
    cases = {  # (width, depth): URAM288 blocks, or None when the memory stays in block RAM / LUTRAM
        (112, 24576): 10,  # the paper MLP's switch accumulators (bulk of the SplitMemory): 84 byte lanes, 9 a block
        (112, 416): None,  # their tail
        (64, 2900): 1,  # the paper MLP's X buffer
        (384, 2000): 6,  # YDX
        (64, 16384): 4,
        (35, 16384): None,
        (36, 2049): 1,
        (36, 2048): None,
        (72, 1025): 1,
        (71, 2048): None,
        (72, 1024): None,
        (16, 1600): None,  # the per-layer mx buffers
        (32, 1802): None,  # the generators' states
    }
    for (w, d), want in cases.items():
        assert rule.selects(w, d) == (want is not None), (w, d)
        if want is not None:
            assert rule.blocks(w, d) == want, (w, d)
            assert rule.blocks(w, d) <= -(-w // 72) * -(-d // 4096)  # never more than whole 72-bit columns
    # a memory the rule sends to UltraRAM takes at least twice as many BRAM36 in block RAM
    for w in range(1, 400, 3):
        for d in (513, 1025, 1500, 2049, 3000, 4096, 4097, 8192, 24576):
            if rule.selects(w, d):
                assert rm.bram36(w, d) >= 2 * rule.blocks(w, d), (w, d)



#: URAM288 blocks Yosys 0.70 gave for one ``width x depth`` memory (one write, one read port, ``ram_style = "ultra"``;
#: plain Verilog, the xcup script of rtl_gen.synth; 10-40 s each on 2 cores), at fd68fc9.
YOSYS_URAM = {(112, 4096): 2, (112, 12288): 5, (112, 24576): 10, (100, 8192): 3, (144, 8192): 4, (64, 16384): 4,
              (384, 2000): 6, (64, 2900): 1, (40, 24576): 4, (72, 24576): 6, (36, 4096): 1, (80, 4096): 2,
              (36, 8192): 1, (36, 16384): 2, (48, 12288): 2, (54, 24576): 5, (36, 2049): 1}


def test_uram_blocks_are_what_yosys_maps():
    """Byte lanes of several 4K-row slices share a block: 36 x 8,192 in one (8 lanes of 9 bits), 48 x 12,288 in two
    (18 lanes of 8 bits); neither byte width alone fits every row."""
    for (w, d), n in YOSYS_URAM.items():
        assert UramRule.blocks(w, d) == n, (w, d)

# -- the resource model uses the same rule ---------------------------------------------------------------------


#: The paper MLP as it was when its units were synthesised for xcup (docs/results.md): the preset before explore's
#: choice of 6-bit accumulators and 8 update lanes, as the resource calibration pins it.
SYNTHESISED = {k: int(v) for k, v in (kv.split("=") for kv in PINNED)}


def test_model_puts_the_rule_memories_in_uram():
    from rtl_gen.top import SystemPlan
    from sim.config import apply_overrides, load_config

    # the configuration of the xcup synthesis below: the paper MLP with 7-bit accumulators and 16 update lanes
    plan = SystemPlan(apply_overrides(load_config("mlp"), SYNTHESISED))
    for inst in rm.unit_instances(plan):
        for m in inst.memories:
            assert m.mapped("xc7") == {"BRAM36": m.bram36, "URAM": 0}  # the xc7 model as before
            up = m.mapped("xcup")
            selected = [d for d in m.segments() if uram_rule("xcup").selects(m.width, d)]
            assert up["URAM"] == sum(UramRule.blocks(m.width, d, None if m.block else m.gran) for d in selected)
            assert (up["BRAM36"] < m.bram36) == bool(selected) or m.bram36 == 0
    model = rm.load_model()
    xc7, xcup = model.predict(plan)["total"], model.predict(plan, "xcup")["total"]
    assert "URAM" not in xc7 and xc7["BRAM36"] == 140
    # accumulators 80 -> 2 BRAM36 (the tail) + 10 URAM, X buffer 6 -> 1 URAM, YDX 22 -> 6 URAM: what the paper MLP's
    # unit-by-unit xcup synthesis gave (docs/results.md: 34 BRAM36, 17 URAM288)
    assert xcup["URAM"] == 17 and xcup["BRAM36"] == 140 - 78 - 6 - 22
    assert all(xcup[k] == xc7[k] for k in ("LUT", "FF", "DSP"))


def test_explorer_holds_designs_to_the_uram_limit():
    from rtl_gen.explore import explore, fits, limits_of, over
    from rtl_gen.top import SystemPlan
    from sim.config import apply_overrides, load_config

    assert "URAM" not in limits_of(get_device("xc7z020"))
    lim = limits_of(get_device("xck26"))
    assert lim["URAM"] == 64 and lim["BRAM36"] == 144
    assert over({"LUT": 0, "FF": 0, "BRAM36": 0, "DSP": 0, "URAM": 65}, lim) == ["URAM 65 > 64"]
    grid = {"lanes_in": (64, 128), "lanes_out": (16, 32), "dw_passes": (2,), "dx_passes": (4,), "po2_lanes": (4,),
            "update_lanes": (16,), "div_steps": (4,), "mul_steps": (4,), "loss_lanes": (1,)}
    model = rm.load_model()
    res = explore(apply_overrides(load_config("mlp"), SYNTHESISED), "xck26", model=model, grid=grid)
    assert res.best is not None and res.base.resources["URAM"] == 17
    for d in res.fronts["LUT"]:
        assert fits(d.resources, lim) and d.resources["URAM"] > 0
        sets = {**SYNTHESISED, **{f"hw.{k}": v for k, v in d.hw.items()}}
        plan = SystemPlan(apply_overrides(load_config("mlp"), sets))
        assert model.predict(plan, "xcup")["total"] == pytest.approx(d.resources)
    # a die with too few UltraRAMs for the paper design's 17 refuses it on URAM alone
    tight = {**lim, "URAM": 16.0}
    assert over(res.base.resources, tight) == ["URAM 17 > 16"]


# -- real synthesis -------------------------------------------------------------------------------------------


class BigMemories(wiring.Component):
    """Three memories the rule treats differently: 4K x 64 single-port (to UltraRAM), 2K x 72 with separate read
    and write addresses (to UltraRAM by the 72-bit clause), 4K x 8 single-port (too narrow: block RAM, where Yosys
    0.70 would pick a LUTRAM it cannot build without the rule's ``ram_style = "block"``). Small enough for Yosys's
    Verilog reader: Amaranth writes every word's initial value, and 35K of them took it over 20 minutes."""

    addr: In(12)
    raddr: In(11)
    wdata: In(72)
    we: In(3)
    sp64: Out(64)
    sdp72: Out(72)
    sp8: Out(8)

    SHAPES = {"sp64": (64, 4096), "sdp72": (72, 2048), "sp8": (8, 4096)}

    def elaborate(self, platform):
        m = Module()
        for i, (name, (width, depth)) in enumerate(self.SHAPES.items()):
            m.submodules[name] = mem = Memory(shape=width, depth=depth, init=[])
            wp, rp = mem.write_port(), mem.read_port()
            abits = depth.bit_length() - 1
            m.d.comb += [wp.addr.eq(self.addr[:abits]), wp.data.eq(self.wdata[:width]), wp.en.eq(self.we[i]),
                         rp.addr.eq(self.raddr if name == "sdp72" else self.addr[:abits]),
                         getattr(self, name).eq(rp.data)]
        return m


@pytest.mark.synth
def test_big_memories_go_to_uram_on_xcup(tmp_path, monkeypatch):
    """About a minute of Yosys on 2 cores (fresh cache)."""
    monkeypatch.setenv("XNORTRAIN_BUILD_DIR", str(tmp_path))
    rep = synth.synthesize_component(BigMemories(), "synth_bigmem", device="xck26")
    print(rep.format_text())
    rule = uram_rule("xcup")
    shapes = [rm.MemoryShape(name, w, d) for name, (w, d) in BigMemories.SHAPES.items()]
    model = {k: sum(s.mapped("xcup")[k] for s in shapes) for k in ("BRAM36", "URAM")}
    assert rep.cells.get("URAM288") == model["URAM"] == 1 + 1
    assert rep.resources["BRAM36"] == model["BRAM36"] == rm.bram36(8, 4096) == 1  # 4K x 8 in one 4K x 9 RAMB36
    assert sorted(rep.memories.values()) == ["BRAM TDP", "URAM", "URAM"], rep.memories
    assert rule.selects(64, 4096) and not rule.selects(8, 4096)
    assert 'ram_style "ultra"' in (rep.workdir / "synth.ys").read_text()
    assert json.loads(rep.stats_path.read_text()) and rep.fits and not rep.unmapped


@pytest.mark.slow
def test_compare_synthesis_groups_parts_by_unit(monkeypatch):
    """``python -m rtl_gen.resource_model --config ... --device xck26``: the model beside the per-part synthesis, one
    row per unit (the io parts summed), Yosys faked with every part at 1 LUT / 2 URAM (the small MLP is elaborated:
    about 30 s)."""
    from small_mlp import SMALL

    from rtl_gen import synth as synth_mod
    from sim.config import apply_overrides, load_config

    calls = []

    def fake_parts(verilog, top, *, device, jobs=1, **kw):
        for name, _alias, _text, _boxes in synth_mod.part_texts(verilog, top):
            calls.append(name)
            rep = synth_mod.SynthReport.from_cells({"LUT4": 1, "URAM288": 2}, top=name, device=device)
            yield name, rep, len(calls) - 1, 0

    monkeypatch.setattr(synth_mod, "synthesize_parts", fake_parts)
    cfg = apply_overrides(load_config("mlp"), SMALL)
    rows = rm.compare_synthesis(cfg, "xck26")
    units = rows[:-1]
    assert sum(r["synthesis"]["LUT"] for r in units) == len(calls) and rows[-1]["synthesis"]["URAM"] == 2 * len(calls)
    io = next(r for r in units if r["kind"] == "io")
    assert io["synthesis"]["LUT"] == sum(1 for n in calls if rm.unit_kind(n) == "io") > 1
    assert all(r["synthesis"]["LUT"] == 1 for r in units if r["kind"] != "io")
    assert set(rows[-1]["model"]) == {"LUT", "FF", "BRAM36", "DSP", "URAM"}
    assert "| **total** |" in rm.format_comparison(rows)
