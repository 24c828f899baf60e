"""cocotb testbench for rtl_gen.xnor_engine.XnorEngine against the bit-exact model's ``xnor_popcount``.

Parameters (``$XNT_TB_PARAMS``, JSON): ``n_in``, ``n_out``, ``lanes_in``, ``lanes_out`` (the build's
geometry), ``preload`` (path of the ``.npy`` weights the build was initialised with), ``rows`` (rows
per test, default 400). Cycle counts measured without stalls are written to ``cycles-<test>.json`` in
the run folder for the pytest side to report.
"""

from __future__ import annotations

import json
from pathlib import Path

import cocotb
import numpy as np
from cocotb.triggers import FallingEdge, ReadOnly

from rtl_gen.xnor_engine import XnorGeometry
from sim.hw.arith import xnor_popcount
from tb.common import Bench, StreamSink, StreamSource, pack, tb_params, to_signed, unpack

PARAMS = tb_params()
GEO = XnorGeometry(**{k: PARAMS[k] for k in ("n_in", "n_out", "lanes_in", "lanes_out")}) if PARAMS else None
ROWS = int(PARAMS.get("rows", 400))


def ref_forward(x_bits: np.ndarray, w_bits: np.ndarray) -> np.ndarray:
    """Golden ``Y`` for bit-encoded inputs and weights (1 = +1, 0 = -1), via :func:`sim.hw.arith.xnor_popcount`."""
    return xnor_popcount(2 * x_bits.astype(np.int64) - 1, 2 * w_bits.astype(np.int64) - 1)


def make_rows(rng: np.random.Generator, w: np.ndarray, count: int) -> np.ndarray:
    """Random rows, with the extremes mixed in: rows equal to a weight column (that output is +N) and to
    its complement (-N), all ones and all zeros."""
    x = rng.integers(0, 2, (count, GEO.n_in), dtype=np.uint8)
    cols = rng.choice(GEO.n_out, size=min(GEO.n_out, 4), replace=False)
    extremes = [w[:, j] for j in cols] + [1 - w[:, j] for j in cols]
    extremes += [np.ones(GEO.n_in, np.uint8), np.zeros(GEO.n_in, np.uint8)]
    at = rng.choice(count, size=min(count, len(extremes)), replace=False)
    for i, row in zip(at, extremes, strict=False):
        x[i] = row
    return x


class TB(Bench):
    """Sources for ``x`` and ``w_load``, a sink for ``y``, and a counter of ``framing_error`` pulses."""

    def __init__(self, dut, *, p_idle=0.0, p_stall=0.0, p_idle_load=0.0):
        super().__init__(dut)
        assert GEO is not None, "no geometry in $XNT_TB_PARAMS"
        assert len(dut.x__payload) == GEO.lanes_in + 1, "the build does not have the geometry in $XNT_TB_PARAMS"
        self.x = StreamSource(self, "x", p_idle=p_idle)
        self.y = StreamSink(self, "y", p_stall=p_stall)
        self.w = StreamSource(self, "w_load", p_idle=p_idle_load)
        self.np_rng = np.random.default_rng(self.rng.getrandbits(64))
        self.framing_errors = 0
        cocotb.start_soon(self._watch())

    async def _watch(self):
        while True:
            await FallingEdge(self.clk)
            await ReadOnly()
            if self.dut.framing_error.value:
                self.framing_errors += 1

    def junk(self, word: int, k: int) -> int:
        """``word`` with random bits in the padding positions past ``n_in`` (for the last word ``k``)."""
        if k != GEO.words - 1:
            return word
        return word | (self.rng.getrandbits(GEO.lanes_in) & ~GEO.last_word_mask)

    async def load(self, w: np.ndarray) -> None:
        """Load ``w`` through ``w_load``; padding bits and padding lanes get random junk (must not matter)."""
        g = GEO
        real_last = g.n_out - (g.groups - 1) * g.lanes_out
        words = []
        for lane, addr, data in g.weight_beats(w):
            group, k = divmod(addr, g.words)
            if group == g.groups - 1 and lane >= real_last:
                data = self.rng.getrandbits(g.lanes_in)
            words.append(pack([(self.junk(data, k), g.lanes_in), (addr, g.addr_width), (lane, g.lane_width)]))
        await self.w.send(words)

    async def forward(self, x: np.ndarray, *, flip_last=()) -> tuple[np.ndarray, int]:
        """Stream rows ``x`` through; returns ``(Y, cycles)`` with cycles from the first input transfer to
        the last output transfer, both included. ``flip_last``: ``(row, word)`` whose last flag is wrong.
        Padding bits of the last word of every row carry random junk."""
        g = GEO
        words = [
            pack([(self.junk(word, k), g.lanes_in), (int(k == g.words - 1) ^ int((r, k) in flip_last), 1)])
            for r, row in enumerate(g.pack_rows(x))
            for k, word in enumerate(row)
        ]
        n_beats = len(x) * g.groups
        first_in, first_out = len(self.x.stamps), len(self.y.stamps)
        budget = 20 * g.cycles(len(x)) + 1000
        sender = cocotb.start_soon(self.x.send(words))
        beats = await self.y.receive(n_beats, max_cycles=budget)
        await sender
        cycles = self.y.stamps[-1] - self.x.stamps[first_in] + 1
        assert self.y.stamps[first_out] > self.x.stamps[first_in]

        lanes = []
        real_last = g.n_out - (g.groups - 1) * g.lanes_out
        for i, beat in enumerate(beats):
            *values, last = unpack(beat, [g.y_width] * g.lanes_out + [1])
            group = i % g.groups
            assert last == int(group == g.groups - 1), f"beat {i}: last={last} in group {group} of {g.groups}"
            values = [to_signed(v, g.y_width) for v in values]
            if group == g.groups - 1:
                assert not any(values[real_last:]), f"beat {i}: padding lanes {values[real_last:]} are not 0"
            lanes.append(values)
        return g.unpack_outputs(lanes), cycles

    def compare(self, x, w, y):
        want = ref_forward(x, w)
        bad = np.argwhere(y != want)
        assert not len(bad), (
            f"{len(bad)} of {y.size} outputs differ; first (row, out): {bad[:4].tolist()}, "
            f"rtl {[int(y[tuple(i)]) for i in bad[:4]]}, ref {[int(want[tuple(i)]) for i in bad[:4]]}"
        )
        n = GEO.n_in
        assert want.max() == n and want.min() == -n, "the extreme rows did not reach |y| = N"


