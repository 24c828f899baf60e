"""cocotb testbench for rtl_gen.rng.RngEngine against sim.hw.rng.RngBank (the contract's generators).

Parameters (``$XNT_TB_PARAMS``, JSON): ``preset`` and ``overrides`` (the configuration), ``layer``,
``lanes_in``, ``lanes_out``, ``update_lanes`` (the build), ``sweeps`` (per test, default 20). Cycle counts
measured without backpressure go to ``cycles-<test>.json`` in the run folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import cocotb
import numpy as np
from cocotb.triggers import FallingEdge, ReadOnly

from rtl_gen.rng import RngGeometry, layer_offset
from sim.config import apply_overrides, load_config
from sim.hw.rng import RngBank
from tb.common import Bench, StreamSink, StreamSource, tb_params

PARAMS = tb_params()
if PARAMS:
    CFG = apply_overrides(load_config(PARAMS.get("preset", "mlp")), PARAMS.get("overrides", {}))
    LAYER = int(PARAMS["layer"])
    GEO = RngGeometry.from_config(
        CFG, LAYER, lanes_in=PARAMS["lanes_in"], lanes_out=PARAMS["lanes_out"], update_lanes=PARAMS["update_lanes"]
    )
    OFFSET = layer_offset(CFG, LAYER)
SWEEPS = int(PARAMS.get("sweeps", 20))


def pack_struct(layout, values: dict) -> int:
    """A payload word from field values, by the Amaranth layout's own offsets."""
    word = 0
    for name, field in layout:
        word |= (int(values.get(name, 0)) & ((1 << field.width) - 1)) << field.offset
    return word


def new_bank() -> RngBank:
    return RngBank([tuple(s.weight_shape) for s in CFG.weight_layers()], CFG.hw.rng_seed, CFG.hw.rng_block)


class TB(Bench):
    def __init__(self, dut, *, p_stall=0.0, p_idle_host=0.0):
        super().__init__(dut)
        assert len(dut.u__payload) == 32 * GEO.sweep.update_lanes + 1, "the build does not match $XNT_TB_PARAMS"
        self.u = StreamSink(self, "u", p_stall=p_stall)
        self.host = StreamSource(self, "host", p_idle=p_idle_host)
        self.rdata = StreamSink(self, "host_rdata", p_stall=0.3)
        self.np_rng = np.random.default_rng(self.rng.getrandbits(64))
        dut.start.value = 0

    async def write_states(self, states) -> None:
        layout = GEO.host_layout
        await self.host.send(
            [pack_struct(layout, {"write": 1, "addr": g, "data": int(s)}) for g, s in enumerate(states)]
        )

    async def read_states(self, addrs) -> list[int]:
        layout = GEO.host_layout
        out = []
        for g in addrs:  # one outstanding read at a time
            await self.host.send([pack_struct(layout, {"write": 0, "addr": int(g)})])
            out += await self.rdata.receive(1, max_cycles=50)
        return out

    async def sweep(self) -> tuple[np.ndarray, int]:
        """One sweep: ``(numbers [visits, U], cycles from start to the last beat)``."""
        sw = GEO.sweep
        await FallingEdge(self.clk)
        while True:  # wait for idle
            await ReadOnly()
            if not self.dut.busy.value:
                break
            await FallingEdge(self.clk)
        await FallingEdge(self.clk)
        self.dut.start.value = 1
        start = self.cycle
        await FallingEdge(self.clk)
        self.dut.start.value = 0
        first = len(self.u.stamps)
        beats = await self.u.receive(sw.visits, max_cycles=20 * GEO.cycles() + 100)
        U = sw.update_lanes
        nums = np.array([[(b >> (32 * j)) & 0xFFFFFFFF for j in range(U)] for b in beats], dtype=np.uint32)
        lasts = [b >> (32 * U) for b in beats]
        assert lasts == [0] * (sw.visits - 1) + [1], "last flag not on exactly the final beat"
        assert self.u.stamps[first] > start
        return nums, self.u.stamps[-1] - start + 1


def compare(nums: np.ndarray, want: np.ndarray, sweep: int) -> None:
    bad = np.argwhere(nums != want)
    assert not len(bad), (
        f"sweep {sweep}: {len(bad)} of {nums.size} numbers differ; first (visit, lane) {bad[:3].tolist()}: "
        f"rtl {[hex(int(nums[tuple(i)])) for i in bad[:3]]} ref {[hex(int(want[tuple(i)])) for i in bad[:3]]}"
    )


@cocotb.test()
async def test_contract_seeds_full_rate(dut):
    """Host seeds the contract's states; every sweep equals RngBank.sweep() for this layer, at one beat per
    cycle (exact cycle count); the states read back equal the bank's afterwards."""
    tb = TB(dut)
    await tb.reset()
    bank = new_bank()
    n = GEO.generators
    assert bank.n_generators >= OFFSET + n
    await tb.write_states(bank.get_state()[OFFSET : OFFSET + n])
    measured = []
    for s in range(SWEEPS):
        nums, cycles = await tb.sweep()
        compare(nums, GEO.numbers(bank.sweep()[LAYER]), s)
        measured.append(cycles)
    assert set(measured) == {GEO.cycles()}, f"cycles per sweep {sorted(set(measured))}, model {GEO.cycles()}"
    back = await tb.read_states(range(n))
    assert back == [int(v) for v in bank.get_state()[OFFSET : OFFSET + n]], "states read back differ"
    Path("cycles-full_rate.json").write_text(
        json.dumps({"visits": GEO.sweep.visits, "measured": measured[0], "model": GEO.cycles()})
    )


@cocotb.test()
async def test_random_states_under_backpressure(dut):
    """Random states (host writes with idle cycles), sweeps against random backpressure on the output."""
    tb = TB(dut, p_stall=0.5, p_idle_host=0.3)
    await tb.reset()
    bank = new_bank()
    n = GEO.generators
    state = bank.get_state()
    state[OFFSET : OFFSET + n] = tb.np_rng.integers(1, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    bank.set_state(state)
    await tb.write_states(state[OFFSET : OFFSET + n])
    for s in range(max(SWEEPS // 4, 2)):
        nums, cycles = await tb.sweep()
        compare(nums, GEO.numbers(bank.sweep()[LAYER]), s)
        assert cycles >= GEO.cycles()
    some = tb.np_rng.choice(n, size=min(n, 8), replace=False)
    assert await tb.read_states(some) == [int(bank.get_state()[OFFSET + g]) for g in some]
