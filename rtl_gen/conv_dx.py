"""The ``dx j`` phase of one conv layer (docs/architecture.md 10.3): ``dX``, the transposed convolution of the layer's
po2 codes with its weights, on the dense dX engine.

``dX[b, c, h, v] = sum_{o, i, j} w[o, c, i, j] d[b, o, h + pad - i, v + pad - j]`` (docs/arithmetic.md 5.5, golden
function :func:`sim.hw.arith.po2_backward_dx_conv`) is a correlation of the code map, padded by ``k - 1 - pad``
zero codes, with the kernel flipped in both spatial axes: the window of codes at input position ``(b, h, v)``
(``Co k^2`` codes, window row ``i'`` and column ``j'`` reading code position ``(h + i' - (k - 1 - pad), v + j' - (k -
1 - pad))``) against ``W'[c, o k^2 + i' k + j'] = w[o, c, k - 1 - i', k - 1 - j']``. So it is the dense ``dY_po2 W'^T``
of a layer with ``n_in = Ci`` inputs and ``n_out = Co k^2`` outputs whose "samples" are the ``B H W`` input
positions, and :class:`rtl_gen.po2_backward.Po2Backward`'s dX unit (``_Dx``, alone: no dW unit) runs unchanged,
built for those sizes. A padding code is the zero code (field 0): its addend is 0, so padding needs no correction
(unlike the forward windows' ``-1`` bits). Dataflow::

    codes (n G beats, order (b, h, v, g), lanes codes each) -> code buffer (block RAM, as ConvUpdate's: one code
      row (b, h) is the Wo G consecutive beats at (b Ho + h) Wo G)
      -> WindowAddressGenerator (transposed: padding k - 1 - pad, the code rows of every dX row; row_words = Wo G)
      -> the buffer's read port -> a row packer (the Wo G beats of a code row as one RowWindow row: pixel v holds
         the G lanes codes of position v, channel-fastest as RowWindow takes it)
      -> RowWindow (the W windows of each dX row; pixel of G lanes dy_bits bit-channels)
      -> the window's Co k^2 codes in the order (o, i', j') cut into G' = ceil(Co k^2 / dx_lanes) engine beats
      -> Po2Backward's dX unit (bank: n_in = Ci, n_out = Co k^2, lanes_in = lanes, lanes_out = dx_lanes; its
         weight banks here, W' loaded through ``w_load``)
      -> ``dx``: per dX position (b, h, v) the K' = ceil(Ci / lanes) words of ``lanes`` values

The engine's ``lanes_in`` is the codes' ``lanes`` (the system's ``lanes_out``) and ``dx_passes`` is 1, so each
``dx`` beat is one channel group of the layer below, in the order ``(b, h, v, g)``: what the layer below's BN
backward (through its pool's routing, :class:`rtl_gen.conv_backward.ConvLayerBackward`'s ``pooled`` input) takes.
Its ``lanes_out`` (``dx_lanes``, default the system's ``lanes_in``: the transposed tile, the adders of a dense
layer's dX unit) sets the rate: ``K' G'`` engine cycles a dX position.

Timing: :class:`rtl_gen.conv_window.RowWindow` alternates loading its ``k`` rows and emitting windows, and each row
is ``Wo G`` buffer reads here, so a dX row costs its ``k`` code rows' reads (less the one the packer holds) and its
``W`` windows of ``K' G'`` engine cycles (:func:`rtl_gen.cycle_model.conv_dx_cycles`).

Ports: ``codes`` (the layer's codes, ``n G`` beats in the order ``(b, h, v, g)``, ``lanes`` codes each; ready
while not ``busy``; write before ``start``), ``w_load`` (the engine's weight banks:
:meth:`ConvDxGeometry.weight_beats` of the layer's ``w``; always ready), ``start`` (a pulse; ignored while
``busy``), ``dx`` (``lanes`` signed values a beat, ``last`` on the batch's last beat), ``busy`` (from ``start``
until the last ``dx`` beat has left).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from amaranth import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from sim.hw.arith import ArithParams
from sim.hw.widths import layer_bounds

from .conv_forward import map_to_window
from .conv_window import RowWindow, RowWindowGeometry, WindowAddressGenerator, WindowGeometry
from .po2_backward import Po2Geometry, _Dx
from .xnor_engine import XnorGeometry

__all__ = ["ConvDx", "ConvDxGeometry", "RowPacker"]


@dataclass(frozen=True, kw_only=True)
class ConvDxGeometry:
    """One conv layer's ``dx`` phase: ``batch`` input maps of ``channels x height x width`` (the dX map),
    ``out_channels`` codes a position of the ``out_height x out_width`` code map, ``kernel x kernel`` kernels,
    stride 1, ``padding`` ("valid" or "same"); ``lanes`` codes a ``codes`` beat and dX values a ``dx`` beat (the
    system's ``lanes_out``), ``dx_lanes`` codes an engine beat; ``dy_bits`` (``approx.dy_bits``) and ``dx_width``
    (the dX register bits of :mod:`sim.hw.widths`)."""

    batch: int
    channels: int
    height: int
    width: int
    out_channels: int
    lanes: int
    dx_lanes: int
    dy_bits: int
    dx_width: int
    kernel: int = 3
    padding: str = "valid"

    def __post_init__(self):
        # the parts check their own fields (one line each, naming the field and its range)
        _ = (self.generator, self.window, self.po2)

    @classmethod
    def from_config(cls, cfg, layer_index: int, *, lanes_in: int, lanes_out: int,
                    dx_lanes: int | None = None) -> ConvDxGeometry:
        """Weight layer ``layer_index`` of ``cfg``, a conv layer above the first (the network's input takes no
        gradient); ``lanes = lanes_out``, ``dx_lanes`` defaults to ``lanes_in``."""
        layers = cfg.weight_layers()
        kinds = [f"a {x.spec.type} layer" for x in layers]
        kinds[0] = "the first layer, which has no dX (the network's input takes no gradient)"
        if layer_index not in range(1, len(layers)) or layers[layer_index].spec.type != "conv":
            what = kinds[layer_index] if layer_index in range(len(layers)) else "not a weight layer"
            raise ValueError(f"layer_index {layer_index} is {what}; ConvDx builds a conv layer in 1..{len(layers) - 1}")
        s = layers[layer_index]
        ci, h, w = s.in_shape
        return cls(batch=cfg.train.batch_size, channels=ci, height=h, width=w, out_channels=s.out_channels,
                   lanes=lanes_out, dx_lanes=lanes_in if dx_lanes is None else dx_lanes,
                   dy_bits=ArithParams.from_config(cfg).k, dx_width=layer_bounds(cfg)[layer_index].widths()["dX"],
                   kernel=s.spec.kernel, padding=s.spec.padding)

    @property
    def _forward(self) -> tuple[WindowGeometry, RowWindowGeometry]:
        """The forward windows' rows and columns (the layer's own padding): the code map's shape."""
        rows = WindowGeometry.for_conv(batch=self.batch, height=self.height, kernel=self.kernel, padding=self.padding)
        return rows, RowWindowGeometry(channels=1, width=self.width, kernel=self.kernel, pad=rows.pad)

    @property
    def pad(self) -> int:
        """The convolution's own padding (0 or ``(k - 1) / 2``); the generator's is ``k - 1 - pad``."""
        return self._forward[0].pad

    @property
    def out_height(self) -> int:
        return self._forward[0].out_height

    @property
    def out_width(self) -> int:
        return self._forward[1].out_width

    @property
    def groups(self) -> int:
        """``G``: ``codes`` beats a code position."""
        return -(-self.out_channels // self.lanes)

    @property
    def words(self) -> int:
        """``K' = ceil(Ci / lanes)``: ``dx`` beats a dX position (the layer below's channel groups)."""
        return self.po2.bank.words

    @property
    def row_words(self) -> int:
        """Buffer beats of a code row: ``Wo G``."""
        return self.out_width * self.groups

    @property
    def generator(self) -> WindowGeometry:
        return WindowGeometry.for_conv(batch=self.batch, height=self.out_height, kernel=self.kernel,
                                       padding=self.padding, row_words=self.row_words, transposed=True)

    @property
    def window(self) -> RowWindowGeometry:
        return RowWindowGeometry(channels=self.groups * self.lanes * self.dy_bits, width=self.out_width,
                                 kernel=self.kernel, pad=self.kernel - 1 - self.pad)

    @property
    def po2(self) -> Po2Geometry:
        """The dX engine's geometry (``batch`` and ``dw_width`` unused: no dW unit is built)."""
        bank = XnorGeometry(n_in=self.channels, n_out=self.out_channels * self.kernel ** 2, lanes_in=self.lanes,
                            lanes_out=self.dx_lanes)
        return Po2Geometry(bank=bank, batch=self.positions, dy_bits=self.dy_bits, x_max=1, lanes_b=1,
                           dx_width=self.dx_width, dw_width=2)

    @property
    def positions(self) -> int:
        """dX positions ``B H W`` (the engine's rows)."""
        return self.batch * self.height * self.width

    @property
    def code_beats(self) -> int:
        """Beats of the ``codes`` input (and words of the code buffer): ``B Ho Wo G``."""
        return self.batch * self.out_height * self.out_width * self.groups

    @property
    def dx_beats(self) -> int:
        return self.positions * self.words

    # what map_to_window takes (the code buffer is the generator's map)
    @property
    def map_width(self) -> int:
        return self.lanes * self.dy_bits

    @property
    def map_depth(self) -> int:
        return self.code_beats

    @property
    def code_layout(self) -> data.StructLayout:
        return self.po2.code_layout

    @property
    def dx_layout(self) -> data.StructLayout:
        return data.StructLayout({"dx": data.ArrayLayout(signed(self.dx_width), self.lanes), "last": 1})

    # --- host side (tests and the controller model) ---

    def code_beats_of(self, neg, field) -> list[list[tuple[int, int]]]:
        """The ``codes`` beats of codes ``[B, Co, Ho, Wo]``: per position ``(b, h, v)`` and group, ``lanes``
        ``(field, neg)`` pairs (padding lanes ``(0, 0)``)."""
        f, s = np.asarray(field, np.int64), np.asarray(neg, np.int64)
        shape = (self.batch, self.out_channels, self.out_height, self.out_width)
        if f.shape != shape or s.shape != shape:
            raise ValueError(f"codes have shape {f.shape}; expected {shape}")
        pad = self.groups * self.lanes - self.out_channels
        both = np.stack([f, s], axis=-1).transpose(0, 2, 3, 1, 4)  # b, h, v, o, (field, neg)
        both = np.pad(both, ((0, 0), (0, 0), (0, 0), (0, pad), (0, 0))).reshape(-1, self.lanes, 2)
        return [[(int(a), int(b)) for a, b in beat] for beat in both]

    def transposed_weights(self, w) -> np.ndarray:
        """``W' [Ci, Co k^2]``: ``W'[c, o k^2 + i k + j] = w[o, c, k - 1 - i, k - 1 - j]`` (the kernel flipped)."""
        w = np.asarray(w)
        shape = (self.out_channels, self.channels, self.kernel, self.kernel)
        if w.shape != shape:
            raise ValueError(f"weights have shape {w.shape}; expected {shape}")
        return np.ascontiguousarray(w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)).reshape(self.channels, -1)

    def weight_beats(self, w) -> list[tuple[int, int, int]]:
        """``(lane, addr, data)`` ``w_load`` beats for the layer's weights ``w [Co, Ci, k, k]`` (+-1 or bits)."""
        return self.po2.bank.weight_beats(self.transposed_weights(w))

    def unpack(self, beats: list[dict]) -> np.ndarray:
        """``dX [B, Ci, H, W]`` from the ``dx`` beats (``{"dx": values, "last": flag}``); checks ``last`` and
        that the padding lanes are 0."""
        if len(beats) != self.dx_beats:
            raise ValueError(f"{len(beats)} dx beats; expected {self.dx_beats}")
        last = [int(b["last"]) for b in beats]
        if last != [0] * (len(beats) - 1) + [1]:
            raise AssertionError("dx last flag does not mark the batch's last beat only")
        vals = np.asarray([list(b["dx"]) for b in beats], np.int64).reshape(self.positions, -1)
        if vals[:, self.channels:].any():
            raise AssertionError("dx padding lanes are not 0")
        dx = vals[:, : self.channels].reshape(self.batch, self.height, self.width, self.channels)
        return np.ascontiguousarray(dx.transpose(0, 3, 1, 2))

    def cycles(self) -> int:
        """The cycle of the last ``dx`` transfer counted from ``start``'s, with no backpressure
        (:func:`rtl_gen.cycle_model.conv_dx_cycles`)."""
        from .cycle_model import conv_dx_cycles

        return conv_dx_cycles(self)


