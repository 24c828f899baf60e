# amaranth: UnusedElaboratable=no
"""rtl_gen.bn_unit: geometry from the configuration, parameter checks, cycle models, quick Amaranth-simulator
checks, and the cocotb/Verilator runs against sim.hw.arith.bn_forward / bn_backward."""

import json
import os
import random
import re

import numpy as np
import pytest
from amaranth import Module, Signal, signed
from amaranth.sim import Simulator

from rtl_gen.bn_unit import (
    BN_BWD_MEM_SLICE,
    BN_MEM_SLICE,
    EPI1_DIV_STAGES,
    EPI3_ISSUE,
    STATS_OUT_STAGE,
    THR_WRITE_STAGES,
    BnBackwardUnit,
    BnForwardCore,
    BnForwardUnit,
    BnLayer,
    forward_cycles,
    mul_const,
    mul_const_fabric,
)
from rtl_gen.divider import CONST_DIV_LATENCY
from rtl_gen.toolchain import run_cocotb, to_verilog
from sim.config import apply_overrides, load_config
from sim.hw.arith import ArithParams, bn_backward, bn_forward, bn_forward_eval
from sim.hw.widths import layer_bounds
from tb.bn_unit_tb import small_config

# --- geometry -------------------------------------------------------------------------------------------------


def test_layer_from_config_is_the_sim_hw_layer():
    cfg = apply_overrides(load_config("mlp"), ["hw.input=int8"])  # layer 0 at its widest
    bounds = layer_bounds(cfg)
    for j in range(5):
        lay = BnLayer.from_config(cfg, j, lanes=16)
        assert lay.bounds == bounds[j] and lay.params == ArithParams.from_config(cfg)
        assert lay.top == (j == 4)
        assert BnLayer.from_dict(json.loads(json.dumps(lay.as_dict()))) == lay
    l0 = BnLayer.from_config(cfg, 0, lanes=16)
    assert (l0.batch, l0.channels, l0.fan_in, l0.x_max, l0.y_bound) == (100, 256, 784, 128, 784 * 128)
    assert (l0.groups, l0.lanes_last, l0.beats, l0.K) == (16, 16, 1600, 100 * 100 << 16)
    # docs/arithmetic.md section 9, layer 0: Y 18, sum_y 25, S 31, C 51, alpha 14, thresholds 18
    w = l0.widths
    assert (w["y"], w["sum_y"], w["S"], w["C"], w["alpha_q"], w["theta"]) == (18, 25, 31, 51, 14, 18)
    assert BnLayer.from_config(cfg, 4, lanes=4).lanes_last == 2


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"lanes": 0}, ValueError, "lanes must be an integer in 1..4096, not 0"),
        ({"lanes": 2.0}, ValueError, "lanes must be an integer in 1..4096, not 2.0"),
        ({"params": None}, TypeError, "params must be a sim.hw.arith.ArithParams, not None"),
        ({"bounds": 3}, TypeError, "bounds must be a sim.hw.widths.LayerBounds, not 3"),
    ],
)
def test_bad_parameters_are_rejected(kwargs, error, message):
    cfg = small_config(4, 5, 6)
    args = {"bounds": layer_bounds(cfg)[0], "params": ArithParams.from_config(cfg), "lanes": 2, **kwargs}
    with pytest.raises(error, match=re.escape(message)):
        BnLayer(**args)
    with pytest.raises(ValueError, match=re.escape("layer_index must be an integer in 0..1, not 2")):
        BnLayer.from_config(cfg, 2, lanes=2)
    with pytest.raises(ValueError, match=re.escape("div_steps must be an integer in 1..14, not 15")):
        BnForwardUnit(layer=BnLayer.from_config(cfg, 0, lanes=2), div_steps=15)
    with pytest.raises(TypeError):
        BnForwardUnit(BnLayer.from_config(cfg, 0, lanes=2))


