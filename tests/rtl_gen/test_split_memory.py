"""SplitMemory (rtl_gen.buffers): a deep memory kept as a bulk and a tail segment behaves like one memory."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth import Module
from amaranth.lib import data
from amaranth.sim import Simulator

from rtl_gen.buffers import SplitMemory, split_segments


@pytest.mark.parametrize(("depth", "block", "segments"), [
    (13, 4, [(0, 12), (12, 1)]),  # a one-word tail
    (23, 8, [(0, 16), (16, 7)]),
    (16, 8, [(0, 16)]),  # a multiple of the block: one memory
    (5, 8, [(0, 5)]),  # shallower than a block
])  # fmt: skip
def test_split_memory_reads_what_was_written(depth, block, segments):
    """Random reads and writes on both ports at once (reads of the written address see the old word, as with one
    memory's non-transparent read port), against a list; a struct-shaped word as the weight memory uses."""
    shape = data.ArrayLayout(7, 3)
    mem = SplitMemory(shape=shape, depth=depth, block=block, name="t")
    assert mem.segments == segments
    m = Module()
    m.submodules.mem = mem
    rng = np.random.default_rng(depth * block)
    model = [0] * depth

    async def bench(ctx):
        for addr in range(depth):  # fill
            model[addr] = int(rng.integers(0, 1 << 21))
            ctx.set(mem.write.addr, addr)
            ctx.set(mem.write.data.as_value(), model[addr])
            ctx.set(mem.write.en, 1)
            await ctx.tick()
        ctx.set(mem.write.en, 0)
        for _ in range(400):
            ra, wa = int(rng.integers(0, depth)), int(rng.integers(0, depth))
            ren, wen = bool(rng.integers(0, 4)), bool(rng.integers(0, 2))
            word = int(rng.integers(0, 1 << 21))
            expect_read = model[ra]
            ctx.set(mem.read.addr, ra)
            ctx.set(mem.read.en, ren)
            ctx.set(mem.write.addr, wa)
            ctx.set(mem.write.data.as_value(), word)
            ctx.set(mem.write.en, wen)
            before = ctx.get(mem.read.data.as_value())
            await ctx.tick()
            if wen:
                model[wa] = word
            got = ctx.get(mem.read.data.as_value())
            assert got == (expect_read if ren else before), (ra, wa, ren, wen)

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


def test_split_memory_checks_its_arguments():
    with pytest.raises(ValueError, match="depth and block must be >= 1"):
        split_segments(0, 4096)
    with pytest.raises(ValueError, match="depth and block must be >= 1"):
        split_segments(100, 0)
    assert split_segments(25_008, 4096) == [(0, 24_576), (24_576, 432)]  # the paper MLP's optimiser state