class RowPacker(wiring.Component):
    """``words`` consecutive beats of ``width`` bits (a code row read word by word) as one beat of ``words width``
    bits, the first beat in the low bits, with the flags of the row's last beat (:class:`RowWindow`'s input
    layout). It takes the next row's first beat in the cycle its row leaves, so rows follow one another every
    ``words`` cycles."""

    def __init__(self, *, width: int, words: int):
        self.width, self.words = width, words
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({"data": width, "valid": 1, "row_last": 1, "last": 1}))),
            "o": Out(stream.Signature(data.StructLayout({"data": width * words, "valid": 1, "row_last": 1,
                                                         "last": 1}))),
        })

    def elaborate(self, platform):
        m = Module()
        wb, n = self.width, self.words
        row = Signal(wb * n)
        count = Signal(range(max(n, 2)))
        full = Signal()
        take = Signal()
        m.d.comb += [
            self.o.valid.eq(full),
            self.o.payload.data.eq(row),
            self.i.ready.eq(~full | self.o.ready),
            take.eq(self.i.valid & self.i.ready),
        ]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += full.eq(0)
        with m.If(take):
            m.d.sync += row.eq(Cat(row[wb:], self.i.payload.data) if n > 1 else self.i.payload.data)
            with m.If(count == n - 1):
                m.d.sync += [count.eq(0), full.eq(1), self.o.payload.valid.eq(self.i.payload.valid),
                             self.o.payload.row_last.eq(self.i.payload.row_last),
                             self.o.payload.last.eq(self.i.payload.last)]
            with m.Else():
                m.d.sync += count.eq(count + 1)
        return m


