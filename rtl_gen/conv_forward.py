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

``same`` padding with the engine unchanged: the register window loads the padding as 0 bits (-1), so the engine's
``Y`` has ``-P`` too many, ``P`` the sum of the weights over the window's padding positions; ``P`` depends only on
the output channel and the border case (``k^2`` cases: each of the row and the column at the top / left ``pad``,
in the middle, or at the bottom / right ``pad``). Before the batch the engine runs ``k^2 + 1`` calibration windows
(:attr:`ConvForwardGeometry.calibration`): all ones, then per case ones at its padding bits; half the sum of a
case's ``Y`` and the all-ones ``Y`` is its ``P`` (a table of ``k^2 G`` beats, LUTRAM), added to every ``Y`` beat
of that case: the contract's ``Y`` (docs/arithmetic.md 3.8: padding skipped) for ``(k^2 + 1) K G`` more engine
cycles a batch (the first row's loads overlap them).

Ports: ``x_write`` (map words: ``addr`` ``b H + r``, ``data`` pixel ``v`` channel ``c`` in bit ``v Ci + c``;
always ready, write before ``start``), ``w_load`` (the engine's weight loads, :meth:`XnorGeometry.weight_beats`
of ``w.reshape(Co, N).T``), ``start`` (a pulse; ignored while ``busy``), ``y``, ``pooled``, ``busy`` (from
``start`` until the batch's last Y beat has left on both outputs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from amaranth import Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .conv_pool import MaxPool, PoolGeometry
from .conv_window import RowWindow, RowWindowGeometry, WindowAddressGenerator, WindowGeometry
from .xnor_engine import XnorEngine, XnorGeometry

__all__ = ["ConvForward", "ConvForwardGeometry", "map_to_window"]


@dataclass(frozen=True, kw_only=True)
class ConvForwardGeometry:
    """One conv layer's forward phase: ``batch`` maps of ``channels x height x width`` signs, ``out_channels``
    kernels of ``kernel x kernel``, stride 1, ``padding`` ("valid" or "same"), the engine's ``lanes_in`` /
    ``lanes_out``, ``pool x pool`` max pooling."""

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
        # the parts check their own fields (one line each, naming the field and its range)
        _ = (self.generator, self.window, self.engine, self.pooling)
        if min(self.height, self.width) < 2 * self.pad:
            raise ValueError(f"padding 'same' with kernel {self.kernel} needs maps of at least {2 * self.pad} rows "
                             f"and columns, not {self.height}x{self.width}")

    @property
    def pad(self) -> int:
        return self.generator.pad

    @property
    def calibration(self) -> list[int]:
        """The windows the engine runs before the batch with ``same`` padding (none with ``valid``): all ones,
        then per border case ``(rc, cc)`` (``rc`` the row class of an output row: ``h`` for the ``pad`` top rows,
        ``pad`` in the middle, ``2 pad - (Ho - 1 - h)`` for the bottom ones; ``cc`` the same for columns) ones
        at the window bits ``(c, i, j)`` that are padding in that case. The engine's ``Y`` of window ``1 + rc k +
        cc`` plus that of the all-ones window is twice the sum of the weights over the case's padding, ``P``; the
        window sets a padding bit to 0 (-1), so the contract's ``Y`` (padding skipped) is the engine's ``+ P``."""
        if not self.pad:
            return []
        k, pd, C = self.kernel, self.pad, self.channels

        def padded(cls: int, i: int) -> bool:  # kernel row (column) i of an output row (column) of class cls
            return i < pd - cls if cls < pd else i > k - 1 + pd - cls

        wins = [(1 << (C * k * k)) - 1]
        for rc in range(k):
            for cc in range(k):
                wins.append(sum(1 << (c * k * k + i * k + j) for c in range(C) for i in range(k) for j in range(k)
                                if padded(rc, i) or padded(cc, j)))
        return wins

    @property
    def generator(self) -> WindowGeometry:
        return WindowGeometry.for_conv(batch=self.batch, height=self.height, kernel=self.kernel,
                                       padding=self.padding)

    @property
    def window(self) -> RowWindowGeometry:
        return RowWindowGeometry(channels=self.channels, width=self.width, kernel=self.kernel, pad=self.pad)

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
        return self.height + 2 * self.pad - self.kernel + 1

    @property
    def out_width(self) -> int:
        return self.width + 2 * self.pad - self.kernel + 1

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
                                   lanes_out=self.lanes_out, kernel=self.kernel, padding=self.padding)



def map_to_window(m: Module, g: ConvForwardGeometry, x_write, gen: WindowAddressGenerator, win: RowWindow) -> None:
    """The map of ``g`` (block RAM, one row a word) written by ``x_write`` (always ready) and read at the
    generator's addresses into the register window: one read beat held on the read port's output until the window
    takes it (``ConvForward``'s and ``rtl_gen.conv_update.ConvUpdate``'s front end)."""
    # the map: written by x_write, read by the generator's addresses (synchronous, non-transparent)
    m.submodules.map = fmap = Memory(shape=g.map_width, depth=g.map_depth, init=[])
    wr = fmap.write_port()
    rd = fmap.read_port(transparent_for=())
    m.d.comb += [
        wr.addr.eq(x_write.payload.addr),
        wr.data.eq(x_write.payload.data),
        wr.en.eq(x_write.valid),
        x_write.ready.eq(1),
    ]

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

        map_to_window(m, g, self.x_write, gen, win)
        wiring.connect(m, wiring.flipped(self.w_load), eng.w_load)

        # start / busy: from start until the batch's last Y beat has left on both outputs
        running = Signal()
        beats = g.batch * g.out_height * g.out_width * e.groups
        count = Signal(range(beats))
        m.d.comb += [gen.start.eq(self.start & ~running), self.busy.eq(running)]
        with m.If(self.start & ~running):
            m.d.sync += [running.eq(1), count.eq(0)]

        # the window source: with same padding first the calibration windows, then the register window's
        cal = g.calibration
        bits = Signal(K * li)
        src_valid = Signal()
        src_taken = Signal()  # the engine takes the window's last word
        m.d.comb += src_taken.eq(eng.x.valid & eng.x.ready & eng.x.payload.last)
        if cal:
            cal_x = Signal(range(len(cal) + 1))  # the next calibration window to send; len(cal): done
            with m.If(self.start & ~running):
                m.d.sync += cal_x.eq(0)
            sending = Signal()
            m.d.comb += sending.eq(running & (cal_x < len(cal)))
            with m.Switch(cal_x):
                for n, pattern in enumerate(cal):
                    with m.Case(n):
                        m.d.comb += bits.eq(pattern)
                with m.Default():
                    m.d.comb += bits.eq(win.o.payload.bits)
            m.d.comb += [src_valid.eq(sending | win.o.valid), win.o.ready.eq(~sending & src_taken)]
            with m.If(sending & src_taken):
                m.d.sync += cal_x.eq(cal_x + 1)
        else:
            m.d.comb += [bits.eq(win.o.payload.bits), src_valid.eq(win.o.valid), win.o.ready.eq(src_taken)]

        # the window cut into the engine's K words (the window's payload holds until its last word is taken)
        m.d.comb += eng.x.valid.eq(src_valid)
        if K == 1:
            m.d.comb += [eng.x.payload.data.eq(bits), eng.x.payload.last.eq(1)]
        else:
            word = Signal(range(K))
            m.d.comb += [eng.x.payload.data.eq(bits.word_select(word, li)), eng.x.payload.last.eq(word == K - 1)]
            with m.If(eng.x.valid & eng.x.ready):
                m.d.sync += word.eq(Mux(word == K - 1, 0, word + 1))

        # with same padding: the calibration's Y beats fill the table of P, and every Y beat gets its case's P
        y_fix = Signal(data.ArrayLayout(signed(e.y_width), g.lanes_out))
        calibrating = Signal()
        if cal:
            G, L, k, pd, Ho, Wo = e.groups, g.lanes_out, g.kernel, g.pad, g.out_height, g.out_width
            lanes = data.ArrayLayout(signed(e.y_width), L)
            m.submodules.y_all = y_all = Memory(shape=lanes, depth=max(G, 2), init=[])
            m.submodules.p_table = p_table = Memory(shape=lanes, depth=k * k * G, init=[])
            all_w, all_r = y_all.write_port(), y_all.read_port(domain="comb")
            p_w, p_r = p_table.write_port(), p_table.read_port(domain="comb")
            cal_y = Signal(range(len(cal)))  # the calibration window of the Y beat
            cal_g = Signal(range(max(G, 2)))
            yh = Signal(range(max(Ho, 2)))  # the position of the Y beat: row, column, group
            yv = Signal(range(max(Wo, 2)))
            yg = Signal(range(max(G, 2)))
            with m.If(self.start & ~running):
                m.d.sync += [calibrating.eq(1), cal_y.eq(0), cal_g.eq(0), yh.eq(0), yv.eq(0), yg.eq(0)]
            take_cal = Signal()
            m.d.comb += [
                take_cal.eq(calibrating & eng.y.valid),
                all_r.addr.eq(cal_g),
                all_w.addr.eq(cal_g),
                all_w.data.eq(eng.y.payload.y),
                all_w.en.eq(take_cal & (cal_y == 0)),
                p_w.addr.eq((cal_y - 1) * G + cal_g),
                p_w.en.eq(take_cal & (cal_y != 0)),
            ]
            for lane in range(L):
                both = Signal(signed(e.y_width + 1), name=f"both{lane}")
                m.d.comb += [both.eq(eng.y.payload.y[lane] + all_r.data[lane]), p_w.data[lane].eq(both >> 1)]
            with m.If(take_cal):
                m.d.sync += cal_g.eq(Mux(cal_g == G - 1, 0, cal_g + 1))
                with m.If(cal_g == G - 1):
                    m.d.sync += cal_y.eq(cal_y + 1)
                    with m.If(cal_y == len(cal) - 1):
                        m.d.sync += calibrating.eq(0)

            def cls(pos, n):  # the row (column) class of an output row (column) of n
                return Mux(pos < pd, pos, Mux(pos >= n - pd, pos + 2 * pd + 1 - n, pd))

            rc = Signal(range(k))
            cc = Signal(range(k))
            m.d.comb += [rc.eq(cls(yh, Ho)), cc.eq(cls(yv, Wo)), p_r.addr.eq((rc * k + cc) * G + yg)]
            for lane in range(L):
                m.d.comb += y_fix[lane].eq(eng.y.payload.y[lane] + p_r.data[lane])
            with m.If(eng.y.valid & eng.y.ready & ~calibrating):
                m.d.sync += yg.eq(Mux(yg == G - 1, 0, yg + 1))
                with m.If(yg == G - 1):
                    m.d.sync += yv.eq(Mux(yv == Wo - 1, 0, yv + 1))
                    with m.If(yv == Wo - 1):
                        m.d.sync += yh.eq(Mux(yh == Ho - 1, 0, yh + 1))
        else:
            m.d.comb += y_fix.eq(eng.y.payload.y)

        # the fork: each Y beat goes once to ``y`` and once to the pool, whichever takes it first
        sent_y = Signal()
        sent_pool = Signal()
        take_y = self.y.valid & self.y.ready
        take_pool = pool.i.valid & pool.i.ready
        done = Signal()
        out = Signal()
        m.d.comb += [
            out.eq(eng.y.valid & ~calibrating),
            self.y.valid.eq(out & ~sent_y),
            self.y.payload.y.eq(y_fix),
            self.y.payload.last.eq(eng.y.payload.last),
            pool.i.valid.eq(out & ~sent_pool),
            pool.i.payload.y.eq(y_fix),
            done.eq((sent_y | take_y) & (sent_pool | take_pool)),
            eng.y.ready.eq(done | calibrating),
        ]
        with m.If(out):
            with m.If(done):
                m.d.sync += [sent_y.eq(0), sent_pool.eq(0), count.eq(count + 1)]
                with m.If(count == beats - 1):
                    m.d.sync += running.eq(0)
            with m.Else():
                m.d.sync += [sent_y.eq(sent_y | take_y), sent_pool.eq(sent_pool | take_pool)]
        wiring.connect(m, pool.o, wiring.flipped(self.pooled))
        return m
