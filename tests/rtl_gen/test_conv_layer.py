# amaranth: UnusedElaboratable=no
"""rtl_gen.conv_layer.ConvLayerForward (one conv layer's whole forward phase: conv, BN over every position, 2x2 max
pooling, the pooled signs as the next layer's map) against the bit-exact model (sim.hw.model.HwModel.forward_train
of a conv-maxpool-dense network: x_hat of every position, the pool indices, the pooled x_hat and mask, the next
layer's input, the BN statistics), in the Amaranth simulator: two batches, the first from the model's power-on
state (the pooled layer's initial bias, sim.reference.ops.pooled_bn_beta) at full rate against the exact cycle
count of rtl_gen.cycle_model.conv_layer_forward_cycles, the second with new data, random biases, gaps on every
input and every output stalled at random."""

import random
from dataclasses import replace

import numpy as np
import pytest
from amaranth import Elaboratable, Module
from amaranth.lib import wiring
from amaranth.sim import Simulator
from pysim_host import bn_param_host, to_signed  # same folder
from test_conv_forward import batch_driver, batch_sink, load_and_start

from rtl_gen.controller import RUNNING_LATENCY, SPACE_BETA, SPACE_MU, SPACE_S, BnParamUnit
from rtl_gen.conv_layer import ConvLayerForward, ConvLayerGeometry
from sim.config import apply_overrides, config_from_dict
from sim.hw import arith as A
from sim.hw.model import HwModel, StepTrace
from sim.reference.ops import pooled_bn_beta

ORDERS = [pytest.param(False, id="pool-after-bn"), pytest.param(True, id="pool-before-bn")]  # the maxpool's before_bn


def _config(B, C, H, W, Co, padding, before_bn=False):
    d = {"name": "conv_layer", "model": {"input_shape": [C, H, W], "num_classes": 4, "layers": [
        {"type": "conv", "channels": Co, "kernel": 3, "padding": padding},
        {"type": "maxpool", "pool": 2, "before_bn": before_bn}, {"type": "dense", "units": 4}]},
         "train": {"batch_size": B, "epochs": 1}}
    return apply_overrides(config_from_dict(d), ["hw.input=binary"])


def _expected(g: ConvLayerGeometry, model: HwModel, x, w, beta):
    """The model's forward pass of layer 0 as the unit's output beats."""
    model.w[0] = np.asarray(w, np.int8)
    model.beta[0] = np.asarray(beta, np.int64)
    trace = StepTrace()
    saved, _ = model.forward_train(np.asarray(x).reshape(g.conv.batch, -1), trace)
    fwd, idx = trace.bn[0], trace.pool_idx[0]
    L, G, Co = g.conv.lanes_out, g.bn.groups, g.conv.out_channels
    B, Ho, Wo = g.conv.batch, g.conv.out_height, g.conv.out_width
    Hp, Wp = g.next_height, g.next_width

    def bits(a, b, h, v, gr):  # lanes of group gr at (b, h, v) as an integer (padding lanes 0)
        return sum(int(a[b, gr * L + lane, h, v] > 0) << lane for lane in range(min(L, Co - gr * L)))

    xh = fwd.x_hat  # every position's, or with before_bn the pooled positions' (BN ran over the pooled Y)
    assert xh.shape == ((B, Co, Hp, Wp) if g.before_bn else (B, Co, Ho, Wo))
    px = xh if g.before_bn else A.maxpool_select(xh, idx, 2)
    pm = fwd.mask if g.before_bn else A.maxpool_select(fwd.mask, idx, 2)
    nxt = saved[0][4]  # the pooled mask the model keeps; the next layer's input is px
    assert (pm == nxt).all()
    xs = [(bits(xh, b, h, v, gr), int(gr == G - 1)) for b in range(B) for h in range(xh.shape[2])
          for v in range(xh.shape[3]) for gr in range(G)]
    pooled_pos = [(b, hp, vp, gr) for b in range(B) for hp in range(Hp) for vp in range(Wp) for gr in range(G)]
    idxs = [[int(idx[b, gr * L + lane, hp, vp]) for lane in range(min(L, Co - gr * L))]
            for b, hp, vp, gr in pooled_pos]
    pooled = [(bits(px, b, hp, vp, gr), bits(pm, b, hp, vp, gr)) for b, hp, vp, gr in pooled_pos]
    rows = list(enumerate(g.next_words(px)))
    stats = [tuple(int(v) for v in (fwd.sum_y[ch], fwd.S[ch], fwd.S_eff[ch], fwd.theta[ch], fwd.theta_lo[ch],
                                    fwd.theta_hi[ch], fwd.alpha_q[ch], fwd.C[ch])) for ch in range(Co)]
    return {"x": xs, "pool_idx": idxs, "pooled": pooled, "next_write": rows, "stats": stats}


