"""cocotb testbench for rtl_gen.conv_pool.MaxPool against pool_reference.

Parameters (``$XNT_TB_PARAMS``, JSON): the ``PoolGeometry`` fields and ``seed`` (the ``Y`` values).
"""

from __future__ import annotations

import cocotb
import numpy as np
from cocotb.triggers import ReadOnly

from rtl_gen.conv_pool import PoolGeometry, pool_reference
from tb.common import Bench, StreamSink, StreamSource, pack, tb_params, to_signed, unpack

PARAMS = tb_params()


async def _run(dut, *, p_idle: float, p_stall: float) -> None:
    g = PoolGeometry(**{k: PARAMS[k] for k in ("batch", "height", "width", "groups", "lanes", "y_width", "pool")})
    rng = np.random.default_rng(PARAMS["seed"])
    lim = 1 << (g.y_width - 1)
    y = rng.integers(-3, 3, (g.batch, g.groups * g.lanes, g.height, g.width))
    y[0, 0, :g.pool, :g.pool] = lim - 1  # the extremes of the width
    y[-1, -1, :g.pool, :g.pool] = -lim
    ins, want = pool_reference(g, y)
    bench = Bench(dut)
    src = StreamSource(bench, "i", p_idle=p_idle)
    sink = StreamSink(bench, "o", p_stall=p_stall)
    await bench.reset()
    cocotb.start_soon(src.send([pack([(v, g.y_width) for v in beat]) for beat in ins]))
    words = await sink.receive(len(want), max_cycles=60 * len(ins) + 100)
    widths = [g.y_width] * g.lanes + [g.index_width] * g.lanes
    for t, (w, (vals, idx)) in enumerate(zip(words, want, strict=True)):
        f = unpack(w, widths)
        got = ([to_signed(v, g.y_width) for v in f[:g.lanes]], f[g.lanes:])
        assert got == (vals, idx), f"pooled beat {t}: got {got}, expected {(vals, idx)}"
    while len(src.stamps) < len(ins):  # the rows past the last window
        await bench.cycles(1)
    await bench.cycles(1)
    await ReadOnly()
    assert not dut.busy.value, "busy after the batch"
    if p_idle == 0.0 and p_stall == 0.0:  # one input beat a cycle
        assert src.stamps[-1] - src.stamps[0] == len(ins) - 1


@cocotb.test()
@cocotb.parametrize(stress=[(0.0, 0.0), (0.3, 0.5)])
async def test_pool(dut, stress):
    """Full rate (one input beat a cycle), then gaps in the input and backpressure on the output."""
    await _run(dut, p_idle=stress[0], p_stall=stress[1])
