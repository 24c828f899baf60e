# amaranth: UnusedElaboratable=no
"""rtl_gen.conv_window: the window rows' address generator against its NumPy reference (WindowGeometry.reads) and
against the contract's convolution (the rows it reads are the rows the windows of sim.hw.arith need), in the
Amaranth simulator (default suite) and in cocotb/Verilator with random backpressure (marker rtl)."""

import json
import os
import random

import numpy as np
import pytest
from amaranth.sim import Simulator

from rtl_gen.conv_window import (
    RowWindow,
    RowWindowGeometry,
    WindowAddressGenerator,
    WindowGeometry,
    row_window_reference,
)
from rtl_gen.toolchain import run_cocotb, to_verilog
from sim.hw import arith as A
from tb.pysim_streams import run_streams

FIELDS = ("addr", "valid", "row_last", "last")


def test_geometry_of_the_preset_layers():
    g0 = WindowGeometry.for_conv(batch=24, height=28, kernel=3, padding="valid")
    assert (g0.pad, g0.out_height, g0.cycles()) == (0, 26, 24 * 26 * 3)
    g1 = WindowGeometry.for_conv(batch=24, height=13, kernel=3, padding="valid", row_words=4)
    assert (g1.out_height, g1.depth, g1.cycles()) == (11, 24 * 13 * 4, 24 * 11 * 3 * 4)
    same = WindowGeometry.for_conv(batch=2, height=5, kernel=3, padding="same")
    assert (same.pad, same.out_height) == (1, 5)
    dx = WindowGeometry.for_conv(batch=2, height=11, kernel=3, padding="valid", transposed=True)
    assert (dx.pad, dx.out_height) == (2, 13)  # the code map 11 rows -> the input map's 13
    with pytest.raises(ValueError, match="pad must be an integer in 0..2, not 3"):
        WindowGeometry(batch=1, height=5, kernel=3, pad=3)
    with pytest.raises(ValueError, match="does not fit 2 rows"):
        WindowGeometry(batch=1, height=2, kernel=3, pad=0)
    with pytest.raises(ValueError, match="odd kernel"):
        WindowGeometry.for_conv(batch=1, height=5, kernel=2, padding="same")


@pytest.mark.parametrize("padding, transposed", [("valid", False), ("same", False), ("valid", True)])
def test_reads_cover_exactly_the_rows_of_the_contracts_windows(padding, transposed):
    """Every output row's valid reads are the image rows whose pixels its windows touch in the contract's
    convolution (a one-hot probe through sim.hw.arith.conv_xnor_popcount / po2 dX), each once, in order."""
    B, H, W, k = 2, 7, 6, 3
    g = WindowGeometry.for_conv(batch=B, height=H, kernel=k, padding=padding, transposed=transposed)
    rd = g.reads()
    per_row = k * g.row_words
    assert len(rd["addr"]) == B * g.out_height * per_row
    # which input rows does output row h of the (transposed) convolution depend on? probe with one row lit
    pad_conv = (k - 1) // 2 if padding == "same" else 0
    Hin = H if not transposed else g.out_height  # the forward input map (for dx: the map dX lands in)
    Hout = Hin + 2 * pad_conv - k + 1
    for b in range(B):
        for h in range(g.out_height):
            beats = slice((b * g.out_height + h) * per_row, (b * g.out_height + h + 1) * per_row)
            rows = {int(a) - b * H for a, v in zip(rd["addr"][beats], rd["valid"][beats], strict=True) if v}
            want = set()
            for r in range(H):
                if not transposed:  # output row h of the forward conv reads input row r?
                    x = -np.ones((1, 1, Hin, W), np.int64)
                    x[0, 0, r] = 1
                    y1 = A.conv_xnor_popcount(x, np.ones((1, 1, k, k), np.int8), padding, 1)
                    y0 = A.conv_xnor_popcount(-np.ones_like(x), np.ones((1, 1, k, k), np.int8), padding, 1)
                    touched = (y1 != y0)[0, 0, h].any()
                else:  # dX row h (input map) reads code row r (output map of the forward conv)?
                    field = np.zeros((1, 1, Hout, W), np.uint8)
                    field[0, 0, r] = 1
                    codes = A.Po2Codes(neg=np.zeros_like(field, bool), field=field, bias=0, unit_exp=0)
                    dx, _ = A.po2_backward_dx_conv(codes, np.ones((1, 1, k, k), np.int8), padding, A.ArithParams())
                    touched = (dx[0, 0, h] != 0).any()
                if touched:
                    want.add(r)
            assert rows == want, (b, h, rows, want)
    assert rd["row_last"].sum() == B * g.out_height and rd["last"][-1] and rd["last"].sum() == 1