def test_cycle_models():
    cfg = apply_overrides(load_config("mlp"), ["hw.input=int8"])  # layer 0 at its widest
    fwd = BnForwardUnit(layer=BnLayer.from_config(cfg, 0, lanes=16))
    # divider: EPI3's alpha only, 14 quotient bits, 1 per cycle
    assert fwd.div_widths[2] == 14 and fwd.div_iterations == 14
    c = fwd.cycles()
    # EPI1: a channel a cycle, a cycle more at each of the 15 later groups' reads, the first group's read, the
    # registered dividend (EPI1_DIV_STAGES = 2: the lane within its part, then the part), the constant division's
    # five cycles (CONST_DIV_LATENCY), the last response and the thresholds' registered write (THR_WRITE_STAGES =
    # 1); EPI2: eleven cycles a channel (the lane's words registered first; twelve at a later group's start) and
    # the same tail without the dividend's registers
    assert EPI1_DIV_STAGES == 2 and THR_WRITE_STAGES == 1
    assert CONST_DIV_LATENCY == 5
    assert (c["epi1"], c["epi2"]) == (1 + 255 + 15 + 2 + 5 + 1 + 1, 11 + 255 * 11 + 15 + 5 + 1 + 1) == (280, 2838)
    # EPI3, one stage (latency 16): the stage busy, I = 14 cycles a division after the first request (at
    # EPI3_ISSUE = 6: the channel's word registered before its products; its first step at 7, entering at 8),
    # and the registered stats output (STATS_OUT_STAGE = 1)
    assert EPI3_ISSUE == 6 and STATS_OUT_STAGE == 1 and c["epi3"] == 9 + 256 * 14 + 1
    # each pass: B G beats, the compare stage and the accumulators' write stage
    assert c["total"] == 3 * (1600 + 1 + 1) + 280 + 2838 + c["epi3"] == 11518
    l0, l1 = BnLayer.from_config(cfg, 0, lanes=16), BnLayer.from_config(cfg, 1, lanes=16)
    # 3 and 4 bits a cycle: two stages, 5 and 4 trips: two divisions per 10 and 8 cycles once the ring is full, so
    # EPI3's issue side (six cycles a channel, seven at each of the 15 later groups' starts) paces it, the first
    # division's latency (12 and 10) and the ring's slots (a division enters when its slot comes by) on top
    c3, c4 = forward_cycles(l0, 3), forward_cycles(l0, 4)
    assert (c3["epi1"], c3["epi2"]) == (c4["epi1"], c4["epi2"]) == (280, 2838)
    assert 6 * 256 + 15 + 10 + 1 <= c4["epi3"] == 1563 < c3["epi3"] == 1565 <= 6 * 256 + 15 + 12 + 2 + 1
    assert BnForwardUnit(layer=l1).div_iterations == 14
    bwd = BnBackwardUnit(layer=l1)
    assert bwd.cycles()["total"] == 2 * 1600 + 16 + 256 + 8  # pass 1 drain 1, pass 2 drain 2 + 5 Q stages


def test_mul_const_is_exact():
    """Shift-and-add products by the configuration constants (canonical signed digits)."""
    m = Module()
    value = Signal(signed(12))
    consts = [0, 1, 3, 7, 100, 100 << 16, 10000 << 16, 0b1011_0111]
    outs = [Signal(signed(48), name=f"p{i}") for i in range(len(consts))]
    m.d.comb += [o.eq(mul_const(value, c)) for o, c in zip(outs, consts, strict=True)]
    # mul_const_fabric: shifted copies summed (B = 100: three set bits), a multiplier past max_terms
    fab = [Signal(signed(48), name=f"f{i}") for i in range(len(consts))]
    m.d.comb += [o.eq(mul_const_fabric(value, c)) for o, c in zip(fab, consts, strict=True)]
    sim = Simulator(m)

    async def bench(ctx):
        for v in (-2048, -1001, -1, 0, 1, 5, 2047):
            ctx.set(value, v)
            assert [ctx.get(o) for o in outs] == [v * c for c in consts]
            assert [ctx.get(o) for o in fab] == [v * c for c in consts]

    sim.add_testbench(bench)
    sim.run()
    with pytest.raises(ValueError, match="non-negative constant, not -3"):
        mul_const(value, -3)
    with pytest.raises(ValueError, match="non-negative constant, not -3"):
        mul_const_fabric(value, -3)


def test_verilog_ports():
    lay = BnLayer.from_config(small_config(6, 5, 7), 0, lanes=2)
    text = to_verilog(BnForwardUnit(layer=lay), "bn_forward")
    widths = {
        name: int(hi or 0) + 1 for hi, name in re.findall(r"^\s*(?:input|output) (?:\[(\d+):0\] )?(\w+);", text, re.M)
    }
    # y: 2 lanes x 4 bits (|Y| <= 7) + last; x: 2 + 2 + 1; beta Q4.16
    assert widths["y__payload"] == 9 and widths["y_replay__payload"] == 9 and widths["x__payload"] == 5
    assert widths["beta__payload"] == 20 and widths["phase"] == 3
    text = to_verilog(BnBackwardUnit(layer=lay), "bn_backward")
    assert re.search(r"input \[\d+:0\] dx__payload;", text) and re.search(r"output \[\d+:0\] q__payload;", text)


# --- quick functional check in Amaranth's simulator -------------------------------------------------------------


def _drive(ctx, port, items, i, coin, p_idle):
    offer = i < len(items) and coin.random() >= p_idle
    ctx.set(port.valid, offer)
    if offer:
        ctx.set(port.payload, items[i])
    return offer and ctx.get(port.ready)


def _beats(lay, values, field, extra=None):
    G, L, M = lay.groups, lay.lanes, lay.channels
    return [
        {field: [int(values[b, c]) if c < M else 0 for c in range(g * L, g * L + L)], "last": int(g == G - 1),
         **(extra(b, g) if extra else {})}
        for b in range(lay.batch) for g in range(G)
    ]  # fmt: skip


