# amaranth: UnusedElaboratable=no
"""rtl_gen.xnor_engine: geometry, packing, cycle model, a quick Amaranth-simulator check, and the
cocotb/Verilator sweep against sim.hw.arith.xnor_popcount."""

import json
import os
import random
import re

import numpy as np
import pytest
from amaranth import Signal
from amaranth.sim import Simulator

from rtl_gen.toolchain import build_root, run_cocotb, to_verilog
from rtl_gen.xnor_engine import XnorEngine, XnorGeometry, as_bits, cycles
from sim.hw.arith import xnor_popcount
from sim.hw.widths import signed_bits


def ref(x_bits, w_bits):
    return xnor_popcount(2 * np.asarray(x_bits, np.int64) - 1, 2 * np.asarray(w_bits, np.int64) - 1)


# --- geometry and packing ---------------------------------------------------------------------------------


def test_geometry_derivations():
    g = XnorGeometry(n_in=784, n_out=256, lanes_in=64, lanes_out=16)
    assert (g.words, g.groups, g.depth, g.addr_width, g.lane_width) == (13, 16, 208, 8, 4)
    assert g.y_width == 11 == signed_bits(784)
    assert g.last_word_mask == (1 << 16) - 1
    assert g.cycles(100) == 100 * 208 + 5 == cycles(784, 256, 100, 64, 16)
    assert g.cycles(0) == 0
    for n in (1, 2, 3, 4, 7, 8, 255, 256, 1023, 1024):
        assert XnorGeometry(n_in=n, n_out=1, lanes_in=8, lanes_out=1).y_width == signed_bits(n)
        assert -(1 << (signed_bits(n) - 1)) <= -n and n < 1 << (signed_bits(n) - 1)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"lanes_in": 0}, "lanes_in must be an integer in 1..4096, not 0"),
        ({"lanes_out": 2.0}, "lanes_out must be an integer in 1..4096, not 2.0"),
        ({"n_in": True}, "n_in must be an integer in 1..1048576, not True"),
        ({"n_out": -3}, "n_out must be an integer in 1..1048576, not -3"),
    ],
)
def test_bad_parameters_are_rejected(kwargs, message):
    args = {"n_in": 20, "n_out": 10, "lanes_in": 8, "lanes_out": 4, **kwargs}
    with pytest.raises(ValueError, match=re.escape(message)):
        XnorEngine(**args)


def test_parameters_are_keyword_only():
    with pytest.raises(TypeError):
        XnorEngine(20, 10, 8, 4)


def test_weight_and_row_packing_follow_the_documented_layout():
    g = XnorGeometry(n_in=20, n_out=10, lanes_in=8, lanes_out=4)
    rng = np.random.default_rng(1)
    w = rng.integers(0, 2, (20, 10))
    banks = g.pack_weights(w)
    assert len(banks) == 4 and all(len(b) == g.depth == 9 for b in banks)
    for lane in range(4):
        for grp in range(3):
            for k in range(3):
                j = grp * 4 + lane
                want = sum(int(w[i, j]) << (i - 8 * k) for i in range(8 * k, min(8 * k + 8, 20)) if j < 10)
                assert banks[lane][grp * 3 + k] == want
    x = rng.integers(0, 2, (2, 20))
    rows = g.pack_rows(2 * x - 1)  # signs pack like bits
    assert rows[1][2] == sum(int(x[1, 16 + b]) << b for b in range(4))
    assert g.weight_beats(w)[:2] == [(0, 0, banks[0][0]), (0, 1, banks[0][1])]
    with pytest.raises(ValueError, match=r"shape \(n_in, n_out\) = \(20, 10\)"):
        g.pack_weights(w.T)
    with pytest.raises(ValueError, match="0/1 bits or -1/\\+1 signs"):
        as_bits([0, -1, 1])


def test_verilog_ports():
    text = to_verilog(XnorEngine(n_in=20, n_out=10, lanes_in=8, lanes_out=4), "xnor_engine")
    widths = {
        name: int(hi or 0) + 1 for hi, name in re.findall(r"^\s*(?:input|output) (?:\[(\d+):0\] )?(\w+);", text, re.M)
    }
    # y: 4 lanes x 6 bits + last; w_load: 8 data + 4 addr (depth 9) + 2 lane
    assert widths["x__payload"] == 9 and widths["y__payload"] == 25 and widths["w_load__payload"] == 14
    assert {"x__valid", "x__ready", "y__valid", "y__ready", "w_load__valid", "framing_error"} <= widths.keys()


