# amaranth: UnusedElaboratable=no
"""rtl_gen.conv_dx.ConvDx (dX of a conv layer: the transposed convolution of its po2 codes, on Po2Backward's dX unit
over windows of the code map) against the bit-exact model's conv dX (sim.hw.arith.po2_backward_dx_conv, as
HwModel.train_step calls it for a conv layer above the first), in the Amaranth simulator: two batches, the first
at full rate against the exact cycle count of rtl_gen.cycle_model.conv_dx_cycles, the second with new codes and
weights written with gaps and the output stalled."""

import random

import numpy as np
import pytest
from amaranth.sim import Simulator

from rtl_gen.conv_dx import ConvDx, ConvDxGeometry
from rtl_gen.cycle_model import conv_dx_cycles
from sim.config import apply_overrides, config_from_dict
from sim.hw import arith as A


def _config(B, Ci, H, W, Co, padding, pool=False):
    """Two conv layers: the first (same padding, then a 2x2 max pool with ``pool``) makes the Ci x H x W map of the
    second, the layer under test."""
    first = [{"type": "conv", "channels": Ci, "kernel": 3, "padding": "same"}]
    first += [{"type": "maxpool", "pool": 2}] if pool else []
    d = {"name": "conv_dx", "model": {"input_shape": [1, H * (1 + pool), W * (1 + pool)], "num_classes": 4,
                                      "layers": [*first, {"type": "conv", "channels": Co, "kernel": 3,
                                                          "padding": padding}, {"type": "dense", "units": 4}]},
         "train": {"batch_size": B, "epochs": 1}}
    return apply_overrides(config_from_dict(d), ["hw.input=binary"])


def _batch(g: ConvDxGeometry, cfg, rng):
    """Random +-1 weights and random codes (a zero channel, a channel of one sign, the largest field somewhere; junk
    in the padding lanes, which the unit ignores); the expected dX."""
    B, Co, Ho, Wo = g.batch, g.out_channels, g.out_height, g.out_width
    w = rng.choice([-1, 1], (Co, g.channels, g.kernel, g.kernel))
    planes = g.po2.planes
    field = rng.integers(0, planes + 1, (B, Co, Ho, Wo)) * (rng.random((B, Co, Ho, Wo)) < 0.8)
    neg = rng.random((B, Co, Ho, Wo)) < 0.5
    field[:, 0] = 0  # a channel with no gradient
    neg[:, -1] = False  # a channel of one sign
    field[0, -1, 0, 0] = planes
    codes = A.Po2Codes(neg, field.astype(np.uint8), 0, 0)
    dx, _ = A.po2_backward_dx_conv(codes, w, g.padding, A.ArithParams.from_config(cfg))
    beats = g.code_beats_of(neg, field)
    real = Co - (g.groups - 1) * g.lanes  # lanes of the last group that are channels; the others get junk codes
    for beat in beats[g.groups - 1::g.groups]:
        beat[real:] = [(int(rng.integers(1, planes + 1)), int(rng.integers(0, 2))) for _ in beat[real:]]
    return beats, g.weight_beats(w), dx


async def _put(ctx, port, payloads, idle, coin):
    """Each payload on ``port`` in turn, with idle cycles at random (``idle``: the chance of one more)."""
    for payload in payloads:
        ctx.set(port.valid, 0)
        while coin.random() < idle:
            await ctx.tick()
        ctx.set(port.valid, 1)
        ctx.set(port.payload, payload)
        await ctx.tick()
    ctx.set(port.valid, 0)


async def _take(ctx, port, stall, coin, limit):
    """The beats of ``port`` up to the one flagged ``last`` (``ready`` low at random: ``stall``), and the cycle of
    that beat counted from the cycle before the call's; fails after ``limit`` cycles without it."""
    beats, cycle = [], 0
    last = False
    while not last:
        cycle += 1
        assert cycle <= limit, f"no last dx beat in {limit} cycles ({len(beats)} beats)"
        ctx.set(port.ready, coin.random() >= stall)
        if ctx.get(port.ready) and ctx.get(port.valid):
            beat = ctx.get(port.payload)
            last = bool(beat.last)
            beats.append({"dx": [int(v) for v in beat.dx], "last": int(beat.last)})
        await ctx.tick()
    ctx.set(port.ready, 0)
    return beats, cycle


def _run(g: ConvDxGeometry, cfg, seed: int):
    rng = np.random.default_rng(seed)
    dut = ConvDx(geometry=g)
    batches = [_batch(g, cfg, rng) for _ in range(2)]
    got, stamps, idle_after = [], [], []
    coin = random.Random(seed)

    async def bench(ctx):
        for k, (codes, weights, _) in enumerate(batches):
            idle, stall = (0.0, 0.0) if k == 0 else (0.3, 0.4)
            await _put(ctx, dut.w_load, [{"lane": lane, "addr": a, "data": d} for lane, a, d in weights], idle, coin)
            await _put(ctx, dut.codes, [{"code": [{"field": f, "neg": s} for f, s in beat]} for beat in codes],
                       idle, coin)
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            assert ctx.get(dut.busy)
            beats, cycle = await _take(ctx, dut.dx, stall, coin, 4 * conv_dx_cycles(g) + 100)
            got.append(g.unpack(beats))
            stamps.append(cycle)
            idle_after.append(not ctx.get(dut.busy))  # busy ends with the last dx beat

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    refs = [ref for _, _, ref in batches]
    assert all(ref.any() for ref in refs)
    assert [(a == b).all() for a, b in zip(got, refs, strict=True)] == [True, True], "dX of batch 0 / 1"
    assert idle_after == [True, True]
    assert stamps[0] == conv_dx_cycles(g), stamps


