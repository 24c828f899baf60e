"""rtl_gen.streams.SkidBuffer in Amaranth's simulator: every beat arrives once and in order under random valid and
ready, at one beat a cycle when both stay high, and neither ``i.ready`` nor ``o.valid`` / ``o.payload`` follows the
other side's signals in the same cycle (they are registers)."""

from __future__ import annotations

import random

import pytest
from amaranth.sim import Simulator

from rtl_gen.streams import SkidBuffer


def _run(p_valid: float, p_ready: float, n: int = 200, seed: int = 1, ring: bool = False, trace=None):
    dut = SkidBuffer(shape=8, ring=ring)
    rnd = random.Random(seed)
    got, cycles = [], []

    async def bench(ctx):
        sent = 0
        for cycle in range(20 * n):
            if len(got) == n:
                return
            valid = sent < n and rnd.random() < p_valid
            ready = rnd.random() < p_ready
            ctx.set(dut.i.valid, valid)
            ctx.set(dut.i.payload, sent % 256)
            # the registered outputs, before this cycle's o.ready is known
            ctx.set(dut.o.ready, 0)
            i_ready, o_valid, o_data = ctx.get(dut.i.ready), ctx.get(dut.o.valid), ctx.get(dut.o.payload)
            ctx.set(dut.o.ready, ready)
            assert (ctx.get(dut.i.ready), ctx.get(dut.o.valid), ctx.get(dut.o.payload)) == (i_ready, o_valid, o_data)
            if trace is not None:
                trace.append((i_ready, o_valid, o_data if o_valid else None))
            if o_valid and ready:
                got.append(o_data)
                cycles.append(cycle)
            sent += bool(valid and i_ready)
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return got, cycles


@pytest.mark.parametrize("ring", [False, True], ids=["skid", "ring"])
def test_skid_buffer_delivers_every_beat_in_order_with_registered_handshakes(ring):
    for p_valid, p_ready in ((1.0, 1.0), (0.7, 0.5), (1.0, 0.3), (0.3, 1.0)):
        got, _ = _run(p_valid, p_ready, ring=ring)
        assert got == [k % 256 for k in range(200)], (p_valid, p_ready)


@pytest.mark.parametrize("ring", [False, True], ids=["skid", "ring"])
def test_skid_buffer_takes_a_beat_a_cycle(ring):
    _, cycles = _run(1.0, 1.0, ring=ring)
    assert cycles == list(range(1, 201))  # one cycle of latency, then one beat every cycle


def test_ring_form_is_cycle_for_cycle_the_skid_form():
    """The ring form (wide payloads) swaps in for the skid form without changing any cycle count: the same
    ``i.ready``, ``o.valid`` and payload every cycle under random valid and ready. Planted: ``full`` set one
    beat early (at one held) fails it."""
    for seed, (p_valid, p_ready) in enumerate(((0.7, 0.5), (1.0, 0.3), (0.5, 0.9), (0.9, 0.6))):
        skid, ring = [], []
        _run(p_valid, p_ready, seed=seed, trace=skid)
        _run(p_valid, p_ready, seed=seed, ring=True, trace=ring)
        assert ring == skid, (p_valid, p_ready)


def test_wide_payloads_take_the_ring_form():
    from rtl_gen.streams import RING_WIDTH

    assert SkidBuffer(shape=RING_WIDTH).ring and not SkidBuffer(shape=RING_WIDTH - 1).ring


def test_replicas_stay_apart_through_the_ecp5_synthesis(tmp_path):
    """``streams.replicas``: four copies of one control register, each the clear of its own 16 flip-flops, are
    still four flip-flops after ``synth_ecp5`` (boards/ecp5.py's script). Planted: the script without
    ``KEEP_REGISTERS`` merges them into one (65 flip-flops)."""
    import json

    from amaranth import Elaboratable, Module, Signal

    from boards.ecp5 import ULX3S_85F, run_ecp5
    from rtl_gen.streams import replicas
    from rtl_gen.toolchain import to_verilog

    class Copies(Elaboratable):
        def __init__(self):
            self.a, self.b = Signal(), Signal()
            self.d, self.o = Signal(64), Signal(64)

        def elaborate(self, platform):
            m = Module()
            clears = replicas(m, self.a & self.b, 4, name="clear", reset_less=True)
            for k, clear in enumerate(clears):
                for j in range(16 * k, 16 * k + 16):
                    with m.If(clear):
                        m.d.sync += self.o[j].eq(0)
                    with m.Else():
                        m.d.sync += self.o[j].eq(self.o[j] ^ self.d[j])
            return m

    dut = Copies()
    verilog = to_verilog(dut, "copies", ports=[dut.a, dut.b, dut.d, dut.o])
    rep = run_ecp5(verilog, "copies", workdir=tmp_path, board=ULX3S_85F, bitstream=False, place=False,
                   check_fit=False)
    cells = json.loads((rep.workdir / "design.json").read_text())["modules"]["copies"]["cells"]
    ffs = sum(c["type"] == "TRELLIS_FF" for c in cells.values())
    assert ffs == 64 + 4, f"{ffs} flip-flops: the copies were merged"


