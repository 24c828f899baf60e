"""host.transports.pynq.PynqTransport against a fake of the pynq objects it uses (``pynq.allocate`` buffers, the
accelerator's MMIO, an AXI DMA with pynq 3.x's ``_SDMAChannel`` attributes ``transfer``/``idle``/``running``/
``error``/``start`` and the DMA's register MMIO), with the mock accelerator behind the streams: every wait is
bounded in wall time and names the transfer, buffers are allocated once, and no buffer is freed while the
DMA may still use it. pynq itself is never imported (a fake module stands in for it)."""

import sys
import time
import types
from types import SimpleNamespace

import numpy as np
import pytest
from mock_accelerator import C, MockAccelerator, batch, make_desc, random_state

from host.driver import Driver
from host.errors import AcceleratorError, ClockWarning, HardwareMismatch, TransferTimeout
from host.transports.pynq import PynqTransport

DMACR = {"send": 0x00, "receive": 0x30}


class FakeBuffer(np.ndarray):
    """A ``pynq.allocate`` buffer: an ndarray with cache maintenance and ``freebuffer``; a view (``buf[:n]``)
    is the same buffer (as pynq's ``PynqBuffer``)."""

    def __array_finalize__(self, obj):
        for a in ("pynq", "number", "freed"):
            if hasattr(obj, a):
                setattr(self, a, getattr(obj, a))

    def flush(self):
        pass

    def invalidate(self):
        pass

    def freebuffer(self):
        assert not self.freed, "buffer freed twice"
        self.freed = True
        self.pynq.freed.append(self.number)


class FakePynq(types.ModuleType):
    def __init__(self):
        super().__init__("pynq")
        self.allocated = []  # sizes, in allocation order
        self.freed = []  # numbers of freed buffers
        self.targets = []  # the device given to each allocate
        self.Clocks = SimpleNamespace(fclk0_mhz=100.0)  # the overlay's FCLK0 (accelerator.json: 100 MHz)

    def allocate(self, shape, dtype, target=None):
        self.targets.append(target)
        buf = np.zeros(shape, dtype).view(FakeBuffer)
        buf.pynq, buf.number, buf.freed = self, len(self.allocated), False
        self.allocated.append(int(np.prod(shape)))
        return buf


class FakeChannel:
    """One simple-mode channel: a transfer completes at once (the mock accelerator takes or gives the
    words) unless ``hang``; ``halts``: run/stop = 0 halts it; ``interrupt_after``: the n-th read of ``idle``
    raises KeyboardInterrupt (Ctrl-C during a wait)."""

    def __init__(self, dma, direction):
        self.dma, self.direction = dma, direction
        self.halted, self.first, self.busy, self.failed = False, True, False, False
        self.hang, self.halts, self.fail = False, True, False
        self.interrupt_after = None
        self.idle_reads = 0
        self.transfers = []  # (buffer number, nbytes)

    @property
    def running(self):
        return not self.halted

    @property
    def idle(self):
        self.idle_reads += 1
        if self.interrupt_after is not None and self.idle_reads >= self.interrupt_after:
            self.interrupt_after = None
            raise KeyboardInterrupt
        return not self.busy and not self.first and not self.halted

    @property
    def error(self):
        return self.failed

    def start(self):
        self.halted, self.first = False, True

    def stop(self):  # as pynq's: run/stop = 0, then poll ``running`` without a deadline
        self.dma.mmio.write(DMACR[self.direction], 0)
        self._spin(lambda: not self.running, "stop")

    def wait(self):  # as pynq's: poll ``error`` and ``idle`` without a deadline
        self._spin(lambda: self.error or self.idle, "wait")
        if self.error:
            raise RuntimeError("DMA Internal Error")

    def _spin(self, ready, what):
        guard = time.monotonic() + 2.0
        while not ready():
            assert time.monotonic() < guard, f"pynq's {what}() would spin forever"

    def transfer(self, array, start=0, nbytes=0):
        assert self.running, "DMA channel not started"
        assert self.idle or self.first, "DMA channel not idle"
        assert not array.freed, "transfer from a freed buffer"
        n = (nbytes or array.nbytes) // 4
        self.transfers.append((array.number, 4 * n))
        self.first = False
        if self.fail:
            self.failed = True
            return
        if self.hang:
            self.busy = True
            return
        acc = self.dma.acc
        if self.direction == "send":
            acc.send(np.array(array[:n]))
        else:
            words = acc.receive(n)
            array[: len(words)] = words
            self.dma.received = 4 * len(words)


