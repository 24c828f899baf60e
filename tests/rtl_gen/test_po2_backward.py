# amaranth: UnusedElaboratable=no
"""rtl_gen.po2_backward: geometry and widths from the configuration, the plane-count formulation, packing, and
the cocotb/Verilator check against sim.hw.arith.po2_backward_dx / po2_backward_dw (random, worst case, stress,
exact cycle counts)."""

import json
import os
import re
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from amaranth import Module
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In

from rtl_gen.po2_backward import DW_LATENCY, DX_LATENCY, Po2Backward, Po2Geometry, array_mode
from rtl_gen.toolchain import run_cocotb, to_verilog
from rtl_gen.xnor_engine import XnorGeometry
from sim.config import apply_overrides, load_config
from sim.hw.widths import layer_bounds, signed_bits
from sim.schema import ConfigError


def small_config(**overrides):
    """A two-layer dense network 37 -> 10 -> 7 with batch 13 (and any further overrides)."""
    d = {
        "model.input_shape": [1, 1, 37],
        "model.layers": [{"type": "dense", "units": 10}, {"type": "dense", "units": 7}],
        "model.num_classes": 7,
        "train.batch_size": 13,
        "hw.input": "auto",  # the first layer's input follows model.input_format: 8-bit unless it says binary
        "hw.dw_window": 0,  # full po2 sums (the ternary cases set a window)
    }
    d.update(overrides)
    return d


class Po2WithBanks(wiring.Component):
    """Test top: the engine, plus (with a dX unit) weight banks in the XnorEngine layout on its ``weights``
    port, written through ``w_load`` (always ready), and (array engines) a codes memory on its ``codes`` port,
    written through ``c_load`` (``addr``, ``data``; always ready)."""

    def __init__(self, shapes: list[Po2Geometry]):
        self._engine = Po2Backward(shapes=shapes)
        geometry = self._engine.geometry  # the envelope of the shapes
        members = {name: mem for name, mem in self._engine.signature.members.items()
                   if name not in ("weights", "codes")}
        if geometry.dx_width:
            members["w_load"] = In(stream.Signature(geometry.bank.w_layout))
        if self._engine.array:
            codes = self._engine.codes.signature.members
            self._c_layout = data.StructLayout({"data": codes["data"].shape, "addr": codes["addr"].shape})
            members["c_load"] = In(stream.Signature(self._c_layout))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.engine = eng = self._engine
        geo = eng.geometry
        if "layer" in self.signature.members:
            m.d.comb += eng.layer.eq(self.layer)
        if eng.array:
            m.d.comb += eng.dx_start.eq(self.dx_start)
            rows = geo.batch * geo.bank.groups
            cmem = m.submodules.codes = Memory(shape=len(self.c_load.payload.data.as_value()), depth=rows, init=[])
            crd, cwr = cmem.read_port(), cmem.write_port()
            m.d.comb += [
                crd.addr.eq(eng.codes.addr), crd.en.eq(eng.codes.en), eng.codes.data.as_value().eq(crd.data),
                cwr.addr.eq(self.c_load.payload.addr), cwr.data.eq(self.c_load.payload.data.as_value()),
                cwr.en.eq(self.c_load.valid), self.c_load.ready.eq(1),
            ]
        for name in ("xdy", "dy"):
            if name in self.signature.members:
                wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(eng, name))
        for name in ("dw", "dx"):
            if name in self.signature.members:
                wiring.connect(m, getattr(eng, name), wiring.flipped(getattr(self, name)))
        if geo.dx_width:
            bank, load = geo.bank, self.w_load.payload
            m.d.comb += self.w_load.ready.eq(1)
            for lane in range(bank.lanes_out):
                mem = m.submodules[f"bank{lane}"] = Memory(shape=bank.lanes_in, depth=bank.depth, init=[])
                rd, wr = mem.read_port(), mem.write_port()
                m.d.comb += [
                    rd.addr.eq(eng.weights.addr),
                    rd.en.eq(eng.weights.en),
                    eng.weights.data[lane].eq(rd.data),
                    wr.addr.eq(load.addr),
                    wr.data.eq(load.data),
                    wr.en.eq(self.w_load.valid & (load.lane == lane)),
                ]
        return m


