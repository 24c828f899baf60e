# amaranth: UnusedElaboratable=no
"""rtl_gen.conv_update.ConvUpdate (sgn(dW) of a conv layer: the windows of its input map against the po2 codes of
every position, on Po2Backward's dW unit) against the bit-exact model's conv sign gradient (sim.hw.arith
po2_backward_dw_conv, or po2_backward_dw_window_conv with hw.dw_window, as HwModel._dw calls them), in the Amaranth
simulator: two batches, the first at full rate against the exact cycle count of
rtl_gen.cycle_model.conv_update_cycles, the second with new data written with gaps and the output stalled."""

import random

import numpy as np
import pytest
from amaranth.sim import Simulator
from test_conv_layer import _config  # same folder

from rtl_gen.conv_update import ConvUpdate, ConvUpdateGeometry
from rtl_gen.cycle_model import conv_update_cycles
from sim.config import apply_overrides
from sim.hw import arith as A


def _geometry(B, C, H, W, Co, lanes_in, lanes_out, passes=1, window=0, padding="valid", dsp=False):
    cfg = apply_overrides(_config(B, C, H, W, Co, padding), [f"hw.dw_window={window}", f"hw.dw_passes={passes}",
                                                             f"hw.dw_dsp={str(dsp).lower()}"])
    return ConvUpdateGeometry.from_config(cfg, 0, lanes_in=lanes_in, lanes_out=lanes_out), cfg


def _batch(g: ConvUpdateGeometry, cfg, rng, top: int):
    """A random map of signs and random codes of fields up to ``top`` (a zero channel, a channel of one sign); the
    expected sgn(dW)."""
    c = g.conv
    B, Co, Ho, Wo = c.batch, c.out_channels, c.out_height, c.out_width
    x = rng.choice([-1, 1], (B, c.channels, c.height, c.width))
    field = rng.integers(0, top + 1, (B, Co, Ho, Wo)) * (rng.random((B, Co, Ho, Wo)) < 0.7)
    neg = rng.random((B, Co, Ho, Wo)) < 0.5
    field[:, 0] = 0  # a channel with no gradient: dW = 0
    neg[:, -1] = False  # a channel of one sign
    codes = A.Po2Codes(neg, field.astype(np.uint8), 0, 0)
    p = A.ArithParams.from_config(cfg)
    if g.window:
        dw = A.po2_backward_dw_window_conv(x, codes, g.window, c.kernel, c.padding, p)
    else:
        dw = A.po2_backward_dw_conv(x, codes, c.kernel, c.padding, p)
    return c.map_words(x), g.code_beats_of(neg, field), np.sign(dw).astype(np.int8)


