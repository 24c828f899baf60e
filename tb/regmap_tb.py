"""cocotb testbench for rtl_gen.axil.AXI4LiteCSR: AXI4-Lite accesses against the declared register map.

The DUT is exported with :func:`rtl_gen.axil.vivado_ports` (``s_axi_awaddr``, ..., ``regs__<reg>__<field>``).
The map arrives as the JSON the host would read (``regmap`` in ``$XNT_TB_PARAMS``), and
:class:`rtl_gen.regmap.RegisterFile` is the reference for every response, read word, datapath output,
pulse and strobe. Parameters (``$XNT_TB_PARAMS``): ``regmap`` (JSON text), ``ops`` (random accesses
per test, default 400).
"""

from __future__ import annotations

import cocotb
from cocotb.triggers import FallingEdge, ReadOnly

from rtl_gen.axil import RESP_OKAY, RESP_SLVERR
from rtl_gen.regmap import RegisterFile, RegisterMap
from tb.common import AxiLiteChecker, AxiLiteMaster, Bench, tb_params

PARAMS = tb_params()
REGMAP = RegisterMap.from_json(PARAMS["regmap"]) if "regmap" in PARAMS else None
OPS = int(PARAMS.get("ops", 400))


class TB(Bench):
    """AXI master and checker, the register-file model, and the datapath side of every field."""

    def __init__(self, dut, *, max_delay=3, p_stall=0.3):
        super().__init__(dut)
        assert REGMAP is not None, "no register map in $XNT_TB_PARAMS"
        self.map = REGMAP
        self.model = RegisterFile(REGMAP)
        self.axi = AxiLiteMaster(self, "s_axi_", max_delay=max_delay, p_stall=p_stall)
        self.checker = AxiLiteChecker(self.axi)
        self.port = {}
        for r in REGMAP:
            for f in r.fields:
                self.port[r.name, f.name] = getattr(dut, f"regs__{r.name}__{f.name}")
                if f.access == "w1c":
                    self.port[r.name, f"{f.name}_set"] = getattr(dut, f"regs__{r.name}__{f.name}_set")
            if r.strobe:
                for s in ("w_stb", "r_stb"):
                    self.port[r.name, s] = getattr(dut, f"regs__{r.name}__{s}")
        for r in REGMAP:  # the datapath drives ro fields with their reset value and sets no status
            for f in r.fields:
                if f.access == "ro":
                    self.port[r.name, f.name].value = f.reset & ((1 << f.width) - 1)
                elif f.access == "w1c":
                    self.port[r.name, f"{f.name}_set"].value = 0
        self.pulses: list[tuple[str, str, int]] = []
        self.strobes: list[tuple[str, str]] = []
        cocotb.start_soon(self._watch())

    async def _watch(self):
        """Record every cycle's nonzero pulse outputs and strobes (each lasts exactly one cycle)."""
        pulse_fields = [(r.name, f.name) for r in self.map for f in r.fields if f.access == "pulse"]
        strobe_regs = [r.name for r in self.map if r.strobe]
        while True:
            await FallingEdge(self.clk)
            await ReadOnly()
            for key in pulse_fields:
                value = int(self.port[key].value)
                if value:
                    self.pulses.append((*key, value))
            for name in strobe_regs:
                for kind in ("w", "r"):
                    if self.port[name, f"{kind}_stb"].value:
                        self.strobes.append((name, kind))

    def random_addr(self) -> int:
        """A mapped address (with random low bits) most of the time, else an unmapped one."""
        rng = self.rng
        if rng.random() < 0.8:
            return rng.choice(self.map.registers).addr | rng.getrandbits(2)
        while True:
            addr = rng.getrandbits(self.map.addr_width)
            if self.map.at(addr) is None:
                return addr

    async def write(self, addr, data, strb=0xF):
        resp = await self.axi.write(addr, data, strb)
        ok = self.model.write(addr, data, strb)
        assert resp == (RESP_OKAY if ok else RESP_SLVERR), f"write {addr:#x}: bresp {resp}, expected ok={ok}"

    async def read(self, addr):
        data, resp = await self.axi.read(addr)
        want, ok = self.model.read(addr)
        reg = self.map.at(addr)
        name = reg.name if reg else "unmapped"
        assert resp == (RESP_OKAY if ok else RESP_SLVERR), f"read {addr:#x} ({name}): rresp {resp}, expected ok={ok}"
        assert data == want, f"read {addr:#x} ({name}): {data:#010x}, expected {want:#010x}"
        return data

    async def drive_inputs(self):
        """New random values on every ro field, as the datapath would."""
        await FallingEdge(self.clk)
        for r in self.map:
            for f in r.fields:
                if f.access == "ro":
                    lo, hi = f.value_range
                    value = self.rng.randint(lo, hi)
                    self.port[r.name, f.name].value = value & ((1 << f.width) - 1)
                    self.model.set_input(r.name, f.name, value)

    async def raise_status(self):
        """One-cycle set pulses with random bits on every w1c field."""
        await FallingEdge(self.clk)
        sets = []
        for r in self.map:
            for f in r.fields:
                if f.access == "w1c":
                    bits = self.rng.getrandbits(f.width)
                    self.port[r.name, f"{f.name}_set"].value = bits
                    sets.append((r.name, f.name, bits))
        await FallingEdge(self.clk)
        for reg, name, bits in sets:
            self.port[reg, f"{name}_set"].value = 0
            self.model.set_status(reg, name, bits)

    async def set_during_write(self, reg, sets: dict[str, int], limit: int = 200):
        """Drive the ``<field>_set`` inputs of ``reg`` with ``sets`` (field name -> bits) for exactly the one
        cycle in which the bank executes a bus write to ``reg`` (the bridge's internal ``bus__w_stb`` and
        ``bus__addr``: the write takes effect at the edge that ends that cycle), then release them. Start it
        before the write; it fails if no such write comes within ``limit`` cycles."""
        w_stb, addr = self.dut.bus__w_stb, self.dut.bus__addr
        for _ in range(limit):
            await FallingEdge(self.clk)
            if w_stb.value and int(addr.value) >> 2 == reg.addr >> 2:
                break
        else:
            raise AssertionError(f"no bus write to {reg.name} within {limit} cycles")
        for name, bits in sets.items():
            self.port[reg.name, f"{name}_set"].value = bits
        await FallingEdge(self.clk)
        for name in sets:
            self.port[reg.name, f"{name}_set"].value = 0

    async def check_datapath(self):
        """rw/w1c outputs equal the model; pulses and strobes seen so far equal the model's."""
        await ReadOnly()
        for r in self.map:
            for f in r.fields:
                if f.access in ("rw", "w1c"):
                    got = int(self.port[r.name, f.name].value)
                    want = self.model.output(r.name, f.name) & ((1 << f.width) - 1)
                    assert got == want, f"{r.name}.{f.name} drives {got:#x}, expected {want:#x}"
        assert self.pulses == self.model.pulses, f"pulses {self.pulses[-3:]} != model {self.model.pulses[-3:]}"
        assert self.strobes == self.model.strobes, f"strobes {self.strobes[-3:]} != model {self.model.strobes[-3:]}"
        await FallingEdge(self.clk)