# --- pure Python / Amaranth simulator ---------------------------------------------------------------------


def test_geometry_and_widths_come_from_the_configuration():
    mlp = apply_overrides(load_config("mlp"), ["hw.input=int8"])  # layer 0 with 8-bit activations
    bounds = layer_bounds(mlp)
    g0 = Po2Geometry.from_config(mlp, 0, lanes_in=64, lanes_out=16, lanes_b=1)
    g1 = Po2Geometry.from_config(mlp, 1, lanes_in=32, lanes_out=8, lanes_b=4)
    assert (g0.x_max, g0.dx_width, g0.dw_width) == (128, 0, 29) and g0.dw_width == signed_bits(bounds[0].dW)
    assert (g1.x_max, g1.dx_width, g1.dw_width) == (1, 24, 22)
    assert (g1.planes, g1.span, g1.batch, g1.beats_per_tile) == (15, 14, 100, 25)
    assert (g1.dw_passes, g1.dx_passes) == (4, 4)  # the defaults
    assert g1.dx_cycles(100) == 100 * 8 * 32 * 4 + DX_LATENCY and g1.dw_cycles() == 256 * 26 * 4 + DW_LATENCY
    with pytest.raises(ValueError, match=re.escape("x_max must be 1 (binary input) or 128 (int8 input), not 3")):
        Po2Geometry(bank=g1.bank, batch=4, dy_bits=5, x_max=3, lanes_b=1, dx_width=8, dw_width=8)
    with pytest.raises(ValueError, match=re.escape("lanes_b must be an integer in 1..4096, not 0")):
        Po2Geometry(bank=g1.bank, batch=4, dy_bits=5, x_max=1, lanes_b=0, dx_width=8, dw_width=8)
    with pytest.raises(TypeError):
        Po2Backward(g1)


def test_dw_passes_come_from_the_configuration_and_are_checked():
    mlp = load_config("mlp")
    g = Po2Geometry.from_config(mlp, 1, lanes_in=32, lanes_out=8, lanes_b=4, dw_passes=4)
    assert g.dw_passes == 4 and g.dw_cycles() == 256 * 26 * 4 + DW_LATENCY
    eight = apply_overrides(mlp, {"hw.dw_passes": 8})
    assert Po2Geometry.from_config(eight, 1, lanes_in=32, lanes_out=8, lanes_b=4).dw_passes == 8
    assert Po2Geometry.from_config(eight, 1, lanes_in=4, lanes_out=8, lanes_b=4).dw_passes == 4  # at most lanes_in
    with pytest.raises(ValueError, match=re.escape("dw_passes (3) must divide lanes_in (32)")):
        Po2Geometry.from_config(mlp, 1, lanes_in=32, lanes_out=8, lanes_b=4, dw_passes=3)
    with pytest.raises(ValueError, match=re.escape("dw_passes must be an integer in 1..32, not 64")):
        Po2Geometry.from_config(mlp, 1, lanes_in=32, lanes_out=8, lanes_b=4, dw_passes=64)
    with pytest.raises(ConfigError, match=re.escape("hw.dw_passes = 6 must be a power of two")):
        apply_overrides(mlp, {"hw.dw_passes": 6})
    with pytest.raises(ConfigError, match="dw_passes"):
        apply_overrides(mlp, {"hw.dw_passes": 64})
    with pytest.raises(ConfigError, match=re.escape("hw.dx_passes = 3 must be a power of two")):
        apply_overrides(mlp, {"hw.dx_passes": 3})
    gx = Po2Geometry.from_config(mlp, 1, lanes_in=32, lanes_out=8, lanes_b=4, dx_passes=2)
    assert gx.dx_cycles(100) == 100 * 8 * 32 * 2 + DX_LATENCY
    with pytest.raises(ValueError, match=re.escape("dx_passes (3) must divide lanes_in (32)")):
        Po2Geometry.from_config(mlp, 1, lanes_in=32, lanes_out=8, lanes_b=4, dx_passes=3)