def _simulate(g: WindowGeometry, *, p_stall: float, seed: int, passes: int = 2):
    dut = WindowAddressGenerator(geometry=g)
    coin = random.Random(seed)
    got = []
    n = g.cycles()

    async def bench(ctx):
        for _ in range(passes):
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            beats = []
            while len(beats) < n:
                ready = coin.random() >= p_stall
                ctx.set(dut.o.ready, ready)
                if ready and ctx.get(dut.o.valid):
                    pl = ctx.get(dut.o.payload)
                    beats.append(tuple(int(getattr(pl, f)) for f in FIELDS))
                await ctx.tick()
            ctx.set(dut.o.ready, 0)
            assert not ctx.get(dut.busy) and not ctx.get(dut.o.valid)
            got.append(beats)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return got


def _reference(g: WindowGeometry):
    rd = g.reads()
    return [tuple(int(rd[f][t]) for f in FIELDS) for t in range(len(rd["addr"]))]


@pytest.mark.parametrize("batch, height, kernel, padding, row_words, transposed, p_stall", [
    (2, 6, 3, "valid", 1, False, 0.0),
    (2, 5, 3, "same", 3, False, 0.4),
    (3, 4, 3, "valid", 2, True, 0.3),
    (1, 7, 5, "same", 1, True, 0.5),
])
def test_generator_equals_the_reference_in_pysim(batch, height, kernel, padding, row_words, transposed, p_stall):
    g = WindowGeometry.for_conv(batch=batch, height=height, kernel=kernel, padding=padding, row_words=row_words,
                                transposed=transposed)
    ref = _reference(g)
    for beats in _simulate(g, p_stall=p_stall, seed=batch * 100 + height):
        assert beats == ref


@pytest.mark.rtl
@pytest.mark.parametrize("case", [
    pytest.param((4, 13, 3, "valid", 4, False), id="b4-h13-valid-rw4"),
    pytest.param((3, 6, 3, "same", 2, False), id="b3-h6-same-rw2"),
    pytest.param((2, 11, 3, "valid", 1, True), id="b2-h11-dx"),
])
def test_generator_rtl(case):
    """cocotb on Verilator: full rate, then random backpressure; the beats equal WindowGeometry.reads."""
    batch, height, kernel, padding, row_words, transposed = case
    g = WindowGeometry.for_conv(batch=batch, height=height, kernel=kernel, padding=padding, row_words=row_words,
                                transposed=transposed)
    params = {"batch": batch, "height": height, "kernel": kernel, "pad": g.pad, "row_words": row_words}
    _cocotb(WindowAddressGenerator(geometry=g), "conv_window", f"b{batch}_h{height}_k{kernel}_p{g.pad}_rw{row_words}",
            params)


def _cocotb(dut, top: str, tag: str, params: dict) -> None:
    """Build ``dut`` as ``top`` and run ``tb/<top>_tb.py`` (two tests) with ``params``; ``XNT_WAVES=1`` for waves."""
    run = run_cocotb(
        verilog=to_verilog(dut, top),
        toplevel=top,
        test_module=f"{top}_tb",
        name=f"{top}_{tag}",
        extra_env={"XNT_TB_PARAMS": json.dumps(params)},
        waves=bool(os.environ.get("XNT_WAVES")),
    )
    assert run.tests == 2


# --- the register window -----------------------------------------------------------------------------------