# --- quick functional check in Amaranth's simulator ------------------------------------------------------


def _pysim(geo_kwargs, batch, *, seed, p_idle, p_stall):
    rng = np.random.default_rng(seed)
    w = rng.integers(0, 2, (geo_kwargs["n_in"], geo_kwargs["n_out"]))
    x = rng.integers(0, 2, (batch, geo_kwargs["n_in"]))
    x[0] = w[:, 0]
    dut = XnorEngine(**geo_kwargs, weights=w)
    g = dut.geometry
    words = [(word, int(k == g.words - 1)) for row in g.pack_rows(x) for k, word in enumerate(row)]
    beats, first_in, last_out = [], [], []
    coin = random.Random(seed)

    async def bench(ctx):
        sent, cycle = 0, 0
        while len(beats) < batch * g.groups:
            offer = sent < len(words) and coin.random() >= p_idle
            ctx.set(dut.x.valid, offer)
            if offer:
                ctx.set(dut.x.payload, {"data": words[sent][0], "last": words[sent][1]})
            take = coin.random() >= p_stall
            ctx.set(dut.y.ready, take)
            if offer and ctx.get(dut.x.ready):
                first_in.append(cycle)
                sent += 1
            if take and ctx.get(dut.y.valid):
                beats.append([int(v) for v in ctx.get(dut.y.payload).y])
                last_out.append(cycle)
            await ctx.tick()
            cycle += 1
            assert cycle < 50 * g.cycles(batch)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert (g.unpack_outputs(beats) == ref(x, w)).all()
    return last_out[-1] - first_in[0] + 1, g.cycles(batch)


@pytest.mark.parametrize(
    "geo",
    [
        {"n_in": 20, "n_out": 10, "lanes_in": 8, "lanes_out": 4},
        {"n_in": 5, "n_out": 2, "lanes_in": 8, "lanes_out": 4},  # one word, one group, padding both ways
        {"n_in": 3, "n_out": 3, "lanes_in": 1, "lanes_out": 1},  # bit-serial
    ],
)
def test_engine_in_amaranth_simulator(geo):
    measured, model = _pysim(geo, 6, seed=3, p_idle=0.0, p_stall=0.0)
    assert measured == model
    _pysim(geo, 6, seed=4, p_idle=0.3, p_stall=0.4)


