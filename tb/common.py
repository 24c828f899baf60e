"""Helpers shared by the cocotb testbenches (cocotb 2.x).

- :class:`Bench`: clock, reset, a cycle counter and the bench's random generator.
- :class:`StreamSource` / :class:`StreamSink`: drive and consume an ``amaranth.lib.stream`` port
  (Verilog ``<name>__payload``, ``__valid``, ``__ready``) with random idle cycles / backpressure.
- :class:`AxiLiteMaster`: AXI4-Lite reads and writes with a random delay on every channel (AW, W and
  AR valid, B and R ready), so AW and W arrive in every order; :class:`AxiLiteChecker` watches the
  slave's side of the protocol.
- :func:`pack` / :func:`unpack` / :func:`to_signed`: payload words from fields and back.

Timing discipline, used by every helper: inputs of the DUT change only right after a falling clock edge,
and outputs are sampled at ``ReadOnly`` of that same time step. What is seen there is what the next
rising edge captures, so ``valid and ready`` at that point is exactly a transfer at the next rising
edge, with no races between helpers. :attr:`Bench.cycle` counts rising edges; a transfer seen with
``bench.cycle == c`` happens at rising edge ``c + 1``.

Reproducing a run: cocotb seeds Python's ``random`` (printed at start; set ``COCOTB_RANDOM_SEED``), and
every random choice here comes from :attr:`Bench.rng`, seeded from it.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, FallingEdge, Lock, ReadOnly, Timer
from cocotb.utils import get_sim_time

__all__ = [
    "AxiLiteChecker",
    "AxiLiteMaster",
    "Bench",
    "StreamSink",
    "StreamSource",
    "pack",
    "tb_params",
    "to_signed",
    "unpack",
]

PARAMS_ENV = "XNT_TB_PARAMS"


def tb_params() -> dict:
    """Testbench parameters passed by the pytest side as JSON in ``$XNT_TB_PARAMS`` (``{}`` if unset)."""
    return json.loads(os.environ.get(PARAMS_ENV, "{}"))


def pack(fields: Sequence[tuple[int, int]]) -> int:
    """One word from ``(value, width)`` pairs, the first in the low bits (values are masked to width)."""
    word, shift = 0, 0
    for value, width in fields:
        word |= (value & ((1 << width) - 1)) << shift
        shift += width
    return word


def unpack(word: int, widths: Sequence[int]) -> list[int]:
    """Inverse of :func:`pack` (unsigned fields)."""
    out = []
    for width in widths:
        out.append(word & ((1 << width) - 1))
        word >>= width
    return out


def to_signed(value: int, width: int) -> int:
    value &= (1 << width) - 1
    return value - (1 << width) if width and value >> (width - 1) else value


class Bench:
    """Owns the clock (``dut.clk``), the reset (``dut.rst``, active high), a cycle counter and ``rng``."""

    def __init__(self, dut, *, period_ns: int = 10):
        self.dut = dut
        self.clk = dut.clk
        self.rng = random.Random(random.getrandbits(32))
        self.period_ns = int(period_ns)
        self._t0 = get_sim_time("ns")
        Clock(dut.clk, period_ns, unit="ns").start()

    @property
    def cycle(self) -> int:
        """Rising edges since the clock started, read from the simulation time: no coroutine wakes up every
        cycle to count them, so a bench waiting on a clock-cycle trigger costs the simulator nothing per cycle."""
        return int(get_sim_time("ns") - self._t0) // self.period_ns

    async def reset(self, cycles: int = 3):
        self.dut.rst.value = 1
        await self.cycles(cycles)
        self.dut.rst.value = 0

    async def pause(self, n: int) -> None:
        """Let about ``n`` cycles pass (``n - 1`` to ``n`` rising edges), ending at a rising edge. One timer
        instead of a wake-up per edge: the driver's status polls wait thousands of cycles at a time."""
        if n > 2:
            await Timer((n - 2) * self.period_ns, unit="ns")
        await ClockCycles(self.clk, min(n, 2))

    async def cycles(self, n: int = 1):
        """Wait ``n`` falling edges (the next drive points)."""
        for _ in range(n):
            await FallingEdge(self.clk)


