"""One conv layer's whole forward phase with max pooling (docs/architecture.md 10.2): :class:`ConvForward` (the map,
the windows, the XNOR engine, the pool's argmax), BN forward, and the pooled signs written as the next layer's map.
Both orders of the model (``sim.hw.widths.pools_before_bn``, the maxpool's ``before_bn``) are built; the geometry's
``before_bn`` selects one.

``before_bn`` (BinaryNet's order, the MNIST preset's; ``n = B Hp Wp`` pooled positions, ``G`` groups of
``lanes_out`` channels)::

    ConvForward.y (every position) -> dropped (``ready`` high)
    ConvForward.pooled (pass 1: per pooled position (b, hp, vp, g) the first largest Y and its index)
        -> BnForwardUnit.y (sum_y over the n pooled positions)
        \\-> Y buffer (n G words) -> two replays -> BnForwardUnit.y_replay (passes 2, 3)
        \\-> ``pool_idx`` (the index, which the backward pass routes the codes with)
    BnForwardUnit.x (pass 3: x_hat and mask of the pooled positions) -> ``x``, ``pooled`` and ``next_write``
    BnForwardUnit.stats (EPI3) -> ``stats``

Pooling the BN output (``n = B Ho Wo`` positions, beats in the order ``(b, h, v, g)``)::

    ConvForward.y (pass 1) ----------------> BnForwardUnit.y        (sum_y over all n positions)
                           \\-> Y buffer (n G words) -> two replays -> BnForwardUnit.y_replay (passes 2, 3)
    ConvForward.pooled (pass 1) -> ``pool_idx`` (per pooled position and group: the first largest Y's index)
    BnForwardUnit.x (pass 3) -> ``x`` (x_hat of every position: the BN backward reads them all)
                             \\-> MaxPool of the class code -> ``pooled`` (pooled x_hat and mask)
                                                          \\-> ``next_write`` (the pooled map's rows)
    BnForwardUnit.stats (EPI3) -> ``stats`` (per channel: sum_y and S for the running statistics, S', alpha_q)

:class:`rtl_gen.bn_unit.BnForwardUnit` is reused unchanged: a conv layer is a dense layer whose "batch" is the ``n``
positions (:class:`BnLayer` with the conv layer's :class:`sim.hw.widths.LayerBounds`, whose ``n`` is ``B Hp Wp``
or ``B Ho Wo`` and whose widths follow from it), and the beats' order is the unit's row-major order.

The pooled sign and mask without ``Y`` (pooling the BN output): within a channel the thresholds satisfy ``theta_lo
<= theta <= theta_hi + 1`` (docs/arithmetic.md 3.4, kept by the saturation), so a position's ``(x_hat, mask)``
fixes its class ``c`` (0: ``Y < theta_lo``, 1: inside the mask, 2: ``Y > theta_hi``) and the code ``v = 2 c +
x_hat`` (0, 2, 3 or 5) is a non-decreasing function of ``Y``. The window's largest ``v`` is therefore ``v`` at its
first largest ``Y`` (the position ``r`` of docs/arithmetic.md 3.9): pooled ``x_hat = x_hat[r]`` is its bit 0 and
pooled ``mask = mask[r]`` its bit 1. :class:`rtl_gen.conv_pool.MaxPool` takes the codes of pass 3 (its own index
output is unused); ``r`` itself, which the backward pass routes dX to, is the pass-1 pool's on ``Y``.

The next layer's map (docs/architecture.md 10.1): one word per pooled image row ``(b, hp)`` at address ``b Hp +
hp``, ``Wp Co`` bits, pooled pixel ``vp`` channel ``c`` in bit ``vp Co + c``: the ``x_write`` words of the next
:class:`ConvForward`. A dense layer after it reads an image's rows one after the other, its inputs in the order
``(hp, vp, c)`` (the model flattens ``(c, hp, vp)``: the dense layer's weight rows are permuted to match).

Ports: ``x_write``, ``w_load`` (as :class:`ConvForward`), ``beta`` (``beta_q`` per channel, taken in EPI2), ``start``
(a pulse; ignored while ``busy``), ``x`` (``x_hat`` of BN's ``n`` positions, ``last`` on a position's last
group; with ``before_bn`` the same beats as ``pooled``), ``pool_idx``, ``pooled`` (order ``(b, hp, vp, g)``),
``next_write`` (``addr``, ``data``), ``stats`` (the BN unit's), ``busy`` (from ``start`` until every output of the
batch has been taken and the engine's pass has ended).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from amaranth import Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from sim.hw.arith import ArithParams
from sim.hw.widths import layer_bounds, pools_after, pools_before_bn

from .bn_unit import BnForwardUnit, BnLayer
from .buffers import MemoryReader, fork
from .conv_forward import ConvForward, ConvForwardGeometry
from .conv_pool import MaxPool, PoolGeometry
from .ports import StreamView

__all__ = ["ConvLayerForward", "ConvLayerGeometry"]

CODE_WIDTH = 4
"""Bits of the signed class code ``v = 2 c + x_hat`` (0 .. 5) the sign pool compares."""


@dataclass(frozen=True, kw_only=True)
class ConvLayerGeometry:
    """One conv layer's forward phase: its :class:`ConvForwardGeometry` and the :class:`BnLayer` of the ``n``
    positions BN runs over (``lanes`` = the engine's ``lanes_out``): ``B Hp Wp`` with ``before_bn`` (the maxpool
    pools ``Y`` before BN), else ``B Ho Wo``; ``div_steps`` of the BN unit's divider."""

    conv: ConvForwardGeometry
    bn: BnLayer
    div_steps: int = 1
    before_bn: bool = False

    def __post_init__(self):
        c, b = self.conv, self.bn
        if self.before_bn:
            p = c.pooling
            what, n = "bn.batch (pooled positions n = B Hp Wp, before_bn)", c.batch * p.out_height * p.out_width
        else:
            what, n = "bn.batch (positions n = B Ho Wo)", c.batch * c.out_height * c.out_width
        for name, have, want in ((what, b.batch, n),
                                 ("bn.channels", b.channels, c.out_channels),
                                 ("bn.fan_in (Ci k^2)", b.fan_in, c.engine.n_in),
                                 ("bn.lanes", b.lanes, c.lanes_out),
                                 ("bn.x_max", b.x_max, 1)):
            if have != want:
                raise ValueError(f"{name} is {have}; the conv layer needs {want}")
        if b.top:
            raise ValueError("a pooled conv layer is never the output layer (bn.top must be false)")
        if b.widths["y"] != c.engine.y_width:
            raise ValueError(f"bn Y width {b.widths['y']} differs from the engine's {c.engine.y_width}")

    @classmethod
    def from_config(cls, cfg, layer_index: int, *, lanes_in: int, lanes_out: int,
                    div_steps: int = 1) -> ConvLayerGeometry:
        """Weight layer ``layer_index`` of ``cfg``: a conv layer with binary input followed by a max pool."""
        layers = cfg.weight_layers()
        if not 0 <= layer_index < len(layers):
            raise ValueError(f"layer_index must be in 0..{len(layers) - 1}, not {layer_index}")
        s = layers[layer_index]
        pool = pools_after(cfg)[layer_index]
        if s.spec.type != "conv" or not pool:
            raise ValueError(f"weight layer {layer_index} is a {s.spec.type} layer without a following max pool; "
                             f"ConvLayerForward builds a conv layer followed by a max pool")
        ci, h, w = s.in_shape
        conv = ConvForwardGeometry(batch=cfg.train.batch_size, channels=ci, height=h, width=w,
                                   out_channels=s.out_channels, lanes_in=lanes_in, lanes_out=lanes_out,
                                   kernel=s.spec.kernel, padding=s.spec.padding, pool=pool)
        bn = BnLayer(bounds=layer_bounds(cfg)[layer_index], params=ArithParams.from_config(cfg), lanes=lanes_out)
        return cls(conv=conv, bn=bn, div_steps=div_steps, before_bn=pools_before_bn(cfg)[layer_index])

    @property
    def positions(self) -> int:
        """``n``, the positions BN runs over: ``B Ho Wo``, or ``B Hp Wp`` with ``before_bn``."""
        return self.bn.batch

    @property
    def beats(self) -> int:
        """Beats of the BN passes (the ``Y`` buffer's words, the ``x`` beats), ``n G``."""
        return self.bn.beats

    @property
    def conv_beats(self) -> int:
        """``Y`` beats of the engine, ``B Ho Wo G``."""
        c = self.conv
        return c.batch * c.out_height * c.out_width * self.bn.groups

    @property
    def pooling(self) -> PoolGeometry:
        return self.conv.pooling

    @property
    def sign_pool(self) -> PoolGeometry:
        """The pool of the class codes (pass 3): the conv pool's geometry with :data:`CODE_WIDTH`-bit values."""
        p = self.conv.pooling
        return PoolGeometry(batch=p.batch, height=p.height, width=p.width, groups=p.groups, lanes=p.lanes,
                            y_width=CODE_WIDTH, pool=p.pool)

    @property
    def next_height(self) -> int:
        return self.pooling.out_height

    @property
    def next_width(self) -> int:
        return self.pooling.out_width

    @property
    def next_depth(self) -> int:
        """Words of the next layer's map: one per pooled image row."""
        return self.conv.batch * self.next_height

    @property
    def next_word(self) -> int:
        """Bits of a next-map word, ``Wp Co``."""
        return self.next_width * self.conv.out_channels

    def next_words(self, x) -> list[int]:
        """The next map's words for pooled signs ``x [B, Co, Hp, Wp]`` (-1/+1 or 0/1), by address."""
        x = np.asarray(x)
        bits = (x > 0).astype(np.uint8) if x.min() < 0 else x.astype(np.uint8)
        shape = (self.conv.batch, self.conv.out_channels, self.next_height, self.next_width)
        if bits.shape != shape:
            raise ValueError(f"pooled map has shape {bits.shape}; expected {shape}")
        rows = bits.transpose(0, 2, 3, 1).reshape(self.next_depth, self.next_word)  # (b, hp), bit vp Co + c
        return [sum(int(t) << i for i, t in enumerate(row)) for row in rows]

    def cycles(self) -> int:
        """Cycles from ``start`` to the batch's last ``stats`` transfer, both included, with no backpressure and
        ``beta`` offered whenever taken (:func:`rtl_gen.cycle_model.conv_layer_forward_cycles`)."""
        from .cycle_model import conv_layer_forward_cycles

        return conv_layer_forward_cycles(self)


