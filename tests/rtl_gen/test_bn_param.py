"""rtl_gen.controller.BnParamUnit's beta update from random states in Amaranth's simulator: every branch of
sim.hw.optim.beta_update (ratios below and above the clip, a = 0, the learning-rate shift to the left, to the
right with rounding and past the value, beta's saturation) and the update's cycles against
rtl_gen.controller.bn_param_cycles."""

import numpy as np
import pytest
from amaranth.sim import Simulator
from pysim_host import bn_param_host, start_beta_update, to_signed  # same folder
from small_mlp import SMALL

from rtl_gen.bn_unit import BnLayer
from rtl_gen.controller import SPACE_A, SPACE_BETA, SPACE_E, SPACE_M, BnParamUnit
from sim.config import apply_overrides, load_config
from sim.hw import optim as O
from sim.hw.arith import ArithParams

# the learning-rate shifts of the updates: with Fb = 16 the shift of r is lr_sh - 8, from -8 (left) to 32 (past r)
LR_SHIFTS = [0, 10, 4, 12, 8, 9, 11, 13, 15, 17, 19, 40]


@pytest.mark.parametrize("div_steps", [2, 4])
def test_beta_update_from_random_states(div_steps):
    cfg = apply_overrides(load_config("mlp"), SMALL)
    assert ArithParams.from_config(cfg).beta_frac == 16  # LR_SHIFTS' cases
    h = cfg.hw
    lay = BnLayer.from_config(cfg, 0, lanes=8)
    dut = BnParamUnit(layer=lay, hw=h, div_steps=div_steps)
    p, M, bits = lay.params, lay.channels, h.beta_state_bits
    model_cycles = dut.cycles()["update"]
    rng = np.random.default_rng(7)
    seen = {"ratio": 0, "clip": 0, "a0": 0, "left": 0, "right_odd": 0, "past": 0, "sat": 0}
    measured = []

    def host(ctx, space, addr, data=None):
        return bn_param_host(ctx, dut, space, addr, data)

    sx = to_signed

    async def bench(ctx):
        for lr_sh in LR_SHIFTS:
            # a state the unit can hold: a below 2^(bits-2), |m| up to 3a (ratios on both sides of the clip at 2)
            a = rng.integers(0, 1 << (bits - 2), M) >> rng.integers(0, bits - 2, M)
            a[rng.random(M) < 0.15] = 0
            m = np.round(a * rng.uniform(-3, 3, M)).astype(np.int64)
            beta = rng.integers(p.beta_lo, p.beta_hi + 1, M)
            beta[:2] = p.beta_lo + rng.integers(0, 3), p.beta_hi - rng.integers(0, 3)  # saturation
            e = int(rng.integers(-30, 5))
            p1 = rng.integers(-(1 << 20), 1 << 20, M) >> rng.integers(0, 18)
            scale = int(rng.integers(-40, 5))
            want = O.beta_update(beta, m, a, e, p1, scale, lr_sh, p, h.beta_momentum_shift, h.beta_scale_shift, bits)
            for space, vals in ((SPACE_BETA, beta), (SPACE_M, m), (SPACE_A, a)):
                for c in range(M):
                    await host(ctx, space, c, vals[c])
            await host(ctx, SPACE_E, 0, e)
            await start_beta_update(ctx, dut, p1[:M], scale, lr_sh)
            n = 1
            while ctx.get(dut.busy):
                await ctx.tick()
                n += 1
            measured.append(n)
            got = [np.array([sx(await host(ctx, sp, c), w) for c in range(M)])
                   for sp, w in ((SPACE_BETA, dut.beta_width), (SPACE_M, dut.m_width))]
            got.append(np.array([await host(ctx, SPACE_A, c) for c in range(M)]))
            assert (got[0] == want[0]).all(), (got[0], want[0])
            assert (got[1] == want[1]).all() and (got[2] == want[2]).all()
            assert sx(await host(ctx, SPACE_E, 0), 16) == want[3]
            # which branches this draw took (the model's own rules, see sim.hw.optim.beta_update)
            a2, m2 = want[2], want[1]
            ratio = np.where(a2 > 0, (2 * np.abs(m2) * 256 + np.maximum(a2, 1)) // (2 * np.maximum(a2, 1)), 0)
            sh = lr_sh + 8 - p.beta_frac
            seen["ratio"] += int(((a2 > 0) & (ratio > 0) & (ratio < 256)).sum())
            seen["clip"] += int(((a2 > 0) & (ratio > 256)).sum())
            seen["a0"] += int((a2 == 0).sum())
            seen["left"] += sh <= 0
            seen["right_odd"] += int(0 < sh < 10 and ((np.minimum(ratio, 256) >> (sh - 1)) & 1).any())
            seen["past"] += sh >= 12
            seen["sat"] += int(((want[0] == p.beta_lo) | (want[0] == p.beta_hi)).sum())

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert all(seen.values()), seen
    # busy from the update pulse: the unit's cycles (every channel takes the same time) and a constant four more
    # (measured: every draw, both divider speeds); a cycle more or less per channel would move it by M
    assert [n - model_cycles for n in measured] == [4] * len(LR_SHIFTS), (measured, model_cycles)


@pytest.mark.parametrize("preset", ["small", "paper"])
def test_running_statistics_from_random_and_extreme_beats(preset):
    """The running-statistics update (``mu_r``, ``s_r``; divisions by the constants 2B and 2B^2 in a pipeline)
    against sim.hw.arith.running_update for two layers of one shared unit, three passes: random stats beats with
    gaps and back to back, the extremes (sum_y = +-B Ymax, S = 0 and the largest S, sums on both sides of a
    rounding step), random old values across the whole range; a beat a cycle is taken."""
    from types import SimpleNamespace

    from rtl_gen.controller import SPACE_MU, SPACE_S
    from sim.hw.arith import running_update

    cfg = load_config("mlp") if preset == "paper" else apply_overrides(load_config("mlp"), SMALL)
    lays = [BnLayer.from_config(cfg, j, lanes=8) for j in (0, len(cfg.layer_shapes()) - 1)]
    dut = BnParamUnit(layers=lays, hw=cfg.hw, div_steps=4)
    p = lays[0].params
    B, fr = lays[0].batch, p.running_frac
    rng = np.random.default_rng(11)
    taken = []

    async def bench(ctx):
        for step in range(3):
            for li, lay in enumerate(lays):
                M, ymax, smax = lay.channels, lay.y_bound, lay.bounds.S
                ctx.set(dut.layer, li)
                mu = rng.integers(-(ymax << fr), (ymax << fr) + 1, M)
                s = rng.integers(0, (2 * ymax << fr) + 1, M)
                for c in range(M):
                    await bn_param_host(ctx, dut, SPACE_MU, c, mu[c])
                    await bn_param_host(ctx, dut, SPACE_S, c, s[c])
                sum_y = rng.integers(-B * ymax, B * ymax + 1, M)
                S = rng.integers(0, smax + 1, M) >> rng.integers(0, 20, M)
                ext = [B * ymax, -B * ymax, 0, -1, 1, -(B // 2), -(B // 2) - 1, B // 2]
                sum_y[: min(M, len(ext))] = ext[:M]
                S[: min(M, 3)] = [smax, 0, B * B // 2][: min(M, 3)]
                for c in range(M):
                    ctx.set(dut.stats.payload.sum_y, int(sum_y[c]))
                    ctx.set(dut.stats.payload.S, int(S[c]))
                    ctx.set(dut.stats.valid, 1)
                    n = 0
                    while True:
                        await ctx.tick()
                        n += 1
                        if ctx.get(dut.stats.ready):  # ready is combinational on state: the beat went in
                            break
                    taken.append(n)
                    if step == 1 and rng.random() < 0.5:  # gaps
                        ctx.set(dut.stats.valid, 0)
                        await ctx.tick().repeat(int(rng.integers(1, 4)))
                ctx.set(dut.stats.valid, 0)
                while ctx.get(dut.busy):
                    await ctx.tick()
                want_mu, want_s = running_update(mu, s, SimpleNamespace(n=B, sum_y=sum_y, S=S), p)
                got_mu = [to_signed(await bn_param_host(ctx, dut, SPACE_MU, c), dut.run_width) for c in range(M)]
                got_s = [to_signed(await bn_param_host(ctx, dut, SPACE_S, c), dut.run_width) for c in range(M)]
                assert got_mu == list(want_mu), (preset, step, li)
                assert got_s == list(want_s), (preset, step, li)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert set(taken) == {1}  # never a wait


@pytest.mark.timing
def test_aligner_inputs_come_from_registers(tmp_path):
    """Yosys's view of the unit (the small MLP's layer 0): the aligner's rounding term (``al_rnd``) is reached
    from registers of the operand (``upd_m_q``, ``al_x_q``, the flag ``al_first``) and the amounts, never from the
    FSM's state (timing: the state's choice of the operand in front of the 35-bit carry chain); and each
    alignment's left amount (``al{i}_l``) sees only the low bits of its exponent difference, its clamp compare
    being a register of its own (``al{i}_lgt``; timing: ``dg`` -> ``d > lmax`` -> ``al2_l``, 99.6 MHz at the paper's
    widths on the ECP5 proxy)."""
    from yosys_nets import flop_cone, gate_netlist  # same folder

    cfg = apply_overrides(load_config("mlp"), SMALL)
    lay = BnLayer.from_config(cfg, 0, lanes=8)
    mod = gate_netlist(BnParamUnit(layer=lay, hw=cfg.hw, div_steps=2), "bn_param", tmp_path)
    nets = {name: n["bits"] for name, n in mod["netnames"].items()}
    state = {b for name, bits in nets.items() if name.startswith("fsm_state") for b in bits if isinstance(b, int)}
    assert state and not flop_cone(mod, nets["al_rnd"]) & state
    assert set(nets["al_first"]) <= flop_cone(mod, nets["al_rnd"])
    for i, d in enumerate(("dm", "dm", "dg")):
        left = nets[f"al{i}_l"]
        cone = flop_cone(mod, left)
        assert set(nets[f"al{i}_lgt"]) <= cone
        assert not cone & set(nets[d][len(left):]), i  # the compare's high bits reach only al{i}_lgt