def _pysim_forward(lay, y, beta, *, seed, p_idle, p_stall, div_steps=1):
    dut = BnForwardUnit(layer=lay, div_steps=div_steps)
    coin = random.Random(seed)
    words = _beats(lay, y, "y")
    xs, stats, stamps = [], [], []

    async def bench(ctx):
        n = [0, 0, 0]
        cycle = 0
        while len(stats) < lay.channels:
            # the output readies first: an input's ready may depend on them in the same cycle
            take_x, take_s = coin.random() >= p_stall, coin.random() >= p_stall
            ctx.set(dut.x.ready, take_x)
            ctx.set(dut.stats.ready, take_s)
            for k, (port, items) in enumerate(
                ((dut.y, words), (dut.y_replay, words + words), (dut.beta, [int(v) for v in beta]))
            ):
                if _drive(ctx, port, items, n[k], coin, p_idle):
                    n[k] += 1
                    if k == 0 and n[0] == 1:
                        stamps.append(cycle)
            if take_x and ctx.get(dut.x.valid):
                xs.append((ctx.get(dut.x.payload.x_hat), ctx.get(dut.x.payload.mask)))
            if take_s and ctx.get(dut.stats.valid):
                s = ctx.get(dut.stats.payload)
                stats.append({f: int(getattr(s, f)) for f in ("sum_y", "S", "S_eff", "theta", "alpha_q", "C")})
                stamps.append(cycle)
            await ctx.tick()
            cycle += 1

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    ref = bn_forward(y, beta, lay.params, lay.y_bound)
    M, G, L = lay.channels, lay.groups, lay.lanes
    bits = np.array([[(v >> lane) & 1 for lane in range(L)] for x, _ in xs for v in [x]]).reshape(lay.batch, G * L)
    assert (np.where(bits[:, :M] > 0, 1, -1) == ref.x_hat).all()
    mask = np.array([[(v >> lane) & 1 for lane in range(L)] for _, v in xs]).reshape(lay.batch, G * L)
    assert (mask[:, :M].astype(bool) == ref.mask).all()
    for f in ("sum_y", "S", "S_eff", "theta", "alpha_q", "C"):
        assert [s[f] for s in stats] == [int(v) for v in getattr(ref, f)], f
    return stamps[-1] - stamps[0] + 1, dut.cycles()["total"]


# div_steps 4 and 5: two and three divisions in flight in the divider's ring (EPI1 / EPI2 overlap channels); 12
# lanes: the accumulators in two slices of 8 and 4 lanes (BN_MEM_SLICE)
@pytest.mark.parametrize("geo", [(6, 5, 7, 2, 1), (5, 3, 9, 4, 1), (6, 5, 7, 2, 4), (8, 11, 12, 3, 5), (4, 9, 6, 4, 2),
                                 (3, 21, 7, 12, 1)])
def test_forward_in_amaranth_simulator(geo):
    batch, channels, fan_in, lanes, steps = geo
    lay = BnLayer.from_config(small_config(batch, channels, fan_in), 0, lanes=lanes)
    rng = np.random.default_rng(1)
    p = lay.params
    y = rng.integers(-fan_in, fan_in + 1, (batch, channels))
    y[:, 0] = 2  # all equal: S = 0
    beta = rng.integers(p.beta_lo, p.beta_hi + 1, channels)
    measured, model = _pysim_forward(lay, y, beta, seed=3, p_idle=0.0, p_stall=0.0, div_steps=steps)
    assert measured == model
    _pysim_forward(lay, y, beta, seed=4, p_idle=0.3, p_stall=0.4, div_steps=steps)


def test_forward_thresholds_reach_the_next_pass_in_one_group():
    """A layer of one group reads its thresholds' word in the first cycle of PASS2 and PASS3: the last channel's
    thresholds (registered before their write, THR_WRITE_STAGES) must be in ``thr_mem`` by then. The last
    channel's values lie on both sides of a mean far from the memory's former word (0), in training and in
    evaluation mode."""
    batch, channels, fan_in, lanes = 5, 3, 9, 4
    lay = BnLayer.from_config(small_config(batch, channels, fan_in), 0, lanes=lanes)
    rng = np.random.default_rng(2)
    p = lay.params
    y = rng.integers(-fan_in, fan_in + 1, (batch, channels))
    y[:, -1] = [3, 4, 6, 8, 9]
    beta = rng.integers(p.beta_lo, p.beta_hi + 1, channels)
    beta[-1] = 0
    measured, model = _pysim_forward(lay, y, beta, seed=3, p_idle=0.0, p_stall=0.0)
    assert measured == model
    mu = np.zeros(channels, dtype=np.int64)
    mu[-1] = 6 << p.running_frac
    s_r = np.full(channels, 1 << p.running_frac)
    _pysim_forward_eval(lay, y, beta, mu, s_r, seed=5, p_idle=0.0, p_stall=0.0)


