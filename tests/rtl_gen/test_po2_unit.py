# amaranth: UnusedElaboratable=no
"""rtl_gen.po2_unit: the per-channel sqrt2 threshold arithmetic, the normaliser, the cycle model, a quick
Amaranth-simulator check, and the cocotb/Verilator runs against sim.hw.arith.po2_quantise."""

import json
import math
import os
import random
import re

import numpy as np
import pytest
from amaranth import Module, Signal
from amaranth.sim import Simulator

from rtl_gen.bn_unit import BnLayer
from rtl_gen.po2_unit import Po2Unit, carry_save_step, normalise, sqrt2_constant
from rtl_gen.toolchain import run_cocotb, to_verilog
from sim.config import load_config
from sim.hw.arith import po2_quantise, sqrt2_thresholds
from tb.bn_unit_tb import small_config


def _t_by_multiplier(s_eff: int, s_width: int, width: int, steps: int) -> int:
    """What the prologue computes: the right-shifting multiplier over the normalised ``S'`` (LSB first,
    ``steps`` bits per cycle, zero padding below), then ``>> (W + 2)``."""
    lz = s_width - s_eff.bit_length()
    iters = -(-s_width // steps)
    bits = (s_eff << lz) << (iters * steps - s_width)
    c = sqrt2_constant(width)
    acc = 0
    for i in range(iters * steps):
        acc = (acc + ((bits >> i) & 1) * c) >> 1
    return acc >> (width + 2)


@pytest.mark.parametrize("s_width, width", [(1, 4), (5, 9), (23, 49), (31, 49), (23, 37)])
def test_threshold_multiplier_matches_isqrt(s_width, width):
    """``t = floor(M_D c / 2^(2W+2))`` equals ``isqrt(2 M_D^2)`` (the contract's ``T_hi - 1``) for every ``S'``
    of small widths and random ones of the MLP's widths, at 1 and 3 bits per cycle."""
    assert sqrt2_constant(width) == math.isqrt(2 << (4 * width + 4))
    rng = random.Random(width)
    values = range(1, 1 << s_width) if s_width <= 9 else [rng.randrange(1, 1 << s_width) for _ in range(2000)]
    for s in [*values, (1 << s_width) - 1, 1 << (s_width - 1)]:
        m_d = s << (width - s.bit_length())
        t_hi, t_lo = sqrt2_thresholds(m_d)
        for steps in (1, 3):
            t = _t_by_multiplier(s, s_width, width, steps)
            assert (t + 1, t // 2 + 1) == (t_hi, t_lo), (s, steps)


@pytest.mark.parametrize("width, n_addends, shift", [(6, 1, 1), (9, 2, 2), (12, 4, 4), (20, 5, 3), (8, 0, 2)])
def test_carry_save_step(width, n_addends, shift):
    """The prologue multiplier's step: ``s + c + cout == (acc_s + acc_c + cin + sum(addends)) >> shift`` for
    random operands whose total stays inside the frame (``width + 1`` bits), including the ``cin`` carries."""
    m = Module()
    acc_s, acc_c, cin = Signal(width), Signal(width), Signal()
    addends = [Signal(width) for _ in range(n_addends)]
    s, c, cout = carry_save_step(m, acc_s, acc_c, cin, addends, shift, "t")
    assert len(s) == len(c) == width + 1 - shift
    sim = Simulator(m)
    rng = random.Random(width * 100 + n_addends)

    async def bench(ctx):
        for _ in range(3000):
            vals = [rng.randrange(1 << rng.randrange(1, width + 1)) for _ in range(2 + n_addends)]
            carry = rng.randrange(2)
            if sum(vals) + carry >= 1 << (width + 1):
                continue
            for sig, v in zip([acc_s, acc_c, *addends], vals, strict=True):
                ctx.set(sig, v)
            ctx.set(cin, carry)
            total = sum(vals) + carry
            assert ctx.get(s) + ctx.get(c) + ctx.get(cout) == total >> shift, (vals, carry)

    sim.add_testbench(bench)
    sim.run()


def test_normaliser_exhaustive():
    for width in (1, 5, 8, 13):
        m = Module()
        value = Signal(width)
        lz, mant = normalise(m, value, width, "n")
        sim = Simulator(m)

        async def bench(ctx, width=width, value=value, lz=lz, mant=mant):
            for v in range(1, 1 << width):
                ctx.set(value, v)
                want = width - v.bit_length()
                assert (ctx.get(lz), ctx.get(mant)) == (want, v << want), (width, v)

        sim.add_testbench(bench)
        sim.run()


def test_parameters_and_cycle_model():
    cfg = load_config("mlp")
    u1 = Po2Unit(layer=BnLayer.from_config(cfg, 1, lanes=16))
    assert (u1.width, u1.e_width, u1.times_batch) == (49, 7, True)  # |Q| B: 49 bits; e0 in [-23, 49]
    # pass 1 drain 6; FIN: a cycle per level of the 16-lane maximum tree (4) and one; BIAS 1; pass 2 drain 2
    assert u1.cycles()["total"] == 256 * (1 + 23) + 2 * 1600 + 6 + 6 + 2
    u4 = Po2Unit(layer=BnLayer.from_config(cfg, 4, lanes=4), mul_steps=4)
    assert (u4.width, u4.times_batch, u4.mul_iterations) == (37, False, 6)
    assert u4.codes_layout.size == 4 * 5 + 1  # k = 5: 4-bit field + sign per lane, then last
    with pytest.raises(ValueError, match=re.escape("mul_steps must be an integer in 1..23, not 24")):
        Po2Unit(layer=BnLayer.from_config(cfg, 1, lanes=16), mul_steps=24)
    with pytest.raises(TypeError, match="layer must be a BnLayer"):
        Po2Unit(layer=None)
    u_parts = Po2Unit(layer=BnLayer.from_config(cfg, 1, lanes=16), pass1_lanes=4)  # 4 cycles per PASS1 beat
    assert u_parts.cycles()["pass1"] == 4 * 1600 + 6 and u_parts.cycles()["bias"] == 2 + 2  # a 4-lane tree
    with pytest.raises(ValueError, match=re.escape("pass1_lanes (3) must divide the lanes (16)")):
        Po2Unit(layer=BnLayer.from_config(cfg, 1, lanes=16), pass1_lanes=3)
    text = to_verilog(Po2Unit(layer=BnLayer.from_config(small_config(4, 3, 5), 0, lanes=2)), "po2")
    assert re.search(r"input signed \[15:0\] scale;", text) or re.search(r"input \[15:0\] scale;", text)


@pytest.mark.parametrize("pass1_lanes", [None, 1])
def test_po2_in_amaranth_simulator(pass1_lanes):
    """Random codes under no stalls; ``pass1_lanes = 1`` takes each 2-lane beat through PASS1 in two parts."""
    lay = BnLayer.from_config(small_config(5, 5, 7), 0, lanes=2)
    dut = Po2Unit(layer=lay, mul_steps=2, pass1_lanes=pass1_lanes)
    rng = np.random.default_rng(7)
    B, M, G = lay.batch, lay.channels, lay.groups
    q = (rng.integers(0, lay.bounds.Q + 1, (B, M)) >> rng.integers(0, 40, (B, M))) * rng.choice([-1, 1], (B, M))
    q[:, 1] = 0
    s_eff = np.maximum(rng.integers(0, lay.s_eff_max + 1, M) >> rng.integers(0, 10, M), 1)
    scale = -7
    beats = [{"q": [int(q[b, c]) if c < M else 0 for c in (2 * g, 2 * g + 1)], "last": int(g == G - 1)}
             for b in range(B) for g in range(G)]  # fmt: skip
    scratch, codes, bias, stamps = [], [], [], []

    async def bench(ctx):
        n = [0, 0, 0]
        cycle = 0
        ctx.set(dut.scale, scale)
        while len(codes) < lay.beats:
            for k, (port, items) in enumerate(((dut.s_eff, [int(v) for v in s_eff]), (dut.q, beats),
                                               (dut.scratch_in, scratch))):  # fmt: skip
                offer = n[k] < len(items)
                ctx.set(port.valid, offer)
                if offer:
                    ctx.set(port.payload, items[n[k]])
                    if ctx.get(port.ready):
                        n[k] += 1
                        if k == 0 and n[0] == 1:
                            stamps.append(cycle)
            for port in (dut.scratch, dut.bias, dut.codes):
                ctx.set(port.ready, 1)
            if ctx.get(dut.scratch.valid):
                scratch.append(ctx.get(dut.scratch.payload))
            if ctx.get(dut.bias.valid):
                bias.append((ctx.get(dut.bias.payload.bias), ctx.get(dut.bias.payload.unit_exp)))
            if ctx.get(dut.codes.valid):
                codes.append([(int(c.field), int(c.neg)) for c in ctx.get(dut.codes.payload.code)])
                stamps.append(cycle)
            await ctx.tick()
            cycle += 1

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    ref = po2_quantise(q, s_eff, scale, lay.params, times_batch=True)
    got = np.array(codes).reshape(B, -1, 2)[:, :M]
    assert (got[..., 0] == ref.field).all() and (got[..., 1].astype(bool) == ref.neg).all()
    assert bias == [(ref.bias, ref.unit_exp)]
    assert stamps[-1] - stamps[0] + 1 == dut.cycles()["total"]


# --- cocotb on Verilator --------------------------------------------------------------------------------------

MLP = {}
SWEEP = [
    # (config overrides or MLP, layer, lanes, mul_steps, batches, PASS1 lanes); one Verilator build each
    pytest.param((dict(batch=8, channels=10, fan_in=20), 0, 4, 1, 24, 2), id="b8-m10-hidden-l4-p2"),  # |Q| B
    pytest.param((dict(batch=6, channels=5, fan_in=7), 1, 2, 3, 24, None), id="b6-top3-l2-s3"),  # output layer
    pytest.param((MLP, 1, 16, 4, 1, 4), id="mlp-layer1-p4"),  # W = 49, S' 23 bits, the default 4 PASS1 lanes
    pytest.param((MLP, 4, 4, 2, 8, None), id="mlp-layer4", marks=pytest.mark.rtl_slow),  # output layer, W = 37
    pytest.param((MLP, 3, 16, 1, 4, None), id="mlp-layer3", marks=pytest.mark.rtl_slow),
]


@pytest.mark.rtl
@pytest.mark.parametrize("case", SWEEP)
def test_po2_rtl(case):
    """Rerun one case with waveforms: ``XNT_WAVES=1 pytest -k b8-m10 ...``; repeat a random run with
    ``COCOTB_RANDOM_SEED=<seed from the log>``."""
    spec, layer_index, lanes, steps, batches, pass1_lanes = case
    cfg = load_config("mlp") if spec is MLP else small_config(**spec)
    lay = BnLayer.from_config(cfg, layer_index, lanes=lanes)
    dut = Po2Unit(layer=lay, mul_steps=steps, pass1_lanes=pass1_lanes)
    run = run_cocotb(
        verilog=to_verilog(dut, "po2"),
        toplevel="po2",
        test_module="po2_unit_tb",
        name=f"po2_b{lay.batch}_m{lay.channels}_n{lay.fan_in}_l{lanes}_s{steps}_t{int(lay.top)}_q{lay.widths['Q']}"
        f"_p{pass1_lanes or lanes}",
        extra_env={"XNT_TB_PARAMS": json.dumps({"layer": lay.as_dict(), "mul_steps": steps, "batches": batches,
                                                "pass1_lanes": pass1_lanes})},
        waves=bool(os.environ.get("XNT_WAVES")),
    )
    assert run.tests == 5
    measured = json.loads((run.build_dir / "cycles-po2.json").read_text())
    assert measured["measured"] == measured["model"]["total"] == dut.cycles()["total"]
