"""Forward XNOR-popcount engine for dense layers: ``Y = X_hat * W_hat``.

Encoding: a bit 1 stands for +1 and a bit 0 for -1, for activations and weights alike. For one input
row ``x`` (``n_in`` bits) and one weight column ``w[:, j]`` the output is the exact integer

    y[j] = sum_i (+-1)(x[i]) * (+-1)(w[i, j]) = 2 * popcount(xnor(x, w[:, j])) - n_in,

in ``[-n_in, n_in]``, carried in ``ceil(log2(n_in + 1)) + 1`` signed bits.

Geometry (:class:`XnorGeometry`): the engine has ``lanes_out`` output lanes (output neurons computed
in parallel) and reads ``lanes_in`` input bits per word. A row of ``n_in`` bits arrives as
``words = ceil(n_in / lanes_in)`` words, input ``i`` in bit ``i % lanes_in`` of word ``i // lanes_in``;
the bits past ``n_in`` in the last word are padding and are masked out (their value does not matter).
The outputs are computed in ``groups = ceil(n_out / lanes_out)`` groups; lane ``l`` of group ``g``
is output neuron ``g * lanes_out + l``; lanes past ``n_out`` in the last group are padding and output 0.

Weights: one bank (a :class:`amaranth.lib.memory.Memory` of ``depth = words * groups`` rows of
``lanes_in`` bits, i.e. block-RAM shaped) per output lane. Row ``g * words + k`` of bank ``l`` holds
the bits ``w[k * lanes_in : (k + 1) * lanes_in, g * lanes_out + l]`` (dense layout: rows of ``w`` are
inputs), input ``k * lanes_in + b`` in bit ``b``. :meth:`XnorGeometry.pack_weights` builds the banks.

Schedule: for every row, for every group, the ``words`` words of the row are combined with one weight
row of every bank per cycle; the first group takes its words straight from the input stream (and keeps
them in a one-row buffer), the other groups replay the buffer, with the input stream stalled. With no
stalls the engine does one word x ``lanes_out`` lanes per cycle, every cycle; :func:`cycles` gives the
exact count. Pipeline: weight read (1 cycle), the XNOR'd and masked bits registered (1), popcount register (1),
accumulate and push into the output register (1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from amaranth import Const, Module, Mux, Shape, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .shared import layer_port, per_layer
from .streams import SkidBuffer, StreamFIFO, credit

__all__ = [
    "LATENCY",
    "WeightReadSignature",
    "XnorEngine",
    "XnorEngineCore",
    "XnorGeometry",
    "as_bits",
    "cycles",
    "popcount",
]

LATENCY = 5
"""Cycles from the transfer of a row's last input word (last group) to the transfer of its last output
beat, minus one: weight read, agreement register, popcount register, the ``pend`` FIFO, output register.
(The agreement register keeps the weight memory's output multiplexing and the XNOR apart from the popcount: in
context the weight word arrives through the shared weight memory's lane choice, and word -> XNOR -> popcount ->
count was the second deepest path of the SMALL design in context, 11.4 LUT levels, benchmarks/logic_depth.py.)"""

PEND_DEPTH = 8
"""Results the engine's ``pend`` FIFO holds: rows in flight (issue to push, 3 cycles) and waiting, so that rows of
one word each still issue one a cycle while the consumer takes one a cycle."""

POPCOUNT_CHUNK = 16
"""Bits of the input word per registered popcount (stage 3); the accumulate stage adds a lane's counts."""

MAX_N = 1 << 20
MAX_LANES = 4096


