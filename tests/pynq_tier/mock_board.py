"""A Zynq board as pynq sees it, for the pynq tier: one :class:`pynq.Device` subclass (as PYNQ's own tests mock
devices, ``tests/mock_devices.py`` in the pynq sources) with

* register access (capability ``REGISTER_RW``) dispatched by address to the IP behind it: the accelerator
  (a :class:`mock_accelerator.MockAccelerator`, register words) and an AXI DMA model;
* ``allocate``: real :class:`pynq.buffer.PynqBuffer` objects, not coherent, with physical addresses; the
  memory the DMA reads and writes is a separate copy ("DRAM") that only ``flush`` (CPU -> DRAM) and
  ``invalidate`` (DRAM -> CPU) synchronise, so a missing cache operation shows as wrong data.

The AXI DMA model (:class:`AxiDma`, simple mode, PG021 register map) is driven only through the registers
pynq's ``pynq.lib.dma.DMA`` writes: a transfer starts when its LENGTH register is written while the channel
runs, moves words between DRAM (at the address in SA/DA) and the accelerator's streams, and sets DMASR.Idle.
Faults for tests: ``stuck`` (the transfer never ends, halting does not stop it, a soft reset does),
``reset_works``, ``starts`` (run/stop = 1 starts the channel), ``fail`` (DMASR.DMAIntErr).
"""

from __future__ import annotations

import struct
import weakref

import numpy as np
import pynq
from pynq.buffer import PynqBuffer

ACC_BASE, ACC_RANGE = 0x43C0_0000, 0x1_0000
DMA_BASE, DMA_RANGE = 0x4040_0000, 0x1_0000
DRAM_BASE = 0x1680_0000
SLCR_BASE, SLCR_RANGE = 0xF800_0000, 0x200  # the PS's system-level control registers (clocks)

# AXI DMA (PG021) register offsets per channel (MM2S at 0x00, S2MM at 0x30)
CR, SR, ADDR, ADDR_MSB, LENGTH = 0x00, 0x04, 0x18, 0x1C, 0x28
CHANNEL_BASE = {"send": 0x00, "receive": 0x30}
SR_HALTED, SR_IDLE, SR_INT_ERR = 0x1, 0x2, 0x10
CR_RS, CR_RESET = 0x1, 0x4


