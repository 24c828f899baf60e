"""boards/ecp5_dsp.py: the MULT18s' own registers take the operand and product flip-flops of the ECP5 netlist."""

import json

import pytest

from boards.ecp5 import run_ecp5
from boards.ecp5_dsp import absorb_mult_registers

#: two products: ``p`` with its operands and product each in flip-flops that nothing else reads (the product's
#: under an enable); ``q`` whose operand ``c_r`` is also an output and whose product goes through an adder
DEMO = """
module mdemo(input clk, input en, input [15:0] a, input [15:0] b, input [15:0] c, output [31:0] p,
             output [31:0] q, output [15:0] c_seen);
  reg [15:0] a_r, b_r, c_r; reg [31:0] p_r, q_r;
  always @(posedge clk) begin
    a_r <= a; b_r <= b; c_r <= c;
    if (en) p_r <= a_r * b_r;
    q_r <= c_r * b_r + 32'd1;
  end
  assign p = p_r; assign q = q_r; assign c_seen = c_r;
endmodule
"""


def _bits(module, name):
    return module["netnames"][name]["bits"]


@pytest.fixture(scope="module")
def routed(tmp_path_factory):
    rep = run_ecp5(DEMO, "mdemo", workdir=tmp_path_factory.mktemp("dsp") / "w", freq_mhz=50)
    netlist = json.loads((rep.workdir / "design.json").read_text())
    return rep, netlist["modules"]["mdemo"]


def test_operand_and_product_flip_flops_become_the_mult18s_registers(routed):
    """``p``'s MULT18 takes A, B and P registers, P under ``en``; ``q``'s takes its operands only (its product
    feeds an adder), ``c_r`` staying in the fabric for its other load; the flow still places, routes and packs."""
    rep, mod = routed
    meta = json.loads((rep.workdir / "meta.json").read_text())["mult_registers"]
    assert meta["mults"] == 2 and meta["a"] + meta["b"] == 4 and meta["p"] == 1
    mults = [c for c in mod["cells"].values() if c["type"] == "MULT18X18D"]
    with_p = [c for c in mults if c["parameters"].get("REG_OUTPUT_CLK") == "CLK0"]
    assert len(with_p) == 1
    cell = with_p[0]
    en = _bits(mod, "en")[0]
    ce = cell["parameters"]["REG_OUTPUT_CE"]
    assert cell["connections"][ce] == [en]  # the product register keeps its enable
    assert {cell["parameters"][f"REG_INPUT{x}_CLK"] for x in "AB"} == {"CLK0"}
    # the operands' registers load the input ports directly (the fabric flip-flops a_r, b_r are gone)
    a_in = set(_bits(mod, "a")) | set(_bits(mod, "b"))
    ops = {b for k, v in cell["connections"].items() if k[0] in "AB" and k[1:].isdigit()
           for b in v if isinstance(b, int)}
    assert ops and ops <= a_in
    ffs = [c for c in mod["cells"].values() if c["type"] == "TRELLIS_FF"]
    # c_r (16, read by c_seen) and q_r (32) stay; a_r, b_r, p_r went into the MULT18s
    assert len(ffs) == 16 + 32
    assert rep.fmax_mhz is not None and rep.bitstream.exists()
    assert rep.utilisation["MULT18"]["used"] == 2


def _ff(d, q, ce=None, lsr="0"):
    return {"type": "TRELLIS_FF", "parameters": {"CEMUX": "CE" if ce else "1 ", "CLKMUX": "CLK", "LSRMUX": "LSR"},
            "port_directions": {"CLK": "input", "CE": "input", "LSR": "input", "DI": "input", "Q": "output"},
            "connections": {"CLK": [1], "CE": [ce] if ce else ["1"], "LSR": [lsr], "DI": [d], "Q": [q]}}


def _mult(a, b, p):
    dirs = {**{f"A{i}": "input" for i in range(18)}, **{f"B{i}": "input" for i in range(18)},
            **{f"P{i}": "output" for i in range(36)}}
    conn = {**{f"A{i}": [a[i]] if i < len(a) else ["0"] for i in range(18)},
            **{f"B{i}": [b[i]] if i < len(b) else ["0"] for i in range(18)},
            **{f"P{i}": [p[i]] if i < len(p) else [1000 + i] for i in range(36)}}
    return {"type": "MULT18X18D", "parameters": {}, "port_directions": dirs, "connections": conn}


def test_registers_with_a_reset_or_mixed_enables_stay_in_the_fabric():
    """An operand flip-flop with a reset, operand bits under two different enables, and a product bit that also
    drives logic: none of them is absorbed."""
    cells = {
        "ra": _ff(10, 20, lsr=5),  # a reset: not the cell's register
        "rb0": _ff(11, 21, ce=6), "rb1": _ff(12, 22, ce=7),  # two enables among B's bits
        "m": _mult([20], [21, 22], [30]),
        "rp": _ff(30, 40), "lut": {"type": "LUT4", "parameters": {}, "port_directions": {"A": "input", "Z": "output"},
                                   "connections": {"A": [30], "Z": [41]}},
    }
    mod = {"ports": {}, "cells": cells, "netnames": {}}
    stats = absorb_mult_registers(mod)
    assert stats == {"mults": 1, "a": 0, "b": 0, "p": 0, "ffs_removed": 0}
    assert mod["cells"]["m"]["parameters"] == {}
    # one product bit read by a flip-flop alone, the other flip-flops plain and under one enable: all absorbed
    cells = {"ra": _ff(10, 20, ce=6), "rb0": _ff(11, 21, ce=6), "rb1": _ff(12, 22, ce=6),
             "m": _mult([20], [21, 22], [30]), "rp": _ff(30, 40, ce=8)}
    mod = {"ports": {"o": {"direction": "output", "bits": [40]}}, "cells": cells, "netnames": {}}
    stats = absorb_mult_registers(mod)
    assert stats == {"mults": 1, "a": 1, "b": 1, "p": 1, "ffs_removed": 4}
    m = mod["cells"]["m"]
    assert m["connections"]["A0"] == [10] and m["connections"]["B1"] == [12] and m["connections"]["P0"] == [40]
    p = m["parameters"]
    assert m["connections"][p["REG_INPUTA_CE"]] == [6] and m["connections"][p["REG_OUTPUT_CE"]] == [8]
    assert m["connections"]["RST0"] == ["0"] and m["connections"]["CLK0"] == [1]


def test_one_operand_register_alone_is_left_in_the_fabric():
    """Only A's flip-flops qualify (B comes from logic, the product feeds logic): nextpnr would time the cell as
    combinational with the path's flip-flop gone, so nothing moves."""
    cells = {"ra": _ff(10, 20), "m": _mult([20], [21], [30]),
             "lut": {"type": "LUT4", "parameters": {}, "port_directions": {"A": "input", "Z": "output"},
                     "connections": {"A": [30], "Z": [21]}}}
    mod = {"ports": {}, "cells": cells, "netnames": {}}
    assert absorb_mult_registers(mod) == {"mults": 1, "a": 0, "b": 0, "p": 0, "ffs_removed": 0}
    assert mod["cells"]["m"]["parameters"] == {} and "ra" in mod["cells"]
