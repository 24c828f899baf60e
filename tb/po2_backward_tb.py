"""cocotb testbench for rtl_gen.po2_backward.Po2Backward against sim.hw.arith.po2_backward_dx / _dw.

The top (``tests/rtl_gen/test_po2_backward.py``) is the engine with its own weight banks on the ``weights``
port, loaded through ``w_load`` (the :class:`~rtl_gen.xnor_engine.XnorEngine` layout), when the layer has a
dX unit. Ports: ``dy``, ``dx``, ``w_load`` (dX), ``xdy``, ``dw``.

Parameters (``$XNT_TB_PARAMS``, JSON): ``preset``, ``overrides``, ``layer``, ``lanes_in``, ``lanes_out``,
``lanes_b``, ``dw_passes``, ``dx_passes`` (the build), ``rows`` (dX rows per test, default 120), ``batches``
(dW batches per test, default 3); ``shared`` (layers of an engine built for several layers, ``layer`` among them:
the one the tests run, selected on the ``layer`` input).
Cycle counts measured without stalls go to ``cycles-dx.json`` / ``cycles-dw.json``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import cocotb
import numpy as np

from rtl_gen.po2_backward import Po2Geometry, array_mode, envelope
from sim.config import apply_overrides, load_config
from sim.hw.arith import ArithParams, Po2Codes, po2_backward_dw, po2_backward_dx
from sim.hw.widths import layer_bounds
from tb.common import Bench, StreamSink, StreamSource, pack, tb_params, to_signed

PARAMS = tb_params()
HAS_DX = ARRAY = False
if PARAMS:
    CFG = apply_overrides(load_config(PARAMS.get("preset", "mlp")), PARAMS.get("overrides", {}))
    LAYER = int(PARAMS["layer"])
    SHARED = [int(j) for j in PARAMS.get("shared", [LAYER])]  # layers of the build; LAYER is the one run
    SHAPES = [
        Po2Geometry.from_config(
            CFG, j, lanes_in=PARAMS["lanes_in"], lanes_out=PARAMS["lanes_out"], lanes_b=PARAMS["lanes_b"],
            dw_passes=PARAMS.get("dw_passes", 1), dx_passes=PARAMS.get("dx_passes", 1),
        )
        for j in SHARED
    ]  # fmt: skip
    GEO = SHAPES[SHARED.index(LAYER)]
    ENV = envelope(SHAPES)  # the build: widths of the dx stream and the weight-load port
    BANK = GEO.bank
    N, M, B = BANK.n_in, BANK.n_out, GEO.batch
    P = ArithParams.from_config(CFG)
    BOUNDS = layer_bounds(CFG)[LAYER]
    HAS_DX = GEO.dx_width > 0
    ARRAY = array_mode(SHAPES)  # dX and dW on one array: dX reads the codes of the whole batch from memory
ROWS = B if ARRAY else int(PARAMS.get("rows", 120))  # the array takes the whole batch
BATCHES = int(PARAMS.get("batches", 3))


def codes_of(neg, field) -> Po2Codes:
    """The golden model's code object (bias and unit do not enter dX / dW in units of the unit)."""
    return Po2Codes(np.asarray(neg, dtype=bool), np.asarray(field, dtype=np.uint8), 0, P.e_min)


def ref_dx(neg, field, w) -> np.ndarray:
    return po2_backward_dx(codes_of(neg, field), w, P)[0]


def ref_dw_sign(x, neg, field) -> np.ndarray:
    """The array with ternary pairs (``hw.dw_window``) counts every nonzero field as +-1 (the system sends fields 0
    / 1); the fabric dW unit sums any codes exactly."""
    xs = 2 * np.asarray(x, dtype=np.int64) - 1 if GEO.x_max == 1 else np.asarray(x, dtype=np.int64)
    field = np.minimum(field, 1) if ARRAY and GEO.dw_pairs else field
    return np.sign(po2_backward_dw(xs, codes_of(neg, field), P, GEO.x_max)).astype(np.int8)