class DmaChannelModel:
    def __init__(self, dma, direction):
        self.dma, self.direction = dma, direction
        self.regs = {CR: 0, ADDR: 0, ADDR_MSB: 0, LENGTH: 0}
        self.halted, self.idle, self.failed, self.busy = True, False, False, False
        self.stuck = False  # the next transfers never complete; halting does not end them
        self.fail = False  # the next transfer fails (DMASR.DMAIntErr)
        self.starts = True  # run/stop = 1 starts the channel (else it stays halted)
        self.transfers = []  # (physical address, bytes)

    def status(self):
        return (self.halted * SR_HALTED) | (self.idle * SR_IDLE) | (self.failed * SR_INT_ERR)

    def write(self, off, value):
        if off == CR:
            if value & CR_RESET:
                self.dma.soft_reset()
                return
            self.regs[CR] = value
            if value & CR_RS:
                self.halted = self.halted and not self.starts
            elif not self.busy or not self.stuck:  # run/stop = 0 halts, unless the transfer hangs
                self.halted, self.busy = True, False
        elif off == SR:
            pass  # interrupt flags (w1c): none modelled
        elif off == LENGTH:
            self.regs[LENGTH] = value
            if not self.halted:
                self._start(value)
        else:
            self.regs[off] = value

    def read(self, off):
        if off == SR:
            return self.status()
        if off == CR:
            return self.regs[CR] | (CR_RESET if self.dma.resetting else 0)
        return self.regs.get(off, 0)

    def _start(self, nbytes):
        addr = self.regs[ADDR] | (self.regs[ADDR_MSB] << 32)
        self.transfers.append((addr, nbytes))
        self.idle = False
        if self.fail:
            self.failed, self.fail = True, False
            return
        if self.stuck:
            self.busy = True
            return
        dev, acc = self.dma.device, self.dma.acc
        if self.direction == "send":
            acc.send(np.frombuffer(dev.dram_read(addr, nbytes), dtype=np.uint32).copy())
        else:
            words = np.asarray(acc.receive(nbytes // 4), dtype=np.uint32)
            dev.dram_write(addr, words.tobytes())
            self.regs[LENGTH] = 4 * len(words)  # S2MM_LENGTH: the bytes received (the stream's TLAST)
        self.idle = True


class AxiDma:
    """The DMA's registers; ``reset_works``: a soft reset ends stuck transfers (else it never completes)."""

    def __init__(self, device, acc):
        self.device, self.acc = device, acc
        self.channels = {d: DmaChannelModel(self, d) for d in CHANNEL_BASE}
        self.reset_works = True
        self.resetting = False
        self.resets = 0

    def soft_reset(self):
        self.resets += 1
        if not self.reset_works:
            self.resetting = True
            return
        for ch in self.channels.values():
            ch.regs[CR] = 0
            ch.halted, ch.idle, ch.failed, ch.busy = True, False, False, False

    def _split(self, off):
        for d, base in CHANNEL_BASE.items():
            if base <= off < base + 0x30:
                return self.channels[d], off - base
        raise AssertionError(f"DMA register 0x{off:x} not modelled")

    def read(self, off):
        ch, o = self._split(off)
        return ch.read(o)

    def write(self, off, value):
        ch, o = self._split(off)
        ch.write(o, value)


class AcceleratorRegisters:
    def __init__(self, acc):
        self.acc = acc

    def read(self, off):
        return self.acc.read(off)

    def write(self, off, value):
        self.acc.write(off, value)


class Slcr:
    """The Zynq-7000 PS's clock registers (SLCR, UG585) that ``pynq.Clocks`` reads for ``fclk0_mhz``: the IO PLL's
    feedback divider (IO_PLL_CTRL.PLL_FDIV, bits 12..18, times the 50 MHz PS reference) and FPGA0_CLK_CTRL
    (SRCSEL bits 4..5 = 0: the IO PLL; DIVISOR0 bits 8..13, DIVISOR1 bits 20..25). Reset: 1000 MHz / 10 / 1 =
    100 MHz. Other registers read 0."""

    IO_PLL_CTRL, FPGA0_CLK_CTRL = 0x108, 0x170

    def __init__(self):
        self.regs = {self.IO_PLL_CTRL: 20 << 12}
        self.set_fclk0(10, 1)

    def set_fclk0(self, div0, div1):
        self.regs[self.FPGA0_CLK_CTRL] = (div1 << 20) | (div0 << 8)

    def read(self, off):
        return self.regs.get(off, 0)

    def write(self, off, value):
        self.regs[off] = value


class MockZynq(pynq.Device):
    """The board's PL as a pynq device: the accelerator and the DMA on the register bus, DRAM for buffers, and the
    PS's clock registers (:class:`Slcr`, for ``pynq.Clocks``: ``arch`` is a Zynq-7000's)."""

    arch = "armv7l"

    def __init__(self, acc, tag="mock_zynq", *, dram_base=DRAM_BASE):
        super().__init__(tag)
        self.capabilities = {"REGISTER_RW": True}
        self.acc = acc
        self.dma = AxiDma(self, acc)
        self.slcr = Slcr()
        self.ips = [(ACC_BASE, ACC_RANGE, AcceleratorRegisters(acc)), (DMA_BASE, DMA_RANGE, self.dma),
                    (SLCR_BASE, SLCR_RANGE, self.slcr)]
        self.next_addr = dram_base
        self.bos = {}  # bo -> [physical address, DRAM bytearray, weakref to the host buffer]
        self.allocations, self.flushes, self.invalidates = [], [], []

    # register access (pynq.MMIO on a REGISTER_RW device)
    def _ip(self, address, length):
        for base, size, ip in self.ips:
            if base <= address < base + size:
                assert address + length <= base + size and length == 4 and address % 4 == 0
                return ip, address - base
        raise AssertionError(f"no IP at 0x{address:x}")

    def read_registers(self, address, length):
        ip, off = self._ip(address, length)
        return struct.pack("<I", ip.read(off) & 0xFFFFFFFF)

    def write_registers(self, address, data):
        ip, off = self._ip(address, len(data))
        ip.write(off, struct.unpack("<I", data)[0])

    # memory
    def allocate(self, shape, dtype, **kwargs):
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        bo = len(self.bos) + 1
        addr = self.next_addr
        self.next_addr += -(-nbytes // 4096) * 4096
        buf = PynqBuffer(shape, dtype, device=self, bo=bo, coherent=False, device_address=addr)
        buf[...] = 0
        self.bos[bo] = [addr, bytearray(nbytes), weakref.ref(buf)]
        self.allocations.append((bo, tuple(np.atleast_1d(shape)), addr))
        return buf

    def _host(self, bo):
        buf = self.bos[bo][2]()
        assert buf is not None, "cache operation on a buffer that no longer exists"
        return buf.view(np.uint8).reshape(-1)

    def flush(self, bo, offset, vaddr, length):
        self.flushes.append((bo, offset, length))
        self.bos[bo][1][offset : offset + length] = self._host(bo)[offset : offset + length].tobytes()

    def invalidate(self, bo, offset, vaddr, length):
        self.invalidates.append((bo, offset, length))
        self._host(bo)[offset : offset + length] = np.frombuffer(self.bos[bo][1], np.uint8)[offset : offset + length]

    def _dram(self, addr, n):
        for base, mem, _ in self.bos.values():
            if base <= addr and addr + n <= base + len(mem):
                return mem, addr - base
        raise AssertionError(f"DMA access to 0x{addr:x}..+{n}: no buffer there (a DMA decode error on a board)")

    def dram_read(self, addr, n):
        mem, off = self._dram(addr, n)
        return bytes(mem[off : off + n])

    def dram_write(self, addr, data):
        mem, off = self._dram(addr, len(data))
        mem[off : off + len(data)] = data


def dma_description(device, *, length_width=26):
    """The ``ip_dict`` entry pynq builds from the .hwh for an ``axi_dma`` (no scatter-gather, both channels,
    32-bit memory maps, no interrupts): what ``pynq.lib.dma.DMA`` reads."""
    return {
        "device": device, "phys_addr": DMA_BASE, "addr_range": DMA_RANGE, "fullpath": "axi_dma_0",
        "type": "xilinx.com:ip:axi_dma:7.1", "interrupts": {}, "gpio": {},
        "parameters": {"c_include_sg": "0", "c_sg_length_width": str(length_width), "c_include_mm2s": "1",
                       "c_include_s2mm": "1", "c_m_axi_mm2s_data_width": "32", "c_m_axi_s2mm_data_width": "32",
                       "c_include_mm2s_dre": "0", "c_include_s2mm_dre": "0", "c_micro_dma": "0"},
    }


def accelerator_description(device):
    return {"device": device, "phys_addr": ACC_BASE, "addr_range": ACC_RANGE, "fullpath": "xnortrain_0",
            "type": "xilinx.com:module_ref:xnortrain:1.0", "interrupts": {}, "gpio": {}, "parameters": {}}


class MockOverlay:
    """What ``pynq.Overlay("xnortrain.bit")`` gives the driver: ``xnortrain_0`` (a ``pynq.DefaultIP``, its
    ``mmio`` a real ``pynq.MMIO``) and ``axi_dma_0`` (a real ``pynq.lib.dma.DMA``), both on ``device``."""

    def __init__(self, device, *, length_width=26):
        from pynq.lib.dma import DMA

        self.device = device
        self.xnortrain_0 = pynq.DefaultIP(accelerator_description(device))
        self.axi_dma_0 = DMA(dma_description(device, length_width=length_width))
