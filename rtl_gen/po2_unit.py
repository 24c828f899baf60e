"""po2_k quantisation of one layer's ``dY`` (:func:`sim.hw.arith.po2_quantise`, docs/arithmetic.md 5.2).

Per element, from ``Q`` and the channel's ``D = S'``, with the operand ``U = |Q| B`` (``|Q|`` for the output
layer) and the common mantissa width ``W`` (the ``sim.hw.widths`` width of ``U``, at least that of ``S'``):

* leading-one positions ``n = bitlen(U) - 1``, ``d = bitlen(D) - 1`` and mantissas ``M_U = U << (W-1-n)``;
* per channel, once: ``t = floor(sqrt2 M_D) = isqrt(2 M_D^2)`` with ``M_D = D << (W-1-d)``, so that
  ``T_hi = t + 1`` and ``T_lo = floor(t / 2) + 1`` (``sqrt2_thresholds``); ``t = floor(M_D c / 2^(2W+2))``
  with ``c = floor(sqrt2 2^(2W+2))``, computed by a right-shifting shift-add multiplier over the bits of
  ``D``'s normalised mantissa (``mul_steps`` bits per cycle, the accumulator in carry-save form:
  :func:`carry_save_step`; its one carry propagation is a registered cycle later, the ``t_mem`` write the cycle
  after);
* ``e0 = n - d + [M_U >= T_hi] - [M_U < T_lo]``, which is ``round(log2(U / D))`` (``round_log2_ratio``).

The scale of the layer's gradient only shifts every exponent by ``scale - Fa``, so pass 1 works with the
scale-free ``e0`` and the layer maximum ``top0 = max e0`` over the nonzero elements; the bias register is
``b = e_max - (top0 + scale - Fa)`` (``0`` for an all-zero layer) and every code follows from ``e0 - top0``:
field ``= max(e0 - top0 + e_max - e_min, 0) + 1`` (``0`` when ``Q = 0``), sign bit ``= Q < 0``.

Schedule (one layer, then it starts over):

======= =================================================================================================
PRO     ``s_eff``: one ``S'`` per channel in channel order -> ``t``, ``d`` per channel (``1 + ceil(Wd /
        mul_steps)`` cycles per channel, ``Wd`` the width of ``S'``; can overlap the BN backward pass)
PASS1   ``q`` in (batch-major, the BN backward unit's ``q`` layout) -> ``scratch`` out: per element ``e0``,
        sign and nonzero flag (the controller keeps them in the exponent scratch), layer maximum ``top0``;
        the datapath holds ``pass1_lanes`` lanes, so a beat takes ``parts = lanes / pass1_lanes`` cycles
BIAS    one ``bias`` beat: ``bias`` and ``unit_exp = e_min - bias`` (``scale`` sampled here)
PASS2   ``scratch_in`` (the scratch, in the same order) -> ``codes`` out
======= =================================================================================================

Cycle model (:meth:`Po2Unit.cycles`), from the first ``s_eff`` transfer to the last ``codes`` transfer,
inputs always offered and outputs always taken::

    M (1 + ceil(Wd / mul_steps)) + (B G parts + PASS1_STAGES) + (levels + 2) + (B G + 2)

with ``levels = max(1, ceil(log2(pass1_lanes)))``, the registered levels of the maximum tree.
"""

from __future__ import annotations

import math

from amaranth import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from sim.hw.widths import signed_bits

from .bn_unit import BnLayer, _BeatCounter, _Channels, _check_channels, _check_int, _LaneWalker, mul_const_fabric
from .shared import layer_port
from .streams import SkidBuffer, credit

__all__ = ["PASS1_STAGES", "SCALE_WIDTH", "Po2Unit", "carry_save_step", "normalise", "po2_cycles", "sqrt2_constant"]

SCALE_WIDTH = 16
"""Bits of the signed ``scale`` input and of the ``bias`` / ``unit_exp`` outputs."""


def sqrt2_constant(width: int) -> int:
    """``c = floor(sqrt2 2^(2 width + 2))``, the multiplier of the per-channel thresholds."""
    return math.isqrt(1 << (4 * width + 5))


def normalise(m: Module, value, width: int, name: str) -> tuple[Signal, Signal]:
    """Leading-zero count and left-aligned mantissa of the ``width``-bit ``value`` (combinational).

    Returns ``(lz, mant)`` with ``mant = value << lz`` having its top bit set (both meaningless for 0). A
    logarithmic shifter: at each level ``2^j`` (largest first) the value moves up by ``2^j`` when its top
    ``2^j`` bits are zero, and that decision is bit ``j`` of ``lz``."""
    levels = (width - 1).bit_length()
    v, lz = normalise_levels(m, value, width, reversed(range(levels)), name)
    return lz, v