class StreamSource:
    """Sends words on the stream port ``<name>__{payload,valid,ready}``.

    ``p_idle``: probability that the source offers nothing in a cycle when it could. While ``valid`` is
    low the payload carries random junk, so a DUT that looks at it without ``valid`` gets caught.
    ``stamps`` collects :attr:`Bench.cycle` at every transfer.
    """

    def __init__(self, bench: Bench, name: str, *, p_idle: float = 0.0):
        self.bench = bench
        self.valid = getattr(bench.dut, f"{name}__valid")
        self.ready = getattr(bench.dut, f"{name}__ready")
        self.payload = getattr(bench.dut, f"{name}__payload")
        self.width = len(self.payload)
        self.p_idle = p_idle
        self.stamps: list[int] = []
        self.valid.value = 0
        self.payload.value = 0

    async def send(self, words: Sequence[int]) -> None:
        bench, rng = self.bench, self.bench.rng
        sent, offering = 0, False
        while sent < len(words):
            await FallingEdge(bench.clk)
            if not offering and rng.random() >= self.p_idle:
                offering = True
                self.payload.value = words[sent]
            elif not offering:
                self.payload.value = rng.getrandbits(self.width)
            self.valid.value = int(offering)
            await ReadOnly()
            if offering and self.ready.value:
                self.stamps.append(bench.cycle)
                sent += 1
                offering = False
        await FallingEdge(bench.clk)
        self.valid.value = 0


class StreamSink:
    """Receives words from the stream port ``<name>__{payload,valid,ready}``.

    ``p_stall``: probability that ``ready`` is low in a cycle. ``stamps`` collects :attr:`Bench.cycle` at
    every transfer.
    """

    def __init__(self, bench: Bench, name: str, *, p_stall: float = 0.0):
        self.bench = bench
        self.valid = getattr(bench.dut, f"{name}__valid")
        self.ready = getattr(bench.dut, f"{name}__ready")
        self.payload = getattr(bench.dut, f"{name}__payload")
        self.p_stall = p_stall
        self.stamps: list[int] = []
        self.ready.value = 0

    async def receive(self, count: int, *, max_cycles: int) -> list[int]:
        """``count`` words; fails if they take more than ``max_cycles`` cycles."""
        bench, rng = self.bench, self.bench.rng
        words: list[int] = []
        start = bench.cycle
        while len(words) < count:
            await FallingEdge(bench.clk)
            ready = rng.random() >= self.p_stall
            self.ready.value = int(ready)
            await ReadOnly()
            if ready and self.valid.value:
                words.append(int(self.payload.value))
                self.stamps.append(bench.cycle)
            assert bench.cycle - start < max_cycles, f"stalled: {len(words)} of {count} words after {max_cycles} cycles"
        await FallingEdge(bench.clk)
        self.ready.value = 0
        return words