def _run(g: ConvUpdateGeometry, cfg, seed: int):
    rng = np.random.default_rng(seed)
    dut = ConvUpdate(geometry=g)
    # the second batch's largest fields lie below the first's: hw.dw_window's maxima are the batch's own
    batches = [_batch(g, cfg, rng, top) for top in (g.po2.planes, g.po2.planes // 2)]
    got = [[] for _ in batches]
    stamps, idle_after = [], []
    coin = random.Random(seed)

    async def bench(ctx):
        for k, (words, beats, _) in enumerate(batches):
            idle, stall = (0.0, 0.0) if k == 0 else (0.3, 0.4)
            for a, word in enumerate(words):
                while coin.random() < idle:
                    await ctx.tick()
                ctx.set(dut.x_write.valid, 1)
                ctx.set(dut.x_write.payload, {"addr": a, "data": word})
                await ctx.tick()
            ctx.set(dut.x_write.valid, 0)
            for i in range(len(beats)):
                while coin.random() < idle:
                    ctx.set(dut.codes.valid, 0)
                    await ctx.tick()
                ctx.set(dut.codes.valid, 1)
                ctx.set(dut.codes.payload.code, [{"field": f, "neg": s} for f, s in beats[i]])
                await ctx.tick()
            ctx.set(dut.codes.valid, 0)
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            cycle = 1
            assert ctx.get(dut.busy)
            while True:
                ctx.set(dut.dw.ready, coin.random() >= stall)
                done = False
                if ctx.get(dut.dw.ready) and ctx.get(dut.dw.valid):
                    got[k].append(ctx.get(dut.dw.payload.as_value()))
                    done = bool(ctx.get(dut.dw.payload.last))
                await ctx.tick()
                if done:
                    break
                cycle += 1
            stamps.append(cycle)
            ctx.set(dut.dw.ready, 0)
            await ctx.tick()
            idle_after.append(not ctx.get(dut.busy))  # busy ends with the last dw beat

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert idle_after == [True, True]
    for k, (_, _, ref) in enumerate(batches):
        assert ref.any() and (ref == 0).any()
        assert (g.unpack(got[k]) == ref).all(), f"batch {k}: sgn(dW)"
    assert stamps[0] == conv_update_cycles(g), stamps


CASES = [
    # (B, Ci, H, W, Co, lanes_in, lanes_out, dw_passes, dw_window, padding, dw_dsp)
    pytest.param((2, 1, 6, 6, 4, 4, 4, 1, 0, "valid", False), id="b2-1x6x6-co4-li4-K3"),  # K = 3, the last padded
    pytest.param((2, 3, 7, 8, 6, 32, 4, 2, 0, "valid", False), id="b2-3x7x8-co6-li32-g2-p2"),  # padding lanes
    pytest.param((2, 2, 10, 10, 8, 8, 8, 1, 2, "valid", False), id="b2-2x10x10-co8-window2"),  # ternary codes
    pytest.param((2, 2, 6, 7, 5, 8, 4, 1, 0, "same", False), id="b2-2x6x7-co5-same"),  # each window twice
    pytest.param((2, 1, 6, 6, 4, 16, 4, 2, 3, "same", False), id="b2-1x6x6-co4-same-window3-p2"),
    pytest.param((2, 3, 8, 8, 6, 16, 4, 2, 0, "valid", True), id="b2-3x8x8-co6-p2-dsp"),  # DSP48 accumulators
    pytest.param((2, 2, 9, 9, 4, 8, 4, 1, 2, "same", True), id="b2-2x9x9-co4-same-window2-dsp"),
]


@pytest.mark.parametrize("case", CASES)
def test_conv_update_in_amaranth_simulator(case):
    B, C, H, W, Co, li, lo, passes, window, padding, dsp = case
    g, cfg = _geometry(B, C, H, W, Co, li, lo, passes, window, padding, dsp)
    assert bool(g.po2.dsp_fields) == dsp
    k = 3 if padding == "valid" else 1  # 3x3 kernels: Ho = H - 2 (valid) or H (same)
    assert g.po2.batch == g.copies * B * (H + 1 - k) * (W + 1 - k)
    _run(g, cfg, seed=B * 100 + Co + li)


def test_conv_update_geometry_widths_and_refusals():
    """The dW accumulators have the widths of sim.hw.widths for n = B Ho Wo (one more bit with same padding: 2 n
    beats); a dense layer is refused by name."""
    from sim.hw.widths import layer_bounds

    g, cfg = _geometry(2, 1, 6, 6, 4, 4, 4)
    assert g.po2.dw_width == layer_bounds(cfg)[0].widths()["dW"] == (32 << g.po2.span).bit_length() + 1
    g2, cfg2 = _geometry(2, 1, 6, 6, 4, 4, 4, padding="same")
    assert g2.po2.dw_width == layer_bounds(cfg2)[0].widths()["dW"] + 1 == (144 << g.po2.span).bit_length() + 1
    with pytest.raises(ValueError, match="dense layer"):
        ConvUpdateGeometry.from_config(cfg, 1, lanes_in=4, lanes_out=4)


@pytest.mark.rtl_slow
def test_conv_update_preset_second_layer():
    """The MNIST preset's second conv layer (16 -> 32 channels, 13x13 map, 11x11 positions) at B = 2."""
    from sim.config import load_config

    cfg = apply_overrides(load_config("configs/cnn_mnist.toml"), ["train.batch_size=2"])
    g = ConvUpdateGeometry.from_config(cfg, 1, lanes_in=64, lanes_out=16)
    assert g.po2.batch == 2 * 11 * 11  # every position's codes, though BN ran over the pooled ones (before_bn)
    _run(g, cfg, seed=9)
