# amaranth: UnusedElaboratable=no
"""rtl_gen.regmap and rtl_gen.axil: declarations, layout, JSON, host encode/decode, the Python model, and
the AXI4-Lite register bank in RTL simulation against the declared map."""

import json
import os
import re

import pytest

from rtl_gen.axil import AXI4LiteCSR, vivado_ports
from rtl_gen.regmap import (
    CSRBank,
    Field,
    Register,
    RegisterFile,
    RegisterMap,
    RegisterMapError,
)
from rtl_gen.toolchain import run_cocotb, to_verilog


def demo_map() -> RegisterMap:
    """Every access type, signed fields, explicit offsets and addresses (holes), fields in every byte
    lane, a strobe register and a constant."""
    return RegisterMap(
        [
            Register("id", "ro", reset=0x584E5431, desc="magic 'XNT1'"),
            Register(
                "ctrl",
                "rw",
                fields=[
                    Field("start", 1, access="pulse", desc="start a training step"),
                    Field("mode", 2, reset=1),
                    Field("bias", 6, signed=True, reset=-3),
                    Field("flush", 1, access="pulse", offset=16),
                    Field("level", 7, offset=24, reset=0x55),
                ],
            ),
            Register(
                "status",
                "w1c",
                fields=[Field("done", 1), Field("errors", 3, offset=8), Field("busy", 1, access="ro", offset=31)],
            ),
            Register("scratch", "rw", reset=0x12345678),
            Register("cmd", "pulse", fields=[Field("op", 8), Field("arg", 16, offset=16)], addr=0x40),
            Register("count", "ro", width=20, desc="sample counter"),
            Register("fifo", "rw", width=16, strobe=True, desc="indirect data"),
            Register("threshold", "rw", width=12, signed=True, reset=-100, addr=0x80),
        ],
        name="demo",
        addr_width=8,
    )


# --- declarations -----------------------------------------------------------------------------------------


def test_layout_assigns_aligned_addresses_and_packs_fields():
    rm = demo_map()
    assert [(r.name, r.addr) for r in rm] == [
        ("id", 0x0),
        ("ctrl", 0x4),
        ("status", 0x8),
        ("scratch", 0xC),
        ("cmd", 0x40),
        ("count", 0x44),
        ("fifo", 0x48),
        ("threshold", 0x80),
    ]
    ctrl = rm["ctrl"]
    assert [(f.name, f.offset, f.access) for f in ctrl.fields] == [
        ("start", 0, "pulse"),
        ("mode", 1, "rw"),
        ("bias", 3, "rw"),
        ("flush", 16, "pulse"),
        ("level", 24, "rw"),
    ]
    assert ctrl.reset_word == (1 << 1) | ((-3 & 0x3F) << 3) | (0x55 << 24)
    assert rm["status"].field("busy").access == "ro"


def test_explicit_addresses_are_skipped_by_auto_assignment():
    rm = RegisterMap([Register("a"), Register("b"), Register("c", addr=0x4), Register("d")])
    assert {r.name: r.addr for r in rm} == {"a": 0x0, "b": 0x8, "c": 0x4, "d": 0xC}


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: RegisterMap([Register("a"), Register("a")]), r"duplicate register name\(s\) \['a'\]"),
        (lambda: Register("a", fields=[Field("x", 1), Field("x", 2)]), r"duplicate field name\(s\) \['x'\]"),
        (
            lambda: Register("a", fields=[Field("x", 4), Field("y", 4, offset=2)]),
            r"field 'y' \(bits 2..5\) overlaps field 'x' at bit 2",
        ),
        (lambda: Register("a", fields=[Field("x", 30), Field("y", 4)]), r"field 'y' \(bits 30..33\) does not fit"),
        (lambda: Field("x", 33), r"width must be an integer in 1..32, not 33"),
        (lambda: Field("x", 4, reset=16), r"reset 16 does not fit 4 bits \(range 0..15\)"),
        (lambda: Field("x", 4, signed=True, reset=8), r"reset 8 does not fit 4 bits \(range -8..7\)"),
        (lambda: Field("x", 1, access="wo"), r"access must be one of"),
        (lambda: Register("a", "pulse", reset=1), r"pulse field 'value' must have reset 0"),
        (lambda: Register("a", "w1c", width=4, signed=True), r"only rw and ro fields can be signed"),
        (lambda: Register("a", addr=6), r"addr must be a non-negative multiple of 4, not 6"),
        (
            lambda: RegisterMap([Register("a", addr=8), Register("b", addr=8)]),
            r"register 'b': addr 0x8 is already taken by register 'a'",
        ),
        (lambda: RegisterMap([Register("a", addr=0x100)], addr_width=8), r"outside the 8-bit address space"),
        (lambda: Register("Ctrl"), r"register name 'Ctrl' must be lower_snake_case"),
        (lambda: Register("a__b"), r"register name 'a__b'"),
        (lambda: Field("class", 1), r"field name 'class'"),
        (lambda: Register("a", "w1c", fields=[Field("x", 1), Field("x_set", 1)]), r"port name\(s\) \['x_set'\]"),
        (lambda: Register("a", strobe=True, fields=[Field("w_stb", 1)]), r"port name\(s\) \['w_stb'\]"),
        (lambda: Register("a", fields=[Field("x", 1)], width=8), r"single-field form"),
        (lambda: RegisterMap([]), r"non-empty sequence of Register"),
    ],
)
def test_bad_declarations_are_rejected(make, message):
    with pytest.raises(RegisterMapError, match=message):
        make()


