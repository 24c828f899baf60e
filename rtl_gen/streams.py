"""Small stream building blocks shared by the datapath components."""

from __future__ import annotations

from amaranth import Module, Mux, Shape, Signal, Value
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

__all__ = ["SkidBuffer", "StreamFIFO", "KEEP", "credit", "or_tree", "replicas"]

#: The attribute that marks a register the synthesis must keep even when another register has the same inputs.
#: Vivado honours ``keep`` on a register; for Yosys, which keeps a wire but merges its driving flip-flop with any
#: flip-flop of equal inputs (``opt_merge``), the ECP5 flow copies it onto the driving flip-flop
#: (``boards/ecp5.py``, ``KEEP_REGISTERS``).
KEEP = {"keep": "true"}


def or_tree(terms):
    """The OR of ``terms`` as a balanced tree (with one-hot ``Mux(sel_i, x_i, 0)`` terms: a multiplexer as deep as
    the log of its inputs, not the chain of an if / elif on the selects)."""
    terms = list(terms)
    while len(terms) > 1:
        terms = [terms[i] | terms[i + 1] if i + 1 < len(terms) else terms[i] for i in range(0, len(terms), 2)]
    return terms[0]


def replicas(m: Module, value, n: int, *, name: str, reset_less: bool = False) -> list[Signal]:
    """``n`` registers that each take ``value`` every cycle: copies of one control flip-flop for ``n`` groups of
    loads, so that no single flip-flop drives them all across the die (docs/architecture.md, the timing
    discipline). Marked :data:`KEEP`, so that the synthesis does not merge them back into one."""
    copies = []
    for k in range(n):
        r = Signal(Value.cast(value).shape(), name=f"{name}_r{k}", attrs=KEEP, reset_less=reset_less)
        m.d.sync += r.eq(value)
        copies.append(r)
    return copies


def credit(m: Module, depth: int, *, take, give, name: str) -> Signal:
    """A credit counter for a queue of ``depth`` entries that a pipeline fills without a stall: ``take`` (a 1-bit
    value) spends a credit as an item enters the stages, ``give`` returns one as an item leaves the queue. Returns
    the flag "a credit is left" (the count is not zero), a register set with the count, so that the stages'
    issue reads a flip-flop, not a compare of the count. ``take`` must be low while the flag is low."""
    if depth < 1:
        raise ValueError(f"a credit counter needs a depth of 1 or more, not {depth}")
    count = Signal(range(depth + 1), init=depth, name=f"{name}_credit")
    has = Signal(init=1, name=f"{name}_has_credit")
    nxt = Signal.like(count, name=f"{name}_credit_next")
    m.d.comb += nxt.eq(count - take + give)
    m.d.sync += [count.eq(nxt), has.eq(nxt != 0)]
    return has


class StreamFIFO(wiring.Component):
    """First-in first-out queue between two :mod:`amaranth.lib.stream` interfaces.

    Parameters:
        shape: payload shape (any shape-castable, e.g. a :class:`amaranth.lib.data.StructLayout`).
        depth: entries, >= 1.

    Ports:
        i: ``In(stream.Signature(shape))``; ``i.ready`` is a registered function of the fill level
            (it never depends on ``o.ready`` in the same cycle), so a producer may base its own stall
            decision on it without creating a combinational path through the queue.
        o: ``Out(stream.Signature(shape))``; a pushed entry is offered from the next cycle on (one
            cycle of latency). ``depth >= 2`` sustains one transfer per cycle; with ``depth == 1``
            ``i.ready`` is low whenever the entry is held, so at most every other cycle.
        level: ``Out(range(depth + 1))`` entries held.
    """

    def __init__(self, *, shape, depth: int = 2):
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
            raise ValueError(f"depth must be an integer >= 1, not {depth!r}")
        self._shape = shape
        self._width = Shape.cast(shape).width
        self._depth = depth
        super().__init__(
            {
                "i": In(stream.Signature(shape)),
                "o": Out(stream.Signature(shape)),
                "level": Out(range(depth + 1)),
            }
        )

    @property
    def depth(self) -> int:
        return self._depth

    def elaborate(self, platform):
        m = Module()
        m.submodules.fifo = fifo = SyncFIFO(width=self._width, depth=self._depth)
        m.d.comb += [
            fifo.w_data.eq(self.i.payload),
            fifo.w_en.eq(self.i.valid),
            self.i.ready.eq(fifo.w_rdy),
            self.o.payload.eq(fifo.r_data),
            self.o.valid.eq(fifo.r_rdy),
            fifo.r_en.eq(self.o.ready),
            self.level.eq(fifo.level),
        ]
        return m


#: Payloads at least this wide get :class:`SkidBuffer`'s ring form by default.
RING_WIDTH = 64

#: Payload bits per copy of the skid form's ``skid_valid``, the select of the output register's choice between the
#: skid register and the input (one flip-flop drove the choice of every bit of BN backward's Q slice: 13.19 ns of
#: routing on that one net in context on the ECP5 proxy).
SKID_SELECT_BITS = 32