def test_ring_slots_load_under_a_flip_flop_of_their_own(tmp_path):
    """The ring form's payload slots take their clock enable straight from a flip-flop (``free{k}``: the slot holds
    nothing and loads the input every cycle), so neither ``i.valid`` nor the pointers reach the enables of the
    slots' bits through logic (one nextpnr seed's routed worst group of the SMALL design). Planted: the slot
    loading under ``take & (wp == k)`` fails it."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from yosys_nets import gate_netlist

    dut = SkidBuffer(shape=16, ring=True)
    mod = gate_netlist(dut, "ring", tmp_path)
    q_of = {}  # flip-flop output bit -> the cell
    for name, c in mod["cells"].items():
        if "DFF" in c["type"]:
            for b in c["connections"]["Q"]:
                q_of[b] = name
    slot_bits = [b for n, v in mod["netnames"].items() if n.startswith("slot") for b in v["bits"]]
    assert len(slot_bits) == 32
    for b in slot_bits:
        cell = mod["cells"][q_of[b]]
        en = cell["connections"].get("E")
        assert en is not None, f"{q_of[b]} ({cell['type']}) has no clock enable"
        assert all(e in q_of for e in en), f"a slot bit's enable is logic, not a flip-flop ({cell['type']})"


def test_skid_register_loads_under_a_flip_flop_of_its_own(tmp_path):
    """The skid form's skid register loads under a flip-flop (``~skid_valid``: while it is empty it takes the
    input every cycle), so the consumer's ``o.ready`` does not reach its bits' enables (the routed SMALL design's
    worst path at 9dda79e seed 1: BN forward's ready -> the beta slice's catch decision -> its skid register's
    enables, 14.24 ns): no port but the payload reaches its inputs through logic. Planted: the skid register
    loading only when a beat is caught (``take`` with the output register held) fails it."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from yosys_nets import flop_cone, gate_netlist

    mod = gate_netlist(SkidBuffer(shape=16, ring=False), "skid", tmp_path)
    ports = {b: n for n, v in mod["netnames"].items() if "__" in n and "$" not in n for b in v["bits"]}
    skid_bits = mod["netnames"]["skid_data"]["bits"]
    assert len(skid_bits) == 16
    reached = {ports[b] for b in flop_cone(mod, skid_bits, inputs=True) if b in ports}
    assert reached == {"i__payload"}, reached


def test_skid_form_selects_a_copy_per_slice_of_the_payload(tmp_path):
    """The skid form's output register chooses between the skid register and the input under copies of
    ``skid_valid``, one per SKID_SELECT_BITS payload bits (KEEP), each also the enable of its bits of the skid
    register, so no flip-flop drives the choice of every bit (BN backward's Q slice in context: 13.19 ns of
    routing on that one net). Planted: every bit's choice under ``skid_valid`` fails it."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from yosys_nets import fanout, gate_netlist

    from rtl_gen.streams import SKID_SELECT_BITS

    width = 3 * SKID_SELECT_BITS + 5
    mod = gate_netlist(SkidBuffer(shape=width, ring=False), "skid", tmp_path, keep=True)
    loads = fanout(mod)
    names = ["skid_valid"] + [f"skid_valid_c{k}" for k in range(1, 4)]
    for name in names:
        (bit,) = mod["netnames"][name]["bits"]
        # its slice's choices and skid register enables, plus take, the ready and its own next value
        assert 1 <= loads[bit] <= 2 * SKID_SELECT_BITS + 8, (name, loads[bit])
    assert f"skid_valid_c{4}" not in mod["netnames"]
