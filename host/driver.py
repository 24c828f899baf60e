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
    result = await drv.train_step(x, labels, lr=1e-3)       # in a cocotb test (AsyncTransport)

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

import json
import math
import time
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
    "Driver",
    "PynqTransport",
    "QuantityLayout",
    "Read",
    "Receive",
    "Send",
    "Sleep",
    "StepResult",
    "Transport",
    "Write",
    "pack_words",
    "unpack_words",
]

DESCRIPTION_FORMAT = "xnortrain-accelerator"
DESCRIPTION_VERSION = 1
BEAT_BITS = 32

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
    """Runs driver programs (generators of bus operations)."""

    def execute(self, program: Program):  # pragma: no cover - interface
        raise NotImplementedError


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
        result = None
        try:
            while True:
                op = program.send(result)
                result = self._do(op)
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
        result = None
        try:
            while True:
                op = program.send(result)
                if isinstance(op, Read):
                    result = int(await self.read(op.addr))
                elif isinstance(op, Write):
                    result = await self.write(op.addr, op.value)
                elif isinstance(op, Send):
                    result = await self.send(op.words)
                elif isinstance(op, Receive):
                    result = np.asarray(await self.receive(op.count), dtype=np.uint32)
                elif isinstance(op, Sleep):
                    result = await self.sleep(op.cycles)
                else:
                    raise TypeError(f"unknown bus operation {op!r}")
        except StopIteration as stop:
            return stop.value


class PynqTransport(BlockingTransport):
    """The board: the accelerator's AXI4-Lite slave through ``pynq.MMIO`` and its two AXI-Streams through
    one AXI DMA (MM2S -> ``s_axis``, S2MM <- ``m_axis``), with ``pynq.allocate`` buffers.

    ``overlay``: a loaded ``pynq.Overlay``; ``ip`` and ``dma`` name the accelerator and the DMA in its
    block design. ``pynq`` is imported here, never at module import (it exists only on the board).
    """

    def __init__(self, overlay, *, ip: str = "xnortrain_0", dma: str = "axi_dma_0", clock_mhz: float = 100.0):
        import pynq  # noqa: F401  (board only)

        self._pynq = pynq
        self._ip = getattr(overlay, ip)
        self._dma = getattr(overlay, dma)
        self._mmio = self._ip.mmio
        self._period = 1e-6 / clock_mhz

    def read(self, addr: int) -> int:
        return int(self._mmio.read(addr))

    def write(self, addr: int, value: int) -> None:
        self._mmio.write(addr, int(value) & 0xFFFFFFFF)

    def send(self, words: np.ndarray) -> None:
        buf = self._pynq.allocate(shape=(len(words),), dtype=np.uint32)
        try:
            buf[:] = words
            buf.flush()
            self._dma.sendchannel.transfer(buf)
            self._dma.sendchannel.wait()
        finally:
            buf.freebuffer()

    def receive(self, count: int) -> np.ndarray:
        buf = self._pynq.allocate(shape=(count,), dtype=np.uint32)
        try:
            self._dma.recvchannel.transfer(buf)
            self._dma.recvchannel.wait()
            buf.invalidate()
            return np.array(buf, dtype=np.uint32)
        finally:
            buf.freebuffer()

    def sleep(self, cycles: int) -> None:
        time.sleep(cycles * self._period)


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


# --- the driver -------------------------------------------------------------------------------------------


class AcceleratorError(RuntimeError):
    """The accelerator flagged an error (the names of the ``error`` register's bits are in ``.flags``)."""

    def __init__(self, message: str, flags: Sequence[str] = ()):
        super().__init__(message)
        self.flags = tuple(flags)


class AcceleratorTimeout(AcceleratorError):
    """A command did not finish within the driver's cycle budget (the driver aborted it)."""


#: Commands: ``cmd`` register pulse field -> ``done`` register flag that reports its completion.
COMMANDS = ("upload", "train", "readback", "restore", "abort")


@dataclass
class StepResult:
    """What one training step reports: ``loss`` (computed by the host from the read-back logits, as the
    bit-exact model does), ``correct``, ``cycles`` (measured by the accelerator from the train command
    to its completion), ``logits`` (int64 ``[B, classes]`` in Q.logit_frac), ``undone`` (``hw.switch_undo``:
    the update was reverted because the re-run's loss rose)."""

    loss: float
    correct: int
    cycles: int
    logits: np.ndarray
    undone: bool = False


