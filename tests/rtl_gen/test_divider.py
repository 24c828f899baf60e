# amaranth: UnusedElaboratable=no
"""rtl_gen.divider: parameters, cycle model, a quick Amaranth-simulator check, and the cocotb/Verilator runs
against Python integer division."""

import json
import os
import random
import re

import pytest
from amaranth.sim import Simulator

from rtl_gen.divider import Divider, divide
from rtl_gen.toolchain import run_cocotb, to_verilog


def test_reference_division():
    assert divide(17, 5, 2) == (3, 2, False)
    assert divide(20, 5, 2) == (0, 0, True)  # quotient 4 needs 3 bits
    assert divide(19, 5, 2) == (3, 4, False)
    assert divide(3, 0, 8) == (0, 0, True)


def test_parameters_and_cycle_model():
    d = Divider(dividend_width=40, divisor_width=24, quotient_width=18, steps=4)
    assert (d.iterations, d.stages, d.latency) == (5, 2, 12)
    # division i = 2 g + k answered 2 + k + 10 (g + 1) cycles after the first request: the 10th at 2 + 1 + 50
    assert d.cycles(0) == 0 and d.cycles(1) == 13 and d.cycles(2) == 14 and d.cycles(10) == 54
    assert Divider(dividend_width=40, divisor_width=24, quotient_width=18, steps=18).latency == 11  # one trip
    assert d.req_layout.size == 64 and d.resp_layout.size == 18 + 24 + 1
    with pytest.raises(ValueError, match=re.escape("steps must be an integer in 1..18, not 19")):
        Divider(dividend_width=40, divisor_width=24, quotient_width=18, steps=19)
    with pytest.raises(ValueError, match=re.escape("divisor_width must be an integer in 1..256, not 0")):
        Divider(dividend_width=4, divisor_width=0, quotient_width=2)
    with pytest.raises(TypeError):
        Divider(40, 24, 18)


def _pysim(widths, steps, count, *, seed, p_idle, p_stall):
    wn, wd, wq = widths
    dut = Divider(dividend_width=wn, divisor_width=wd, quotient_width=wq, steps=steps)
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        d = rng.randrange(0, 1 << wd)
        fits = max(min(d << wq, 1 << wn), 1)  # dividends whose quotient fits (mostly)
        cases.append((rng.randrange(1 << wn) if rng.random() < 0.1 else rng.randrange(fits), d))
    got, stamps = [], []

    async def bench(ctx):
        sent, cycle = 0, 0
        while len(got) < count:
            offer = sent < count and rng.random() >= p_idle
            ctx.set(dut.req.valid, offer)
            if offer:
                ctx.set(dut.req.payload, {"dividend": cases[sent][0], "divisor": cases[sent][1]})
            take = rng.random() >= p_stall
            ctx.set(dut.resp.ready, take)
            if offer and ctx.get(dut.req.ready):
                stamps.append(cycle)
                sent += 1
            if take and ctx.get(dut.resp.valid):
                p = ctx.get(dut.resp.payload)
                got.append((p.quotient, p.remainder, bool(p.overflow)))
                stamps.append(cycle)
            await ctx.tick()
            cycle += 1

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    for (n, d), (q, r, over) in zip(cases, got, strict=True):
        want = divide(n, d, wq)
        assert over == want[2] and (over or (q, r) == want[:2]), (n, d, (q, r, over), want)
    return stamps[-1] - stamps[0] + 1, dut.cycles(count)


# steps 2 and 4: radix-4 stages only; 3: one radix-4 and one radix-2 stage; (10, 7, 3) x 2: a padded quotient
@pytest.mark.parametrize("widths, steps", [((12, 5, 8), 1), ((12, 5, 8), 2), ((12, 5, 8), 3), ((12, 5, 8), 4),
                                           ((10, 7, 3), 2), ((6, 8, 1), 1), ((12, 5, 8), 8), ((12, 5, 8), 5),
                                           ((31, 17, 14), 4)])
def test_divider_in_amaranth_simulator(widths, steps):
    measured, model = _pysim(widths, steps, 60, seed=1, p_idle=0.0, p_stall=0.0)
    assert measured == model
    _pysim(widths, steps, 60, seed=2, p_idle=0.4, p_stall=0.4)


SWEEP = [
    # (dividend_width, divisor_width, quotient_width, steps, count)
    pytest.param((21, 13, 8, 1, 1500), id="n21-d13-q8-s1"),
    pytest.param((56, 38, 18, 3, 1500), id="n56-d38-q18-s3"),  # the MLP layer-0 BN divider, 3 bits per cycle
    pytest.param((31, 17, 14, 4, 1500), id="n31-d17-q14-s4"),  # the small MLP's BN divider: two stages, 4 trips
    pytest.param((160, 96, 64, 4, 800), id="n160-d96-q64-s4"),  # wide operands (VlWide in Verilator)
]


@pytest.mark.rtl
@pytest.mark.parametrize("case", SWEEP)
def test_divider_rtl(case):
    """Rerun one case with waveforms: ``XNT_WAVES=1 pytest -k n21 ...``; repeat a random run with
    ``COCOTB_RANDOM_SEED=<seed from the log>``."""
    wn, wd, wq, steps, count = case
    params = {"dividend_width": wn, "divisor_width": wd, "quotient_width": wq, "steps": steps}
    run = run_cocotb(
        verilog=to_verilog(Divider(**params), "divider"),
        toplevel="divider",
        test_module="divider_tb",
        name=f"divider_n{wn}_d{wd}_q{wq}_s{steps}",
        extra_env={"XNT_TB_PARAMS": json.dumps({**params, "count": count})},
        waves=bool(os.environ.get("XNT_WAVES")),
    )
    assert run.tests == 5
    measured = json.loads((run.build_dir / "cycles.json").read_text())
    assert measured["measured"] == measured["model"] == Divider(**params).cycles(count)