class FakeDmaRegisters:
    """The DMA's own registers: DMACR run/stop and soft reset, S2MM_LENGTH."""

    def __init__(self, dma):
        self.dma = dma
        self.writes = []

    def write(self, addr, value):
        self.writes.append((addr, value))
        d = {v: k for k, v in DMACR.items()}[addr]
        ch = self.dma.channels[d]
        if value & 0x4:  # soft reset: both channels halt, transfers end
            if self.dma.reset_works:
                for c in self.dma.channels.values():
                    c.halted, c.busy = True, False
        elif not value & 1 and ch.halts:
            ch.halted, ch.busy = True, False
        elif value & 1:
            ch.halted = False

    def read(self, addr):
        if addr == 0x58:
            return self.dma.received
        return 0


class FakeDma:
    def __init__(self, acc):
        self.acc = acc
        self.device = object()  # pynq's DMA driver: the device (memory) it is on
        self.received = 0
        self.reset_works = True
        self.sendchannel = FakeChannel(self, "send")
        self.recvchannel = FakeChannel(self, "receive")
        self.channels = {"send": self.sendchannel, "receive": self.recvchannel}
        self.mmio = FakeDmaRegisters(self)


class FakeMMIO:
    def __init__(self, acc):
        self.acc = acc

    def read(self, addr):
        return self.acc.read(addr)

    def write(self, addr, value):
        self.acc.write(addr, value)


@pytest.fixture
def board(monkeypatch):
    """(driver, fake pynq, DMA, mock accelerator) with a 0.1 s transfer budget."""
    pynq = FakePynq()
    monkeypatch.setitem(sys.modules, "pynq", pynq)
    desc = make_desc()
    acc = MockAccelerator(desc)
    dma = FakeDma(acc)
    overlay = SimpleNamespace(xnortrain_0=SimpleNamespace(mmio=FakeMMIO(acc)), axi_dma_0=dma)
    t = PynqTransport(overlay, timeout_s=0.1, stop_timeout_s=0.02)
    return Driver(desc, t), pynq, dma, acc


def test_buffers_are_allocated_once_for_the_largest_transfers(board):
    drv, pynq, dma, acc = board
    desc = drv.desc
    send_max = max([desc.batch_layout.beats + desc.label_layout.beats]
                   + [q.beats for q in desc.quantities if q.access != "ro"])
    recv_max = max(q.beats for q in desc.quantities if q.access != "wo")
    assert sorted(pynq.allocated) == sorted([send_max, recv_max])
    assert pynq.targets == [dma.device, dma.device]  # memory the DMA reaches, not pynq's default device
    state = random_state(desc)
    for _ in range(3):
        drv.upload(*batch())
        drv.load_state_dict(state)
        back = drv.state_dict()
    assert all((np.asarray(back[k]) == np.asarray(state[k])).all() for k in state)
    assert len(pynq.allocated) == 2 and pynq.freed == []
    assert len(dma.sendchannel.transfers) > 20 and len(dma.recvchannel.transfers) > 10
    assert {n for n, _ in dma.sendchannel.transfers} == {0} and {n for n, _ in dma.recvchannel.transfers} == {1}
    drv.transport.close()
    assert sorted(pynq.freed) == [0, 1]


@pytest.mark.parametrize("direction", ["send", "receive"])
def test_a_transfer_that_never_completes_raises_in_time_naming_it(board, direction):
    drv, pynq, dma, acc = board
    dma.channels[direction].hang = True
    q = drv.desc.quantity("beta", 1)
    t0 = time.monotonic()
    with pytest.raises(TransferTimeout) as info:
        if direction == "send":
            drv.write("beta", 1, np.arange(C))
        else:
            drv.read("beta", 1)
    assert time.monotonic() - t0 < 0.1 + 1.0
    what = "restore beta1" if direction == "send" else "readback beta1"
    assert str(info.value).startswith(f"{what}")
    assert f"DMA {direction} of {q.beats} words not complete after 0.1" in str(info.value)
    assert "channel was stopped" in str(info.value) and "command was aborted" in str(info.value)
    assert (DMACR[direction], 0) in dma.mmio.writes  # halted ...
    assert dma.channels[direction].running  # ... and restarted
    assert ("write", "cmd", drv.map.encode("cmd", abort=1)) in acc.log  # the accelerator's command aborted
    assert pynq.freed == []
    dma.channels[direction].hang = False  # the transport (and the accelerator) work again
    drv.write("beta", 1, np.arange(C))
    assert (drv.read("beta", 1) == np.arange(C)).all()


