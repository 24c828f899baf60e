"""Data movement of the accelerator: 32-bit stream beats <-> memory words, and memories streamed out.

The host path (:mod:`rtl_gen.top`) moves every quantity as *memory words*: a quantity lives in one
memory, or in several banks read at the same address whose outputs concatenate into one word, and a
word of ``W`` bits travels as ``ceil(W / 32)`` 32-bit beats, least significant first (the format
``rtl_gen.contract.QuantityLayout`` decodes). Three blocks do all of it:

- :class:`BeatWriter`: stream beats in, whole words out as sequential memory writes, with the TLAST
  checks of the ``framing`` error (upload and restore);
- :class:`MemoryReader`: sequential reads of a memory as a stream of words at one word per cycle,
  with backpressure (feeds the XNOR engines and the read-back path);
- :class:`WordSerializer`: words -> beats, TLAST on the last beat of the last word (read-back).

Beats per word are a run-time input (``beats``), so one instance serves quantities of different widths
(the narrower ones use the low bits).
"""

from __future__ import annotations

from amaranth import Array, Const, Elaboratable, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .contract import BEAT_BITS
from .streams import KEEP, SKID_SELECT_BITS, SkidBuffer

__all__ = ["BEAT_BITS", "BeatWriter", "MemoryReader", "SplitMemory", "WordSerializer", "beat_layout", "beats_for"]


