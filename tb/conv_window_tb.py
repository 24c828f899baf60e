"""cocotb testbench for rtl_gen.conv_window.WindowAddressGenerator against WindowGeometry.reads.

Parameters (``$XNT_TB_PARAMS``, JSON): ``batch``, ``height``, ``kernel``, ``pad``, ``row_words`` (the build's
geometry). Two passes per test (a restart after ``busy`` falls must begin the sequence afresh).
"""

from __future__ import annotations

import cocotb
from cocotb.triggers import FallingEdge, ReadOnly

from rtl_gen.conv_window import WindowGeometry
from tb.common import Bench, StreamSink, tb_params, unpack

PARAMS = tb_params()
GEO = WindowGeometry(**{k: PARAMS[k] for k in ("batch", "height", "kernel", "pad", "row_words")}) if PARAMS else None
FIELDS = ("addr", "valid", "row_last", "last")


def _reference() -> list[tuple[int, ...]]:
    rd = GEO.reads()
    return [tuple(int(rd[f][t]) for f in FIELDS) for t in range(len(rd["addr"]))]


async def _passes(dut, *, p_stall: float, passes: int = 2) -> None:
    bench = Bench(dut)
    dut.start.value = 0
    sink = StreamSink(bench, "o", p_stall=p_stall)
    await bench.reset()
    addr_bits = len(dut.o__payload) - 3
    ref = _reference()
    for n in range(passes):
        await FallingEdge(bench.clk)
        dut.start.value = 1
        await FallingEdge(bench.clk)
        dut.start.value = 0
        start = bench.cycle
        words = await sink.receive(len(ref), max_cycles=50 * len(ref) + 100)
        got = [tuple(unpack(w, (addr_bits, 1, 1, 1))) for w in words]
        for t, (a, b) in enumerate(zip(got, ref, strict=True)):
            named = [dict(zip(FIELDS, v, strict=True)) for v in (a, b)]
            assert a == b, f"pass {n}, beat {t}: got {named[0]}, expected {named[1]}"
        await ReadOnly()
        assert not dut.busy.value and not dut.o__valid.value, "still busy after the last beat"
        if p_stall == 0.0:  # one beat a cycle: the last transfer GEO.cycles() - 1 cycles after the first
            assert sink.stamps[-1] - sink.stamps[-len(ref)] == GEO.cycles() - 1, (start, sink.stamps[-1])


@cocotb.test()
async def test_full_rate(dut):
    await _passes(dut, p_stall=0.0)


@cocotb.test()
async def test_random_backpressure(dut):
    await _passes(dut, p_stall=0.5)