class ConvDx(wiring.Component):
    """``dX`` of one conv layer (:class:`ConvDxGeometry`, module docstring)."""

    def __init__(self, *, geometry: ConvDxGeometry):
        if not isinstance(geometry, ConvDxGeometry):
            raise TypeError(f"geometry must be a ConvDxGeometry, not {type(geometry).__name__}")
        self.geometry = g = geometry
        super().__init__({
            "codes": In(stream.Signature(data.StructLayout({"code": data.ArrayLayout(g.code_layout, g.lanes)}))),
            "w_load": In(stream.Signature(g.po2.bank.w_layout)),
            "start": In(1),
            "dx": Out(stream.Signature(g.dx_layout)),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        g = self.geometry
        po2 = g.po2
        bank = po2.bank
        k, cb, Co, LO = g.kernel, g.dy_bits, g.out_channels, bank.lanes_out
        m.submodules.gen = gen = WindowAddressGenerator(geometry=g.generator)
        m.submodules.packer = packer = RowPacker(width=g.map_width, words=g.row_words)
        m.submodules.window = win = RowWindow(geometry=g.window)
        m.submodules.engine = eng = _Dx([po2])
        m.d.comb += eng.layer.eq(0)

        # the code buffer, written in the order (b, h, v, g) while idle, read by the generator (map_to_window's
        # front end, the packer standing in for the register window)
        running = Signal()
        write = stream.Signature(data.StructLayout({"addr": range(max(g.map_depth, 2)), "data": g.map_width}))
        write = write.create()
        w_addr = Signal(range(max(g.code_beats, 2)))
        m.d.comb += [
            self.codes.ready.eq(~running),
            write.valid.eq(self.codes.valid & ~running),
            write.payload.addr.eq(w_addr),
            write.payload.data.eq(self.codes.payload.code),
        ]
        with m.If(write.valid):
            m.d.sync += w_addr.eq(Mux(w_addr == g.code_beats - 1, 0, w_addr + 1))
        map_to_window(m, g, write, gen, packer)
        wiring.connect(m, packer.o, win.i)

        # the engine's weight banks (W', loaded through w_load), read by the engine
        m.d.comb += self.w_load.ready.eq(1)
        load = self.w_load.payload
        for lane in range(LO):
            mem = m.submodules[f"bank{lane}"] = Memory(shape=bank.lanes_in, depth=bank.depth, init=[])
            rd, wr = mem.read_port(), mem.write_port()
            m.d.comb += [
                rd.addr.eq(eng.weights.addr), rd.en.eq(eng.weights.en), eng.weights.data[lane].eq(rd.data),
                wr.addr.eq(load.addr), wr.data.eq(load.data), wr.en.eq(self.w_load.valid & (load.lane == lane)),
            ]

        # the window's codes in the engine's order q = o k^2 + i k + j (bit t of code o at window bit
        # (o cb + t) k^2 + i k + j; the padding codes o >= Co are not taken), cut into G' beats of LO codes
        G2 = bank.groups
        bits = win.o.payload.bits
        codes = [Cat(bits[(o * cb + t) * k * k + ij] for t in range(cb)) for o in range(Co) for ij in range(k * k)]
        codes += [Const(0, cb)] * (G2 * LO - len(codes))
        beats = Cat(*codes)
        gsel = Signal(range(max(G2, 2)))
        g_last = gsel == G2 - 1
        m.d.comb += [
            eng.dy.valid.eq(win.o.valid),
            eng.dy.payload.codes.eq(beats.word_select(gsel, LO * cb) if G2 > 1 else beats),
            eng.dy.payload.last.eq(g_last),
            win.o.ready.eq(eng.dy.ready & g_last),
        ]
        with m.If(eng.dy.valid & eng.dy.ready):
            m.d.sync += gsel.eq(Mux(g_last, 0, gsel + 1))

        # the dx beats, last on the batch's last; start / busy
        pos = Signal(range(max(g.positions, 2)))
        pos_last = pos == g.positions - 1
        out = Signal()
        m.d.comb += [
            self.dx.valid.eq(eng.dx.valid),
            eng.dx.ready.eq(self.dx.ready),
            self.dx.payload.dx.eq(eng.dx.payload.dx),
            self.dx.payload.last.eq(eng.dx.payload.last & pos_last),
            out.eq(self.dx.valid & self.dx.ready),
            gen.start.eq(self.start & ~running),
            self.busy.eq(running),
        ]
        with m.If(out & eng.dx.payload.last):
            m.d.sync += pos.eq(Mux(pos_last, 0, pos + 1))
        with m.If(gen.start):
            m.d.sync += running.eq(1)
        with m.Elif(out & self.dx.payload.last):
            m.d.sync += running.eq(0)
        return m
