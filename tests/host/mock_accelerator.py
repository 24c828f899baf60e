"""A small accelerator description and a Python mock of its command behaviour behind a register-file
model, shared by the host tests (tests/host/test_driver.py, tests/host/test_pynq_transport.py) and the pynq tier
(tests/pynq: the same mock behind pynq's own MMIO and DMA classes). :class:`ModelAccelerator` puts the
bit-exact model (:class:`sim.hw.model.HwModel`) behind the same command behaviour, for a generated
description (``SystemPlan(cfg).description()``): a training step trains the model on the uploaded batch, a
read-back returns the model's state as the hardware's memories would stream it, a restore writes into it."""

import asyncio

import numpy as np

from host.transports.base import AsyncTransport, BlockingTransport
from rtl_gen.contract import AcceleratorDescription, QuantityLayout, description_hash
from rtl_gen.controller import build_regmap
from rtl_gen.regmap import RegisterFile

# --- a small accelerator description and a mock of its command behaviour ----------------------------------

B, F, C = 4, 20, 3


def make_desc(*, hidden: int = 8) -> AcceleratorDescription:
    """The mock description (``hidden``: the hidden layer's width, 8; its ``id_hash`` register holds the hash of
    this description, as the generator's does)."""
    desc = _make_desc(hidden, 0)
    return _make_desc(hidden, description_hash(desc))


