"""The ``upd j`` phase of one conv layer, ``sgn(dW)`` (docs/architecture.md 10.3): the correlation of the layer's
input map with the po2 codes of its ``dY`` over the batch and the positions, on the dense dW engine.

``dW[o, c, i, j] = sum_{b, h, v} x[b, c, h + i, v + j] d[b, o, h, v]`` (docs/arithmetic.md 5.5) is the dense
``X^T dY_po2`` of the im2col rows: a conv layer is a dense layer of ``n = B Ho Wo`` "samples" whose input row is
the window of position ``(b, h, v)`` (``N = Ci k^2`` bits, the contract's ``(c, i, j)`` order) and whose codes are
that position's ``Co`` codes. So the dW unit of :class:`rtl_gen.po2_backward.Po2Backward` runs unchanged, built for
``batch = n`` (its accumulators' widths from :mod:`sim.hw.widths` for ``n``), and this unit is its tile reader over
windows. Dataflow, one beat a cycle at every stage::

    map (block RAM, as ConvForward's: one row of W Ci bits per image row (b, r) at b H + r)
      -> WindowAddressGenerator -> the map's read port -> RowWindow (the windows of the batch, positions in order)
      -> word k of the window (li bits)  +  the codes of group g of the same position (code buffer, n G beats)
      -> Po2Backward's dW unit (xdy: one position a beat)  -> ``dw``: sgn(dW) of one bank-row tile a beat

The dW unit takes every tile ``(g, k)`` (bank-row order, ``g`` outer) in ``dw_passes`` passes over the batch, each
reading the tile's ``n`` operands again; here each pass is one sweep of the generator over the map (the generator
restarts as soon as it has issued the last read of the previous sweep, so the sweeps follow one another without a
gap at the register window). The window's other words and the other groups' codes are not used in that sweep:
``G K P`` sweeps a batch, each at the register window's rate (``k + Wo`` cycles an output row).

With ``hw.dw_window`` (``window > 0``) the codes pass through :class:`rtl_gen.code_window.CodeWindow` on the way
to the engine: each channel's largest field is tracked while the codes are written (over the batch and the
positions, as :func:`sim.hw.arith.dw_window_ternary` takes it for a conv layer), and the codes read are rewritten
to the ternary ``t`` (field 1 or the zero code); the engine's exact sums are then ``X^T t``.

Ports: ``x_write`` (the map's words, as :class:`rtl_gen.conv_forward.ConvForward`'s; always ready), ``codes``
(the layer's codes, ``n G`` beats in the order ``(b, h, v, g)``, each ``lanes_out`` codes; ready while not
``busy``; write both before ``start``), ``start`` (a pulse; ignored while ``busy``), ``dw`` (the dW unit's
:func:`rtl_gen.weight_memory.grad_layout` beats, one per bank row ``g K + k``), ``busy`` (from ``start`` until the
last ``dw`` beat has left).

``same`` padding: a padded term of ``dW`` is 0 (docs/arithmetic.md 5.5), which the engine's +-1 activations cannot
give. Each window goes to the engine twice with its position's codes, its padding bits 0 (-1) the first time
(as the register window loads them) and 1 (+1) the second: a padding term then adds ``-d + d = 0`` and every real
term ``2 x d``, so the engine, built for a batch of ``2 n`` (one more accumulator bit than ``sim.hw.widths`` gives
for ``n``), sums ``2 dW``, of the same sign. It costs ``Wo`` more cycles an output row.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from amaranth import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .code_window import CodeWindow
from .conv_forward import ConvForwardGeometry, map_to_window
from .conv_window import RowWindow, WindowAddressGenerator
from .po2_backward import Po2Backward, Po2Geometry
from .weight_memory import grad_layout

__all__ = ["ConvUpdate", "ConvUpdateGeometry"]


@dataclass(frozen=True, kw_only=True)
class ConvUpdateGeometry:
    """``conv``: the layer's map, kernel and lanes (:class:`ConvForwardGeometry`; its pool is not used, but it
    needs maps of at least 2x2 positions); ``po2``: the dW engine's geometry (``bank`` = ``conv.engine``, ``batch``
    = ``n = B Ho Wo``, one position a beat, no dX unit; fabric accumulators, or with ``dw_dsp`` (``hw.dw_dsp``) the
    unit's DSP48 multiply-accumulates); ``window``: ``hw.dw_window`` (0: the po2 codes)."""

    conv: ConvForwardGeometry
    po2: Po2Geometry
    window: int = 0

    def __post_init__(self):
        c, p = self.conv, self.po2
        if p.bank != c.engine:
            raise ValueError(f"po2.bank {p.bank} is not the conv layer's engine geometry {c.engine}")
        if p.batch != self.copies * self.positions:
            raise ValueError(f"po2.batch ({p.batch}) must be {self.copies} n = {self.copies} B Ho Wo "
                             f"(each window {self.copies} times)")
        if p.x_max != 1 or p.lanes_b != 1 or p.dx_width or p.dx_dsp:
            raise ValueError("po2 must be binary input (x_max 1), lanes_b 1, no dX unit (dx_dsp false)")
        if not 0 <= self.window <= 255:
            raise ValueError(f"window (hw.dw_window) must be in 0..255, not {self.window}")
        if bool(self.window) != p.dw_ternary:
            raise ValueError(f"window {self.window} and po2.dw_ternary {p.dw_ternary} disagree")

    @classmethod
    def from_config(cls, cfg, layer_index: int, *, lanes_in: int, lanes_out: int,
                    dw_passes: int | None = None) -> ConvUpdateGeometry:
        """Weight layer ``layer_index`` of ``cfg``: a conv layer with binary input; with ``same`` padding the
        engine takes ``2 n`` beats a pass and its accumulators one more bit (module docstring)."""
        layers = cfg.weight_layers()
        if not 0 <= layer_index < len(layers):
            raise ValueError(f"layer_index must be in 0..{len(layers) - 1}, not {layer_index}")
        s = layers[layer_index]
        if s.spec.type != "conv":
            raise ValueError(f"weight layer {layer_index} is a {s.spec.type} layer; ConvUpdate builds a conv layer")
        ci, h, w = s.in_shape
        conv = ConvForwardGeometry(batch=cfg.train.batch_size, channels=ci, height=h, width=w,
                                   out_channels=s.out_channels, lanes_in=lanes_in, lanes_out=lanes_out,
                                   kernel=s.spec.kernel, padding=s.spec.padding)
        po2 = Po2Geometry.from_config(cfg, layer_index, lanes_in=lanes_in, lanes_out=lanes_out, lanes_b=1,
                                      dw_passes=dw_passes, dx_dsp=False)
        # every position's codes (a maxpool before BN routes the pooled positions' codes to them, the rest 0), so
        # the engine's batch is B Ho Wo, not the BN's n; the dW width of sim.hw.widths is over every position
        po2 = replace(po2, dx_width=0, batch=conv.batch * conv.out_height * conv.out_width)
        if conv.pad:
            po2 = replace(po2, batch=2 * po2.batch, dw_width=po2.dw_width + 1)
        return cls(conv=conv, po2=po2, window=int(cfg.hw.dw_window or 0))

    @property
    def positions(self) -> int:
        """``n = B Ho Wo``."""
        return self.conv.batch * self.conv.out_height * self.conv.out_width

    @property
    def copies(self) -> int:
        """Times each window goes to the engine: 2 with ``same`` padding (module docstring), else 1."""
        return 2 if self.conv.pad else 1

    @property
    def code_beats(self) -> int:
        """Beats of the ``codes`` input (and words of the code buffer): ``n G``."""
        return self.positions * self.conv.engine.groups

    @property
    def sweeps(self) -> int:
        """Sweeps of the generator over the map: one per tile and pass, ``G K P``."""
        return self.conv.engine.depth * self.po2.dw_passes

    def code_beats_of(self, neg, field) -> list[list[tuple[int, int]]]:
        """The ``codes`` beats for codes ``[B, Co, Ho, Wo]`` (``neg``, ``field``): per position ``(b, h, v)``
        and group, ``lanes_out`` ``(field, neg)`` pairs (padding lanes ``(0, 0)``)."""
        c = self.conv
        L, G = c.lanes_out, c.engine.groups
        rows_f = np.asarray(field).transpose(0, 2, 3, 1).reshape(-1, c.out_channels)
        rows_n = np.asarray(neg).transpose(0, 2, 3, 1).reshape(-1, c.out_channels)
        if rows_f.shape[0] != self.positions:
            raise ValueError(f"codes have {rows_f.shape[0]} positions; expected n = {self.positions}")
        out = []
        for f, s in zip(rows_f, rows_n, strict=True):
            for g in range(G):
                out.append([(int(f[o]), int(s[o])) if o < c.out_channels else (0, 0)
                            for o in range(g * L, g * L + L)])
        return out

    def unpack(self, beats: list[int]) -> np.ndarray:
        """``sgn(dW)`` in the weights' layout ``[Co, Ci, k, k]`` (int8) from the ``dw`` payloads."""
        c = self.conv
        full = self.po2.unpack_dw(beats)  # [Ci k k, Co]
        return np.ascontiguousarray(full.T.reshape(c.out_channels, c.channels, c.kernel, c.kernel))

    def cycles(self) -> int:
        """Cycles from ``start`` to the last ``dw`` transfer, both included, with no backpressure
        (:func:`rtl_gen.cycle_model.conv_update_cycles`)."""
        from .cycle_model import conv_update_cycles

        return conv_update_cycles(self)


