"""host.driver.Driver + PynqTransport through pynq's own classes: ``pynq.DefaultIP``/``pynq.MMIO`` for the
accelerator's registers, ``pynq.lib.dma.DMA`` (its ``_SDMAChannel``) for the streams and ``pynq.allocate``
buffers (``PynqBuffer``, not coherent), on a mock device (tests/pynq_tier/mock_board.py) with the bit-exact model
behind the registers and streams (tests/host/mock_accelerator.py ``ModelAccelerator``)."""

import time

import numpy as np
import pynq
import pytest
from mock_accelerator import ModelAccelerator
from mock_board import CHANNEL_BASE, MockOverlay, MockZynq

from host.driver import Driver
from host.errors import AcceleratorError, ClockWarning, HardwareMismatch, TransferTimeout
from host.transports.pynq import PynqTransport
from rtl_gen.contract import description_hash

pytestmark = pytest.mark.pynq

LAYERS = '[{type="dense",units=12},{type="dense",units=10}]'


def small(batch=4, layers=LAYERS):
    from rtl_gen.top import SystemPlan
    from sim.config import apply_overrides, load_config

    cfg = apply_overrides(load_config("mlp"), [
        "model.input_format=binary", f"train.batch_size={batch}", "hw.lanes_in=32", "hw.lanes_out=8",
        "hw.lanes_b=2", "hw.update_lanes=8", f"model.layers={layers}"])
    return cfg, SystemPlan(cfg).description()


def batch(desc, seed):
    rng = np.random.default_rng(seed)
    x = np.where(rng.random((desc.batch, desc.features)) < 0.5, -1, 1).astype(np.int8)
    return x, rng.integers(0, desc.classes, desc.batch)


@pytest.fixture(scope="module")
def small_design():
    return small()


class Board:
    def __init__(self, cfg, desc, monkeypatch, *, length_width=26, acc_desc=None):
        self.cfg, self.desc = cfg, desc
        self.acc = ModelAccelerator(acc_desc or desc, cfg)
        self.dev = MockZynq(self.acc)
        # pynq's default device is another one: buffers must come from the DMA's own device
        self.decoy = MockZynq(ModelAccelerator(acc_desc or desc, cfg), "decoy", dram_base=0x3000_0000)
        monkeypatch.setattr(pynq.Device, "_active_device", self.decoy, raising=False)
        # pynq.Clocks reads the PS clock registers of its device (the board's; its instance is made afresh)
        monkeypatch.delattr(pynq.Clocks, "_real_instance", raising=False)
        if hasattr(pynq.Clocks, "device"):  # pynq 4.0.0
            monkeypatch.setattr(pynq.Clocks, "device", self.dev)
        else:  # pynq 3.0.1: a Zynq-7000's clocks (chosen by the CPU's architecture) on the active device at first use
            monkeypatch.setattr(pynq.ps, "CPU_ARCH", pynq.ps.ZYNQ_ARCH)
            monkeypatch.setattr(pynq.Device, "_active_device", self.dev, raising=False)
            monkeypatch.setattr(pynq.Clocks, "_real_instance", pynq.ps._ClocksZynq(), raising=False)
            monkeypatch.setattr(pynq.Device, "_active_device", self.decoy, raising=False)
        self.overlay = MockOverlay(self.dev, length_width=length_width)
        assert isinstance(self.overlay.xnortrain_0.mmio, pynq.MMIO)

    def transport(self, **kw):
        return PynqTransport(self.overlay, timeout_s=kw.pop("timeout_s", 0.2), stop_timeout_s=0.05, **kw)

    def driver(self, **kw):
        return Driver(self.desc, self.transport(**kw))


@pytest.fixture
def board(small_design, monkeypatch):
    return Board(*small_design, monkeypatch)


def assert_states_equal(got, want):
    assert sorted(got) == sorted(want)
    for k in want:
        assert np.array_equal(np.asarray(got[k]).astype(np.int64), np.asarray(want[k]).astype(np.int64)), k


