"""The cocotb transport: the driver's bus (:mod:`host.transports.base`) on the accelerator in a cocotb
simulation. AXI4-Lite through :class:`tb.common.AxiLiteMaster`, the two 32-bit AXI-Streams through
:class:`AxisSource` / :class:`AxisSink`, with random idle cycles and backpressure when ``stress`` is set. The
testbench of the whole accelerator (``tb/system_tb.py``) runs the real :class:`host.driver.Driver` on it."""

from __future__ import annotations

import numpy as np
from cocotb.triggers import FallingEdge, ReadOnly

from host.transports.base import AsyncTransport
from tb.common import AxiLiteMaster, Bench

__all__ = ["AxisSink", "AxisSource", "CocotbTransport"]


class AxisSource:
    """Drives ``<prefix>_tdata/_tlast/_tvalid`` and watches ``_tready`` (32-bit AXI-Stream into the DUT)."""

    def __init__(self, bench: Bench, prefix: str, *, p_idle: float = 0.0):
        dut = bench.dut
        self.bench = bench
        self.tdata = getattr(dut, f"{prefix}_tdata")
        self.tlast = getattr(dut, f"{prefix}_tlast")
        self.tvalid = getattr(dut, f"{prefix}_tvalid")
        self.tready = getattr(dut, f"{prefix}_tready")
        self.p_idle = p_idle
        self.tvalid.value = 0
        self.tlast.value = 0
        self.tdata.value = 0

    async def send(self, words, *, last: bool = True) -> None:
        rng = self.bench.rng
        n = len(words)
        i = idle = 0
        while i < n:
            await FallingEdge(self.bench.clk)
            if self.p_idle and rng.random() < self.p_idle:
                self.tvalid.value = 0
                continue
            self.tdata.value = int(words[i])
            self.tlast.value = int(last and i == n - 1)
            self.tvalid.value = 1
            await ReadOnly()
            if self.tready.value:
                i += 1
                idle = 0
            else:
                idle += 1
                assert idle < 200_000, f"s_axis: not ready for 200000 cycles at beat {i} of {n}"
        await FallingEdge(self.bench.clk)
        self.tvalid.value = 0
        self.tlast.value = 0


class AxisSink:
    """Takes words from ``<prefix>_tdata/_tlast/_tvalid`` (AXI-Stream out of the DUT), drives ``_tready``."""

    def __init__(self, bench: Bench, prefix: str, *, p_stall: float = 0.0):
        dut = bench.dut
        self.bench = bench
        self.tdata = getattr(dut, f"{prefix}_tdata")
        self.tlast = getattr(dut, f"{prefix}_tlast")
        self.tvalid = getattr(dut, f"{prefix}_tvalid")
        self.tready = getattr(dut, f"{prefix}_tready")
        self.p_stall = p_stall
        self.tready.value = 0
        self.lasts: list[int] = []

    async def receive(self, count: int, *, max_idle: int = 100_000) -> np.ndarray:
        rng = self.bench.rng
        out = np.zeros(count, np.uint32)
        i, idle = 0, 0
        if not self.p_stall and count:
            # ready held high from a falling edge on: valid and data come from registers and may not depend on
            # ready (AXI-Stream), so their values at each falling edge are what the next rising edge takes. One
            # wake-up per cycle instead of two and no write per cycle (the state read-backs are most of a run).
            await FallingEdge(self.bench.clk)
            self.tready.value = 1
            while True:
                if self.tvalid.value:
                    out[i] = int(self.tdata.value)
                    if self.tlast.value:
                        self.lasts.append(i)
                    i += 1
                    idle = 0
                    if i == count:
                        break
                else:
                    idle += 1
                    assert idle < max_idle, f"m_axis: no beat for {max_idle} cycles after {i} of {count}"
                await FallingEdge(self.bench.clk)
            await FallingEdge(self.bench.clk)
            self.tready.value = 0
            return out
        while i < count:
            await FallingEdge(self.bench.clk)
            ready = not (self.p_stall and rng.random() < self.p_stall)
            self.tready.value = int(ready)
            await ReadOnly()
            if ready and self.tvalid.value:
                out[i] = int(self.tdata.value)
                if self.tlast.value:
                    self.lasts.append(i)
                i += 1
                idle = 0
            else:
                idle += 1
                assert idle < max_idle, f"m_axis: no beat for {max_idle} cycles after {i} of {count}"
        await FallingEdge(self.bench.clk)
        self.tready.value = 0
        return out


class CocotbTransport(AsyncTransport):
    """The driver's bus on the simulated accelerator. A SLVERR response raises."""

    def __init__(self, bench: Bench, *, stress: bool = False, log=None, regmap=None):
        self.bench = bench
        self.log = log
        self.regmap = regmap
        self.axi = AxiLiteMaster(bench, "s_axi_", max_delay=3 if stress else 0, p_stall=0.3 if stress else 0.0)
        self.src = AxisSource(bench, "s_axis", p_idle=0.3 if stress else 0.0)
        self.sink = AxisSink(bench, "m_axis", p_stall=0.3 if stress else 0.0)

    async def read(self, addr):
        data, resp = await self.axi.read(addr)
        assert resp == 0, f"AXI read of {addr:#x} answered {resp}"
        return data

    async def write(self, addr, value):
        if self.log and self.regmap is not None and self.regmap.at(addr).name in ("cmd", "arg"):
            r = self.regmap.at(addr)
            self.log(f"cycle {self.bench.cycle}: {r.name} {r.decode(int(value))}")
        resp = await self.axi.write(addr, int(value))
        assert resp == 0, f"AXI write of {addr:#x} answered {resp}"

    async def send(self, words):
        if self.log:
            self.log(f"cycle {self.bench.cycle}: send {len(words)} words")
        await self.src.send(words)

    async def receive(self, count):
        if self.log:
            self.log(f"cycle {self.bench.cycle}: receive {count} words")
        return await self.sink.receive(count)

    async def sleep(self, cycles):
        await self.bench.pause(int(cycles))
