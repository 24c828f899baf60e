"""Amaranth-simulator harness for a unit with one input stream ``i`` and one output stream ``o`` (the fast
default-suite checks of rtl_gen's conv units; the cocotb testbenches beside this file do the same on Verilator)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from amaranth.sim import Simulator


def run_streams(dut, beats: Sequence, n_out: int, *, read: Callable, p_idle: float, p_stall: float,
                seed: int) -> list:
    """Send ``beats`` (payload values for ``dut.i``) with idle cycles of probability ``p_idle``, take ``n_out``
    beats from ``dut.o`` (``read(payload)`` of each) with ``ready`` low with probability ``p_stall``, and check
    that ``busy`` and ``o.valid`` are low once every input beat is in."""
    coin = random.Random(seed)
    got, sent = [], []

    async def source(ctx):
        for beat in beats:
            while coin.random() < p_idle:
                ctx.set(dut.i.valid, 0)
                await ctx.tick()
            ctx.set(dut.i.payload, beat)
            ctx.set(dut.i.valid, 1)
            await ctx.tick().until(dut.i.ready)
        ctx.set(dut.i.valid, 0)
        sent.append(True)

    async def sink(ctx):
        while len(got) < n_out:
            ready = coin.random() >= p_stall
            ctx.set(dut.o.ready, ready)
            if ready and ctx.get(dut.o.valid):
                got.append(read(ctx.get(dut.o.payload)))
            await ctx.tick()
        ctx.set(dut.o.ready, 0)
        while not sent:  # input beats past the last output (a pool's dropped rows) still come in
            await ctx.tick()
        await ctx.tick()
        assert not ctx.get(dut.busy) and not ctx.get(dut.o.valid), "busy after the last beat"

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(source, background=True)
    sim.add_testbench(sink)
    sim.run()
    return got