class ConvUpdate(wiring.Component):
    """``sgn(dW)`` of one conv layer (:class:`ConvUpdateGeometry`, module docstring)."""

    def __init__(self, *, geometry: ConvUpdateGeometry):
        if not isinstance(geometry, ConvUpdateGeometry):
            raise TypeError(f"geometry must be a ConvUpdateGeometry, not {type(geometry).__name__}")
        self.geometry = g = geometry
        c = g.conv
        super().__init__({
            "x_write": In(stream.Signature(data.StructLayout({"addr": range(max(c.map_depth, 2)),
                                                              "data": c.map_width}))),
            "codes": In(stream.Signature(data.StructLayout({
                "code": data.ArrayLayout(g.po2.code_layout, c.lanes_out)}))),
            "start": In(1),
            "dw": Out(stream.Signature(grad_layout(c.engine))),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        g = self.geometry
        c, e = g.conv, g.conv.engine
        K, G, li, P, n, k2 = e.words, e.groups, e.lanes_in, g.po2.dw_passes, g.positions, c.kernel ** 2
        m.submodules.gen = gen = WindowAddressGenerator(geometry=c.generator)
        m.submodules.window = win = RowWindow(geometry=c.window)
        m.submodules.engine = eng = Po2Backward(geometry=g.po2)

        map_to_window(m, c, self.x_write, gen, win)  # the map and its read stage, as ConvForward's

        # the code buffer (block RAM): written in the order (b, h, v, g), read at position * G + g; the read port
        # takes the next beat's address, so its registered data is the current beat's codes
        codes = data.ArrayLayout(g.po2.code_layout, c.lanes_out)
        m.submodules.code_buf = cbuf = Memory(shape=codes, depth=max(g.code_beats, 2), init=[])
        cw = cbuf.write_port()
        cr = cbuf.read_port(transparent_for=())
        running = Signal()
        w_addr = Signal(range(max(g.code_beats, 2)))
        take_code = Signal()
        m.d.comb += [
            self.codes.ready.eq(~running),
            take_code.eq(self.codes.valid & ~running),
            cw.addr.eq(w_addr),
            cw.data.eq(self.codes.payload.code),
            cw.en.eq(take_code),
        ]
        with m.If(take_code):
            m.d.sync += w_addr.eq(Mux(w_addr == g.code_beats - 1, 0, w_addr + 1))

        # start / busy; the generator restarts for each of the G K P sweeps
        sweeps = Signal(range(g.sweeps + 1))  # sweeps started
        dw_last = Signal()
        m.d.comb += [
            dw_last.eq(self.dw.valid & self.dw.ready & self.dw.payload.last),
            self.busy.eq(running),
            gen.start.eq(running & ~gen.busy & (sweeps != g.sweeps)),
        ]
        with m.If(self.start & ~running):
            m.d.sync += [running.eq(1), sweeps.eq(0)]
        with m.Elif(dw_last):
            m.d.sync += running.eq(0)
        with m.If(gen.start):
            m.d.sync += sweeps.eq(sweeps + 1)

        # the operand beats: word k of each window with the codes of group g of its position
        k = Signal(range(max(K, 2)))
        gr = Signal(range(max(G, 2)))
        pas = Signal(range(max(P, 2)))
        pos = Signal(range(max(n, 2)))
        c_addr = Signal(range(max(g.code_beats, 2)))  # pos G + gr
        c_next = Signal.like(c_addr)
        bits = Signal(K * li)
        take = Signal()  # the window leaves (its last copy is taken)
        pos_last, pass_last, k_last, g_last = pos == n - 1, pas == P - 1, k == K - 1, gr == G - 1
        if g.copies == 1:
            m.d.comb += [bits.eq(win.o.payload.bits), win.o.ready.eq(eng.xdy.ready)]
        else:  # same padding: the window twice, its padding bits 0, then 1 (the mask's clear bits)
            second = Signal()
            pad_bits = Signal(c.window.window_bits)
            for ch in range(c.channels):
                m.d.comb += pad_bits[ch * k2:(ch + 1) * k2].eq(~win.o.payload.mask)
            m.d.comb += [bits.eq(Mux(second, win.o.payload.bits | pad_bits, win.o.payload.bits)),
                         win.o.ready.eq(eng.xdy.ready & second)]
            with m.If(win.o.valid & eng.xdy.ready):
                m.d.sync += second.eq(~second)
        m.d.comb += [
            eng.xdy.valid.eq(win.o.valid),
            take.eq(win.o.valid & win.o.ready),
            eng.xdy.payload.x[0].eq(bits.word_select(k, li) if K > 1 else bits),
            eng.xdy.payload.last.eq(pos_last),
            cr.addr.eq(c_next),
        ]
        if g.window:
            m.submodules.code_window = cwin = CodeWindow(lanes=c.lanes_out, groups=G, code_bits=g.po2.dy_bits,
                                                         window=g.window)
            m.d.comb += [
                cwin.clear.eq(dw_last),
                cwin.track.eq(take_code),
                cwin.track_codes.eq(self.codes.payload.code),
                cwin.advance.eq(take & pos_last & pass_last & k_last),
                cwin.codes_in.eq(cr.data),
                eng.xdy.payload.dy[0].eq(cwin.codes_out),
            ]
        else:
            m.d.comb += eng.xdy.payload.dy[0].eq(cr.data)
        m.d.comb += c_next.eq(c_addr)
        m.d.sync += c_addr.eq(c_next)
        with m.If(take):
            m.d.sync += pos.eq(pos + 1)
            m.d.comb += c_next.eq(c_addr + G)
            with m.If(pos_last):
                m.d.sync += [pos.eq(0), pas.eq(pas + 1)]
                m.d.comb += c_next.eq(gr)
                with m.If(pass_last):
                    m.d.sync += [pas.eq(0), k.eq(k + 1)]
                    with m.If(k_last):
                        m.d.sync += [k.eq(0), gr.eq(Mux(g_last, 0, gr + 1))]
                        m.d.comb += c_next.eq(Mux(g_last, 0, gr + 1))
        wiring.connect(m, eng.dw, wiring.flipped(self.dw))
        return m