class ConvLayerForward(wiring.Component):
    """The forward phase of :class:`ConvLayerGeometry` (module docstring)."""

    def __init__(self, *, geometry: ConvLayerGeometry):
        if not isinstance(geometry, ConvLayerGeometry):
            raise TypeError(f"geometry must be a ConvLayerGeometry, not {type(geometry).__name__}")
        self.geometry = g = geometry
        c, b = g.conv, g.bn
        e = c.engine
        L = c.lanes_out
        super().__init__({
            "x_write": In(stream.Signature(data.StructLayout({"addr": range(max(c.map_depth, 2)),
                                                              "data": c.map_width}))),
            "w_load": In(stream.Signature(e.w_layout)),
            "beta": In(stream.Signature(signed(b.beta_width))),
            "start": In(1),
            "x": Out(stream.Signature(data.StructLayout({"x_hat": L, "last": 1}))),
            "pool_idx": Out(stream.Signature(data.StructLayout({"idx": data.ArrayLayout(
                c.pooling.index_width, L)}))),
            "pooled": Out(stream.Signature(data.StructLayout({"x_hat": L, "mask": L}))),
            "next_write": Out(stream.Signature(data.StructLayout({"addr": range(max(g.next_depth, 2)),
                                                                  "data": g.next_word}))),
            "stats": Out(stream.Signature(b.stats_layout)),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        g = self.geometry
        c, lay = g.conv, g.bn
        L, G, yw = c.lanes_out, lay.groups, lay.widths["y"]
        beats = g.beats
        m.submodules.conv = conv = ConvForward(geometry=c)
        m.submodules.bn = bn = BnForwardUnit(layer=lay, div_steps=g.div_steps)
        wiring.connect(m, wiring.flipped(self.x_write), conv.x_write)
        wiring.connect(m, wiring.flipped(self.w_load), conv.w_load)
        wiring.connect(m, wiring.flipped(self.beta), bn.beta)
        wiring.connect(m, bn.stats, wiring.flipped(self.stats))
        m.d.comb += [bn.eval_mode.eq(0), bn.run.eq(0)]

        running = Signal()
        go = Signal()
        finished = Signal()  # every output of the batch taken (the counts below) and the engine's pass ended
        m.d.comb += [go.eq(self.start & ~running), conv.start.eq(go), self.busy.eq(running & ~finished)]

        # pass 1: Y (before_bn: the pooled Y) into the BN unit and the Y buffer (a word per beat, lane l in bits
        # l yw ..); the pass-1 pool's indices to ``pool_idx``
        m.submodules.ybuf = ybuf = Memory(shape=L * yw, depth=max(beats, 2), init=[])
        y_wr, y_rd = ybuf.write_port(), ybuf.read_port(transparent_for=())
        y_count = Signal(range(beats + 1))
        y_take = Signal()
        if g.before_bn:
            # the engine's Y only feeds the pool; each pooled beat goes once to BN and once to ``pool_idx``
            yg = Signal(range(max(G, 2)))  # the pooled beat's group (for ``last``)
            m.d.comb += conv.y.ready.eq(1)
            fork(m, StreamView(conv.pooled.valid, conv.pooled.ready), [bn.y, self.pool_idx], name="pool_fork")
            y_src = conv.pooled.payload.y
            m.d.comb += bn.y.payload.last.eq(yg == G - 1)
            with m.If(go):
                m.d.sync += yg.eq(0)
            with m.Elif(y_take):
                m.d.sync += yg.eq(Mux(yg == G - 1, 0, yg + 1))
        else:
            y_src = conv.y.payload.y
            m.d.comb += [bn.y.valid.eq(conv.y.valid), bn.y.payload.last.eq(conv.y.payload.last),
                         conv.y.ready.eq(bn.y.ready),
                         self.pool_idx.valid.eq(conv.pooled.valid), conv.pooled.ready.eq(self.pool_idx.ready)]
        for lane in range(L):
            m.d.comb += self.pool_idx.payload.idx[lane].eq(conv.pooled.payload.idx[lane])
        m.d.comb += [y_take.eq(bn.y.valid & bn.y.ready), y_wr.addr.eq(y_count), y_wr.en.eq(y_take)]
        for lane in range(L):
            m.d.comb += [bn.y.payload.y[lane].eq(y_src[lane]), y_wr.data[lane * yw:(lane + 1) * yw].eq(y_src[lane])]
        with m.If(go):
            m.d.sync += y_count.eq(0)
        with m.Elif(y_take):
            m.d.sync += y_count.eq(y_count + 1)

        # passes 2 and 3: the buffer read twice, from the cycle after the last Y beat's write
        m.submodules.replay = rr = MemoryReader(width=L * yw, depth=max(beats, 2), repeat=2)
        replayed = Signal()
        with m.If(go):
            m.d.sync += replayed.eq(0)
        with m.Elif(running & (y_count == beats) & ~replayed):
            m.d.sync += replayed.eq(1)
            m.d.comb += [rr.start.eq(1), rr.base.eq(0), rr.count.eq(2 * beats), rr.wrap.eq(beats)]
        m.d.comb += [y_rd.addr.eq(rr.r_addr), y_rd.en.eq(rr.r_en), rr.r_data.eq(y_rd.data)]
        rg = Signal(range(max(G, 2)))  # the replay beat's group (for ``last``)
        for lane in range(L):
            m.d.comb += bn.y_replay.payload.y[lane].eq(rr.o.payload.data[lane * yw:(lane + 1) * yw].as_signed())
        m.d.comb += [bn.y_replay.payload.last.eq(rg == G - 1), bn.y_replay.valid.eq(rr.o.valid),
                     rr.o.ready.eq(bn.y_replay.ready)]
        with m.If(go):
            m.d.sync += rg.eq(0)
        with m.Elif(rr.o.valid & rr.o.ready):
            m.d.sync += rg.eq(Mux(rg == G - 1, 0, rg + 1))

        # pass 3: x_hat to ``x``; the pooled x_hat and mask (``px``, ``pm``) to ``pooled`` and the row packer
        m.d.comb += [self.x.payload.x_hat.eq(bn.x.payload.x_hat), self.x.payload.last.eq(bn.x.payload.last)]
        pk_valid = Signal()
        pk_ready = Signal()
        px, pm = Signal(L), Signal(L)
        if g.before_bn:  # BN ran over the pooled positions: its x_hat and mask are the pooled ones
            x_move = fork(m, StreamView(bn.x.valid, bn.x.ready), [self.x, self.pooled, StreamView(pk_valid, pk_ready)],
                          name="x_fork")
            p_move = x_move
            m.d.comb += [px.eq(bn.x.payload.x_hat), pm.eq(bn.x.payload.mask)]
        else:  # the class codes to the sign pool (module docstring)
            m.submodules.sign_pool = spool = MaxPool(geometry=g.sign_pool)
            x_move = fork(m, StreamView(bn.x.valid, bn.x.ready), [self.x, spool.i], name="x_fork")
            for lane in range(L):
                xh, mk = bn.x.payload.x_hat[lane], bn.x.payload.mask[lane]
                # v = 2 c + x_hat: 0 (below theta_lo), 2 / 3 (in the mask), 5 (above theta_hi)
                m.d.comb += spool.i.payload.y[lane].eq(Mux(mk, 2 + xh, Mux(xh, 5, 0)))
            p_move = fork(m, StreamView(spool.o.valid, spool.o.ready),
                          [self.pooled, StreamView(pk_valid, pk_ready)], name="pooled_fork")
            for lane in range(L):
                m.d.comb += [px[lane].eq(spool.o.payload.y[lane][0]), pm[lane].eq(spool.o.payload.y[lane][1])]
        m.d.comb += [self.pooled.payload.x_hat.eq(px), self.pooled.payload.mask.eq(pm)]

        # the pooled beats into the next map's rows
        Wp, Co = g.next_width, c.out_channels
        slot = Signal(range(max(Wp * G, 2)))  # the beat's (vp, g) within the pooled row
        row = Signal(range(max(g.next_depth, 2)))  # the pooled row's address b Hp + hp
        acc = Signal(g.next_word)
        word = Signal(g.next_word)
        out_valid = Signal()
        out_addr = Signal.like(row)
        out_data = Signal(g.next_word)
        row_end = Signal()
        m.d.comb += [
            row_end.eq(slot == Wp * G - 1),
            pk_ready.eq(~row_end | ~out_valid | self.next_write.ready),
            self.next_write.valid.eq(out_valid),
            self.next_write.payload.addr.eq(out_addr),
            self.next_write.payload.data.eq(out_data),
            word.eq(acc),
        ]
        with m.Switch(slot):
            for vp in range(Wp):
                for gr in range(G):
                    lo = vp * Co + gr * L
                    n = min(L, Co - gr * L)
                    with m.Case(vp * G + gr):
                        m.d.comb += word[lo:lo + n].eq(px[:n])
        pk_take = Signal()
        m.d.comb += pk_take.eq(pk_valid & pk_ready)
        with m.If(self.next_write.valid & self.next_write.ready):
            m.d.sync += out_valid.eq(0)
        with m.If(go):
            m.d.sync += [slot.eq(0), row.eq(0), acc.eq(0)]
        with m.Elif(pk_take):
            with m.If(row_end):
                m.d.sync += [slot.eq(0), row.eq(row + 1), acc.eq(0), out_valid.eq(1), out_addr.eq(row),
                             out_data.eq(word)]
            with m.Else():
                m.d.sync += [slot.eq(slot + 1), acc.eq(word)]

        # busy until every output has been taken: counts of x, pool_idx, pooled, rows; the last stats beat
        x_count = Signal(range(beats + 1))
        i_count = Signal(range(c.pooling.beats_out() + 1))
        p_count = Signal(range(c.pooling.beats_out() + 1))
        r_count = Signal(range(g.next_depth + 1))
        s_done = Signal()
        with m.If(go):
            m.d.sync += [running.eq(1), x_count.eq(0), i_count.eq(0), p_count.eq(0), r_count.eq(0), s_done.eq(0)]
        with m.Else():
            with m.If(x_move):
                m.d.sync += x_count.eq(x_count + 1)
            with m.If(self.pool_idx.valid & self.pool_idx.ready):
                m.d.sync += i_count.eq(i_count + 1)
            with m.If(p_move):
                m.d.sync += p_count.eq(p_count + 1)
            with m.If(self.next_write.valid & self.next_write.ready):
                m.d.sync += r_count.eq(r_count + 1)
            with m.If(self.stats.valid & self.stats.ready & self.stats.payload.last):
                m.d.sync += s_done.eq(1)
            with m.If(finished):
                m.d.sync += running.eq(0)
        m.d.comb += finished.eq(s_done & ~conv.busy & (x_count == beats) & (i_count == c.pooling.beats_out())
                                & (p_count == c.pooling.beats_out()) & (r_count == g.next_depth))
        return m
