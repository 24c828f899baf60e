"""The simulated board's transport: register accesses and stream transfers run in the C++ bus harness of a
:class:`host.simboard.SimBoard` (``host/simboard.cpp``), one ``ctypes`` call each."""

from __future__ import annotations

import ctypes

import numpy as np

from host.errors import AcceleratorError, AcceleratorTimeout, TransferTimeout

from .base import BlockingTransport

__all__ = ["BUS_CYCLES", "MAX_IDLE", "SimTransport"]

#: Cycles an AXI4-Lite access may wait for its response (the register file answers in a few cycles).
BUS_CYCLES = 10_000
#: Cycles a stream transfer may go without moving a word before it is given up.
MAX_IDLE = 1_000_000


class SimTransport(BlockingTransport):
    """The driver's bus on a :class:`SimBoard` (register accesses and stream transfers run in C++).

    ``bus_cycles``: an AXI4-Lite access without a response within this many cycles raises
    :class:`AcceleratorTimeout`; ``max_idle``: a stream transfer that moves no word for this many cycles
    in a row raises :class:`TransferTimeout`. A non-OKAY response (SLVERR) raises :class:`AcceleratorError`."""

    def __init__(self, board, *, bus_cycles: int = BUS_CYCLES, max_idle: int = MAX_IDLE):
        for name, v in (("bus_cycles", bus_cycles), ("max_idle", max_idle)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} = {v!r}: expected a positive number of cycles")
        self.board = board
        self.bus_cycles = bus_cycles
        self.max_idle = max_idle

    def read(self, addr: int) -> int:
        b = self.board
        data, resp = ctypes.c_uint32(), ctypes.c_uint32()
        if b._lib.sb_read(b._handle(), int(addr), self.bus_cycles, ctypes.byref(data), ctypes.byref(resp)):
            raise AcceleratorTimeout(f"AXI4-Lite read of {int(addr):#x}: no response within {self.bus_cycles} cycles")
        if resp.value:
            raise AcceleratorError(f"AXI4-Lite read of {int(addr):#x} answered {resp.value} (not OKAY)")
        return data.value

    def write(self, addr: int, value: int) -> None:
        b = self.board
        resp = ctypes.c_uint32()
        if b._lib.sb_write(b._handle(), int(addr), int(value) & 0xFFFFFFFF, 0xF, self.bus_cycles, ctypes.byref(resp)):
            raise AcceleratorTimeout(f"AXI4-Lite write of {int(addr):#x}: no response within {self.bus_cycles} cycles")
        if resp.value:
            raise AcceleratorError(f"AXI4-Lite write of {int(addr):#x} answered {resp.value} (not OKAY)")

    def send(self, words: np.ndarray) -> None:
        b = self.board
        words = np.ascontiguousarray(np.asarray(words).reshape(-1), dtype=np.uint32)
        n = len(words)
        if n == 0:
            return
        ptr = words.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32))
        took = b._lib.sb_send(b._handle(), ptr, n, 1, self.max_idle)
        if took != n:
            raise TransferTimeout(f"stream send of {n} words: the accelerator took {took} and then was not ready for "
                                  f"{self.max_idle} cycles")

    def receive(self, count: int) -> np.ndarray:
        b = self.board
        count = int(count)
        out = np.zeros(count, np.uint32)
        if count == 0:
            return out
        last = ctypes.c_int64()
        got = b._lib.sb_receive(b._handle(), out.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32)), count,
                                self.max_idle, ctypes.byref(last))
        if got != count:
            if last.value >= 0:
                raise AcceleratorError(f"stream receive of {count} words: the stream ended (TLAST) after {got} words")
            raise TransferTimeout(f"stream receive of {count} words: {got} came, then none for {self.max_idle} cycles")
        return out

    def sleep(self, cycles: int) -> None:
        self.board.run(int(cycles))