def test_a_channel_that_does_not_halt_is_reset(board):
    drv, pynq, dma, acc = board
    dma.recvchannel.hang, dma.recvchannel.halts = True, False
    with pytest.raises(TransferTimeout, match="readback w0"):
        drv.read("w", 0)
    assert (DMACR["receive"], 0x4) in dma.mmio.writes
    assert dma.sendchannel.running and dma.recvchannel.running


def test_a_dma_that_cannot_be_stopped_keeps_its_buffers_and_refuses_further_transfers(board):
    drv, pynq, dma, acc = board
    dma.recvchannel.hang, dma.recvchannel.halts, dma.reset_works = True, False, False
    with pytest.raises(AcceleratorError, match="did not stop within .*buffers are kept: reload the overlay"):
        drv.read("w", 0)
    acc.running = acc.pending = None
    with pytest.raises(AcceleratorError, match="reload the overlay"):
        drv.upload(*batch())
    drv.transport.close()
    assert pynq.freed == []


def test_a_dma_error_is_raised_and_the_channel_stopped(board):
    drv, pynq, dma, acc = board
    dma.sendchannel.fail = True
    with pytest.raises(AcceleratorError, match="DMA send of 5 words: the DMA reported an error"):
        drv.upload(*batch())
    assert (DMACR["send"], 0) in dma.mmio.writes


def test_a_short_receive_is_an_error(board):
    drv, pynq, dma, acc = board
    real = acc.receive
    acc.receive = lambda count: real(count)[:-1]  # the accelerator ends the stream one word early
    with pytest.raises(AcceleratorError, match="DMA receive of 8 words: the stream ended .* after 7 words"):
        drv.read("rng", 0)


def test_ctrl_c_during_a_wait_does_not_free_the_buffer(board):
    drv, pynq, dma, acc = board
    ch = dma.recvchannel
    ch.hang = True
    ch.interrupt_after = ch.idle_reads + 3
    with pytest.raises(KeyboardInterrupt):
        drv.read("w", 0)
    assert pynq.freed == [] and len(pynq.allocated) == 2  # the DMA may still write into it
    assert ch.busy  # the transfer is still in flight
    # the next receive stops the interrupted transfer before it reuses the buffer
    acc.running = acc.pending = None
    ch.hang = False
    drv.abort()
    w = drv.read("w", 0)
    assert w.shape == drv.desc.quantity("w", 0).shape
    assert (DMACR["receive"], 0) in dma.mmio.writes
    assert pynq.freed == [] and len(pynq.allocated) == 2
    # close() too only frees a buffer no transfer uses
    ch.hang = True
    ch.interrupt_after = ch.idle_reads + 2
    with pytest.raises(KeyboardInterrupt):
        drv.read("w", 0)
    drv.transport.close()
    assert not ch.busy and sorted(pynq.freed) == [0, 1]



# --- the clock: the overlay's FCLK0, with accelerator.json's clock_mhz as the expectation -------------------


def _clocked(monkeypatch, fclk0_mhz, desc_mhz=100.0, **kw):
    pynq = FakePynq()
    pynq.Clocks.fclk0_mhz = fclk0_mhz
    monkeypatch.setitem(sys.modules, "pynq", pynq)
    desc = make_desc()
    desc.clock_mhz = desc_mhz
    acc = MockAccelerator(desc)
    overlay = SimpleNamespace(xnortrain_0=SimpleNamespace(mmio=FakeMMIO(acc)), axi_dma_0=FakeDma(acc))
    t = PynqTransport(overlay, timeout_s=0.1, stop_timeout_s=0.02, **kw)
    return desc, t