def test_packing_round_trips():
    geo = Po2Geometry(
        bank=XnorGeometry(n_in=10, n_out=7, lanes_in=4, lanes_out=3),
        batch=5,
        dy_bits=5,
        x_max=1,
        lanes_b=2,
        dx_width=12,
        dw_width=10,
    )
    rng = np.random.default_rng(2)
    field = rng.integers(0, 16, (5, 7))
    neg = rng.integers(0, 2, (5, 7))
    beats = geo.dy_beats(neg, field)
    assert len(beats) == 5 * 3 and beats[2] >> (3 * 5) == 1  # last group of a row
    assert (beats[0] & 0x1F) == field[0, 0] | neg[0, 0] << 4
    xdy = geo.xdy_beats(rng.integers(0, 2, (5, 10)), neg, field)
    assert len(xdy) == geo.bank.depth * 3 and geo.xdy_layout.size == 2 * 4 + 2 * 3 * 5 + 1
    two = replace(geo, dw_passes=2)  # each tile's beats once per pass
    x = rng.integers(0, 2, (5, 10))
    assert two.xdy_beats(x, neg, field) == [b for i in range(geo.bank.depth)
                                            for b in geo.xdy_beats(x, neg, field)[3 * i:3 * i + 3] * 2]
    with pytest.raises(ValueError, match="po2 fields must be in 0..15"):
        geo.dy_beats(neg, field + 16)


# --- cocotb on Verilator ----------------------------------------------------------------------------------

SWEEP = [
    # (overrides, layer, lanes_in, lanes_out, lanes_b, dw_passes, dx_passes, rows, batches)
    # binary layer 10 -> 7, B = 13, k = 6 (31 planes, dX 34 bits): partial last word, group and sample beat;
    # two dW and two dX passes, the second one all padding in the last word
    pytest.param((small_config(**{"approx.dy_bits": 6}), 1, 4, 3, 3, 2, 2, 120, 4), id="l1-n10x7-k6-li4-lo3-b3-p2"),
    # one word and one group per row, one sample per beat; four dW and dX passes (the third one half padding);
    # dW in packed multiply-accumulates (two weights per DSP48: hw.dw_dsp, the default) and in fabric adders
    pytest.param((small_config(), 1, 16, 8, 1, 4, 4, 120, 4), id="l1-n10x7-li16-lo8-b1-p4"),
    pytest.param((small_config(**{"hw.dw_dsp": False}), 1, 16, 8, 1, 4, 4, 120, 2),
                 id="l1-n10x7-li16-lo8-b1-p4-fabric"),
    # first layer: 8-bit activations (x_max 128), no dX unit, two dW passes
    pytest.param((small_config(), 0, 8, 4, 2, 2, 1, 0, 4), id="l0-int8-n37x10-li8-lo4-b2-p2"),
    # the MLP's hidden layer 256 x 256, B = 100, one dW and one dX pass on the fabric engine (the paper's preset
    # runs the DSP array, over whole steps in make test-paper): a minute and a half, so in the rtl_slow tier
    pytest.param(({"hw.dw_window": 0}, 1, 32, 8, 4, 1, 1, 100, 1), id="mlp-l1-n256x256-li32-lo8-b4",
                 marks=pytest.mark.rtl_slow),
]