def test_training_steps_and_readback_match_the_bit_exact_model(board):
    from sim.hw.model import HwModel

    drv, acc, dev = board.driver(), board.acc, board.dev
    ref = HwModel(board.cfg)
    assert_states_equal(drv.state_dict(), ref.state_dict())  # power-on state, read back through the DMA
    lr0 = float(board.cfg.lr)
    for step, lr in enumerate([lr0, lr0 / 2]):
        x, y = batch(board.desc, step)
        acc.lr, acc.progress = lr, step / 2
        res = drv.train_step(x, y, lr=lr, progress=step / 2, lr0=lr0)
        tr = ref.train_step(x, y, lr=lr, progress=step / 2)
        assert np.array_equal(res.logits, tr.logits_q)
        assert (res.correct, res.loss, res.loss_q, res.undone) == (tr.correct, tr.loss, tr.loss_q, tr.undone)
    assert_states_equal(drv.state_dict(), ref.state_dict())
    # two buffers, allocated once on the DMA's device, at the addresses the DMA was given
    assert len(dev.allocations) == 2
    assert board.decoy.allocations == []
    addrs = {bo: addr for bo, _, addr in dev.allocations}
    for d, ch in dev.dma.channels.items():
        assert ch.transfers and {a for a, _ in ch.transfers} <= set(addrs.values()), d
    # cache maintenance covers exactly each transfer: flush before every send, invalidate after every receive
    sends = [n for a, n in dev.dma.channels["send"].transfers]
    receives = [n for a, n in dev.dma.channels["receive"].transfers]
    assert [n for _, off, n in dev.flushes] == sends and all(off == 0 for _, off, _ in dev.flushes)
    assert [n for _, off, n in dev.invalidates] == receives


def test_readback_sees_what_the_accelerator_wrote_after_the_previous_readback(board):
    drv, acc = board.driver(), board.acc
    w = drv.read("w", 1)
    acc.model.w[1] = -acc.model.w[1]  # the hardware changes the weights behind the host's cached copy
    assert np.array_equal(drv.read("w", 1), -w)
    acc.model.beta[0][:] = np.arange(len(acc.model.beta[0])) - 5
    assert np.array_equal(drv.read("beta", 0), np.arange(len(acc.model.beta[0])) - 5)


def test_restore_then_train_continues_as_the_model_does(board):
    from sim.hw.model import HwModel

    drv, acc = board.driver(), board.acc
    other = HwModel(board.cfg)
    for step in range(2):  # a state the accelerator has never had: two steps on other data
        other.train_step(*batch(board.desc, 10 + step), lr=float(board.cfg.lr))
    state = other.state_dict()
    drv.load_state_dict(state)
    assert_states_equal(acc.model.state_dict() | {"steps": state["steps"]}, state)
    assert_states_equal(drv.state_dict(), state)
    x, y = batch(board.desc, 20)
    res = drv.train_step(x, y, lr=float(board.cfg.lr))
    tr = other.train_step(x, y, lr=float(board.cfg.lr))
    assert np.array_equal(res.logits, tr.logits_q)
    assert_states_equal(drv.state_dict(), other.state_dict())


def test_a_dma_too_narrow_for_the_description_is_refused_at_connect(small_design, monkeypatch):
    cfg, desc = small_design
    acc0 = desc.quantity("acc", 0)
    assert 4 * acc0.beats == 9408  # the largest transfer of this design, 8 KiB < 9408 B < 16 KiB
    b = Board(cfg, desc, monkeypatch, length_width=13)
    with pytest.raises(HardwareMismatch, match=r"at most 8191 bytes per transfer \(c_sg_length_width = 13\), but "
                       r".*restore acc0 is 9408 bytes: rebuild the bitstream with a buffer length width of at least "
                       r"14 bits"):
        b.driver()
    b = Board(cfg, desc, monkeypatch, length_width=14)
    assert b.driver().read("acc", 0).shape == acc0.shape  # 14 bits carry it


def test_a_transfer_over_the_dma_limit_is_refused_before_the_dma_starts(board):
    t = board.transport()
    Driver(board.desc, t)
    before = list(board.dev.dma.channels["send"].transfers)
    words = (1 << 26) // 4  # one word over pynq's default 2**26 - 1 bytes
    with pytest.raises(AcceleratorError, match=rf"DMA send of {words} words \({4 * words} bytes\) exceeds the "
                       r"overlay's DMA limit of 67108863 bytes per transfer \(c_sg_length_width = 26\)"):
        t.send(np.zeros(words, np.uint32))
    assert board.dev.dma.channels["send"].transfers == before