def test_division_by_a_constant():
    """const_reciprocal's (r, s) equal floor division on every dividend of its width near the multiples of the
    divisor, the ends of the range and at random; const_divide's pipeline gives those quotients CONST_DIV_LATENCY
    cycles after each value, a value every cycle (Amaranth simulator); a bad divisor is refused."""
    from amaranth import Module, Signal

    from rtl_gen.divider import CONST_DIV_LATENCY, const_divide, const_reciprocal

    rnd = random.Random(5)
    for d in [1, 2, 3, 7, 100, 200, 1000, 20_000, 12_345, 1 << 20, (1 << 20) + 1]:
        for n_bits in [1, 4, 17, 26, 34, 44, 60]:
            r, s = const_reciprocal(n_bits, d)
            top = (1 << n_bits) - 1
            near = [k * d + o for k in (1, 2, 3, top // d, top // d - 1, rnd.randrange(top // d + 1))
                    for o in (-1, 0, 1)]
            vals = [0, 1, top, top - 1] + near + [rnd.randrange(top + 1) for _ in range(500)]
            assert all((v * r) >> s == v // d for v in vals if 0 <= v <= top), (d, n_bits)
    for bad in (0, -3, 2.0, True):
        with pytest.raises(ValueError, match="constant divisor"):
            const_reciprocal(8, bad)

    m = Module()
    x = Signal(34)
    cases = {20_000: None, 200: None, 64: None}
    for d in cases:
        cases[d] = const_divide(m, x, d, f"q{d}")
    d0 = 20_000
    values = [0, 1, d0 - 1, d0, d0 + 1, 7 * d0, 7 * d0 - 1, (1 << 34) - 1] + [rnd.randrange(1 << 34) for _ in range(40)]

    async def bench(ctx):
        for i in range(len(values) + CONST_DIV_LATENCY):
            if i < len(values):
                ctx.set(x, values[i])
            if i >= CONST_DIV_LATENCY:
                v = values[i - CONST_DIV_LATENCY]
                for d, q in cases.items():
                    assert ctx.get(q) == v // d, (v, d)
            await ctx.tick()

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


@pytest.mark.parametrize("widths, steps", [((12, 5, 8), 1), ((12, 5, 8), 4), ((12, 5, 8), 5), ((12, 5, 8), 8),
                                           ((10, 7, 3), 2)])
def test_ring_moves_while_the_requester_waits(widths, steps):
    """The ring's stages never stall and the credit admits exactly what the output queue can hold: with every
    response refused for long, the divider takes ``queue_depth + 2`` requests (the queue's entries, the entry
    register and the request register; one more would overflow the queue, one fewer would slow a requester that
    takes at once), and every
    division in the queue is finished, so once the responses are taken they come one a cycle, in request order and
    correct (Amaranth simulator; a cycle bound instead of a hang when a response is lost)."""
    wn, wd, wq = widths
    dut = Divider(dividend_width=wn, divisor_width=wd, quotient_width=wq, steps=steps)
    Q = dut.queue_depth
    assert Q == dut.stages + 1
    rng = random.Random(3)
    cases = []
    for _ in range(3 * Q + 4):
        d = rng.randrange(1, 1 << wd)
        cases.append((rng.randrange(min(d << wq, 1 << wn)), d))
    wait = 3 * dut.latency  # cycles with the responses refused: every division admitted finishes in them
    sent, got, stamps = [], [], []

    async def bench(ctx):
        for cycle in range(wait + 4 * dut.latency * len(cases)):
            if len(got) == len(cases):
                break
            offer = len(sent) < len(cases)
            ctx.set(dut.req.valid, offer)
            if offer:
                n, d = cases[len(sent)]
                ctx.set(dut.req.payload, {"dividend": n, "divisor": d})
            ctx.set(dut.resp.ready, cycle >= wait)
            if offer and ctx.get(dut.req.ready):
                sent.append(cycle)
            if cycle >= wait and ctx.get(dut.resp.valid):
                p = ctx.get(dut.resp.payload)
                got.append((p.quotient, p.remainder, bool(p.overflow)))
                stamps.append(cycle)
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert len([c for c in sent if c < wait]) == Q + 2
    assert len(got) == len(cases), f"{len(got)} of {len(cases)} responses"
    assert got == [divide(n, d, wq) for n, d in cases]
    assert stamps[:Q] == list(range(wait, wait + Q))  # the queue's divisions finished while the requester waited


def test_request_step_is_registered_before_the_ring(tmp_path):
    """Yosys's view of the divider (the paper MLP's BN forward widths, 45 / 31 / 14 bits, 4 steps): the request's
    first step lands in the entry register (``pre_rem``), and stage 0's remainder register (``st0_rem``) is reached
    from the ring and the entry register only, never from the request register's divisor through a step's carry
    chains (timing: that path, with the choice of stage 0, closed at 92.4 MHz on the ECP5 proxy)."""
    from yosys_nets import flop_cone, gate_netlist  # same folder

    mod = gate_netlist(Divider(dividend_width=45, divisor_width=31, quotient_width=14, steps=4), "divider", tmp_path)
    nets = {name: n["bits"] for name, n in mod["netnames"].items()}
    cone = flop_cone(mod, nets["st0_rem"])
    assert not cone & set(nets["in_divisor"]) and not cone & set(nets["in_dividend"])
    assert set(nets["pre_rem"]) <= cone and set(nets["st1_rem"]) <= cone
    assert set(nets["in_divisor"]) & flop_cone(mod, nets["pre_rem"])