class Driver:
    """Drives one accelerator through a :class:`Transport` (see the module docstring).

    Every public method returns what the transport's ``execute`` returns: the value itself for a
    :class:`BlockingTransport`, a coroutine to await for an :class:`AsyncTransport`.

    ``poll_cycles``: first wait between status polls (doubling up to 64x); ``timeout_cycles``: a command
    not done after this many cycles is aborted and raises :class:`AcceleratorTimeout`.
    """

    def __init__(self, desc: AcceleratorDescription, transport: Transport, *, poll_cycles: int = 64,
                 timeout_cycles: int = 1 << 32):
        if not isinstance(desc, AcceleratorDescription):
            raise TypeError(f"desc must be an AcceleratorDescription, not {desc!r}")
        if not isinstance(transport, Transport):
            raise TypeError(f"transport must be a Transport, not {transport!r}")
        self.desc = desc
        self.map = desc.regmap
        self.transport = transport
        self.poll_cycles = int(poll_cycles)
        self.timeout_cycles = int(timeout_cycles)
        self._steps_base = 0  # steps restored by load_state_dict minus the hardware counter at that time
        self._schedule = None  # last schedule words written (to skip rewriting unchanged tables)

    # -- public API -----------------------------------------------------------------------------------------

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
        """Restore everything :meth:`state_dict` returns."""
        return self.transport.execute(self._load_state_dict(state))

    # -- programs -------------------------------------------------------------------------------------------

    def _read_fields(self, name: str) -> Program:
        word = yield Read(self.map.addr(name))
        return self.map.decode(name, word)

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

    def _wait_done(self, name: str) -> Program:
        """Poll ``done.<name>`` (and ``error``) with growing pauses until set, or time out."""
        waited, pause = 0, self.poll_cycles
        done = self.map["done"]
        err = self.map["error"]
        while True:
            word = yield Read(done.addr)
            if done.decode(word)[name]:
                break
            eword = yield Read(err.addr)
            if eword:
                yield from self._check_errors(f"command {name}")
            if waited >= self.timeout_cycles:
                yield from self._abort()
                raise AcceleratorTimeout(f"command {name} not done after {waited} cycles; aborted")
            yield Sleep(pause)
            waited += pause
            pause = min(2 * pause, 64 * self.poll_cycles)
        yield Write(done.addr, done.field(name).mask)
        yield from self._check_errors(f"command {name}")

    def batch_words(self, x, labels) -> np.ndarray:
        """The beats of one batch upload: the samples (``batch_layout``), then the labels (``label_layout``)."""
        d = self.desc
        x = np.asarray(x)
        labels = np.asarray(labels)
        if x.shape != (d.batch, d.features):
            raise ValueError(f"batch: expected x of shape {(d.batch, d.features)}, got {x.shape}")
        if labels.shape != (d.batch,):
            raise ValueError(f"batch: expected {d.batch} labels, got shape {labels.shape}")
        if labels.size and (labels.min() < 0 or labels.max() >= d.classes):
            raise ValueError(f"batch: labels must be in 0..{d.classes - 1}")
        return np.concatenate([d.batch_layout.encode(x), d.label_layout.encode(labels.astype(np.int64))])

    def _upload(self, x, labels) -> Program:
        words = self.batch_words(x, labels)
        yield from self._command("upload", batch=self.desc.batch)
        yield Send(words)
        yield from self._wait_done("upload")

    def schedule_words(self, lr: float, progress: float, lr0: float | None) -> dict:
        """Per-step constants of the hardware optimiser (docs/arithmetic.md, "Update"), computed with
        :mod:`sim.hw.optim` as the bit-exact model does: ``sched`` register fields ``lr_shift``
        (round(-log2 lr): beta and sgd) and ``opt_shift`` (bop's EMA shift or iir's alpha shift at this point
        of the schedule), and for the switch optimiser its probability table ``switch_table`` (written to
        every layer's weight memory when it changes)."""
        from sim.hw import optim as O

        s = self.desc.schedule
        lr0 = float(s.get("lr0", lr)) if lr0 is None else float(lr0)
        ratio = lr / lr0 if lr0 > 0 else 1.0
        out = {"lr_shift": min(O.lr_shift(lr), 63), "opt_shift": 0}
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
            lam = float(s["switch_lambda"]) * min(ratio, 1.0)
            out["switch_table"] = tuple(int(v) for v in O.switch_table(int(s["switch_cutoff"]),
                                                                        float(s["switch_sigma"]), lam))
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

        yield from self._set_schedule(lr, progress, lr0)
        yield from self._upload(x, labels)
        yield from self._command("train")
        yield from self._wait_done("train")
        cycles = (yield from self._read_fields("cycles"))["value"]
        correct = (yield from self._read_fields("correct"))["value"]
        undone = (yield from self._read_fields("undone"))["value"]
        logits = yield from self._readback(self.desc.quantity("logits", len(self.desc.layers) - 1))
        p = ArithParams(**self.desc.schedule.get("arith", {}))
        _, loss, _ = loss_grad(logits, labels, p)
        return StepResult(loss=loss, correct=int(correct), cycles=int(cycles), logits=logits, undone=bool(undone))

    def _readback(self, q: QuantityLayout) -> Program:
        if q.access == "wo":
            raise ValueError(f"{q.key} is write-only on the accelerator")
        yield from self._command("readback", layer=q.layer or 0, quantity=q.kind)
        words = yield Receive(q.beats)
        yield from self._wait_done("readback")
        return q.decode(words)

    def _restore(self, q: QuantityLayout, array) -> Program:
        if q.access == "ro":
            raise ValueError(f"{q.key} is read-only on the accelerator")
        words = q.encode(array)
        yield from self._command("restore", layer=q.layer or 0, quantity=q.kind)
        yield Send(words)
        yield from self._wait_done("restore")

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

    def _load_state_dict(self, state: Mapping[str, np.ndarray]) -> Program:
        rng = np.asarray(state["rng"], dtype=np.uint32) if "rng" in state else None
        at = 0
        for q in self.desc.quantities:
            if q.access != "rw":
                continue
            if q.name == "rng":
                n = math.prod(q.shape)
                part = rng[at : at + n].reshape(q.shape).astype(np.int64)
                at += n
                yield from self._restore(q, part)
            else:
                yield from self._restore(q, np.asarray(state[q.key]).reshape(q.shape))
        if rng is not None and at != len(rng):
            raise ValueError(f"rng state has {len(rng)} generators; the accelerator has {at}")
        steps = (yield from self._read_fields("steps"))["value"]
        self._steps_base = int(state["steps"]) - steps
