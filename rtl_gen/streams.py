"""Small stream building blocks shared by the datapath components."""

from __future__ import annotations

from amaranth import Module, Shape, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

__all__ = ["SkidBuffer", "StreamFIFO"]


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


class SkidBuffer(wiring.Component):
    """A registered slice between two :mod:`amaranth.lib.stream` interfaces: ``o.valid``, ``o.payload`` and
    ``i.ready`` all come from flip-flops, so neither the payload nor the consumer's ``ready`` crosses it in one
    cycle (docs/architecture.md, "Timing discipline": where a ``ready`` travels back across units). One transfer a
    cycle; a beat taken on ``i`` is offered on ``o`` from the next cycle on (one cycle of latency).

    Two entries: the output register and the skid register, which catches the beat that was already on its way
    when ``o.ready`` fell (``i.ready`` is "the skid register is empty", registered).
    """

    def __init__(self, *, shape):
        self._shape = shape
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})

    def elaborate(self, platform):
        m = Module()
        width = Shape.cast(self._shape).width
        out_valid, skid_valid = Signal(), Signal()
        # the payload registers have no reset: only the valid bits say what they hold, and a reset net that
        # reaches every payload flip-flop of every unit is the largest net of the design after the clock
        out_data, skid_data = Signal(width, reset_less=True), Signal(width, reset_less=True)
        m.d.comb += [self.o.valid.eq(out_valid), self.o.payload.eq(out_data), self.i.ready.eq(~skid_valid)]
        take = Signal()
        m.d.comb += take.eq(self.i.valid & ~skid_valid)
        with m.If(~out_valid | self.o.ready):  # the output register is free this cycle
            with m.If(skid_valid):
                m.d.sync += [out_valid.eq(1), out_data.eq(skid_data), skid_valid.eq(0)]
            with m.Else():
                m.d.sync += [out_valid.eq(take), out_data.eq(self.i.payload)]
        with m.Elif(take):  # the output register holds: the incoming beat goes to the skid register
            m.d.sync += [skid_valid.eq(1), skid_data.eq(self.i.payload)]
        return m