@pytest.mark.parametrize("direction", ["send", "receive"])
def test_a_stuck_dma_raises_transfer_timeout_in_time_and_recovers(board, direction):
    drv, dma = board.driver(timeout_s=0.2), board.dev.dma
    ch = dma.channels[direction]
    ch.stuck = True
    t0 = time.monotonic()
    with pytest.raises(TransferTimeout) as info:
        if direction == "send":
            drv.write("beta", 1, np.arange(board.desc.classes))
        else:
            drv.read("beta", 1)
    assert time.monotonic() - t0 < 0.2 + 1.0
    what = "restore beta1" if direction == "send" else "readback beta1"
    assert str(info.value).startswith(what) and "command was aborted" in str(info.value)
    assert dma.resets == 1  # halting did not end the transfer: soft reset, then both channels restarted
    assert all(not c.halted for c in dma.channels.values())
    assert board.dev.read_registers(0x4040_0000 + CHANNEL_BASE[direction], 4) == b"\x01\x00\x00\x00"
    ch.stuck = False
    drv.write("beta", 1, np.arange(board.desc.classes))
    assert np.array_equal(drv.read("beta", 1), np.arange(board.desc.classes))


def test_a_dma_that_cannot_be_reset_leaves_the_transport_refusing_transfers(board):
    drv, dma = board.driver(), board.dev.dma
    dma.channels["receive"].stuck, dma.reset_works = True, False
    with pytest.raises(AcceleratorError, match="did not stop within .*buffers are kept: reload the overlay"):
        drv.read("w", 0)
    board.acc.running = board.acc.pending = None  # (the accelerator itself would wait for its stream)
    with pytest.raises(AcceleratorError, match="reload the overlay"):
        drv.read("w", 1)
    drv.transport.close()  # a DMA that may still write into the buffers: they are kept
    assert all(not buf.freed for buf in drv.transport._buffers.values()) and len(drv.transport._buffers) == 2


def test_a_dma_channel_that_does_not_restart_after_a_reset_raises_instead_of_hanging(board):
    drv, dma = board.driver(), board.dev.dma
    dma.channels["receive"].stuck = True
    dma.channels["send"].starts = False  # after the soft reset the other channel stays halted
    t0 = time.monotonic()
    with pytest.raises(AcceleratorError, match="send channel did not restart within 0.05 s .*reload the overlay"):
        drv.read("w", 0)
    assert time.monotonic() - t0 < 0.2 + 1.0 and dma.resets == 1


def test_a_dma_error_is_raised(board):
    drv = board.driver()
    board.dev.dma.channels["send"].fail = True
    with pytest.raises(AcceleratorError, match=r"DMA send of 104 words: the DMA reported an error"):
        drv.upload(*batch(board.desc, 0))


@pytest.mark.parametrize("other", [
    {"batch": 8}, {"layers": '[{type="dense",units=12},{type="dense",units=12},{type="dense",units=10}]'},
    {"layers": '[{type="dense",units=16},{type="dense",units=10}]'}])  # only the description hash differs
def test_a_description_of_another_accelerator_is_refused(small_design, monkeypatch, other):
    cfg, desc = small_design
    cfg2, desc2 = small(**other)
    b = Board(cfg2, desc2, monkeypatch, acc_desc=desc)  # the bitstream is desc's, the description desc2's
    with pytest.raises(HardwareMismatch, match="not the one accelerator.json describes") as info:
        b.driver()
    assert info.value.fields
    want = "info_batch.batch: accelerator.json 8, hardware 4" if "batch" in other else \
        "info.layers: accelerator.json 3, hardware 2" if "units=12},{" in other["layers"] else \
        f"description hash (id_hash): accelerator.json {description_hash(desc2):#010x}, hardware " \
        f"{description_hash(desc):#010x}"
    assert want in info.value.fields
    assert any(f.startswith("description hash") for f in info.value.fields)  # every other description differs


def test_the_clock_is_the_overlays_fclk0(board):
    t = board.transport()
    assert t.clock_mhz == pynq.Clocks.fclk0_mhz == 100.0  # read through pynq's Clocks from the PS registers
    board.dev.slcr.set_fclk0(8, 1)  # 125 MHz: faster than the 100 MHz the bitstream was built for
    t = board.transport()
    assert t.clock_mhz == 125.0
    with pytest.raises(HardwareMismatch, match=r"runs at 125 MHz \(the overlay's FCLK0\), accelerator.json says "
                                               r"clock_mhz = 100 MHz: the design met timing at 100 MHz only"):
        Driver(board.desc, t)
    board.dev.slcr.set_fclk0(20, 1)  # 50 MHz: slower, so only a warning, and the steps still run
    with pytest.warns(ClockWarning, match=r"runs at 50 MHz .*clock_mhz = 100 MHz"):
        drv = board.driver()
    assert drv.transport.clock_mhz == 50.0
    drv.upload(*batch(board.desc, 0))