def beats_for(width: int) -> int:
    """Stream beats of one ``width``-bit memory word."""
    return max(1, -(-int(width) // BEAT_BITS))


def beat_layout() -> data.StructLayout:
    """Payload of the 32-bit host streams: ``data`` and ``last`` (TLAST)."""
    return data.StructLayout({"data": BEAT_BITS, "last": 1})


def _check(name, value, lo, hi=1 << 40):
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in {lo}..{hi}, not {value!r}")
    return value


class BeatWriter(wiring.Component):
    """Assembles words of ``beats`` beats from the stream ``i`` and writes them to ``count`` consecutive
    addresses from 0 (``w_addr``/``w_data``/``w_en``, one cycle each; a word's last beat waits for
    ``w_ready``, so a target that is momentarily busy holds the stream back; memories keep ``w_ready``
    high and the DMA runs at full rate).

    Parameters: ``width`` (widest word, bits), ``depth`` (largest ``count``).

    Ports: ``start`` (pulse: begin, with ``count``, ``beats`` and ``final`` valid), ``count``, ``beats``,
    ``final`` (1: the transfer must end with TLAST on its last beat; 0: a TLAST anywhere in this segment
    is early, e.g. the images part of an upload), ``i`` (beats), ``w_addr``, ``w_data``, ``w_en``,
    ``busy``, ``done`` (pulse: finished; ``error`` valid with it), ``error`` (framing), ``abort``
    (pulse: stop at once, nothing more is written).

    Framing: a TLAST before the last beat ends the command with ``error`` (the transfer is over; what was
    written stays). A last beat without TLAST when ``final`` is set also sets ``error``, and the writer
    then accepts and drops beats until TLAST, so the sender never stalls.
    """

    def __init__(self, *, width: int, depth: int):
        self._width = _check("width", width, 1)
        self._depth = _check("depth", depth, 1)
        self._max_beats = beats_for(width)
        super().__init__({
            "start": In(1),
            "abort": In(1),
            "count": In(range(depth + 1)),
            "beats": In(range(1, self._max_beats + 1)),
            "final": In(1),
            "i": In(stream.Signature(beat_layout())),
            "w_addr": Out(range(max(depth, 2))),
            "w_data": Out(width),
            "w_en": Out(1),
            "w_ready": In(1, init=1),
            "busy": Out(1),
            "done": Out(1),
            "error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        nb = self._max_beats
        acc = Signal(nb * BEAT_BITS)
        beat = Signal(range(nb))
        addr = Signal(range(self._depth + 1))
        count = Signal(range(self._depth + 1))
        beats = Signal(range(1, nb + 1))
        final = Signal()
        word = Signal(nb * BEAT_BITS)
        take = Signal()
        last_beat = Signal()
        last_word = Signal()
        m.d.comb += [
            take.eq(self.i.valid & self.i.ready),
            last_beat.eq(beat == beats - 1),
            last_word.eq(addr == count - 1),
            self.w_addr.eq(addr),
            self.w_data.eq(word[: self._width]),
        ]
        # the word being completed: earlier beats from acc, this beat in its slot
        for k in range(nb):
            sl = slice(k * BEAT_BITS, (k + 1) * BEAT_BITS)
            m.d.comb += word[sl].eq(Mux(beat == k, self.i.payload.data, acc[sl]))
        m.d.comb += [self.done.eq(0)]
        with m.FSM():
            with m.State("idle"):
                with m.If(self.start):
                    m.d.sync += [addr.eq(0), beat.eq(0), count.eq(self.count), beats.eq(self.beats),
                                 final.eq(self.final), self.error.eq(0)]
                    with m.If(self.count == 0):
                        m.next = "finish"
                    with m.Else():
                        m.next = "run"
            with m.State("run"):
                m.d.comb += [self.busy.eq(1), self.i.ready.eq(~last_beat | self.w_ready)]
                with m.If(self.abort):
                    m.next = "idle"
                with m.Elif(take):
                    m.d.sync += acc.eq(word)
                    m.d.comb += self.w_en.eq(last_beat)
                    with m.If(last_beat):
                        m.d.sync += [beat.eq(0), addr.eq(addr + 1)]
                    with m.Else():
                        m.d.sync += beat.eq(beat + 1)
                    end = Signal()
                    m.d.comb += end.eq(last_beat & last_word)
                    with m.If(end):
                        with m.If(final & ~self.i.payload.last):
                            m.d.sync += self.error.eq(1)  # no TLAST on the last beat: drop beats until it
                            m.next = "drain"
                        with m.Else():
                            m.d.sync += self.error.eq(~final & self.i.payload.last)  # TLAST in a non-final part
                            m.next = "finish"
                    with m.Elif(self.i.payload.last):
                        m.d.sync += self.error.eq(1)  # early TLAST: the transfer is over
                        m.next = "finish"
            with m.State("drain"):
                m.d.comb += [self.busy.eq(1), self.i.ready.eq(1)]
                with m.If(self.abort | (take & self.i.payload.last)):
                    m.next = "finish"
            with m.State("finish"):
                m.d.comb += self.done.eq(1)
                m.next = "idle"
        return m


#: words in a registered :class:`MemoryReader`'s queue (its credits): a read, its word taken a cycle later and the
#: credit back a cycle after the consumer took it make a loop of three cycles, so three keep one word a cycle
PREFETCH = 3


class MemoryReader(wiring.Component):
    """Reads ``count`` consecutive addresses from ``base`` through a synchronous read port (``r_addr``,
    ``r_en``, ``r_data`` one cycle later) and offers the words on ``o`` (``last`` on the final word), one
    per cycle while ``o.ready`` is high.

    Parameters: ``width`` (word bits), ``depth`` (address range), ``repeat`` (largest ``count`` in units of
    ``depth``), ``registered`` (the words leave from registers of the reader's own: one more cycle of latency, and
    neither the read data nor the consumer's ``ready`` crosses into the other side in one cycle; for a consumer
    that does arithmetic on the word at once, docs/architecture.md "Timing discipline").

    Unregistered: no output queue; a word read stays on the read port's output (the port's enable is low while it
    waits), so ``o.payload.data`` is ``r_data`` itself and ``r_en`` depends on ``o.ready`` in the same cycle (the
    next read is issued as the word leaves). The read port must hold its data while ``r_en`` is low and nothing
    else may read through it while the reader runs.

    Registered: a queue of :data:`PREFETCH` words and as many credits. A read is issued while a credit is left
    (``r_en`` depends on the reader's flip-flops only), its word is taken from ``r_data`` in the next cycle
    whatever the consumer does, and a word taken by the consumer returns its credit a cycle later. The read port
    need not hold its data, so a port whose readers are all registered may read every cycle (its enable tied
    high: no enable fanned out to every bit of the port's data register). Latency two cycles from the read, one
    word a cycle, and the same words in the same cycles as the earlier form (the port's word and a skid buffer,
    three words in all), checked cycle for cycle in tests/rtl_gen/test_buffers.py.

    Ports: ``start`` (pulse, with ``base``, ``count`` and ``wrap``), ``abort`` (pulse: stop issuing and empty
    the queue), ``base``, ``count``, ``wrap`` (nonzero: the address returns to 0 after ``wrap - 1``, to read
    a buffer several times), ``r_addr``, ``r_en``, ``r_data``, ``o`` (payload ``data``, ``last``), ``busy``
    (until the last word is taken), ``reading`` (while it needs the read port: until the last word has left it).
    """

    def __init__(self, *, width: int, depth: int, repeat: int = 1, registered: bool = False):
        self._width = _check("width", width, 1)
        self._depth = _check("depth", depth, 1)
        self._repeat = _check("repeat", repeat, 1, 16)
        self._registered = bool(registered)
        self._layout = data.StructLayout({"data": width, "last": 1})
        super().__init__({
            "start": In(1),
            "abort": In(1),
            "base": In(range(max(depth, 2))),
            "count": In(range(repeat * depth + 1)),
            "wrap": In(range(depth + 1)),
            "r_addr": Out(range(max(depth, 2))),
            "r_en": Out(1),
            "r_data": In(width),
            "o": Out(stream.Signature(self._layout)),
            "busy": Out(1),
            "reading": Out(1),
        })

    @property
    def layout(self):
        return self._layout

    def _counters(self, m, issue):
        """The address and the count of reads left: ``(more, one)``, ``left != 0`` and ``left == 1`` as
        flip-flops (the read enable is one gate of registers, not a wide compare)."""
        addr = Signal(range(max(self._depth, 2)))
        left = Signal(range(self._repeat * self._depth + 1))  # reads still to issue
        wrap = Signal(range(self._depth + 1))
        more, one = Signal(), Signal()
        m.d.comb += self.r_addr.eq(addr)
        with m.If(issue):
            m.d.sync += [more.eq(~one), one.eq(left == 2),
                         addr.eq(Mux((wrap != 0) & (addr == wrap - 1), 0, addr + 1)), left.eq(left - 1)]
        with m.If(self.start):
            m.d.sync += [addr.eq(self.base), left.eq(self.count), wrap.eq(self.wrap), more.eq(self.count != 0),
                         one.eq(self.count == 1)]
        with m.If(self.abort):
            m.d.sync += [left.eq(0), more.eq(0), one.eq(0)]
        return more, one

    def _elaborate_prefetch(self, m):
        issue = Signal()
        more, one = self._counters(m, issue)
        issued_last = Signal()
        issued = _prefetch_queue(m, self, self._layout, more, issue, lambda: {"data": self.r_data, "last": issued_last})
        m.d.sync += issued_last.eq(issue & one)
        m.d.comb += self.reading.eq(more | issued)
        return m

    def elaborate(self, platform):
        m = Module()
        if self._registered:
            return self._elaborate_prefetch(m)
        have = Signal()  # a word waits on r_data
        have_last = Signal()
        issue = Signal()
        more, one = self._counters(m, issue)
        m.d.comb += [
            issue.eq(more & (~have | self.o.ready) & ~self.abort),
            self.r_en.eq(issue),
            self.o.valid.eq(have),
            self.o.payload.data.eq(self.r_data),
            self.o.payload.last.eq(have_last),
            self.busy.eq(more | have),
            self.reading.eq(more | have),
        ]
        with m.If(issue):
            m.d.sync += [have.eq(1), have_last.eq(one)]
        with m.Elif(self.o.ready):
            m.d.sync += have.eq(0)
        with m.If(self.abort):  # stop issuing, drop the waiting word
            m.d.sync += have.eq(0)
        return m


class WordSerializer(wiring.Component):
    """Words of up to ``width`` bits in (``i``: ``data``, ``last``), 32-bit beats out (``o``), ``beats``
    beats per word (run-time), least significant first; TLAST on the last beat of a word marked ``last``.
    Full rate: a one-beat word per cycle."""

    def __init__(self, *, width: int):
        self._width = _check("width", width, 1)
        self._max_beats = beats_for(width)
        super().__init__({
            "beats": In(range(1, self._max_beats + 1)),
            "i": In(stream.Signature(data.StructLayout({"data": width, "last": 1}))),
            "o": Out(stream.Signature(beat_layout())),
        })

    def elaborate(self, platform):
        m = Module()
        nb = self._max_beats
        shreg = Signal(nb * BEAT_BITS)
        full = Signal()
        last = Signal()
        beat = Signal(range(nb))
        final_beat = Signal()
        load = Signal()
        m.d.comb += [
            final_beat.eq(beat == self.beats - 1),
            self.o.valid.eq(full),
            self.o.payload.data.eq(shreg[:BEAT_BITS]),
            self.o.payload.last.eq(last & final_beat),
            self.i.ready.eq(~full | (self.o.ready & final_beat)),
            load.eq(self.i.valid & self.i.ready),
        ]
        with m.If(full & self.o.ready):
            m.d.sync += [shreg.eq(shreg >> BEAT_BITS), beat.eq(beat + 1)]
            with m.If(final_beat):
                m.d.sync += full.eq(0)
        with m.If(load):
            m.d.sync += [shreg.eq(self.i.payload.data), full.eq(1), beat.eq(0), last.eq(self.i.payload.last)]
        return m


def next_sample_row(m: Module, bank, base, banks: int, words: int):
    """Step a sample-banked buffer's write or read position to the next sample: the next bank, or, after the
    last of ``banks`` banks, bank 0 at the next ``words``-word base (samples ``b`` live in bank ``b mod banks``,
    row ``b // banks``)."""
    with m.If(bank == banks - 1):
        m.d.sync += [bank.eq(0), base.eq(base + words)]
    with m.Else():
        m.d.sync += bank.eq(bank + 1)


def zero_extend(value, width: int):
    """``value`` as exactly ``width`` bits (truncated or zero-extended)."""
    v = value.as_value() if hasattr(value, "as_value") else value
    if len(v) >= width:
        return v[:width]
    return v | Const(0, width)


class RowReader(wiring.Component):
    """Rows of a sample-banked buffer, in sample order: ``rows`` rows of ``words`` words each, row ``s`` in
    bank ``s % banks`` at addresses ``(s // banks) * words + k``. All banks get the same ``r_addr``/``r_en``;
    the word is taken from bank ``s % banks`` (``r_data`` is the banks' outputs, bank 0 lowest). Output ``o``:
    ``data``, ``row_last`` (word ``words - 1``), ``last`` (the final word); one word per cycle. No output queue
    (as :class:`MemoryReader`: the word waits on the read port, whose enable depends on ``o.ready``).

    ``registered``: as :class:`MemoryReader`'s, a queue of :data:`PREFETCH` words and as many credits; a read is
    issued while a credit is left (``r_en`` from the reader's flip-flops only), its bank's word is taken in the
    next cycle whatever the consumer does, so the read port need not hold its data (its enable may be tied high)
    and the consumer's ``ready`` reaches neither the read enable nor the port's data register. One more cycle of
    latency; one word a cycle.

    Ports: ``start``, ``abort`` (pulses), ``r_addr``, ``r_en``, ``r_data``, ``o``, ``busy``.
    """

    def __init__(self, *, width: int, banks: int, words: int, rows: int, registered: bool = False):
        self._width = _check("width", width, 1)
        self._banks = _check("banks", banks, 1, 4096)
        self._words = _check("words", words, 1)
        self._rows = _check("rows", rows, 1)
        self._registered = bool(registered)
        self._depth = -(-rows // banks) * words
        self._layout = data.StructLayout({"data": width, "row_last": 1, "last": 1})
        super().__init__({
            "start": In(1),
            "abort": In(1),
            "r_addr": Out(range(max(self._depth, 2))),
            "r_en": Out(1),
            "r_data": In(data.ArrayLayout(width, banks)),
            "o": Out(stream.Signature(self._layout)),
            "busy": Out(1),
        })

    @property
    def depth(self) -> int:
        """Words per bank."""
        return self._depth

    def elaborate(self, platform):
        m = Module()
        W, NB, R = self._words, self._banks, self._rows
        running = Signal()
        k = Signal(range(W))
        bank = Signal(range(NB))
        row = Signal(range(R))
        base = Signal(range(max(self._depth, 2)))  # (row // banks) * words
        have = Signal()  # a word waits on r_data
        s1_bank = Signal(range(NB))
        s1_row_last = Signal()
        s1_last = Signal()
        issue = Signal()
        last_word = Signal()
        m.d.comb += last_word.eq((k == W - 1) & (row == R - 1))
        with m.If(issue):
            with m.If(k == W - 1):
                m.d.sync += [k.eq(0), row.eq(row + 1)]
                next_sample_row(m, bank, base, NB, W)
                with m.If(row == R - 1):
                    m.d.sync += running.eq(0)
            with m.Else():
                m.d.sync += k.eq(k + 1)
        with m.If(self.start):
            m.d.sync += [running.eq(1), k.eq(0), bank.eq(0), row.eq(0), base.eq(0)]
        m.d.comb += self.r_addr.eq(base + k)
        if self._registered:
            return self._elaborate_prefetch(m, running, issue, bank, k, last_word)
        m.d.comb += [
            issue.eq(running & (~have | self.o.ready) & ~self.abort),
            self.r_en.eq(issue),
            self.busy.eq(running | have),
            self.o.valid.eq(have),
            self.o.payload.data.eq(self.r_data[s1_bank]),
            self.o.payload.row_last.eq(s1_row_last),
            self.o.payload.last.eq(s1_last),
        ]
        with m.If(issue):
            m.d.sync += [have.eq(1), s1_bank.eq(bank), s1_row_last.eq(k == W - 1), s1_last.eq(last_word)]
        with m.Elif(self.o.ready):
            m.d.sync += have.eq(0)
        with m.If(self.abort):
            m.d.sync += [running.eq(0), have.eq(0)]
        return m

    def _elaborate_prefetch(self, m, running, issue, bank, k, last_word):
        """The registered form (see the class docstring); the counters are :meth:`elaborate`'s."""
        i_bank = Signal(range(self._banks))
        i_row_last, i_last = Signal(), Signal()
        word = Signal(self._width, name="word")
        m.d.comb += word.eq(self.r_data[i_bank])
        m.d.sync += [i_bank.eq(bank), i_row_last.eq(k == self._words - 1), i_last.eq(last_word)]
        _prefetch_queue(m, self, self._layout, running, issue,
                        lambda: {"data": word, "row_last": i_row_last, "last": i_last})
        with m.If(self.abort):
            m.d.sync += running.eq(0)
        return m


def _prefetch_queue(m, rd, layout, more, issue, entry):
    """A registered reader's queue of :data:`PREFETCH` words in flip-flops and as many credits (``rd``: a reader
    with ``abort``, ``r_en``, ``o`` and ``busy``): ``issue`` (driven here) is ``more`` while a credit is left, a word
    is taken into the queue in the cycle after its read whatever the consumer does (``entry()``: the slot's fields
    then), and a word the consumer takes returns its credit. ``abort`` empties the queue. Returns ``issued`` (a read
    was issued in the cycle before)."""
    credits = Signal(range(PREFETCH + 1), init=PREFETCH)
    issued = Signal()  # a read issued in the cycle before: its word is on r_data
    slots = [Signal(layout, name=f"slot{n}") for n in range(PREFETCH)]
    wp, rp = Signal(range(PREFETCH)), Signal(range(PREFETCH))
    count = Signal(range(PREFETCH + 1))
    take, pop = Signal(), Signal()
    m.d.comb += [
        issue.eq(more & (credits != 0) & ~rd.abort),
        rd.r_en.eq(issue),
        take.eq(issued & ~rd.abort),
        rd.o.valid.eq(count != 0),
        rd.o.payload.eq(Array(slots)[rp]),
        pop.eq(rd.o.valid & rd.o.ready),
        rd.busy.eq(more | issued | (count != 0)),
    ]
    m.d.sync += [issued.eq(issue), count.eq(count + take - pop), credits.eq(credits - issue + pop)]
    ent = Signal(layout, name="slot_entry")
    m.d.comb += [getattr(ent, f).eq(v) for f, v in entry().items()]
    # slot n loads under copies of a flag register of its own, one per SKID_SELECT_BITS bits of the slot (KEEP),
    # each loaded with "a read is issued and slot n is the next written": the queue's counters reach no slot's
    # clock enables through logic (timing: the write pointer's decode into slot 0's enables, 13.65 ns, 12.65
    # of it routing, in the SMALL design in context at 0d278d2 seed 2). A read aborted in the cycle it arrives
    # loads its slot too: the abort empties the queue, so that word is never read.
    wp_next = Signal.like(wp, name="slot_wp_next")
    m.d.comb += wp_next.eq(Mux(rd.abort, 0, Mux(take, Mux(wp == PREFETCH - 1, 0, wp + 1), wp)))
    width = len(ent.as_value())
    for n, slot in enumerate(slots):
        for k, lo in enumerate(range(0, width, SKID_SELECT_BITS)):
            hi = min(lo + SKID_SELECT_BITS, width)
            en = Signal(name=f"slot{n}_load_c{k}", attrs=KEEP)
            m.d.sync += en.eq(issue & (wp_next == n))
            with m.If(en):
                m.d.sync += slot.as_value()[lo:hi].eq(ent.as_value()[lo:hi])
    m.d.sync += wp.eq(wp_next)
    with m.If(pop):
        m.d.sync += rp.eq(Mux(rp == PREFETCH - 1, 0, rp + 1))
    with m.If(rd.abort):  # stop issuing, drop the word on its way and the queue
        m.d.sync += [count.eq(0), credits.eq(PREFETCH), rp.eq(0)]
    return issued


class RowWriter(wiring.Component):
    """Sequential writes into a sample-banked buffer (the layout :class:`RowReader` reads): word ``k`` of row
    ``s`` goes to bank ``s % banks``, address ``(s // banks) * words + k``. ``start`` resets the position;
    each ``valid`` cycle writes ``data`` (``w_en`` is one-hot over the banks)."""

    def __init__(self, *, width: int, banks: int, words: int, rows: int):
        self._width = _check("width", width, 1)
        self._banks = _check("banks", banks, 1, 4096)
        self._words = _check("words", words, 1)
        self._rows = _check("rows", rows, 1)
        self._depth = -(-rows // banks) * words
        super().__init__({
            "start": In(1),
            "valid": In(1),
            "data": In(width),
            "w_addr": Out(range(max(self._depth, 2))),
            "w_data": Out(width),
            "w_en": Out(banks),
            "count": Out(range(rows * words + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        W, NB = self._words, self._banks
        k = Signal(range(W))
        bank = Signal(range(NB))
        base = Signal(range(max(self._depth, 2)))
        m.d.comb += [
            self.w_addr.eq(base + k),
            self.w_data.eq(self.data),
            self.w_en.eq(Mux(self.valid, 1 << bank, 0)),
        ]
        with m.If(self.valid):
            m.d.sync += self.count.eq(self.count + 1)
            with m.If(k == W - 1):
                m.d.sync += k.eq(0)
                next_sample_row(m, bank, base, NB, W)
            with m.Else():
                m.d.sync += k.eq(k + 1)
        with m.If(self.start):
            m.d.sync += [k.eq(0), bank.eq(0), base.eq(0), self.count.eq(0)]
        return m


class TileReader(wiring.Component):
    """The dW operand stream: for every bank row ``g * words + k`` (``g`` outer), ``passes`` times ``tiles``
    beats ``t`` (the dW unit's passes over the tile; it keeps no copy of them); beat ``t`` reads address
    ``t * words + k`` of every bank of the activation buffer ``a`` and address ``t * groups + g`` of every bank
    of the code buffer ``c`` (both sample-banked: bank ``i`` of beat ``t`` holds sample ``t * banks + i``).
    Output ``o``: ``a`` (all banks), ``c`` (all banks), ``last`` (the tile's last beat of each pass); one beat
    per cycle; ``g_last``: the beat on ``o`` is the last of its group ``g`` (last tile, pass and beat). No output
    queue (as :class:`MemoryReader`: the beat waits on the read ports, whose enable depends on ``o.ready``), unless
    ``registered``: then the beats (and ``g_last``) leave through a :class:`~rtl_gen.streams.SkidBuffer`, one
    more cycle of latency, and the read enable depends on the reader's flip-flops only (the memories' read
    registers no longer wait on the consumer's ``ready``: the SMALL design's routed paths into the code and
    activation buffers' read registers, docs/results/timing.md)."""

    def __init__(self, *, a_width: int, c_width: int, banks: int, words: int, groups: int, tiles: int,
                 passes: int = 1, registered: bool = False):
        self._registered = bool(registered)
        self._aw, self._cw = _check("a_width", a_width, 1), _check("c_width", c_width, 1)
        self._passes = _check("passes", passes, 1, 4096)
        self._banks = _check("banks", banks, 1, 4096)
        self._words, self._groups, self._tiles = words, groups, tiles
        self._layout = data.StructLayout({
            "a": data.ArrayLayout(a_width, banks), "c": data.ArrayLayout(c_width, banks), "last": 1})
        super().__init__({
            "start": In(1),
            "abort": In(1),
            "a_addr": Out(range(max(tiles * words, 2))),
            "c_addr": Out(range(max(tiles * groups, 2))),
            "r_en": Out(1),
            "a_data": In(data.ArrayLayout(a_width, banks)),
            "c_data": In(data.ArrayLayout(c_width, banks)),
            "o": Out(stream.Signature(self._layout)),
            "g_last": Out(1),
            "busy": Out(1),
        })

    @property
    def beats(self) -> int:
        return self._words * self._groups * self._tiles * self._passes

    def elaborate(self, platform):
        m = Module()
        W, G, T, P = self._words, self._groups, self._tiles, self._passes
        running = Signal()
        g = Signal(range(G))
        k = Signal(range(W))
        t = Signal(range(T))
        p = Signal(range(max(P, 2)))
        a_addr = Signal(range(max(T * W, 2)))
        c_addr = Signal(range(max(T * G, 2)))
        have = Signal()  # a beat waits on a_data / c_data
        s1_last = Signal()
        s1_g_last = Signal()
        issue = Signal()
        # the beat on the read ports' outputs: ``self.o`` itself, or the skid buffer's input
        beat = stream.Signature(data.StructLayout({**self._layout.members, "g_last": 1})).create()
        busy_out = Const(0)
        if self._registered:
            m.submodules.out = out = SkidBuffer(shape=beat.payload.shape())
            wiring.connect(m, beat, out.i)
            m.d.comb += [self.o.valid.eq(out.o.valid), out.o.ready.eq(self.o.ready),
                         self.o.payload.a.eq(out.o.payload.a), self.o.payload.c.eq(out.o.payload.c),
                         self.o.payload.last.eq(out.o.payload.last), self.g_last.eq(out.o.payload.g_last)]
            busy_out = out.o.valid | ~out.i.ready
        else:
            m.d.comb += [self.o.valid.eq(beat.valid), beat.ready.eq(self.o.ready), self.o.payload.a.eq(beat.payload.a),
                         self.o.payload.c.eq(beat.payload.c), self.o.payload.last.eq(beat.payload.last),
                         self.g_last.eq(beat.payload.g_last)]
        m.d.comb += [
            issue.eq(running & (~have | beat.ready) & ~self.abort),
            self.a_addr.eq(a_addr),
            self.c_addr.eq(c_addr),
            self.r_en.eq(issue),
            self.busy.eq(running | have | busy_out),
            beat.valid.eq(have),
            beat.payload.a.eq(self.a_data),
            beat.payload.c.eq(self.c_data),
            beat.payload.last.eq(s1_last),
            beat.payload.g_last.eq(s1_g_last),
        ]
        with m.If(issue):
            m.d.sync += [have.eq(1), s1_last.eq(t == T - 1),
                         s1_g_last.eq((t == T - 1) & (p == P - 1) & (k == W - 1))]
        with m.Elif(beat.ready):
            m.d.sync += have.eq(0)
        with m.If(issue):
            with m.If((t == T - 1) & (p != P - 1)):  # the same tile again for the next pass
                m.d.sync += [t.eq(0), p.eq(p + 1), a_addr.eq(k), c_addr.eq(g)]
            with m.Elif(t == T - 1):
                m.d.sync += [t.eq(0), p.eq(0)]
                with m.If(k == W - 1):
                    m.d.sync += [k.eq(0), g.eq(g + 1), a_addr.eq(0), c_addr.eq(g + 1)]
                    with m.If(g == G - 1):
                        m.d.sync += running.eq(0)
                with m.Else():
                    m.d.sync += [k.eq(k + 1), a_addr.eq(k + 1), c_addr.eq(g)]
            with m.Else():
                m.d.sync += [t.eq(t + 1), a_addr.eq(a_addr + W), c_addr.eq(c_addr + G)]
        with m.If(self.start):
            m.d.sync += [running.eq(1), g.eq(0), k.eq(0), t.eq(0), p.eq(0), a_addr.eq(0), c_addr.eq(0)]
        with m.If(self.abort):
            m.d.sync += [running.eq(0), have.eq(0)]
        return m


def host_request_layout(outer: int, inner: int, width: int) -> data.StructLayout:
    """A host access to a unit's storage: ``write``, ``space`` (which array), ``outer`` and ``inner``
    (address parts, e.g. bank row and lane), ``data``."""
    return data.StructLayout({"write": 1, "space": 3, "outer": range(max(outer, 2)), "inner": range(max(inner, 2)),
                              "data": width})


class HostSequencer(wiring.Component):
    """Walks ``count`` addresses of the selected quantity for the host path, ``inner_n`` inner positions
    per outer step (e.g. lanes per bank row), as requests on ``req``.

    Read mode (``write = 0``): one request outstanding; each response (``resp``) leaves on ``o`` with
    ``last`` on the final word. Write mode: the requests carry the words of ``w_data`` (``w_valid`` /
    ``w_ready``, from a :class:`BeatWriter`).
    """

    def __init__(self, *, outer: int, inner: int, width: int, count: int):
        self._outer, self._inner, self._width, self._count = outer, inner, width, count
        self._req = host_request_layout(outer, inner, width)
        super().__init__({
            "start": In(1),
            "abort": In(1),
            "write": In(1),
            "space": In(3),
            "count": In(range(count + 1)),
            "inner_n": In(range(1, max(inner, 1) + 1)),
            "req": Out(stream.Signature(self._req)),
            "resp": In(stream.Signature(width)),
            "o": Out(stream.Signature(data.StructLayout({"data": width, "last": 1}))),
            "w_valid": In(1),
            "w_data": In(width),
            "w_ready": Out(1),
            "busy": Out(1),
        })

    @property
    def request_layout(self):
        return self._req

    def elaborate(self, platform):
        m = Module()
        running = Signal()
        write = Signal()
        space = Signal(3)
        left = Signal(range(self._count + 1))
        inner_n = Signal(range(1, max(self._inner, 1) + 1))
        outer = Signal(range(max(self._outer, 2)))
        inner = Signal(range(max(self._inner, 2)))
        waiting = Signal()  # a read is outstanding
        out_full = Signal()
        out_data = Signal(self._width)
        out_last = Signal()
        m.d.comb += [
            self.req.payload.write.eq(write),
            self.req.payload.space.eq(space),
            self.req.payload.outer.eq(outer),
            self.req.payload.inner.eq(inner),
            self.req.payload.data.eq(self.w_data),
            self.o.valid.eq(out_full),
            self.o.payload.data.eq(out_data),
            self.o.payload.last.eq(out_last),
            self.busy.eq(running | waiting | out_full),
        ]
        go = Signal()
        with m.If(running & ~self.abort):
            with m.If(write):
                m.d.comb += [self.req.valid.eq(self.w_valid), self.w_ready.eq(self.req.ready)]
            with m.Else():
                m.d.comb += self.req.valid.eq(~waiting & ~out_full)
        m.d.comb += go.eq(self.req.valid & self.req.ready)
        with m.If(go):
            m.d.sync += left.eq(left - 1)
            with m.If(inner == inner_n - 1):
                m.d.sync += [inner.eq(0), outer.eq(outer + 1)]
            with m.Else():
                m.d.sync += inner.eq(inner + 1)
            with m.If(left == 1):
                m.d.sync += running.eq(0)
            with m.If(~write):
                m.d.sync += [waiting.eq(1), out_last.eq(left == 1)]
        m.d.comb += self.resp.ready.eq(waiting & ~out_full)
        with m.If(self.resp.valid & self.resp.ready):
            m.d.sync += [waiting.eq(0), out_full.eq(1), out_data.eq(self.resp.payload)]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += out_full.eq(0)
        with m.If(self.start):
            m.d.sync += [running.eq(self.count != 0), write.eq(self.write), space.eq(self.space), left.eq(self.count),
                         inner_n.eq(self.inner_n), outer.eq(0), inner.eq(0)]
        with m.If(self.abort):
            m.d.sync += [running.eq(0), waiting.eq(0), out_full.eq(0)]
        return m


class MemoryTarget(wiring.Component):
    """A plain memory (or a register) behind the host request/response protocol of :class:`HostSequencer`:
    requests are taken when no response is pending; a read reads the memory a cycle after it is taken, at an
    address from a register, and answers a cycle after that (synchronous read port: ``r_addr``/``r_en``/
    ``r_data``; timing: the host request slice's output choice into the address of the logits' LUT-RAM was 14.10
    ns, 12.5 of it routing, in the routed SMALL design at one seed); a write drives ``w_addr``/``w_data``/``w_en``
    for one cycle."""

    def __init__(self, *, outer: int, inner: int, width: int):
        self._req = host_request_layout(outer, inner, width)
        super().__init__({
            "req": In(stream.Signature(self._req)),
            "resp": Out(stream.Signature(width)),
            "r_addr": Out(range(max(outer, 2))),
            "r_en": Out(1),
            "r_data": In(width),
            "w_addr": Out(range(max(outer, 2))),
            "w_data": Out(width),
            "w_en": Out(1),
            "space": Out(3),
        })

    def elaborate(self, platform):
        m = Module()
        pending = Signal()
        rd_go = Signal()  # a read taken in the cycle before: the memory reads now
        r_addr = Signal.like(self.r_addr)
        space = Signal(3)
        take = self.req.valid & self.req.ready
        m.d.comb += [
            self.req.ready.eq(~rd_go & ~pending & ~self.resp.valid),
            self.r_addr.eq(r_addr),
            self.r_en.eq(rd_go),
            self.w_addr.eq(self.req.payload.outer),
            self.w_data.eq(self.req.payload.data),
            self.w_en.eq(take & self.req.payload.write),
            self.space.eq(Mux(take, self.req.payload.space, space)),
        ]
        resp_full = Signal()
        resp_data = Signal(len(self.resp.payload))
        m.d.sync += [rd_go.eq(take & ~self.req.payload.write), r_addr.eq(self.req.payload.outer)]
        with m.If(take & ~self.req.payload.write):
            m.d.sync += space.eq(self.req.payload.space)
        with m.If(rd_go):
            m.d.sync += pending.eq(1)
        with m.If(pending):
            m.d.sync += [pending.eq(0), resp_full.eq(1), resp_data.eq(self.r_data)]
        with m.If(self.resp.valid & self.resp.ready):
            m.d.sync += resp_full.eq(0)
        m.d.comb += [self.resp.valid.eq(resp_full), self.resp.payload.eq(resp_data)]
        return m


def fork(m: Module, src, dsts: list, name: str = "fork"):
    """Connect the handshake of stream ``src`` to every stream in ``dsts`` (an eager fork: each destination
    takes the beat when it is ready, ``src`` moves on once all have taken it; no ``valid`` depends on a
    ``ready``). Payloads are assigned by the caller. Returns the ``src`` transfer signal."""
    taken = [Signal(name=f"{name}_taken{i}") for i in range(len(dsts))]
    done = [Signal(name=f"{name}_done{i}") for i in range(len(dsts))]
    move = Signal(name=f"{name}_move")
    for d, t, dn in zip(dsts, taken, done, strict=True):
        m.d.comb += [d.valid.eq(src.valid & ~t), dn.eq(t | d.ready)]
    m.d.comb += [move.eq(src.valid & _and(done)), src.ready.eq(_and(done))]
    for d, t in zip(dsts, taken, strict=True):
        with m.If(move):
            m.d.sync += t.eq(0)
        with m.Elif(d.valid & d.ready):
            m.d.sync += t.eq(1)
    return move


def _and(values):
    out = Const(1)
    for v in values:
        out = out & v
    return out


class _MemPort:
    """The signals of one port of a :class:`SplitMemory`: ``addr``, ``en``, ``data``."""

    def __init__(self, shape, depth: int, name: str):
        self.addr = Signal(range(max(depth, 2)), name=f"{name}_addr")
        self.en = Signal(name=f"{name}_en")
        self.data = Signal(shape, name=f"{name}_data")


def _bits(v):
    return v.as_value() if hasattr(v, "as_value") else v


def split_segments(depth: int, block: int) -> list[tuple[int, int]]:
    """``(base, words)`` of the segments of a :class:`SplitMemory`: the bulk (a multiple of ``block``) and the
    tail, or one segment when ``depth <= block`` or ``block`` divides ``depth``."""
    if depth < 1 or block < 1:
        raise ValueError(f"depth and block must be >= 1, not {depth} and {block}")
    bulk = depth - depth % block if depth > block else depth
    return [(0, bulk)] + ([(bulk, depth - bulk)] if depth > bulk else [])


class SplitMemory(Elaboratable):
    """A memory of ``depth`` words with one synchronous read port (``read``) and one write port (``write``),
    kept as a bulk of ``depth - depth % block`` words and a tail of ``depth % block`` words (one memory when
    ``depth <= block`` or ``block`` divides it).

    Why: Yosys maps a deep, wide memory to block RAMs of one aspect ratio, ``4096 x 9`` for the widths of the
    weight memory's optimiser state, so a depth just past a multiple of 4,096 takes a whole extra row of
    RAMB36s (25,008 x 112 bits: 7 x 13 = 91 RAMB36). With the tail as its own memory the tail maps to a
    shallow, wide mode (432 x 112 bits: 2 RAMB36), 6 x 13 + 2 = 80 in that example. Never more block RAMs:
    the tail alone needs at most as many as one row of the bulk. The read data follow the segment of the address
    that was read (a registered select); ports behave like :meth:`amaranth.lib.memory.Memory.read_port` and
    ``write_port`` without granularity. ``init``: initial words (as for ``Memory``), split with the segments.

    The same holds for ``1024 x 36``: the per-channel memories of all layers of the paper's MLP hold 1,034
    words, which as one memory needs the ``2048``-deep (half as wide) modes."""

    def __init__(self, *, shape, depth: int, block: int = 4096, name: str = "mem", init=()):
        self.segments = split_segments(depth, block)
        self.shape, self.depth, self.name = shape, depth, name
        self.init = list(init)
        if len(self.init) > depth:
            raise ValueError(f"{len(self.init)} initial words for a memory of {depth}")
        self.read = _MemPort(shape, depth, f"{name}_rd")
        self.write = _MemPort(shape, depth, f"{name}_wr")

    def elaborate(self, platform):
        m = Module()
        rd_data = []
        sel = Signal(range(max(len(self.segments), 2)), name=f"{self.name}_seg")
        for i, (base, n) in enumerate(self.segments):
            mem = m.submodules[f"seg{i}"] = Memory(shape=self.shape, depth=max(n, 2), init=self.init[base:base + n])
            rd, wr = mem.read_port(), mem.write_port()
            here = (self.write.addr >= base) & (self.write.addr < base + n)
            m.d.comb += [
                rd.addr.eq(self.read.addr - base), rd.en.eq(self.read.en),
                wr.addr.eq(self.write.addr - base), _bits(wr.data).eq(_bits(self.write.data)),
                wr.en.eq(self.write.en & here),
            ]  # fmt: skip
            rd_data.append(_bits(rd.data))
            with m.If(self.read.en & (self.read.addr >= base)):
                m.d.sync += sel.eq(i)
        m.d.comb += _bits(self.read.data).eq(rd_data[0] if len(rd_data) == 1 else Mux(sel, rd_data[1], rd_data[0]))
        return m
