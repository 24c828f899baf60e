"""xorshift32 random numbers for one weight layer's update sweep (docs/arithmetic.md section 8).

Generators: weight column ``c`` is cut into blocks of ``block`` (``hw.rng_block``) consecutive rows, each
with its own xorshift32 generator; within the layer, generator ``b * n_out + c`` serves block ``b`` of column
``c`` (the contract's numbering minus the layer's offset, :func:`layer_offset`). Their states live in one
``32 x n_blocks * n_out`` :class:`~amaranth.lib.memory.Memory` (block RAM), written and read back by the
host through ``host`` (seeding: ``state = sim.hw.rng.seed_state(hw.rng_seed, offset + g)``).

Order: one ``start`` produces one sweep's numbers in the order of the weight memory's update sweep
(:class:`rtl_gen.weight_memory.SweepGeometry`): one beat per visit with ``update_lanes`` numbers, number
``j`` for row ``row + j`` of the visit's column, each the next output of that row's generator (0 for
padding rows past ``n_in``, which do not advance any generator). Each column's rows come in increasing
order, so every generator advances once per weight it serves in increasing row order, as
:meth:`sim.hw.rng.RngBank.sweep` does.

Datapath: a visit takes its column's state from the state RAM when it starts a block (first chunk of the
block's first word), otherwise from a ``lanes_out``-entry lane file (distributed RAM) that holds each
lane's state between the words of a block; ``update_lanes`` numbers per cycle come from one state through
the jump matrices ``A^1 .. A^U`` of xorshift32 over GF(2) (each output bit an XOR of state bits, no
chained steps). The state after the visit goes back to the lane file, or to the state RAM at the block's
last word. Requires ``block % lanes_in == 0``, so a bank word never straddles two blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, reduce
from operator import xor

import numpy as np
from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from sim.hw.rng import xorshift32_next

from .shared import layer_port, per_layer
from .streams import KEEP, SkidBuffer, StreamFIFO, credit
from .weight_memory import SweepGeometry, rng_layout
from .xnor_engine import XnorGeometry, _check_int

__all__ = ["FANOUT_WEIGHT", "LATENCY", "RngEngine", "RngGeometry", "copy_groups", "jump_rows", "layer_offset"]

LATENCY = 7
"""Cycles of a sweep beyond one per visit with no backpressure, counted from the cycle ``start`` is high
(accepted) to the cycle the last beat is transferred, both included: ``visits + LATENCY`` (start, state-RAM
read, its output register, the state register, the numbers' register, the queue, its output slice)."""

QUEUE_DEPTH = 8
"""Beats of :class:`RngEngine`'s output queue. Its stages never stall: a visit is issued only while the queue has
room for it and for every visit already in the stages (a credit counter), so no ``ready`` reaches the stages'
enables. Eight covers the loop from an issue to its credit's return (the four stages, the queue, the credit's
register) with one beat a cycle."""


def layer_offset(cfg, layer_index: int) -> int:
    """Index of weight layer ``layer_index``'s first generator in the contract's numbering."""
    block = cfg.hw.rng_block
    return sum(-(-s.fan_in // block) * s.out_channels for s in cfg.weight_layers()[:layer_index])


FANOUT_WEIGHT = 1024
"""XOR inputs per copy of a generator's state in :class:`RngEngine` (about 32 loads a state bit)."""


def copy_groups(update_lanes: int) -> list[list[int]]:
    """The numbers' jump matrices ``A^1 .. A^(U-1)`` in groups, each group read from one copy of the state: in order,
    a group closed when the next matrix would take it past :data:`FANOUT_WEIGHT` ones (``A^U`` has a copy of its
    own, the chain's)."""
    groups, weight = [], FANOUT_WEIGHT + 1
    for n in range(1, update_lanes):
        w = sum(len(r) for r in jump_rows(n))
        if weight + w > FANOUT_WEIGHT:
            groups.append([])
            weight = 0
        groups[-1].append(n)
        weight += w
    return groups


@cache
def jump_rows(n: int) -> tuple[tuple[int, ...], ...]:
    """Rows of ``A^n`` (``A`` = one xorshift32 step over GF(2)): bit ``i`` of the ``n``-th next state is the
    XOR of the state bits listed in row ``i``. Built from :func:`sim.hw.rng.xorshift32_next` on basis vectors."""
    cols = []
    for j in range(32):
        x = 1 << j
        for _ in range(n):
            x = xorshift32_next(x)
        cols.append(x)
    return tuple(tuple(j for j in range(32) if cols[j] >> i & 1) for i in range(32))


@dataclass(frozen=True, kw_only=True)
class RngGeometry:
    """``sweep`` (:class:`SweepGeometry`) and ``block`` (rows per generator, a multiple of ``lanes_in``)."""

    sweep: SweepGeometry
    block: int

    def __post_init__(self):
        if not isinstance(self.sweep, SweepGeometry):
            raise TypeError(f"sweep must be a SweepGeometry, not {self.sweep!r}")
        _check_int("block", self.block, 1, 1 << 20)
        if self.block % self.sweep.bank.lanes_in:
            raise ValueError(
                f"block (hw.rng_block) must be a multiple of lanes_in = {self.sweep.bank.lanes_in}, not {self.block}"
            )

    @classmethod
    def from_config(cls, cfg, layer_index: int, *, lanes_in: int, lanes_out: int, update_lanes: int) -> RngGeometry:
        """The generators of weight layer ``layer_index`` of ``cfg`` (``hw.rng_block`` rows each)."""
        layers = cfg.weight_layers()
        _check_int("layer_index", layer_index, 0, len(layers) - 1)
        n_in, n_out = layers[layer_index].weight_shape
        bank = XnorGeometry(n_in=n_in, n_out=n_out, lanes_in=lanes_in, lanes_out=lanes_out)
        return cls(sweep=SweepGeometry(bank=bank, update_lanes=update_lanes), block=cfg.hw.rng_block)

    @property
    def host_layout(self) -> data.StructLayout:
        """Host port payload: ``write``, ``addr`` (generator), ``data`` (state)."""
        return data.StructLayout({"write": 1, "addr": range(self.generators), "data": 32})

    @property
    def n_blocks(self) -> int:
        return -(-self.sweep.bank.n_in // self.block)

    @property
    def generators(self) -> int:
        """Generators of the layer (rows of the state RAM): ``n_blocks * n_out``."""
        return self.n_blocks * self.sweep.bank.n_out

    @property
    def words_per_block(self) -> int:
        return self.block // self.sweep.bank.lanes_in

    def cycles(self) -> int:
        """Cycles of one sweep without backpressure (see :data:`LATENCY`)."""
        return self.sweep.visits + LATENCY

    def numbers(self, u) -> np.ndarray:
        """Per-weight numbers ``u`` (``(n_in, n_out)``, one sweep of :meth:`sim.hw.rng.RngBank.sweep`) as the
        engine's beats: ``(visits, update_lanes)`` uint32, 0 for padding."""
        return self.sweep.gather(np.asarray(u, dtype=np.uint32), pad=0)


class RngEngine(wiring.Component):
    """The xorshift32 generators of one layer, or of several layers (one engine, their phases never
    overlap), producing one sweep of numbers per ``start``.

    Parameters (keyword-only): ``geometry`` (:class:`RngGeometry`), or ``geometries`` (one per layer, all with
    the same ``update_lanes``: the jump matrices); :meth:`from_config` derives one. With several layers the
    layers' generators follow each other in the state RAM, every geometry constant of the sweep (words,
    groups, lanes, chunks, the partial last chunk) is picked by the ``layer`` input at run time, and the
    host port's ``addr`` is the generator within the selected layer.

    Ports:
        start: ``In(1)`` start a sweep (sampled while idle).
        busy: ``Out(1)`` a sweep is in progress (until its last beat is transferred).
        u: ``Out(stream.Signature(rng_layout(update_lanes)))`` one beat per visit, ``last`` on the last.
        host: ``In(stream.Signature(host_layout))`` ``write``, ``addr`` (generator), ``data`` (state);
            ready while idle and no read response is pending.
        host_rdata: ``Out(stream.Signature(32))`` the state, one per host read.
        layer: ``In(range(len(geometries)))`` (several layers only) the layer of the sweep or host access;
            hold it while they run.
    """

    def __init__(self, *, geometry: RngGeometry | None = None, geometries=None):
        geos = per_layer(geometry, geometries, RngGeometry, key=lambda g: g.sweep.update_lanes, unit="RngEngine",
                         agree="update_lanes")
        self._geos = geos
        self._geometry = geos[0]
        U = geos[0].sweep.update_lanes
        super().__init__(
            {
                **layer_port(len(geos)),
                "start": In(1),
                "busy": Out(1),
                "u": Out(stream.Signature(rng_layout(U))),
                "host": In(stream.Signature(self.host_layout)),
                "host_rdata": Out(stream.Signature(32)),
            }
        )

    @classmethod
    def from_config(cls, cfg, layer_index: int, *, lanes_in: int, lanes_out: int, update_lanes: int) -> RngEngine:
        """The generators of weight layer ``layer_index`` of ``cfg`` (see :meth:`RngGeometry.from_config`)."""
        geo = RngGeometry.from_config(
            cfg, layer_index, lanes_in=lanes_in, lanes_out=lanes_out, update_lanes=update_lanes
        )
        return cls(geometry=geo)

    @property
    def geometry(self) -> RngGeometry:
        """The (first) layer's geometry."""
        return self._geometry

    @property
    def geometries(self) -> list[RngGeometry]:
        return list(self._geos)

    @property
    def host_layout(self) -> data.StructLayout:
        """Host port payload: ``write``, ``addr`` (generator within the layer), ``data`` (state)."""
        return data.StructLayout({"write": 1, "addr": range(max(max(g.generators for g in self._geos), 2)),
                                  "data": 32})

    def elaborate(self, platform):
        geos = self._geos
        U = geos[0].sweep.update_lanes
        n_layers = len(geos)
        total = sum(g.generators for g in geos)
        m = Module()

        # per-layer constants of the sweep, picked by the layer input ("1" = minus one)
        def mx(f):
            return max(f(g) for g in geos)

        consts = {
            "K1": (lambda g: g.sweep.bank.words - 1, mx(lambda g: g.sweep.bank.words)),
            "G1": (lambda g: g.sweep.bank.groups - 1, mx(lambda g: g.sweep.bank.groups)),
            "D1": (lambda g: g.sweep.bank.depth - 1, mx(lambda g: g.sweep.bank.depth)),
            "L1": (lambda g: g.sweep.bank.lanes_out - 1, mx(lambda g: g.sweep.bank.lanes_out)),
            "L": (lambda g: g.sweep.bank.lanes_out, mx(lambda g: g.sweep.bank.lanes_out) + 1),
            "M": (lambda g: g.sweep.bank.n_out, mx(lambda g: g.sweep.bank.n_out) + 1),
            "C1": (lambda g: g.sweep.chunks - 1, mx(lambda g: g.sweep.chunks)),
            "CL1": (lambda g: g.sweep.chunks_last - 1, mx(lambda g: g.sweep.chunks)),
            "LL1": (lambda g: g.sweep.lanes_last - 1, mx(lambda g: g.sweep.bank.lanes_out)),
            "VL": (lambda g: g.sweep.valid_last, U + 1),
            "W1": (lambda g: g.words_per_block - 1, mx(lambda g: g.words_per_block)),
        }
        c = {k: Signal(range(max(hi, 2)), name=f"c_{k}") for k, (_, hi) in consts.items()}
        c["base"] = Signal(range(max(total, 2)), name="c_base")  # the layer's first generator in the state RAM
        sel = self.layer if n_layers > 1 else Const(0, 1)
        with m.Switch(sel):
            for i, geo in enumerate(geos):
                with m.Case(i):
                    m.d.comb += [c[k].eq(f(geo)) for k, (f, _) in consts.items()]
                    m.d.comb += c["base"].eq(sum(h.generators for h in geos[:i]))

        # the output queue and its registered slice; the stages move every cycle (no stall enable fanning out to
        # every stage's registers: timing, the queue's ready into the stages' enables and the visit counters was
        # the generators' worst path in context on the ECP5 proxy, 12.95 ns at one nextpnr seed), and a visit
        # is issued only while ``credit``, the queue's free entries less the visits in the stages, is not zero
        m.submodules.queue = queue = StreamFIFO(shape=rng_layout(U), depth=QUEUE_DEPTH)
        m.submodules.out_slice = out_slice = SkidBuffer(shape=rng_layout(U))

        # --- stage 0: the visit counters and the state-RAM read ---
        running = Signal()
        addr = Signal(range(mx(lambda g: g.sweep.bank.depth)))
        k = Signal(range(mx(lambda g: g.sweep.bank.words)))
        g = Signal(range(mx(lambda g: g.sweep.bank.groups)))
        lane = Signal(range(mx(lambda g: g.sweep.bank.lanes_out)))
        chunk = Signal(range(mx(lambda g: g.sweep.chunks)))
        wib = Signal(range(mx(lambda g: g.words_per_block)))  # word in block
        n_gen_max = mx(lambda g: g.generators)
        block_base = Signal(range(n_gen_max + mx(lambda g: g.sweep.bank.n_out)))  # b * n_out
        group_base = Signal(range(mx(lambda g: g.sweep.bank.groups * g.sweep.bank.lanes_out)))  # g * lanes_out
        gen = Signal(range(max(total, 2) + mx(lambda g: g.sweep.bank.groups * g.sweep.bank.lanes_out)))
        last_chunk = Signal()
        last_lane = Signal()
        last_word = Signal()
        last_visit = Signal()
        first_of_block = Signal()
        last_of_block = Signal()
        m.d.comb += [
            last_chunk.eq((chunk == c["C1"]) | ((k == c["K1"]) & (chunk == c["CL1"]))),
            last_lane.eq((lane == c["L1"]) | ((g == c["G1"]) & (lane == c["LL1"]))),
            last_word.eq(k == c["K1"]),
            last_visit.eq(last_chunk & last_lane & (addr == c["D1"])),
            first_of_block.eq(wib == 0),
            last_of_block.eq((wib == c["W1"]) | last_word),
            gen.eq(c["base"] + block_base + group_base + lane),
        ]
        issue = Signal()
        pop = Signal()  # a beat leaves the queue
        has_credit = credit(m, QUEUE_DEPTH, take=issue, give=pop, name="queue")
        m.d.comb += [issue.eq(running & has_credit), pop.eq(queue.o.valid & queue.o.ready)]
        with m.If(issue):
            with m.If(last_chunk):
                m.d.sync += chunk.eq(0)
                with m.If(last_lane):
                    m.d.sync += [lane.eq(0), addr.eq(addr + 1)]
                    with m.If(last_word):
                        m.d.sync += [k.eq(0), wib.eq(0), block_base.eq(0), g.eq(g + 1),
                                     group_base.eq(group_base + c["L"])]
                    with m.Else():
                        m.d.sync += k.eq(k + 1)
                        with m.If(wib == c["W1"]):
                            m.d.sync += [wib.eq(0), block_base.eq(block_base + c["M"])]
                        with m.Else():
                            m.d.sync += wib.eq(wib + 1)
                with m.Else():
                    m.d.sync += lane.eq(lane + 1)
            with m.Else():
                m.d.sync += chunk.eq(chunk + 1)
            with m.If(last_visit):
                m.d.sync += running.eq(0)

        m.submodules.states = states = Memory(shape=32, depth=max(total, 2), init=[])
        ram_rd = states.read_port()
        ram_wr = states.write_port()
        L_max = mx(lambda g: g.sweep.bank.lanes_out)
        m.submodules.lane_file = lane_file = Memory(shape=32, depth=max(L_max, 2), init=[])
        lf_rd = lane_file.read_port(domain="comb")
        lf_wr = lane_file.write_port()

        # --- stage 1a: the state RAM's word arrives; stage 1b: it is registered (``ram_q``: the block RAM's output
        # drives no logic; the RAM's output through the choice below into the state copies was the generators'
        # worst path alone at the paper's widths on the ECP5 proxy, 10.88 ns, 6.7 of it logic). No hazard: a
        # generator's state is read from the RAM at the first word of its block and written back at the last, once
        # per sweep. ---
        # (``use_ram`` / ``use_lf`` and the ``chain_c`` copies below: where the visit's state comes from as it
        # enters stage 1, decided as it enters stage 1b, a stage early, so that the choice's selects are
        # flip-flops. The visit in stage 1 at that moment is the one in stage 1b now, as the stages move every
        # cycle; a gap between visits is a stage without ``valid``.)
        visit = data.StructLayout({"lane": lane.shape(), "gen": gen.shape(), "first_chunk": 1, "last_chunk": 1,
                                   "first_of_block": 1, "last_of_block": 1, "partial": 1, "last": 1,
                                   "use_ram": 1, "use_lf": 1})
        s1a_valid = Signal()
        s1a = Signal(visit)
        s1b_valid = Signal()
        s1b = Signal(visit)
        ram_q = Signal(32)
        # a block's first word takes the state RAM's word; a later word of the block the lane file's, unless the same
        # lane's previous word is the visit ahead (then leaving stage 1: a group of one lane, one chunk per word);
        # otherwise the state after the chunk ahead: from the XORs if that chunk is in stage 1, else from ``cur``
        v_ram, v_lf = Signal(), Signal()
        m.d.comb += [v_ram.eq(s1a.first_chunk & s1a.first_of_block),
                     v_lf.eq(s1a.first_chunk & ~s1a.first_of_block & ~(s1b_valid & (s1b.lane == s1a.lane)))]
        m.d.sync += s1a_valid.eq(issue)
        with m.If(issue):
            m.d.sync += [
                s1a.lane.eq(lane),
                s1a.gen.eq(gen),
                s1a.first_chunk.eq(chunk == 0),
                s1a.last_chunk.eq(last_chunk),
                s1a.first_of_block.eq(first_of_block),
                s1a.last_of_block.eq(last_of_block),
                s1a.partial.eq(last_word & (chunk == c["CL1"])),
                s1a.last.eq(last_visit),
            ]
        m.d.sync += s1b_valid.eq(s1a_valid)
        with m.If(s1a_valid):
            m.d.sync += [s1b.eq(s1a), s1b.use_ram.eq(v_ram), s1b.use_lf.eq(v_lf), ram_q.eq(ram_rd.data)]

        # --- stage 1: the state, the numbers, the write-back. The state is a register (``state``), loaded as the
        # visit enters stage 1 with the state RAM's word (a block's first word), the lane file's word read in stage
        # 1b (a later word of the block) or the state after the previous chunk (``cur``, or the chunk leaving stage
        # 1 in that cycle), chosen by stage 1b's flags. The jump-matrix XORs then start at flip-flops: before, the
        # choice's registered selects fanned out to its 32 multiplexers and on into every XOR tree (``use_lf`` ->
        # the lane file's write data and the numbers' register, 13.9 ns in context on the ECP5 proxy at two
        # nextpnr seeds; earlier the lane file's read and the choice in front of the XORs, below 80 MHz). A
        # lane-file word read in stage 1b misses the write of the visit in stage 1 in that cycle; when that visit is
        # the same lane's previous word (a group of one lane, one chunk per word), its state is the chunk leaving
        # stage 1, and the visit takes it from there. ---
        s1_valid = Signal()
        s1 = Signal(visit)
        state = Signal(32, attrs=KEEP)
        cur = Signal(32)  # the state after the last chunk that left stage 1
        vls = sorted({geo.sweep.valid_last for geo in geos})
        pv = Signal(len(vls))  # one-hot: a partial last chunk with valid_last vls[i]
        vl_min = min(vls)
        pad = Signal(U)  # number j is a padding row of a partial last chunk
        # the lane file's write is registered (below): a word that is still in that register when stage 1b's
        # word is taken comes from the register instead of the file
        lf_w_en = Signal()
        lf_w_addr = Signal.like(lf_wr.addr)
        lf_w_data = Signal(32, reset_less=True)
        lf_bypass = Signal()
        m.d.comb += [lf_rd.addr.eq(s1b.lane), lf_bypass.eq(lf_w_en & (lf_w_addr == s1b.lane))]
        step = s1_valid
        # The state is held in copies (flip-flops marked KEEP): ``state`` feeds only the chain's matrix A^U, the
        # loop from chunk to chunk (state -> XORs -> state), and each further copy a group of the numbers' matrices
        # of about FANOUT_WEIGHT XOR inputs, so that no state bit drives more than about FANOUT_WEIGHT / 32 of them.
        # One register of 32 bits fed all of them (about 100 loads a bit at update_lanes 8), and the loop through
        # the XORs and the choice below was the generators' worst path in context on the ECP5 proxy (13.44 ns at
        # one nextpnr seed). The choice's selects are flip-flops (stage 1b's flags, one copy per state copy), so
        # the loop is the XORs and one multiplexer whose other input, ``ext``, is settled beside it.
        groups = copy_groups(U)
        copies = [state] + [Signal(32, name=f"state_c{i}", attrs=KEEP) for i in range(len(groups))]
        chains = [Signal(name=f"chain_c{i}", attrs=KEEP) for i in range(len(copies))]
        source = {U: state} | {n: copies[i + 1] for i, grp in enumerate(groups) for n in grp}
        outs = []
        for n in range(1, U + 1):
            out = Signal(32, name=f"x{n}")
            m.d.comb += out.eq(Cat(*(reduce(xor, (source[n][j] for j in row)) for row in jump_rows(n))))
            outs.append(out)
        ext = Signal(32)  # the state when the visit does not continue the chunk in stage 1
        m.d.comb += ext.eq(Mux(s1b.use_ram, ram_q, Mux(s1b.use_lf, Mux(lf_bypass, lf_w_data, lf_rd.data), cur)))
        with m.If(s1a_valid):
            m.d.sync += [ch.eq(~v_ram & ~v_lf & s1b_valid) for ch in chains]
        m.d.sync += s1_valid.eq(s1b_valid)
        with m.If(s1b_valid):
            m.d.sync += [cp.eq(Mux(ch, outs[U - 1], ext)) for cp, ch in zip(copies, chains, strict=True)]
            m.d.sync += [
                s1.eq(s1b),
                pv.eq(Cat(s1b.partial & (c["VL"] == v) for v in vls)),
                pad.eq(Cat(s1b.partial & (c["VL"] <= j) if j >= vl_min else Const(0) for j in range(U))),
            ]
        s1_last_chunk, s1_last_of_block, s1_partial = s1.last_chunk, s1.last_of_block, s1.partial
        # the state after the chunk: the output of its last real row
        nxt = Signal(32)
        m.d.comb += nxt.eq(Mux(s1_partial, reduce(lambda a, b: a | b, (Mux(pv[i], outs[v - 1], 0)
                                                                        for i, v in enumerate(vls))), outs[U - 1]))
        # ``cur`` takes the full chunk's state: a partial chunk is the last chunk of a block's last word, and the
        # visit after it starts a block (the state RAM's word), so ``cur`` is not read after it. The partial choice
        # stays out of the chunk-to-chunk loop (cur -> XORs -> cur; in context on the ECP5 proxy it was the
        # generators' worst path, 13.9 ns) and reaches only the write-back register.
        with m.If(step):
            m.d.sync += cur.eq(outs[U - 1])
        # the write-backs (lane file, state RAM) from registers a cycle later: the jump-matrix XORs and the partial
        # chunk's choice end at flip-flops, not at the LUT-RAM's write data across the die (13.9 ns in context,
        # docs/results/timing.md). The state RAM is read at a block's first word and written at its last, once a
        # sweep, so the later write meets no read of the same sweep.
        ram_w_en = Signal()
        ram_w_addr = Signal.like(s1.gen)
        m.d.sync += [
            lf_w_en.eq(step & s1_last_chunk & ~s1_last_of_block),
            lf_w_addr.eq(s1.lane),
            lf_w_data.eq(nxt),  # the word for either memory
            ram_w_en.eq(step & s1_last_chunk & s1_last_of_block),
            ram_w_addr.eq(s1.gen),
        ]
        m.d.comb += [
            lf_wr.addr.eq(lf_w_addr),
            lf_wr.data.eq(lf_w_data),
            lf_wr.en.eq(lf_w_en),
        ]

        # --- stage 2: the numbers are registered before the queue (its input multiplexer and the padding after the
        # XORs closed below 80 MHz in context) ---
        s2_valid = Signal()
        s2 = Signal(rng_layout(U), reset_less=True)  # what it holds matters only with s2_valid
        m.d.sync += [s2_valid.eq(s1_valid), s2.last.eq(s1.last)]
        m.d.sync += [s2.u[j].eq(Mux(pad[j], 0, outs[j])) for j in range(U)]
        m.d.comb += [
            queue.i.payload.eq(s2),
            queue.i.valid.eq(s2_valid),  # the credit keeps room for it
        ]
        wiring.connect(m, queue.o, out_slice.i)
        wiring.connect(m, out_slice.o, wiring.flipped(self.u))

        # --- start, busy and the host port ---
        busy = Signal()
        rd_issued = Signal()
        resp_valid = Signal()
        resp_data = Signal(32)
        h = self.host.payload
        m.d.comb += [
            busy.eq(running | s1a_valid | s1b_valid | s1_valid | s2_valid | queue.o.valid | out_slice.o.valid
                    | ram_w_en),
            self.busy.eq(busy),
            self.host.ready.eq(~busy & ~rd_issued & ~resp_valid & ~self.start),
            self.host_rdata.valid.eq(resp_valid),
            self.host_rdata.payload.eq(resp_data),
        ]
        host_go = self.host.valid & self.host.ready
        m.d.comb += [
            ram_rd.addr.eq(Mux(busy, gen, c["base"] + h.addr)),
            ram_rd.en.eq(Mux(busy, issue, host_go & ~h.write)),
            ram_wr.addr.eq(Mux(busy, ram_w_addr, c["base"] + h.addr)),
            ram_wr.data.eq(Mux(busy, lf_w_data, h.data)),
            ram_wr.en.eq(Mux(busy, ram_w_en, host_go & h.write)),
        ]
        m.d.sync += rd_issued.eq(host_go & ~h.write)
        with m.If(self.host_rdata.ready):
            m.d.sync += resp_valid.eq(0)
        with m.If(rd_issued):
            m.d.sync += [resp_valid.eq(1), resp_data.eq(ram_rd.data)]
        with m.If(self.start & ~busy & ~rd_issued & ~resp_valid):
            m.d.sync += [
                running.eq(1),
                addr.eq(0),
                k.eq(0),
                g.eq(0),
                lane.eq(0),
                chunk.eq(0),
                wib.eq(0),
                block_base.eq(0),
                group_base.eq(0),
            ]
        return m
