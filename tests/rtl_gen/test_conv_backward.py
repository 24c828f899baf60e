# amaranth: UnusedElaboratable=no
"""rtl_gen.conv_backward.ConvLayerBackward (a pooled conv layer's max-pool backward routing and BN backward over
every position) against the bit-exact model's functions as HwModel.train_step applies them (sim.hw.arith
maxpool_route, then bn_backward over n = B Ho Wo positions), in the Amaranth simulator: two batches, the first at full
rate against the exact cycle count of rtl_gen.cycle_model.conv_layer_backward_cycles, the second with new data,
gaps on every input and both outputs stalled at random."""

import random

import numpy as np
import pytest
from amaranth.sim import Simulator
from test_conv_layer import ORDERS, _config  # same folder

from rtl_gen.conv_backward import ConvLayerBackward, ConvLayerBackwardCodes
from rtl_gen.conv_layer import ConvLayerGeometry
from rtl_gen.cycle_model import conv_layer_backward_cycles
from sim.hw import arith as A


def _batch(g: ConvLayerGeometry, rng, codes: bool):
    """Random retained x_hat, pool indices, masked pooled gradient and alpha (and S' with ``codes``); the expected
    Q beats (or po2 code beats), P1 (and the po2 bias)."""
    B, Co, Ho, Wo = g.conv.batch, g.conv.out_channels, g.conv.out_height, g.conv.out_width
    p, Hp, Wp = g.pooling.pool, g.next_height, g.next_width
    bd = g.bn.bounds
    first = g.before_bn  # BN over the pooled positions, the codes routed (HwModel.train_step's pool_first)
    xh = rng.choice([-1, 1], (B, Co, Hp, Wp) if first else (B, Co, Ho, Wo))
    idx = rng.integers(0, p * p, (B, Co, Hp, Wp))
    d = rng.integers(-bd.dx, bd.dx + 1, (B, Co, Hp, Wp)) * rng.integers(0, 2, (B, Co, Hp, Wp))  # times the mask
    alpha = rng.integers(0, bd.alpha_q + 1, Co)
    zero = np.zeros(Co, bool)
    if Co > 2:
        zero[1] = True  # a channel whose forward S was 0: Q = 0, P1 as usual
    dx = d if first else A.maxpool_route(d, idx, xh.shape, p)
    q, p1 = A.bn_backward(dx, xh, alpha, g.bn.params, zero)
    L, G = g.bn.lanes, g.bn.groups

    def lanes(gr):
        return [c for c in range(gr * L, gr * L + L)]

    def beats(a):  # order (b, h, v, g) over a's positions
        return [[a[b, c, h, v] if c < Co else None for c in lanes(gr)]
                for b in range(a.shape[0]) for h in range(a.shape[2]) for v in range(a.shape[3]) for gr in range(G)]

    xs = [{"x_hat": sum(int(t > 0) << k for k, t in enumerate(r) if t is not None)} for r in beats(xh)]
    pooled = [{"dx": [int(d[b, c, hp, vp]) if c < Co else 0 for c in lanes(gr)],
               "idx": [int(idx[b, c, hp, vp]) if c < Co else 0 for c in lanes(gr)]}
              for b in range(B) for hp in range(Hp) for vp in range(Wp) for gr in range(G)]
    alphas = [{"alpha_q": int(a), "zero": int(z)} for a, z in zip(alpha, zero, strict=True)]
    qs = [[0 if t is None else int(t) for t in r] for r in beats(q)]
    inputs = {"x": xs, "pooled": pooled, "alpha": alphas}
    if not codes:
        return inputs, qs, [int(v) for v in p1], None
    s_eff = np.maximum(rng.integers(0, g.bn.s_eff_max + 1, Co) >> rng.integers(0, 10, Co), 1)
    inputs["s_eff"] = [int(v) for v in s_eff]
    ref = A.po2_quantise(q, s_eff, SCALE, g.bn.params, times_batch=True)  # HwModel.train_step's call (hidden layer)
    codes = A.route_codes(ref, idx, (B, Co, Ho, Wo), p) if first else ref  # every position (b, h, v)
    cs = [[(0, 0) if f is None else (int(f), int(n)) for f, n in zip(rf, rn, strict=True)]
          for rf, rn in zip(beats(codes.field), beats(codes.neg), strict=True)]
    return inputs, cs, [int(v) for v in p1], (ref.bias, ref.unit_exp)


SCALE = -7  # the gradient scale exponent of the layer above's dX


