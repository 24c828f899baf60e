"""The forward phase of one conv layer with max pooling (docs/architecture.md 10): the feature map in block RAM,
the window address generator and register window, the XNOR engine, and the pool on the fly.

Dataflow, one beat a cycle at every stage while the outputs take them::

    map (block RAM, one row of W Ci bits per image row (b, r) at b H + r)
      -> WindowAddressGenerator (the k rows of every output row)  -> the map's read port (1 cycle)
      -> RowWindow (the Wo windows of the output row, N = Ci k^2 bits each, the contract's (c, i, j) order)
      -> the window cut into K = ceil(N / li) words of li bits (the last word's tail is the engine's padding)
      -> XnorEngine (a dense layer of n_in = N, n_out = Co: one row per output position (b, h, v))
      -> Y beats, order (b, h, v, g)  -> ``y``  (every position: what the YDX buffer and BN take)
                                      -> MaxPool -> ``pooled`` (per pooled position and group: the first largest
                                         Y of each lane's window and its index)

The engine is :class:`rtl_gen.xnor_engine.XnorEngine` unchanged: a conv layer is a dense layer whose rows are the
``B Ho Wo`` positions and whose row is a window. The Y stream goes to both outputs through a fork that hands each
beat to each output once (``y`` and ``pooled`` may stall independently).

Only ``valid`` padding is built: ``same`` padding needs the window's skip mask in the engine and ``N_valid`` per
border case (docs/architecture.md 10.1), and is refused here.

Ports: ``x_write`` (map words: ``addr`` ``b H + r``, ``data`` pixel ``v`` channel ``c`` in bit ``v Ci + c``;
always ready, write before ``start``), ``w_load`` (the engine's weight loads, :meth:`XnorGeometry.weight_beats`
of ``w.reshape(Co, N).T``), ``start`` (a pulse; ignored while ``busy``), ``y``, ``pooled``, ``busy`` (from
``start`` until the batch's last Y beat has left on both outputs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from amaranth import Module, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .conv_pool import MaxPool, PoolGeometry
from .conv_window import RowWindow, RowWindowGeometry, WindowAddressGenerator, WindowGeometry
from .xnor_engine import XnorEngine, XnorGeometry

__all__ = ["ConvForward", "ConvForwardGeometry"]


@dataclass(frozen=True, kw_only=True)
class ConvForwardGeometry:
    """One conv layer's forward phase: ``batch`` maps of ``channels x height x width`` signs, ``out_channels``
    kernels of ``kernel x kernel``, stride 1, ``padding`` ("valid"), the engine's ``lanes_in`` / ``lanes_out``,
    ``pool x pool`` max pooling."""

    batch: int
    channels: int
    height: int
    width: int
    out_channels: int
    lanes_in: int
    lanes_out: int
    kernel: int = 3
    padding: str = "valid"
    pool: int = 2

    def __post_init__(self):
        if self.padding != "valid":
            raise ValueError(f"padding {self.padding!r} is not built: ConvForward takes 'valid' padding only "
                             "(same padding needs the engine's skip mask, docs/architecture.md 10.1)")
        # the parts check their own fields (one line each, naming the field and its range)
        _ = (self.generator, self.window, self.engine, self.pooling)

    @property
    def generator(self) -> WindowGeometry:
        return WindowGeometry.for_conv(batch=self.batch, height=self.height, kernel=self.kernel,
                                       padding=self.padding)

    @property
    def window(self) -> RowWindowGeometry:
        return RowWindowGeometry(channels=self.channels, width=self.width, kernel=self.kernel, pad=0)

    @property
    def engine(self) -> XnorGeometry:
        return XnorGeometry(n_in=self.channels * self.kernel ** 2, n_out=self.out_channels, lanes_in=self.lanes_in,
                            lanes_out=self.lanes_out)

    @property
    def pooling(self) -> PoolGeometry:
        e = self.engine
        return PoolGeometry(batch=self.batch, height=self.out_height, width=self.out_width, groups=e.groups,
                            lanes=self.lanes_out, y_width=e.y_width, pool=self.pool)

    @property
    def out_height(self) -> int:
        return self.height - self.kernel + 1

    @property
    def out_width(self) -> int:
        return self.width - self.kernel + 1

    @property
    def map_depth(self) -> int:
        """Words of the map memory: one per image row ``(b, r)``."""
        return self.batch * self.height

    @property
    def map_width(self) -> int:
        return self.width * self.channels

    def map_words(self, x) -> list[int]:
        """The map memory's words for ``x [B, Ci, H, W]`` (0/1 bits or -1/+1 signs; 1 is +1), by address."""
        x = np.asarray(x)
        bits = (x > 0).astype(np.uint8) if x.min() < 0 else x.astype(np.uint8)
        if bits.shape != (self.batch, self.channels, self.height, self.width):
            raise ValueError(f"map has shape {bits.shape}; expected "
                             f"{(self.batch, self.channels, self.height, self.width)}")
        rows = bits.transpose(0, 2, 3, 1).reshape(self.map_depth, self.map_width)  # (b, r), bit v Ci + c
        return [sum(int(t) << i for i, t in enumerate(row)) for row in rows]

    def weight_beats(self, w) -> list[tuple[int, int, int]]:
        """The engine's ``(lane, addr, data)`` loads for conv weights ``w [Co, Ci, k, k]`` (bits or signs)."""
        w = np.asarray(w)
        shape = (self.out_channels, self.channels, self.kernel, self.kernel)
        if w.shape != shape:
            raise ValueError(f"conv weights have shape {w.shape}; expected {shape}")
        return self.engine.weight_beats(w.reshape(self.out_channels, -1).T)

    def cycles(self) -> int:
        """Cycles from ``start`` to the transfer of the batch's last Y beat, both included, with no backpressure
        (docs/architecture.md 10; :func:`rtl_gen.cycle_model.conv_forward_cycles`)."""
        from .cycle_model import conv_forward_cycles

        return conv_forward_cycles(batch=self.batch, channels=self.channels, height=self.height, width=self.width,
                                   out_channels=self.out_channels, lanes_in=self.lanes_in,
                                   lanes_out=self.lanes_out, kernel=self.kernel)


