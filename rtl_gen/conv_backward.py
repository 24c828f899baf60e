"""The first piece of a pooled conv layer's backward phase (docs/architecture.md 10.2, docs/arithmetic.md 5.5): BN
backward and max-pool backward, in the order of the layer's maxpool (``ConvLayerGeometry.before_bn``).

``before_bn`` (the maxpool pools ``Y`` before BN; ``n = B Hp Wp`` pooled positions, ``G`` groups of ``lanes``)::

    x      (x_hat of every pooled position, order (b, hp, vp, g))     -> x buffer  (n G words of lanes bits)
    pooled (dX above times the pooled mask, order (b, hp, vp, g))     -> pooled buffer (n G words; ``idx`` unused)
    then twice (BN passes 1 and 2) beat i of both buffers -> BnBackwardUnit (P1 and Q over the n pooled positions)
    -> ``p1``, ``q`` (order (b, hp, vp, g))

:class:`ConvLayerBackwardCodes` then routes the po2 codes of ``Q`` (not ``Q``) to the windows' argmax: it keeps the
``idx`` of the ``pooled`` beats and the codes of the pooled positions in two buffers, and its ``codes`` are every
position's ``(b, h, v, g)``: the window's code where the window's index ``idx`` is ``(h % p) p + (v % p)``, the
zero code (field 0) elsewhere and in the trailing rows and columns the pooling dropped (``sim.hw.arith.route_codes``).
The route starts with the first code and follows the codes, one beat a cycle.

Pooling the BN output (``n = B Ho Wo`` positions; ``Hp = Ho // p``, ``Wp = Wo // p``)::

    x      (x_hat of every position, order (b, h, v, g))          -> x buffer  (n G words of lanes bits)
    pooled (dX above times the pooled mask, and the pool's index,
            order (b, hp, vp, g))                                  -> pooled buffer (B Hp Wp G words)
    then twice (BN passes 1 and 2): per position (b, h, v) and group g the routed dx beat
        dx = pooled dx at (b, h // p, v // p) where that window's index is (h % p) p + (v % p), else 0
        (0 too in the trailing rows and columns the pooling dropped)
    -> BnBackwardUnit (P1 = dbeta and Q over all n positions) -> ``p1``, ``q``

:class:`rtl_gen.bn_unit.BnBackwardUnit` is reused unchanged, built with the conv layer's :class:`BnLayer` (its ``n``
is the unit's batch; every width follows from the layer's ``sim.hw.widths`` bounds), as
:class:`rtl_gen.conv_layer.ConvLayerForward` does for the BN forward unit. Routed beats are written nowhere: the
route is a read-side multiplexer on a buffer (:class:`Raster`; the ``p^2 - 1`` other positions read as 0).

The buffers are read combinationally (distributed RAM). The load (both inputs at once) and the two replays do not
overlap: the load takes ``max(n G, B Hp Wp G)`` cycles at full rate, then BN runs as for a dense layer of ``n``
samples (:func:`rtl_gen.cycle_model.conv_layer_backward_cycles`).

Ports: ``x`` (``x_hat``), ``pooled`` (``dx``, ``idx`` per lane), ``alpha`` (the BN unit's: ``alpha_q`` and the
zero-scale flag per channel), ``p1`` (``P1`` per channel), ``q`` (``Q`` of BN's ``n`` positions, ``last`` on a
position's last group), ``busy`` (from the first load transfer until the BN unit took the last replayed beat).

:class:`ConvLayerBackwardCodes` adds the po2 codes: :class:`rtl_gen.po2_unit.Po2Unit` unchanged, built with the same
:class:`BnLayer` but for its operand ``|Q| n`` (:func:`po2_layer`: the model's conv form folds ``n`` into the
per-channel thresholds instead; both are the exact rounding of ``log2(|Q| n / S')``), its PASS1 scratch held for
PASS2 in a FIFO of ``n G`` beats; with ``before_bn``, the route above.
"""

