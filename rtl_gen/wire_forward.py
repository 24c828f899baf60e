"""The top level's wiring of the forward phases (``fwd j``, ``rfwd j``, ``ifwd j``) of one layer: the XNOR
engine fed from the layer's X buffer and weight memory, BN forward and the running statistics, the packing of
x_hat into the next layer's X buffer, and for the output layer the logits, the loss and the infer argmax.
A mixin of :class:`rtl_gen.top.Accelerator` (it uses the accelerator's shared-unit helpers).
"""

from __future__ import annotations

from amaranth import Cat, Const, Mux, Signal, signed
from amaranth.lib import data

from .buffers import (
    MemoryReader,
    RowReader,
    RowWriter,
    fork,
    next_sample_row,
)
from .ports import StreamView

__all__ = ["ForwardWiring"]


class ForwardWiring:
    """Forward phases of :class:`rtl_gen.top.Accelerator`."""

    # ---- forward phase of one layer ----------------------------------------------------------------------------
    def _forward(self, m, plan, lp, act, start, done, eng, wm, bnf, bnp, xb, mx, ports, logit, loss,
                 sub, correct):
        j = lp.index
        B, G, W, lo = plan.batch, lp.groups, lp.words, lp.lanes_out
        key = ("fwd", j)
        # the switch_undo re-run (rfwd j) runs the same datapath; it leaves the running statistics, the logits
        # and the correct count of the first run alone
        rkey = ("rfwd", j)
        rerun = self._phase_reg([rkey], f"fwd_rerun{j}") if rkey in act else Const(0)
        # infer (ifwd j): the same datapath in evaluation mode (``ev``): thresholds and logit constants from the
        # running statistics; the running statistics, the loss unit and the step's registers are left alone
        ikey = ("ifwd", j)
        ev = self._phase_reg([ikey], f"fwd_eval{j}")  # (copies of its own below for the units' eval_mode inputs)
        keys = [k for k in (key, rkey, ikey) if k in act]
        a = self._phase_reg(keys, f"fwd_any{j}")  # registers of their own (docs/architecture.md, "Timing discipline")
        st = self._phase_reg(keys, f"fwd_any_start{j}", start=True)
        copies = iter(range(1000))

        def stc():
            """A copy of the start pulse of its own for one group of counters it clears (one register and its
            OR with the reset reached 72-80 reset pins across the die in the SMALL design, routed)."""
            return self._phase_reg(keys, f"fwd_any_start{j}_c{next(copies)}", start=True)

        e, bn, par = eng[j], bnf[j], bnp[j]
        # each unit's eval_mode from a copy of the infer phase's register: the global phase register into BN
        # forward's enable chain was the SMALL design's routed critical path at one nextpnr seed (act_ifwd0 ->
        # the epilogue's accumulator clock enables, 13.45 ns, 11.7 of it routing)
        m.d.comb += [bn.eval_mode.eq(self._phase_reg([ikey], f"bn_fwd_eval{j}")),
                     par.eval_mode.eq(self._phase_reg([ikey], f"bn_param_eval{j}"))]
        # rows of X_j -> engine, through a registered reader (cycle_model.ROWS_STAGE): the banks' read enables
        # from its flip-flops, not the engine's ready (timing: the engine's handshake into the sample banks' block
        # RAM read enables was the paper-width design's worst path in context, 16.11 ns at 0ccd9f5)
        xr = sub(f"fwd_rows{j}", RowReader(width=lp.lanes_in, banks=lp.lanes_b, words=W, rows=B, registered=True))
        m.d.comb += xr.start.eq(st)
        for i in range(lp.lanes_b):
            ports[f"xb{j}_{i}_r"].add(a, addr=xr.r_addr, en=xr.r_en)
            m.d.comb += xr.r_data[i].eq(ports[f"xb{j}_{i}_r"].port.data)
        m.d.comb += [
            e.x.valid.eq(a & xr.o.valid),
            e.x.payload.data.eq(xr.o.payload.data),
            e.x.payload.last.eq(xr.o.payload.row_last),
            xr.o.ready.eq(a & e.x.ready),
        ]
        # weights: the engine reads the weight memory
        m.d.comb += [wm[j].read.addr.eq(e.weights.addr), wm[j].read.en.eq(e.weights.en),
                     e.weights.data.eq(wm[j].read.data)]
        # Y: to BN pass 1 and into the Y buffer
        yw = lp.widths["y"]
        y_count = Signal(range(lp.beats + 1), name=f"y_count{j}")
        y_word = Signal(lo * yw, name=f"y_word{j}")
        for lane in range(lo):
            m.d.comb += [bn.y.payload.y[lane].eq(e.y.payload.y[lane]), y_word[lane * yw:(lane + 1) * yw].eq(
                e.y.payload.y[lane])]
        m.d.comb += [bn.y.payload.last.eq(e.y.payload.last), bn.y.valid.eq(a & e.y.valid),
                     e.y.ready.eq(a & bn.y.ready)]
        y_take = Signal(name=f"y_take{j}")
        m.d.comb += y_take.eq(a & e.y.valid & bn.y.ready)
        ports["ydx_w"].add(y_take, addr=y_count, data=y_word, en=1)
        with m.If(stc()):
            m.d.sync += y_count.eq(0)
        with m.Elif(y_take):
            m.d.sync += y_count.eq(y_count + 1)
        # replays of Y: two for BN (passes 2, 3), a third for the logits of the output layer
        reps = 3 if lp.top else 2
        rd_depth = max(q.beats for q in plan.layers)
        ry = max(q.lanes_out * q.widths["y"] for q in plan.layers)  # one reader for every layer's Y words
        rr = self._pooled(m, sub, "y_replay", (ry,),
                          lambda: MemoryReader(width=ry, depth=rd_depth, repeat=3, registered=True), a)
        replay_started = Signal(name=f"replay_started{j}")
        with m.If(stc()):
            m.d.sync += replay_started.eq(0)
        with m.Elif(a & (y_count == lp.beats) & ~replay_started):
            m.d.sync += replay_started.eq(1)
            m.d.comb += [rr.start.eq(1), rr.base.eq(0), rr.count.eq(reps * lp.beats), rr.wrap.eq(lp.beats)]
        # a registered reader: the port reads every cycle
        ports["ydx_r"].add(self._port_phase(keys, "ydx_r"), addr=rr.r_addr, en=1)
        m.d.comb += rr.r_data.eq(ports["ydx_r"].port.data[:ry])
        r_count = Signal(range(reps * lp.beats + 1), name=f"replay_count{j}")
        to_bn = Signal(name=f"replay_to_bn{j}")  # r_count < 2 beats, as a flip-flop (it steers the replay's ready)
        with m.If(stc()):
            m.d.sync += [r_count.eq(0), to_bn.eq(1)]
        with m.Elif(rr.o.valid & rr.o.ready):
            m.d.sync += [r_count.eq(r_count + 1), to_bn.eq(r_count + 1 < 2 * lp.beats)]
        groups_last = Signal(name=f"replay_last{j}")
        rg = Signal(range(G), name=f"replay_g{j}")
        with m.If(stc()):
            m.d.sync += rg.eq(0)
        with m.Elif(rr.o.valid & rr.o.ready):
            m.d.sync += rg.eq(Mux(rg == G - 1, 0, rg + 1))
        m.d.comb += groups_last.eq(rg == G - 1)
        for lane in range(lo):
            m.d.comb += bn.y_replay.payload.y[lane].eq(rr.o.payload.data[lane * yw:(lane + 1) * yw].as_signed())
        m.d.comb += [bn.y_replay.payload.last.eq(groups_last), bn.y_replay.valid.eq(a & to_bn & rr.o.valid)]
        if not lp.top:
            m.d.comb += rr.o.ready.eq(a & bn.y_replay.ready)
        self._bn_replay_ready = bn.y_replay.ready
        # beta per channel (eval mode: with the channel's running statistics), through a registered slice in front
        # of the BN forward unit (one per unit, shared by its layers: a slice per layer put a choice between the
        # slices, by a phase register, in front of BN forward's compare, 12.85 ns in context): BN forward's
        # ``ready``, a decode of its phase and channel state, ends at the slice instead of crossing the die into the
        # parameter unit's output register (the SMALL design's routed worst path at one nextpnr seed: BN forward's
        # ``phase`` -> the parameter unit's facade -> BN forward's enables, 14.98 ns, 13.5 of it routing). The
        # skid form: its payload comes straight from a register (BN forward compares and multiplies it in the cycle
        # it takes it; a ring's read choice in front of that was 13.56 ns). BN forward takes every beta the
        # parameter unit streams, so the slice is empty at the phase's end (an abort resets it with the units). The
        # first beta comes three cycles after ``beta_start`` and BN forward takes betas in EPI2 only, a pass over
        # the batch later: no cycle changes
        m.d.comb += par.beta_start.eq(st)
        bl = data.StructLayout({"beta": par.beta.payload.shape(), "mu": par.run.mu.shape(), "s": par.run.s.shape()})
        bsk, first = self._group_slice(sub, "beta", j, bl)
        if first:  # the parameter unit's outputs are the same for every layer: the first layer's drive the payload
            m.d.comb += [bsk.i.payload.beta.eq(par.beta.payload), bsk.i.payload.mu.eq(par.run.mu),
                         bsk.i.payload.s.eq(par.run.s)]
        with m.If(a):
            m.d.comb += [bsk.i.valid.eq(par.beta.valid), bsk.o.ready.eq(bn.beta.ready)]
        m.d.comb += [
            par.beta.ready.eq(a & bsk.i.ready),
            bn.beta.valid.eq(a & bsk.o.valid), bn.beta.payload.eq(bsk.o.payload.beta),
            bn.run.mu.eq(bsk.o.payload.mu), bn.run.s.eq(bsk.o.payload.s),
        ]
        # x_hat and mask: MX_j; x_hat packed into X_{j+1}
        x_count = Signal(range(lp.beats + 1), name=f"x_count{j}")
        x_take = Signal(name=f"x_take{j}")
        m.d.comb += [bn.x.ready.eq(a), x_take.eq(a & bn.x.valid)]
        mx_data = Cat(bn.x.payload.x_hat, bn.x.payload.mask) if lp.top else bn.x.payload.mask
        ports[f"mx{j}_w"].add(x_take, addr=x_count, data=mx_data, en=1)
        with m.If(stc()):
            m.d.sync += x_count.eq(0)
        with m.Elif(x_take):
            m.d.sync += x_count.eq(x_count + 1)
        if not lp.top:
            self._pack_next(m, plan, lp, stc(), x_take, bn.x.payload.x_hat, ports, sub)
        # per-channel statistics: S', alpha; running statistics; (output layer) logit constants
        st_count = Signal(range(lp.n_out + 1), name=f"stats_count{j}")
        to_par = StreamView(Signal(name=f"stats_par_valid{j}"), Signal(name=f"stats_par_ready{j}"))
        m.d.comb += [par.stats.valid.eq(to_par.valid & ~rerun & ~ev), to_par.ready.eq(par.stats.ready | rerun | ev)]
        dsts = [to_par] + ([logit.consts] if lp.top else [])
        stats_valid = Signal(name=f"stats_valid{j}")
        m.d.comb += stats_valid.eq(a & bn.stats.valid)
        src = StreamView(stats_valid, bn.stats.ready)
        move = fork(m, src, dsts, name=f"stats_fork{j}")
        sp = bn.stats.payload
        m.d.comb += [par.stats.payload.sum_y.eq(sp.sum_y), par.stats.payload.S.eq(sp.S)]
        if lp.top:
            m.d.comb += [logit.consts.payload.c.eq(sp.C), logit.consts.payload.s.eq(sp.S_eff),
                         logit.consts.payload.last.eq(sp.last)]
        ports[f"seff{j}_w"].add(move, addr=st_count, data=sp.S_eff, en=1)
        pad = Const(0, self._alpha_w - len(sp.alpha_q))
        ports[f"alpha{j}_w"].add(move, addr=st_count, data=Cat(sp.alpha_q, pad, sp.S == 0), en=1)
        with m.If(stc()):
            m.d.sync += st_count.eq(0)
        with m.Elif(move):
            m.d.sync += st_count.eq(st_count + 1)
        fin = (st_count == lp.n_out) & (x_count == lp.beats) & ~par.busy
        if lp.top:
            fin = fin & self._output(m, plan, lp, a, stc, rr, to_bn, rg, logit, loss, ports, correct, rerun, ev)
        m.d.comb += [done[key].eq(fin), done[ikey].eq(fin)]
        if rkey in done:
            m.d.comb += done[rkey].eq(fin)

    def _output(self, m, plan, lp, a, stc, rr, to_bn, rg, logit, loss, ports, correct, rerun, ev):
        """Logits (third Y replay), loss gradient g into the top of YDX, logits into their buffer, correct count.

        The logit and loss units take ``nl = plan.loss_lanes`` classes per beat: each Y beat of ``lo`` lanes is
        split into ``lo / nl`` beats (those past the classes dropped), and the gradient beats are joined back
        into words of ``lo`` lanes for YDX (lanes past the classes 0)."""
        B, G, lo = plan.batch, lp.groups, lp.lanes_out
        nl, C = plan.loss_lanes, plan.classes
        parts = lo // nl
        yw = lp.widths["y"]
        sb = Signal(range(max(parts, 2)), name="logit_part")  # part of the Y beat going to the logit unit
        end = Signal(name="logit_sample_end")  # the sample's last part
        part_end = Signal(name="logit_part_end")  # the Y beat's last part
        # the sample's end and the beat's last part as constant tables indexed by (group, part): no adder and
        # compare in front of the replay's ready
        sbw = len(sb)
        ends = [int(s_ < parts and g * lo + s_ * nl + nl >= C) for g in range(G) for s_ in range(1 << sbw)]
        pends = [int(s_ < parts and (s_ == parts - 1 or e)) for g in range(G) for s_, e in
                 zip(range(1 << sbw), ends[g << sbw:(g + 1) << sbw], strict=True)]
        idx = Signal(len(ends).bit_length(), name="logit_part_index")

        def table(bits):
            return Const(sum(b << k for k, b in enumerate(bits)), len(bits))

        m.d.comb += [idx.eq(Cat(sb, rg)), end.eq(table(ends).bit_select(idx, 1)),
                     part_end.eq(table(pends).bit_select(idx, 1))]
        part = Signal(nl * yw, name="logit_y_part")
        with m.Switch(sb):
            for s_ in range(parts):
                with m.Case(s_):
                    m.d.comb += part.eq(rr.o.payload.data[s_ * nl * yw:(s_ + 1) * nl * yw])
        for lane in range(nl):
            m.d.comb += logit.y.payload.y[lane].eq(part[lane * yw:(lane + 1) * yw].as_signed())
        m.d.comb += [
            logit.y.payload.last.eq(end),
            logit.y.valid.eq(a & ~to_bn & rr.o.valid),
            rr.o.ready.eq(a & Mux(to_bn, self._bn_replay_ready, logit.y.ready & part_end)),
        ]
        with m.If(stc()):
            m.d.sync += sb.eq(0)
        with m.Elif(logit.y.valid & logit.y.ready):
            m.d.sync += sb.eq(Mux(part_end, 0, sb + 1))
        # logits -> loss unit and the logits buffer
        lw = plan.logit_width
        lg_count = Signal(range(B * plan.loss_groups + 1), name="logit_count")
        m.d.comb += logit.eval_mode.eq(self._phase_reg([("ifwd", lp.index)], "logit_eval"))
        for lane in range(nl):  # a training logit fits the loss unit's narrower lanes
            m.d.comb += loss.x.payload.x[lane].eq(logit.x.payload.x[lane])
        m.d.comb += [loss.x.payload.last.eq(logit.x.payload.last), loss.x.valid.eq(a & ~ev & logit.x.valid),
                     logit.x.ready.eq(a & (ev | loss.x.ready))]
        lg_take = Signal(name="logit_take")
        m.d.comb += lg_take.eq(a & logit.x.valid & (ev | loss.x.ready))
        cls_done = self._argmax(m, plan, stc(), lg_take & ev, logit.x.payload, ports)
        lg_word = Signal(nl * lw, name="logit_word")
        for lane in range(nl):
            m.d.comb += lg_word[lane * lw:(lane + 1) * lw].eq(logit.x.payload.x[lane])
        ports["lgb_w"].add(lg_take & ~rerun, addr=lg_count, data=lg_word, en=1)
        with m.If(stc()):
            m.d.sync += lg_count.eq(0)
        with m.Elif(lg_take):
            m.d.sync += lg_count.eq(lg_count + 1)
        # labels
        labr = self._sub("labels_reader", MemoryReader(width=plan.label_bits, depth=B))
        # not started in infer: a reader left holding a word would hand it to the next step's loss unit
        m.d.comb += [labr.start.eq(stc() & ~ev), labr.base.eq(0), labr.count.eq(B), labr.wrap.eq(0)]
        ports["lab_r"].add(a, addr=labr.r_addr, en=labr.r_en)
        m.d.comb += [labr.r_data.eq(ports["lab_r"].port.data), loss.label.payload.eq(labr.o.payload.data),
                     loss.label.valid.eq(a & ~ev & labr.o.valid), labr.o.ready.eq(a & ~ev & loss.label.ready)]
        # gradient: nl lanes per beat joined into words of lo lanes (a word ends after lo / nl parts or with the
        # sample); the parts taken so far wait in g_held
        gw = len(loss.g.payload.g[0])
        g_count = Signal(range(lp.beats + 1), name="g_count")
        g_take = Signal(name="g_take")
        m.d.comb += [loss.g.ready.eq(a), g_take.eq(a & loss.g.valid)]
        incoming = Signal(nl * gw, name="g_part")
        for lane in range(nl):
            m.d.comb += incoming[lane * gw:(lane + 1) * gw].eq(loss.g.payload.g[lane])
        g_word = Signal(lo * gw, name="g_word")
        if parts == 1:
            g_flush = g_take
            m.d.comb += g_word.eq(incoming)
        else:
            gs = Signal(range(parts), name="g_part_index")
            g_held = Signal(lo * gw, name="g_held", reset_less=True)
            g_flush = Signal(name="g_flush")
            m.d.comb += g_flush.eq(g_take & ((gs == parts - 1) | loss.g.payload.last))
            # part s of the word: taken now (s = gs), held (s < gs; each part's register loads only when that part
            # is taken, so no enable or clear reaches the whole word), or not come (s > gs, a short last word): 0
            for s_ in range(parts):
                sl = slice(s_ * nl * gw, (s_ + 1) * nl * gw)
                m.d.comb += g_word[sl].eq(Mux(gs == s_, incoming, Mux(gs > s_, g_held[sl], 0)))
                with m.If(g_take & (gs == s_)):
                    m.d.sync += g_held[sl].eq(incoming)
            with m.If(stc() | g_flush):
                m.d.sync += gs.eq(0)
            with m.Elif(g_take):
                m.d.sync += gs.eq(gs + 1)
        ports["ydx_w"].add(g_flush, addr=self._g_base + g_count, data=g_word, en=1)
        with m.If(stc()):
            m.d.sync += g_count.eq(0)
        with m.Elif(g_flush):
            m.d.sync += g_count.eq(g_count + 1)
        loss_done = Signal(name="loss_done")
        with m.If(stc()):
            m.d.sync += loss_done.eq(0)
        with m.Elif(loss.done):
            m.d.sync += loss_done.eq(1)
            if plan.undo:  # the loss register keeps the first run's loss, which the re-run's is compared with
                with m.If(rerun):
                    m.d.sync += self._loss_rose.eq(loss.loss_q > self._loss_q)
                with m.Else():
                    m.d.sync += [self._loss_q.eq(loss.loss_q), self._loss_rose.eq(0), correct.eq(loss.correct)]
            else:
                m.d.sync += [self._loss_q.eq(loss.loss_q), correct.eq(loss.correct)]
        return Mux(ev, cls_done, loss_done & (g_count == lp.beats))

    def _argmax(self, m, plan, st, take, payload, ports):
        """Infer: the class of every sample, the argmax of its eval logits (the first on ties, as numpy's argmax
        and the ``correct`` count of :func:`sim.hw.arith.loss_grad`), written into the labels memory at the
        sample's row; ``take``: a logit beat of ``nl`` classes (``last`` on a sample's last beat). Returns the
        signal that every sample of the batch has its class."""
        B, C, nl = plan.batch, plan.classes, plan.loss_lanes
        ng = plan.loss_groups
        real_last = C - (ng - 1) * nl
        lw = plan.logit_width
        og = Signal(range(max(ng, 2)), name="cls_beat")  # beat within the sample
        sample = Signal(range(B + 1), name="cls_sample")
        best_v = Signal(signed(lw), name="cls_best")
        best_i = Signal(range(max(C, 2)), name="cls_best_i")
        # the first maximum of this beat's real lanes (a lane past the classes only in the last beat)
        cand_v, cand_i = payload.x[0], Const(0, range(max(nl, 2)))
        for lane in range(1, nl):
            real = Const(1) if lane < real_last else (og != ng - 1)
            v = Signal(signed(lw), name=f"cls_v{lane}")
            i = Signal(range(max(nl, 2)), name=f"cls_i{lane}")
            better = real & (payload.x[lane] > cand_v)
            m.d.comb += [v.eq(Mux(better, payload.x[lane], cand_v)), i.eq(Mux(better, lane, cand_i))]
            cand_v, cand_i = v, i
        new = Signal(name="cls_new")
        nv = Signal(signed(lw), name="cls_new_v")
        ni = Signal(range(max(C, 2)), name="cls_new_i")
        m.d.comb += [new.eq((og == 0) | (cand_v > best_v)), nv.eq(Mux(new, cand_v, best_v)),
                     ni.eq(Mux(new, og * nl + cand_i, best_i))]
        end = Signal(name="cls_end")
        m.d.comb += end.eq(take & payload.last)
        # the class is written a cycle after its sample's last beat, from registers (timing: the logit queue's
        # word -> the compares -> the labels memory's write data, 12.6 ns in context on the ECP5 proxy at one
        # nextpnr seed); the phase's done comes from ``sample`` as before, and the labels are read by the host
        # only after the phase has ended
        end_q = Signal(name="cls_end_q")
        wa_q = Signal.like(sample, name="cls_wr_sample")
        wd_q = Signal.like(ni, name="cls_wr_class")
        m.d.sync += [end_q.eq(end), wa_q.eq(sample), wd_q.eq(ni)]
        ports["lab_w"].add(end_q, addr=wa_q, data=wd_q, en=1)
        with m.If(st):
            m.d.sync += [og.eq(0), sample.eq(0)]
        with m.Elif(take):
            m.d.sync += og.eq(Mux(payload.last, 0, og + 1))
            with m.If(payload.last):
                m.d.sync += sample.eq(sample + 1)
        # the running best loads under ``take`` alone (a sample's first beat replaces it whatever it held: ``new``
        # at og == 0), so the start pulse is not in its clock enable (one nextpnr seed's routed failing group of
        # the SMALL design: the start copy -> cls_best's enables)
        with m.If(take):
            m.d.sync += [best_v.eq(nv), best_i.eq(ni)]
        return sample == B

    def _pack_next(self, m, plan, lp, st, x_take, x_hat, ports, sub):
        """x_hat beats of layer j (lo bits) packed into the words of X_{j+1} (li_{j+1} bits), sample-major."""
        j = lp.index
        nxt = plan.layers[j + 1]
        lo, li, G = lp.lanes_out, nxt.lanes_in, lp.groups
        r = li // lo
        wr = sub(f"pack_rows{j + 1}", RowWriter(width=li, banks=nxt.lanes_b, words=nxt.words, rows=plan.batch))
        acc = Signal(li, name=f"pack_acc{j}")
        slot = Signal(range(max(r, 2)), name=f"pack_slot{j}")
        g = Signal(range(max(G, 2)), name=f"pack_g{j}")
        word = Signal(li, name=f"pack_word{j}")
        cases = [acc | (x_hat << (s * lo)) for s in range(r)]
        with m.Switch(slot):
            for s in range(r):
                with m.Case(s):
                    m.d.comb += word.eq(cases[s])
        flush = Signal(name=f"pack_flush{j}")
        m.d.comb += [flush.eq(x_take & ((slot == r - 1) | (g == G - 1))), wr.start.eq(st), wr.valid.eq(flush),
                     wr.data.eq(word)]
        with m.If(st):
            m.d.sync += [acc.eq(0), slot.eq(0), g.eq(0)]
        with m.Elif(x_take):
            m.d.sync += g.eq(Mux(g == G - 1, 0, g + 1))
            with m.If(flush):
                m.d.sync += [acc.eq(0), slot.eq(0)]
            with m.Else():
                m.d.sync += [acc.eq(word), slot.eq(slot + 1)]
        a = Signal(name=f"pack_act{j}")
        m.d.comb += a.eq(x_take)
        for i in range(nxt.lanes_b):
            ports[f"xb{j + 1}_{i}_w"].add(flush, addr=wr.w_addr, data=wr.w_data, en=wr.w_en[i])

    def _x_hat_from_next(self, m, plan, lp, st, a, feed, ports):
        """x_hat of hidden layer ``j`` in BN beat order, read from ``XB_{j+1}`` (where ``_pack_next`` put it) in
        step with ``feed`` (beat ``b * G + g`` of each of its two passes): word ``g // r`` of row ``b``, slot ``g % r``
        (``r = li_{j+1} / lo``). The selects are taken with each read; the word waits on the read port with the
        feed's."""
        j = lp.index
        nxt = plan.layers[j + 1]
        lo, li, G, B, lb, W = lp.lanes_out, nxt.lanes_in, lp.groups, plan.batch, nxt.lanes_b, nxt.words
        r = li // lo
        g = Signal(range(max(G, 2)), name=f"xh_g{j}")
        slot = Signal(range(max(r, 2)), name=f"xh_slot{j}")
        k = Signal(range(max(W, 2)), name=f"xh_k{j}")
        b = Signal(range(max(B, 2)), name=f"xh_b{j}")
        bank = Signal(range(max(lb, 2)), name=f"xh_bank{j}")
        base = Signal(range(max(-(-B // lb) * W, 2)), name=f"xh_base{j}")  # (b // lanes_b) * W
        s_slot = Signal.like(slot, name=f"xh_s_slot{j}")
        s_bank = Signal.like(bank, name=f"xh_s_bank{j}")
        issue = Signal(name=f"xh_issue{j}")
        m.d.comb += issue.eq(a & feed.r_en)
        for i in range(lb):
            ports[f"xb{j + 1}_{i}_r"].add(a, addr=base + k, en=feed.r_en)
        with m.If(st):
            m.d.sync += [g.eq(0), slot.eq(0), k.eq(0), b.eq(0), bank.eq(0), base.eq(0)]
        with m.Elif(issue):
            m.d.sync += [s_slot.eq(slot), s_bank.eq(bank)]
            with m.If(g == G - 1):  # next row (after the last row: the second pass from row 0)
                m.d.sync += [g.eq(0), slot.eq(0), k.eq(0)]
                with m.If(b == B - 1):
                    m.d.sync += [b.eq(0), bank.eq(0), base.eq(0)]
                with m.Else():
                    m.d.sync += b.eq(b + 1)
                    next_sample_row(m, bank, base, lb, W)
            with m.Else():
                m.d.sync += g.eq(g + 1)
                with m.If(slot == r - 1):
                    m.d.sync += [slot.eq(0), k.eq(k + 1)]
                with m.Else():
                    m.d.sync += slot.eq(slot + 1)
        words = Signal(li * lb, name=f"xh_words{j}")
        for i in range(lb):
            m.d.comb += words[i * li:(i + 1) * li].eq(ports[f"xb{j + 1}_{i}_r"].port.data)
        word = Signal(li, name=f"xh_word{j}")
        xh = Signal(lo, name=f"xh{j}")
        m.d.comb += word.eq(words.word_select(s_bank, li))
        m.d.comb += xh.eq(word.word_select(s_slot, lo))
        return xh
