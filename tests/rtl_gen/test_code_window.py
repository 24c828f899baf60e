# amaranth: UnusedElaboratable=no
"""rtl_gen.code_window.CodeWindow against sim.hw.arith.dw_window_ternary: the column maxima tracked over a batch of
po2 code beats, then the dW stream's codes rewritten to the ternary codes, with gaps in both streams."""

import random

import numpy as np
import pytest
from amaranth.sim import Simulator

from rtl_gen.code_window import CodeWindow
from sim.hw import arith as A


def _codes(rng, batch, n_out, k, top_heavy):
    field = rng.integers(0, 1 << (k - 1), size=(batch, n_out)).astype(np.uint8)
    if top_heavy:  # many columns with a few large fields and most far below: the window matters
        field = np.where(rng.random(field.shape) < 0.85, np.minimum(field, 4), field).astype(np.uint8)
    neg = rng.random((batch, n_out)) < 0.5
    return A.Po2Codes(neg=neg, field=field, bias=0, unit_exp=0)


@pytest.mark.parametrize("lanes, groups, banks, window, k, seed", [
    (4, 3, 1, 3, 5, 0),
    (8, 1, 2, 2, 5, 1),
    (3, 4, 3, 1, 4, 2),
    (4, 2, 1, 15, 5, 3),  # a window past every plane: every nonzero code counts
    (2, 5, 2, 200, 5, 4),
])
def test_code_window_equals_the_models_ternary_codes(lanes, groups, banks, window, k, seed):
    rng = np.random.default_rng(seed)
    coin = random.Random(seed)
    batch = banks * 3
    n_out = lanes * groups
    dut = CodeWindow(lanes=lanes, groups=groups, code_bits=k, window=window, banks=banks)
    steps = [_codes(rng, batch, n_out, k, top_heavy=s == 1) for s in range(3)]  # three "training steps"
    got = []

    def put(ctx, port, rows):
        """rows: list of (field, neg) per lane."""
        ctx.set(port, [{"field": int(f), "neg": int(n)} for f, n in rows])

    async def bench(ctx):
        for codes in steps:
            ctx.set(dut.clear, 1)  # bwd starts
            await ctx.tick()
            ctx.set(dut.clear, 0)
            for b in range(batch):
                for g in range(groups):
                    while coin.random() < 0.3:  # a gap in the po2 unit's stream
                        await ctx.tick()
                    cols = range(g * lanes, (g + 1) * lanes)
                    put(ctx, dut.track_codes, [(codes.field[b, c], codes.neg[b, c]) for c in cols])
                    ctx.set(dut.track, 1)
                    await ctx.tick()
                    ctx.set(dut.track, 0)
            for _ in range(coin.randrange(1, 4)):  # dx runs in between (at least the cycle the last beat takes in)
                await ctx.tick()
            out = np.zeros((2, batch, n_out), np.int64)  # each repetition's rewrite, both checked
            for g in range(groups):
                tiles = batch // banks
                for rep in range(2):  # each group's tiles come several times (words, passes)
                    for t in range(tiles):
                        rows = []
                        for bank in range(banks):
                            b = t * banks + bank
                            rows += [(codes.field[b, c], codes.neg[b, c]) for c in range(g * lanes, (g + 1) * lanes)]
                        put(ctx, dut.codes_in, rows)
                        while coin.random() < 0.3:
                            await ctx.tick()
                        res = ctx.get(dut.codes_out)
                        for bank in range(banks):
                            for lane in range(lanes):
                                c = res[bank * lanes + lane]
                                value = 0 if c.field == 0 else (-1 if c.neg else 1)
                                assert c.field in (0, 1) and (c.field or not c.neg)
                                out[rep, t * banks + bank, g * lanes + lane] = value
                        ctx.set(dut.advance, int(rep == 1 and t == tiles - 1))
                        await ctx.tick()
                        ctx.set(dut.advance, 0)
            got.append(out)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    for codes, out in zip(steps, got, strict=True):
        for rep in range(2):
            assert np.array_equal(out[rep], A.dw_window_ternary(codes, window)), rep
    assert any(np.count_nonzero(A.dw_window_ternary(c, window)) < np.count_nonzero(c.field) for c in steps) \
        or window >= (1 << (k - 1)) - 1  # the window dropped codes somewhere (the case tests something)


def test_code_window_refuses_bad_parameters():
    with pytest.raises(ValueError, match="window must be an integer in 1..255, not 0"):
        CodeWindow(lanes=4, groups=2, code_bits=5, window=0)
    with pytest.raises(ValueError, match="code_bits must be an integer in 2..8"):
        CodeWindow(lanes=4, groups=2, code_bits=9, window=3)