def _pysim_forward_eval(lay, y, beta, mu, s_r, *, seed, p_idle, p_stall):
    """BnForwardUnit with ``eval_mode`` high: x_hat from the running statistics, per channel C' and s_r'."""
    dut = BnForwardUnit(layer=lay)
    coin = random.Random(seed)
    words = _beats(lay, y, "y")
    xs, stats = [], []

    async def bench(ctx):
        n = [0, 0, 0]
        ctx.set(dut.eval_mode, 1)
        while len(stats) < lay.channels:
            take_x, take_s = coin.random() >= p_stall, coin.random() >= p_stall
            ctx.set(dut.x.ready, take_x)
            ctx.set(dut.stats.ready, take_s)
            c = min(n[2], lay.channels - 1)
            ctx.set(dut.run, {"mu": int(mu[c]), "s": int(s_r[c])})  # travels with the channel's beta
            for k, (port, items) in enumerate(
                ((dut.y, words), (dut.y_replay, words + words), (dut.beta, [int(v) for v in beta]))
            ):
                if _drive(ctx, port, items, n[k], coin, p_idle):
                    n[k] += 1
            if take_x and ctx.get(dut.x.valid):
                xs.append(ctx.get(dut.x.payload.x_hat))
            if take_s and ctx.get(dut.stats.valid):
                st = ctx.get(dut.stats.payload)
                stats.append((int(st.C), int(st.S_eff)))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    p = lay.params
    M, G, L = lay.channels, lay.groups, lay.lanes
    bits = np.array([[(v >> lane) & 1 for lane in range(L)] for v in xs]).reshape(lay.batch, G * L)
    assert (np.where(bits[:, :M] > 0, 1, -1) == bn_forward_eval(y, beta, mu, s_r, p, lay.y_bound)).all()
    s_eff = np.maximum(s_r, 1)
    assert stats == [(int(m_) * (1 << p.beta_frac) - int(b) * int(s_), int(s_))
                     for m_, b, s_ in zip(mu, beta, s_eff, strict=True)]


@pytest.mark.parametrize("geo", [(6, 5, 7, 2), (5, 3, 9, 4), (4, 12, 16, 8)])
def test_forward_eval_in_amaranth_simulator(geo):
    """Evaluation mode (the ``infer`` command): thresholds ``ceil((mu_r 2^Fb - beta s_r') / 2^(Fr+Fb))`` by a
    shift, saturated at +-(Ymax+1), bit for bit :func:`sim.hw.arith.bn_forward_eval`; the constants the eval
    logits need (C', s_r') on the stats stream. Running statistics across their whole range: s_r <= 0 (s_r' = 1),
    a mean beyond +-Ymax (every sample on one side), and values near the thresholds."""
    batch, channels, fan_in, lanes = geo
    lay = BnLayer.from_config(small_config(batch, channels, fan_in), 0, lanes=lanes)
    rng = np.random.default_rng(7)
    p = lay.params
    run = lay.bounds.running
    y = rng.integers(-fan_in, fan_in + 1, (batch, channels))
    beta = rng.integers(p.beta_lo, p.beta_hi + 1, channels)
    mu = rng.integers(-(fan_in << p.running_frac), (fan_in << p.running_frac) + 1, channels)
    s_r = rng.integers(1, 4 << p.running_frac, channels)
    mu[0], s_r[0] = run, 0  # s_r' = 1 and a mean above every y: all -1
    mu[1 % channels], s_r[1 % channels] = -run, -3
    beta[2 % channels] = 0  # theta = ceil(mu_r 2^-Fr): y equal to it gives +1
    mu[2 % channels] = int(y[0, 2 % channels]) << p.running_frac
    _pysim_forward_eval(lay, y, beta, mu, s_r, seed=5, p_idle=0.0, p_stall=0.0)
    _pysim_forward_eval(lay, y, beta, mu, s_r, seed=6, p_idle=0.3, p_stall=0.4)


@pytest.mark.parametrize("pass2_lanes", [None, 1])
def test_backward_in_amaranth_simulator(pass2_lanes):
    """Random stalls and backpressure; ``pass2_lanes = 1`` computes each 2-lane Q beat in two parts. Channels 2
    and 4 had ``S = 0`` in the forward pass: their ``Q`` is 0 (``P1`` as usual)."""
    _pysim_backward(pass2_lanes, lambda cycle, coin: coin.random() >= 0.4)


@pytest.mark.parametrize("pass2_lanes", [None, 1])
def test_backward_q_waits_in_pend_under_long_backpressure(pass2_lanes):
    """Pass 2's Q pipeline never stalls: a beat that finds the q output full waits in ``pend``, and a beat enters
    the pipeline only with a credit for it there. The q output stays not ready for 40 cycles at a time, longer
    than ``pend`` takes to fill, then takes a few beats: nothing is lost or repeated."""
    _pysim_backward(pass2_lanes, lambda cycle, coin: cycle % 44 >= 40)


def test_backward_back_to_back_beats():
    """Every input offered at once, q always ready: pass 1 takes a beat a cycle, so the first beat of a row is
    taken while the last beat of the row before is in s1 (the first-row clear counts that row)."""
    _pysim_backward(None, lambda cycle, coin: True, p_idle=0.0)