@cocotb.test()
async def test_reset_values(dut):
    """Right after reset every register reads its declared reset word and drives its reset values."""
    tb = TB(dut)
    await tb.reset()
    for r in tb.map:
        assert await tb.read(r.addr) == r.reset_word
    await tb.check_datapath()
    tb.checker.check()


@cocotb.test()
@cocotb.parametrize(delays=[(0, 0.0), (3, 0.3), (8, 0.7)])
async def test_random_accesses(dut, delays):
    """Random reads and writes (mapped, unmapped, random byte strobes) under random channel delays,
    with the datapath changing ro inputs and raising status bits in between."""
    max_delay, p_stall = delays
    tb = TB(dut, max_delay=max_delay, p_stall=p_stall)
    await tb.reset()
    rng = tb.rng
    for _ in range(OPS):
        choice = rng.random()
        if choice < 0.45:
            strb = 0xF if rng.random() < 0.5 else rng.getrandbits(4)
            await tb.write(tb.random_addr(), rng.getrandbits(32), strb)
        elif choice < 0.9:
            await tb.read(tb.random_addr())
        elif choice < 0.95:
            await tb.drive_inputs()
        else:
            await tb.raise_status()
        await tb.check_datapath()
    tb.checker.check()
    dut._log.info("handshakes %s", tb.checker.counts)