def _beat(name, pl, g):
    if name == "x":
        return int(pl.x_hat), int(pl.last)
    if name == "pool_idx":
        return [int(t) for t in pl.idx]
    if name == "pooled":
        return int(pl.x_hat), int(pl.mask)
    if name == "next_write":
        return int(pl.addr), int(pl.data)
    return tuple(int(getattr(pl, k)) for k in ("sum_y", "S", "S_eff", "theta", "theta_lo", "theta_hi", "alpha_q",
                                              "C"))


OUTPUTS = ("x", "pool_idx", "pooled", "next_write", "stats")


def run_conv_layer(g: ConvLayerGeometry, batches, *, p_idle: float, p_stall: float, seed: int):
    """Run ``batches`` (``(x, w, beta)``) one after the other, the first with no gaps and no stalls, the others with
    gaps of probability ``p_idle`` on the inputs and ``ready`` low with probability ``p_stall`` on every output.
    Returns per batch the beats of every output and the cycles from ``start`` to the last ``stats`` beat."""
    dut = ConvLayerForward(geometry=g)
    c = g.conv
    coin = random.Random(seed)
    counts = {"x": g.beats, "pool_idx": c.pooling.beats_out(), "pooled": c.pooling.beats_out(),
              "next_write": g.next_depth, "stats": c.out_channels}
    got = [{k: [] for k in OUTPUTS} for _ in batches]
    marks, last_stats = [], [0] * len(batches)
    running = [0]
    limit = 20 * g.cycles()

    def missing(n):
        short = [len(got[n][k]) for k in OUTPUTS]
        return f"{short} beats" if any(len(got[n][k]) < counts[k] for k in OUTPUTS) else ""

    driver = batch_driver(dut, c, batches, running=running, marks=marks, coin=coin, p_idle=p_idle, limit=limit,
                          missing=missing)

    async def beta_source(ctx):
        for n, (_, _, beta) in enumerate(batches):
            while running[0] != n or len(marks) <= n:
                await ctx.tick()
            for v in beta:
                while n and coin.random() < p_idle:
                    ctx.set(dut.beta.valid, 0)
                    await ctx.tick()
                ctx.set(dut.beta.payload, int(v))
                ctx.set(dut.beta.valid, 1)
                await ctx.tick().until(dut.beta.ready)
            ctx.set(dut.beta.valid, 0)

    def sink(name):
        return batch_sink(getattr(dut, name), [b[name] for b in got], counts[name], running=running, coin=coin,
                          p_stall=p_stall, stamp=last_stats if name == "stats" else None,
                          convert=lambda pl: _beat(name, pl, g))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    for name in OUTPUTS:
        sim.add_testbench(sink(name), background=True)
    sim.add_testbench(beta_source, background=True)
    sim.add_testbench(driver)
    sim.run()
    return got, [end - start + 1 for start, end in zip(marks, last_stats, strict=True)]


def _trim(beats, g):
    """pool_idx beats cut to their real lanes (the padding lanes of the last group carry any index)."""
    L, G, Co = g.conv.lanes_out, g.bn.groups, g.conv.out_channels
    return [b[:min(L, Co - (i % G) * L)] for i, b in enumerate(beats)]


CASES = [
    # B, Ci, H, W, Co, lanes_in, lanes_out, padding
    pytest.param((2, 1, 6, 6, 4, 16, 4, "valid"), id="ci1-6x6-co4-K1-G1"),
    pytest.param((2, 3, 7, 6, 6, 16, 4, "valid"), id="ci3-7x6-co6-K2-G2-padlanes-dropped-row"),
    pytest.param((1, 2, 6, 7, 8, 32, 4, "same"), id="same-ci2-6x7-co8-K1-G2-dropped-col"),
    pytest.param((2, 1, 5, 4, 3, 16, 4, "valid"), id="ci1-5x4-co3-K1-G1-rows-of-2-dropped-row"),  # Wo < k
]


