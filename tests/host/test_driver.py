"""host.driver against a mock bus: packing, layouts, the description file, and the exact register and
stream transactions of every driver operation (blocking and async transports run the same programs)."""

import asyncio
import sys

import numpy as np
import pytest

from host.driver import (
    AcceleratorDescription,
    AcceleratorError,
    AcceleratorTimeout,
    AsyncTransport,
    BlockingTransport,
    Driver,
    PynqTransport,
    QuantityLayout,
    Read,
    Send,
    pack_words,
    unpack_words,
)
from rtl_gen.controller import build_regmap
from rtl_gen.regmap import RegisterFile

# --- packing --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bits, per, signed", [(1, 32, False), (1, 8, False), (7, 4, True), (8, 4, True),
                                               (24, 1, True), (32, 1, False), (11, 5, True), (1, 64, False)])
def test_pack_unpack_roundtrip(bits, per, signed):
    rng = np.random.default_rng(bits * 100 + per)
    lo, hi = (-(1 << (bits - 1)), 1 << (bits - 1)) if signed else (0, 1 << bits)
    v = rng.integers(lo, hi, per * 6, dtype=np.int64)
    words = pack_words(v, elem_bits=bits, elems_per_word=per)
    assert words.dtype == np.uint32 and len(words) == 6 * -(-bits * per // 32)
    assert (unpack_words(words, elem_bits=bits, elems_per_word=per, signed=signed) == v).all()


def test_packing_bit_positions():
    # element e at bits e * elem_bits, words LSB beat first
    w = pack_words(np.array([1, 2, 3]), elem_bits=12, elems_per_word=3)
    assert w.tolist() == [1 | 2 << 12 | (3 & 0xFF) << 24, 3 >> 8]
    assert pack_words(np.array([-1, 0]), elem_bits=4, elems_per_word=2).tolist() == [0xF]


def test_quantity_layout_order_and_padding():
    # a (5, 3) array, padded to (8, 4), stored as (group, word, lane, bit) with 4 bits per word, 2 lanes
    q = QuantityLayout("w", 0, 0, (5, 3), elem_bits=1, elems_per_word=4, pad=(8, 4), reshape=(2, 4, 2, 2),
                       transpose=(2, 0, 3, 1), encoding="sign")
    w = np.where(np.random.default_rng(0).random((5, 3)) < 0.5, -1, 1).astype(np.int8)
    words = q.encode(w)
    assert len(words) == q.beats == 8
    assert (q.decode(words) == w).all() and q.decode(words).dtype == np.int8
    # stream element 0..3 = padded[(k=0, b=0..3), (g=0, l=0)] = column 0, rows 0..3
    col0 = [(int(v) > 0) for v in w[:4, 0]]
    assert words[0] == sum(int(b) << i for i, b in enumerate(col0))
    with pytest.raises(ValueError, match="shape"):
        q.encode(w.T)
    with pytest.raises(ValueError, match="pad"):
        QuantityLayout("x", 0, 0, (5,), 1, 1, pad=(4,), reshape=(4,), transpose=(0,))


def test_quantity_layout_range_check():
    q = QuantityLayout("acc", 0, 1, (4,), elem_bits=7, elems_per_word=4, pad=(4,), reshape=(4,), transpose=(0,),
                       signed=True)
    q.encode(np.array([-64, 63, 0, 1]))
    with pytest.raises(ValueError, match="do not fit 7 bits"):
        q.encode(np.array([64, 0, 0, 0]))


# --- a small accelerator description and a mock of its command behaviour ----------------------------------

B, F, C = 4, 20, 3


def make_desc() -> AcceleratorDescription:
    kinds = {"w": 0, "acc": 1, "beta": 2, "rng": 3, "logits": 4}
    regmap = build_regmap(name="mock", layers=2, batch=B, classes=C, input_int8=False, optimizer="switch",
                          quantity_kinds=len(kinds))

    def flat(name, layer, shape, bits, per, signed=False, access="rw", encoding="int"):
        n = int(np.prod(shape))
        padn = -(-n // per) * per
        return QuantityLayout(name, layer, kinds[name], shape, bits, per, pad=(padn,) if len(shape) == 1 else shape,
                              reshape=(padn,) if len(shape) == 1 else (n,), transpose=(0,), signed=signed,
                              encoding=encoding, access=access)

    quantities = [
        QuantityLayout("w", 0, 0, (F, 8), 1, 8, pad=(24, 8), reshape=(3, 8, 8), transpose=(2, 0, 1), encoding="sign"),
        flat("acc", 0, (F, 8), 7, 4, signed=True),
        flat("beta", 0, (8,), 24, 1, signed=True),
        flat("rng", 0, (8,), 32, 1),
        QuantityLayout("w", 1, 0, (8, C), 1, 8, pad=(8, C), reshape=(8, C), transpose=(1, 0), encoding="sign"),
        flat("acc", 1, (8, C), 7, 4, signed=True),
        flat("beta", 1, (C,), 24, 1, signed=True),
        flat("rng", 1, (C,), 32, 1),
        flat("logits", 1, (B, C), 16, 2, signed=True, access="ro"),
    ]
    return AcceleratorDescription(
        name="mock", regmap=regmap, batch=B, classes=C, input="binary", features=F, layers=[(F, 8), (8, C)],
        batch_layout=QuantityLayout("x", None, 0, (B, F), 1, 32, pad=(B, 32), reshape=(B, 32), transpose=(0, 1),
                                    encoding="sign"),
        label_layout=QuantityLayout("labels", None, 0, (B,), 8, 4, pad=(B,), reshape=(B,), transpose=(0,)),
        quantities=quantities, kinds=kinds,
        schedule={"optimizer": "switch", "switch_lambda": 0.5, "switch_cutoff": 63, "switch_sigma": 0.5, "lr0": 1e-3,
                  "arith": {"loss": "cross_entropy"}},
    )


class MockAccelerator:
    """The command semantics of rtl_gen.controller, in Python, behind a register-file model. Every bus
    operation is logged as a tuple for exact checks."""

    def __init__(self, desc, *, train_polls=2, hang=False):
        self.desc = desc
        self.regs = RegisterFile(desc.regmap)
        self.log = []
        self.memory = {}  # (kind, layer) -> words
        self.pending = None  # what the stream input / output does next
        self.running = None  # command name, done after ``train_polls`` polls of done
        self.polls = 0
        self.train_polls = train_polls
        self.hang = hang
        self.steps = 0

    # register side
    def read(self, addr):
        reg = self.desc.regmap.at(addr).name
        if reg == "done" and self.running and not self.hang:
            self.polls += 1
            if self.polls >= self.train_polls:
                self._finish()
        word, ok = self.regs.read(addr)
        assert ok
        self.log.append(("read", reg, word))
        return word

    def write(self, addr, value):
        reg = self.desc.regmap.at(addr).name
        self.log.append(("write", reg, value))
        assert self.regs.write(addr, value)
        for r, f, _ in self.regs.pulses:
            assert r == "cmd"
            self._command(f)
        self.regs.pulses.clear()

    def _error(self, flag):
        self.regs.set_status("error", flag, 1)

    def _command(self, name):
        arg = {f: self.regs.output("arg", f) for f in ("batch", "layer", "quantity")}
        if name == "abort":
            self.running = self.pending = None
            return
        if self.running or self.pending:
            return self._error("busy")
        if name == "upload":
            if arg["batch"] != self.desc.batch:
                return self._error("batch")
            self.pending = ("upload", None)
        elif name == "train":
            self.running, self.polls = "train", 0
        else:
            if arg["layer"] >= len(self.desc.layers):
                return self._error("layer")
            self.pending = (name, (arg["quantity"], arg["layer"]))

    def _finish(self):
        if self.running == "train":
            self.steps += 1
            self.regs.set_input("cycles", "value", 1234)
            self.regs.set_input("steps", "value", self.steps)
            self.regs.set_input("correct", "value", 2)
        self.regs.set_status("done", self.running, 1)
        self.running = None

    # stream side
    def send(self, words):
        self.log.append(("send", len(words)))
        name, key = self.pending
        self.pending = None
        if name == "restore":
            self.memory[key] = np.array(words, dtype=np.uint32)
        self.running, self.polls = name, 0

    def receive(self, count):
        self.log.append(("receive", count))
        name, key = self.pending
        assert name == "readback"
        self.pending = None
        self.running, self.polls = name, 0
        return self.memory.get(key, np.zeros(count, np.uint32))[:count]


class MockTransport(BlockingTransport):
    def __init__(self, acc):
        self.acc = acc
        self.sleeps = []

    def read(self, addr):
        return self.acc.read(addr)

    def write(self, addr, value):
        self.acc.write(addr, value)

    def send(self, words):
        self.acc.send(words)

    def receive(self, count):
        return self.acc.receive(count)

    def sleep(self, cycles):
        self.sleeps.append(cycles)


class AsyncMockTransport(AsyncTransport):
    def __init__(self, acc):
        self.acc = acc

    async def read(self, addr):
        return self.acc.read(addr)

    async def write(self, addr, value):
        self.acc.write(addr, value)

    async def send(self, words):
        self.acc.send(words)

    async def receive(self, count):
        return self.acc.receive(count)

    async def sleep(self, cycles):
        await asyncio.sleep(0)


def batch(seed=0):
    rng = np.random.default_rng(seed)
    return np.where(rng.random((B, F)) < 0.5, -1, 1).astype(np.int8), rng.integers(0, C, B)


# --- tests ----------------------------------------------------------------------------------------------


def test_description_json_roundtrip(tmp_path):
    d = make_desc()
    path = d.write_json(tmp_path / "accelerator.json")
    e = AcceleratorDescription.from_json(path)
    assert e.to_dict() == d.to_dict()
    assert e.regmap == d.regmap
    with pytest.raises(ValueError, match="not an accelerator description"):
        AcceleratorDescription.from_dict({"format": "other"})


def test_batch_words_layout_and_checks():
    drv = Driver(make_desc(), MockTransport(MockAccelerator(make_desc())))
    x, y = batch()
    words = drv.batch_words(x, y)
    assert len(words) == B + 1  # one 32-bit word per 20-bit row, 4 labels in one word
    assert words[0] == sum(1 << i for i in range(F) if x[0, i] > 0)
    assert words[-1] == sum(int(v) << (8 * i) for i, v in enumerate(y))
    with pytest.raises(ValueError, match="labels must be in 0..2"):
        drv.batch_words(x, np.array([0, 1, 2, 3]))
    with pytest.raises(ValueError, match="expected x of shape"):
        drv.batch_words(x[:3], y)


def test_train_step_transactions_are_exact():
    desc = make_desc()
    acc = MockAccelerator(desc)
    drv = Driver(desc, MockTransport(acc))
    x, y = batch()
    logits = np.array([[256, -10, 5], [0, 300, -2], [1, 2, 3], [-5, -6, 100]])
    acc.memory[(desc.kinds["logits"], 1)] = desc.quantity("logits", 1).encode(logits)
    r = drv.train_step(x, y, lr=1e-3)
    m = desc.regmap
    cmd = lambda name: m.encode("cmd", **{name: 1})  # noqa: E731
    expected_start = [
        ("write", "sched", m.encode("sched", lr_shift=10, opt_shift=0)),
        ("write", "arg", m.encode("arg", batch=B)),
        ("write", "done", m["done"].field("upload").mask),
        ("write", "cmd", cmd("upload")),
        ("read", "error", 0),
        ("send", B + 1),
    ]
    assert acc.log[: len(expected_start)] == expected_start
    kinds = [e[:2] for e in acc.log]
    assert ("write", "cmd") in kinds and acc.log.count(("write", "cmd", cmd("train"))) == 1
    assert ("receive", desc.quantity("logits", 1).beats) in acc.log
    assert r.cycles == 1234 and r.correct == 2
    assert (r.logits == logits).all()
    from sim.hw.arith import ArithParams, loss_grad

    assert r.loss == loss_grad(logits, y, ArithParams())[1]
    # the schedule is written again only when it changes
    n_sched = sum(1 for e in acc.log if e[1] == "sched")
    drv.train_step(x, y, lr=1e-3)
    assert sum(1 for e in acc.log if e[1] == "sched") == n_sched
    drv.train_step(x, y, lr=2.5e-4)
    assert sum(1 for e in acc.log if e[1] == "sched") == n_sched + 1


def test_refused_command_raises_with_flags_and_clears_them():
    desc = make_desc()
    acc = MockAccelerator(desc)
    drv = Driver(desc, MockTransport(acc))
    acc.running = "train"  # the accelerator is busy
    with pytest.raises(AcceleratorError, match="busy") as info:
        drv.read("beta", 0)
    assert info.value.flags == ("busy",)
    assert acc.regs.values["error", "busy"] == 0  # cleared by the driver
    acc.running = None
    with pytest.raises(AcceleratorError, match="layer"):
        drv.transport.execute(drv._command("readback", layer=5, quantity=0))


def test_timeout_aborts():
    desc = make_desc()
    acc = MockAccelerator(desc, hang=True)
    t = MockTransport(acc)
    drv = Driver(desc, t, poll_cycles=10, timeout_cycles=1000)
    x, y = batch()
    with pytest.raises(AcceleratorTimeout, match="upload not done after"):
        drv.upload(x, y)
    assert ("write", "cmd", desc.regmap.encode("cmd", abort=1)) in acc.log
    assert t.sleeps[:4] == [10, 20, 40, 80] and max(t.sleeps) == 640


def test_state_dict_roundtrip_through_restore_and_readback():
    desc = make_desc()
    acc = MockAccelerator(desc)
    drv = Driver(desc, MockTransport(acc))
    rng = np.random.default_rng(3)
    state = {"steps": np.array(7)}
    for q in desc.quantities:
        if q.access != "rw":
            continue
        if q.encoding == "sign":
            state[q.key] = np.where(rng.random(q.shape) < 0.5, -1, 1).astype(np.int8)
        elif q.name == "rng":
            continue
        else:
            state[q.key] = rng.integers(-(1 << (q.elem_bits - 1)), 1 << (q.elem_bits - 1), q.shape)
    state["rng"] = rng.integers(1, 1 << 32, 8 + C, dtype=np.uint64).astype(np.uint32)
    drv.load_state_dict(state)
    back = drv.state_dict()
    assert set(back) == set(state)
    for k in state:
        assert (np.asarray(back[k]) == np.asarray(state[k])).all(), k
    with pytest.raises(ValueError, match="read-only"):
        drv.write("logits", 1, np.zeros((B, C)))


def test_async_transport_runs_the_same_program():
    desc = make_desc()
    acc_a, acc_b = MockAccelerator(desc), MockAccelerator(desc)
    x, y = batch(1)
    Driver(desc, MockTransport(acc_a)).upload(x, y)
    asyncio.run(Driver(desc, AsyncMockTransport(acc_b)).upload(x, y))
    assert acc_a.log == acc_b.log


def test_programs_yield_plain_operations():
    drv = Driver(make_desc(), MockTransport(MockAccelerator(make_desc())))
    prog = drv._read_fields("id")
    op = next(prog)
    assert op == Read(drv.map.addr("id"))
    with pytest.raises(StopIteration) as stop:
        prog.send(drv.map["id"].reset_word)
    assert stop.value.value == {"magic": 0x584E, "version": 1}
    up = drv._upload(*batch())
    ops = [next(up)]
    while not isinstance(ops[-1], Send):
        ops.append(up.send(0))
    assert len(ops[-1].words) == B + 1


def test_pynq_is_never_imported():
    assert "pynq" not in sys.modules
    with pytest.raises(ImportError):
        PynqTransport(object())