from __future__ import annotations

from dataclasses import replace

from amaranth import Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .bn_unit import BnBackwardUnit, BnLayer
from .conv_layer import ConvLayerGeometry
from .po2_unit import SCALE_WIDTH, Po2Unit

__all__ = ["ConvLayerBackward", "ConvLayerBackwardCodes"]


class ConvLayerBackward(wiring.Component):
    """Max-pool backward routing and BN backward of one pooled conv layer (see the module docstring).

    Parameters (keyword-only): ``geometry`` (:class:`ConvLayerGeometry`: the conv layer's shape, its pool and the
    :class:`BnLayer` of its ``n`` positions).
    """

    def __init__(self, *, geometry: ConvLayerGeometry):
        if not isinstance(geometry, ConvLayerGeometry):
            raise TypeError(f"geometry must be a ConvLayerGeometry, not {geometry!r}")
        self._g = geometry
        bn = geometry.bn
        super().__init__(
            {
                "x": In(stream.Signature(self.x_layout)),
                "pooled": In(stream.Signature(self.pooled_layout)),
                "alpha": In(stream.Signature(bn.alpha_layout)),
                "p1": Out(stream.Signature(bn.p1_layout)),
                "q": Out(stream.Signature(bn.q_layout)),
                "busy": Out(1),
            }
        )

    @property
    def geometry(self) -> ConvLayerGeometry:
        return self._g

    @property
    def idx_width(self) -> int:
        p = self._g.pooling.pool
        return max(1, (p * p - 1).bit_length())

    @property
    def x_layout(self) -> data.StructLayout:
        return data.StructLayout({"x_hat": self._g.bn.lanes})

    @property
    def pooled_layout(self) -> data.StructLayout:
        bn = self._g.bn
        return data.StructLayout({"dx": data.ArrayLayout(bn.dx_layout["dx"].shape.elem_shape, bn.lanes),
                                  "idx": data.ArrayLayout(unsigned(self.idx_width), bn.lanes)})

    def elaborate(self, platform):
        g = self._g
        bn_lay = g.bn
        pool = g.pooling
        B, G, L = g.conv.batch, bn_lay.groups, bn_lay.lanes
        Hp, Wp = pool.out_height, pool.out_width
        nx, npool = g.beats, B * Hp * Wp * G  # before_bn: both B Hp Wp G
        m = Module()
        m.submodules.bn = bn = BnBackwardUnit(layer=bn_lay)
        wiring.connect(m, wiring.flipped(self.alpha), bn.alpha)
        wiring.connect(m, bn.p1, wiring.flipped(self.p1))
        wiring.connect(m, bn.q, wiring.flipped(self.q))

        # before_bn: the index is not needed here (ConvLayerBackwardCodes routes the codes with it)
        stored = self.pooled_layout.members["dx"] if g.before_bn else self.pooled_layout
        m.submodules.x_mem = x_mem = Memory(shape=L, depth=nx, init=[])
        m.submodules.p_mem = p_mem = Memory(shape=stored, depth=npool, init=[])
        x_wr, p_wr = x_mem.write_port(), p_mem.write_port()
        x_rd, p_rd = x_mem.read_port(domain="comb"), p_mem.read_port(domain="comb")

        emit = Signal()  # 0: loading both buffers; 1: the two passes
        xa = Signal(range(nx + 1))
        pa = Signal(range(npool + 1))
        m.d.comb += [
            self.x.ready.eq(~emit & (xa != nx)),
            self.pooled.ready.eq(~emit & (pa != npool)),
            x_wr.addr.eq(xa), x_wr.data.eq(self.x.payload.x_hat), x_wr.en.eq(self.x.valid & self.x.ready),
            p_wr.addr.eq(pa), p_wr.en.eq(self.pooled.valid & self.pooled.ready),
            p_wr.data.eq(self.pooled.payload.dx if g.before_bn else self.pooled.payload),
        ]
        with m.If(x_wr.en):
            m.d.sync += xa.eq(xa + 1)
        with m.If(p_wr.en):
            m.d.sync += pa.eq(pa + 1)
        started = Signal()
        with m.If(x_wr.en | p_wr.en):
            m.d.sync += started.eq(1)
        m.d.comb += self.busy.eq(started | emit)

        # the passes: beat i of (pass, b, h, v, g) (before_bn: (pass, b, hp, vp, g), both buffers at i)
        second = Signal()
        i = Signal(range(nx))
        take = Signal()
        last = Signal()  # the pass's last beat
        with m.If(~emit & (xa == nx) & (pa == npool)):
            m.d.sync += [emit.eq(1), second.eq(0)]
        beat = Signal(bn_lay.dx_layout)
        m.d.comb += [x_rd.addr.eq(i), beat.x_hat.eq(x_rd.data)]
        if g.before_bn:
            gr = Signal(range(max(G, 2)))
            m.d.comb += [p_rd.addr.eq(i), beat.dx.eq(p_rd.data), beat.last.eq(gr == G - 1), last.eq(i == nx - 1)]
            with m.If(take):
                m.d.sync += gr.eq(Mux(gr == G - 1, 0, gr + 1))
        else:  # the route: the pooled value where the window's index names the position, else 0
            r = Raster(m, g, take)
            m.d.comb += [p_rd.addr.eq(r.pooled_addr), beat.last.eq(r.gr == G - 1), last.eq(r.last)]
            for lane in range(L):
                hit = r.in_window & (p_rd.data.idx[lane] == r.here)
                m.d.comb += beat.dx[lane].eq(Mux(hit, p_rd.data.dx[lane], 0))
        m.d.comb += [
            bn.dx.payload.eq(beat), bn.dx_replay.payload.eq(beat),
            bn.dx.valid.eq(emit & ~second), bn.dx_replay.valid.eq(emit & second),
            take.eq((bn.dx.valid & bn.dx.ready) | (bn.dx_replay.valid & bn.dx_replay.ready)),
        ]
        with m.If(take):
            m.d.sync += i.eq(Mux(last, 0, i + 1))
            with m.If(last):
                m.d.sync += second.eq(1)
                with m.If(second):  # the last replayed beat: load the next batch
                    m.d.sync += [emit.eq(0), started.eq(0), xa.eq(0), pa.eq(0)]
        return m