def _pysim_backward(pass2_lanes, q_ready, p_idle=0.3):
    lay = BnLayer.from_config(small_config(5, 5, 7), 0, lanes=2)
    rng = np.random.default_rng(2)
    b, m = lay.batch, lay.channels
    dx = rng.integers(-lay.bounds.dx, lay.bounds.dx + 1, (b, m))
    dx[:, 1] = 0  # all masked: Q = 0
    xh = rng.choice([-1, 1], (b, m))
    alpha = rng.integers(0, lay.bounds.alpha_q + 1, m)
    zero = np.array([False, False, True, False, True])
    xh[:, 2], xh[:, 4] = 1, -1  # x_hat of a zero-scale channel is sign(beta) for every sample
    alpha_items = [{"zero": int(z), "alpha_q": int(a)} for a, z in zip(alpha, zero, strict=True)]
    dut = BnBackwardUnit(layer=lay, pass2_lanes=pass2_lanes)
    coin = random.Random(5)

    def x_bits(r, g):
        return {"x_hat": sum(int(xh[r, c] > 0) << (c - 2 * g) for c in (2 * g, 2 * g + 1) if c < m)}

    words = _beats(lay, dx, "dx", x_bits)
    qs, p1s = [], []

    async def bench(ctx):
        n = [0, 0, 0]
        for cycle in range(20 * lay.beats * lay.lanes + 2000):
            if len(qs) == lay.beats:
                break
            # the output readies first: an input's ready may depend on them in the same cycle
            ctx.set(dut.q.ready, q_ready(cycle, coin))
            ctx.set(dut.p1.ready, coin.random() >= 0.4)
            sources = ((dut.dx, words), (dut.dx_replay, words), (dut.alpha, alpha_items))
            for k, (port, items) in enumerate(sources):
                n[k] += _drive(ctx, port, items, n[k], coin, p_idle)
            if ctx.get(dut.q.ready) and ctx.get(dut.q.valid):
                qs.append([int(v) for v in ctx.get(dut.q.payload.q)])
            if ctx.get(dut.p1.ready) and ctx.get(dut.p1.valid):
                p1s.append(int(ctx.get(dut.p1.payload.p1)))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    q, p1 = bn_backward(dx, xh, alpha, lay.params, zero)
    assert not q[:, zero].any() and q[:, ~zero].any()
    assert (np.array(qs).reshape(b, -1)[:, :m] == q).all() and p1s == p1.tolist()


# --- cocotb on Verilator --------------------------------------------------------------------------------------

MLP = {}  # the preset, with the 8-bit first-layer input so that layer 0 is at its widest
FORWARD = [
    # (config overrides or MLP, layer, lanes, div_steps, batches); one Verilator build each
    pytest.param((dict(batch=8, channels=10, fan_in=20), 0, 4, 1, 16), id="b8-m10-n20-l4"),  # partial last group
    pytest.param((dict(batch=5, channels=3, fan_in=9), 0, 4, 3, 16), id="b5-m3-n9-l4-s3"),  # one group
    pytest.param((dict(batch=7, channels=6, fan_in=30, input_kind="int8"), 0, 3, 2, 12), id="b7-m6-n30-int8"),
    pytest.param((MLP, 0, 16, 3, 1), id="mlp-layer0"),  # int8 input: Y 18 bits, C 51, A 57
    pytest.param((MLP, 1, 16, 3, 1), id="mlp-layer1"),
    pytest.param((MLP, 2, 8, 1, 3), id="mlp-layer2-l8-s1", marks=pytest.mark.rtl_slow),
]
BACKWARD = [
    pytest.param((dict(batch=8, channels=10, fan_in=20), 0, 4, 1, 40), id="b8-m10-l4"),  # hidden: dx = M_above 2^14
    pytest.param((dict(batch=6, channels=5, fan_in=7), 1, 2, 1, 40), id="b6-top3-l2"),  # output layer: dx = 2^Fp
    pytest.param((MLP, 1, 16, 1, 2), id="mlp-layer1"),  # dx 24, P 30, Q 44 bits
    pytest.param((MLP, 4, 4, 1, 6), id="mlp-layer4", marks=pytest.mark.rtl_slow),
]


def _config(spec):
    return apply_overrides(load_config("mlp"), ["hw.input=int8"]) if spec is MLP else small_config(**spec)


def _run(unit, case):
    spec, layer_index, lanes, steps, batches = case
    lay = BnLayer.from_config(_config(spec), layer_index, lanes=lanes)
    if unit == "forward":
        dut, top = BnForwardUnit(layer=lay, div_steps=steps), "bn_forward"
    else:
        dut, top = BnBackwardUnit(layer=lay), "bn_backward"
    name = f"{top}_b{lay.batch}_m{lay.channels}_n{lay.fan_in}_x{lay.x_max}_l{lanes}_s{steps}_t{int(lay.top)}"
    run = run_cocotb(
        verilog=to_verilog(dut, top),
        toplevel=top,
        test_module="bn_unit_tb",
        name=name,
        extra_env={
            "XNT_TB_PARAMS": json.dumps({"unit": unit, "layer": lay.as_dict(), "div_steps": steps, "batches": batches})
        },
        waves=bool(os.environ.get("XNT_WAVES")),
        test_filter=r"\.test_fwd_" if unit == "forward" else r"\.test_bwd_",
    )
    assert run.tests == 5
    measured = json.loads((run.build_dir / f"cycles-{unit}.json").read_text())
    assert measured["measured"] == measured["model"]["total"] == dut.cycles()["total"]


@pytest.mark.rtl
@pytest.mark.parametrize("case", FORWARD)
def test_bn_forward_rtl(case):
    """Rerun one case with waveforms (a separate build): ``XNT_WAVES=1 pytest -k b8-m10 ...``; repeat a random run
    with ``COCOTB_RANDOM_SEED=<seed from the log>``."""
    _run("forward", case)