def _check(case, *, seed, p_idle=0.3, p_stall=0.4, before_bn=False):
    B, C, H, W, Co, li, lo, padding = case
    cfg = _config(B, C, H, W, Co, padding, before_bn)
    g = ConvLayerGeometry.from_config(cfg, 0, lanes_in=li, lanes_out=lo)
    assert g.before_bn == before_bn
    model = HwModel(cfg)
    rng = np.random.default_rng(seed)
    batches, want = [], []
    for n in range(2):
        x = rng.choice(np.array([-1, 1], np.int8), size=(B, C, H, W))
        w = rng.choice(np.array([-1, 1], np.int8), size=(Co, C, 3, 3))
        x[0, :, :4, :4] = w[0, :, :3, :3].max()  # windows with ties and the largest |Y|
        # the power-on bias of a pooled layer first, then random biases (one channel at the range's bottom)
        beta = model.beta[0].copy() if n == 0 else rng.integers(-(1 << 18), 1 << 18, size=Co)
        if n:
            beta[0] = -(1 << 19)
        batches.append((x, w, beta))
        want.append(_expected(g, model, x, w, beta))
    # the power-on bias: 0 with before_bn (BN sees the pooled Y, as a dense layer's), else -81,985
    assert (batches[0][2] == (0 if before_bn else round(pooled_bn_beta(2) * (1 << g.bn.params.beta_frac)))).all()
    got, cycles = run_conv_layer(g, batches, p_idle=p_idle, p_stall=p_stall, seed=seed)
    for n in range(2):
        for k in OUTPUTS:
            have = _trim(got[n][k], g) if k == "pool_idx" else got[n][k]
            assert have == want[n][k], f"batch {n}: {k} differs"
    assert cycles[0] == g.cycles(), f"cycles {cycles[0]} != model {g.cycles()}"
    return cycles


@pytest.mark.parametrize("case", CASES)
def test_conv_layer_forward(case):
    _check(case, seed=7)


@pytest.mark.parametrize("case", CASES)
def test_conv_layer_forward_pool_before_bn(case):
    """The maxpool's ``before_bn`` order (the preset's): the pooled Y into BN, its statistics over the B Hp Wp
    pooled positions, x_hat and mask of the pooled positions."""
    _check(case, seed=8, before_bn=True)


class _WithParams(Elaboratable):
    """The layer with the BN parameter unit the top level gives every layer: beta from its memory (the host's
    state), the stats into its running statistics."""

    def __init__(self, g: ConvLayerGeometry, hw):
        self.layer = ConvLayerForward(geometry=g)
        self.par = BnParamUnit(layer=g.bn, hw=hw)

    def elaborate(self, platform):
        m = Module()
        m.submodules.layer, m.submodules.par = lay, par = self.layer, self.par
        wiring.connect(m, par.beta, lay.beta)
        sp = lay.stats.payload
        m.d.comb += [par.stats.valid.eq(lay.stats.valid), par.stats.payload.sum_y.eq(sp.sum_y),
                     par.stats.payload.S.eq(sp.S), lay.stats.ready.eq(par.stats.ready), par.beta_start.eq(lay.start)]
        return m