def test_one_core_for_layers_of_different_geometry():
    """One XnorEngineCore for three layers with 8-bit words and 4 lanes (37 -> 10: 5 words, partial last word
    and group; 10 -> 10: 2 words, 2 padding lanes; 10 -> 3: one group, 1 real lane), each layer's weights in
    its own region of the banks: layers run one after the other (twice round), with random input stalls and
    output backpressure; every output equals the reference, padding lanes are 0."""
    from amaranth import Module
    from amaranth.lib.memory import Memory

    from rtl_gen.xnor_engine import XnorEngineCore

    geos = [XnorGeometry(n_in=37, n_out=10, lanes_in=8, lanes_out=4), XnorGeometry(n_in=10, n_out=10, lanes_in=8,
                                                                                    lanes_out=4),
            XnorGeometry(n_in=10, n_out=3, lanes_in=8, lanes_out=4)]
    core = XnorEngineCore(geometries=geos)
    assert core.geometry.y_width == geos[0].y_width
    with pytest.raises(ValueError, match="same lanes_in and lanes_out"):
        XnorEngineCore(geometries=[geos[0], XnorGeometry(n_in=10, n_out=3, lanes_in=8, lanes_out=2)])
    rng = np.random.default_rng(5)
    ws = [rng.integers(0, 2, (g.n_in, g.n_out)) for g in geos]
    bases = [sum(g.depth for g in geos[:i]) for i in range(len(geos))]
    top = Module()
    top.submodules.core = core
    for lane in range(4):
        rows = [row for g, w in zip(geos, ws, strict=True) for row in g.pack_weights(w)[lane]]
        bank = top.submodules[f"bank{lane}"] = Memory(shape=8, depth=len(rows), init=rows)
        rd = bank.read_port()
        base = Signal(range(len(rows)))
        with top.Switch(core.layer):
            for i, b in enumerate(bases):
                with top.Case(i):
                    top.d.comb += base.eq(b)
        top.d.comb += [rd.addr.eq(base + core.weights.addr), rd.en.eq(core.weights.en),
                       core.weights.data[lane].eq(rd.data)]
    coin = random.Random(9)
    batch = 5

    async def bench(ctx):
        for rnd in range(2):
            for i, g in enumerate(geos):
                ctx.set(core.layer, i)
                x = rng.integers(0, 2, (batch, g.n_in))
                words = [(word, int(k == g.words - 1)) for row in g.pack_rows(x) for k, word in enumerate(row)]
                beats, sent = [], 0
                while len(beats) < batch * g.groups:
                    offer = sent < len(words) and coin.random() >= 0.3
                    ctx.set(core.x.valid, offer)
                    if offer:
                        ctx.set(core.x.payload, {"data": words[sent][0], "last": words[sent][1]})
                    take = coin.random() >= 0.3
                    ctx.set(core.y.ready, take)
                    if offer and ctx.get(core.x.ready):
                        sent += 1
                    if take and ctx.get(core.y.valid):
                        beats.append([int(v) for v in ctx.get(core.y.payload).y])
                    await ctx.tick()
                ctx.set(core.x.valid, 0)
                ctx.set(core.y.ready, 0)
                full = np.asarray(beats, dtype=np.int64).reshape(batch, g.groups * 4)
                assert (full[:, g.n_out:] == 0).all(), (rnd, i)
                assert (g.unpack_outputs(beats) == ref(x, ws[i])).all(), (rnd, i)

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


# --- cocotb on Verilator ----------------------------------------------------------------------------------

SWEEP = [
    # (lanes_in, lanes_out, n_in, n_out, rows per test); each is its own Verilator build (~15-60 s first time)
    pytest.param((8, 4, 20, 10, 400), id="li8-lo4-n20x10"),  # partial last word and partial last group
    pytest.param((16, 1, 16, 3, 400), id="li16-lo1-n16x3"),  # one word per row (a result every cycle), 1 lane
    pytest.param((64, 8, 784, 20, 200), id="li64-lo8-n784x20"),  # MNIST fan-in, |y| up to 784 (11 bits)
    pytest.param((32, 8, 100, 16, 300), id="li32-lo8-n100x16", marks=pytest.mark.rtl_slow),
]


@pytest.mark.rtl
@pytest.mark.parametrize("case", SWEEP)
def test_xnor_engine_rtl(case):
    """Rerun one case with waveforms (a separate build): ``XNT_WAVES=1 pytest -k li8 ...``; repeat a
    random run with ``COCOTB_RANDOM_SEED=<seed from the log>``."""
    lanes_in, lanes_out, n_in, n_out, rows = case
    name = f"xnor_engine_li{lanes_in}_lo{lanes_out}_n{n_in}x{n_out}"
    w = np.random.default_rng(n_in * 1000 + n_out).integers(0, 2, (n_in, n_out), dtype=np.uint8)
    preload = build_root() / "xnor_engine" / f"{name}.npy"
    preload.parent.mkdir(parents=True, exist_ok=True)
    np.save(preload, w)
    dut = XnorEngine(n_in=n_in, n_out=n_out, lanes_in=lanes_in, lanes_out=lanes_out, weights=w)
    params = {"n_in": n_in, "n_out": n_out, "lanes_in": lanes_in, "lanes_out": lanes_out}
    run = run_cocotb(
        verilog=to_verilog(dut, "xnor_engine"),
        toplevel="xnor_engine",
        test_module="xnor_engine_tb",
        name=name,
        extra_env={"XNT_TB_PARAMS": json.dumps({**params, "rows": rows, "preload": str(preload)})},
        waves=bool(os.environ.get("XNT_WAVES")),
    )
    assert run.tests == 6
    measured = json.loads((run.build_dir / "cycles-preloaded.json").read_text())
    assert measured["measured"] == measured["model"] == cycles(n_in, n_out, rows, lanes_in, lanes_out)
