# amaranth: UnusedElaboratable=no
"""rtl_gen.conv_pool.MaxPool against sim.hw.arith.maxpool_argmax / maxpool_select: Y beats in raster order with
many ties, odd sizes (dropped rows and columns), several groups, gaps in the input and backpressure on the output;
in the Amaranth simulator (default suite) and in cocotb (marker rtl)."""

import json
import os

import numpy as np
import pytest

from rtl_gen.conv_pool import MaxPool, PoolGeometry, pool_reference
from rtl_gen.toolchain import run_cocotb, to_verilog
from tb.pysim_streams import run_streams


def test_geometry():
    g = PoolGeometry(batch=24, height=26, width=26, groups=1, lanes=16, y_width=5)
    assert (g.out_height, g.out_width, g.index_width, g.beats_out()) == (13, 13, 2, 24 * 169)
    g = PoolGeometry(batch=2, height=11, width=11, groups=2, lanes=16, y_width=9)
    assert (g.out_height, g.out_width, g.beats_in(), g.beats_out()) == (5, 5, 2 * 121 * 2, 2 * 25 * 2)
    with pytest.raises(ValueError, match="pool 2 does not fit 1x5"):
        PoolGeometry(batch=1, height=1, width=5, groups=1, lanes=1, y_width=4)
    with pytest.raises(ValueError, match="lanes must be an integer in 1..4096, not 0"):
        PoolGeometry(batch=1, height=4, width=4, groups=1, lanes=0, y_width=4)


@pytest.mark.parametrize("B, H, W, G, L, pool, p_idle, p_stall", [
    (2, 4, 4, 1, 3, 2, 0.0, 0.0),
    (2, 5, 7, 2, 2, 2, 0.3, 0.4),  # a dropped row and column
    (1, 7, 6, 3, 2, 3, 0.2, 0.5),  # 3x3 windows, a dropped row
])
def test_max_pool_equals_the_contract_in_pysim(B, H, W, G, L, pool, p_idle, p_stall):
    g = PoolGeometry(batch=B, height=H, width=W, groups=G, lanes=L, y_width=5, pool=pool)
    rng = np.random.default_rng(B * 100 + H * 10 + W)
    y = rng.integers(-3, 3, (B, G * L, H, W))  # a small range: ties in most windows
    y[0, 0, :pool, :pool] = 15  # the extremes of the width
    y[-1, -1, :pool, :pool] = -16
    ins, want = pool_reference(g, y)
    got = run_streams(MaxPool(geometry=g), [{"y": beat} for beat in ins] * 2, 2 * len(want),  # two batches
                      read=lambda pl: ([int(x) for x in pl.y], [int(x) for x in pl.idx]), p_idle=p_idle,
                      p_stall=p_stall, seed=B + H + W)
    assert got[:len(want)] == want and got[len(want):] == want


@pytest.mark.rtl
@pytest.mark.parametrize("case", [
    pytest.param((3, 11, 11, 2, 16, 9, 2), id="b3-11x11-g2-l16"),
    pytest.param((2, 7, 8, 1, 4, 5, 3), id="b2-7x8-l4-p3"),
])
def test_max_pool_rtl(case):
    """cocotb on Verilator: full rate (one beat a cycle), then gaps and backpressure; the outputs equal
    pool_reference."""
    B, H, W, G, L, yw, pool = case
    g = PoolGeometry(batch=B, height=H, width=W, groups=G, lanes=L, y_width=yw, pool=pool)
    params = {"batch": B, "height": H, "width": W, "groups": G, "lanes": L, "y_width": yw, "pool": pool,
              "seed": B * 10 + H}
    run = run_cocotb(
        verilog=to_verilog(MaxPool(geometry=g), "conv_pool"),
        toplevel="conv_pool",
        test_module="conv_pool_tb",
        name=f"conv_pool_b{B}_{H}x{W}_g{G}_l{L}_y{yw}_p{pool}",
        extra_env={"XNT_TB_PARAMS": json.dumps(params)},
        waves=bool(os.environ.get("XNT_WAVES")),
    )
    assert run.tests == 2