@cocotb.test()
async def test_overlapping_read_and_write(dut):
    """A stream of writes and a stream of reads in flight at the same time, on different registers."""
    tb = TB(dut, max_delay=2, p_stall=0.2)
    await tb.reset()
    writable = [r for r in tb.map if any(f.access == "rw" for f in r.fields) and not r.strobe]
    target, other = writable[0], writable[1]

    async def writer():
        for _ in range(OPS // 4):
            await tb.write(target.addr, tb.rng.getrandbits(32))

    async def reader():
        for _ in range(OPS // 4):
            await tb.read(other.addr)

    await tb.write(other.addr, 0x5A5A5A5A)
    w, r = cocotb.start_soon(writer()), cocotb.start_soon(reader())
    await w
    await r
    await tb.read(target.addr)
    await tb.check_datapath()
    tb.checker.check()


@cocotb.test()
@cocotb.parametrize(delays=[(0, 0.0), (3, 0.3)])
async def test_w1c_set_in_the_clearing_cycle_wins(dut, delays):
    """A ``<field>_set`` pulse in the very cycle that a write-1-to-clear of the same bits takes effect wins:
    the bits stay set (no event is lost). The set lasts that one cycle only, so a bank in which the clear
    wins reads the shared bits as 0 and fails; a set held for longer would be re-applied in the next cycle and
    could not tell the two apart. Random prior bits, clears and sets on every w1c field."""
    max_delay, p_stall = delays
    tb = TB(dut, max_delay=max_delay, p_stall=p_stall)
    await tb.reset()
    rng = tb.rng
    regs = [r for r in tb.map if any(f.access == "w1c" for f in r.fields)]
    for _ in range(24):
        r = rng.choice(regs)
        fields = [f for f in r.fields if f.access == "w1c"]
        await tb.raise_status()  # random bits already set
        clear = {f.name: rng.getrandbits(f.width) | 1 for f in fields}
        sets = {f.name: rng.getrandbits(f.width) | 1 for f in fields}  # bit 0 is both cleared and set
        pulse = cocotb.start_soon(tb.set_during_write(r, sets))
        await tb.write(r.addr, r.encode(**clear))
        await pulse
        for name, bits in sets.items():  # applied after the clear: the set wins
            tb.model.set_status(r.name, name, bits)
        await tb.read(r.addr)
        await tb.check_datapath()
    # released, the bits clear
    for r in regs:
        await tb.write(r.addr, r.encode(**{f.name: (1 << f.width) - 1 for f in r.fields if f.access == "w1c"}))
        await tb.read(r.addr)
    await tb.check_datapath()
    tb.checker.check()


@cocotb.test()
async def test_address_before_data_and_data_before_address(dut):
    """Long one-sided delays: W many cycles before AW and AW many cycles before W."""
    tb = TB(dut, max_delay=0, p_stall=0.0)
    await tb.reset()
    r = next(r for r in tb.map if r.fields[0].access == "rw" and r.fields[0].width == 32)
    axi = tb.axi
    for aw_delay, w_delay in ((12, 0), (0, 12), (5, 5)):
        value = tb.rng.getrandbits(32)
        aw = cocotb.start_soon(axi._send(axi.awvalid, axi.awready, {axi.awaddr: r.addr}, aw_delay))
        w = cocotb.start_soon(axi._send(axi.wvalid, axi.wready, {axi.wdata: value, axi.wstrb: 0xF}, w_delay))
        (resp,) = await axi._accept(axi.bvalid, axi.bready, [axi.bresp])
        await aw
        await w
        assert resp == RESP_OKAY
        tb.model.write(r.addr, value)
        assert await tb.read(r.addr) == value
    tb.checker.check()
