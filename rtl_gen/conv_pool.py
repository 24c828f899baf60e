"""Max pooling on the fly (docs/architecture.md 10.2): the first largest ``Y`` of every ``p x p`` window and its
index, from a conv layer's ``Y`` beats in raster order.

Input ``i``: the ``Y`` of one output position and one channel group a beat, ``lanes`` signed values, in the order
``(b, h, v, g)`` (sample, output row, output column, group; the order the engine and the ``YDX`` replays produce).
Output ``o``: per pooled position ``(b, hp, vp, g)``, in that order, the window's largest ``Y`` per lane and the
index ``i p + j`` (row-major within the window) of its **first** largest, scanning the window's rows top to
bottom and each row left to right with a strict compare, so a tie keeps the lower index: exactly
``sim.hw.arith.maxpool_argmax`` and ``maxpool_select(y, ...)``. Rows and columns past ``(H // p) p`` and
``(W // p) p`` are consumed and dropped, as the contract drops them.

State: one running maximum and index per lane for every pooled column and group (``(W // p) G lanes`` entries,
registers here): a pooled row's windows collect over its ``p`` output rows, and a window's result leaves with
the beat of its last position (row ``p - 1``, column ``p - 1`` of the window). ``i.ready`` follows ``o.ready`` on
those beats and is high on the others: one beat a cycle.

Ports: ``i``, ``o`` (streams), ``busy`` (a batch is part way through).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from amaranth import Array, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["MaxPool", "PoolGeometry", "pool_reference"]


@dataclass(frozen=True)
class PoolGeometry:
    """A conv layer's output as the pool sees it: ``batch`` maps of ``height x width`` positions, ``groups`` beats
    of ``lanes`` channels per position, ``y_width``-bit signed values, windows of ``pool x pool``."""

    batch: int
    height: int
    width: int
    groups: int
    lanes: int
    y_width: int
    pool: int = 2

    def __post_init__(self):
        for name, lo, hi in (("batch", 1, 1 << 16), ("height", 1, 1 << 12), ("width", 1, 1 << 12),
                             ("groups", 1, 4096), ("lanes", 1, 4096), ("y_width", 2, 64), ("pool", 2, 4)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
                raise ValueError(f"{name} must be an integer in {lo}..{hi}, not {value!r}")
        if self.height < self.pool or self.width < self.pool:
            raise ValueError(f"pool {self.pool} does not fit {self.height}x{self.width} positions")

    @property
    def out_height(self) -> int:
        return self.height // self.pool

    @property
    def out_width(self) -> int:
        return self.width // self.pool

    @property
    def index_width(self) -> int:
        return (self.pool * self.pool - 1).bit_length()

    def beats_in(self) -> int:
        return self.batch * self.height * self.width * self.groups

    def beats_out(self) -> int:
        return self.batch * self.out_height * self.out_width * self.groups


def _advance(m: Module, pos: Signal, within: Signal, pooled: Signal, pool: int) -> None:
    """The next position: ``pos + 1``, its place ``within`` the window (wrapping at ``pool``) and its ``pooled``
    coordinate (one up when ``within`` wraps)."""
    m.d.sync += pos.eq(pos + 1)
    with m.If(within == pool - 1):
        m.d.sync += [within.eq(0), pooled.eq(pooled + 1)]
    with m.Else():
        m.d.sync += within.eq(within + 1)


def pool_reference(g: PoolGeometry, y: np.ndarray) -> tuple[list[list[int]], list[tuple[list[int], list[int]]]]:
    """The input beats (``lanes`` values each, order ``(b, h, v, g)``) and the expected output beats
    ``(values, indices)`` (order ``(b, hp, vp, g)``) for ``y [B, G lanes, H, W]``, by ``sim.hw.arith``."""
    from sim.hw import arith as A

    y = np.asarray(y)
    if y.shape != (g.batch, g.groups * g.lanes, g.height, g.width):
        raise ValueError(f"y has shape {y.shape}; expected {(g.batch, g.groups * g.lanes, g.height, g.width)}")
    idx = A.maxpool_argmax(y, g.pool)
    top = A.maxpool_select(y, idx, g.pool)
    L = g.lanes
    ins = [[int(y[b, gr * L + lane, h, v]) for lane in range(L)]
           for b in range(g.batch) for h in range(g.height) for v in range(g.width) for gr in range(g.groups)]
    outs = [([int(top[b, gr * L + lane, hp, vp]) for lane in range(L)],
             [int(idx[b, gr * L + lane, hp, vp]) for lane in range(L)])
            for b in range(g.batch) for hp in range(g.out_height) for vp in range(g.out_width)
            for gr in range(g.groups)]
    return ins, outs


class MaxPool(wiring.Component):
    """The pool of :class:`PoolGeometry` (module docstring)."""

    def __init__(self, *, geometry: PoolGeometry):
        if not isinstance(geometry, PoolGeometry):
            raise TypeError(f"geometry must be a PoolGeometry, not {type(geometry).__name__}")
        self.geometry = g = geometry
        ys = data.ArrayLayout(signed(g.y_width), g.lanes)
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({"y": ys}))),
            "o": Out(stream.Signature(data.StructLayout({"y": ys, "idx": data.ArrayLayout(g.index_width,
                                                                                         g.lanes)}))),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        g = self.geometry
        P, H, W, G, L = g.pool, g.height, g.width, g.groups, g.lanes
        Wp = g.out_width
        b = Signal(range(max(g.batch, 2)))
        h = Signal(range(max(H, 2)))
        v = Signal(range(max(W, 2)))
        grp = Signal(range(max(G, 2)))
        wi = Signal(range(P))  # row within the window (h mod P)
        wj = Signal(range(P))  # column within the window (v mod P)
        vp = Signal(range(Wp + 2))  # pooled column (v // P); Wp: a dropped column
        hp = Signal(range(max(g.out_height + 1, 2)))  # pooled row (h // P); out_height: a dropped row
        started = Signal()
        # running maxima and indices per (pooled column, group), lane by lane
        entries = Wp * G
        best = [Array(Signal(signed(g.y_width), name=f"best{e}_{lane}") for e in range(entries)) for lane in range(L)]
        bidx = [Array(Signal(g.index_width, name=f"bidx{e}_{lane}") for e in range(entries)) for lane in range(L)]
        entry = Signal(range(max(entries, 2)))
        m.d.comb += entry.eq(vp * G + grp)
        inside = Signal()
        m.d.comb += inside.eq((hp < g.out_height) & (v < Wp * P))
        first = (wi == 0) & (wj == 0)
        closing = Signal()
        m.d.comb += closing.eq(inside & (wi == P - 1) & (wj == P - 1))
        here = Signal(g.index_width)
        m.d.comb += here.eq(wi * P + wj)
        new_y = [Signal(signed(g.y_width), name=f"new_y{lane}") for lane in range(L)]
        new_i = [Signal(g.index_width, name=f"new_i{lane}") for lane in range(L)]
        for lane in range(L):
            y = self.i.payload.y[lane]
            take = first | (y > best[lane][entry])
            m.d.comb += [new_y[lane].eq(Mux(take, y, best[lane][entry])),
                         new_i[lane].eq(Mux(take, here, bidx[lane][entry]))]
            m.d.comb += [self.o.payload.y[lane].eq(new_y[lane]), self.o.payload.idx[lane].eq(new_i[lane])]
        m.d.comb += [
            self.o.valid.eq(self.i.valid & closing),
            self.i.ready.eq(~closing | self.o.ready),
            self.busy.eq(started),
        ]
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += started.eq(1)
            with m.If(inside):
                for lane in range(L):
                    m.d.sync += [best[lane][entry].eq(new_y[lane]), bidx[lane][entry].eq(new_i[lane])]
            # advance (b, h, v, g) and the window coordinates
            with m.If(grp != G - 1):
                m.d.sync += grp.eq(grp + 1)
            with m.Else():
                m.d.sync += grp.eq(0)
                with m.If(v != W - 1):
                    _advance(m, v, wj, vp, P)
                with m.Else():
                    m.d.sync += [v.eq(0), wj.eq(0), vp.eq(0)]
                    with m.If(h != H - 1):
                        _advance(m, h, wi, hp, P)
                    with m.Else():
                        m.d.sync += [h.eq(0), wi.eq(0), hp.eq(0)]
                        with m.If(b != g.batch - 1):
                            m.d.sync += b.eq(b + 1)
                        with m.Else():
                            m.d.sync += [b.eq(0), started.eq(0)]
        return m