@pytest.mark.rtl
@pytest.mark.parametrize("case", BACKWARD)
def test_bn_backward_rtl(case):
    _run("backward", case)


@pytest.mark.timing
def test_backward_memories_read_at_registers_of_their_own(tmp_path):
    """Yosys's view of the unit (a layer of three groups): each of the three memories (P1, P2, alpha) reads every
    cycle (read enable 1) at an address that is a register of its own, with no logic between (timing: the phase's
    choice of the address fanned out to every LUT-RAM cell), and the three registers are not merged into one."""
    from yosys_nets import memory_read_ports  # same folder

    lay = BnLayer.from_config(small_config(4, 5, 7), 0, lanes=2)
    nets, reads = memory_read_ports(BnBackwardUnit(layer=lay), "bn_backward", tmp_path)
    regs = {name: nets[f"{name}_rd_g"] for name in ("p1", "p2", "a")}
    assert all(len(bits) == 2 for bits in regs.values())  # three groups
    reads = {r["cell"]: r for r in reads}
    assert {name: reads[f"{name}_mem"]["addr"] for name in regs} == regs
    assert len(set(regs.values())) == 3
    assert all(reads[f"{name}_mem"]["en"] == ("1",) for name in regs)


@pytest.mark.timing
def test_backward_first_row_clear_is_one_register_per_lane(tmp_path):
    """Yosys's view of the unit (a layer of three groups, two lanes): pass 1's first-row clear of the read words
    is a register per lane (``s1_first{lane}``), the copies not merged into one, each driving only its own lane's
    P1 and P2 adders (timing: one clear into the adders of every lane, 960 inputs at the paper's widths)."""
    from yosys_nets import fanout, gate_netlist  # same folder

    lay = BnLayer.from_config(small_config(4, 5, 7), 0, lanes=2)
    mod = gate_netlist(BnBackwardUnit(layer=lay), "bn_backward", tmp_path)
    nets = {name: tuple(n["bits"]) for name, n in mod["netnames"].items()}
    copies = [nets[f"s1_first{lane}"] for lane in range(2)]
    assert all(len(c) == 1 and isinstance(c[0], int) for c in copies)
    assert len({c[0] for c in copies}) == 2  # not merged
    fan = fanout(mod)
    p_bits = lay.widths["P"]
    assert all(fan[c[0]] <= 2 * p_bits + 4 for c in copies), [fan[c[0]] for c in copies]


@pytest.mark.timing
def test_backward_memories_cut_into_lane_slices(tmp_path):
    """Yosys's view of the unit (16 lanes, two groups): the P1, P2 and alpha memories are cut into slices of
    ``BN_BWD_MEM_SLICE`` lanes, each read at an address register of its own (twelve registers, none merged), and
    the P1 and P2 slices are written under one enable that is a flip-flop (``p_wen``), with no logic between
    (timing: one read address register, and the phase's decode of the write enable, reached every lane's LUT-RAM
    cells). The beat register's lanes move in slices of ``BN_MEM_SLICE``, each under an enable from a copy of
    ``s1_valid`` of its own (two copies, not merged)."""
    from yosys_nets import gate_netlist, memory_ports  # same folder

    assert BN_MEM_SLICE == 8 and BN_BWD_MEM_SLICE == 4
    lay = BnLayer.from_config(small_config(4, 20, 7), 0, lanes=16)
    mod = gate_netlist(BnBackwardUnit(layer=lay), "bn_backward", tmp_path)
    nets, mems = memory_ports(mod)
    mems = {r["cell"]: r for r in mems if not r["cell"].startswith("q_pend")}
    names = [f"{name}_mem{k}" for name in ("p1", "p2", "a") for k in range(4)]
    assert sorted(mems) == sorted(names)
    regs = {n: nets[n.replace("_mem", "_rd_g")] for n in names}
    assert all(len(bits) == 1 for bits in regs.values())  # two groups
    assert {n: mems[n]["addr"] for n in names} == regs
    assert len(set(regs.values())) == 12
    wen = nets["p_wen"]
    flops = {b for c in mod["cells"].values() if "DFF" in c["type"].upper() for b in c["connections"]["Q"]}
    assert len(wen) == 1 and wen[0] in flops
    assert all(set(mems[f"{name}_mem{k}"]["wen"]) == set(wen) for name in ("p1", "p2") for k in range(4))
    copies = [nets[f"s1_valid{k}"] for k in range(2)]
    assert all(len(c) == 1 and c[0] in flops for c in copies) and copies[0] != copies[1]


