"""Host driver for a generated xnortrain accelerator.

One driver class (:class:`Driver`) for every transport. It knows the accelerator only through its
description (:class:`AcceleratorDescription`, the ``accelerator.json`` that ``xnortrain generate`` writes:
the register map, the batch/stream formats and the layout of every quantity that can be read back or
restored), and reaches it only through bus operations:

=================  =====================================================================================
:class:`Read`      read a 32-bit register (AXI4-Lite) -> the word
:class:`Write`     write a 32-bit register
:class:`Send`      push 32-bit words into the accelerator's AXI-Stream input (a DMA MM2S transfer)
:class:`Receive`   take ``count`` 32-bit words from the accelerator's AXI-Stream output (DMA S2MM)
:class:`Sleep`     let about ``cycles`` accelerator clock cycles pass (between status polls)
=================  =====================================================================================

Every driver operation is written once, as a generator that yields these operations and gets their
results back ("sans-IO"); a :class:`Transport` runs it. A :class:`BlockingTransport` runs it to the end
and returns the result (PYNQ on the board, mocks in tests); an :class:`AsyncTransport` returns a
coroutine to ``await`` (the cocotb transport in ``sim/tb/system_tb.py``). So the same register and
buffer logic drives the simulated accelerator and the board::

    drv = Driver(AcceleratorDescription.from_json("out/accelerator.json"), PynqTransport(overlay))
    result = drv.train_step(x, labels, lr=1e-3)             # on the board
    await drv.connect()                                     # in a cocotb test (AsyncTransport) ...
    result = await drv.train_step(x, labels, lr=1e-3)       # ... every call returns a coroutine

Before anything else the driver checks that the hardware is the accelerator the description describes
(:meth:`Driver.connect`: the identification, geometry and batch registers; the constructor runs it on a
blocking transport). Every wait is bounded in accelerator cycles and in wall time: a command that does not
finish is aborted (:class:`AcceleratorTimeout`), a stream transfer that does not complete is stopped
(:class:`TransferTimeout`, naming the transfer). A restore checks the whole state before it writes
anything (:meth:`Driver.check_state`, :class:`StateError`).

No register address or bit position is written here: registers and fields are looked up by name in
the map (:class:`rtl_gen.regmap.RegisterMap`), quantities by name in the description.

Stream format of a quantity (:class:`QuantityLayout`): the model's array (``shape``) is padded with
zeros to ``pad``, reshaped to ``reshape``, transposed by ``transpose`` and flattened: that is the order
in which the hardware's memories hold the elements. ``elems_per_word`` consecutive elements of
``elem_bits`` bits each (element ``e`` at bits ``e * elem_bits``, two's complement if ``signed``,
weights as 1 = +1 / 0 = -1 if ``encoding == "sign"``) make one memory word, and a memory word travels as
``ceil(elems_per_word * elem_bits / 32)`` stream beats, least significant beat first. The last beat of
a transfer carries TLAST.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import warnings
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "DESCRIPTION_FORMAT",
    "AcceleratorDescription",
    "AcceleratorError",
    "AcceleratorTimeout",
    "AsyncTransport",
    "BlockingTransport",
    "ClockWarning",
    "Driver",
    "HardwareMismatch",
    "PynqTransport",
    "QuantityLayout",
    "Read",
    "Receive",
    "Send",
    "Sleep",
    "StateError",
    "StepResult",
    "TransferTimeout",
    "Transport",
    "Write",
    "description_hash",
    "pack_words",
    "unpack_words",
]

DESCRIPTION_FORMAT = "xnortrain-accelerator"
DESCRIPTION_VERSION = 1
BEAT_BITS = 32
#: The read-only register (``rtl_gen.controller.build_regmap``) holding :func:`description_hash` of the description.
HASH_REGISTER = "id_hash"

# --- bus operations ---------------------------------------------------------------------------------------


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


class PynqTransport(BlockingTransport):
    """The board: the accelerator's AXI4-Lite slave through ``pynq.MMIO`` and its two AXI-Streams through
    one AXI DMA (MM2S -> ``s_axis``, S2MM <- ``m_axis``), with ``pynq.allocate`` buffers.

    ``overlay``: a loaded ``pynq.Overlay``; ``ip`` and ``dma`` name the accelerator and the DMA in its
    block design. ``pynq`` is imported here, never at module import (it exists only on the board).

    Buffers: one per direction, allocated once (by :meth:`attach`, which the :class:`Driver` calls, sized
    for the largest transfer of the description) on the DMA's device (``pynq.allocate(target=dma.device)``)
    and reused; only :meth:`close` frees them, and never one the DMA may still be using. A transfer of ``n``
    words hands the DMA the buffer's first ``n`` words (a ``PynqBuffer`` view: its physical address is the
    buffer's), so the cache operations cover only those bytes: pynq's send channel flushes the array it is
    given before it starts; a receive is invalidated here once complete (pynq does that only in ``wait()``).

    Clock: the accelerator's clock is the overlay's FCLK0 (``pynq.Clocks.fclk0_mhz``, set from the .hwh when the
    overlay is loaded), read when the transport is made; ``clock_mhz`` overrides it (an accelerator clocked
    from another source). It paces :meth:`sleep` and the transfer deadlines. :meth:`attach` compares it with
    the description's ``clock_mhz`` (the clock the bitstream was built and timing-checked for): within
    ``CLOCK_TOLERANCE`` nothing is said; slower, or faster by at most ``CLOCK_FAST_LIMIT`` (the PS PLL rounds a
    requested clock to the nearest divider, and Vivado checks timing at the rounded one), a
    :class:`ClockWarning` names both figures; faster than that, :class:`HardwareMismatch` (the design met
    timing only at the described clock: results could be silently wrong). A slower clock only makes steps
    take longer: the deadlines here and the driver's wall-time budget follow this clock.

    Transfer size: the DMA moves at most ``dma.buffer_max_size`` bytes per transfer (``2**c_sg_length_width
    - 1``, from the .hwh). :meth:`attach` refuses a description whose largest transfer does not fit
    (:class:`HardwareMismatch`: the bitstream's DMA was built too narrow), and every transfer is checked
    before it starts (pynq's own check raises a bare ``ValueError``).

    Waits (the DMA in simple mode): a transfer is complete when its channel reports ``idle`` (pynq's
    ``_SDMAChannel`` properties ``idle``, ``error``, ``running``; its blocking ``wait()`` polls without a
    deadline and is not used). A transfer not complete after ``timeout_s`` plus 64 cycles per word, or one
    the DMA flags as failed, is stopped: the channel is halted (``stop_timeout_s`` to do so; then a DMA
    soft reset, then both channels restarted) and :class:`TransferTimeout` / :class:`AcceleratorError`
    raised. A channel that does not stop even after the reset leaves the transport unusable (every later
    transfer raises) with its buffers kept. An interrupt (Ctrl-C) during a wait leaves the transfer marked
    in flight: the next transfer in that direction first waits for it to finish, or stops it.
    """

    # AXI DMA (PG021) registers used to halt / reset / restart a channel with a deadline (pynq's ``stop()`` and
    # ``start()`` poll without one): DMACR of each channel (bit 0 run/stop, bit 2 soft reset) and S2MM_LENGTH
    # (bytes received)
    _DMACR = {"send": 0x00, "receive": 0x30}
    _S2MM_LENGTH = 0x58
    _RUN = 0x1
    _RESET = 0x4

    CLOCK_TOLERANCE = 0.01  # relative difference from the description's clock that goes unreported
    CLOCK_FAST_LIMIT = 0.05  # faster than the description's clock by more than this: refused

    def __init__(self, overlay, *, ip: str = "xnortrain_0", dma: str = "axi_dma_0", clock_mhz: float | None = None,
                 timeout_s: float = 5.0, stop_timeout_s: float = 0.5):
        import pynq  # (board only)

        self._pynq = pynq
        self._ip = getattr(overlay, ip)
        self._dma = getattr(overlay, dma)
        self._mmio = self._ip.mmio
        if clock_mhz is None:
            try:
                clock_mhz = float(pynq.Clocks.fclk0_mhz)
            except Exception as e:  # noqa: BLE001 (pynq raises RuntimeError, AttributeError, OSError off a Zynq)
                raise HardwareMismatch(f"cannot read the overlay's clock (pynq.Clocks.fclk0_mhz: {e}); pass "
                                       "PynqTransport(overlay, clock_mhz=...) with the accelerator's clock") from None
        if not (isinstance(clock_mhz, int | float) and math.isfinite(clock_mhz) and clock_mhz > 0):
            raise ValueError(f"clock_mhz must be a positive number of MHz, not {clock_mhz!r}")
        #: the accelerator's clock (MHz): the overlay's FCLK0 unless given
        self.clock_mhz = float(clock_mhz)
        self._period = 1e-6 / self.clock_mhz
        self.timeout_s = float(timeout_s)
        self.stop_timeout_s = float(stop_timeout_s)
        self._channels = {"send": self._dma.sendchannel, "receive": self._dma.recvchannel}
        self._max_bytes = getattr(self._dma, "buffer_max_size", None)  # pynq's DMA: 2**c_sg_length_width - 1
        self._sizes = {"send": 0, "receive": 0}  # words of the largest transfer the description needs
        self._buffers: dict[str, Any] = {}
        self._in_flight = {"send": False, "receive": False}  # the DMA may still use the buffer
        self._broken: str | None = None  # why no transfer can run any more

    def attach(self, desc: AcceleratorDescription) -> None:
        """Compare the clock with the description's (see the class docstring), then allocate both buffers for
        the largest transfers of ``desc`` (the batch upload, every quantity)."""
        self.check_clock(desc.clock_mhz)
        qs = desc.quantities
        sends = [("batch upload", desc.batch_layout.beats + desc.label_layout.beats)]
        sends += [(f"restore {q.key}", q.beats) for q in qs if q.access != "ro"]
        receives = [("readback", 1)] + [(f"readback {q.key}", q.beats) for q in qs if q.access != "wo"]
        for direction, transfers in (("send", sends), ("receive", receives)):
            what, words = max(transfers, key=lambda t: t[1])
            if self._max_bytes is not None and 4 * words > self._max_bytes:
                need = (4 * words).bit_length()
                raise HardwareMismatch(
                    f"the overlay's DMA moves at most {self._max_bytes} bytes per transfer (c_sg_length_width = "
                    f"{self._width()}), but {desc.name}'s {what} is {4 * words} bytes: rebuild the bitstream with "
                    f"a buffer length width of at least {need} bits", [f"dma.c_sg_length_width >= {need}"])
            self._sizes[direction] = words
        for direction, words in self._sizes.items():
            self._buffer(direction, words)

    def check_clock(self, expected_mhz: float) -> None:
        """Report a clock that differs from ``expected_mhz`` (accelerator.json's ``clock_mhz``): a
        :class:`ClockWarning` or, faster than ``CLOCK_FAST_LIMIT`` allows, :class:`HardwareMismatch`."""
        have, want = self.clock_mhz, float(expected_mhz)
        if abs(have - want) <= self.CLOCK_TOLERANCE * want:
            return
        what = (f"the accelerator runs at {have:g} MHz (the overlay's FCLK0), accelerator.json says "
                f"clock_mhz = {want:g} MHz")
        if have > want * (1 + self.CLOCK_FAST_LIMIT):
            raise HardwareMismatch(
                f"{what}: the design met timing at {want:g} MHz only, so results could be silently wrong; "
                f"set pynq.Clocks.fclk0_mhz = {want:g} or rebuild the bitstream for {have:g} MHz",
                [f"clock: accelerator.json {want:g} MHz, overlay {have:g} MHz"])
        warnings.warn(f"{what}; the driver's deadlines follow {have:g} MHz", ClockWarning, stacklevel=3)

    def read(self, addr: int) -> int:
        return int(self._mmio.read(addr))

    def write(self, addr: int, value: int) -> None:
        self._mmio.write(addr, int(value) & 0xFFFFFFFF)

    def send(self, words: np.ndarray) -> None:
        words = np.asarray(words, dtype=np.uint32).reshape(-1)
        n = len(words)
        if n == 0:
            return
        self._check_size("send", n)
        buf = self._start("send", n)
        buf[:n] = words
        self._transfer("send", buf[:n], n)  # pynq's send channel flushes these n words before it starts

    def receive(self, count: int) -> np.ndarray:
        count = int(count)
        if count == 0:
            return np.zeros(0, np.uint32)
        self._check_size("receive", count)
        buf = self._start("receive", count)
        self._transfer("receive", buf[:count], count)
        got = int(self._dma.mmio.read(self._S2MM_LENGTH)) // 4
        if got != count:
            raise AcceleratorError(f"DMA receive of {count} words: the stream ended (TLAST) after {got} words")
        view = buf[:count]
        view.invalidate()  # the DMA wrote memory behind the CPU's cache
        return np.array(view, dtype=np.uint32)

    def sleep(self, cycles: int) -> None:
        time.sleep(cycles * self._period)

    def close(self) -> None:
        """Free the buffers (stopping a transfer still in flight first; a broken DMA's buffers are kept)."""
        for direction in list(self._buffers):
            try:
                self._settle(direction)
            except AcceleratorError:
                continue
            self._buffers.pop(direction).freebuffer()

    # -- internals ------------------------------------------------------------------------------------------

    def _width(self) -> int:
        return (self._max_bytes + 1).bit_length() - 1

    def _check_size(self, direction: str, words: int) -> None:
        if self._max_bytes is not None and 4 * words > self._max_bytes:
            raise AcceleratorError(f"DMA {direction} of {words} words ({4 * words} bytes) exceeds the overlay's DMA "
                                   f"limit of {self._max_bytes} bytes per transfer (c_sg_length_width = "
                                   f"{self._width()})")

    def _start(self, direction: str, words: int):
        """The buffer for a transfer of ``words`` words, once no earlier transfer can still use it."""
        self._settle(direction)
        return self._buffer(direction, words)

    def _buffer(self, direction: str, words: int):
        buf = self._buffers.get(direction)
        if buf is not None and len(buf) >= words:
            return buf
        if buf is not None:  # a larger transfer than the description's: replace the buffer, once unused
            self._settle(direction)
            self._buffers.pop(direction).freebuffer()
        buf = self._pynq.allocate(shape=(max(words, self._sizes[direction]),), dtype=np.uint32,
                                  target=getattr(self._dma, "device", None))  # memory the DMA reaches
        self._buffers[direction] = buf
        return buf

    def _transfer(self, direction: str, buf, words: int) -> None:
        ch = self._channels[direction]
        self._in_flight[direction] = True
        ch.transfer(buf, nbytes=4 * words)
        t0 = time.monotonic()
        deadline = t0 + self.timeout_s + 64 * words * self._period
        pause = 1e-5
        while True:  # a KeyboardInterrupt here leaves the transfer in flight (see _settle)
            if ch.error:
                self._stop(direction)
                raise AcceleratorError(f"DMA {direction} of {words} words: the DMA reported an error after "
                                       f"{time.monotonic() - t0:.3f} s; the channel was stopped")
            if ch.idle:
                break
            now = time.monotonic()
            if now >= deadline:
                self._stop(direction)
                raise TransferTimeout(f"DMA {direction} of {words} words not complete after {now - t0:.2f} s; "
                                      "the DMA channel was stopped")
            time.sleep(pause)
            pause = min(2 * pause, 1e-3)
        self._in_flight[direction] = False

    def _settle(self, direction: str) -> None:
        """Make sure no earlier transfer in ``direction`` is still running (stop it if it is)."""
        if self._broken:
            raise AcceleratorError(self._broken)
        if self._in_flight[direction]:
            ch = self._channels[direction]
            if ch.idle and not ch.error:
                self._in_flight[direction] = False
            else:
                self._stop(direction)

    def _poll(self, ready, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while not ready():
            if time.monotonic() >= deadline:
                return False
            time.sleep(1e-4)
        return True

    def _stop(self, direction: str) -> None:
        """Halt the channel, soft-reset the DMA if it does not halt in time, and restart what was stopped."""
        ch, mmio, cr = self._channels[direction], self._dma.mmio, self._DMACR[direction]
        mmio.write(cr, 0)  # run/stop = 0
        restart = [direction]
        if not self._poll(lambda: not ch.running, self.stop_timeout_s):
            mmio.write(cr, self._RESET)  # resets (and halts) both channels
            if not self._poll(lambda: not mmio.read(cr) & self._RESET and not ch.running, self.stop_timeout_s):
                self._broken = (f"the DMA's {direction} channel did not stop within {2 * self.stop_timeout_s:g} s "
                                "(halt, then soft reset); its buffers are kept: reload the overlay")
                raise AcceleratorError(self._broken)
            restart = list(self._channels)
        for d in restart:  # run/stop = 1 with a deadline (pynq's start() polls ``running`` without one) ...
            c = self._channels[d]
            mmio.write(self._DMACR[d], self._RUN)
            if not self._poll(lambda c=c: c.running, self.stop_timeout_s):
                self._broken = (f"the DMA's {d} channel did not restart within {self.stop_timeout_s:g} s after it was "
                                "stopped; its buffers are kept: reload the overlay")
                raise AcceleratorError(self._broken)
            c.start()  # ... then pynq's start(): returns at once; lets the next transfer begin on a non-idle channel
            self._in_flight[d] = False


# --- packing ----------------------------------------------------------------------------------------------


def _bits_of(values: np.ndarray, bits: int) -> np.ndarray:
    """``[n, bits]`` uint8 bit matrix of the low ``bits`` bits of int64 ``values`` (LSB first)."""
    v = np.ascontiguousarray(values.astype(np.int64).astype(np.uint64).reshape(-1))
    by = v.view(np.uint8).reshape(-1, 8)  # little-endian bytes on every supported host
    return np.unpackbits(by, axis=1, bitorder="little")[:, :bits]


def pack_words(values: np.ndarray, *, elem_bits: int, elems_per_word: int) -> np.ndarray:
    """uint32 beats of ``values`` (a flat int array whose length is a multiple of ``elems_per_word``):
    ``elems_per_word`` elements of ``elem_bits`` bits per memory word, each word as
    ``ceil(word bits / 32)`` beats, least significant first. Values are masked to ``elem_bits``."""
    values = np.asarray(values).reshape(-1)
    if len(values) % elems_per_word:
        raise ValueError(f"{len(values)} elements are not whole words of {elems_per_word}")
    n_words = len(values) // elems_per_word
    beats = math.ceil(elem_bits * elems_per_word / BEAT_BITS)
    bits = _bits_of(values, elem_bits).reshape(n_words, elems_per_word * elem_bits)
    padded = np.zeros((n_words, beats * BEAT_BITS), np.uint8)
    padded[:, : bits.shape[1]] = bits
    return np.packbits(padded, axis=1, bitorder="little").view("<u4").reshape(-1).astype(np.uint32)


def unpack_words(words: np.ndarray, *, elem_bits: int, elems_per_word: int, signed: bool = False) -> np.ndarray:
    """Inverse of :func:`pack_words`: int64 elements (sign-extended when ``signed``)."""
    words = np.asarray(words, dtype=np.uint32).reshape(-1)
    beats = math.ceil(elem_bits * elems_per_word / BEAT_BITS)
    if len(words) % beats:
        raise ValueError(f"{len(words)} beats are not whole memory words of {beats} beats")
    n_words = len(words) // beats
    bits = np.unpackbits(words.astype("<u4").view(np.uint8).reshape(n_words, beats * 4), axis=1, bitorder="little")
    bits = bits[:, : elems_per_word * elem_bits].reshape(n_words * elems_per_word, elem_bits)
    weights = np.left_shift(np.uint64(1), np.arange(elem_bits, dtype=np.uint64))
    raw = (bits.astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64)
    out = raw.astype(np.int64) if elem_bits < 64 else raw.view(np.int64)
    if signed and elem_bits < 64:
        out = np.where(out >> (elem_bits - 1) & 1, out - (1 << elem_bits), out)
    return out


@dataclass(frozen=True)
class QuantityLayout:
    """Where one array of the accelerator's state travels on the streams (see the module docstring).

    ``name`` and ``layer`` give the :meth:`Driver.state_dict` key (``f"{name}{layer}"``; ``layer`` is
    ``None`` for whole-accelerator quantities); ``kind`` is the code the ``arg.quantity`` register
    field selects it with; ``access``: ``"rw"`` (read back and restore), ``"ro"`` (read back only).
    """

    name: str
    layer: int | None
    kind: int
    shape: tuple[int, ...]
    elem_bits: int
    elems_per_word: int
    pad: tuple[int, ...]
    reshape: tuple[int, ...]
    transpose: tuple[int, ...]
    signed: bool = False
    encoding: str = "int"  # "int" or "sign" (+1 -> 1, -1 -> 0)
    access: str = "rw"
    skip_pad_words: bool = False  # words whose first element is padding are not stored (sweep order)

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(v) for v in self.shape))
        object.__setattr__(self, "pad", tuple(int(v) for v in self.pad))
        object.__setattr__(self, "reshape", tuple(int(v) for v in self.reshape))
        object.__setattr__(self, "transpose", tuple(int(v) for v in self.transpose))
        if len(self.pad) != len(self.shape) or any(p < s for p, s in zip(self.pad, self.shape, strict=True)):
            raise ValueError(f"{self.key}: pad {self.pad} does not cover shape {self.shape}")
        if math.prod(self.reshape) != math.prod(self.pad) or sorted(self.transpose) != list(range(len(self.reshape))):
            raise ValueError(
                f"{self.key}: reshape {self.reshape} / transpose {self.transpose} do not fit pad {self.pad}")
        if math.prod(self.pad) % self.elems_per_word:
            raise ValueError(f"{self.key}: {math.prod(self.pad)} elements are not whole words of {self.elems_per_word}")
        if not 1 <= self.elem_bits <= 63:
            raise ValueError(f"{self.key}: elem_bits {self.elem_bits} out of 1..63")
        if self.encoding not in ("int", "sign") or self.access not in ("rw", "ro", "wo"):
            raise ValueError(f"{self.key}: bad encoding {self.encoding!r} or access {self.access!r}")

    @property
    def key(self) -> str:
        return self.name if self.layer is None else f"{self.name}{self.layer}"

    @property
    def words(self) -> int:
        """Memory words of the quantity."""
        return len(self._index()) // self.elems_per_word

    @property
    def beats_per_word(self) -> int:
        return math.ceil(self.elem_bits * self.elems_per_word / BEAT_BITS)

    @property
    def beats(self) -> int:
        """Stream beats of one transfer."""
        return self.words * self.beats_per_word

    def _index(self) -> np.ndarray:
        """Flat index into the padded array of every stream element, in stream order."""
        cached = self.__dict__.get("_idx")
        if cached is not None:
            return cached
        idx = np.arange(math.prod(self.pad)).reshape(self.reshape).transpose(self.transpose).reshape(-1)
        if self.skip_pad_words:
            first = idx.reshape(-1, self.elems_per_word)[:, 0]
            coords = np.unravel_index(first, self.pad)
            keep = np.ones(len(first), bool)
            for c, s in zip(coords, self.shape, strict=True):
                keep &= c < s
            idx = idx.reshape(-1, self.elems_per_word)[keep].reshape(-1)
        self.__dict__["_idx"] = idx
        return idx

    def encode(self, array) -> np.ndarray:
        """The beats that restore ``array`` (shape ``shape``)."""
        a = np.asarray(array)
        if a.shape != self.shape:
            raise ValueError(f"{self.key}: expected an array of shape {self.shape}, got {a.shape}")
        a = a.astype(np.int64)
        if self.encoding == "sign":
            if not np.isin(a, (-1, 1)).all():
                raise ValueError(f"{self.key}: weights must be +-1")
            a = (a > 0).astype(np.int64)
        lo, hi = (-(1 << (self.elem_bits - 1)), (1 << (self.elem_bits - 1)) - 1) if self.signed else (
            0, (1 << self.elem_bits) - 1)
        if a.size and (a.min() < lo or a.max() > hi):
            raise ValueError(f"{self.key}: values {a.min()}..{a.max()} do not fit {self.elem_bits} bits ({lo}..{hi})")
        padded = np.zeros(self.pad, np.int64)
        padded[tuple(slice(0, s) for s in self.shape)] = a
        return pack_words(padded.reshape(-1)[self._index()], elem_bits=self.elem_bits,
                          elems_per_word=self.elems_per_word)

    def decode(self, words: np.ndarray) -> np.ndarray:
        """The array (shape ``shape``, int64; int8 for sign-encoded weights) carried by ``words``."""
        if len(words) != self.beats:
            raise ValueError(f"{self.key}: expected {self.beats} beats, got {len(words)}")
        flat = unpack_words(words, elem_bits=self.elem_bits, elems_per_word=self.elems_per_word, signed=self.signed)
        padded = np.zeros(math.prod(self.pad), np.int64)
        padded[self._index()] = flat[: len(self._index())]
        a = padded.reshape(self.pad)[tuple(slice(0, s) for s in self.shape)]
        if self.encoding == "sign":
            return np.where(a > 0, 1, -1).astype(np.int8)
        return a.copy()

    def to_dict(self) -> dict:
        d = {f: getattr(self, f) for f in self.__dataclass_fields__}
        for k in ("shape", "pad", "reshape", "transpose"):
            d[k] = list(d[k])
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> QuantityLayout:
        return cls(**dict(d))


@dataclass
class AcceleratorDescription:
    """What the host needs to know about one generated accelerator (``accelerator.json``).

    ``regmap``: the :class:`rtl_gen.regmap.RegisterMap`; ``batch``: samples per step; ``classes``;
    ``input``: ``"binary"`` or ``"int8"``; ``features``: inputs per sample; ``layers``: ``[n_in, n_out]``
    per weight layer; ``batch_layout`` and ``label_layout``: how one batch is uploaded (a
    :class:`QuantityLayout` each, with ``kind`` unused); ``quantities``: the readable/restorable arrays;
    ``kinds``: quantity name -> ``arg.quantity`` code; ``schedule``: the per-step constants of the
    optimiser (``{"optimizer": .., ...}``, see :meth:`Driver.schedule_words`); ``config``: the resolved
    configuration (TOML text) the accelerator was generated from; ``clock_mhz``.
    """

    name: str
    regmap: Any
    batch: int
    classes: int
    input: str
    features: int
    layers: list[tuple[int, int]]
    batch_layout: QuantityLayout
    label_layout: QuantityLayout
    quantities: list[QuantityLayout]
    kinds: dict[str, int]
    schedule: dict = field(default_factory=dict)
    config: str = ""
    clock_mhz: float = 100.0

    def quantity(self, name: str, layer: int | None = None) -> QuantityLayout:
        for q in self.quantities:
            if q.name == name and q.layer == layer:
                return q
        raise KeyError(f"the accelerator has no quantity {name!r} for layer {layer!r}")

    def to_dict(self) -> dict:
        return {
            "format": DESCRIPTION_FORMAT,
            "version": DESCRIPTION_VERSION,
            "name": self.name,
            "regmap": self.regmap.to_dict(),
            "batch": self.batch,
            "classes": self.classes,
            "input": self.input,
            "features": self.features,
            "layers": [list(x) for x in self.layers],
            "batch_layout": self.batch_layout.to_dict(),
            "label_layout": self.label_layout.to_dict(),
            "quantities": [q.to_dict() for q in self.quantities],
            "kinds": dict(self.kinds),
            "schedule": dict(self.schedule),
            "config": self.config,
            "clock_mhz": self.clock_mhz,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def write_json(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json() + "\n")
        return path

    @classmethod
    def from_dict(cls, d: Mapping) -> AcceleratorDescription:
        from rtl_gen.regmap import RegisterMap

        if d.get("format") != DESCRIPTION_FORMAT or d.get("version") != DESCRIPTION_VERSION:
            raise ValueError(f"not an accelerator description (format {DESCRIPTION_FORMAT!r} v{DESCRIPTION_VERSION})")
        return cls(
            name=d["name"],
            regmap=RegisterMap.from_dict(d["regmap"]),
            batch=int(d["batch"]),
            classes=int(d["classes"]),
            input=d["input"],
            features=int(d["features"]),
            layers=[tuple(x) for x in d["layers"]],
            batch_layout=QuantityLayout.from_dict(d["batch_layout"]),
            label_layout=QuantityLayout.from_dict(d["label_layout"]),
            quantities=[QuantityLayout.from_dict(q) for q in d["quantities"]],
            kinds=dict(d["kinds"]),
            schedule=dict(d.get("schedule", {})),
            config=d.get("config", ""),
            clock_mhz=float(d.get("clock_mhz", 100.0)),
        )

    @classmethod
    def from_json(cls, text_or_path) -> AcceleratorDescription:
        if isinstance(text_or_path, Path) or not str(text_or_path).lstrip().startswith("{"):
            text_or_path = Path(text_or_path).read_text()
        return cls.from_dict(json.loads(text_or_path))


def description_hash(desc: AcceleratorDescription | Mapping) -> int:
    """The 32-bit hash of an accelerator description (an :class:`AcceleratorDescription` or its ``to_dict()``,
    e.g. accelerator.json loaded): the generator builds it into the ``id_hash`` register, the driver compares
    the register with the hash of the description it was given (:meth:`Driver.connect`).

    Covered: everything ``to_dict()`` holds (geometry, every quantity layout, the batch and label formats, the
    optimiser schedule, the register map, the configuration text) except the ``id_hash`` register's own value
    (set to 0 here: the map holding the hash must hash like the map built with 0) and ``clock_mhz`` (a setting
    of the bitstream build, not of the Verilog; :class:`PynqTransport` compares it with the overlay's clock).
    The dict goes through a JSON round trip first, so a description and the same description read back from
    accelerator.json hash alike; then SHA-256 of its canonical JSON text, first 4 bytes little-endian."""
    d = desc.to_dict() if isinstance(desc, AcceleratorDescription) else desc
    d = json.loads(json.dumps(d))  # a copy in JSON types (tuples -> lists, keys -> str)
    d.pop("clock_mhz", None)
    for reg in d.get("regmap", {}).get("registers", []):
        if reg.get("name") == HASH_REGISTER:
            reg["reset"] = 0
            for f in reg.get("fields", []):
                f["reset"] = 0
    text = json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")


# --- the driver -------------------------------------------------------------------------------------------


class AcceleratorError(RuntimeError):
    """The accelerator flagged an error (the names of the ``error`` register's bits are in ``.flags``)."""

    def __init__(self, message: str, flags: Sequence[str] = ()):
        super().__init__(message)
        self.flags = tuple(flags)


class AcceleratorTimeout(AcceleratorError):
    """A command did not finish within the driver's cycle or wall-time budget (the driver aborted it)."""


class TransferTimeout(AcceleratorTimeout):
    """A stream transfer did not complete in time (the transport stopped it, the driver aborted the command)."""


class HardwareMismatch(AcceleratorError):
    """The identification / geometry registers disagree with the description (``.fields``: one line each)."""

    def __init__(self, message: str, fields: Sequence[str] = ()):
        super().__init__(message)
        self.fields = tuple(fields)


class ClockWarning(RuntimeWarning):
    """The board clocks the accelerator at another frequency than its description says (both figures named)."""


class StateError(ValueError):
    """A state dict that cannot be restored (a key missing or unknown, a shape, dtype or value wrong)."""


#: Registers that identify the accelerator (build-time constants) and are checked by :meth:`Driver.connect`.
IDENTITY_REGISTERS = ("id", "info", "info_batch", HASH_REGISTER)


#: Commands: ``cmd`` register pulse field -> ``done`` register flag that reports its completion.
COMMANDS = ("upload", "train", "readback", "restore", "abort")


@dataclass
class StepResult:
    """What one training step reports: ``loss`` (computed by the host from the read-back logits, as the
    bit-exact model does), ``correct``, ``cycles`` (measured by the accelerator from the train command
    to its completion), ``logits`` (int64 ``[B, classes]`` in Q.logit_frac), ``undone`` (``hw.switch_undo``:
    the update was reverted because the re-run's loss rose), ``loss_q`` (the accelerator's own integer loss
    of the batch from its loss unit, the quantity ``switch_undo`` compares: :meth:`sim.hw.model.HwModel._loss_q`,
    ``StepTrace.loss_q``)."""

    loss: float
    correct: int
    cycles: int
    logits: np.ndarray
    undone: bool = False
    loss_q: int = 0


class Driver:
    """Drives one accelerator through a :class:`Transport` (see the module docstring).

    Every public method returns what the transport's ``execute`` returns: the value itself for a
    :class:`BlockingTransport`, a coroutine to await for an :class:`AsyncTransport`.

    ``poll_cycles``: first wait between status polls (doubling up to 64x); ``timeout_cycles`` and
    ``timeout_s``: a command not done after this many (polled) cycles or this many seconds of wall time is
    aborted and raises :class:`AcceleratorTimeout` (``timeout_s`` defaults to twice the cycle budget at the
    transport's ``clock_mhz`` where it has one (:class:`PynqTransport`: the overlay's clock), else at the
    description's clock, at least a minute; a simulation, slower than the clock, passes its own).
    ``check``: run :meth:`connect` in the constructor (blocking transports only: with an
    :class:`AsyncTransport` await ``connect()`` yourself).
    ``step_log``: a path or a :class:`host.energy.StepLog`: every :meth:`train_step` appends one JSON line
    (wall-clock start and end, monotonic duration, the step's cycles, the batch size, the step index) for
    ``xnortrain energy-measure``; None (default) logs nothing.
    """

    def __init__(self, desc: AcceleratorDescription, transport: Transport, *, poll_cycles: int = 64,
                 timeout_cycles: int = 1 << 32, timeout_s: float | None = None, check: bool = True,
                 step_log=None):
        if not isinstance(desc, AcceleratorDescription):
            raise TypeError(f"desc must be an AcceleratorDescription, not {desc!r}")
        if not isinstance(transport, Transport):
            raise TypeError(f"transport must be a Transport, not {transport!r}")
        self.desc = desc
        self.map = desc.regmap
        self.transport = transport
        self.poll_cycles = int(poll_cycles)
        self.timeout_cycles = int(timeout_cycles)
        if timeout_s is None:  # at the transport's clock where it knows it (PynqTransport: the overlay's)
            clock = getattr(transport, "clock_mhz", None) or desc.clock_mhz
            timeout_s = max(60.0, 2 * self.timeout_cycles / (clock * 1e6))
        if not float(timeout_s) > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, not {timeout_s!r}")
        self.timeout_s = float(timeout_s)
        self._steps_base = 0  # steps restored by load_state_dict minus the hardware counter at that time
        self._schedule = None  # last schedule words written (to skip rewriting unchanged tables)
        self.last_infer_cycles: int | None = None  # cycles register after the last infer
        self._model_cfg = None  # the description's configuration, loaded on the first restore (False: none)
        if step_log is not None and not hasattr(step_log, "record"):  # a path: host.energy.StepLog opens it
            from host.energy import StepLog

            step_log = StepLog(step_log)
        self.step_log = step_log
        transport.attach(desc)
        if check and isinstance(transport, BlockingTransport):
            self.connect()

    # -- public API -----------------------------------------------------------------------------------------

    def connect(self):
        """Check that the hardware is the accelerator of the description: read the identification (``id``),
        geometry (``info``), batch (``info_batch``) and description hash (``id_hash``) registers and compare
        every field with the value :meth:`expected_identity` gives. Raises :class:`HardwareMismatch` naming
        each differing field with the expected and the read value ("description hash": the hardware was built
        from another description than this one, :func:`description_hash`), or when the description predates
        the hash register; returns the fields read (by register)."""
        return self.transport.execute(self._connect())

    def expected_identity(self) -> dict[str, dict[str, int]]:
        """What :meth:`connect` expects: each field's build-time value in the register map of the
        description; ``info.layers``, ``info.classes``, ``info.input_int8`` and ``info_batch.batch`` from the
        description's own fields (the ones the driver packs data with); ``id_hash.value`` is
        :func:`description_hash` of the description (not the value its register map records, so an edited
        accelerator.json is refused too)."""
        d = self.desc
        own = {("info", "layers"): len(d.layers), ("info", "classes"): d.classes,
               ("info", "input_int8"): int(d.input == "int8"), ("info_batch", "batch"): d.batch,
               (HASH_REGISTER, "value"): description_hash(d)}
        out = {}
        if HASH_REGISTER not in self.map:
            # refused, not warned: without the hash nothing ties the description to the bitstream beyond a few
            # geometry fields, and a wrong pairing trains silently wrong (issue 19)
            raise HardwareMismatch(
                f"accelerator.json ({d.name}) has no {HASH_REGISTER!r} register: it was generated before "
                "descriptions were hashed into the bitstream; regenerate it and the bitstream with this xnortrain",
                [f"{HASH_REGISTER}: missing from accelerator.json"])
        for reg in IDENTITY_REGISTERS:
            if reg not in self.map:
                raise ValueError(f"accelerator.json: the register map has no {reg!r} register")
            out[reg] = {f.name: own.get((reg, f.name), f.reset) for f in self.map[reg].fields}
        return out

    def check_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Raise :class:`StateError` (naming the key) unless :meth:`load_state_dict` can restore ``state``
        as a whole: every key the accelerator holds present and none other, shapes as in the description,
        integer values that fit the stored bit widths, weights +-1, every generator state nonzero; then,
        where the description's configuration can be loaded (:meth:`model_config`), the bit-exact model's
        :func:`sim.hw.model.validate_state` (ranges the configuration allows within those widths, the
        coupling of weights and optimiser state)."""
        self._encode_state(state)

    def model_config(self):
        """The configuration the accelerator was generated from (accelerator.json's ``config``), or None
        when the description has none or it cannot be loaded here (no ``sim`` package: the description's own
        checks still apply)."""
        if self._model_cfg is None:
            self._model_cfg = False
            if self.desc.config:
                try:
                    from sim.config import config_from_dict, tomllib
                    from sim.schema import ConfigError
                except ImportError:
                    return None
                try:
                    self._model_cfg = config_from_dict(tomllib.loads(self.desc.config))
                except (tomllib.TOMLDecodeError, ConfigError) as e:
                    raise ValueError(f"accelerator.json: its config does not load: {e}") from None
        return self._model_cfg or None

    def read_register(self, name: str):
        """Field values of register ``name`` (a dict by field name)."""
        return self.transport.execute(self._read_fields(name))

    def write_register(self, name: str, **fields):
        """Write register ``name`` with ``fields`` (others 0)."""
        return self.transport.execute(self._write_fields(name, **fields))

    def status(self):
        """``{"status": {...}, "done": {...}, "error": {...}, "cycles": n, "steps": n, "correct": n}``."""
        return self.transport.execute(self._status())

    def abort(self):
        """Stop whatever the accelerator is doing; clears ``done`` and ``error``."""
        return self.transport.execute(self._abort())

    def upload(self, x, labels):
        """Send one batch (``x``: ``[B, features]`` +-1 or int8 values; ``labels``: ``[B]``)."""
        return self.transport.execute(self._upload(x, labels))

    def infer(self, x, *, logits: bool = False):
        """Classify ``x`` (``[n, features]``, 1 <= n <= the batch size) on the accelerator with its running BN
        statistics (``HwModel.forward_eval``); the training state is left untouched. Returns the predicted
        classes (``[n]``, int64), and with ``logits=True`` ``(classes, logits)`` (``[n, classes]``, Q.FL
        integers). The cycles of the command are in :attr:`last_infer_cycles`."""
        return self.transport.execute(self._infer(x, logits=logits))

    def train_step(self, x, labels, *, lr: float, progress: float = 0.0, lr0: float | None = None):
        """Upload a batch, run one training step, read the logits: a :class:`StepResult`."""
        return self.transport.execute(self._train_step(x, labels, lr=lr, progress=progress, lr0=lr0))

    def read(self, name: str, layer: int | None = None):
        """Read back one quantity (decoded array)."""
        return self.transport.execute(self._readback(self.desc.quantity(name, layer)))

    def write(self, name: str, layer: int | None, array):
        """Restore one quantity."""
        return self.transport.execute(self._restore(self.desc.quantity(name, layer), array))

    def state_dict(self):
        """Every readable ``rw`` quantity, keyed like :meth:`sim.hw.model.HwModel.state_dict` (``w0``,
        ``acc0``, ``beta0``, ..., ``rng`` concatenated over layers, ``steps``)."""
        return self.transport.execute(self._state_dict())

    def load_state_dict(self, state: Mapping[str, np.ndarray]):
        """Restore everything :meth:`state_dict` returns. The whole state is checked first
        (:meth:`check_state`): a bad state raises :class:`StateError` before anything is written."""
        return self.transport.execute(self._load_state_dict(state))

    # -- programs -------------------------------------------------------------------------------------------

    def _read_fields(self, name: str) -> Program:
        word = yield Read(self.map.addr(name))
        return self.map.decode(name, word)

    def _connect(self) -> Program:
        got, bad = {}, []
        for reg, fields in self.expected_identity().items():
            got[reg] = yield from self._read_fields(reg)
            bad += [f"description hash ({reg}): accelerator.json {v:#010x}, hardware {got[reg][f]:#010x}"
                    if reg == HASH_REGISTER else f"{reg}.{f}: accelerator.json {v}, hardware {got[reg][f]}"
                    for f, v in fields.items() if got[reg][f] != v]
        if bad:
            raise HardwareMismatch(f"the accelerator is not the one accelerator.json describes ({self.desc.name}; "
                                   f"another bitstream or description?): {'; '.join(bad)}", bad)
        return got

    def _stream(self, op: Send | Receive, what: str) -> Program:
        """Run one stream transfer; when the transport gives up on it (:class:`TransferTimeout`), abort the
        accelerator's command too and name the transfer in the error."""
        try:
            return (yield op)
        except TransferTimeout as e:
            yield from self._abort()
            raise TransferTimeout(f"{what}: {e}; the command was aborted") from None

    def _write_fields(self, name: str, **fields) -> Program:
        yield Write(self.map.addr(name), self.map.encode(name, **fields))

    def _status(self) -> Program:
        out = {}
        for reg in ("status", "done", "error"):
            out[reg] = yield from self._read_fields(reg)
        for reg in ("cycles", "steps", "correct", "undone"):
            out[reg] = (yield from self._read_fields(reg))["value"]
        return out

    def _abort(self) -> Program:
        yield from self._write_fields("cmd", abort=1)
        yield from self._clear()

    def _clear(self) -> Program:
        """Clear every done and error flag (w1c)."""
        for reg in ("done", "error"):
            r = self.map[reg]
            yield Write(r.addr, sum(f.mask for f in r.fields))

    def _check_errors(self, what: str) -> Program:
        err = yield from self._read_fields("error")
        flags = [k for k, v in err.items() if v]
        if flags:
            yield from self._clear()
            raise AcceleratorError(f"{what}: the accelerator reported error(s) {', '.join(flags)}", flags)

    def _command(self, name: str, **arg) -> Program:
        """Write ``arg`` fields, clear ``done``, pulse ``cmd.<name>``; raise at once if it was refused."""
        if arg:
            yield from self._write_fields("arg", **arg)
        done = self.map["done"]
        yield Write(done.addr, done.field(name).mask)
        yield from self._write_fields("cmd", **{name: 1})
        yield from self._check_errors(f"command {name}")

    def _wait_done(self, name: str, what: str | None = None) -> Program:
        """Poll ``done.<name>`` (and ``error``) with growing pauses until set, or time out (cycles or wall
        time); ``what`` names the command in errors (default ``name``)."""
        what = what or name
        waited, pause = 0, self.poll_cycles
        done = self.map["done"]
        err = self.map["error"]
        t0 = time.monotonic()
        while True:
            word = yield Read(done.addr)
            if done.decode(word)[name]:
                break
            eword = yield Read(err.addr)
            if eword:
                yield from self._check_errors(f"command {what}")
            elapsed = time.monotonic() - t0
            if waited >= self.timeout_cycles or elapsed >= self.timeout_s:
                yield from self._abort()
                raise AcceleratorTimeout(f"command {what} not done after {elapsed:.2f} s ({waited} cycles; budget "
                                         f"{self.timeout_s:g} s, {self.timeout_cycles} cycles); aborted")
            yield Sleep(pause)
            waited += pause
            pause = min(2 * pause, 64 * self.poll_cycles)
        yield Write(done.addr, done.field(name).mask)
        yield from self._check_errors(f"command {name}")

    def batch_words(self, x, labels, *, partial: bool = False) -> np.ndarray:
        """The beats of one batch upload: the samples (``batch_layout``), then the labels (``label_layout``).
        ``partial``: ``n`` samples, 1 .. the batch size (an ``infer`` batch; ``train`` needs a full one)."""
        d = self.desc
        x = np.asarray(x)
        labels = np.asarray(labels)
        n = len(x) if partial and x.ndim == 2 else d.batch
        if partial and not 1 <= n <= d.batch:
            raise ValueError(f"batch: {n} samples; the accelerator takes 1 .. {d.batch} (its batch size) at a time")
        if x.shape != (n, d.features):
            raise ValueError(f"batch: expected x of shape {(n, d.features)}, got {x.shape}")
        if labels.shape != (n,):
            raise ValueError(f"batch: expected {n} labels, got shape {labels.shape}")
        if labels.size and (labels.min() < 0 or labels.max() >= d.classes):
            raise ValueError(f"batch: labels must be in 0..{d.classes - 1}")
        if n == d.batch:
            return np.concatenate([d.batch_layout.encode(x), d.label_layout.encode(labels.astype(np.int64))])
        # the first n rows of a full batch (sample-major words), then n labels
        full = np.ones((d.batch, d.features), dtype=x.dtype)
        full[:n] = x
        xw = d.batch_layout.encode(full)
        lw = d.label_layout.encode(np.concatenate([labels.astype(np.int64), np.zeros(d.batch - n, np.int64)]))
        lab_words = -(-n // d.label_layout.elems_per_word) * d.label_layout.beats_per_word
        return np.concatenate([xw[: len(xw) // d.batch * n], lw[:lab_words]])

    def _upload(self, x, labels) -> Program:
        words = self.batch_words(x, labels)
        yield from self._command("upload", batch=self.desc.batch)
        yield from self._stream(Send(words), "upload batch")
        yield from self._wait_done("upload")

    def schedule_words(self, lr: float, progress: float, lr0: float | None) -> dict:
        """Per-step constants of the hardware optimiser (docs/arithmetic.md, "Update"), computed with
        :mod:`sim.hw.optim` as the bit-exact model does: ``sched`` register fields ``lr_shift``
        (round(-log2 lr): beta and sgd), ``opt_shift`` (bop's EMA shift or iir's alpha shift at this point
        of the schedule) and ``switch_gate`` (``switch_gate(lr / lr0, hw.switch_rate)``: the switch accumulators
        take their increment only where ``(u & 0xFFFF) < gate``; 65536 = always), and for the switch optimiser its
        probability table ``switch_table`` (``switch_table_at``: the configured lambda, the threshold sigma
        annealed with ``lr / lr0`` by ``hw.switch_anneal``; written to every layer's weight memory when it
        changes, at most once per threshold step)."""
        from sim.hw import optim as O

        s = self.desc.schedule
        lr0 = float(s.get("lr0", lr)) if lr0 is None else float(lr0)
        ratio = lr / lr0 if lr0 > 0 else 1.0
        out = {"lr_shift": min(O.lr_shift(lr), 63), "opt_shift": 0, "switch_gate": 1 << O.PROB_BITS}
        opt = s.get("optimizer", "switch")
        if opt == "bop":
            out["opt_shift"] = min(int(s["bop_shift"]) + O.ratio_shift(ratio), 16)
        elif opt == "iir":
            from sim.reference.optim import iir_beta

            beta = iir_beta(progress, s["alpha_decay"], epochs=int(s["epochs"]), factor=float(s["decay_factor"]),
                            every=int(s["decay_every"]))
            out["opt_shift"] = int(s["iir_alpha_shift"]) + O.ratio_shift(beta, int(s["iir_max_decay_shift"]))
        elif opt == "sgd":
            out["opt_shift"] = min(O.lr_shift(lr), 63)
        elif opt == "switch":
            out["switch_gate"] = O.switch_gate(ratio, float(s.get("switch_rate", 1.0)))
            out["switch_table"] = tuple(int(v) for v in O.switch_table_at(
                int(s["switch_cutoff"]), float(s["switch_sigma"]), float(s["switch_lambda"]),
                float(s.get("switch_anneal", 0.0)), ratio))
        return out

    def _set_schedule(self, lr: float, progress: float, lr0: float | None) -> Program:
        words = self.schedule_words(lr, progress, lr0)
        old = self._schedule or {}
        regs = {k: v for k, v in words.items() if k != "switch_table"}
        if regs != {k: v for k, v in old.items() if k != "switch_table"}:
            yield from self._write_fields("sched", **regs)
        if "switch_table" in words and words["switch_table"] != old.get("switch_table"):
            table = np.array(words["switch_table"], dtype=np.int64)
            for q in self.desc.quantities:
                if q.name == "switch_table":
                    yield from self._restore(q, table)
        self._schedule = words

    def _train_step(self, x, labels, *, lr: float, progress: float, lr0: float | None) -> Program:
        from sim.hw.arith import ArithParams, loss_grad

        t_start, m_start = time.time(), time.monotonic()  # the step window of the step log
        yield from self._set_schedule(lr, progress, lr0)
        yield from self._upload(x, labels)
        yield from self._command("train")
        yield from self._wait_done("train")
        cycles = (yield from self._read_fields("cycles"))["value"]
        correct = (yield from self._read_fields("correct"))["value"]
        undone = (yield from self._read_fields("undone"))["value"]
        loss_q = (yield from self._read_fields("loss"))["value"]
        if "loss_hi" in self.map:  # an integer loss wider than one register
            loss_q |= (yield from self._read_fields("loss_hi"))["value"] << 32
        logits = yield from self._readback(self.desc.quantity("logits", len(self.desc.layers) - 1))
        if self.step_log is not None:
            self.step_log.record(t_start=t_start, t_end=time.time(), duration_s=time.monotonic() - m_start,
                                 cycles=int(cycles), batch=len(labels))
        p = ArithParams(**self.desc.schedule.get("arith", {}))
        _, loss, _ = loss_grad(logits, labels, p)
        return StepResult(loss=loss, correct=int(correct), cycles=int(cycles), logits=logits, undone=bool(undone),
                          loss_q=int(loss_q))

    def _infer(self, x, *, logits: bool) -> Program:
        d = self.desc
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != d.features:
            raise ValueError(f"infer: expected x of shape (n, {d.features}), got {x.shape}")
        n = len(x)
        if not 1 <= n <= d.batch:
            raise ValueError(f"infer: {n} samples; the accelerator classifies 1 .. {d.batch} (its batch size) "
                             "at a time")
        words = self.batch_words(x, np.zeros(n, np.int64), partial=True)
        yield from self._command("upload", batch=n)
        yield from self._stream(Send(words), f"upload {n} samples to infer")
        yield from self._wait_done("upload")
        yield from self._command("infer")
        yield from self._wait_done("infer")
        self.last_infer_cycles = int((yield from self._read_fields("cycles"))["value"])
        classes = (yield from self._readback(d.quantity("classes")))[:n].astype(np.int64)
        if not logits:
            return classes
        lg = yield from self._readback(d.quantity("logits", len(d.layers) - 1))
        return classes, np.asarray(lg)[:n]

    def _readback(self, q: QuantityLayout) -> Program:
        if q.access == "wo":
            raise ValueError(f"{q.key} is write-only on the accelerator")
        yield from self._command("readback", layer=q.layer or 0, quantity=q.kind)
        words = yield from self._stream(Receive(q.beats), f"readback {q.key}")
        yield from self._wait_done("readback", f"readback {q.key}")
        return q.decode(words)

    def _restore(self, q: QuantityLayout, array) -> Program:
        if q.access == "ro":
            raise ValueError(f"{q.key} is read-only on the accelerator")
        yield from self._restore_words(q, q.encode(array))

    def _restore_words(self, q: QuantityLayout, words: np.ndarray) -> Program:
        yield from self._command("restore", layer=q.layer or 0, quantity=q.kind)
        yield from self._stream(Send(words), f"restore {q.key} ({len(words)} words)")
        yield from self._wait_done("restore", f"restore {q.key}")

    def _state_dict(self) -> Program:
        out: dict[str, np.ndarray] = {}
        rng = []
        for q in self.desc.quantities:
            if q.access != "rw":
                continue
            a = yield from self._readback(q)
            if q.name == "rng":
                rng.append(a.astype(np.uint32))
            elif q.shape == ():
                out[q.key] = np.array(int(a), dtype=np.int64)
            else:
                out[q.key] = a
        if rng:
            out["rng"] = np.concatenate(rng)
        steps = (yield from self._read_fields("steps"))["value"]
        out["steps"] = np.array(steps + self._steps_base, dtype=np.int64)
        return out

    def _encode_state(self, state: Mapping[str, np.ndarray]) -> tuple[list, int]:
        """``([(quantity, words), ...], steps)`` for a restore of ``state``, or :class:`StateError`."""
        rw = [q for q in self.desc.quantities if q.access == "rw"]
        rngs = [q for q in rw if q.name == "rng"]
        keys = [q.key for q in rw if q.name != "rng"] + (["rng"] if rngs else []) + ["steps"]
        missing = [k for k in keys if k not in state]
        if missing:
            raise StateError(f"state: {', '.join(map(repr, missing))} {'is' if len(missing) == 1 else 'are'} "
                             f"missing (the accelerator holds {', '.join(keys)})")
        unknown = [k for k in state if k not in keys]
        if unknown:
            raise StateError(f"state: {', '.join(map(repr, unknown))} not held by the accelerator "
                             f"(it holds {', '.join(keys)}; a state of another configuration?)")
        arrays = {k: np.asarray(state[k]) for k in keys}
        for k, a in arrays.items():
            if a.dtype.kind not in "iu":
                raise StateError(f"state: {k!r} has dtype {a.dtype}; integer values are needed")
        steps = arrays["steps"]
        if steps.shape != ():
            raise StateError(f"state: 'steps' has shape {steps.shape}; a single integer is needed")
        if steps < 0:
            raise StateError(f"state: 'steps' = {int(steps)}; must be >= 0")
        rng = arrays.get("rng")
        if rngs:
            n = sum(math.prod(q.shape) for q in rngs)
            if rng.ndim != 1 or len(rng) != n:
                raise StateError(f"state: 'rng' has shape {rng.shape}: {rng.size} generators; the accelerator has {n}")
            _check_range("rng", rng, 0, (1 << 32) - 1, "32-bit generator state")
            if not rng.all():
                raise StateError(f"state: 'rng' generator {int(np.argmin(rng != 0))} is 0; xorshift32 states must be "
                                 "nonzero (a zero state never changes)")
        plan, at = [], 0
        for q in rw:
            if q.name == "rng":
                a = rng[at : at + math.prod(q.shape)].reshape(q.shape)
                at += a.size
            else:
                a = arrays[q.key]
                if a.shape != q.shape:
                    raise StateError(f"state: {q.key!r} has shape {a.shape}; the accelerator holds {q.shape}")
                if q.encoding == "sign":
                    bad = np.argwhere((a != 1) & (a != -1))
                    if len(bad):
                        i = tuple(int(v) for v in bad[0])
                        raise StateError(f"state: {q.key!r}{list(i)} = {int(a[i])}; weights must be +-1")
                else:
                    lo, hi = (-(1 << (q.elem_bits - 1)), (1 << (q.elem_bits - 1)) - 1) if q.signed else (
                        0, (1 << q.elem_bits) - 1)
                    _check_range(q.key, a, lo, hi, f"{q.elem_bits}-bit {'signed' if q.signed else 'unsigned'} field")
            try:
                plan.append((q, q.encode(a.astype(np.int64))))
            except ValueError as e:
                raise StateError(f"state: {q.key!r}: {e}") from None
        cfg = self.model_config()
        if cfg is not None:
            from sim.hw.model import StateError as ModelStateError
            from sim.hw.model import validate_state

            try:
                validate_state(cfg, state)
            except ModelStateError as e:
                raise StateError(f"state: {e}") from None
        return plan, int(steps)

    def _load_state_dict(self, state: Mapping[str, np.ndarray]) -> Program:
        plan, steps = self._encode_state(state)  # everything checked before the first write
        for q, words in plan:
            yield from self._restore_words(q, words)
        hw_steps = (yield from self._read_fields("steps"))["value"]
        self._steps_base = steps - hw_steps


def _check_range(key: str, a: np.ndarray, lo: int, hi: int, what: str) -> None:
    """:class:`StateError` naming the first element of integer array ``a`` outside ``lo..hi``."""
    if not a.size:
        return
    bad = np.argwhere((a < lo) | (a > hi))
    if len(bad):
        i = tuple(int(v) for v in bad[0])
        raise StateError(f"state: {key!r}{list(i)} = {int(a[i])} does not fit the accelerator's {what} ({lo}..{hi})")