# dX and dW on one array of DSP48 slices (hw.dx_dsp, the default where the layers allow it): 37 -> 12 -> 7
# (layer 1: 12 inputs = 3 of the word's 4 parts, 7 outputs = one group with a padding lane); B = 13 in blocks
# of 2 samples (the last one half padding); B = 5 has passes shorter than the drain (the array waits for it)
ARRAY = dict(small_config(**{"model.layers": [{"type": "dense", "units": 12}, {"type": "dense", "units": 7}]}))
ARRAY_CASES = [
    pytest.param((ARRAY, 1, 16, 8, 1, 4, 4, 0, 3), id="array-l1-n12x7-li16-lo8-p4"),
    pytest.param(({**ARRAY, "train.batch_size": 5}, 1, 16, 8, 1, 4, 4, 0, 3), id="array-l1-b5-li16-lo8-p4"),
    # the paper MLP's hidden layer: 256 x 256, B = 100, 64 x 16 lanes, 4 passes (blocks of 4 samples); three
    # minutes, so in the rtl_slow tier (make test-paper runs this engine over whole steps in CI)
    pytest.param(({"hw.dw_window": 0}, 1, 64, 16, 1, 4, 4, 0, 1), id="array-mlp-l1-n256x256-li64-lo16-p4",
                 marks=pytest.mark.rtl_slow),
    # ternary dW codes (hw.dw_window): four weights a slice, the passes in pairs (Po2Geometry.dw_pairs)
    pytest.param(({**ARRAY, "hw.dw_window": 3}, 1, 16, 8, 1, 4, 4, 0, 3), id="array-pairs-l1-n12x7-li16-lo8-p4"),
    pytest.param(({**ARRAY, "hw.dw_window": 3, "train.batch_size": 5}, 1, 8, 8, 1, 2, 2, 0, 3),
                 id="array-pairs-l1-b5-li8-lo8-p2"),
    pytest.param(({**ARRAY, "hw.dw_window": 3, "train.batch_size": 127}, 1, 16, 8, 1, 4, 4, 0, 1),
                 id="array-pairs-l1-b127-li16-lo8-p4"),
]
BINARY = small_config(**{"model.input_format": "binary"})
SHARED = [
    # one engine for layers 0 (37 -> 10: 5 words, 3 groups) and 1 (10 -> 7: 2 words, 2 groups), run as layer 1
    # (dX and dW) and as layer 0 (dW only): run-time words, groups and padding
    pytest.param((BINARY, 1, 8, 4, 2, 2, 2, 60, 3), id="shared-l0l1-run-l1"),
    pytest.param((BINARY, 0, 8, 4, 2, 1, 1, 0, 3), id="shared-l0l1-run-l0"),
    # an array engine for layers 0 (37 -> 12, dW only) and 1 (12 -> 7)
    pytest.param(({**ARRAY, "model.input_format": "binary"}, 1, 16, 8, 1, 4, 4, 0, 2), id="shared-array-run-l1"),
    pytest.param(({**ARRAY, "model.input_format": "binary"}, 0, 16, 8, 1, 4, 4, 0, 2), id="shared-array-run-l0"),
]


@pytest.mark.rtl
@pytest.mark.parametrize("case", SWEEP + ARRAY_CASES + SHARED)
def test_po2_backward_rtl(case, request):
    """Rerun one case with waveforms: ``XNT_WAVES=1 pytest -k l0-int8 ...``. The ``shared`` cases build one
    engine for layers 0 and 1 and run one of them."""
    overrides, layer, lanes_in, lanes_out, lanes_b, dw_passes, dx_passes, rows, batches = case
    cfg = apply_overrides(load_config("mlp"), overrides)
    shared = [0, 1] if request.node.callspec.id.startswith("shared") else [layer]
    shapes = [
        Po2Geometry.from_config(cfg, j, lanes_in=lanes_in, lanes_out=lanes_out, lanes_b=lanes_b,
                                dw_passes=dw_passes, dx_passes=dx_passes)
        for j in shared
    ]
    geo = shapes[shared.index(layer)]
    arr = array_mode(shapes)
    assert arr == ("array" in request.node.callspec.id)
    assert (arr and geo.dw_pairs) == ("pairs" in request.node.callspec.id)
    assert geo.dsp_fields == (2 if lanes_b == 1 and geo.x_max == 1 and "fabric" not in request.node.callspec.id else 0)
    params = {"overrides": overrides, "layer": layer, "lanes_in": lanes_in, "lanes_out": lanes_out, "lanes_b": lanes_b,
              "dw_passes": dw_passes, "dx_passes": dx_passes, "shared": shared}
    name = "po2_backward_" + (request.node.callspec.id if len(shared) == 1
                              else "shared_array" if arr else "shared").replace("-", "_")
    # the tests that apply to this build (one that skipped would check nothing and fail the run)
    tests = ["test_dw_random_full_rate", "test_dw_under_stress", "test_dw_worst_case"]
    if not arr:
        tests.append("test_dw_long_stalls")
    if geo.dx_width:
        tests += ["test_dx_random_full_rate", "test_dx_under_stress", "test_dx_worst_case"]
        if arr:
            tests.append("test_array_dx_and_dw_in_turn")
    run = run_cocotb(
        verilog=to_verilog(Po2WithBanks(shapes), "po2_backward", emit_src=False),  # afresh: builds are keyed on it
        toplevel="po2_backward",
        test_module="po2_backward_tb",
        name=name,
        extra_env={"XNT_TB_PARAMS": json.dumps({**params, "rows": rows, "batches": batches})},
        waves=bool(os.environ.get("XNT_WAVES")),
        testcase=tests,
        expect_tests=len(tests),
    )
    dw = json.loads((run.build_dir / "cycles-dw.json").read_text())
    if arr:
        assert dw["measured"] == dw["model"] == geo.array_dw_cycles()
    else:
        assert dw["measured"] == dw["model"] == geo.dw_cycles() == (
            geo.bank.depth * (geo.beats_per_tile + 1) * dw_passes + DW_LATENCY
        )
    if geo.dx_width:
        dx = json.loads((run.build_dir / "cycles-dx.json").read_text())
        if arr:
            assert dx["measured"] == dx["model"] == geo.array_dx_cycles()
        else:
            assert dx["measured"] == dx["model"] == geo.dx_cycles(rows) == (
                rows * geo.bank.depth * dx_passes + DX_LATENCY
            )