def _make_desc(H: int, desc_hash: int) -> AcceleratorDescription:
    kinds = {"w": 0, "acc": 1, "beta": 2, "rng": 3, "logits": 4, "classes": 5}
    regmap = build_regmap(name="mock", layers=2, batch=B, classes=C, input_int8=False, optimizer="switch",
                          quantity_kinds=len(kinds), desc_hash=desc_hash)

    def flat(name, layer, shape, bits, per, signed=False, access="rw", encoding="int"):
        n = int(np.prod(shape))
        padn = -(-n // per) * per
        return QuantityLayout(name, layer, kinds[name], shape, bits, per, pad=(padn,) if len(shape) == 1 else shape,
                              reshape=(padn,) if len(shape) == 1 else (n,), transpose=(0,), signed=signed,
                              encoding=encoding, access=access)

    quantities = [
        QuantityLayout("w", 0, 0, (F, H), 1, 8, pad=(24, H), reshape=(3, 8, H), transpose=(2, 0, 1), encoding="sign"),
        flat("acc", 0, (F, H), 7, 4, signed=True),
        flat("beta", 0, (H,), 24, 1, signed=True),
        flat("rng", 0, (H,), 32, 1),
        QuantityLayout("w", 1, 0, (H, C), 1, 8, pad=(H, C), reshape=(H, C), transpose=(1, 0), encoding="sign"),
        flat("acc", 1, (H, C), 7, 4, signed=True),
        flat("beta", 1, (C,), 24, 1, signed=True),
        flat("rng", 1, (C,), 32, 1),
        flat("logits", 1, (B, C), 16, 2, signed=True, access="ro"),
        flat("classes", None, (B,), 2, 1, access="ro"),
    ]
    return AcceleratorDescription(
        name="mock", regmap=regmap, batch=B, classes=C, input="binary", features=F, layers=[(F, H), (H, C)],
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
        self.loaded = None  # samples of the uploaded batch
        self.uploaded = None  # their +-1 values

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
            if not 1 <= arg["batch"] <= self.desc.batch:
                return self._error("batch")
            self.pending = ("upload", arg["batch"])
        elif name == "train":
            if self.loaded != self.desc.batch:
                return self._error("no_batch" if self.loaded is None else "batch")
            self.loaded = None
            self.running, self.polls = "train", 0
        elif name == "infer":
            if self.loaded is None:
                return self._error("no_batch")
            # the mock's classifier: the number of +1 inputs of the sample modulo the classes (rows past the
            # uploaded samples keep what the memory held)
            q = self.desc.quantity("classes")
            classes = q.decode(self.memory.get((q.kind, 0), np.zeros(q.beats, np.uint32))).astype(np.int64)
            classes[: len(self.uploaded)] = (self.uploaded > 0).sum(axis=1) % self.desc.classes
            self.memory[(q.kind, 0)] = q.encode(classes)
            self.loaded = None
            self.running, self.polls = "infer", 0
        else:
            if arg["layer"] >= len(self.desc.layers):
                return self._error("layer")
            self.pending = (name, (arg["quantity"], arg["layer"]))

    def _finish(self):
        if self.running == "infer":
            self.regs.set_input("cycles", "value", 321)
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
        if name == "upload":  # the samples (key: their count), then the labels
            d = self.desc
            per = len(d.batch_layout.encode(np.ones((d.batch, d.features), np.int8))) // d.batch
            x_words = np.zeros(per * d.batch, np.uint32)
            x_words[: per * key] = words[: per * key]
            self.uploaded = d.batch_layout.decode(x_words)[:key]
            self.loaded = key
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


def random_state(desc, seed=0):
    """A restorable state for ``desc``: random +-1 weights, values over each field's range, nonzero generators."""
    rng = np.random.default_rng(seed)
    state = {"steps": np.array(7)}
    for q in desc.quantities:
        if q.access != "rw" or q.name == "rng":
            continue
        if q.encoding == "sign":
            state[q.key] = np.where(rng.random(q.shape) < 0.5, -1, 1).astype(np.int8)
        else:
            state[q.key] = rng.integers(-(1 << (q.elem_bits - 1)), 1 << (q.elem_bits - 1), q.shape)
    n = sum(q.shape[0] for q in desc.quantities if q.name == "rng")
    state["rng"] = rng.integers(1, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    return state


class ModelAccelerator(MockAccelerator):
    """:class:`MockAccelerator`'s command behaviour with the bit-exact model holding the state: ``upload``
    decodes the batch from its beats, ``train`` runs :meth:`HwModel.train_step` on it (with ``lr`` and
    ``progress`` set by the test before the step; the ``sched`` register the driver wrote must agree with
    them), ``readback`` encodes a model quantity with the description's layout, ``restore`` decodes one into
    the model. ``log`` and the error/timeout behaviour are the base class's."""

    def __init__(self, desc, cfg, **kw):
        from sim.hw.model import HwModel

        super().__init__(desc, **kw)
        self.model = HwModel(cfg)
        self.lr, self.progress = float(cfg.lr), 0.0
        self.x = self.labels = None
        self.trace = None
        self.switch_tables = {}  # layer -> the last table the driver restored

    def _rng_slices(self):
        at, out = 0, {}
        for q in self.desc.quantities:
            if q.name == "rng":
                n = int(np.prod(q.shape))
                out[q.layer] = slice(at, at + n)
                at += n
        return out

    def _get(self, q):
        m = self.model
        if q.name == "logits":
            return self.trace.logits_q if self.trace is not None else np.zeros(q.shape, np.int64)
        if q.name == "phase_cycles":
            return np.zeros(q.shape, np.int64)
        if q.name == "rng":
            return m.rng.get_state()[self._rng_slices()[q.layer]]
        if q.name in m.opt:
            return m.opt[q.name][q.layer]
        return np.asarray(getattr(m, q.name)[q.layer])

    def _set(self, q, a):
        m = self.model
        if q.name == "switch_table":
            self.switch_tables[q.layer] = a
        elif q.name == "rng":
            state = m.rng.get_state()
            state[self._rng_slices()[q.layer]] = a.astype(np.uint32)
            m.rng.set_state(state)
        elif q.name in m.opt:
            m.opt[q.name][q.layer] = a.astype(m.opt[q.name][q.layer].dtype)
        elif q.name == "e_beta":
            m.e_beta[q.layer] = int(a)
        else:
            getattr(m, q.name)[q.layer] = a.astype(getattr(m, q.name)[q.layer].dtype)

    def _quantity(self, key):
        kind, layer = key
        for q in self.desc.quantities:
            if q.kind == kind and (q.layer or 0) == layer:
                return q
        raise AssertionError(f"no quantity of kind {kind} for layer {layer}")

    def _finish(self):
        if self.running == "train":
            from sim.hw import optim as O

            sched = {f: self.regs.output("sched", f) for f in ("lr_shift", "switch_gate")}
            want = {"lr_shift": min(O.lr_shift(self.lr), 63), "switch_gate": O.switch_gate(self.lr / self.model.lr0,
                                                                                 self.model.h.switch_rate)}
            assert sched == want, f"sched register {sched} does not match lr {self.lr}: {want}"
            self.trace = self.model.train_step(self.x, self.labels, lr=self.lr, progress=self.progress)
            self.regs.set_input("cycles", "value", 1000 + self.model.steps)
            self.regs.set_input("steps", "value", self.model.steps)
            self.regs.set_input("correct", "value", int(self.trace.correct))
            self.regs.set_input("undone", "value", int(self.trace.undone))
            self.regs.set_input("loss", "value", int(self.trace.loss_q) & 0xFFFFFFFF)
            self.regs.set_status("done", "train", 1)
            self.running = None
            return
        super()._finish()

    def send(self, words):
        self.log.append(("send", len(words)))
        name, key = self.pending
        self.pending = None
        words = np.asarray(words, dtype=np.uint32)
        if name == "upload":  # whole batches only here (partial uploads: MockAccelerator)
            bl, ll = self.desc.batch_layout, self.desc.label_layout
            assert key == self.desc.batch and len(words) == bl.beats + ll.beats, f"upload of {len(words)} words"
            self.x = bl.decode(words[: bl.beats])
            self.labels = ll.decode(words[bl.beats :])
            self.uploaded, self.loaded = self.x, key
        elif name == "restore":
            q = self._quantity(key)
            self._set(q, q.decode(words))
        self.running, self.polls = name, 0

    def receive(self, count):
        self.log.append(("receive", count))
        name, key = self.pending
        assert name == "readback"
        self.pending = None
        self.running, self.polls = name, 0
        q = self._quantity(key)
        return q.encode(np.asarray(self._get(q)).astype(np.int64))[:count]