def _run(g: ConvLayerGeometry, seed: int, codes: bool = False):
    rng = np.random.default_rng(seed)
    dut = ConvLayerBackwardCodes(geometry=g) if codes else ConvLayerBackward(geometry=g)
    out = dut.codes if codes else dut.q
    batches = [_batch(g, rng, codes) for _ in range(2)]
    got = [{"q": [], "p1": [], "bias": []} for _ in batches]
    stamps, busy = [], []
    coin = random.Random(seed)
    limit = 20 * conv_layer_backward_cycles(g, codes=codes)

    async def bench(ctx):
        if codes:
            ctx.set(dut.scale, SCALE)
        for k, (inputs, qs, *_) in enumerate(batches):
            idle, stall = (0.0, 0.0) if k == 0 else (0.3, 0.4)
            n = dict.fromkeys(inputs, 0)
            cycle = 0
            first = None
            while len(got[k]["q"]) < len(qs):
                ctx.set(out.ready, coin.random() >= stall)
                ctx.set(dut.p1.ready, coin.random() >= stall)
                if codes:
                    ctx.set(dut.bias.ready, coin.random() >= stall)
                for name, items in inputs.items():
                    port = getattr(dut, name)
                    offer = n[name] < len(items) and coin.random() >= idle
                    ctx.set(port.valid, offer)
                    if offer:
                        ctx.set(port.payload, items[n[name]])
                        if ctx.get(port.ready):
                            n[name] += 1
                            first = cycle if first is None else first
                if ctx.get(out.ready) and ctx.get(out.valid):
                    pl = ctx.get(out.payload)
                    got[k]["q"].append([(int(c.field), int(c.neg)) for c in pl.code] if codes
                                       else [int(v) for v in pl.q])
                if codes and ctx.get(dut.bias.ready) and ctx.get(dut.bias.valid):
                    got[k]["bias"].append((int(ctx.get(dut.bias.payload.bias)),
                                           int(ctx.get(dut.bias.payload.unit_exp))))
                if ctx.get(dut.p1.ready) and ctx.get(dut.p1.valid):
                    got[k]["p1"].append(int(ctx.get(dut.p1.payload.p1)))
                busy.append(ctx.get(dut.busy))
                await ctx.tick()
                cycle += 1
                assert cycle < limit, f"batch {k}: {len(got[k]['q'])} of {len(qs)} output beats after {cycle} cycles"
            stamps.append(cycle - first)
            for name in inputs:
                ctx.set(getattr(dut, name).valid, 0)
            for _ in range(3):  # the last q left while the router may still hand over its last replayed beat
                await ctx.tick()
            assert not ctx.get(dut.busy), f"batch {k}: still busy after its last output"

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    for k, (_, qs, p1, bias) in enumerate(batches):
        assert got[k]["p1"] == p1, f"batch {k}: P1"
        assert got[k]["q"] == qs, f"batch {k}: {'codes' if codes else 'Q'}"
        assert any(any(r) for r in qs)
        assert got[k]["bias"] == ([bias] if codes else [])
    assert sum(busy) > len(busy) // 2  # busy while the batch is in the unit
    assert stamps[0] == conv_layer_backward_cycles(g, codes=codes), stamps


CASES = [
    # (B, Ci, H, W, Co, padding, lanes_out)
    pytest.param((2, 1, 7, 7, 4, "valid", 4), id="b2-5x5-co4-l4"),  # Ho = 5: a dropped row and column
    pytest.param((2, 2, 6, 6, 5, "valid", 4), id="b2-4x4-co5-l4-g2"),  # two groups, padding lanes
    pytest.param((1, 1, 5, 6, 3, "same", 2), id="b1-5x6-same-co3-l2"),  # same padding, odd rows
]


@pytest.mark.parametrize("before_bn", ORDERS)
@pytest.mark.parametrize("case", CASES)
def test_conv_layer_backward_in_amaranth_simulator(case, before_bn):
    """Pooling the BN output: the pooled gradient routed to the argmax, BN backward over every position. With
    ``before_bn``: BN backward over the pooled positions, Q in their order."""
    B, C, H, W, Co, padding, lanes = case
    cfg = _config(B, C, H, W, Co, padding, before_bn)
    g = ConvLayerGeometry.from_config(cfg, 0, lanes_in=8, lanes_out=lanes)
    assert g.before_bn == before_bn
    _run(g, seed=B * 100 + Co + 2 * before_bn)


# before_bn: larger maps, where the po2 unit's PRO (a division per channel) is hidden behind the load and BN's first
# pass over the pooled positions (in CASES it is not, and holds the Q beats back: the cycle model counts both)
CASES_POOLED_BN = [
    pytest.param((2, 1, 9, 9, 4, "valid", 4), id="b2-7x7-co4-l4"),  # Ho = 7: a dropped row and column
    pytest.param((2, 2, 8, 8, 5, "valid", 4), id="b2-6x6-co5-l4-g2"),  # two groups, padding lanes
    pytest.param((1, 1, 7, 8, 3, "same", 2), id="b1-7x8-same-co3-l2"),  # same padding, a dropped row
]


@pytest.mark.parametrize(("case", "before_bn"), [pytest.param(c.values[0], o.values[0], id=f"{c.id}-{o.id}")
                                                 for o in ORDERS for c in CASES]
                         + [pytest.param(c.values[0], True, id=f"{c.id}-pool-before-bn") for c in CASES_POOLED_BN])
def test_conv_layer_backward_codes_in_amaranth_simulator(case, before_bn):
    """The same with the po2 unit: the codes and bias of the layer's dY (and P1); with ``before_bn`` the pooled
    positions' codes routed to every position (sim.hw.arith.route_codes)."""
    B, C, H, W, Co, padding, lanes = case
    cfg = _config(B, C, H, W, Co, padding, before_bn)
    g = ConvLayerGeometry.from_config(cfg, 0, lanes_in=8, lanes_out=lanes)
    _run(g, seed=B * 100 + Co + 1 + 2 * before_bn, codes=True)


@pytest.mark.rtl_slow
def test_conv_layer_backward_preset_second_layer():
    """The MNIST preset's second conv layer (32 channels, 11x11 positions, pooled to 5x5 before BN) at B = 2 (the po2
    unit's PRO, 672 cycles, outlasts BN's first pass over the 2 x 25 pooled positions)."""
    from sim.config import apply_overrides, load_config

    cfg = apply_overrides(load_config("configs/cnn_mnist.toml"), ["train.batch_size=2"])
    g = ConvLayerGeometry.from_config(cfg, 1, lanes_in=64, lanes_out=16)
    assert g.before_bn  # the preset pools before BN
    _run(g, seed=7)
    _run(g, seed=8, codes=True)