class SkidBuffer(wiring.Component):
    """A registered slice between two :mod:`amaranth.lib.stream` interfaces: ``o.valid``, ``o.payload`` and
    ``i.ready`` all come from flip-flops, so neither the payload nor the consumer's ``ready`` crosses it in one
    cycle (docs/architecture.md, "Timing discipline": where a ``ready`` travels back across units). One transfer a
    cycle; a beat taken on ``i`` is offered on ``o`` from the next cycle on (one cycle of latency).

    Two entries: the output register and the skid register, which catches the beat that was already on its way
    when ``o.ready`` fell (``i.ready`` is "the skid register is empty", registered).
    """

    def __init__(self, *, shape, ring: bool | None = None):
        self._shape = shape
        #: the two entries as a ring (see :meth:`_elaborate_ring`); by default for payloads of RING_WIDTH bits or more
        self.ring = Shape.cast(shape).width >= RING_WIDTH if ring is None else ring
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})

    def elaborate(self, platform):
        if self.ring:
            return self._elaborate_ring()
        m = Module()
        width = Shape.cast(self._shape).width
        out_valid, skid_valid = Signal(), Signal()
        # the payload registers have no reset: only the valid bits say what they hold, and a reset net that
        # reaches every payload flip-flop of every unit is the largest net of the design after the clock
        out_data = Signal(width, reset_less=True, name="out_data")
        skid_data = Signal(width, reset_less=True, name="skid_data")
        m.d.comb += [self.o.valid.eq(out_valid), self.o.payload.eq(out_data), self.i.ready.eq(~skid_valid)]
        take = Signal()
        m.d.comb += take.eq(self.i.valid & ~skid_valid)
        # skid_valid and its copies (KEEP), one per SKID_SELECT_BITS payload bits, each the select of its bits'
        # choice and their skid register's enable; all load alike
        segs = [(lo, min(lo + SKID_SELECT_BITS, width)) for lo in range(0, width, SKID_SELECT_BITS)] or [(0, 0)]
        sels = [skid_valid] + [Signal(name=f"skid_valid_c{k}", attrs=KEEP) for k in range(1, len(segs))]
        # the skid register loads while it is empty, a junk word unless a beat is caught: its enable is a
        # flip-flop, not ``o.ready`` (timing: the consumer's ready from across the die into the skid register's
        # enables through the catch decision was 14.24 ns in context on the ECP5 proxy, BN forward's beta slice)
        for sel, (lo, hi) in zip(sels, segs, strict=True):
            with m.If(~sel):
                m.d.sync += skid_data[lo:hi].eq(Value.cast(self.i.payload)[lo:hi])
        with m.If(~out_valid | self.o.ready):  # the output register is free this cycle
            m.d.sync += [out_data[lo:hi].eq(Mux(sel, skid_data[lo:hi], Value.cast(self.i.payload)[lo:hi]))
                         for sel, (lo, hi) in zip(sels, segs, strict=True) if hi > lo]
            m.d.sync += [out_valid.eq(skid_valid | take), *(sel.eq(0) for sel in sels)]
        with m.Elif(take):  # the output register holds: the incoming beat goes to the skid register
            m.d.sync += [sel.eq(1) for sel in sels]
        return m

    def _elaborate_ring(self):
        """The same two entries as a ring of two payload registers with a write and a read pointer: a beat is
        written once, into the free slot, and ``o.payload`` picks the older slot (one 2:1 multiplexer after the
        registers, its select a flip-flop). The slots' clock enables depend on ``i.valid`` and the unit's own
        flip-flops, never on the consumer's ``o.ready``: in the skid form ``o.ready`` reaches the clock enable of
        every payload bit (the SMALL design's routed worst path: a phase flag -> the weight memory's take -> the
        po2 backward engine's 512-bit dW queue, 13.9 ns of routing on the ECP5 proxy). Handshakes and latency are
        the skid form's: ``i.ready`` is "fewer than two held", ``o.valid`` "one or more", both registers."""
        m = Module()
        width = Shape.cast(self._shape).width
        slots = [Signal(width, name=f"slot{k}", reset_less=True) for k in range(2)]
        wp, rp = Signal(), Signal()
        full, held = Signal(), Signal()  # two beats held; one or more
        take, give = Signal(), Signal()
        m.d.comb += [
            self.i.ready.eq(~full),
            self.o.valid.eq(held),
            self.o.payload.eq(Mux(rp, slots[1], slots[0])),
            take.eq(self.i.valid & ~full),
            give.eq(held & self.o.ready),
        ]
        # a slot loads the input whenever it is free (its own flip-flop, ``free{k}``): a free slot holds nothing, so
        # a junk load is harmless, and the beat taken into it is the last one it loads. The slot's clock enable is
        # then one flip-flop, not ``i.valid`` and the pointers through a LUT (the generators' output ring, the SMALL
        # design's routed worst group at one nextpnr seed: ``i.valid`` -> every slot bit's enable)
        free = [Signal(name=f"free{k}", init=1) for k in range(2)]
        for k, slot in enumerate(slots):
            with m.If(free[k]):
                m.d.sync += slot.eq(self.i.payload)
            with m.If(take & (wp == k)):
                m.d.sync += free[k].eq(0)
            with m.Elif(give & (rp == k)):
                m.d.sync += free[k].eq(1)
        with m.If(take):
            m.d.sync += wp.eq(~wp)
        with m.If(give):
            m.d.sync += rp.eq(~rp)
        with m.If(take & ~give):  # one more held
            m.d.sync += [held.eq(1), full.eq(held)]
        with m.Elif(give & ~take):  # one fewer
            m.d.sync += [full.eq(0), held.eq(full)]
        return m