@pytest.mark.parametrize("before_bn", ORDERS)
def test_running_statistics_and_the_pooled_initial_bias(before_bn):
    """The state the model keeps for the layer: the beta it starts from (HwModel.reset's pooled bias, written by
    the host as state; 0 before BN) in, the running mean and scale after the batch (sim.hw.arith.running_update
    over BN's n positions) out of rtl_gen.controller.BnParamUnit fed by the layer's stats, equal to the model's
    train_step."""
    B, C, H, W, Co = 2, 2, 6, 6, 4
    cfg = _config(B, C, H, W, Co, "valid", before_bn)
    g = ConvLayerGeometry.from_config(cfg, 0, lanes_in=8, lanes_out=4)
    assert g.before_bn == before_bn
    model = HwModel(cfg)
    rng = np.random.default_rng(3)
    x = rng.choice(np.array([-1, 1], np.int8), size=(B, C, H, W))
    run = model.bounds[0].running
    model.mu_r[0] = rng.integers(-run // 4, run // 4, Co)
    model.s_r[0] = rng.integers(0, run // 4, Co)
    mu0, s0, beta0, w0 = model.mu_r[0].copy(), model.s_r[0].copy(), model.beta[0].copy(), model.w[0].copy()
    trace = model.train_step(x.reshape(B, -1), rng.integers(0, 4, B), lr=model.lr0)  # running update inside
    want_mu, want_s = model.mu_r[0], model.s_r[0]
    assert (want_mu != mu0).any() and (want_s != s0).any()
    assert (A.running_update(mu0, s0, trace.bn[0], model.p)[0] == want_mu).all()
    top = _WithParams(g, cfg.hw)
    dut, par = top.layer, top.par
    c = g.conv
    got = {}

    async def bench(ctx):
        for space, vals in ((SPACE_BETA, beta0), (SPACE_MU, mu0), (SPACE_S, s0)):
            for ch in range(Co):
                await bn_param_host(ctx, par, space, ch, vals[ch])
        for name in ("x", "pool_idx", "pooled", "next_write"):
            ctx.set(getattr(dut, name).ready, 1)
        await load_and_start(ctx, dut, c, x, w0, gaps=0.0, coin=random.Random(0))
        for _ in range(20 * g.cycles()):
            if not ctx.get(dut.busy):
                break
            await ctx.tick()
        await ctx.tick().repeat(RUNNING_LATENCY + 2)
        for name, space in (("mu", SPACE_MU), ("s", SPACE_S)):
            got[name] = [to_signed(await bn_param_host(ctx, par, space, ch), par.run_width) for ch in range(Co)]

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert got["mu"] == [int(v) for v in want_mu] and got["s"] == [int(v) for v in want_s]


@pytest.mark.rtl_slow
@pytest.mark.parametrize("case", [
    pytest.param((2, 1, 28, 28, 16, 64, 16, "valid"), id="preset-layer0-b2-G1"),  # configs/cnn_mnist.toml's first
    pytest.param((2, 16, 13, 13, 32, 64, 16, "valid"), id="preset-layer1-b2-K3-G2"),  # its second (13x13 pooled)
])
def test_conv_layer_forward_larger(case):
    _check(case, seed=11, p_idle=0.5, p_stall=0.6, before_bn=True)  # the preset pools before BN


def test_geometry():
    from sim.config import load_config
    from sim.hw.widths import derive_widths

    cfg = load_config("configs/cnn_mnist.toml")  # each maxpool before its BN
    g = ConvLayerGeometry.from_config(cfg, 0, lanes_in=64, lanes_out=16)
    assert g.before_bn and (g.positions, g.beats, g.conv_beats) == (24 * 13 * 13, 24 * 13 * 13, 16224)
    assert (g.next_depth, g.next_word, g.bn.groups) == (24 * 13, 208, 1)
    assert g.bn.widths == derive_widths(cfg)[0]  # the BN unit's widths are the layer's, from n = B Hp Wp
    g1 = ConvLayerGeometry.from_config(cfg, 1, lanes_in=64, lanes_out=16)
    assert (g1.positions, g1.bn.groups, g1.next_depth, g1.next_word) == (24 * 5 * 5, 2, 24 * 5, 160)
    with pytest.raises(ValueError, match="weight layer 2 is a dense layer without a following max pool"):
        ConvLayerGeometry.from_config(cfg, 2, lanes_in=64, lanes_out=16)
    with pytest.raises(ValueError, match=r"bn.batch \(pooled positions n = B Hp Wp, before_bn\) is 24; the conv "
                                         r"layer needs 4056"):
        ConvLayerGeometry(conv=g.conv, bn=replace(g.bn, bounds=replace(g.bn.bounds, n=24)), before_bn=True)
    with pytest.raises(ValueError, match=r"bn.batch \(positions n = B Ho Wo\) is 4056; the conv layer needs 16224"):
        ConvLayerGeometry(conv=g.conv, bn=g.bn)  # pooling the BN output: BN over every position
    with pytest.raises(ValueError, match="bn.lanes is 8; the conv layer needs 16"):
        ConvLayerGeometry(conv=g.conv, bn=replace(g.bn, lanes=8), before_bn=True)