# --- host side --------------------------------------------------------------------------------------------


def test_json_round_trip_and_format(tmp_path):
    rm = demo_map()
    d = json.loads(rm.to_json())
    assert (d["format"], d["version"], d["data_width"], d["addr_width"], d["name"]) == (
        "xnortrain-regmap",
        1,
        32,
        8,
        "demo",
    )
    ctrl = next(r for r in d["registers"] if r["name"] == "ctrl")
    assert ctrl["addr"] == 4 and ctrl["reset"] == rm["ctrl"].reset_word
    assert ctrl["fields"][2] == {
        "name": "bias",
        "offset": 3,
        "width": 6,
        "access": "rw",
        "reset": -3,
        "signed": True,
        "desc": "",
    }
    assert RegisterMap.from_json(rm.to_json()) == rm
    assert RegisterMap.from_json(rm.write_json(tmp_path / "map.json")) == rm
    with pytest.raises(RegisterMapError, match="format must be"):
        RegisterMap.from_dict({"registers": []})
    assert "| 0x004 | `ctrl` |" in rm.to_markdown()


def test_encode_decode_by_name():
    rm = demo_map()
    word = rm.encode("ctrl", mode=3, bias=-1, level=0x7F, start=1)
    assert word == 1 | (3 << 1) | (0x3F << 3) | (0x7F << 24)
    assert rm.decode("ctrl", word) == {"start": 1, "mode": 3, "bias": -1, "flush": 0, "level": 0x7F}
    # read-modify-write: pulse bits in the base are dropped
    assert rm.encode("ctrl", word, mode=0) == word & ~0b111 & ~1
    assert rm.decode("threshold", rm.encode("threshold", value=-2048)) == {"value": -2048}
    assert rm.at(0x42) is rm["cmd"] and rm.at(0x10) is None
    with pytest.raises(RegisterMapError, match="field 'busy' is read-only"):
        rm.encode("status", busy=1)
    with pytest.raises(RegisterMapError, match=r"value 4 does not fit 2 bits \(0..3\)"):
        rm.encode("ctrl", mode=4)
    with pytest.raises(RegisterMapError, match="has no field 'nope'"):
        rm.encode("ctrl", nope=1)
    with pytest.raises(RegisterMapError, match="has no register 'nope'"):
        rm.addr("nope")


def test_register_file_model_semantics():
    rm = demo_map()
    rf = RegisterFile(rm)
    assert rf.read(rm.addr("scratch")) == (0x12345678, True)
    assert rf.write(rm.addr("scratch"), 0xAABBCCDD, strb=0b0101)
    assert rf.read(rm.addr("scratch"))[0] == 0x12BB56DD
    assert rf.write(rm.addr("ctrl"), rm.encode("ctrl", start=1, bias=-5))
    assert rf.pulses == [("ctrl", "start", 1)] and rf.output("ctrl", "bias") == -5
    assert rf.read(rm.addr("ctrl"))[0] & 1 == 0  # pulse bits read 0
    rf.set_status("status", "errors", 0b101)
    rf.set_input("status", "busy", 1)
    assert rm.decode("status", rf.read(rm.addr("status"))[0]) == {"done": 0, "errors": 0b101, "busy": 1}
    rf.write(rm.addr("status"), rm.encode("status", errors=0b100))
    assert rf.output("status", "errors") == 0b001
    assert not rf.write(rm.addr("id"), 0)  # nothing writable
    assert not rf.write(0x10, 0) and rf.read(0x10) == (0, False)
    rf.read(rm.addr("fifo"))
    assert rf.strobes == [("fifo", "r")]


