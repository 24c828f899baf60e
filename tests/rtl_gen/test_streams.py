"""rtl_gen.streams.SkidBuffer in Amaranth's simulator: every beat arrives once and in order under random valid and
ready, at one beat a cycle when both stay high, and neither ``i.ready`` nor ``o.valid`` / ``o.payload`` follows the
other side's signals in the same cycle (they are registers)."""

from __future__ import annotations

import random

from amaranth.sim import Simulator

from rtl_gen.streams import SkidBuffer


def _run(p_valid: float, p_ready: float, n: int = 200, seed: int = 1):
    dut = SkidBuffer(shape=8)
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


def test_skid_buffer_delivers_every_beat_in_order_with_registered_handshakes():
    for p_valid, p_ready in ((1.0, 1.0), (0.7, 0.5), (1.0, 0.3), (0.3, 1.0)):
        got, _ = _run(p_valid, p_ready)
        assert got == [k % 256 for k in range(200)], (p_valid, p_ready)


def test_skid_buffer_takes_a_beat_a_cycle():
    _, cycles = _run(1.0, 1.0)
    assert cycles == list(range(1, 201))  # one cycle of latency, then one beat every cycle