class ConvForward(wiring.Component):
    """The forward phase of :class:`ConvForwardGeometry` (module docstring)."""

    def __init__(self, *, geometry: ConvForwardGeometry):
        if not isinstance(geometry, ConvForwardGeometry):
            raise TypeError(f"geometry must be a ConvForwardGeometry, not {type(geometry).__name__}")
        self.geometry = g = geometry
        e, p = g.engine, g.pooling
        ys = data.ArrayLayout(signed(e.y_width), g.lanes_out)
        super().__init__({
            "x_write": In(stream.Signature(data.StructLayout({"addr": range(max(g.map_depth, 2)),
                                                              "data": g.map_width}))),
            "w_load": In(stream.Signature(e.w_layout)),
            "start": In(1),
            "y": Out(stream.Signature(e.y_layout)),
            "pooled": Out(stream.Signature(data.StructLayout({"y": ys, "idx": data.ArrayLayout(
                p.index_width, g.lanes_out)}))),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        g = self.geometry
        e = g.engine
        K, li = e.words, e.lanes_in
        m.submodules.gen = gen = WindowAddressGenerator(geometry=g.generator)
        m.submodules.window = win = RowWindow(geometry=g.window)
        m.submodules.engine = eng = XnorEngine(n_in=e.n_in, n_out=e.n_out, lanes_in=li, lanes_out=e.lanes_out)
        m.submodules.pool = pool = MaxPool(geometry=g.pooling)

        # the map: written by x_write, read by the generator's addresses (synchronous, non-transparent)
        m.submodules.map = fmap = Memory(shape=g.map_width, depth=g.map_depth, init=[])
        wr = fmap.write_port()
        rd = fmap.read_port(transparent_for=())
        m.d.comb += [
            wr.addr.eq(self.x_write.payload.addr),
            wr.data.eq(self.x_write.payload.data),
            wr.en.eq(self.x_write.valid),
            self.x_write.ready.eq(1),
        ]
        wiring.connect(m, wiring.flipped(self.w_load), eng.w_load)

        # start / busy: from start until the batch's last Y beat has left on both outputs
        running = Signal()
        beats = g.batch * g.out_height * g.out_width * e.groups
        count = Signal(range(beats))
        m.d.comb += [gen.start.eq(self.start & ~running), self.busy.eq(running)]
        with m.If(self.start & ~running):
            m.d.sync += [running.eq(1), count.eq(0)]

        # the read stage: one beat held on the read port's output until the window takes it
        held = Signal()
        flags = Signal(data.StructLayout({"valid": 1, "row_last": 1, "last": 1}))
        advance = Signal()
        m.d.comb += [
            advance.eq(~held | win.i.ready),
            gen.o.ready.eq(advance),
            rd.addr.eq(gen.o.payload.addr),
            rd.en.eq(advance),
            win.i.valid.eq(held),
            win.i.payload.data.eq(rd.data),
            win.i.payload.valid.eq(flags.valid),
            win.i.payload.row_last.eq(flags.row_last),
            win.i.payload.last.eq(flags.last),
        ]
        with m.If(advance):
            m.d.sync += [held.eq(gen.o.valid), flags.valid.eq(gen.o.payload.valid),
                         flags.row_last.eq(gen.o.payload.row_last), flags.last.eq(gen.o.payload.last)]

        # the window cut into the engine's K words (the window's payload holds until its last word is taken)
        bits = Signal(K * li)
        m.d.comb += bits.eq(win.o.payload.bits)
        if K == 1:
            m.d.comb += [eng.x.payload.data.eq(bits), eng.x.payload.last.eq(1), eng.x.valid.eq(win.o.valid),
                         win.o.ready.eq(eng.x.ready)]
        else:
            word = Signal(range(K))
            final = Signal()
            m.d.comb += [
                final.eq(word == K - 1),
                eng.x.payload.data.eq(bits.word_select(word, li)),
                eng.x.payload.last.eq(final),
                eng.x.valid.eq(win.o.valid),
                win.o.ready.eq(eng.x.ready & final),
            ]
            with m.If(eng.x.valid & eng.x.ready):
                m.d.sync += word.eq(word + 1)
                with m.If(final):
                    m.d.sync += word.eq(0)

        # the fork: each Y beat goes once to ``y`` and once to the pool, whichever takes it first
        sent_y = Signal()
        sent_pool = Signal()
        take_y = self.y.valid & self.y.ready
        take_pool = pool.i.valid & pool.i.ready
        done = Signal()
        m.d.comb += [
            self.y.valid.eq(eng.y.valid & ~sent_y),
            self.y.payload.eq(eng.y.payload),
            pool.i.valid.eq(eng.y.valid & ~sent_pool),
            pool.i.payload.y.eq(eng.y.payload.y),
            done.eq((sent_y | take_y) & (sent_pool | take_pool)),
            eng.y.ready.eq(done),
        ]
        with m.If(eng.y.valid):
            with m.If(done):
                m.d.sync += [sent_y.eq(0), sent_pool.eq(0), count.eq(count + 1)]
                with m.If(count == beats - 1):
                    m.d.sync += running.eq(0)
            with m.Else():
                m.d.sync += [sent_y.eq(sent_y | take_y), sent_pool.eq(sent_pool | take_pool)]
        wiring.connect(m, pool.o, wiring.flipped(self.pooled))
        return m
