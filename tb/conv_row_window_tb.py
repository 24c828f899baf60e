"""cocotb testbench for rtl_gen.conv_window.RowWindow against row_window_reference.

Parameters (``$XNT_TB_PARAMS``, JSON): ``batch``, ``height``, ``kernel``, ``pad`` (the generator's geometry),
``channels``, ``width`` (the rows), ``seed`` (the feature map).
"""

from __future__ import annotations

import cocotb
import numpy as np
from cocotb.triggers import ReadOnly

from rtl_gen.conv_window import RowWindowGeometry, WindowGeometry, row_window_reference
from tb.common import Bench, StreamSink, StreamSource, pack, tb_params, unpack

PARAMS = tb_params()


def _setup():
    gen = WindowGeometry(**{k: PARAMS[k] for k in ("batch", "height", "kernel", "pad")})
    rw = RowWindowGeometry(channels=PARAMS["channels"], width=PARAMS["width"], kernel=gen.kernel, pad=gen.pad)
    rng = np.random.default_rng(PARAMS["seed"])
    x = rng.integers(0, 2, (gen.batch, rw.channels, gen.height, rw.width), dtype=np.uint8)
    return gen, rw, *row_window_reference(gen, rw, x, rng)


async def _run(dut, *, p_idle: float, p_stall: float) -> None:
    gen, rw, ins, want = _setup()
    bench = Bench(dut)
    src = StreamSource(bench, "i", p_idle=p_idle)
    sink = StreamSink(bench, "o", p_stall=p_stall)
    await bench.reset()
    widths_in = (rw.width * rw.channels, 1, 1, 1)
    widths_out = (rw.window_bits, rw.kernel ** 2, 1, 1)
    cocotb.start_soon(src.send([pack(zip(beat, widths_in, strict=True)) for beat in ins]))
    words = await sink.receive(len(want), max_cycles=60 * (len(ins) + len(want)) + 100)
    got = [tuple(unpack(w, widths_out)) for w in words]
    for t, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a == b, f"window {t}: got {a}, expected {b}"
    await ReadOnly()
    assert not dut.busy.value and not dut.o__valid.value, "still busy after the last window"
    if p_idle == 0.0 and p_stall == 0.0:  # k loads, then the row's windows, per output row
        assert sink.stamps[-1] - src.stamps[0] == rw.cycles(gen.batch * gen.out_height) - 1


@cocotb.test()
@cocotb.parametrize(stress=[(0.0, 0.0), (0.3, 0.5)])
async def test_windows(dut, stress):
    """Full rate (``k + Wo`` cycles per output row), then gaps in the rows and backpressure on the windows."""
    await _run(dut, p_idle=stress[0], p_stall=stress[1])