def _expected_windows(gen: WindowGeometry, rw: RowWindowGeometry, x_bits: np.ndarray):
    B, C, H, W = x_bits.shape
    k, out = gen.kernel, []
    for b in range(B):
        for h in range(gen.out_height):
            rs = [h + i - gen.pad for i in range(k)]
            valid = np.array([0 <= r < H for r in rs])
            rows = np.stack([x_bits[b, :, r] if 0 <= r < H else np.zeros((C, W), np.uint8) for r in rs])
            bits, mask = rw.windows(rows, valid)
            for v in range(rw.out_width):
                out.append((bits[v], mask[v]))
    return out


@pytest.mark.parametrize("padding", ["valid", "same"])
def test_row_windows_reproduce_the_contracts_convolution(padding):
    """The reference windows, with the engine's sum over the unmasked bits, give sim.hw.arith.conv_xnor_popcount."""
    rng = np.random.default_rng(5)
    B, C, H, W, k, Co = 2, 3, 6, 5, 3, 4
    x = rng.integers(0, 2, (B, C, H, W), dtype=np.uint8)
    w = rng.integers(0, 2, (Co, C, k, k), dtype=np.uint8)
    gen = WindowGeometry.for_conv(batch=B, height=H, kernel=k, padding=padding)
    rw = RowWindowGeometry(channels=C, width=W, kernel=k, pad=gen.pad)
    wins = _expected_windows(gen, rw, x)
    y = np.zeros((B, Co, gen.out_height, rw.out_width), np.int64)
    for t, (bits, mask) in enumerate(wins):
        b, rest = divmod(t, gen.out_height * rw.out_width)
        h, v = divmod(rest, rw.out_width)
        skip = np.tile(mask, C) == 0  # bit c k^2 + i k + j takes pixel mask i k + j
        for o in range(Co):
            agree = (2 * bits.astype(np.int64) - 1) * (2 * w[o].reshape(-1).astype(np.int64) - 1)
            y[b, o, h, v] = agree[~skip].sum()
    want = A.conv_xnor_popcount(2 * x.astype(np.int64) - 1, 2 * w.astype(np.int64) - 1, padding, 1)
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("B, C, H, W, k, padding, p_idle, p_stall", [
    (2, 1, 6, 6, 3, "valid", 0.0, 0.0),
    (2, 3, 5, 5, 3, "same", 0.3, 0.4),
    (1, 2, 7, 4, 5, "same", 0.5, 0.2),
])
def test_row_window_equals_the_reference_in_pysim(B, C, H, W, k, padding, p_idle, p_stall):
    rng = np.random.default_rng(B * 10 + C)
    x = rng.integers(0, 2, (B, C, H, W), dtype=np.uint8)
    gen = WindowGeometry.for_conv(batch=B, height=H, kernel=k, padding=padding)
    rw = RowWindowGeometry(channels=C, width=W, kernel=k, pad=gen.pad)
    beats, want = row_window_reference(gen, rw, x, rng)
    inputs = [{"data": d, "valid": ok, "row_last": rl, "last": last} for d, ok, rl, last in beats]
    got = run_streams(RowWindow(geometry=rw), inputs, len(want), p_idle=p_idle, p_stall=p_stall, seed=B + C + k,
                      read=lambda pl: (int(pl.bits), int(pl.mask), int(pl.row_last), int(pl.last)))
    assert got == want


@pytest.mark.rtl
@pytest.mark.parametrize("case", [
    pytest.param((3, 13, 3, "valid", 16, 13), id="b3-c16-13x13-valid"),
    pytest.param((2, 6, 3, "same", 3, 5), id="b2-c3-6x5-same"),
])
def test_row_window_rtl(case):
    """cocotb on Verilator: full rate (the cycle count of RowWindowGeometry.cycles), then gaps in the rows and
    backpressure on the windows; the windows equal row_window_reference."""
    batch, height, kernel, padding, channels, width = case
    gen = WindowGeometry.for_conv(batch=batch, height=height, kernel=kernel, padding=padding)
    rw = RowWindowGeometry(channels=channels, width=width, kernel=kernel, pad=gen.pad)
    params = {"batch": batch, "height": height, "kernel": kernel, "pad": gen.pad, "channels": channels,
              "width": width, "seed": batch * 7 + channels}
    _cocotb(RowWindow(geometry=rw), "conv_row_window", f"c{channels}_w{width}_k{kernel}_p{gen.pad}", params)
