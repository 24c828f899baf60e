"""The top level's wiring of the backward phases of one layer: ``bwd j`` (BN backward, the po2 codes, the beta
update's inputs), ``dx j`` (dX into the buffer of layer ``j-1``, on the fabric engine or the dW array), ``upd j``
(dW tiles into the weight update sweep) and ``undo j``. A mixin of :class:`rtl_gen.top.Accelerator`.
"""

from __future__ import annotations

from amaranth import Cat, Const, Mux, Signal
from amaranth.lib import data, wiring

from .buffers import (
    MemoryReader,
    RowReader,
    RowWriter,
    TileReader,
)
from .code_window import CodeWindow, rewrite
from .streams import KEEP, SkidBuffer
from .weight_memory import UNDO, UPDATE

#: bits of the dX split's holding register per copy of its load enable (``_dx``)
HOLD_SLICE = 64

__all__ = ["BackwardWiring"]


class BackwardWiring:
    """Backward phases of :class:`rtl_gen.top.Accelerator`."""

    # ---- backward: BN backward and po2 codes -----------------------------------------------------------------
    def _backward(self, m, plan, lp, act, start, done, bnb, bnp, po2, mx, ports, scale, unit_exp, sub,
                  lb):
        j = lp.index
        B, G, lo = plan.batch, lp.groups, lp.lanes_out
        key = ("bwd", j)
        a, st = self._phase_pair(key)
        bu, pu, par = bnb[j], po2[j], bnp[j]
        # per-channel S' -> po2 (PRO); alpha -> BN backward (EPI)
        for name, dst in (("seff", pu.s_eff), ("alpha", bu.alpha)):
            rw = len(ports[f"{name}_r"].port.data)
            ch_all = sum(q.n_out for q in plan.layers)
            # registered: S' goes into the po2 unit's normaliser and alpha into a multiplier at once, and their
            # consumers' ready would reach the read enable (one more cycle before PRO: cycle_model.SEFF_STAGE)
            # the pooled reader's facade, start and ready from copies of the phase registers of its own (the routed
            # SMALL design at one nextpnr seed: ``bwd_any1``, placed among the phase's other loads, into the
            # pooled readers' and the code window's input choices, up to 14.0 ns, 12.3 of it routing)
            ra, rst_ = self._phase_pair(key, f"{name}_bwd")
            rd = self._pooled(m, sub, f"{name}_reader", (rw,),
                              lambda rw=rw, ch_all=ch_all: MemoryReader(width=rw, depth=ch_all, registered=True), ra)
            # the reader counts from the layer's first channel in the shared memory, so the read address is the
            # reader's register itself: no per-layer offset adder and no choice between layers' addresses in front
            # of the memory's read address (the LUT-RAM read into the data register was a group of the SMALL
            # design's routed failing paths at one nextpnr seed)
            m.d.comb += [rd.start.eq(rst_), rd.base.eq(self._chan_base[j]), rd.count.eq(lp.n_out), rd.wrap.eq(0)]
            # a registered reader: the port reads every cycle
            ports[f"{name}_r"].add(self._port_phase([key], f"{name}_r"), addr=rd.r_addr, en=1)
            m.d.comb += [rd.r_data.eq(ports[f"{name}_r"].port.data), dst.payload.eq(rd.o.payload.data),
                         dst.valid.eq(a & rd.o.valid), rd.o.ready.eq(ra & dst.ready)]
        # dx (twice): g (output layer) or dX times the mask, both from YDX, with x_hat
        dxw = lp.widths["dx"]
        src_name = "ydx"  # dX of the layer above, or (output layer) the loss gradient g from YDX word _g_base on
        src_base = self._g_base if lp.top else 0
        src_w = len(ports[f"{src_name}_r"].port.data)
        rd_depth = max(q.beats for q in plan.layers)
        fa, fst = self._phase_pair(key, "dx_feed_bwd")
        feed = self._pooled(m, sub, "dx_feed", (src_w + 2 * lo,),
                            lambda: MemoryReader(width=src_w + 2 * lo, depth=rd_depth, repeat=2,
                                                 registered=True), fa)
        m.d.comb += [feed.start.eq(fst), feed.base.eq(0), feed.count.eq(2 * lp.beats), feed.wrap.eq(lp.beats)]
        # (the port is the feed's until its last word is taken; then the po2 scratch reader's, which may share it)
        # (registered readers take their word a cycle after the read: the ports read every cycle, en=1)
        ports[f"{src_name}_r"].add(self._port_phase([key], f"{src_name}_r") & feed.reading,
                                   addr=feed.r_addr + src_base, en=1)
        ports[f"mx{j}_r"].add(a, addr=feed.r_addr, en=1)
        if lp.top:  # x_hat is in the MX word, beside the mask
            m.d.comb += feed.r_data.eq(Cat(ports[f"{src_name}_r"].port.data, ports[f"mx{j}_r"].port.data))
        else:  # x_hat read from XB_{j+1} in step with the feed, and registered with its word; dX masked on the
            # way in (the mask after the feed's slot multiplexer ended at BN backward's beat register: 13.2 ns in
            # context on the ECP5 proxy)
            src, mk = ports[f"{src_name}_r"].port.data, ports[f"mx{j}_r"].port.data[:lo]
            masked = Cat(*(Mux(mk[lane], src[lane * dxw:(lane + 1) * dxw], 0) for lane in range(lo)))
            m.d.comb += feed.r_data.eq(Cat(masked, Const(0, src_w - lo * dxw), mk,
                                           self._x_hat_from_next(m, plan, lp, st, a, feed, ports)))
        fd = feed.o.payload.data
        # (the mask travels in the word, but dX is masked as it enters the feed: only x_hat is taken here)
        xh = fd[src_w:src_w + lo] if lp.top else fd[src_w + lo:src_w + 2 * lo]
        f_count = Signal(range(2 * lp.beats + 1), name=f"dx_count{j}")
        first = Signal(name=f"dx_first{j}")
        m.d.comb += first.eq(f_count < lp.beats)
        fg = Signal(range(max(G, 2)), name=f"dx_g{j}")
        with m.If(st):
            m.d.sync += [f_count.eq(0), fg.eq(0)]
        with m.Elif(feed.o.valid & feed.o.ready):
            m.d.sync += [f_count.eq(f_count + 1), fg.eq(Mux(fg == G - 1, 0, fg + 1))]
        sw = len(plan.layers) and (len(bnb[j].dx.payload.dx[0]))
        for dst in (bu.dx, bu.dx_replay):
            for lane in range(lo):
                if lp.top:
                    gw = self._g_lane
                    v = fd[lane * gw:(lane + 1) * gw].as_signed()
                else:  # masked as it entered the feed
                    v = fd[lane * dxw:(lane + 1) * dxw].as_signed()
                m.d.comb += dst.payload.dx[lane].eq(v)
            m.d.comb += [dst.payload.x_hat.eq(xh), dst.payload.last.eq(fg == G - 1)]
        del sw
        m.d.comb += [
            bu.dx.valid.eq(a & first & feed.o.valid),
            bu.dx_replay.valid.eq(a & ~first & feed.o.valid),
            feed.o.ready.eq(fa & Mux(first, bu.dx.ready, bu.dx_replay.ready)),
        ]
        # P1 -> BN parameters; Q -> po2
        m.d.comb += [par.p1.valid.eq(a & bu.p1.valid), par.p1.payload.eq(bu.p1.payload.p1),
                     bu.p1.ready.eq(a & par.p1.ready)]
        # Q through a registered slice in front of the po2 unit (one per unit, shared by its layers, as BN forward's
        # beta slice): the po2 unit's ``ready`` (its phase, ``in_done`` and credit) ends at the slice beside it
        # instead of crossing the die into BN backward's output queue (the SMALL design's routed worst path at one
        # nextpnr seed: a phase register -> the facades -> the po2 unit's ready -> the queue's enables, 12.63 ns,
        # 10.9 of it routing). The skid form: the payload comes straight from a register. The po2 unit takes every
        # Q beat of the phase, so the slice is empty at its end.
        qsk, first = self._group_slice(sub, "q", j, bu.q.payload.shape())
        if first:  # BN backward's outputs are the same for every layer: the first layer's drive the payload
            m.d.comb += qsk.i.payload.eq(bu.q.payload)
        with m.If(a):
            m.d.comb += [qsk.i.valid.eq(bu.q.valid), qsk.o.ready.eq(pu.q.ready)]
        m.d.comb += [bu.q.ready.eq(a & qsk.i.ready),
                     pu.q.payload.eq(qsk.o.payload), pu.q.valid.eq(a & qsk.o.valid)]
        m.d.comb += pu.scale.eq(scale[j])
        # po2 scratch out and back; bias; codes into the code buffer (banked by sample)
        scr_count = Signal(range(lp.beats + 1), name=f"scr_count{j}")
        m.d.comb += pu.scratch.ready.eq(a)
        scr_take = Signal(name=f"scr_take{j}")
        m.d.comb += scr_take.eq(a & pu.scratch.valid)
        sbits = len(pu.scratch.payload.as_value()) - 1
        ports["scr_w"].add(scr_take, addr=scr_count, data=pu.scratch.payload.as_value()[:sbits], en=1)
        with m.If(st):
            m.d.sync += scr_count.eq(0)
        with m.Elif(scr_take):
            m.d.sync += scr_count.eq(scr_count + 1)
        rd_depth = max(q.beats for q in plan.layers)
        srd = self._pooled(m, sub, "scratch_reader", (sbits,),
                          lambda: MemoryReader(width=sbits, depth=rd_depth, registered=True), a)
        m.d.comb += pu.bias.ready.eq(a)
        with m.If(a & pu.bias.valid):
            m.d.sync += unit_exp[j].eq(pu.bias.payload.unit_exp)
            m.d.comb += [srd.start.eq(1), srd.base.eq(0), srd.count.eq(lp.beats), srd.wrap.eq(0)]
        ports["scr_r"].add(self._port_phase([key], "scr_r"), addr=srd.r_addr, en=1)  # a registered reader
        sg = Signal(range(max(G, 2)), name=f"scr_g{j}")
        with m.If(st):
            m.d.sync += sg.eq(0)
        with m.Elif(srd.o.valid & srd.o.ready):
            m.d.sync += sg.eq(Mux(sg == G - 1, 0, sg + 1))
        m.d.comb += [
            srd.r_data.eq(ports["scr_r"].port.data[:sbits]),
            pu.scratch_in.payload.as_value().eq(Cat(srd.o.payload.data, sg == G - 1)),
            pu.scratch_in.valid.eq(a & srd.o.valid),
            srd.o.ready.eq(a & pu.scratch_in.ready),
        ]
        cw = sub(f"codes_rows{j}", RowWriter(width=lo * plan.p.k, banks=lb, words=G, rows=B))
        c_take = Signal(name=f"codes_take{j}")
        m.d.comb += [pu.codes.ready.eq(a), c_take.eq(a & pu.codes.valid), cw.start.eq(st), cw.valid.eq(c_take),
                     cw.data.eq(pu.codes.payload.as_value()[: lo * plan.p.k])]
        for i in range(lb):
            ports[f"cb{i}_w"].add(c_take, addr=cw.w_addr, data=cw.w_data, en=cw.w_en[i])
        m.d.comb += done[key].eq((cw.count == lp.beats) & ~par.busy)
        if plan.cfg.hw.dw_window:  # the columns' largest fields, for upd j's ternary codes
            # the window's facade and its clear and track inputs from copies of the phase registers of their own
            # (the routed SMALL design at one nextpnr seed: ``bwd_any1``, placed among the phase's other loads ->
            # the shared window's input choice -> its ring's synchronous clear, 14.0 ns, 12.3 of it routing)
            wa, wst = self._phase_pair(key, "window_bwd")
            cwin = self._code_window(m, sub, plan, lp, lb, wa)
            m.d.comb += [cwin.clear.eq(wst), cwin.track.eq(wa & pu.codes.valid),
                         cwin.track_codes.as_value().eq(pu.codes.payload.as_value()[: lo * plan.p.k])]

    def _code_window(self, m, sub, plan, lp, lb, active):
        """hw.dw_window: the :class:`CodeWindow` of layer ``lp``, one per geometry (lanes, groups), shared by the
        layers that have it: a layer's ``bwd``, ``dx`` and ``upd`` all run before the next layer's ``bwd``
        clears it. ``active``: the calling phase's."""
        params = (lp.lanes_out, lp.groups, plan.p.k, plan.cfg.hw.dw_window, lb)
        return self._pooled(m, sub, "code_window", params, lambda: CodeWindow(
            lanes=lp.lanes_out, groups=lp.groups, code_bits=plan.p.k, window=plan.cfg.hw.dw_window, banks=lb),
            active)

    # ---- dX of layer j into the buffer of layer j-1 --------------------------------------------------------------
    def _dx(self, m, plan, lp, act, start, done, po2b, wm, ports, sub, lb):
        j = lp.index
        B, G, lo, li = plan.batch, lp.groups, lp.lanes_out, lp.lanes_in
        below = plan.layers[j - 1]
        key = ("dx", j)
        a, st = self._phase_pair(key)
        u = po2b[j]
        k_bits = plan.p.k
        if u.array:
            self._array_dx(m, plan, lp, a, st, done[key], u, wm, ports)
            return
        # a registered reader (cycle_model.CODES_STAGE): the code buffers read every cycle in this phase, and the
        # engine's stall reaches neither their read enable nor their read-data registers' clock enables (the
        # routed SMALL design at two nextpnr seeds: the dX unit's ``adv`` -> the weights' read enable -> the
        # unregistered reader's ``r_en`` -> the 40 + 40 read-data enables of ``cb0`` / ``cb1``, 14.5 ns)
        cr = self._pooled(m, sub, "codes_reader", (lo * k_bits, lb, G, B),
                          lambda: RowReader(width=lo * k_bits, banks=lb, words=G, rows=B, registered=True), a)
        m.d.comb += cr.start.eq(st)
        for i in range(lb):
            ports[f"cb{i}_r"].add(self._port_phase([key], f"cb{i}_r"), addr=cr.r_addr, en=1)
            m.d.comb += cr.r_data[i].eq(ports[f"cb{i}_r"].port.data[: lo * k_bits])
        # the engine may serve several layers: its inputs are driven only while this phase is active
        with m.If(a):  # the engine's layer: Accelerator's register (po2b_layer_*)
            m.d.comb += u.dy.valid.eq(cr.o.valid)
        self._wide(m, a, [(u.dy.payload.as_value(), Cat(cr.o.payload.data, cr.o.payload.row_last))])
        m.d.comb += cr.o.ready.eq(a & u.dy.ready)
        # the dX unit reads the weights (the memory is idle: no sweep runs during this phase)
        with m.If(a):
            m.d.comb += [wm[j].read.addr.eq(u.weights.addr), wm[j].read.en.eq(u.weights.en)]
        self._wide(m, a, [(u.weights.data, wm[j].read.data)])
        # re-cut the dX beats (ls values: one pass of an input word) into the BN beats of layer j-1 (lo' values),
        # dropping padding beats: split each beat in r, or join c beats
        lo2, G2 = below.lanes_out, below.groups
        ls = u.dx.payload.dx.shape().length
        dxw = below.widths["dx"]
        vw = len(u.dx.payload.dx[0])
        per_row = lp.words * li // lo2  # BN beats per dX row, padding included
        q = Signal(range(max(per_row, 2)), name=f"split_q{j}")
        wcount = Signal(range(below.beats + 1), name=f"split_count{j}")
        word = Signal(lo2 * dxw, name=f"split_word{j}")
        keep = Signal(name=f"split_keep{j}")
        emit = Signal(name=f"split_emit{j}")  # a BN beat (real or padding) is complete this cycle
        m.d.comb += keep.eq(emit & (q < G2))
        ports["ydx_w"].add(keep, addr=wcount, data=word, en=1)
        # every BN beat the engine sends, padding included: the phase ends when the last row's padding beats have
        # left the engine too (a shared engine would otherwise start its next layer's dX with them)
        ecount = Signal(range(B * per_row + 1), name=f"split_emitted{j}")
        with m.If(emit):
            m.d.sync += [q.eq(Mux(q == per_row - 1, 0, q + 1)), ecount.eq(ecount + 1)]
            with m.If(keep):
                m.d.sync += wcount.eq(wcount + 1)

        if ls > lo2:
            r = ls // lo2
            full = Signal(name=f"split_full{j}")
            hold = Signal(len(u.dx.payload.dx.as_value()), name=f"split_hold{j}")
            sub_i = Signal(range(max(r, 2)), name=f"split_sub{j}")
            with m.If(a):
                m.d.comb += u.dx.ready.eq(~full | (sub_i == r - 1))
            with m.Switch(sub_i):
                for s_ in range(r):
                    with m.Case(s_):
                        for lane in range(lo2):
                            src = (s_ * lo2 + lane) * vw
                            m.d.comb += word[lane * dxw:(lane + 1) * dxw].eq(hold[src:src + vw].as_signed())
            # a shared engine hands other layers' dX beats out while this phase is idle: only this phase's beats
            # load the holding register, and none leaves in the phase's first cycle, when the write position
            # still points past the end of the previous step's buffer (into the codes packed above YDX's words)
            m.d.comb += emit.eq(a & full & ~st)
            full_n = Signal(name=f"split_full_next{j}")
            sub_n = Signal.like(sub_i, name=f"split_sub_next{j}")
            m.d.comb += [full_n.eq(full), sub_n.eq(sub_i)]
            m.d.sync += [full.eq(full_n), sub_i.eq(sub_n)]
            with m.If(emit):
                m.d.comb += sub_n.eq(sub_i + 1)
                with m.If(sub_i == r - 1):
                    m.d.comb += full_n.eq(0)
            with m.If(a & u.dx.valid & u.dx.ready):  # (re)load: the next beat follows the last sub-beat directly
                m.d.comb += [full_n.eq(1), sub_n.eq(0)]
            with m.If(st):
                m.d.comb += [full_n.eq(0), sub_n.eq(0)]
            # the holding register loads the unit's word whenever it is free (nothing held, or its last sub-beat
            # leaves this cycle): a junk word is never used, as ``full`` is set by a taken beat alone. Its enable
            # comes from a register per slice of HOLD_SLICE bits, loaded from the next values (timing: the phase
            # copy, the unit's valid and the handshake as the enable of several hundred bits across the die, 17.48
            # ns, 16.1 of it routing, at the paper's widths in context on the ECP5 proxy)
            for k, lo in enumerate(range(0, len(hold), HOLD_SLICE)):
                free = Signal(name=f"split_free{j}_{k}", init=1, attrs=KEEP)
                m.d.sync += free.eq(~full_n | (sub_n == r - 1))
                with m.If(free):
                    m.d.sync += hold[lo:lo + HOLD_SLICE].eq(u.dx.payload.dx.as_value()[lo:lo + HOLD_SLICE])
        else:  # join c beats (c = 1: each beat is written straight from the unit's output register, the same
            # data for every layer, so the YDX write port needs no multiplexer for it)
            c = lo2 // ls
            take = Signal(name=f"split_take{j}")
            incoming = Signal(ls * dxw, name=f"split_in{j}")
            for lane in range(ls):
                m.d.comb += incoming[lane * dxw:(lane + 1) * dxw].eq(u.dx.payload.dx[lane])
            m.d.comb += take.eq(a & u.dx.valid)
            with m.If(a):
                m.d.comb += u.dx.ready.eq(1)
            if c == 1:
                m.d.comb += [word.eq(incoming), emit.eq(take)]
            else:
                gath = Signal(lo2 * dxw, name=f"split_gather{j}")  # beats shift in from the top
                n = Signal(range(c), name=f"split_n{j}")
                m.d.comb += [word.eq(Cat(gath[ls * dxw:], incoming)), emit.eq(take & (n == c - 1))]
                with m.If(take):
                    m.d.sync += [gath.eq(word), n.eq(Mux(n == c - 1, 0, n + 1))]
                with m.If(st):
                    m.d.sync += n.eq(0)
        with m.If(st):
            m.d.sync += [q.eq(0), wcount.eq(0), ecount.eq(0)]
        m.d.comb += done[key].eq(ecount == B * per_row)

    def _array_dx(self, m, plan, lp, a, st, done, u, wm, ports):
        """dX on the po2 backward engine's array: it reads the codes and the weights itself and writes each word
        of the layer below's buffer (one sample's BN beat) with its address."""
        j = lp.index
        below = plan.layers[j - 1]
        with m.If(a):  # the engine's layer: Accelerator's register (po2b_layer_*)
            m.d.comb += [u.dx_start.eq(st), u.dx.ready.eq(1)]
        cb = ports["cb0_r"]
        cb.add(a, addr=u.codes.addr, en=u.codes.en)
        self._wide(m, a, [(u.codes.data.as_value(), cb.port.data[: len(u.codes.data.as_value())])])
        with m.If(a):
            m.d.comb += [wm[j].read.addr.eq(u.weights.addr), wm[j].read.en.eq(u.weights.en)]
        self._wide(m, a, [(u.weights.data, wm[j].read.data)])
        dxw = below.widths["dx"]
        vals = u.dx.payload.dx
        word = Signal(len(vals) * dxw, name=f"array_dx_word{j}")
        for lane in range(len(vals)):
            m.d.comb += word[lane * dxw:(lane + 1) * dxw].eq(vals[lane])
        keep = Signal(name=f"array_dx_keep{j}")
        wcount = Signal(range(below.beats + 1), name=f"array_dx_count{j}")
        m.d.comb += keep.eq(a & u.dx.valid)
        ports["ydx_w"].add(keep, addr=u.dx.payload.addr, data=word, en=1)
        with m.If(st):
            m.d.sync += wcount.eq(0)
        with m.Elif(keep):
            m.d.sync += wcount.eq(wcount + 1)
        m.d.comb += done.eq(wcount == below.beats)

    # ---- dW, the update sweep and the beta update -------------------------------------------------------------
    def _update(self, m, plan, lp, act, start, done, po2b, wm, rng, bnp, xb, ports, sub, scale, regs, sched_shift,
                lb):
        j = lp.index
        G, lo, li, W = lp.groups, lp.lanes_out, lp.lanes_in, lp.words
        key = ("upd", j)
        a, st = self._phase_pair(key)
        u, w, g, par = po2b[j], wm[j], rng[j], bnp[j]
        k_bits = plan.p.k
        tr = sub(f"tiles{j}", TileReader(a_width=li, c_width=lo * k_bits, banks=lb, words=W, groups=G,
                                         tiles=lp.tiles, passes=plan.dw_reads(j), registered=True))  # TILE_STAGE
        m.d.comb += tr.start.eq(st)
        for i in range(lb):
            ports[f"xb{j}_{i}_r"].add(a, addr=tr.a_addr, en=tr.r_en)
            ports[f"cb{i}_r"].add(self._port_phase([key], f"cb{i}_r"), addr=tr.c_addr, en=tr.r_en)
            m.d.comb += [tr.a_data[i].eq(ports[f"xb{j}_{i}_r"].port.data),
                         tr.c_data[i].eq(ports[f"cb{i}_r"].port.data[: lo * k_bits])]
        # the dW stream from the engine to the weight memory gated by a copy of the phase register of its own
        # (the SMALL design's routed worst path began at ``act_upd1``, placed among its other loads)
        ag = self._phase_reg([key], f"upd_grad{j}")
        if not plan.cfg.hw.dw_window:  # the engine may serve several layers (its layer: po2b_layer_*)
            with m.If(a):
                m.d.comb += u.xdy.valid.eq(tr.o.valid)
        with m.If(ag):
            m.d.comb += u.dw.ready.eq(w.grad.ready)
        codes = tr.o.payload.c.as_value()
        if plan.cfg.hw.dw_window:  # the ternary codes of the windowed sign gradient, group by group
            # the codes are rewritten against their group's bound from the window (shared by the layers of one
            # geometry) on the way into a registered slice (cycle_model.WINDOW_STAGE), and the slice's registers
            # go to the engine with no logic but the ring's read choice: the route across the die to the engine's
            # operand registers starts at a flip-flop (timing: the tile reader's word through the window's
            # multiplexer and compare, then across the die into the engine's operand register, 16.5 ns in context
            # on the ECP5 proxy; with the rewrite behind the slice, the slice's read pointer -> the rewrite -> the
            # engine, 12.9 ns, 11.0 of it routing). The window's advance follows the tile reader's handshake, so
            # the bound belongs to the word beside it.
            cwin = self._code_window(m, sub, plan, lp, lb, self._phase_reg([key], f"window_upd{j}"))
            m.d.comb += cwin.advance.eq(a & tr.o.valid & tr.o.ready & tr.g_last)
            c_in = Signal(cwin.codes_in.shape(), name=f"window_codes{j}")
            m.d.comb += c_in.as_value().eq(codes)
            ternary = rewrite(m, c_in, cwin.bound, cwin.low, lanes=lp.lanes_out, banks=lb, name=f"window_keep{j}_")
            layout = data.StructLayout({"a": len(tr.o.payload.a.as_value()), "c": cwin.codes_in.shape(), "last": 1})
            # the ring form: the engine's ``xdy.ready`` would reach every payload bit's clock enable in the skid form
            # (a group of the SMALL design's routed failing paths at one nextpnr seed); cycle for cycle the same
            wout = sub(f"window_out{j}", SkidBuffer(shape=layout, ring=True))
            m.d.comb += [wout.i.valid.eq(a & tr.o.valid), tr.o.ready.eq(a & wout.i.ready),
                         wout.i.payload.eq(Cat(tr.o.payload.a.as_value(), ternary.as_value(), tr.o.payload.last))]
            q = wout.o.payload
            with m.If(a):
                m.d.comb += u.xdy.valid.eq(wout.o.valid)
            m.d.comb += wout.o.ready.eq(a & u.xdy.ready)
            self._wide(m, a, [(u.xdy.payload.as_value(), Cat(q.a, q.c, q.last))])
        else:
            self._wide(m, a, [(u.xdy.payload.as_value(), Cat(tr.o.payload.a.as_value(), codes, tr.o.payload.last))])
            m.d.comb += tr.o.ready.eq(a & u.xdy.ready)
        m.d.comb += [w.grad.valid.eq(ag & u.dw.valid), w.grad.payload.eq(u.dw.payload)]
        wiring.connect(m, g.u, w.rng)
        cmd_sent = Signal(name=f"upd_cmd_sent{j}")
        m.d.comb += [w.cmd.valid.eq(a & ~cmd_sent), w.cmd.payload.op.eq(UPDATE), w.cmd.payload.shift.eq(sched_shift),
                     w.cmd.payload.gate.eq(regs.sched.switch_gate)]
        settle = Signal(2, name=f"upd_settle{j}")
        with m.If(st):
            m.d.sync += [cmd_sent.eq(0), settle.eq(0)]
        with m.Elif(a & (settle != 3)):
            m.d.sync += settle.eq(settle + 1)
        with m.If(w.cmd.valid & w.cmd.ready):  # may be the phase's first cycle: this wins over the reset
            m.d.sync += cmd_sent.eq(1)
        m.d.comb += [g.start.eq(st), par.update.eq(st), par.scale.eq(scale[j]), par.lr_shift.eq(regs.sched.lr_shift)]
        m.d.comb += done[key].eq(cmd_sent & (settle == 3) & ~w.busy & ~g.busy & ~tr.busy & ~par.busy)


    def _undo(self, m, lp, act, start, done, wm):
        """switch_undo, layer j: an ``UNDO`` sweep of its weight memory if the re-run's loss rose; else nothing."""
        j = lp.index
        key = ("undo", j)
        a, st = self._phase_pair(key)
        w = wm[j]
        sent = Signal(name=f"undo_sent{j}")
        settle = Signal(2, name=f"undo_settle{j}")
        with m.If(a):  # overrides the update phase's command (the same port)
            m.d.comb += [w.cmd.valid.eq(self._loss_rose & ~sent), w.cmd.payload.op.eq(UNDO),
                         w.cmd.payload.shift.eq(0)]
        with m.If(st):
            m.d.sync += [sent.eq(0), settle.eq(0)]
        with m.Elif(a & (settle != 3)):
            m.d.sync += settle.eq(settle + 1)
        with m.If(a & w.cmd.valid & w.cmd.ready):
            m.d.sync += sent.eq(1)
        m.d.comb += done[key].eq(~st & (~self._loss_rose | (sent & (settle == 3) & ~w.busy)))