def normalise_levels(m: Module, value, width: int, levels, name: str) -> tuple[Signal, Signal]:
    """The levels ``levels`` (shift ``2^j`` each, largest first) of :func:`normalise`, so that a pipeline can
    split them: returns the shifted value and the leading-zero count's bits of these levels (others 0).

    A level's decision tests the top ``2^j`` bits of the value as the levels above left it. That window is one
    of the input's windows, one per combination of the decisions above; all of them are tested in parallel on
    the input and the decisions above pick the test, earliest decision first (timing: tested on the shifted
    value, each level waited for the shift above it, 10 LUT levels for three levels of a 49-bit value)."""
    total = max((width - 1).bit_length(), 1)
    v_in = Signal(width, name=f"{name}_in")
    m.d.comb += v_in.eq(value)
    lz = Signal(total, name=f"{name}_lz")
    v = v_in
    done = []  # (shift, decision) of the levels above
    for j in levels:
        sh = 1 << j
        tests = []  # index: bit i set when the i-th level above shifted
        for combo in range(1 << len(done)):
            hi = width - sum(s for i, (s, _) in enumerate(done) if combo >> i & 1)
            if hi <= 0:  # everything shifted out: only zeros are left
                tests.append(Const(1))
                continue
            t = Signal(name=f"{name}_z{j}_w{combo}")
            m.d.comb += t.eq(v_in[max(hi - sh, 0) : hi] == 0)
            tests.append(t)
        for _, d in done:  # pick by the earliest decision first
            tests = [Mux(d, tests[k + 1], tests[k]) for k in range(0, len(tests), 2)]
        zero = Signal(name=f"{name}_z{j}")
        nxt = Signal(width, name=f"{name}_s{j}")
        m.d.comb += [zero.eq(tests[0]), nxt.eq(Mux(zero, v << sh, v)), lz[j].eq(zero)]
        done.append((sh, zero))
        v = nxt
    return v, lz


def carry_save_step(m: Module, acc_s, acc_c, cin, addends, shift: int, name: str) -> tuple[Signal, Signal, Signal]:
    """One step of a right-shifting carry-save accumulator (combinational): with ``V = acc_s + acc_c + cin +
    sum(addends)``, returns ``(s, c, cout)`` such that ``s + c + cout = V >> shift``.

    The operands are reduced to two by levels of 3:2 compressors (one LUT level each, no carry chain); ``cin``
    takes the free bit 0 of the first carry vector; only the ``shift`` bits shifted out are added (their carry is
    ``cout``). The frame is one bit wider than the widest operand, ``fw`` bits, and the caller keeps ``V`` below
    ``2^fw`` (every partial vector is at most ``V``, so no carry leaves the frame); ``s`` and ``c`` have
    ``fw - shift`` bits."""
    fw = max(len(v) for v in (acc_s, acc_c, *addends)) + 1
    operands = [acc_s, acc_c, *addends]
    cin_used = False
    level = 0
    while len(operands) > 2:
        nxt = []
        for i in range(0, len(operands) - 2, 3):
            a, b, d = operands[i : i + 3]
            s_v = Signal(fw, name=f"{name}_csa{level}_{i}_s")
            c_v = Signal(fw, name=f"{name}_csa{level}_{i}_c")
            m.d.comb += [s_v.eq(a ^ b ^ d), c_v[1:].eq((a & b) | (a & d) | (b & d))]
            if not cin_used:  # bit 0 of a carry vector is free
                m.d.comb += c_v[0].eq(cin)
                cin_used = True
            nxt += [s_v, c_v]
        nxt += operands[len(operands) - len(operands) % 3 :]
        operands = nxt
        level += 1
    lo_s, lo_c = (operands + [Const(0, fw)])[:2]
    low = Signal(shift + 1, name=f"{name}_low")
    # with fewer than three operands no compressor took cin: it joins the low add
    m.d.comb += low.eq(lo_s[:shift] + lo_c[:shift] + (0 if cin_used else cin))
    out_s = Signal(fw - shift, name=f"{name}_sum_next")
    out_c = Signal(fw - shift, name=f"{name}_carry_next")
    cout = Signal(name=f"{name}_cout")
    m.d.comb += [out_s.eq(lo_s >> shift), out_c.eq(lo_c >> shift), cout.eq(low[shift])]
    return out_s, out_c, cout


PASS1_STAGES = 6
"""Cycles of PASS1 between a ``q`` part and its push into the scratch queue: five registered stages (``|Q|``;
``|Q| B``; the normaliser's upper levels; its lower levels; the compares with the thresholds and the sums
``n - d + rho``, ``e0`` chosen by the compares as the beat is pushed) and the ``pend`` FIFO."""