# --- structure (Yosys's RTL cells) --------------------------------------------------------------------------


@pytest.mark.parametrize("window", [0, 3], ids=["full", "pairs"])
def test_array_slices_have_a_dsp48s_pipeline_registers(tmp_path, window):
    """Yosys's view of a small array (word-level cells): every slice's multiply takes its operands from flip-flops
    loaded from flip-flops (a DSP48's A1 A2 and B1 B2 registers) and its product goes only into flip-flops (M),
    which feed the accumulator's adder (P): the operands' choice and decode, their way to the multiplier, the
    product and the accumulate are four cycles (in one cycle they closed at 31.3 MHz on the ECP5 proxy; on the
    xc7z020 the registers are the slice's own). The operand flip-flops
    have no synchronous reset: one with a reset cannot move into the MULT18's input register (boards/ecp5_dsp.py).
    Planted: the dX / dW choice of A as a multiplexer (Yosys turns its constant-0 side into a reset) fails it; B2
    loaded from stage 1's ``v`` fails it."""
    cfg = apply_overrides(load_config("mlp"), {**ARRAY, "hw.dw_window": window})
    geo = Po2Geometry.from_config(cfg, 1, lanes_in=16, lanes_out=8, lanes_b=1, dw_passes=4, dx_passes=4)
    assert array_mode([geo]) and geo.dw_pairs == bool(window)
    from yosys_nets import rtl_netlist  # same folder

    mod = rtl_netlist(Po2Backward(geometry=geo), "po2b", tmp_path)
    cells = mod["cells"].values()
    flops = [c for c in cells if "dff" in c["type"]]
    q_bits = {b for c in flops for b in c["connections"]["Q"]}
    d_bits = {b for c in flops for b in c["connections"]["D"]}
    loads: dict[int, list[str]] = {}  # net bit -> the cell types whose inputs it drives
    for c in cells:
        for port, bits in c["connections"].items():
            if c["port_directions"].get(port) == "input":
                for b in bits:
                    if isinstance(b, int):
                        loads.setdefault(b, []).append(c["type"])
    muls = [c for c in cells if c["type"] == "$mul"]
    LS = geo.bank.lanes_in // geo.dw_passes
    assert len(muls) == geo.bank.lanes_out * (LS // 2 + 1)  # the slices and each lane's -T slice
    q_type = {b: c["type"] for c in flops for b in c["connections"]["Q"]}
    d_of = {q: d for f in flops for q, d in zip(f["connections"]["Q"], f["connections"]["D"], strict=True)}
    for c in muls:
        ins = [b for p in ("A", "B") for b in c["connections"][p] if isinstance(b, int)]
        assert ins and all(b in q_bits for b in ins), "a multiplier operand does not come from a register"
        assert {q_type[b] for b in ins} <= {"$dff", "$dffe"}, {q_type[b] for b in ins}
        # the second operand registers (A2, B2) are loaded from the first (A1, B1): the multiplier's own registers,
        # reached from the fabric over a cycle of their own
        assert all(d_of[b] in q_bits for b in ins if isinstance(d_of[b], int)), "an operand register is not the second"
        outs = [b for b in c["connections"]["Y"] if b in loads]
        assert outs and all(b in d_bits and set(loads[b]) == {"$dff"} for b in outs), "a product is not registered"
    # the product registers feed the accumulators' adders
    y_bits = {b for c in muls for b in c["connections"]["Y"]}
    m_regs = [f for f in flops if y_bits & set(f["connections"]["D"])]
    assert len(m_regs) >= len(muls)
    assert all({"$add"} & set(loads.get(b, [])) for f in m_regs for b in f["connections"]["Q"][:1])


def test_array_window_choices_read_select_copies_of_their_own(tmp_path):
    """The array's stage-1 choices of the window's codes (a choice per sample) and of the weights (a choice per
    part) each read copies of the output-lane and buffer selects of their own (KEEP), not one ``s1_o`` read by
    every lane's choice (13.41 ns, 10.7 of it routing, into a B1 register for a quarter array at the paper's
    widths on the ECP5 proxy); the lane pad is a register. Planted: every sample's choice under sample 0's copies
    fails it."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from yosys_nets import flop_cone, gate_netlist

    cfg = apply_overrides(load_config("mlp"), {**ARRAY, "hw.dw_window": 0})
    geo = Po2Geometry.from_config(cfg, 1, lanes_in=16, lanes_out=8, lanes_b=1, dw_passes=4, dx_passes=4)
    NS, P, LS = geo.array_samples, geo.dw_passes, geo.bank.lanes_in // geo.dw_passes
    assert NS > 1 and P > 1
    mod = gate_netlist(Po2Backward(geometry=geo), "po2b", tmp_path, keep=True)
    nets = {n: v["bits"] for n, v in mod["netnames"].items()}
    assert "array.s1_o" not in nets
    copies = {f"array.s1_o_s{s}" for s in range(NS)} | {f"array.s1_par_s{s}" for s in range(NS)}
    copies |= {f"array.s1_o_q{q}" for q in range(P)}
    owner = {b: n for n in copies for b in nets[n]}

    def selects(bits):
        return {owner[b] for b in flop_cone(mod, bits) if b in owner}

    for s in range(NS):
        assert selects(nets[f"array.xcode{s}"]) == {f"array.s1_o_s{s}", f"array.s1_par_s{s}"}, s
    for q in range(P):
        assert selects(nets["array.wcol"][q * LS:(q + 1) * LS]) == {f"array.s1_o_q{q}"}, q
    assert all(isinstance(b, int) for b in nets["array.o_pad"])
    assert not selects(nets["array.o_pad"])


@pytest.mark.parametrize("window", [0, 3], ids=["full", "pairs"])
def test_array_b1_takes_a_decode_of_registered_codes(tmp_path, window):
    """Every B1 register of the array (and each lane's -T slice's) takes its data through the decode alone from
    stage c's registers: the lane's chosen code and real flag (``code_c``, ``real_c``) and, with ternary pairs,
    the registered pair value and dX / dW choice (``v_tc``, ``sc_x``). The window's buffer select, the code
    choice and the decode into B1 in one cycle were 14.06 ns for a quarter array at the paper's widths on the
    ECP5 proxy. Planted: B1 decoding stage 1's code (no stage c) fails it."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from yosys_nets import flop_cone, gate_netlist

    cfg = apply_overrides(load_config("mlp"), {**ARRAY, "hw.dw_window": window})
    geo = Po2Geometry.from_config(cfg, 1, lanes_in=16, lanes_out=8, lanes_b=1, dw_passes=4, dx_passes=4)
    assert array_mode([geo]) and geo.dw_pairs == bool(window)
    mod = gate_netlist(Po2Backward(geometry=geo), "po2b", tmp_path, keep=True)
    nets = {n: v["bits"] for n, v in mod["netnames"].items()}
    d_of = {q: d for c in mod["cells"].values() if "DFF" in c["type"]
            for q, d in zip(c["connections"]["Q"], c["connections"]["D"], strict=True)}
    LO = geo.bank.lanes_out
    stage_c = [f"array.{n}{lane}" for lane in range(LO) for n in ("code_c", "real_c", "v_tc", "sc_x_r")]
    allowed = {b for n in stage_c if n in nets for b in nets[n]}
    b1 = [n for n in nets if n.startswith(("array.dsp_br1_", "array.dsp_tb1_"))]
    assert len(b1) >= LO * 2
    for name in b1:
        data_in = [d_of[b] for b in nets[name] if b in d_of]
        cone = flop_cone(mod, data_in)
        extra = {n for n, bits in nets.items() for b in bits if b in cone - allowed}
        assert cone <= allowed, f"{name} reads {sorted(extra)[:6]} besides stage c's registers"


def test_fabric_dx_picks_read_pair_sum_copies_of_their_own(tmp_path):
    """The fabric dX unit's registered pair sums are copied per group of PICK_GROUP inputs, and each copy survives
    synthesis with the flow's KEEP (the picks of 8 inputs read 2 copies). Planted: every input's picks from one
    copy (the earlier form, one register a sum: 9.6 ns of routing to a far pick in context) fails it."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from yosys_nets import gate_netlist

    from rtl_gen.po2_backward import PICK_GROUP

    cfg = apply_overrides(load_config("mlp"), {**BINARY, "hw.dw_window": 0})
    geo = Po2Geometry.from_config(cfg, 1, lanes_in=16, lanes_out=4, lanes_b=2, dw_passes=2, dx_passes=2)
    assert not array_mode([geo])
    ls = 16 // 2
    mod = gate_netlist(Po2Backward(geometry=geo), "po2b", tmp_path, keep=True)
    q_bits = {b for c in mod["cells"].values() if "DFF" in c["type"] for b in c["connections"]["Q"]}
    loads = Counter(b for c in mod["cells"].values() for p, bits in c["connections"].items()
                    if c["port_directions"][p] == "input" for b in bits)
    copies = -(-ls // PICK_GROUP)
    assert copies == 2
    for q in range(copies):
        bits = mod["netnames"][f"dx_unit.pair0_0_r{q}"]["bits"]
        assert all(b in q_bits and loads[b] for b in bits), f"copy {q} is not a register with loads of its own"


def test_fabric_dx_decodes_from_registered_codes(tmp_path):
    """The fabric dX unit's v and -v registers (stage 1v) take their data through the decode alone from the
    registered codes and ``real`` flags (``c1``, ``real1``): the choice between the stream and the row buffer and
    the ``real`` compare are in stage 0 (the choice, ``real`` and the decode in one cycle: 13.17 ns, 11.5 of it
    routing, in context at 427fbc0 seed 1). Planted: stage 1's last-group flag gating the decode fails it."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from yosys_nets import flop_cone, gate_netlist

    cfg = apply_overrides(load_config("mlp"), {**BINARY, "hw.dw_window": 0})
    geo = Po2Geometry.from_config(cfg, 1, lanes_in=16, lanes_out=4, lanes_b=2, dw_passes=2, dx_passes=2)
    assert not array_mode([geo]) and geo.dx_passes > 1  # the row buffer is there
    mod = gate_netlist(Po2Backward(geometry=geo), "po2b", tmp_path)
    nets = mod["netnames"]
    allowed = set(nets["dx_unit.c1"]["bits"]) | set(nets["dx_unit.real1"]["bits"])
    d_of = {q: d for c in mod["cells"].values() if "DFF" in c["type"]
            for q, d in zip(c["connections"]["Q"], c["connections"]["D"], strict=True)}
    for lane in range(4):
        for name in (f"dx_unit.v{lane}_r", f"dx_unit.nv{lane}_r"):
            data_in = [d_of[b] for b in nets[name]["bits"] if b in d_of]  # their D pins (not enable or reset)
            cone = flop_cone(mod, data_in, inputs=True)
            assert cone and cone <= allowed, f"{name} reads {len(cone - allowed)} bits besides c1 and real1"