def random_codes(rng: np.random.Generator, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Codes ``[rows, n_out]`` with a per-column style: uniform fields, mostly zero, only the two lowest planes
    (sums that cancel to 0), only the top plane, all zero."""
    top = GEO.planes
    field = np.zeros((rows, M), dtype=np.int64)
    # every style in every draw (with five columns or more), the all-zero one always: a draw with styles at random
    # could miss the zero signs that the full-rate test asserts it covers (about one seed in six at 8 columns)
    styles = rng.permutation(np.resize(rng.permutation(5), M))
    if 4 not in styles:
        styles[rng.integers(0, M)] = 4
    for c in range(M):
        style = styles[c]
        if style == 0:
            field[:, c] = rng.integers(0, top + 1, rows)
        elif style == 1:
            field[:, c] = np.where(rng.random(rows) < 0.15, rng.integers(1, top + 1, rows), 0)
        elif style == 2:
            field[:, c] = rng.integers(0, 3, rows)
        elif style == 3:
            field[:, c] = np.where(rng.random(rows) < 0.5, top, 0)
    neg = rng.integers(0, 2, (rows, M)).astype(bool)
    return neg, field


def random_x(rng: np.random.Generator) -> np.ndarray:
    if GEO.x_max == 1:
        return rng.integers(0, 2, (B, N))
    x = rng.integers(-128, 128, (B, N))
    x[:, rng.integers(0, N, 3)] = -128  # the extreme magnitude
    return x


class TB(Bench):
    def __init__(self, dut, *, p_idle=0.0, p_stall=0.0):
        super().__init__(dut)
        assert len(dut.xdy__payload) == GEO.xdy_layout.size, "the build does not match $XNT_TB_PARAMS"
        self.xdy = StreamSource(self, "xdy", p_idle=p_idle)
        self.dw = StreamSink(self, "dw", p_stall=p_stall)
        if HAS_DX:
            if ARRAY:
                self.c = StreamSource(self, "c_load", p_idle=0.2)
            else:
                self.dy = StreamSource(self, "dy", p_idle=p_idle)
            self.dx = StreamSink(self, "dx", p_stall=p_stall)
            self.w = StreamSource(self, "w_load", p_idle=0.2)
        self.np_rng = np.random.default_rng(self.rng.getrandbits(64))

    async def load(self, w) -> None:
        b, e = BANK, ENV.bank  # the layer's rows, in the build's port widths
        await self.w.send(
            [
                pack([(data, b.lanes_in), (addr, e.addr_width), (lane, e.lane_width)])
                for lane, addr, data in b.weight_beats(w)
            ]
        )

    async def reset(self, cycles: int = 3):
        if len(SHARED) > 1:
            self.dut.layer.value = SHARED.index(LAYER)
        await super().reset(cycles)

    async def run_dx(self, neg, field) -> tuple[np.ndarray, int]:
        if ARRAY:
            return await self.run_array_dx(neg, field)
        beats_in = GEO.dy_beats(neg, field)
        first_in, first_out = len(self.dy.stamps), len(self.dx.stamps)
        sender = cocotb.start_soon(self.dy.send(beats_in))
        rows = len(field)
        out = await self.dx.receive(rows * BANK.words * GEO.dx_passes, max_cycles=30 * GEO.dx_cycles(rows) + 500)
        await sender
        assert self.dx.stamps[first_out] > self.dy.stamps[first_in]
        return replace(GEO, dx_width=ENV.dx_width).unpack_dx(out), self.dx.stamps[-1] - self.dy.stamps[first_in] + 1

    async def run_array_dx(self, neg, field) -> tuple[np.ndarray, int]:
        """Array engines: the codes of the batch into the codes memory (padding lanes of the last group get
        random codes, which the engine must ignore), a ``dx_start`` pulse, then every word of the layer below
        (``sample * parts + part``) once."""
        assert field.shape == (B, M), "the array computes dX for the whole batch"
        G, LO = BANK.groups, BANK.lanes_out
        codes = np.zeros((B, G * LO), dtype=np.int64)
        codes[:, :M] = GEO._codes(neg, field)
        codes[:, M:] = self.np_rng.integers(0, 1 << GEO.dy_bits, (B, G * LO - M))
        addr_bits = len(self.dut.c_load__payload) - GEO.dy_bits * LO
        await self.c.send([
            pack([(int(c), GEO.dy_bits) for c in codes[b, g * LO:(g + 1) * LO]] + [(b * G + g, addr_bits)])
            for b in range(B) for g in range(G)
        ])
        await self.cycles(2)
        self.dut.dx_start.value = 1
        start = self.cycle
        await self.cycles(1)
        self.dut.dx_start.value = 0
        first_out = len(self.dx.stamps)
        words = GEO.array_dx_words()
        out = await self.dx.receive(words, max_cycles=30 * GEO.array_dx_cycles() + 500)
        LS, w = BANK.lanes_in // GEO.dw_passes, ENV.dx_width
        parts = N // LS
        dx = np.full((B, N), 1 << 40, dtype=np.int64)
        for word in out:
            vals = [to_signed((word >> (i * w)) & ((1 << w) - 1), w) for i in range(LS)]
            addr = word >> (LS * w)
            b, part = divmod(addr, parts)
            assert b < B, f"dx word address {addr} is past the batch"
            assert (dx[b, part * LS:(part + 1) * LS] == 1 << 40).all(), f"dx word {addr} written twice"
            dx[b, part * LS:(part + 1) * LS] = vals
        return dx, self.dx.stamps[-1] - start + 1 if len(self.dx.stamps) > first_out else 0

    async def run_dw(self, x, neg, field) -> tuple[np.ndarray, int]:
        beats_in = GEO.xdy_beats(x, neg, field, GEO.dw_reads if ARRAY else GEO.dw_passes)
        first_in = len(self.xdy.stamps)
        sender = cocotb.start_soon(self.xdy.send(beats_in))
        out = await self.dw.receive(BANK.depth, max_cycles=30 * dw_model() + 500)
        await sender
        return GEO.unpack_dw(out), self.dw.stamps[-1] - self.xdy.stamps[first_in] + 1


def dx_model(rows: int) -> int:
    return GEO.array_dx_cycles() if ARRAY else GEO.dx_cycles(rows)


def dw_model() -> int:
    return GEO.array_dw_cycles() if ARRAY else GEO.dw_cycles()


def assert_equal(what: str, got, want) -> None:
    got, want = np.asarray(got), np.asarray(want)
    bad = np.argwhere(got != want)
    assert not len(bad), (
        f"{what}: {len(bad)} of {np.size(want)} differ; first {bad[:4].tolist()}: "
        f"rtl {[int(got[tuple(i)]) for i in bad[:4]]} ref {[int(want[tuple(i)]) for i in bad[:4]]}"
    )


def record(name: str, measured: int, model: int) -> None:
    Path(f"cycles-{name}.json").write_text(json.dumps({"measured": measured, "model": model}))


@cocotb.test(skip=not HAS_DX)
async def test_dx_random_full_rate(dut):
    """Random weights and codes: dX equals po2_backward_dx; exact cycle count without stalls."""
    tb = TB(dut)
    await tb.reset()
    w = tb.np_rng.choice(np.array([-1, 1]), (N, M))
    await tb.load(w)
    neg, field = random_codes(tb.np_rng, ROWS)
    dx, cycles = await tb.run_dx(neg, field)
    assert_equal("dX", dx, ref_dx(neg, field, w))
    record("dx", cycles, dx_model(ROWS))
    assert cycles == dx_model(ROWS), f"{ROWS} rows took {cycles} cycles, model {dx_model(ROWS)}"


@cocotb.test(skip=not HAS_DX)
async def test_dx_under_stress(dut):
    """Idle input cycles and output backpressure; two back-to-back batches of rows."""
    tb = TB(dut, p_idle=0.4, p_stall=0.5)
    await tb.reset()
    w = tb.np_rng.choice(np.array([-1, 1]), (N, M))
    await tb.load(w)
    for rows in (B, B) if ARRAY else (max(ROWS // 4, 1), max(ROWS // 5, 1)):
        neg, field = random_codes(tb.np_rng, rows)
        dx, cycles = await tb.run_dx(neg, field)
        assert_equal("dX under stress", dx, ref_dx(neg, field, w))
        assert cycles >= dx_model(rows)


@cocotb.test(skip=not HAS_DX)
async def test_dx_worst_case(dut):
    """Every code at the top exponent with all signs aligned: |dX| reaches the width bound M 2^span."""
    tb = TB(dut)
    await tb.reset()
    w = np.ones((N, M), dtype=np.int64)
    w[:, : M // 2] = -1
    await tb.load(w)
    rows = B if ARRAY else 4  # the array takes whole batches: rows 4, 5, ... repeat rows 0 .. 3
    field = np.full((rows, M), GEO.planes)
    neg = np.zeros((rows, M), dtype=bool)
    neg[0::4, : M // 2] = True  # row 0: every addend +2^span
    neg[1::4, M // 2 :] = True  # row 1: every addend -2^span
    neg[2::4] = True
    want = ref_dx(neg, field, w)
    assert want[0].min() == BOUNDS.dX and want[1].max() == -BOUNDS.dX
    assert BOUNDS.dX < 1 << (GEO.dx_width - 1)
    dx, _ = await tb.run_dx(neg, field)
    assert_equal("dX worst case", dx, want)


@cocotb.test()
async def test_dw_random_full_rate(dut):
    """Random activations and codes for several batches: sgn(dW) equals the sign of po2_backward_dw; exact
    cycle count per batch without stalls."""
    tb = TB(dut)
    await tb.reset()
    counts = np.zeros(3, dtype=np.int64)
    for n in range(BATCHES):
        x = random_x(tb.np_rng)
        neg, field = random_codes(tb.np_rng, B)
        dw, cycles = await tb.run_dw(x, neg, field)
        want = ref_dw_sign(x, neg, field)
        assert_equal(f"sgn(dW), batch {n}", dw, want)
        counts += np.bincount(want.ravel() + 1, minlength=3)
        if n == 0:
            record("dw", cycles, dw_model())
        assert cycles == dw_model(), f"a batch took {cycles} cycles, model {dw_model()}"
    assert counts.min() > 0, f"signs (-1, 0, +1) seen {counts.tolist()}: the cases do not cover all three"


@cocotb.test()
async def test_dw_under_stress(dut):
    """Idle input cycles and output backpressure."""
    tb = TB(dut, p_idle=0.4, p_stall=0.6)
    await tb.reset()
    for n in range(max(BATCHES // 2, 1)):
        x = random_x(tb.np_rng)
        neg, field = random_codes(tb.np_rng, B)
        dw, cycles = await tb.run_dw(x, neg, field)
        assert_equal(f"sgn(dW) under stress, batch {n}", dw, ref_dw_sign(x, neg, field))
        assert cycles >= dw_model()


@cocotb.test(skip=ARRAY)
async def test_dw_long_stalls(dut):
    """The output ready low in most cycles: finished tiles wait in ``pend`` and the queue, and the unit, whose
    stages never stall, must start no tile it has no room for (a tile too many is lost or overwritten)."""
    tb = TB(dut, p_stall=0.97)
    await tb.reset()
    x = random_x(tb.np_rng)
    neg, field = random_codes(tb.np_rng, B)
    dw, _ = await tb.run_dw(x, neg, field)
    assert_equal("sgn(dW) with long output stalls", dw, ref_dw_sign(x, neg, field))


@cocotb.test()
async def test_dw_worst_case(dut):
    """Every code at the top exponent, signs aligned over the batch: dW reaches +-B x_max 2^span (the width
    bound); an accumulator one bit short would wrap and show the wrong sign."""
    tb = TB(dut)
    await tb.reset()
    x = np.full((B, N), 1 if GEO.x_max == 1 else -128)
    field = np.full((B, M), GEO.planes)
    neg = np.zeros((B, M), dtype=bool)
    neg[:, ::2] = True
    want_dw = po2_backward_dw(2 * x - 1 if GEO.x_max == 1 else x, codes_of(neg, field), P, GEO.x_max)
    assert np.abs(want_dw).max() == BOUNDS.dW == np.abs(want_dw).min()
    assert -BOUNDS.dW >= -(1 << (GEO.dw_width - 1)) and BOUNDS.dW < 1 << (GEO.dw_width - 1)
    for flip in (False, True):
        dw, _ = await tb.run_dw(x, neg ^ flip, field)
        assert_equal(f"sgn(dW) worst case (flip {flip})", dw, ref_dw_sign(x, neg ^ flip, field))


@cocotb.test(skip=not (ARRAY and HAS_DX))
async def test_array_dx_and_dw_in_turn(dut):
    """Array engines: dW batches and dX jobs alternate on the same slices (as the layers' phases do), with
    output backpressure; each result equals the model."""
    tb = TB(dut, p_stall=0.3)
    await tb.reset()
    w = tb.np_rng.choice(np.array([-1, 1]), (N, M))
    await tb.load(w)
    for n in range(2):
        x = random_x(tb.np_rng)
        neg, field = random_codes(tb.np_rng, B)
        dw, _ = await tb.run_dw(x, neg, field)
        assert_equal(f"sgn(dW), round {n}", dw, ref_dw_sign(x, neg, field))
        neg, field = random_codes(tb.np_rng, B)
        dx, _ = await tb.run_dx(neg, field)
        assert_equal(f"dX, round {n}", dx, ref_dx(neg, field, w))
