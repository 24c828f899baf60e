"""rtl_gen.buffers.MemoryReader's registered form in Amaranth's simulator: cycle for cycle the same words, ``last``
flags and ``busy`` as its earlier form (the unregistered reader, whose word waits on the read port, followed by a
SkidBuffer), under random ``ready`` and restarts; it needs no read port that holds its data; and an abort leaves
nothing to deliver."""

from __future__ import annotations

import random

import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth.sim import Simulator

from rtl_gen.buffers import MemoryReader
from rtl_gen.streams import SkidBuffer

DEPTH, WIDTH = 7, 12


def _duts():
    m = Module()
    new = m.submodules.new = MemoryReader(width=WIDTH, depth=DEPTH, repeat=3, registered=True)
    old = m.submodules.old = MemoryReader(width=WIDTH, depth=DEPTH, repeat=3)
    skid = m.submodules.skid = SkidBuffer(shape=old.layout, ring=False)
    wiring.connect(m, old.o, skid.i)
    return m, new, old, skid


def _compare(seed: int, *, hold_new: bool, p_ready: float, cycles: int = 600):
    """Both readers side by side; ``hold_new``: the new reader's port holds its word while ``r_en`` is low (else
    it reads every cycle, its enable tied high). Returns the words the new reader delivered."""
    m, new, old, skid = _duts()
    rnd = random.Random(seed)
    mem = [rnd.randrange(1 << WIDTH) for _ in range(DEPTH)]
    got = []

    async def bench(ctx):
        ports = {"new": [None], "old": [None]}  # the address each port's data register read last
        idle = 0
        for cycle in range(cycles):
            start = idle > 2 and rnd.random() < 0.2 and not ctx.get(new.busy)
            run = (rnd.randrange(DEPTH), rnd.randrange(1, 3 * DEPTH + 1), rnd.choice([0, DEPTH]))
            for rd in (new, old):
                ctx.set(rd.start, start)
                if start:
                    for sig, v in zip((rd.base, rd.count, rd.wrap), run, strict=True):
                        ctx.set(sig, v)
            ready = rnd.random() < p_ready
            ctx.set(new.o.ready, ready)
            ctx.set(skid.o.ready, ready)
            for name, rd in (("new", new), ("old", old)):
                if ports[name][0] is not None:
                    ctx.set(rd.r_data, mem[ports[name][0] % DEPTH])
            n_valid, o_valid = ctx.get(new.o.valid), ctx.get(skid.o.valid)
            assert n_valid == o_valid, f"cycle {cycle}: valid {n_valid} (new) != {o_valid} (old)"
            if n_valid:
                n_word = (ctx.get(new.o.payload.data), ctx.get(new.o.payload.last))
                o_word = (ctx.get(skid.o.payload.data), ctx.get(skid.o.payload.last))
                assert n_word == o_word, f"cycle {cycle}: word {n_word} (new) != {o_word} (old)"
                if ready:
                    got.append(n_word)
            busy_old = ctx.get(old.busy) or ctx.get(skid.o.valid) or not ctx.get(skid.i.ready)
            assert ctx.get(new.busy) == busy_old, f"cycle {cycle}: busy"
            if ctx.get(new.r_en) or not hold_new:
                ports["new"] = [ctx.get(new.r_addr)]
            if ctx.get(old.r_en):
                ports["old"] = [ctx.get(old.r_addr)]
            idle = 0 if ctx.get(new.busy) else idle + 1
            await ctx.tick()

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return got


@pytest.mark.parametrize("hold_new", [True, False], ids=["held-port", "port-reads-every-cycle"])
def test_registered_reader_is_cycle_for_cycle_the_skid_form(hold_new):
    total = 0
    for seed, p_ready in enumerate([1.0, 0.5, 0.2, 0.8]):
        total += len(_compare(seed, hold_new=hold_new, p_ready=p_ready))
    assert total > 500  # the comparison saw words, not only idle cycles


def test_an_abort_empties_the_registered_reader():
    """An abort in any cycle of a run under backpressure: nothing is offered after it, ``busy`` falls at once, and
    the next run delivers its own words from its first one."""
    for when in range(1, 12):
        rd = MemoryReader(width=WIDTH, depth=DEPTH, repeat=3, registered=True)
        seen = []

        async def bench(ctx, rd=rd, when=when, seen=seen):
            async def run(count, abort_at=None):
                ctx.set(rd.base, 0)
                ctx.set(rd.count, count)
                ctx.set(rd.wrap, 0)
                ctx.set(rd.start, 1)
                await ctx.tick()
                ctx.set(rd.start, 0)
                addr, words = None, []
                for cycle in range(40):
                    ctx.set(rd.abort, cycle == abort_at)
                    if addr is not None:
                        ctx.set(rd.r_data, 100 + addr)
                    ctx.set(rd.o.ready, cycle % 3 == 0)
                    if abort_at is not None and cycle > abort_at:
                        assert not ctx.get(rd.o.valid) and not ctx.get(rd.busy), (when, cycle)
                    if ctx.get(rd.o.valid) and ctx.get(rd.o.ready) and cycle != abort_at:
                        words.append(ctx.get(rd.o.payload.data))
                    addr = ctx.get(rd.r_addr) if ctx.get(rd.r_en) else addr
                    await ctx.tick()
                ctx.set(rd.abort, 0)
                return words

            await run(6, abort_at=when)
            seen.append(await run(4))

        sim = Simulator(rd)
        sim.add_clock(1e-8)
        sim.add_testbench(bench)
        sim.run()
        assert seen == [[100, 101, 102, 103]], when


def test_registered_reader_slots_load_under_flag_copies_of_their_own(tmp_path):
    """Yosys's view (gates) of a 70-bit registered reader: every slot flip-flop's clock enable is a flip-flop's
    output, one per slot and 32 bits (three per slot here, kept apart), not the decode of the write pointer (its
    fan-out into a slot's enables was 13.65 ns, 12.65 of it routing, in the SMALL design in context at 0d278d2
    seed 2). Planted: a slot loading under ``take & (wp == n)`` fails it."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from yosys_nets import gate_netlist

    from rtl_gen.streams import SKID_SELECT_BITS

    width = 70
    mod = gate_netlist(MemoryReader(width=width, depth=DEPTH, repeat=3, registered=True), "reader", tmp_path,
                       keep=True)
    q_of = {b: c for c in mod["cells"].values() if "DFF" in c["type"] for b in c["connections"]["Q"]}
    n_copies = -(-(width + 2) // SKID_SELECT_BITS)  # data, row_last, last
    for n in range(3):
        bits = [b for b in mod["netnames"][f"slot{n}"]["bits"] if isinstance(b, int)]
        enables = set()
        for b in bits:
            cell = q_of[b]
            assert "E" in cell["connections"], f"slot{n} bit loads every cycle"
            enables.add(cell["connections"]["E"][0])
        assert all(e in q_of for e in enables), f"slot{n}'s enables are not flip-flops"
        assert len(enables) == n_copies, (n, len(enables))
