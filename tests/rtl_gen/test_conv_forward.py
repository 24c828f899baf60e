# amaranth: UnusedElaboratable=no
"""rtl_gen.conv_forward.ConvForward (one conv layer's forward phase with 2x2 max pooling) against the bit-exact model
(sim.hw.model.HwModel's forward pass: the layer's Y at every position, the pooled maxima and argmax indices), in
the Amaranth simulator: two batches, the first at full rate (the exact cycle count of
rtl_gen.cycle_model.conv_forward_cycles), the second with a new map and new weights written with gaps and
both outputs stalled at random."""

import random

import numpy as np
import pytest
from amaranth.sim import Simulator

from rtl_gen.conv_forward import ConvForward, ConvForwardGeometry
from rtl_gen.conv_pool import pool_reference
from rtl_gen.cycle_model import conv_forward_cycles
from sim.config import apply_overrides, config_from_dict
from sim.hw import arith as A
from sim.hw.model import HwModel, StepTrace


def _model_forward(B, C, H, W, Co, x, w, padding):
    """Layer 0's Y and pool indices by HwModel.forward_train for a conv(Co)-maxpool-dense network."""
    d = {"name": "conv_forward", "model": {"input_shape": [C, H, W], "num_classes": 4, "layers": [
        {"type": "conv", "channels": Co, "kernel": 3, "padding": padding}, {"type": "maxpool", "pool": 2},
        {"type": "dense", "units": 4}]}, "train": {"batch_size": B, "epochs": 1}}
    model = HwModel(apply_overrides(config_from_dict(d), ["hw.input=binary"]))
    model.w[0] = np.asarray(w, np.int8)
    trace = StepTrace()
    model.forward_train(np.asarray(x).reshape(B, -1), trace)
    return trace.y[0], trace.pool_idx[0]