class Raster:
    """Counters over a pooled conv layer's output beats in the order ``(b, h, v, g)``, advanced by ``take`` and
    wrapping after the batch's ``last`` beat, with each position's window: ``pooled_addr`` (the beat of pooled
    position ``(b, h // p, v // p)`` and group ``g`` in the order ``(b, hp, vp, g)``, clamped to the last pooled
    row and column in the rows and columns the pool drops), ``in_window`` (not dropped), ``here`` (the position's
    index ``(h % p) p + (v % p)`` within its window)."""

    def __init__(self, m: Module, g: ConvLayerGeometry, take):
        p = g.pooling.pool
        B, Ho, Wo, G = g.conv.batch, g.conv.out_height, g.conv.out_width, g.bn.groups
        Hp, Wp = g.pooling.out_height, g.pooling.out_width
        b = Signal(range(max(B, 2)))
        hp, hi = Signal(range(Ho // p + 2)), Signal(range(p))
        vp, vi = Signal(range(Wo // p + 2)), Signal(range(p))
        h, v = Signal(range(max(Ho, 2))), Signal(range(max(Wo, 2)))
        self.gr = gr = Signal(range(max(G, 2)))
        self.last = Signal()
        self.in_window = Signal()
        self.here = Signal(range(p * p))
        self.pooled_addr = Signal(range(max(B * Hp * Wp * G, 2)))
        m.d.comb += [
            self.last.eq((b == B - 1) & (h == Ho - 1) & (v == Wo - 1) & (gr == G - 1)),
            self.in_window.eq((hp < Hp) & (vp < Wp)),
            self.here.eq(hi * p + vi),
            self.pooled_addr.eq(((b * Hp + Mux(hp < Hp, hp, Hp - 1)) * Wp + Mux(vp < Wp, vp, Wp - 1)) * G + gr),
        ]
        with m.If(take):
            m.d.sync += gr.eq(gr + 1)
            with m.If(gr == G - 1):
                m.d.sync += [gr.eq(0), v.eq(v + 1), vi.eq(vi + 1)]
                with m.If(vi == p - 1):
                    m.d.sync += [vi.eq(0), vp.eq(vp + 1)]
                with m.If(v == Wo - 1):
                    m.d.sync += [v.eq(0), vi.eq(0), vp.eq(0), h.eq(h + 1), hi.eq(hi + 1)]
                    with m.If(hi == p - 1):
                        m.d.sync += [hi.eq(0), hp.eq(hp + 1)]
                    with m.If(h == Ho - 1):
                        m.d.sync += [h.eq(0), hi.eq(0), hp.eq(0), b.eq(b + 1)]
                        with m.If(b == B - 1):
                            m.d.sync += b.eq(0)


def po2_layer(bn: BnLayer) -> BnLayer:
    """The conv layer's :class:`BnLayer` for :class:`Po2Unit`: its operand is the dense form's ``|Q| n``, so its
    ``po2_num`` bound is ``Q n`` (``sim.hw.widths`` gives a conv layer ``Q``, the conv form's operand with ``n`` in
    the per-channel thresholds, which the unit does not implement): ``bitlen(n)`` more bits per lane."""
    return replace(bn, bounds=replace(bn.bounds, po2_num=bn.bounds.Q * bn.batch))


class ConvLayerBackwardCodes(wiring.Component):
    """:class:`ConvLayerBackward` followed by :class:`rtl_gen.po2_unit.Po2Unit`: a pooled conv layer's ``bwd`` phase
    up to the po2 codes of its ``dY`` (docs/arithmetic.md 5.5).

    Ports: ``x``, ``pooled``, ``alpha``, ``p1`` (as :class:`ConvLayerBackward`; ``P1`` is what the beta update
    needs), ``s_eff`` (``S'`` per channel, taken before the codes' first pass), ``scale`` (the gradient scale
    exponent of the layer above's ``dX``), ``bias`` (the layer's po2 bias and unit exponent), ``codes`` (per
    position and group, order ``(b, h, v, g)``), ``busy``.
    """

    def __init__(self, *, geometry: ConvLayerGeometry, mul_steps: int = 1):
        self._bwd = ConvLayerBackward(geometry=geometry)
        self._po2 = Po2Unit(layer=po2_layer(geometry.bn), mul_steps=mul_steps)
        bn = geometry.bn
        super().__init__(
            {
                "x": In(stream.Signature(self._bwd.x_layout)),
                "pooled": In(stream.Signature(self._bwd.pooled_layout)),
                "alpha": In(stream.Signature(bn.alpha_layout)),
                "s_eff": In(stream.Signature(unsigned(bn.s_width))),
                "scale": In(signed(SCALE_WIDTH)),
                "p1": Out(stream.Signature(bn.p1_layout)),
                "bias": Out(stream.Signature(self._po2.bias_layout)),
                "codes": Out(stream.Signature(self._po2.codes_layout)),
                "busy": Out(1),
            }
        )

    @property
    def po2(self) -> Po2Unit:
        return self._po2

    def elaborate(self, platform):
        m = Module()
        m.submodules.bwd = bwd = self._bwd
        m.submodules.po2 = po2 = self._po2
        for name in ("x", "alpha"):
            wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(bwd, name))
        wiring.connect(m, wiring.flipped(self.s_eff), po2.s_eff)
        wiring.connect(m, bwd.p1, wiring.flipped(self.p1))
        wiring.connect(m, bwd.q, po2.q)
        wiring.connect(m, po2.bias, wiring.flipped(self.bias))
        m.d.comb += po2.scale.eq(self.scale)
        if self._bwd.geometry.before_bn:
            routing = self._route(m, po2)
        else:
            wiring.connect(m, wiring.flipped(self.pooled), bwd.pooled)
            wiring.connect(m, po2.codes, wiring.flipped(self.codes))
            routing = 0
        m.d.comb += self.busy.eq(bwd.busy | (po2.phase != Po2Unit.PRO) | routing)
        lay = po2.scratch_layout
        m.submodules.scratch = fifo = SyncFIFOBuffered(width=lay.size, depth=self._bwd.geometry.beats)
        m.d.comb += [
            fifo.w_data.eq(po2.scratch.payload), fifo.w_en.eq(po2.scratch.valid), po2.scratch.ready.eq(fifo.w_rdy),
            po2.scratch_in.payload.eq(fifo.r_data), po2.scratch_in.valid.eq(fifo.r_rdy),
            fifo.r_en.eq(po2.scratch_in.ready),
        ]
        return m

    def _route(self, m: Module, po2: Po2Unit):
        """before_bn: the pooled codes (order ``(b, hp, vp, g)``) into a code buffer and the pool's indices (taken
        with the ``pooled`` beats) into an index buffer, both read combinationally; ``codes`` then gives every
        position ``(b, h, v, g)`` the code of its window where the window's index names it, the zero code
        elsewhere and in the dropped rows and columns. A beat leaves once its window's code is in (the route
        follows the codes from the first one); the next batch's ``pooled`` beats wait for the route's end.
        Returns the signal that is high while codes of the batch are held."""
        g = self._bwd.geometry
        L, G = g.bn.lanes, g.bn.groups
        npool = g.beats
        code_lay = po2.codes_layout.members["code"]
        idx_lay = self._bwd.pooled_layout.members["idx"]
        m.submodules.c_mem = c_mem = Memory(shape=code_lay, depth=max(npool, 2), init=[])
        m.submodules.i_mem = i_mem = Memory(shape=idx_lay, depth=max(npool, 2), init=[])
        c_wr, i_wr = c_mem.write_port(), i_mem.write_port()
        c_rd, i_rd = c_mem.read_port(domain="comb"), i_mem.read_port(domain="comb")
        cn = Signal(range(npool + 1))  # codes in
        ia = Signal(range(npool + 1))  # indices in
        take, done = Signal(), Signal()
        bp = self._bwd.pooled
        m.d.comb += [
            bp.valid.eq(self.pooled.valid & (ia != npool)), bp.payload.eq(self.pooled.payload),
            self.pooled.ready.eq(bp.ready & (ia != npool)),
            i_wr.addr.eq(ia), i_wr.data.eq(self.pooled.payload.idx), i_wr.en.eq(self.pooled.valid & self.pooled.ready),
            po2.codes.ready.eq(cn != npool),
            c_wr.addr.eq(cn), c_wr.data.eq(po2.codes.payload.code), c_wr.en.eq(po2.codes.valid & po2.codes.ready),
        ]
        with m.If(i_wr.en):
            m.d.sync += ia.eq(ia + 1)
        with m.If(c_wr.en):
            m.d.sync += cn.eq(cn + 1)
        r = Raster(m, g, take)
        out = self.codes
        m.d.comb += [
            c_rd.addr.eq(r.pooled_addr), i_rd.addr.eq(r.pooled_addr),
            out.valid.eq(cn > r.pooled_addr), out.payload.last.eq(r.gr == G - 1),
            take.eq(out.valid & out.ready), done.eq(take & r.last),
        ]
        for lane in range(L):
            hit = r.in_window & (i_rd.data[lane] == r.here)
            m.d.comb += out.payload.code[lane].eq(Mux(hit, c_rd.data[lane], 0))
        with m.If(done):
            m.d.sync += [cn.eq(0), ia.eq(0)]
        return cn != 0
