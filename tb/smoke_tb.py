"""cocotb testbench for rtl_gen.smoke.XnorPopcount: random beats against the Python golden model.

Reads the width from the DUT's ports, so it serves every parametrisation. Knobs (environment):
SMOKE_BEATS, the number of input beats per test (default 300); SMOKE_EXPECT_OFFSET, added to every
expected value (default 0) so the test suite can check that a wrong result really fails the run.
"""

import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, ReadOnly

from rtl_gen.smoke import ref_xnor_popcount

BEATS = int(os.environ.get("SMOKE_BEATS", "300"))
EXPECT_OFFSET = int(os.environ.get("SMOKE_EXPECT_OFFSET", "0"))


class TB:
    """Owns the clock, reset and the two stream ends of the DUT."""

    def __init__(self, dut):
        self.dut = dut
        self.width = len(dut.i_stream__payload) // 2
        Clock(dut.clk, 10, unit="ns").start()

    async def reset(self):
        dut = self.dut
        dut.rst.value = 1
        dut.i_stream__valid.value = 0
        dut.i_stream__payload.value = 0
        dut.o_stream__ready.value = 0
        for _ in range(3):
            await FallingEdge(dut.clk)
        dut.rst.value = 0

    async def transfer(self, beats, *, p_idle, p_stall, rng):
        """Send ``beats`` ``(a, w)`` pairs with random idle cycles and backpressure; return (outputs, cycles).

        Inputs change only on the falling edge; at ReadOnly of the same step the handshake values are the
        ones the next rising edge will see, so a beat counts as transferred exactly when valid & ready there.
        """
        dut = self.dut
        outputs, sent, offering, cycles = [], 0, False, 0
        limit = 20 * len(beats) + 100
        while len(outputs) < len(beats):
            if not offering:
                offering = sent < len(beats) and rng.random() >= p_idle
                if offering:
                    a, w = beats[sent]
                    dut.i_stream__payload.value = (w << self.width) | a
                dut.i_stream__valid.value = int(offering)
            ready = int(rng.random() >= p_stall)
            dut.o_stream__ready.value = ready
            await ReadOnly()
            if offering and dut.i_stream__ready.value:
                sent += 1
                offering = False
            if ready and dut.o_stream__valid.value:
                outputs.append(int(dut.o_stream__payload.value))
            await FallingEdge(dut.clk)
            cycles += 1
            assert cycles < limit, f"stalled: {len(outputs)} of {len(beats)} results after {cycles} cycles"
        return outputs, cycles


@cocotb.test()
@cocotb.parametrize(stress=[(0.0, 0.0), (0.3, 0.0), (0.0, 0.4), (0.3, 0.4)])
async def test_random_beats(dut, stress):
    """Random inputs under (idle probability, stall probability) stress match the golden model."""
    p_idle, p_stall = stress
    tb = TB(dut)
    rng = random.Random(random.getrandbits(32))  # cocotb seeds `random` (COCOTB_RANDOM_SEED reproduces)
    await tb.reset()
    width = tb.width
    beats = [(rng.getrandbits(width), rng.getrandbits(width)) for _ in range(BEATS)]
    beats[:3] = [(0, 0), ((1 << width) - 1, 0), (0b1010 % (1 << width), 0b0110 % (1 << width))]

    got, cycles = await tb.transfer(beats, p_idle=p_idle, p_stall=p_stall, rng=rng)

    expected = [ref_xnor_popcount(a, w, width) + EXPECT_OFFSET for a, w in beats]
    mismatches = [(i, beats[i], g, e) for i, (g, e) in enumerate(zip(got, expected, strict=True)) if g != e]
    assert not mismatches, f"{len(mismatches)} mismatches (index, (a, w), rtl, ref), first: {mismatches[:5]}"
    if p_idle == 0 and p_stall == 0:
        assert cycles <= len(beats) + 2, f"{len(beats)} beats took {cycles} cycles without stalls"