CASES = [
    # (B, Ci, H, W, Co, lanes, dx_lanes, padding)
    pytest.param((2, 1, 5, 6, 4, 4, 8, "valid"), id="b2-ci1-5x6-co4-valid"),  # Ci 1: 3 padding lanes a dx beat
    pytest.param((2, 6, 6, 5, 5, 4, 8, "same"), id="b2-ci6-6x5-co5-g2-same"),  # 2 groups, padding lanes, K' 2
    pytest.param((2, 3, 6, 6, 8, 8, 16, "valid"), id="b2-ci3-6x6-co8-valid"),
    pytest.param((2, 10, 5, 5, 2, 4, 2, "valid"), id="b2-ci10-5x5-co2-k3-engine-bound"),  # K' 3, G' 9: the engine
    pytest.param((2, 2, 4, 5, 6, 4, 4, "same"), id="b2-ci2-4x5-co6-g2-same"),  # binds the rows' rate
    pytest.param((2, 3, 5, 6, 8, 2, 72, "valid"), id="b2-ci3-5x6-co8-g4-packer-bound"),  # G' 1: the row reads bind
]


@pytest.mark.parametrize("case", CASES)
def test_conv_dx_in_amaranth_simulator(case):
    B, Ci, H, W, Co, lanes, dx_lanes, padding = case
    cfg = _config(B, Ci, H, W, Co, padding)
    g = ConvDxGeometry.from_config(cfg, 1, lanes_in=dx_lanes, lanes_out=lanes)
    assert (g.channels, g.height, g.width, g.out_channels) == (Ci, H, W, Co)
    _run(g, cfg, seed=B * 100 + Co * 10 + Ci)


def test_conv_dx_geometry_and_refusals():
    """dX has the width of sim.hw.widths (Co min(k, Ho) min(k, Wo) addends of 2^span); W' is the kernel flipped;
    the first layer (no dX) and a dense layer are refused by name."""
    from sim.hw.widths import layer_bounds

    cfg = _config(2, 3, 6, 6, 8, "valid")
    g = ConvDxGeometry.from_config(cfg, 1, lanes_in=16, lanes_out=8)
    assert g.dx_width == layer_bounds(cfg)[1].widths()["dX"] == (8 * 9 << g.po2.span).bit_length() + 1
    assert (g.words, g.po2.bank.groups, g.row_words) == (1, 5, 4)
    w = np.arange(8 * 3 * 9).reshape(8, 3, 3, 3)
    assert g.transposed_weights(w)[2, 5 * 9 + 1 * 3 + 0] == w[5, 2, 1, 2]
    with pytest.raises(ValueError, match="layer_index 0 is the first layer, which has no dX"):
        ConvDxGeometry.from_config(cfg, 0, lanes_in=16, lanes_out=8)
    with pytest.raises(ValueError, match="layer_index 2 is a dense layer"):
        ConvDxGeometry.from_config(cfg, 2, lanes_in=16, lanes_out=8)
    with pytest.raises(ValueError, match="layer_index 3 is not a weight layer"):
        ConvDxGeometry.from_config(cfg, 3, lanes_in=16, lanes_out=8)


@pytest.mark.parametrize("lanes", [4, 8])
def test_conv_dx_joins_the_pooled_input_of_the_layer_below(lanes):
    """The dx beats are what ConvLayerBackward of the pooled layer below takes on ``pooled`` (besides the indices):
    the same lanes and value width, one beat per pooled position and channel group."""
    from rtl_gen.conv_backward import ConvLayerBackward
    from rtl_gen.conv_layer import ConvLayerGeometry

    cfg = _config(2, 6, 5, 4, 3, "valid", pool=True)
    g = ConvDxGeometry.from_config(cfg, 1, lanes_in=16, lanes_out=lanes)
    below = ConvLayerGeometry.from_config(cfg, 0, lanes_in=16, lanes_out=lanes)
    assert (g.channels, g.height, g.width) == (6, 5, 4) == (below.conv.out_channels, below.next_height,
                                                             below.next_width)
    assert g.dx_layout["dx"].shape == ConvLayerBackward(geometry=below).pooled_layout["dx"].shape
    assert g.dx_beats == 2 * 5 * 4 * below.bn.groups


@pytest.mark.rtl_slow
def test_conv_dx_preset_second_layer():
    """The MNIST preset's second conv layer (codes of 32 channels on 11x11 positions, dX of 16 channels on the 13x13
    pooled map of the first) at B = 2."""
    from sim.config import load_config

    cfg = apply_overrides(load_config("configs/cnn_mnist.toml"), ["train.batch_size=2"])
    g = ConvDxGeometry.from_config(cfg, 1, lanes_in=64, lanes_out=16)
    _run(g, cfg, seed=9)
