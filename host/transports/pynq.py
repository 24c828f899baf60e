"""The board's transport: the accelerator on a PYNQ overlay (``pynq.MMIO`` and one AXI DMA)."""

from __future__ import annotations

import math
import time
import warnings
from typing import Any

import numpy as np

from host.errors import AcceleratorError, ClockWarning, HardwareMismatch, TransferTimeout
from rtl_gen.contract import AcceleratorDescription

from .base import BlockingTransport

__all__ = ["PynqTransport"]


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