@pytest.mark.timing
def test_backward_push_is_one_register_per_lane_slice(tmp_path):
    """Yosys's view of BN backward (16 lanes): the beat's push into the lanes' pend FIFOs is a flip-flop per slice
    of ``BN_MEM_SLICE`` lanes (``d_push0``, ``d_push1``, not merged), and the write enable of each lane's FIFO
    memory is reached by its own slice's copy only (timing: one flip-flop drove every lane's LUT-RAM write enable,
    11.2 ns at the paper's widths on the ECP5 proxy)."""
    from yosys_nets import flop_cone, gate_netlist, memory_ports  # same folder

    lay = BnLayer.from_config(small_config(4, 20, 7), 0, lanes=16)
    mod = gate_netlist(BnBackwardUnit(layer=lay), "bn_backward", tmp_path)
    nets, mems = memory_ports(mod)
    copies = [nets.get(f"d_push{k}") for k in range(2)]
    assert all(c is not None and len(c) == 1 for c in copies) and copies[0] != copies[1]
    pend = {r["cell"]: r for r in mems if r["cell"].startswith("q_pend")}
    assert len(pend) == 16
    for cell, r in pend.items():
        lane = int(re.match(r"q_pend(\d+)", cell).group(1))
        reached = flop_cone(mod, r["wen"]) & {copies[0][0], copies[1][0]}
        assert reached == {copies[lane // BN_MEM_SLICE][0]}, (cell, reached)


@pytest.mark.timing
def test_backward_beat_source_is_one_flag_per_lane_slice(tmp_path):
    """Yosys's view of BN backward (16 lanes): the beat register ``s1`` takes each slice of ``BN_MEM_SLICE`` lanes
    from ``dx`` or ``dx_replay`` by a flag register of its own (``s1_from_dx0``, ``s1_from_dx1``, not merged), never
    by the phase register (timing: the phase chose the payload of every lane of s1, 10.0 ns at the paper's widths
    on the ECP5 proxy)."""
    from yosys_nets import flop_cone, gate_netlist  # same folder

    lay = BnLayer.from_config(small_config(4, 20, 7), 0, lanes=16)
    mod = gate_netlist(BnBackwardUnit(layer=lay), "bn_backward", tmp_path)
    nets = {name: tuple(n["bits"]) for name, n in mod["netnames"].items()}
    copies = [nets.get(f"s1_from_dx{k}") for k in range(2)]
    assert all(c is not None and len(c) == 1 for c in copies) and copies[0] != copies[1]
    phase = {b for b in nets["phase_r"] if isinstance(b, int)}
    watched = phase | {c[0] for c in copies}
    dx = lay.dx_layout["dx"]
    w = dx.shape.elem_shape.width
    s1 = nets["s1"]
    d_of = {}  # flip-flop output bit -> its data input bit (the enable, s1's advance, may see the phase)
    for c in mod["cells"].values():
        if "DFF" in c["type"].upper():
            for q, d in zip(c["connections"]["Q"], c["connections"]["D"], strict=True):
                d_of[q] = d
    for lane in range(16):
        lo = dx.offset + lane * w
        reached = flop_cone(mod, [d_of[b] for b in s1[lo:lo + w]]) & watched
        assert reached == {copies[lane // BN_MEM_SLICE][0]}, (lane, reached)


@pytest.mark.timing
def test_backward_part_choice_is_one_register_per_lane(tmp_path):
    """Yosys's view of BN backward (four lanes, pass 2 in two parts of two lanes): stage b's choice of the part's
    P1, P2 and alpha words is a register per lane of the part (``a_part_l{lane}``, not merged), and each lane's
    stage-b registers are reached by its own copy only (timing: one ``a_pp`` picked the part of every lane's
    words, 10.5 ns at the paper's widths on the ECP5 proxy)."""
    from yosys_nets import flop_cone, gate_netlist  # same folder

    lay = BnLayer.from_config(small_config(4, 5, 7), 0, lanes=4)
    mod = gate_netlist(BnBackwardUnit(layer=lay, pass2_lanes=2), "bn_backward", tmp_path)
    nets = {name: tuple(n["bits"]) for name, n in mod["netnames"].items()}
    copies = [nets.get(f"a_part_l{lane}") for lane in range(2)]
    assert all(c is not None and len(c) == 1 for c in copies) and copies[0] != copies[1]
    parts = {b for name in ("a_part_l0", "a_part_l1", "a_pp") for b in nets.get(name, ()) if isinstance(b, int)}
    for name in ("b_p1", "b_p2"):
        bits = nets[name]
        w = len(bits) // 2
        for lane in range(2):
            reached = flop_cone(mod, bits[lane * w:(lane + 1) * w]) & parts
            assert reached == {copies[lane][0]}, (name, lane, reached)
    for lane in range(2):
        reached = flop_cone(mod, nets[f"b_aq{lane}"]) & parts
        assert reached == {copies[lane][0]}, ("b_aq", lane, reached)


@pytest.mark.timing
def test_forward_accumulators_cut_into_lane_slices(tmp_path):
    """Yosys's view of BN forward (16 lanes, two groups): the accumulators (sum y, Ys, Ns) are cut into slices of
    ``BN_MEM_SLICE`` lanes, each read at an address register of its own (six registers, none merged; timing: the
    pass / epilogue address multiplexer's output reached every LUT-RAM cell of a memory), written under enables
    that are flip-flops, and read out in the epilogues at lane index copies of their own."""
    from yosys_nets import gate_netlist, memory_ports  # same folder

    lay = BnLayer.from_config(small_config(4, 20, 7), 0, lanes=16)
    mod = gate_netlist(BnForwardCore(layer=lay), "bn_forward", tmp_path)
    nets, mems = memory_ports(mod)
    mems = {r["cell"]: r for r in mems}
    names = [f"{name}_mem{k}" for name in ("sum", "ys", "ns") for k in range(2)]
    assert set(names) <= set(mems)
    regs = {n: nets[n.replace("_mem", "_rd_g")] for n in names}
    assert all(len(bits) == 1 for bits in regs.values())  # two groups
    assert {n: mems[n]["addr"] for n in names} == regs
    assert len(set(regs.values())) == 6
    flops = {b for c in mod["cells"].values() if "DFF" in c["type"].upper() for b in c["connections"]["Q"]}
    assert all(set(mems[n]["wen"]) <= flops for n in names)
    # the epilogue's lane of each slice: a copy of the lane index of its own per memory and slice (six, not merged)
    lanes = [nets[f"{name}_l_l{k}"] for name in ("sum", "ys", "ns") for k in range(2)]
    assert all(b in flops for c in lanes for b in c if b != "x") and len(set(lanes)) == 6  # "x": a bit unused


@pytest.mark.timing
def test_forward_first_row_clear_is_one_register_per_accumulator_slice(tmp_path):
    """Yosys's view of BN forward (16 lanes, two groups): the first row's clear of the accumulators' read words
    is a register per accumulator (sum y, Ys, Ns) and slice of ``BN_MEM_SLICE`` lanes (``s2_first_{acc}{k}``),
    the six copies kept apart, each driving only its own slice's adders (timing: one clear into every lane's
    adders of the three accumulators, then the carry chain into the LUT-RAM write data, 12.85 ns at the paper's
    widths on the ECP5 proxy). Planted: one clear for all fails it."""
    from yosys_nets import fanout, gate_netlist  # same folder

    lay = BnLayer.from_config(small_config(4, 20, 7), 0, lanes=16)
    mod = gate_netlist(BnForwardCore(layer=lay), "bn_forward", tmp_path, keep=True)
    nets = {name: tuple(n["bits"]) for name, n in mod["netnames"].items()}
    copies = [nets[f"s2_first_{acc}{k}"] for acc in ("sum", "ys", "ns") for k in range(2)]
    assert all(len(c) == 1 and isinstance(c[0], int) for c in copies)
    assert len({c[0] for c in copies}) == 6  # kept apart
    fan = fanout(mod)
    # a slice's adders: BN_MEM_SLICE lanes of at most sum_y's bits (with the accumulators' sign and growth)
    assert all(fan[c[0]] <= BN_MEM_SLICE * (lay.widths["sum_y"] + 2) for c in copies), [fan[c[0]] for c in copies]


@pytest.mark.parametrize("config", ["small", "paper"])
def test_forward_products_are_registered_multipliers(tmp_path, config):
    """Yosys's view of BN forward (word-level cells): every product of two variables (sum_y Ns, beta_q's and S's
    parts, C's parts times Ns) takes both operands from flip-flops without a reset and goes only into such
    flip-flops, so that they become the MULT18's own registers on the ECP5 proxy (boards/ecp5_dsp.py; a register
    with a reset stays in the fabric: sum_r -> a MULT18 -> sum_ns, 13.07 ns in context at 427fbc0 seed 2).
    Planted: sum_r with a reset fails it."""
    from yosys_nets import rtl_netlist, unregistered_products  # same folder

    cfg = small_config(4, 20, 7) if config == "small" else load_config("configs/mlp_mnist.toml")
    lay = BnLayer.from_config(cfg, 1 if config == "paper" else 0, lanes=16)
    mod = rtl_netlist(BnForwardCore(layer=lay), "bn_forward", tmp_path)
    n_mul = sum(c["type"] == "$mul" and all(any(isinstance(b, int) for b in c["connections"][p]) for p in "AB")
                for c in mod["cells"].values())
    assert n_mul >= 4  # sum_y Ns, two or more beta_q S' parts, C's parts times Ns
    assert unregistered_products(mod) == []


@pytest.mark.timing
def test_forward_beta_ready_is_a_flip_flop(tmp_path):
    """BN forward's ``beta.ready`` is a flip-flop's output with no logic after it (``beta_rdy``, set with every
    step of the channel sequencer: EPI2 and CH0 for the step entered): the decode of the phase, ``in_pass`` and
    the step, routed across the die into the beta slice's select copies, was the SMALL design's worst path at one
    nextpnr seed (13.07 ns in context at 2319ec1 seed 3). Planted: the decode as ``ready`` fails it."""
    from yosys_nets import rtl_netlist  # same folder

    lay = BnLayer.from_config(small_config(4, 20, 7), 0, lanes=16)
    mod = rtl_netlist(BnForwardCore(layer=lay), "bn_forward", tmp_path)
    ready = mod["ports"]["beta__ready"]["bits"]
    q = {b: c["type"] for c in mod["cells"].values() if "dff" in c["type"] for b in c["connections"]["Q"]}
    assert len(ready) == 1 and q.get(ready[0]) is not None, "beta.ready does not come straight from a flip-flop"