def _check_int(name: str, value: object, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in {lo}..{hi}, not {value!r}")
    return value


def as_bits(a, what: str = "array") -> np.ndarray:
    """``a`` as a 0/1 ``uint8`` array: accepts 0/1 bits or -1/+1 signs (1 means +1 in both)."""
    a = np.asarray(a)
    values = set(np.unique(a).tolist())
    if values <= {0, 1}:
        return a.astype(np.uint8)
    if values <= {-1, 1}:
        return (a > 0).astype(np.uint8)
    raise ValueError(f"{what} must hold 0/1 bits or -1/+1 signs, found values {sorted(values)[:6]}")


def _pack_last_axis(bits: np.ndarray) -> np.ndarray:
    """Integers from the bits along the last axis (bit 0 = element 0), as a Python-int object array."""
    packed = np.packbits(bits, axis=-1, bitorder="little")
    flat = packed.reshape(-1, packed.shape[-1])
    ints = np.array([int.from_bytes(row.tobytes(), "little") for row in flat], dtype=object)
    return ints.reshape(bits.shape[:-1])


@dataclass(frozen=True, kw_only=True)
class XnorGeometry:
    """Sizes of an engine for one dense layer; every derived width and the packing live here.

    Parameters (keyword-only): ``n_in`` (fan-in N, 1..2**20), ``n_out`` (output neurons, 1..2**20),
    ``lanes_in`` (bits per input word, 1..4096), ``lanes_out`` (parallel output lanes, 1..4096).
    """

    n_in: int
    n_out: int
    lanes_in: int
    lanes_out: int

    def __post_init__(self):
        _check_int("n_in", self.n_in, 1, MAX_N)
        _check_int("n_out", self.n_out, 1, MAX_N)
        _check_int("lanes_in", self.lanes_in, 1, MAX_LANES)
        _check_int("lanes_out", self.lanes_out, 1, MAX_LANES)

    @property
    def words(self) -> int:
        """Input words per row, ``ceil(n_in / lanes_in)``."""
        return -(-self.n_in // self.lanes_in)

    @property
    def groups(self) -> int:
        """Output groups per row, ``ceil(n_out / lanes_out)``."""
        return -(-self.n_out // self.lanes_out)

    @property
    def depth(self) -> int:
        """Rows per weight bank, ``words * groups``."""
        return self.words * self.groups

    @property
    def addr_width(self) -> int:
        return Shape.cast(range(self.depth)).width

    @property
    def lane_width(self) -> int:
        return Shape.cast(range(self.lanes_out)).width

    @property
    def y_width(self) -> int:
        """Bits of a signed output, ``ceil(log2(n_in + 1)) + 1``."""
        return self.n_in.bit_length() + 1

    @property
    def last_word_mask(self) -> int:
        """Valid bits of the last word of a row."""
        return (1 << (self.n_in - (self.words - 1) * self.lanes_in)) - 1

    @property
    def x_layout(self) -> data.StructLayout:
        """Input stream payload: ``data`` (``lanes_in`` bits, bit 0 first) and ``last`` (last word of a row)."""
        return data.StructLayout({"data": self.lanes_in, "last": 1})

    @property
    def y_layout(self) -> data.StructLayout:
        """Output stream payload: ``y`` (``lanes_out`` signed values, lane 0 in the low bits) and ``last``
        (last group of a row)."""
        return data.StructLayout({"y": data.ArrayLayout(signed(self.y_width), self.lanes_out), "last": 1})

    @property
    def w_layout(self) -> data.StructLayout:
        """Weight-load payload: ``data`` (one bank row), ``addr`` (row), ``lane`` (bank)."""
        return data.StructLayout({"data": self.lanes_in, "addr": range(self.depth), "lane": range(self.lanes_out)})

    def cycles(self, batch: int) -> int:
        """See :func:`cycles`."""
        _check_int("batch", batch, 0, 1 << 40)
        return batch * self.depth + LATENCY if batch else 0

    # --- packing (host and tests) ---

    def pack_weights(self, w) -> list[list[int]]:
        """Bank contents for weights ``w`` of shape ``(n_in, n_out)`` (bits or signs): ``banks[l][row]``."""
        bits = as_bits(w, "weights")
        if bits.shape != (self.n_in, self.n_out):
            raise ValueError(f"weights must have shape (n_in, n_out) = {(self.n_in, self.n_out)}, not {bits.shape}")
        padded = np.zeros((self.words * self.lanes_in, self.groups * self.lanes_out), np.uint8)
        padded[: self.n_in, : self.n_out] = bits
        # (k, b, g, l) -> (l, g, k, b): bank l, row g * words + k, bit b
        by_bank = padded.reshape(self.words, self.lanes_in, self.groups, self.lanes_out).transpose(3, 2, 0, 1)
        return _pack_last_axis(by_bank.reshape(self.lanes_out, self.depth, self.lanes_in)).tolist()

    def weight_beats(self, w) -> list[tuple[int, int, int]]:
        """``(lane, addr, data)`` for every bank row: what to send on ``w_load`` to load ``w``."""
        banks = self.pack_weights(w)
        return [(lane, addr, word) for lane, rows in enumerate(banks) for addr, word in enumerate(rows)]

    def pack_rows(self, x) -> list[list[int]]:
        """Input words of rows ``x`` of shape ``(batch, n_in)`` (bits or signs): ``words[row][k]``."""
        bits = as_bits(x, "inputs")
        if bits.ndim != 2 or bits.shape[1] != self.n_in:
            raise ValueError(f"inputs must have shape (batch, n_in={self.n_in}), not {bits.shape}")
        padded = np.zeros((bits.shape[0], self.words * self.lanes_in), np.uint8)
        padded[:, : self.n_in] = bits
        return _pack_last_axis(padded.reshape(bits.shape[0], self.words, self.lanes_in)).tolist()

    def unpack_outputs(self, beats: list[list[int]]) -> np.ndarray:
        """``(batch, n_out)`` outputs from output beats (each the ``lanes_out`` lane values), in order."""
        if len(beats) % self.groups:
            raise ValueError(f"{len(beats)} output beats is not a whole number of rows ({self.groups} per row)")
        y = np.asarray(beats, dtype=np.int64).reshape(-1, self.groups * self.lanes_out)
        return y[:, : self.n_out]


def cycles(n_in: int, n_out: int, batch: int, lanes_in: int, lanes_out: int) -> int:
    """Clock cycles for ``batch`` rows with no input stalls and no output backpressure, counted from the
    cycle the first input word is transferred to the cycle the last output beat is transferred, both
    included: ``batch * ceil(n_in / lanes_in) * ceil(n_out / lanes_out) + LATENCY``."""
    return XnorGeometry(n_in=n_in, n_out=n_out, lanes_in=lanes_in, lanes_out=lanes_out).cycles(batch)


def popcount(bits):
    """Number of set bits of ``bits``, as a balanced adder tree (unsigned, ``len(bits).bit_length()``
    bits wide). Pure combinational logic.

    Pass a :class:`Signal`, not an expression: the tree slices ``bits`` once per bit, and Amaranth does
    not share common subexpressions, so slicing an expression repeats its logic for every bit.
    """
    terms = [bits[i] for i in range(len(bits))]
    if not terms:
        return Const(0, 1)
    while len(terms) > 1:
        paired = [terms[i] + terms[i + 1] for i in range(0, len(terms) - 1, 2)]
        if len(terms) % 2:
            paired.append(terms[-1])
        terms = paired
    return terms[0]


class WeightReadSignature(wiring.Signature):
    """Read access to the weight banks of an :class:`XnorEngineCore`, seen from the engine.

    Members: ``addr`` Out(range(depth)), ``en`` Out(1), ``data`` In(ArrayLayout(lanes_in, lanes_out)).
    Contract: synchronous read of every bank at ``addr``; ``data`` shows the row addressed in the
    previous cycle in which ``en`` was high, and holds while ``en`` is low (what
    :meth:`amaranth.lib.memory.Memory.read_port` provides).
    """

    def __init__(self, geometry: XnorGeometry):
        self._geometry = geometry
        super().__init__(
            {
                "addr": Out(range(geometry.depth)),
                "en": Out(1),
                "data": In(data.ArrayLayout(geometry.lanes_in, geometry.lanes_out)),
            }
        )

    @property
    def geometry(self) -> XnorGeometry:
        return self._geometry

    def __eq__(self, other):
        return type(other) is type(self) and other.geometry == self.geometry

    def __repr__(self):
        return f"WeightReadSignature({self._geometry!r})"


class XnorEngineCore(wiring.Component):
    """The engine's datapath without weight storage, for a weight memory that lives elsewhere (e.g. the
    optimiser's banks). See the module docstring for the arithmetic and the schedule.

    Parameters (keyword-only):
        geometry: an :class:`XnorGeometry`; or
        geometries: several (one per layer, equal ``lanes_in`` and ``lanes_out``): the engine serves each
            in turn, picking words, groups, the padding masks and ``-n_in`` at run time by its ``layer``
            input (hold it while a layer's rows run). Its ports are built for the largest layer.

    Ports:
        x: ``In(stream.Signature(geometry.x_layout))`` input words.
        y: ``Out(stream.Signature(geometry.y_layout))`` one beat per output group.
        weights: ``Out(WeightReadSignature(geometry))``.
        framing_error: ``Out(1)`` high for one cycle after an input word whose ``last`` flag disagrees
            with the word count (the engine goes by the count; the flag is only checked).
        layer: ``In(range(len(geometries)))`` (several geometries only).
    """

    def __init__(self, *, geometry: XnorGeometry | None = None, geometries=None):
        geos = per_layer(geometry, geometries, XnorGeometry, key=lambda g: (g.lanes_in, g.lanes_out),
                         unit="XnorEngineCore", agree="lanes_in and lanes_out")
        self._geos = geos
        # the ports' geometry: the largest fan-in (|y|) and a depth that covers every layer's
        self._geometry = env = geos[0] if len(geos) == 1 else XnorGeometry(
            n_in=max(g.n_in for g in geos), n_out=max(g.n_out for g in geos), lanes_in=geos[0].lanes_in,
            lanes_out=geos[0].lanes_out)
        super().__init__(
            {
                **layer_port(len(geos)),
                "x": In(stream.Signature(env.x_layout)),
                "y": Out(stream.Signature(env.y_layout)),
                "weights": Out(WeightReadSignature(env)),
                "framing_error": Out(1),
            }
        )

    @property
    def geometry(self) -> XnorGeometry:
        """The geometry the ports are built for (the layer's own with one geometry)."""
        return self._geometry

    @property
    def geometries(self) -> list[XnorGeometry]:
        return list(self._geos)

    def elaborate(self, platform):
        geos = self._geos
        geo = self._geometry
        li, lo = geo.lanes_in, geo.lanes_out
        m = Module()

        # the selected layer's constants ("1": minus one)
        K1 = Signal(range(max(g.words for g in geos)))
        D1 = Signal(range(max(g.depth for g in geos)))
        last_start = Signal(range(max(g.depth for g in geos)))  # first row of the last group, (G - 1) K
        y_shape = signed(geo.y_width)
        neg_n = Signal(y_shape)
        last_mask = Signal(li)
        pad_lane = Signal(lo)  # lanes past n_out in the last group
        sel = self.layer if len(geos) > 1 else Const(0, 1)
        with m.Switch(sel):
            for i, g in enumerate(geos):
                with m.Case(i):
                    real = g.n_out - (g.groups - 1) * lo
                    m.d.comb += [
                        K1.eq(g.words - 1), D1.eq(g.depth - 1),
                        last_start.eq((g.groups - 1) * g.words), neg_n.eq(-g.n_in),
                        last_mask.eq(g.last_word_mask), pad_lane.eq(((1 << lo) - 1) & ~((1 << real) - 1)),
                    ]

        # Stage 0: issue one (group, word) step per cycle; the weight row address is group * K + word.
        # The stages after it move every cycle (no stall enable from the output queue's ready fanning out to every
        # stage register and into the accumulators: the SMALL design's `s2_last` -> popcount paths in context,
        # docs/results/timing.md). A result waits in ``pend`` (a FIFO in front of the output queue) when the
        # queue is full, and a row (group) starts only while ``pend`` has room for it and every row already
        # started (``credit``).
        adv = Const(1)
        issue = Signal()
        m.submodules.pend = pend = StreamFIFO(shape=geo.y_layout, depth=PEND_DEPTH)
        row_start = Signal()
        go = Signal()  # the step may issue: it is not a row's first word, or there is credit for the row
        pop = Signal()
        has_credit = credit(m, PEND_DEPTH, take=issue & row_start, give=pop, name="pend")
        addr = Signal(range(max(g.depth for g in geos)))
        word = Signal(range(max(g.words for g in geos)))
        first_group = Signal(init=1)
        last_group = Signal()
        last_word = Signal()
        # ``first_group`` (addr < K) is a flag register, set where the address wraps to 0 and cleared by the
        # first group's last word, so that no compare of the address sits between the input stream's valid and
        # the enables of the counters (timing: the XNOR engine's ``issue``, 13.02 ns at 7 endpoints in context
        # at 427fbc0 seed 2). The layer changes only at address 0, where addr < K holds for every layer.
        m.d.comb += [
            last_group.eq(addr >= last_start),
            last_word.eq(word == K1),
            row_start.eq(word == 0),
            go.eq(~row_start | has_credit),
            self.x.ready.eq(go & first_group),
            issue.eq(go & (~first_group | self.x.valid)),
            self.weights.addr.eq(addr),
            self.weights.en.eq(1),  # read every cycle: no enable to the weight word's registers
        ]
        with m.If(issue):
            m.d.sync += [
                word.eq(Mux(last_word, 0, word + 1)),
                addr.eq(Mux(addr == D1, 0, addr + 1)),
            ]
            with m.If(addr == D1):
                m.d.sync += first_group.eq(1)
            with m.Elif(last_word):
                m.d.sync += first_group.eq(0)
        m.d.sync += self.framing_error.eq(self.x.valid & self.x.ready & (self.x.payload.last != last_word))

        # Stage 1: weight rows and the input word are here; XNOR, mask the padding bits, popcount. The word and
        # the padding mask come from registers (stage 0 picks the stream or the row buffer, read combinationally,
        # so no multiplexer sits in front of the popcount: ECP5 timing proxy, docs/results.md).
        s1_valid = Signal()
        s1_first = Signal()
        s1_last = Signal()
        s1_last_group = Signal()
        x1 = Signal(li)
        mask = Signal(li)
        full = (1 << li) - 1
        x_in = Signal(li)
        if any(g.groups > 1 for g in geos):  # later groups replay the row from a one-row buffer
            m.submodules.row_buffer = row_buffer = Memory(shape=li, depth=max(max(g.words for g in geos), 2),
                                                          init=[])
            keep = row_buffer.write_port()
            replay = row_buffer.read_port(domain="comb")
            m.d.comb += [
                keep.addr.eq(word),
                keep.data.eq(self.x.payload.data),
                keep.en.eq(issue & first_group),
                replay.addr.eq(word),
                x_in.eq(Mux(first_group, self.x.payload.data, replay.data)),
            ]
        else:
            m.d.comb += x_in.eq(self.x.payload.data)
        with m.If(adv):
            m.d.sync += [
                s1_valid.eq(issue),
                s1_first.eq(word == 0),
                s1_last.eq(last_word),
                s1_last_group.eq(last_group),
            ]
            # (loaded every cycle: a word loaded without an issue goes with s1_valid low, and ``issue`` stays out
            # of the enables of the word's and the mask's bits)
            m.d.sync += [x1.eq(x_in), mask.eq(Mux(last_word, last_mask, full))]
        x_word = x1

        # Stage 2 (signals s2a_*): the agreement bits (XNOR of word and weight row, padding masked), registered.
        s2a_valid = Signal()
        s2a_first = Signal()
        s2a_last = Signal()
        s2a_last_group = Signal()
        agree = [Signal(li, name=f"agree{lane}") for lane in range(lo)]  # registers, so that the popcount's
        with m.If(adv):  # per-bit slices read one flip-flop each
            m.d.sync += [
                s2a_valid.eq(s1_valid),
                s2a_first.eq(s1_first),
                s2a_last.eq(s1_last),
                s2a_last_group.eq(s1_last_group),
            ]
            m.d.sync += [agree[lane].eq(~(x_word ^ self.weights.data[lane]) & mask) for lane in range(lo)]

        # Stage 3 (signals s2_*): registered popcounts, one per POPCOUNT_CHUNK bits of the word (timing: a 64-bit
        # popcount in one cycle closed at 88 MHz at the paper's widths on the ECP5 proxy); accumulate
        # y = -N + 2 * sum(popcounts); push the last sum.
        s2_valid = Signal()
        s2_first = Signal()
        s2_last = Signal()
        s2_last_group = Signal()
        chunks = [(lo_, min(li, lo_ + POPCOUNT_CHUNK)) for lo_ in range(0, li, POPCOUNT_CHUNK)]
        parts = [[Signal(range(b - a + 1), name=f"count{lane}_{k}") for k, (a, b) in enumerate(chunks)]
                 for lane in range(lo)]
        counts = [sum(p) if len(p) > 1 else p[0] for p in parts]
        with m.If(adv):
            m.d.sync += [
                s2_valid.eq(s2a_valid),
                s2_first.eq(s2a_first),
                s2_last.eq(s2a_last),
                s2_last_group.eq(s2a_last_group),
            ]
            for lane in range(lo):
                bits = [Signal(b - a, name=f"agree{lane}_{k}") for k, (a, b) in enumerate(chunks)]
                m.d.comb += [bs.eq(agree[lane][a:b]) for bs, (a, b) in zip(bits, chunks, strict=True)]
                m.d.sync += [c.eq(popcount(bs)) for c, bs in zip(parts[lane], bits, strict=True)]

        m.submodules.queue = queue = SkidBuffer(shape=geo.y_layout)
        push = Signal()
        m.d.comb += [
            push.eq(s2_valid & s2_last),
            pend.i.valid.eq(push),
            pend.i.payload.last.eq(s2_last_group),
            pop.eq(pend.o.valid & queue.i.ready),
        ]
        wiring.connect(m, pend.o, queue.i)
        real_min = min(g.n_out - (g.groups - 1) * lo for g in geos)
        for lane in range(lo):
            acc = Signal(y_shape, name=f"acc{lane}")
            total = Signal(y_shape, name=f"sum{lane}")
            m.d.comb += total.eq(Mux(s2_first, neg_n, acc) + (counts[lane] << 1))
            with m.If(adv & s2_valid):
                m.d.sync += acc.eq(total)
            if lane < real_min:
                m.d.comb += pend.i.payload.y[lane].eq(total)
            else:  # padding lane in the last group (of some layer)
                m.d.comb += pend.i.payload.y[lane].eq(Mux(s2_last_group & pad_lane[lane], 0, total))
        wiring.connect(m, queue.o, wiring.flipped(self.y))
        return m


class XnorEngine(wiring.Component):
    """XNOR-popcount engine with its own weight banks.

    Parameters (keyword-only): ``n_in``, ``n_out``, ``lanes_in``, ``lanes_out`` (see
    :class:`XnorGeometry`); ``weights``: optional initial weights of shape ``(n_in, n_out)`` (bits or
    signs), loaded into the banks at configuration (for tests, or a fixed start); default all zero.

    Ports (Verilog names in brackets):
        x: ``In(stream.Signature(x_layout))`` [``x__payload`` = data | last << lanes_in, ``x__valid``,
            ``x__ready``].
        y: ``Out(stream.Signature(y_layout))`` [``y__payload`` = lane values, lane 0 lowest, then
            ``last``; ``y__valid``, ``y__ready``].
        w_load: ``In(stream.Signature(w_layout))`` weight writes, always ready [``w_load__payload`` =
            data | addr << lanes_in | lane << (lanes_in + addr_width)]. Writes do not wait for the
            datapath: load while no rows are in flight.
        framing_error: ``Out(1)`` (see :class:`XnorEngineCore`).
    """

    def __init__(self, *, n_in: int, n_out: int, lanes_in: int, lanes_out: int, weights=None):
        self._geometry = geo = XnorGeometry(n_in=n_in, n_out=n_out, lanes_in=lanes_in, lanes_out=lanes_out)
        self._init = geo.pack_weights(weights) if weights is not None else None
        super().__init__(
            {
                "x": In(stream.Signature(geo.x_layout)),
                "y": Out(stream.Signature(geo.y_layout)),
                "w_load": In(stream.Signature(geo.w_layout)),
                "framing_error": Out(1),
            }
        )

    @property
    def geometry(self) -> XnorGeometry:
        return self._geometry

    def elaborate(self, platform):
        geo = self._geometry
        m = Module()
        m.submodules.core = core = XnorEngineCore(geometry=geo)
        wiring.connect(m, wiring.flipped(self.x), core.x)
        wiring.connect(m, core.y, wiring.flipped(self.y))
        m.d.comb += [self.framing_error.eq(core.framing_error), self.w_load.ready.eq(1)]
        load = self.w_load.payload
        for lane in range(geo.lanes_out):
            init = self._init[lane] if self._init is not None else []
            bank = m.submodules[f"bank{lane}"] = Memory(shape=geo.lanes_in, depth=geo.depth, init=init)
            read = bank.read_port()
            write = bank.write_port()
            m.d.comb += [
                read.addr.eq(core.weights.addr),
                read.en.eq(core.weights.en),
                core.weights.data[lane].eq(read.data),
                write.addr.eq(load.addr),
                write.data.eq(load.data),
                write.en.eq(self.w_load.valid & (load.lane == lane)),
            ]
        return m