def _expected(g: ConvForwardGeometry, y: np.ndarray, idx: np.ndarray):
    """The Y beats (order (b, h, v, g): values, padding lanes 0, and ``last`` on the last group) and the pooled
    beats (values, indices) of pool_reference, after checking the pool reference against the model's own indices."""
    G, L = g.engine.groups, g.lanes_out
    yp = np.zeros((g.batch, G * L, g.out_height, g.out_width), np.int64)
    yp[:, :g.out_channels] = y
    ys = [([int(yp[b, gr * L + lane, h, v]) for lane in range(L)], int(gr == G - 1))
          for b in range(g.batch) for h in range(g.out_height) for v in range(g.out_width) for gr in range(G)]
    _, pooled = pool_reference(g.pooling, yp)
    model = [([int(t) for t in A.maxpool_select(y, idx, g.pool)[b, gr * L:(gr + 1) * L, hp, vp]],
              [int(t) for t in idx[b, gr * L:(gr + 1) * L, hp, vp]])
             for b in range(g.batch) for hp in range(g.out_height // g.pool) for vp in range(g.out_width // g.pool)
             for gr in range(G)]
    real = [min(L, g.out_channels - gr * L) for gr in range(G)] * (len(pooled) // G)
    assert [(v[:n], i[:n]) for (v, i), n in zip(pooled, real, strict=True)] == model
    return ys, pooled


async def load_and_start(ctx, dut, g: ConvForwardGeometry, x, w, *, gaps: float, coin, at_start=None) -> int:
    """Write the map ``x`` and the weights ``w`` into ``dut`` (a ConvForward or a unit with its ``x_write`` and
    ``w_load``) with gaps of probability ``gaps``, then pulse ``start`` (``at_start()`` just before); returns the
    cycles before the start pulse's."""
    now = 0
    for port, beats in ((dut.x_write, [{"addr": a, "data": d} for a, d in enumerate(g.map_words(x))]),
                        (dut.w_load, [{"lane": ln, "addr": a, "data": d} for ln, a, d in g.weight_beats(w)])):
        for beat in beats:
            while coin.random() < gaps:
                ctx.set(port.valid, 0)
                await ctx.tick()
                now += 1
            ctx.set(port.payload, beat)
            ctx.set(port.valid, 1)
            await ctx.tick()
            now += 1
        ctx.set(port.valid, 0)
    if at_start is not None:
        at_start()
    ctx.set(dut.start, 1)
    await ctx.tick()
    ctx.set(dut.start, 0)
    return now


def batch_driver(dut, g: ConvForwardGeometry, batches, *, running, marks, coin, p_idle: float, limit: int, missing,
                 idle=()):
    """A testbench process running ``batches`` (``(x, w, ...)``) one after the other through :func:`load_and_start`
    (gaps from the second batch on), each until ``missing(n)`` is empty (it names what batch ``n`` still lacks;
    more than ``limit`` cycles fail); ``running[0]`` is the batch the sinks are in, ``marks`` gets each start
    cycle. After a batch ``dut.busy`` and every signal of ``idle`` must be low. Every process counts its own
    cycles (one tick per await)."""

    async def driver(ctx):
        now = 0
        for n, (x, w, *_) in enumerate(batches):
            before = await load_and_start(ctx, dut, g, x, w, gaps=p_idle if n else 0.0, coin=coin,
                                          at_start=lambda n=n: running.__setitem__(0, n))
            marks.append(now + before)
            now += before + 1
            while missing(n):
                assert now - marks[n] < limit, f"batch {n}: {missing(n)} after {limit} cycles"
                await ctx.tick()
                now += 1
            await ctx.tick()
            now += 1
            assert not ctx.get(dut.busy), "busy after the batch's last beat"
            assert not any(ctx.get(s) for s in idle)
    return driver


def batch_sink(port, out, n_out: int, *, running, coin, p_stall: float, stamp=None, convert=lambda pl: pl):
    """A testbench process taking ``n_out`` beats of stream ``port`` per batch into ``out[n]`` (``convert``ed;
    ``running[0]`` is the batch), ``ready`` low with probability ``p_stall`` from the second batch on;
    ``stamp[n]``: the cycle of batch ``n``'s last beat."""

    async def run(ctx):
        now = 0
        while True:
            n = running[0]
            ready = len(out[n]) < n_out and coin.random() >= (p_stall if n else 0.0)
            ctx.set(port.ready, ready)
            if ready and ctx.get(port.valid):
                out[n].append(convert(ctx.get(port.payload)))
                if stamp is not None:
                    stamp[n] = now
            await ctx.tick()
            now += 1
    return run


def run_conv_forward(g: ConvForwardGeometry, batches, *, p_idle: float, p_stall: float, seed: int):
    """Run ``batches`` (``(x, w)`` pairs) one after the other: the first with no gaps and no stalls, the others with
    gaps of probability ``p_idle`` in the writes and ``ready`` low with probability ``p_stall`` on each output.
    Returns per batch the Y beats, the pooled beats and the cycles from ``start`` to the last Y beat (included)."""
    dut = ConvForward(geometry=g)
    coin = random.Random(seed)
    n_y = g.batch * g.out_height * g.out_width * g.engine.groups
    n_p = g.pooling.beats_out()
    marks = []  # per batch: the start cycle
    got_y = [[] for _ in batches]
    got_p = [[] for _ in batches]
    last_y = [0] * len(batches)
    running = [0]  # the batch the sinks are in
    limit = 20 * g.cycles()  # a stuck handshake fails instead of hanging

    def missing(n):
        short = len(got_y[n]) < n_y or len(got_p[n]) < n_p
        return f"{len(got_y[n])} Y and {len(got_p[n])} pooled beats" if short else ""

    driver = batch_driver(dut, g, batches, running=running, marks=marks, coin=coin, p_idle=p_idle, limit=limit,
                          missing=missing, idle=[dut.y.valid, dut.pooled.valid])

    def sink(port, out, n_out, stamp):
        return batch_sink(port, out, n_out, running=running, coin=coin, p_stall=p_stall,
                          stamp=last_y if stamp else None)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(sink(dut.y, got_y, n_y, True), background=True)
    sim.add_testbench(sink(dut.pooled, got_p, n_p, False), background=True)
    sim.add_testbench(driver)
    sim.run()
    ys = [[([int(t) for t in pl.y], int(pl.last)) for pl in beats] for beats in got_y]
    ps = [[([int(t) for t in pl.y], [int(t) for t in pl.idx]) for pl in beats] for beats in got_p]
    return ys, ps, [end - start + 1 for start, end in zip(marks, last_y, strict=True)]


CASES = [
    # B, Ci, H, W, Co, lanes_in, lanes_out, padding: K = ceil(9 Ci / li) words, G = ceil(Co / lo) groups
    pytest.param((2, 1, 8, 8, 4, 8, 4, "valid"), id="ci1-8x8-co4-K2-G1"),
    pytest.param((2, 3, 10, 10, 8, 32, 4, "valid"), id="ci3-10x10-co8-K1-G2"),
    pytest.param((2, 3, 8, 8, 6, 8, 4, "valid"), id="ci3-8x8-co6-K4-G2-padlanes"),
    pytest.param((2, 1, 9, 10, 5, 16, 8, "valid"), id="ci1-9x10-co5-K1-G1-dropped-row"),
    pytest.param((2, 1, 8, 8, 4, 16, 4, "same"), id="same-ci1-8x8-co4-K1-G1"),
    pytest.param((2, 3, 7, 8, 6, 8, 4, "same"), id="same-ci3-7x8-co6-K4-G2-dropped-row"),
]


def _check(case, *, seed, p_idle=0.3, p_stall=0.4):
    B, C, H, W, Co, li, lo, padding = case
    g = ConvForwardGeometry(batch=B, channels=C, height=H, width=W, out_channels=Co, lanes_in=li, lanes_out=lo,
                            padding=padding)
    rng = np.random.default_rng(seed)
    batches, want = [], []
    for _ in range(2):
        x = rng.choice(np.array([-1, 1], np.int8), size=(B, C, H, W))
        w = rng.choice(np.array([-1, 1], np.int8), size=(Co, C, 3, 3))
        x[0, :, :4, :4] = w[0, :, :3, :3].max()  # a few windows with many ties and the largest |Y|
        batches.append((x, w))
        want.append(_expected(g, *_model_forward(B, C, H, W, Co, x, w, padding)))
    ys, ps, cycles = run_conv_forward(g, batches, p_idle=p_idle, p_stall=p_stall, seed=seed)
    for n, (wy, wp) in enumerate(want):
        assert len(ys[n]) == len(wy)
        bad = [i for i, (a, b) in enumerate(zip(ys[n], wy, strict=True)) if a != b]
        assert not bad, f"batch {n}: {len(bad)} Y beats differ, the first at beat {bad[:1]}"
        assert ps[n] == wp, f"batch {n}: pooled beats differ"
    assert cycles[0] == g.cycles() == conv_forward_cycles(
        batch=B, channels=C, height=H, width=W, out_channels=Co, lanes_in=li, lanes_out=lo, padding=padding)
    return g


@pytest.mark.parametrize("case", CASES)
def test_conv_forward_equals_the_model(case):
    _check(case, seed=sum(case[:-1]))


@pytest.mark.rtl_slow
@pytest.mark.parametrize("case", [
    pytest.param((2, 1, 28, 28, 16, 64, 16, "valid"), id="preset-layer0-b2"),  # configs/cnn_mnist.toml's first
    pytest.param((2, 16, 13, 13, 32, 64, 16, "valid"), id="preset-layer1-b2-K3-G2"),  # its second (13x13 pooled)
    pytest.param((2, 16, 13, 13, 32, 64, 16, "same"), id="same-layer1-b2-K3-G2"),
])
def test_conv_forward_larger(case):
    _check(case, seed=7, p_idle=0.5, p_stall=0.6)


def test_geometry():
    g = ConvForwardGeometry(batch=24, channels=1, height=28, width=28, out_channels=16, lanes_in=64, lanes_out=16)
    assert (g.out_height, g.map_depth, g.map_width, g.engine.words, g.engine.groups) == (26, 672, 28, 1, 1)
    assert (g.pooling.out_height, g.pooling.y_width) == (13, 5)
    assert g.cycles() == 5 + (24 * 26 - 1) * (25 + 4) + 26 + 5  # k + Wo cycles per output row
    same = ConvForwardGeometry(batch=2, channels=2, height=5, width=6, out_channels=4, lanes_in=8, lanes_out=4,
                               padding="same")
    assert (same.pad, same.out_height, same.out_width, len(same.calibration), same.calibration[5]) == (1, 5, 6, 10, 0)
    assert same.cycles() == 10 * 3 + 1 + (2 * 5 - 1) * (5 * 3 + 3 + 3) + 6 * 3 + 5  # 10 calibration windows first
    with pytest.raises(ValueError, match="needs maps of at least 4 rows and columns, not 3x8"):
        ConvForwardGeometry(batch=1, channels=1, height=3, width=8, out_channels=4, lanes_in=8, lanes_out=4,
                            kernel=5, padding="same")
    with pytest.raises(ValueError, match="padding must be 'valid' or 'same', not 'full'"):
        ConvForwardGeometry(batch=1, channels=1, height=8, width=8, out_channels=4, lanes_in=8, lanes_out=4,
                            padding="full")
    with pytest.raises(ValueError, match="lanes_in must be an integer in 1..4096, not 0"):
        ConvForwardGeometry(batch=1, channels=1, height=8, width=8, out_channels=4, lanes_in=0, lanes_out=4)
    with pytest.raises(ValueError, match="does not fit 2 rows"):
        ConvForwardGeometry(batch=1, channels=1, height=2, width=8, out_channels=4, lanes_in=8, lanes_out=4)


@pytest.mark.parametrize("kernel, shape", [(3, (2, 3, 6, 5)), (5, (1, 2, 5, 4))])
def test_calibration_gives_the_contracts_same_padding(kernel, shape):
    """The engine's Y with the padding as -1 bits plus P of the calibration windows (their Y summed with the
    all-ones window's, halved) is sim.hw.arith.conv_xnor_popcount with same padding (padding skipped)."""
    B, C, H, W = shape
    Co = 3
    g = ConvForwardGeometry(batch=B, channels=C, height=H, width=W, out_channels=Co, lanes_in=8, lanes_out=4,
                            kernel=kernel, padding="same")
    rng = np.random.default_rng(kernel)
    x = rng.choice(np.array([-1, 1]), size=(B, C, H, W))
    w = rng.choice(np.array([-1, 1]), size=(Co, C, kernel, kernel))
    n, pd = C * kernel * kernel, g.pad
    wm = w.reshape(Co, n)

    def engine(bits):  # the engine's Y of one window of bits (1: +1, 0: -1)
        return wm @ (2 * np.array([(bits >> t) & 1 for t in range(n)]) - 1)

    y_cal = [engine(b) for b in g.calibration]
    table = [(yc + y_cal[0]) // 2 for yc in y_cal[1:]]
    xp = np.pad(x, ((0, 0), (0, 0), (pd, pd), (pd, pd)), constant_values=-1)  # the padding as -1 bits

    def cls(pos, size):
        return pos if pos < pd else pos + 2 * pd + 1 - size if pos >= size - pd else pd

    y = np.zeros((B, Co, H, W), np.int64)
    for b in range(B):
        for h in range(H):
            for v in range(W):
                y[b, :, h, v] = wm @ xp[b, :, h:h + kernel, v:v + kernel].reshape(-1) \
                    + table[cls(h, H) * kernel + cls(v, W)]
    np.testing.assert_array_equal(y, A.conv_xnor_popcount(x, w, "same", 1))