PEND_DEPTH = 8
"""Beats of PASS1's ``pend`` FIFO, in front of the scratch queue: the beats a part in stage 1 may find ahead of it
(at most :data:`PASS1_STAGES`), so that the stages never wait."""


def po2_cycles(layer: BnLayer, mul_steps: int = 1, pass1_lanes: int | None = None) -> dict[str, int]:
    """Cycles of every phase of :class:`Po2Unit` and their ``total`` for one layer with no stalls: ``pro`` (from
    the first ``s_eff`` transfer), ``pass1`` (to the push of the last scratch beat; ``lanes / pass1_lanes``
    cycles per beat), ``bias`` (FIN and BIAS), ``pass2`` (to the last ``codes`` transfer)."""
    dw = layer.s_width
    iters = -(-dw // _check_int("mul_steps", mul_steps, 1, dw))
    parts = layer.lanes // _pass1_lanes(layer, pass1_lanes)
    # FIN: one cycle per level of the maximum tree and one for the running maximum; BIAS: one
    out = {"pro": layer.channels * (1 + iters), "pass1": layer.beats * parts + PASS1_STAGES,
           "bias": _max_levels(layer.lanes // parts) + 2,
           "pass2": layer.beats + 2}
    out["total"] = sum(out.values())
    return out


def _max_levels(lanes: int) -> int:
    """Registered levels of PASS1's maximum tree over ``lanes`` lanes (at least one: the part's maximum)."""
    return max(1, (lanes - 1).bit_length())


def _pass1_lanes(layer: BnLayer, pass1_lanes: int | None) -> int:
    if pass1_lanes is None:
        return layer.lanes
    _check_int("pass1_lanes", pass1_lanes, 1, layer.lanes)
    if layer.lanes % pass1_lanes:
        raise ValueError(f"pass1_lanes ({pass1_lanes}) must divide the lanes ({layer.lanes})")
    return pass1_lanes


class Po2Unit(wiring.Component):
    """po2_k codes of one layer (see the module docstring).

    Parameters (keyword-only): ``layer`` (:class:`rtl_gen.bn_unit.BnLayer`; ``layer.top`` selects the
    operand ``|Q|``), ``mul_steps`` (bits of the per-channel threshold multiplier per cycle), ``pass1_lanes``
    (lanes of the PASS1 datapath, dividing ``layer.lanes``; default all: a beat takes ``lanes / pass1_lanes``
    cycles of PASS1, and the per-lane normalise / compare logic shrinks by the same factor).

    Ports:
        s_eff: ``In(stream.Signature(unsigned(Wd)))`` ``S'`` per channel (PRO).
        q: ``In(stream.Signature(layer.q_layout))`` PASS1.
        scratch: ``Out(stream.Signature(scratch_layout))`` PASS1: per lane ``e0`` (signed), ``neg``, ``nz``.
        scratch_in: ``In(stream.Signature(scratch_layout))`` PASS2: the scratch beats, in order.
        bias: ``Out(stream.Signature(bias_layout))`` one beat after PASS1: ``bias``, ``unit_exp``.
        codes: ``Out(stream.Signature(codes_layout))`` PASS2: per lane ``field`` (k-1 bits, 0 = zero) then
            ``neg``; padding lanes 0.
        scale: ``In(signed(SCALE_WIDTH))`` the layer's gradient scale exponent (``scale_exp`` of the model),
            sampled in BIAS.
        phase: ``Out(3)``: 0 PRO, 1 PASS1, 2 FIN, 3 BIAS, 4 PASS2.
    """

    PRO, PASS1, FIN, BIAS, PASS2 = range(5)

    def __init__(self, *, layer: BnLayer, mul_steps: int = 1, channels=None, tops=None, pass1_lanes=None):
        if not isinstance(layer, BnLayer):
            raise TypeError(f"layer must be a BnLayer, not {layer!r}")
        self._layer = layer
        self._pass1_lanes = _pass1_lanes(layer, pass1_lanes)
        self._channels = _check_channels(layer, channels)
        self._tops = [layer.top] * len(self._channels) if tops is None else [bool(t) for t in tops]
        if len(self._tops) != len(self._channels):
            raise ValueError(f"tops must have one flag per layer ({len(self._channels)}), not {len(self._tops)}")
        self._dw = layer.s_width
        self._mul_steps = _check_int("mul_steps", mul_steps, 1, self._dw)
        super().__init__(
            {
                **layer_port(len(self._channels)),
                "s_eff": In(stream.Signature(unsigned(self._dw))),
                "q": In(stream.Signature(layer.q_layout)),
                "scratch": Out(stream.Signature(self.scratch_layout)),
                "scratch_in": In(stream.Signature(self.scratch_layout)),
                "bias": Out(stream.Signature(self.bias_layout)),
                "codes": Out(stream.Signature(self.codes_layout)),
                "scale": In(signed(SCALE_WIDTH)),
                "phase": Out(3),
            }
        )

    @classmethod
    def from_config(cls, cfg, layer_index: int, *, lanes: int, mul_steps: int = 1) -> Po2Unit:
        return cls(layer=BnLayer.from_config(cfg, layer_index, lanes=lanes), mul_steps=mul_steps)

    @property
    def bn_layer(self) -> BnLayer:
        return self._layer

    @property
    def times_batch(self) -> bool:
        """Whether the operand is ``|Q| B`` (hidden layers) rather than ``|Q|`` (output layer); for a unit
        shared by both kinds, whether it is for the first layer (the ``layer`` input picks at run time)."""
        return not self._tops[0]

    @property
    def width(self) -> int:
        """``W``: the common mantissa width (the width of the operand ``U``, at least that of ``S'``)."""
        return max(self._layer.widths["po2_num"], self._dw)

    @property
    def e_width(self) -> int:
        """Bits of the signed scratch exponent ``e0`` (in ``[-Wd, W]``)."""
        return signed_bits(max(self.width, self._dw))

    @property
    def mul_iterations(self) -> int:
        return -(-self._dw // self._mul_steps)

    @property
    def scratch_layout(self) -> data.StructLayout:
        lane = data.StructLayout({"e0": signed(self.e_width), "neg": 1, "nz": 1})
        return data.StructLayout({"e": data.ArrayLayout(lane, self._layer.lanes), "last": 1})

    @property
    def codes_layout(self) -> data.StructLayout:
        lane = data.StructLayout({"field": unsigned(self._layer.params.k - 1), "neg": 1})
        return data.StructLayout({"code": data.ArrayLayout(lane, self._layer.lanes), "last": 1})

    @property
    def bias_layout(self) -> data.StructLayout:
        return data.StructLayout({"bias": signed(SCALE_WIDTH), "unit_exp": signed(SCALE_WIDTH)})

    def cycles(self) -> dict[str, int]:
        return po2_cycles(self._layer, self._mul_steps, self._pass1_lanes)

    def elaborate(self, platform):
        lay = self._layer
        p = lay.params
        m = Module()
        ch = _Channels(m, lay, self._channels, self.layer if len(self._channels) > 1 else None)
        B, G, L = lay.batch, ch.max_groups, lay.lanes
        W, Wd, ew = self.width, self._dw, self.e_width
        if len(set(self._tops)) == 1:
            is_top = Const(int(self._tops[0]))
        else:  # the operand's factor B, per layer
            is_top = Signal(name="is_top")
            with m.Switch(self.layer):
                for i, t in enumerate(self._tops):
                    with m.Case(i):
                        m.d.comb += is_top.eq(int(t))
        PRO, PASS1, FIN, BIAS, PASS2 = self.PRO, self.PASS1, self.FIN, self.BIAS, self.PASS2

        phase = Signal(range(5), name="phase_r")
        m.d.comb += self.phase.eq(phase)

        t_layout = data.StructLayout({"t": unsigned(W + 1), "d": unsigned(max((Wd - 1).bit_length(), 1))})
        m.submodules.t_mem = t_mem = Memory(shape=data.ArrayLayout(t_layout, L), depth=G, init=[])
        t_rd, t_wr = t_mem.read_port(), t_mem.write_port(granularity=1)

        # ---- PRO: t = floor(sqrt2 M_D) per channel ----------------------------------------------------------
        walk = _LaneWalker(m, ch, "pro")
        ms, iters = self._mul_steps, self.mul_iterations
        pad = iters * ms - Wd
        c = sqrt2_constant(W)
        lz_s, mant_s = normalise(m, self.s_eff.payload, Wd, "norm_s")
        bits = Signal(iters * ms, name="mul_bits")  # S' mantissa (LSB first), consumed ms bits per cycle
        d_r = Signal(t_layout["d"].shape, name="d_r")
        left = Signal(range(iters + 1), name="mul_left")
        # The accumulator in carry-save form: ``acc = sum + carry + cin`` (the value of the right-shifting
        # multiplier, which stays below c). A cycle compresses sum, carry and the ms partial products with 3:2
        # compressors (no carry chain), shifts the ms low bits out and keeps only their carry (an ms-bit add) in
        # ``cin``; the one wide carry propagation is the write stage's, a registered cycle later.
        aw = c.bit_length() + 1
        acc_s = Signal(aw, name="mul_sum")
        acc_c = Signal(aw, name="mul_carry")
        cin = Signal(name="mul_cin")
        pps = []
        for j in range(ms):
            pp = Signal(c.bit_length() + j, name=f"mul_pp{j}")
            m.d.comb += pp.eq(Mux(bits[j], c << j, 0))
            pps.append(pp)
        s_next, c_next, cin_next = carry_save_step(m, acc_s, acc_c, cin, pps, ms, "mul")
        # the channel's carry resolved a cycle after its last step, registered, and written the cycle after
        # (timing: the resolving adder straight into every lane's t_mem write data closed at 86.5 MHz at the
        # paper's widths on the ECP5 proxy); PASS1 reads t_mem two cycles after its start at the earliest
        wr_pend = Signal(name="t_wr_pend")  # the channel's carry resolution, one cycle after its last step
        wr_pend2 = Signal(name="t_wr_pend2")  # its write
        wr_g = Signal.like(walk.g, name="t_wr_g")
        wr_l = Signal.like(walk.l, name="t_wr_l")
        wr_g2 = Signal.like(walk.g, name="t_wr_g2")
        wr_l2 = Signal.like(walk.l, name="t_wr_l2")
        t_full = Signal(aw + 1, name="mul_resolved")
        m.d.comb += t_full.eq(acc_s + acc_c + cin)
        t_word = Signal(t_layout)
        with m.If(wr_pend):
            m.d.sync += [t_word.t.eq(t_full >> (W + 2)), t_word.d.eq(d_r), wr_g2.eq(wr_g), wr_l2.eq(wr_l)]
        m.d.comb += [
            t_wr.addr.eq(wr_g2),
            t_wr.en.eq(Mux(wr_pend2, 1 << wr_l2, 0)),
        ]
        for lane in range(L):
            m.d.comb += t_wr.data[lane].eq(t_word)
        m.d.sync += [wr_pend.eq(0), wr_pend2.eq(wr_pend)]
        top0 = Signal(signed(ew), name="top0")
        any_nz = Signal(name="any_nz")
        with m.If(phase == PRO):
            with m.If(left == 0):
                m.d.comb += self.s_eff.ready.eq(1)
                with m.If(self.s_eff.valid):
                    m.d.sync += [bits.eq(mant_s << pad), acc_s.eq(0), acc_c.eq(0), cin.eq(0),
                                 d_r.eq(Wd - 1 - lz_s), left.eq(iters)]
            with m.Else():
                m.d.sync += [acc_s.eq(s_next), acc_c.eq(c_next), cin.eq(cin_next),
                             bits.eq(bits >> ms), left.eq(left - 1)]
                with m.If(left == 1):
                    m.d.sync += [wr_pend.eq(1), wr_g.eq(walk.g), wr_l.eq(walk.l)]
                    walk.next_channel(m)
                    with m.If(walk.last_lane & walk.last_group):
                        m.d.sync += [phase.eq(PASS1), top0.eq(-(1 << (ew - 1))), any_nz.eq(0)]

        # ---- element passes ---------------------------------------------------------------------------------
        in_done = Signal()
        accept = Signal()
        cnt = _BeatCounter(m, ch, B, accept, "in")
        with m.If(accept & cnt.last):
            m.d.sync += in_done.eq(1)

        # PASS1: s1 |Q| (x B) -> s2, s2b normalise (half of the shifter's levels each) -> s3 compare with t -> s4 e0,
        # push; then the running maximum. The
        # datapath holds ``pl = pass1_lanes`` lanes: a beat of L lanes goes through it as ``parts = L / pl`` parts
        # (one per cycle), their results are joined in ``joined`` and the beat is pushed with its last part.
        pl, parts = self._pass1_lanes, L // self._pass1_lanes
        m.submodules.scratch_queue = sq = SkidBuffer(shape=self.scratch_layout)
        # The stages move every cycle (no stall enable fanning out to every stage's registers: timing, the
        # queue's ready into them closed at 98.9 MHz at the paper's widths on the ECP5 proxy). A beat's results
        # wait in ``pend`` (a FIFO in front of the scratch queue) when the queue is full, and a part enters stage 1
        # only while ``pend`` has room for every beat already in the stages (``credit``).
        m.submodules.pend = pend = SyncFIFO(width=self.scratch_layout.size + 1, depth=PEND_DEPTH)
        stages = ("1", "2", "2b", "3", "4")
        s_valid = [Signal(name=f"s{i}_valid") for i in stages]
        s_last = [Signal(name=f"s{i}_last") for i in stages]  # the layer's last part
        s_lg = [Signal(name=f"s{i}_last_group") for i in stages]
        s_g = [Signal(range(G), name=f"s{i}_g") for i in stages]
        s_part = [Signal(range(max(parts, 2)), name=f"s{i}_part") for i in stages]
        s_push = [Signal(name=f"s{i}_push") for i in stages]  # the beat's last part
        part = Signal(range(max(parts, 2)), name="part")
        last_part = Signal(name="last_part")
        m.d.comb += [
            last_part.eq(part == parts - 1),
        ]
        take = Signal(name="part_take")  # a part of the q beat enters s1
        pop = Signal()  # a beat leaves pend
        has_credit = credit(m, PEND_DEPTH, take=take & last_part, give=pop, name="pend")
        m.d.comb += [
            take.eq((phase == PASS1) & ~in_done & has_credit & self.q.valid),
            self.q.ready.eq((phase == PASS1) & ~in_done & has_credit & last_part),
        ]
        if parts > 1:
            with m.If(take):
                m.d.sync += part.eq(Mux(last_part, 0, part + 1))
        q_shape = signed(lay.widths["Q"])
        q_part = Signal(data.ArrayLayout(q_shape, pl))
        real_part = Signal(pl)
        real_all = Signal(L)
        m.d.comb += real_all.eq(Cat(ch.real(lane, cnt.last_group) for lane in range(L)))
        with m.Switch(part):
            for pi in range(parts):
                with m.Case(pi):
                    m.d.comb += [
                        q_part.as_value().eq(self.q.payload.q.as_value().word_select(pi, pl * q_shape.width)),
                        real_part.eq(real_all[pi * pl : (pi + 1) * pl]),
                    ]
        # stage 1 holds |Q|, its sign and Q != 0 (timing: the negation, then |Q| B, in one cycle with the
        # multiplier's parts joined by adders closed at 64 MHz at the paper's widths on the ECP5 proxy)
        s1_a = Signal(data.ArrayLayout(unsigned(lay.widths["Q"]), pl))
        s1_neg = Signal(pl)
        s1_nz = Signal(pl)
        s1_real = Signal(pl)
        s2_u = Signal(data.ArrayLayout(unsigned(W), pl))
        s2_neg = Signal(pl)
        s2_nz = Signal(pl)
        nlev = (W - 1).bit_length()  # the normaliser's levels: the upper half in stage 2, the rest in stage 2b
        hi_levels = list(reversed(range(nlev)))[: nlev // 2]
        lo_levels = list(reversed(range(nlev)))[nlev // 2 :]
        s2b_v = Signal(data.ArrayLayout(unsigned(W), pl))
        s2b_lz = Signal(data.ArrayLayout(unsigned(max(nlev, 1)), pl))
        s2b_neg = Signal(pl)
        s2b_nz = Signal(pl)
        s3_n = Signal(data.ArrayLayout(unsigned(max((W - 1).bit_length(), 1)), pl))
        s3_mant = Signal(data.ArrayLayout(unsigned(W), pl))
        s3_neg = Signal(pl)
        s3_nz = Signal(pl)
        s4_neg = Signal(pl)
        s4_nz = Signal(pl)
        m.d.sync += [
            s_valid[0].eq(take),
            s_last[0].eq(cnt.last & last_part),
            s_lg[0].eq(cnt.last_group),
            s_g[0].eq(cnt.g),
            s_part[0].eq(part),
            s_push[0].eq(last_part),
        ]
        for x in (s_valid, s_last, s_lg, s_g, s_part, s_push):
            m.d.sync += [x[k].eq(x[k - 1]) for k in range(1, len(stages))]
        m.d.sync += [
            *(s1_a[lane].eq(Mux(q_part[lane] < 0, -q_part[lane], q_part[lane])) for lane in range(pl)),
            s1_neg.eq(Cat(q_part[lane] < 0 for lane in range(pl))),
            s1_nz.eq(Cat(q_part[lane] != 0 for lane in range(pl))),
            s1_real.eq(real_part),
        ]
        scratch = Signal(self.scratch_layout, name="scratch_beat")  # the beat pushed by stage 4, into ``pend``
        joined = Signal(self.scratch_layout)  # the parts of the beat so far
        lane_layout = self.scratch_layout["e"].shape.elem_shape
        new = Signal(data.ArrayLayout(lane_layout, pl))  # this part's results
        # t_mem is read for the part in stage 2 and the part's thresholds are registered into stage 3
        t_part = Signal(data.ArrayLayout(t_layout, pl))
        s3_t = Signal(data.ArrayLayout(t_layout, pl))
        with m.Switch(s_part[2]):
            for pi in range(parts):
                with m.Case(pi):
                    m.d.comb += t_part.as_value().eq(t_rd.data.as_value().word_select(pi, pl * t_layout.size))
        m.d.sync += s3_t.eq(t_part)
        mx_valid = Signal()
        mx_e = Signal(data.ArrayLayout(signed(ew), pl))
        mx_nz = Signal(pl)
        for lane in range(pl):
            a = Signal(unsigned(lay.widths["Q"]), name=f"abs{lane}")
            m.d.comb += a.eq(s1_a[lane])
            v_mid, lz_hi = normalise_levels(m, s2_u[lane], W, hi_levels, f"norm{lane}_a")
            mant, lz_lo = normalise_levels(m, s2b_v[lane], W, lo_levels, f"norm{lane}_b")
            lz = Signal(max(nlev, 1), name=f"norm{lane}_lz")
            m.d.comb += lz.eq(s2b_lz[lane] | lz_lo)
            t = s3_t[lane]
            # e0 = n - d + rho: stage 3 compares and forms the three sums side by side, stage 4 picks one by rho
            # (timing: the 49-bit compares and the choice into the scratch queue in one cycle closed at 77 MHz
            # at the paper's widths on the ECP5 proxy, 80 % of it routing)
            above, below = Signal(name=f"above{lane}"), Signal(name=f"below{lane}")
            nd = [Signal(signed(ew), name=f"nd{lane}_{k}") for k in ("m1", "0", "p1")]
            e0 = Signal(signed(ew), name=f"e0_{lane}")
            m.d.sync += [
                above.eq(s3_mant[lane] > t.t),
                below.eq(s3_mant[lane] <= (t.t >> 1)),
                *(v.eq(s3_n[lane] - t.d + k) for v, k in zip(nd, (-1, 0, 1), strict=True)),
                s4_neg[lane].eq(s3_neg[lane]),
                s4_nz[lane].eq(s3_nz[lane]),
            ]
            m.d.comb += [
                e0.eq(Mux(above, nd[2], Mux(below, nd[0], nd[1]))),
                new[lane].e0.eq(e0),
                new[lane].neg.eq(s4_neg[lane]),
                new[lane].nz.eq(s4_nz[lane]),
            ]
            m.d.sync += [
                s2_u[lane].eq(self._operand(a, B, is_top)),
                s2_neg[lane].eq(s1_neg[lane]),
                s2_nz[lane].eq(s1_nz[lane] & s1_real[lane]),
                s2b_v[lane].eq(v_mid),
                s2b_lz[lane].eq(lz_hi),
                s2b_neg[lane].eq(s2_neg[lane]),
                s2b_nz[lane].eq(s2_nz[lane]),
                s3_n[lane].eq(W - 1 - lz),
                s3_mant[lane].eq(mant),
                s3_neg[lane].eq(s2b_neg[lane]),
                s3_nz[lane].eq(s2b_nz[lane]),
            ]
        # the beat is pushed with its last part: the last part's results go to the queue as they are, the
        # earlier parts' from ``joined``, where each was kept as it passed stage 4
        lane_bits = lane_layout.size
        for pi in range(parts):
            sl = slice(pi * pl * lane_bits, (pi + 1) * pl * lane_bits)
            if pi == parts - 1:
                m.d.comb += scratch.e.as_value()[sl].eq(new.as_value())
            else:
                m.d.comb += scratch.e.as_value()[sl].eq(joined.e.as_value()[sl])
                with m.If(s_valid[4] & (s_part[4] == pi)):
                    m.d.sync += joined.e.as_value()[sl].eq(new.as_value())
        pushed = Signal(self.scratch_layout)
        m.d.comb += [
            t_rd.addr.eq(s_g[1]),
            t_rd.en.eq(1),
            scratch.last.eq(s_lg[4]),
            pend.w_en.eq(s_valid[4] & s_push[4]),
            pend.w_data.eq(Cat(scratch.as_value(), s_last[4])),
            pushed.eq(pend.r_data[:-1]),
            sq.i.valid.eq(pend.r_rdy),
            sq.i.payload.eq(pushed),
            pend.r_en.eq(sq.i.ready),
            pop.eq(pend.r_rdy & sq.i.ready),
        ]
        wiring.connect(m, sq.o, wiring.flipped(self.scratch))
        m.d.sync += mx_valid.eq(s_valid[4])
        for lane in range(pl):
            m.d.sync += [mx_e[lane].eq(new[lane].e0), mx_nz[lane].eq(new[lane].nz)]
        # Maximum over the part's nonzero lanes: a tree with a register after each level (one compare per cycle:
        # ECP5 timing proxy, docs/results.md), then into the running maximum; FIN waits for the last part.
        terms = []
        for lane in range(pl):
            v = Signal(signed(ew), name=f"max_in{lane}")
            m.d.comb += v.eq(Mux(mx_nz[lane], mx_e[lane], -(1 << (ew - 1))))
            terms.append(v)
        t_valid, t_nz = mx_valid, mx_nz.any()
        for level in range(_max_levels(pl)):
            nxt = []
            for i in range(0, len(terms) - 1, 2):
                v = Signal(signed(ew), name=f"max_l{level}_{i}")
                m.d.sync += v.eq(Mux(terms[i] >= terms[i + 1], terms[i], terms[i + 1]))
                nxt.append(v)
            if len(terms) % 2:
                v = Signal(signed(ew), name=f"max_l{level}_{len(terms) - 1}")
                m.d.sync += v.eq(terms[-1])
                nxt.append(v)
            terms = nxt
            nv, nz = Signal(name=f"max_l{level}_valid"), Signal(name=f"max_l{level}_nz")
            m.d.sync += [nv.eq(t_valid), nz.eq(t_nz)]
            t_valid, t_nz = nv, nz
        with m.If(t_valid):
            m.d.sync += any_nz.eq(any_nz | t_nz)
            with m.If(terms[0] > top0):
                m.d.sync += top0.eq(terms[0])
        fin_wait = Signal(range(_max_levels(pl) + 1), name="fin_wait")
        with m.If((phase == PASS1) & pop & pend.r_data[-1]):
            m.d.sync += [phase.eq(FIN), in_done.eq(0)]
        with m.If(phase == FIN):
            with m.If(fin_wait == _max_levels(pl)):
                m.d.sync += [phase.eq(BIAS), fin_wait.eq(0)]
            with m.Else():
                m.d.sync += fin_wait.eq(fin_wait + 1)

        # BIAS: b = e_max - (top0 + scale - Fa); unit_exp = e_min - b.
        bias = Signal(signed(SCALE_WIDTH + 2))
        m.d.comb += [
            bias.eq(Mux(any_nz, p.e_max + p.alpha_frac - top0 - self.scale, 0)),
            self.bias.payload.bias.eq(bias),
            self.bias.payload.unit_exp.eq(p.e_min - bias),
            self.bias.valid.eq(phase == BIAS),
        ]
        with m.If(self.bias.valid & self.bias.ready):
            m.d.sync += phase.eq(PASS2)

        # PASS2: field = max(e0 - top0 + span, 0) + 1 for nonzero elements.
        m.submodules.codes_queue = cq = SkidBuffer(shape=self.codes_layout)
        adv2 = Signal()
        r_valid = Signal()
        r = Signal(self.scratch_layout)
        r_last = Signal()
        m.d.comb += [
            adv2.eq(~r_valid | cq.i.ready),
            self.scratch_in.ready.eq((phase == PASS2) & ~in_done & adv2),
            accept.eq((self.q.valid & self.q.ready) | (self.scratch_in.valid & self.scratch_in.ready)),
        ]
        with m.If(adv2):
            m.d.sync += [
                r_valid.eq(self.scratch_in.valid & self.scratch_in.ready),
                r.eq(self.scratch_in.payload),
                r_last.eq(cnt.last),
            ]
        r_lastg = Signal()
        with m.If(adv2):
            m.d.sync += r_lastg.eq(cnt.last_group)
        for lane in range(L):
            rel = Signal(signed(ew + 1), name=f"rel{lane}")
            f = Signal(unsigned(p.k - 1), name=f"field{lane}")
            m.d.comb += [
                rel.eq(r.e[lane].e0 - top0 + p.span),
                f.eq(Mux(r.e[lane].nz, Mux(rel < 0, 0, rel) + 1, 0)),
            ]
            real = ch.real(lane, r_lastg)
            m.d.comb += [
                cq.i.payload.code[lane].field.eq(Mux(real, f, 0)),
                cq.i.payload.code[lane].neg.eq(r.e[lane].neg & real),
            ]
        m.d.comb += [cq.i.valid.eq(r_valid), cq.i.payload.last.eq(r_lastg)]
        wiring.connect(m, cq.o, wiring.flipped(self.codes))
        with m.If((phase == PASS2) & r_valid & r_last & adv2):
            m.d.sync += [phase.eq(PRO), in_done.eq(0)]
        return m

    def _operand(self, a, B: int, is_top):
        """``|Q| B`` for a hidden layer, ``|Q|`` for the output layer (``is_top``)."""
        if len(set(self._tops)) == 1:
            return a if self._tops[0] else mul_const_fabric(a, B)
        return Mux(is_top, a, mul_const_fabric(a, B))