class AxiLiteMaster:
    """AXI4-Lite master on the DUT ports ``<prefix>awaddr`` ... (prefix ``"s_axi_"`` for the Vivado names
    from :func:`rtl_gen.axil.vivado_ports`, ``"s_axi__"`` for Amaranth's default export).

    Every channel gets a random delay: AW, W and AR wait ``0..max_delay`` cycles before raising
    ``valid`` (independently, so AW and W arrive in every order); B and R hold ``ready`` low with
    probability ``p_stall`` in each cycle. One write and one read may be outstanding at a time (each
    direction is serialised by a lock); a write and a read may overlap.
    """

    def __init__(self, bench: Bench, prefix: str = "s_axi_", *, max_delay: int = 3, p_stall: float = 0.3):
        self.bench = bench
        self.max_delay = max_delay
        self.p_stall = p_stall
        dut = bench.dut
        for name in (
            "awaddr", "awprot", "awvalid", "awready", "wdata", "wstrb", "wvalid", "wready",
            "bresp", "bvalid", "bready", "araddr", "arprot", "arvalid", "arready",
            "rdata", "rresp", "rvalid", "rready",
        ):  # fmt: skip
            setattr(self, name, getattr(dut, prefix + name))
        for handle in (self.awvalid, self.wvalid, self.arvalid, self.bready, self.rready):
            handle.value = 0
        for handle in (self.awaddr, self.awprot, self.wdata, self.wstrb, self.araddr, self.arprot):
            handle.value = 0
        self._write_lock = Lock()
        self._read_lock = Lock()

    def _delay(self) -> int:
        return self.bench.rng.randint(0, self.max_delay)

    async def _send(self, valid, ready, fields: dict, delay: int) -> None:
        bench, rng = self.bench, self.bench.rng
        for _ in range(delay):
            await FallingEdge(bench.clk)
        await FallingEdge(bench.clk)
        for handle, value in fields.items():
            handle.value = value
        valid.value = 1
        while True:
            await ReadOnly()
            if ready.value:
                break
            await FallingEdge(bench.clk)
        await FallingEdge(bench.clk)
        valid.value = 0
        for handle in fields:
            handle.value = rng.getrandbits(len(handle))  # junk while not valid

    async def _accept(self, valid, ready, fields: Sequence) -> list[int]:
        bench, rng = self.bench, self.bench.rng
        while True:
            await FallingEdge(bench.clk)
            take = rng.random() >= self.p_stall
            ready.value = int(take)
            await ReadOnly()
            if take and valid.value:
                values = [int(f.value) for f in fields]
                break
        await FallingEdge(bench.clk)
        ready.value = 0
        return values

    async def write(self, addr: int, data: int, strb: int = 0xF) -> int:
        """Write ``data`` at byte address ``addr`` with byte enables ``strb``; returns ``bresp``."""
        rng = self.bench.rng
        async with self._write_lock:
            aw = cocotb.start_soon(
                self._send(
                    self.awvalid, self.awready, {self.awaddr: addr, self.awprot: rng.getrandbits(3)}, self._delay()
                )
            )
            w = cocotb.start_soon(
                self._send(self.wvalid, self.wready, {self.wdata: data, self.wstrb: strb}, self._delay())
            )
            (resp,) = await self._accept(self.bvalid, self.bready, [self.bresp])
            await aw
            await w
        return resp

    async def read(self, addr: int) -> tuple[int, int]:
        """Read byte address ``addr``; returns ``(rdata, rresp)``."""
        rng = self.bench.rng
        async with self._read_lock:
            ar = cocotb.start_soon(
                self._send(
                    self.arvalid, self.arready, {self.araddr: addr, self.arprot: rng.getrandbits(3)}, self._delay()
                )
            )
            data, resp = await self._accept(self.rvalid, self.rready, [self.rdata, self.rresp])
            await ar
        return data, resp


class AxiLiteChecker:
    """Checks the slave's side of AXI4-Lite every cycle while running:

    - ``bvalid``/``rvalid``, once high, stay high with ``bresp`` / ``rdata``+``rresp`` unchanged until
      the handshake;
    - no write response before both the write's address and data were accepted, no read response
      before its address was accepted (counted per handshake).

    ``errors`` lists violations; call :meth:`check` at the end of a test.
    """

    def __init__(self, master: AxiLiteMaster):
        self.m = master
        self.errors: list[str] = []
        self.counts = dict.fromkeys(("aw", "w", "b", "ar", "r"), 0)
        cocotb.start_soon(self._run())

    async def _run(self):
        m = self.m
        prev = None
        while True:
            await FallingEdge(m.bench.clk)
            await ReadOnly()
            now = {
                "bvalid": int(m.bvalid.value), "bready": int(m.bready.value), "bresp": int(m.bresp.value),
                "rvalid": int(m.rvalid.value), "rready": int(m.rready.value),
                "rdata": int(m.rdata.value), "rresp": int(m.rresp.value),
            }  # fmt: skip
            if prev is not None:
                if prev["bvalid"] and not prev["bready"]:
                    if not now["bvalid"] or now["bresp"] != prev["bresp"]:
                        self.errors.append(f"cycle {m.bench.cycle}: B changed before the handshake: {prev} -> {now}")
                if prev["rvalid"] and not prev["rready"]:
                    if not now["rvalid"] or (now["rdata"], now["rresp"]) != (prev["rdata"], prev["rresp"]):
                        self.errors.append(f"cycle {m.bench.cycle}: R changed before the handshake: {prev} -> {now}")
            for ch, valid, ready in (
                ("aw", m.awvalid, m.awready), ("w", m.wvalid, m.wready), ("ar", m.arvalid, m.arready),
                ("b", m.bvalid, m.bready), ("r", m.rvalid, m.rready),
            ):  # fmt: skip
                if valid.value and ready.value:
                    self.counts[ch] += 1
            c = self.counts
            if c["b"] > min(c["aw"], c["w"]) or c["r"] > c["ar"]:
                self.errors.append(f"cycle {m.bench.cycle}: response without request, handshakes {c}")
            prev = now

    def check(self):
        assert not self.errors, f"{len(self.errors)} AXI4-Lite protocol violations, first: {self.errors[:3]}"
