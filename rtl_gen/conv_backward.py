"""The first piece of a pooled conv layer's backward phase (docs/architecture.md 10.2, docs/arithmetic.md 5.5):
max-pool backward (the gradient at each pooled position routed to its window's argmax) and BN backward over every
position.

Dataflow (``n = B Ho Wo`` positions, ``G`` groups of ``lanes`` channels; ``Hp = Ho // p``, ``Wp = Wo // p``)::

    x      (x_hat of every position, order (b, h, v, g))          -> x buffer  (n G words of lanes bits)
    pooled (dX above times the pooled mask, and the pool's index,
            order (b, hp, vp, g))                                  -> pooled buffer (B Hp Wp G words)
    then twice (BN passes 1 and 2): per position (b, h, v) and group g the routed dx beat
        dx = pooled dx at (b, h // p, v // p) where that window's index is (h % p) p + (v % p), else 0
        (0 too in the trailing rows and columns the pooling dropped)
    -> BnBackwardUnit (P1 = dbeta and Q over all n positions) -> ``p1``, ``q``

:class:`rtl_gen.bn_unit.BnBackwardUnit` is reused unchanged, built with the conv layer's :class:`BnLayer` (its
``n = B Ho Wo`` is the unit's batch; every width follows from the layer's ``sim.hw.widths`` bounds), as
:class:`rtl_gen.conv_layer.ConvLayerForward` does for the BN forward unit. The routed beats are written nowhere: the
route is a read-side multiplexer on the pooled buffer (the ``p^2 - 1`` other positions read as 0).

Both buffers are read combinationally (distributed RAM). The load (both inputs at once) and the two replays do not
overlap: the load takes ``max(n G, B Hp Wp G)`` cycles at full rate, then BN runs as for a dense layer of ``n``
samples (:func:`rtl_gen.cycle_model.conv_layer_backward_cycles`).

Ports: ``x`` (``x_hat``), ``pooled`` (``dx``, ``idx`` per lane), ``alpha`` (the BN unit's: ``alpha_q`` and the
zero-scale flag per channel), ``p1`` (``P1`` per channel), ``q`` (``Q`` of every position, order ``(b, h, v, g)``,
``last`` on a position's last group), ``busy`` (from the first load transfer until the BN unit took the last
replayed beat).

:class:`ConvLayerBackwardCodes` adds the po2 codes: :class:`rtl_gen.po2_unit.Po2Unit` unchanged, built with the same
:class:`BnLayer` but for its operand ``|Q| n`` (:func:`po2_layer`: the model's conv form folds ``n`` into the
per-channel thresholds instead; both are the exact rounding of ``log2(|Q| n / S')``), its PASS1 scratch held for
PASS2 in a FIFO of ``n G`` beats.
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
        p = pool.pool
        B, Ho, Wo, G, L = g.conv.batch, g.conv.out_height, g.conv.out_width, bn_lay.groups, bn_lay.lanes
        Hp, Wp = pool.out_height, pool.out_width
        nx, npool = B * Ho * Wo * G, B * Hp * Wp * G
        m = Module()
        m.submodules.bn = bn = BnBackwardUnit(layer=bn_lay)
        wiring.connect(m, wiring.flipped(self.alpha), bn.alpha)
        wiring.connect(m, bn.p1, wiring.flipped(self.p1))
        wiring.connect(m, bn.q, wiring.flipped(self.q))

        m.submodules.x_mem = x_mem = Memory(shape=L, depth=nx, init=[])
        m.submodules.p_mem = p_mem = Memory(shape=self.pooled_layout, depth=npool, init=[])
        x_wr, p_wr = x_mem.write_port(), p_mem.write_port()
        x_rd, p_rd = x_mem.read_port(domain="comb"), p_mem.read_port(domain="comb")

        emit = Signal()  # 0: loading both buffers; 1: the two routed passes
        xa = Signal(range(nx + 1))
        pa = Signal(range(npool + 1))
        m.d.comb += [
            self.x.ready.eq(~emit & (xa != nx)),
            self.pooled.ready.eq(~emit & (pa != npool)),
            x_wr.addr.eq(xa), x_wr.data.eq(self.x.payload.x_hat), x_wr.en.eq(self.x.valid & self.x.ready),
            p_wr.addr.eq(pa), p_wr.data.eq(self.pooled.payload), p_wr.en.eq(self.pooled.valid & self.pooled.ready),
        ]
        with m.If(x_wr.en):
            m.d.sync += xa.eq(xa + 1)
        with m.If(p_wr.en):
            m.d.sync += pa.eq(pa + 1)
        started = Signal()
        with m.If(x_wr.en | p_wr.en):
            m.d.sync += started.eq(1)
        m.d.comb += self.busy.eq(started | emit)

        # the routed passes: counters over (pass, b, h, v, g), h = hp p + hi, v = vp p + vi
        second = Signal()
        b = Signal(range(B))
        hp, hi = Signal(range(Ho // p + 2)), Signal(range(p))
        vp, vi = Signal(range(Wo // p + 2)), Signal(range(p))
        h, v = Signal(range(Ho)), Signal(range(Wo))
        gr = Signal(range(G))
        i = Signal(range(nx))
        with m.If(~emit & (xa == nx) & (pa == npool)):
            m.d.sync += [emit.eq(1), second.eq(0), b.eq(0), h.eq(0), hp.eq(0), hi.eq(0), v.eq(0), vp.eq(0),
                         vi.eq(0), gr.eq(0), i.eq(0)]
        in_win = Signal()
        m.d.comb += [
            in_win.eq((hp < Hp) & (vp < Wp)),
            x_rd.addr.eq(i),
            p_rd.addr.eq(((b * Hp + hp) * Wp + vp) * G + gr),
        ]
        here = Signal(range(p * p))
        m.d.comb += here.eq(hi * p + vi)
        beat = Signal(bn_lay.dx_layout)
        m.d.comb += [beat.x_hat.eq(x_rd.data), beat.last.eq(gr == G - 1)]
        for lane in range(L):
            hit = in_win & (p_rd.data.idx[lane] == here)
            m.d.comb += beat.dx[lane].eq(Mux(hit, p_rd.data.dx[lane], 0))
        m.d.comb += [
            bn.dx.payload.eq(beat), bn.dx_replay.payload.eq(beat),
            bn.dx.valid.eq(emit & ~second), bn.dx_replay.valid.eq(emit & second),
        ]
        take = Signal()
        m.d.comb += take.eq((bn.dx.valid & bn.dx.ready) | (bn.dx_replay.valid & bn.dx_replay.ready))
        with m.If(take):
            m.d.sync += i.eq(i + 1)
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
                            m.d.sync += [b.eq(0), i.eq(0), second.eq(1)]
                            with m.If(second):  # the last replayed beat: load the next batch
                                m.d.sync += [emit.eq(0), started.eq(0), xa.eq(0), pa.eq(0)]
        return m


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
        for name in ("x", "pooled", "alpha"):
            wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(bwd, name))
        wiring.connect(m, wiring.flipped(self.s_eff), po2.s_eff)
        wiring.connect(m, bwd.p1, wiring.flipped(self.p1))
        wiring.connect(m, bwd.q, po2.q)
        wiring.connect(m, po2.bias, wiring.flipped(self.bias))
        wiring.connect(m, po2.codes, wiring.flipped(self.codes))
        m.d.comb += [po2.scale.eq(self.scale), self.busy.eq(bwd.busy | (po2.phase != Po2Unit.PRO))]
        lay = po2.scratch_layout
        m.submodules.scratch = fifo = SyncFIFOBuffered(width=lay.size, depth=self._bwd.geometry.beats)
        m.d.comb += [
            fifo.w_data.eq(po2.scratch.payload), fifo.w_en.eq(po2.scratch.valid), po2.scratch.ready.eq(fifo.w_rdy),
            po2.scratch_in.payload.eq(fifo.r_data), po2.scratch_in.valid.eq(fifo.r_rdy),
            fifo.r_en.eq(po2.scratch_in.ready),
        ]
        return m