@pytest.mark.parametrize("fclk0", [100.0, 100.9, 99.2])
def test_the_clock_comes_from_the_overlay_and_a_rounding_difference_is_silent(monkeypatch, recwarn, fclk0):
    desc, t = _clocked(monkeypatch, fclk0)
    assert t.clock_mhz == fclk0 and t._period == pytest.approx(1e-6 / fclk0)
    drv = Driver(desc, t)
    assert not [w for w in recwarn if issubclass(w.category, ClockWarning)]
    assert drv.timeout_s == pytest.approx(max(60.0, 2 * drv.timeout_cycles / (fclk0 * 1e6)))


@pytest.mark.parametrize("fclk0", [50.0, 142.857143, 104.0])  # 140 MHz asked, the PLL gives 1000/7
def test_a_slower_or_slightly_faster_clock_is_a_warning_naming_both(monkeypatch, fclk0):
    desc, t = _clocked(monkeypatch, fclk0, desc_mhz=140.0 if fclk0 > 130 else 100.0)
    with pytest.warns(ClockWarning, match=rf"runs at {fclk0:g} MHz \(the overlay's FCLK0\), accelerator.json says "
                                          rf"clock_mhz = {desc.clock_mhz:g} MHz"):
        drv = Driver(desc, t)
    # the driver's wall-time budget follows the real clock: a slow board is not aborted early
    assert drv.timeout_s == pytest.approx(max(60.0, 2 * drv.timeout_cycles / (fclk0 * 1e6)))
    drv.upload(*batch())


def test_a_clock_faster_than_the_design_was_built_for_is_refused(monkeypatch):
    desc, t = _clocked(monkeypatch, 125.0)
    with pytest.raises(HardwareMismatch, match=r"runs at 125 MHz .*clock_mhz = 100 MHz: the design met timing at "
                                               r"100 MHz only"):
        Driver(desc, t)
    assert t._buffers == {}  # refused before anything was allocated


def test_an_explicit_clock_overrides_the_overlay_and_an_unreadable_one_is_named(monkeypatch):
    desc, t = _clocked(monkeypatch, 50.0, clock_mhz=100.0)
    assert t.clock_mhz == 100.0
    Driver(desc, t)

    class NoClocks:
        @property
        def fclk0_mhz(self):
            raise RuntimeError("Architecture not supported for Clocks")

    pynq = FakePynq()
    pynq.Clocks = NoClocks()
    monkeypatch.setitem(sys.modules, "pynq", pynq)
    acc = MockAccelerator(desc)
    overlay = SimpleNamespace(xnortrain_0=SimpleNamespace(mmio=FakeMMIO(acc)), axi_dma_0=FakeDma(acc))
    with pytest.raises(HardwareMismatch, match=r"cannot read the overlay's clock \(pynq.Clocks.fclk0_mhz: "
                                               r"Architecture not supported"):
        PynqTransport(overlay)
    with pytest.raises(ValueError, match=r"clock_mhz must be a positive number of MHz, not 0"):
        PynqTransport(overlay, clock_mhz=0)


def test_open_board_takes_the_clock_from_the_overlay_not_from_accelerator_json(monkeypatch, tmp_path):
    from host.board import open_board

    desc = make_desc()
    desc.clock_mhz = 100.0
    desc.write_json(tmp_path / "accelerator.json")
    (tmp_path / "vivado").mkdir()
    bit = tmp_path / "vivado" / "xnortrain.bit"
    bit.write_bytes(b"")
    bit.with_suffix(".hwh").write_text("")
    acc = MockAccelerator(desc)
    pynq = FakePynq()
    pynq.Clocks.fclk0_mhz = 90.0
    pynq.Overlay = lambda path: SimpleNamespace(xnortrain_0=SimpleNamespace(mmio=FakeMMIO(acc)),
                                                axi_dma_0=FakeDma(acc))
    monkeypatch.setitem(sys.modules, "pynq", pynq)
    with pytest.warns(ClockWarning, match=r"runs at 90 MHz .*clock_mhz = 100 MHz"):
        with open_board(None, str(bit), log=lambda *a: None) as drv:
            assert drv.transport.clock_mhz == 90.0
            assert drv.transport._period == pytest.approx(1e-6 / 90.0)
