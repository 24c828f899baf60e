"""The bus the driver speaks, and the transports that run it.

The driver (:class:`host.driver.Driver`) reaches the accelerator only through bus operations:

=================  =====================================================================================
:class:`Read`      read a 32-bit register (AXI4-Lite) -> the word
:class:`Write`     write a 32-bit register
:class:`Send`      push 32-bit words into the accelerator's AXI-Stream input (a DMA MM2S transfer)
:class:`Receive`   take ``count`` 32-bit words from the accelerator's AXI-Stream output (DMA S2MM)
:class:`Sleep`     let about ``cycles`` accelerator clock cycles pass (between status polls)
=================  =====================================================================================

Every driver operation is written once, as a generator that yields these operations and gets their
results back ("sans-IO"); a :class:`Transport` runs it. A :class:`BlockingTransport` runs it to the end
and returns the result (:class:`host.transports.pynq.PynqTransport` on the board,
:class:`host.transports.simboard.SimTransport` on the simulated board, mocks in tests); an
:class:`AsyncTransport` returns a coroutine to ``await`` (the cocotb transport of the testbenches,
``tb/cocotb_transport.py``).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from rtl_gen.contract import AcceleratorDescription

__all__ = ["AsyncTransport", "BlockingTransport", "Op", "Program", "Read", "Receive", "Send", "Sleep", "Transport",
           "Write"]


@dataclass(frozen=True)
class Read:
    """Read the register word at byte address ``addr``; the result is the word (int)."""

    addr: int


@dataclass(frozen=True)
class Write:
    """Write ``value`` to the register at byte address ``addr``."""

    addr: int
    value: int


@dataclass(frozen=True, eq=False)
class Send:
    """Push ``words`` (uint32) into the accelerator's stream input; the last one carries TLAST."""

    words: np.ndarray


@dataclass(frozen=True)
class Receive:
    """Take ``count`` words from the accelerator's stream output; the result is a uint32 array."""

    count: int


@dataclass(frozen=True)
class Sleep:
    """Let about ``cycles`` accelerator clock cycles pass."""

    cycles: int


Op = Read | Write | Send | Receive | Sleep
Program = Generator[Op, Any, Any]


class Transport:
    """Runs driver programs (generators of bus operations).

    An operation that raises (an ``Exception``) is raised inside the program at its ``yield``, so the
    program can clean up (the driver aborts the accelerator's command when a stream transfer times out)
    before the error leaves :meth:`execute`."""

    def execute(self, program: Program):  # pragma: no cover - interface
        raise NotImplementedError

    def attach(self, desc: AcceleratorDescription) -> None:
        """Called once by the :class:`Driver` with the accelerator's description (e.g. to size buffers)."""


class BlockingTransport(Transport):
    """A transport whose operations block: :meth:`execute` returns the program's result."""

    def read(self, addr: int) -> int:
        raise NotImplementedError

    def write(self, addr: int, value: int) -> None:
        raise NotImplementedError

    def send(self, words: np.ndarray) -> None:
        raise NotImplementedError

    def receive(self, count: int) -> np.ndarray:
        raise NotImplementedError

    def sleep(self, cycles: int) -> None:
        pass

    def execute(self, program: Program):
        result, error = None, None
        try:
            while True:
                op = program.send(result) if error is None else program.throw(error)
                result, error = None, None
                try:
                    result = self._do(op)
                except Exception as e:  # handed to the program (see Transport); KeyboardInterrupt is not
                    error = e
        except StopIteration as stop:
            return stop.value

    def _do(self, op: Op):
        if isinstance(op, Read):
            return int(self.read(op.addr))
        if isinstance(op, Write):
            self.write(op.addr, op.value)
            return None
        if isinstance(op, Send):
            self.send(op.words)
            return None
        if isinstance(op, Receive):
            return np.asarray(self.receive(op.count), dtype=np.uint32)
        if isinstance(op, Sleep):
            self.sleep(op.cycles)
            return None
        raise TypeError(f"unknown bus operation {op!r}")


class AsyncTransport(Transport):
    """A transport with ``async`` operations (cocotb): :meth:`execute` returns a coroutine."""

    async def read(self, addr: int) -> int:
        raise NotImplementedError

    async def write(self, addr: int, value: int) -> None:
        raise NotImplementedError

    async def send(self, words: np.ndarray) -> None:
        raise NotImplementedError

    async def receive(self, count: int) -> np.ndarray:
        raise NotImplementedError

    async def sleep(self, cycles: int) -> None:
        raise NotImplementedError

    def execute(self, program: Program):
        return self._run(program)

    async def _run(self, program: Program):
        result, error = None, None
        try:
            while True:
                op = program.send(result) if error is None else program.throw(error)
                result, error = None, None
                try:
                    result = await self._do(op)
                except Exception as e:  # handed to the program (see Transport)
                    error = e
        except StopIteration as stop:
            return stop.value

    async def _do(self, op: Op):
        if isinstance(op, Read):
            return int(await self.read(op.addr))
        if isinstance(op, Write):
            return await self.write(op.addr, op.value)
        if isinstance(op, Send):
            return await self.send(op.words)
        if isinstance(op, Receive):
            return np.asarray(await self.receive(op.count), dtype=np.uint32)
        if isinstance(op, Sleep):
            return await self.sleep(op.cycles)
        raise TypeError(f"unknown bus operation {op!r}")
