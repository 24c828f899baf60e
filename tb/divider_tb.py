"""cocotb testbench for rtl_gen.divider.Divider against Python integer division.

Parameters (``$XNT_TB_PARAMS``, JSON): ``dividend_width``, ``divisor_width``, ``quotient_width``, ``steps``
(the build's divider), ``count`` (random divisions per test, default 2000). The no-stall cycle count is
written to ``cycles.json`` in the run folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import cocotb

from rtl_gen.divider import Divider, divide
from tb.common import Bench, StreamSink, StreamSource, tb_params

PARAMS = tb_params()
DIV = (
    Divider(**{k: PARAMS[k] for k in ("dividend_width", "divisor_width", "quotient_width", "steps")})
    if PARAMS
    else None
)
COUNT = int(PARAMS.get("count", 2000))


def random_case(rng) -> tuple[int, int]:
    """A division whose quotient fits (mostly): random widths of the divisor and of the quotient, so small and
    large operands are both common; 5 % overflow on purpose (quotient too wide, or divisor 0)."""
    wn, wd, wq = DIV.dividend_width, DIV.divisor_width, DIV.quotient_width
    if rng.random() < 0.05:
        d = rng.choice([0, rng.randrange(1, 1 << wd)])
        lo = d << wq
        return (rng.randrange(lo, 1 << wn) if lo < 1 << wn else (1 << wn) - 1), d
    d = rng.getrandbits(rng.randint(1, wd)) or 1
    limit = min(d << rng.randint(0, wq), 1 << wn)
    return rng.randrange(limit), d


def worst_cases() -> list[tuple[int, int]]:
    """Extremes at the build's widths: largest quotient, largest remainder, all-ones operands, divisor 1 and
    the largest divisor, zero dividend, and the first overflowing dividends."""
    wn, wd, wq = DIV.dividend_width, DIV.divisor_width, DIV.quotient_width
    dmax = (1 << wd) - 1
    nmax = (1 << wn) - 1
    out = []
    for d in {1, 2, 3, dmax, dmax - 1, 1 << (wd - 1), (1 << (wd - 1)) + 1}:
        if d < 1:
            continue
        top = min(d << wq, 1 << wn)  # first dividend whose quotient no longer fits (or past the width)
        out += [(0, d), (top - 1, d), (max(top - d, 0), d), (min(d, nmax), d), (min(d - 1, nmax), d)]
        if top <= nmax:
            out += [(top, d), (nmax, d)]
    out += [(nmax, 0), (0, 0)]
    return [(n, d) for n, d in out if 0 <= n <= nmax and 0 <= d <= dmax]


class TB(Bench):
    def __init__(self, dut, *, p_idle=0.0, p_stall=0.0):
        super().__init__(dut)
        assert DIV is not None, "no divider parameters in $XNT_TB_PARAMS"
        assert len(dut.req__payload) == DIV.dividend_width + DIV.divisor_width, "build does not match the parameters"
        self.req = StreamSource(self, "req", p_idle=p_idle)
        self.resp = StreamSink(self, "resp", p_stall=p_stall)

    async def run(self, cases: list[tuple[int, int]]) -> int:
        """Divide every case, check each answer, and return the cycles from the first request transfer to the
        last response transfer."""
        wn, wd, wq = DIV.dividend_width, DIV.divisor_width, DIV.quotient_width
        first = len(self.req.stamps)
        sender = cocotb.start_soon(self.req.send([n | d << wn for n, d in cases]))
        words = await self.resp.receive(len(cases), max_cycles=(DIV.iterations + 2) * len(cases) * 20 + 100)
        await sender
        bad = []
        for (n, d), word in zip(cases, words, strict=True):
            q, r, over = word & ((1 << wq) - 1), (word >> wq) & ((1 << wd) - 1), word >> (wq + wd)
            want_q, want_r, want_over = divide(n, d, wq)
            if bool(over) != want_over or (not want_over and (q, r) != (want_q, want_r)):
                bad.append((n, d, (q, r, over), (want_q, want_r, want_over)))
        assert not bad, f"{len(bad)} of {len(cases)} divisions wrong; first (n, d, rtl, python): {bad[:3]}"
        return self.resp.stamps[-1] - self.req.stamps[first] + 1


@cocotb.test()
async def test_random_full_rate(dut):
    """Random divisions back to back: every answer, and exactly ``count * iterations + 1`` cycles."""
    tb = TB(dut)
    await tb.reset()
    cases = [random_case(tb.rng) for _ in range(COUNT)]
    cycles = await tb.run(cases)
    Path("cycles.json").write_text(json.dumps({"count": len(cases), "measured": cycles, "model": DIV.cycles(COUNT)}))
    assert cycles == DIV.cycles(len(cases)), f"{len(cases)} divisions took {cycles} cycles, model {DIV.cycles(COUNT)}"


@cocotb.test()
async def test_worst_cases(dut):
    """Extreme operands at the full widths, including overflow and division by zero."""
    tb = TB(dut)
    await tb.reset()
    cases = worst_cases()
    assert await tb.run(cases) == DIV.cycles(len(cases))


@cocotb.test()
@cocotb.parametrize(stress=[(0.5, 0.0), (0.0, 0.6), (0.4, 0.5)])
async def test_random_under_stress(dut, stress):
    """Random divisions with idle requester cycles and response backpressure."""
    p_idle, p_stall = stress
    tb = TB(dut, p_idle=p_idle, p_stall=p_stall)
    await tb.reset()
    cases = [random_case(tb.rng) for _ in range(COUNT // 4)] + worst_cases()
    tb.rng.shuffle(cases)
    assert await tb.run(cases) >= DIV.cycles(len(cases))