def record_cycles(test: str, rows: int, measured: int) -> None:
    entry = {**{k: PARAMS[k] for k in ("n_in", "n_out", "lanes_in", "lanes_out")}, "rows": rows}
    entry.update(measured=measured, model=GEO.cycles(rows))
    Path(f"cycles-{test}.json").write_text(json.dumps(entry))


@cocotb.test()
async def test_preloaded_weights_full_rate(dut):
    """Weights from the build's memory initialisation; no stalls: results and the exact cycle count."""
    tb = TB(dut)
    await tb.reset()
    w = np.load(PARAMS["preload"])
    x = make_rows(tb.np_rng, w, ROWS)
    y, cycles = await tb.forward(x)
    tb.compare(x, w, y)
    record_cycles("preloaded", len(x), cycles)
    assert cycles == GEO.cycles(len(x)), f"{len(x)} rows took {cycles} cycles, model {GEO.cycles(len(x))}"
    assert tb.framing_errors == 0


@cocotb.test()
@cocotb.parametrize(stress=[(0.0, 0.0), (0.5, 0.0), (0.0, 0.6), (0.3, 0.5)])
async def test_loaded_weights_under_stress(dut, stress):
    """New random weights through ``w_load`` (with idle cycles), then rows in two back-to-back batches
    under (input idle probability, output stall probability)."""
    p_idle, p_stall = stress
    tb = TB(dut, p_idle=p_idle, p_stall=p_stall, p_idle_load=0.3)
    await tb.reset()
    w = tb.np_rng.integers(0, 2, (GEO.n_in, GEO.n_out), dtype=np.uint8)
    await tb.load(w)
    for half in (ROWS // 2, ROWS - ROWS // 2):
        x = make_rows(tb.np_rng, w, half)
        y, cycles = await tb.forward(x)
        tb.compare(x, w, y)
        if stress == (0.0, 0.0):
            assert cycles == GEO.cycles(half)
        else:
            assert cycles >= GEO.cycles(half)
    dut._log.info("stress %s: last batch of %d rows took %d cycles (model without stalls %d)",
                  stress, half, cycles, GEO.cycles(half))  # fmt: skip
    assert tb.framing_errors == 0


@cocotb.test()
async def test_framing_error_flag(dut):
    """A wrong ``last`` flag pulses ``framing_error`` once per bad word; the engine goes by its count."""
    tb = TB(dut, p_idle=0.2, p_stall=0.2)
    await tb.reset()
    w = tb.np_rng.integers(0, 2, (GEO.n_in, GEO.n_out), dtype=np.uint8)
    await tb.load(w)
    x = make_rows(tb.np_rng, w, 12)
    flips = {(1, 0), (4, GEO.words - 1), (7, GEO.words // 2)}
    y, _ = await tb.forward(x, flip_last=flips)
    tb.compare(x, w, y)
    await tb.cycles(2)
    assert tb.framing_errors == len(flips), f"{tb.framing_errors} framing errors flagged, {len(flips)} expected"