# --- gateware ---------------------------------------------------------------------------------------------


def test_bank_ports_follow_the_map():
    text = to_verilog(CSRBank(demo_map()), "bank")
    ports = {name: d for d, name in re.findall(r"^\s*(input|output) (?:\[\d+:0\] )?(\w+);", text, re.M)}
    assert ports["regs__ctrl__mode"] == "output" and ports["regs__ctrl__start"] == "output"
    assert ports["regs__status__done"] == "output" and ports["regs__status__done_set"] == "input"
    assert ports["regs__status__busy"] == "input" and ports["regs__count__value"] == "input"
    assert ports["regs__fifo__r_stb"] == "output" and ports["bus__r_data"] == "output"


def test_vivado_port_names():
    csr = AXI4LiteCSR(demo_map())
    text = to_verilog(csr, "csr", ports=vivado_ports(csr))
    for name in ("s_axi_awaddr", "s_axi_wstrb", "s_axi_bresp", "s_axi_rdata", "s_axi_rready", "regs__ctrl__mode"):
        assert re.search(rf"^\s*(input|output) (\[\d+:0\] )?{name};", text, re.M), name
    header = re.search(r"^module csr\((.*?)\);", text, re.M | re.S).group(1)
    assert "s_axi_awaddr" in header and "s_axi__" not in header


@pytest.mark.rtl
def test_axi_lite_register_bank_rtl():
    """Waveforms: ``XNT_WAVES=1``; repeat a run: ``COCOTB_RANDOM_SEED=<seed from the log>``."""
    rm = demo_map()
    csr = AXI4LiteCSR(rm)
    run = run_cocotb(
        verilog=to_verilog(csr, "axil_csr", ports=vivado_ports(csr)),
        toplevel="axil_csr",
        test_module="regmap_tb",
        name="axil_csr_demo",
        extra_env={"XNT_TB_PARAMS": json.dumps({"regmap": rm.to_json(indent=None), "ops": 300})},
        waves=bool(os.environ.get("XNT_WAVES")),
    )
    assert run.tests == 8


# --- the accelerator's map: the description hash register (issue 19) ------------------------------------------


def test_the_generated_map_holds_the_hash_of_the_description_without_its_own_value():
    from rtl_gen.contract import description_hash
    from rtl_gen.controller import build_regmap
    from rtl_gen.top import SystemPlan
    from sim.config import apply_overrides, load_config

    def plan(units):
        return SystemPlan(apply_overrides(load_config("mlp"), [
            "model.input_format=binary", "train.batch_size=4", "hw.lanes_in=32", "hw.lanes_out=8", "hw.lanes_b=2",
            "hw.update_lanes=8", f'model.layers=[{{type="dense",units={units}}},{{type="dense",units=10}}]']))

    p12, p16 = plan(12), plan(16)
    reg = p12.regmap["id_hash"]
    assert (reg.access, [f.width for f in reg.fields]) == ("ro", [32])
    assert reg.field("value").reset == p12.desc_hash == description_hash(p12.description()) != 0
    assert p12.description().regmap["id_hash"].field("value").reset == p12.desc_hash
    # one hidden width apart: the same id / info / info_batch words, another hash
    assert all(p12.regmap[r].reset_word == p16.regmap[r].reset_word for r in ("id", "info", "info_batch"))
    assert p16.desc_hash != p12.desc_hash
    # the hash register follows the identification registers; its value does not move any address
    m0 = build_regmap(name="t", layers=2, batch=4, classes=10, input_int8=False, optimizer="switch",
                      quantity_kinds=6)
    m1 = build_regmap(name="t", layers=2, batch=4, classes=10, input_int8=False, optimizer="switch",
                      quantity_kinds=6, desc_hash=0xFFFFFFFF)
    assert [r.name for r in m0][:4] == ["id", "info", "info_batch", "id_hash"]
    assert {r.name: r.addr for r in m0} == {r.name: r.addr for r in m1}
    assert m1["id_hash"].reset_word == 0xFFFFFFFF
