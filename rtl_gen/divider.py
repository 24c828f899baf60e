"""Pipelined restoring integer divider with stream request/response ports (a ring of registered stages).

One unsigned division ``dividend = quotient * divisor + remainder`` (``0 <= remainder < divisor``) per request,
``steps`` quotient bits per clock cycle in total. The quotient width is a construction parameter, and the
caller guarantees the quotient fits in it: ``dividend < divisor << quotient_width``. The cost then depends on
the quotient width only, however wide the dividend is, and each subtractor is only a few bits wider than the
divisor. A request that breaks the precondition (or divides by zero) is answered with ``overflow = 1`` and an
unspecified quotient and remainder.

Algorithm (restoring, most significant quotient bit first): with ``I = ceil(Wq / steps)`` loops and
``Wq' = I * steps`` the dividend is split as ``hi * 2**Wq' + lo``; the precondition gives ``hi < divisor``, so
the partial remainder starts as ``R = hi``. Each radix-2 step shifts the next bit of ``lo`` into ``R`` (now
``< 2 * divisor``) and subtracts the divisor when ``R >= divisor``, shifting the outcome in as the next
quotient bit; ``lo`` and the quotient share one shift register. The steps are taken two at a time (radix 4:
the next two bits against ``d``, ``2 d`` and ``3 d`` in parallel, one carry chain each; see
:func:`_radix4_stage`), with one radix-2 step last when ``steps`` is odd.

Structure (the timing reason): the ``steps`` bits of a cycle are ``P = ceil(steps / 2)`` **stages**, each one
radix-4 (or the last radix-2) step followed by a register, closed into a ring: a division enters stage 0
from a request register (its first step taken into an entry register on the way), walks the stages and goes
round the ring ``I`` times, its last step written into the response register (below). So no clock cycle holds
more than one carry chain (nor any of the requester's logic: the request is registered first), and the ring
holds up to ``P`` divisions at once, one per stage. Measured on the ECP5 proxy (``nextpnr-ecp5`` out of
context, the small MLP's BN divider, 31 / 17 / 14 bits): one radix-4 stage per cycle 100.6 MHz, where two
chained in one cycle (the former sequential divider at 4 bits per cycle) closed at 63.8 MHz and four chained
radix-2 steps at 39.9 MHz.

The ring's stages move every cycle (no stall enable reaches them). A finished division leaves the last stage
into the output queue: the response register, and a FIFO behind it that fills only while the requester does
not take responses. A request enters the ring only while a credit counter (the queue's ``P + 1`` entries,
:attr:`Divider.queue_depth`, less the divisions in the ring and in the queue) is not zero, so the queue never
overflows however long the requester waits; ``P + 1`` entries let a division enter in the cycle its slot's
finished division is offered, so a requester that takes every response at once never waits for credit.

Timing (:attr:`Divider.latency`, :meth:`Divider.cycles`): the response is offered ``2 + I * P`` cycles after
its request transfer when the ring has room, and held until taken. A request's first step (stage 0's, loop 0)
is taken from the request register into an entry register; the division enters the ring (stage 0's register)
from there when the slot arriving there is free (empty, or its division leaves the ring in that cycle) and the
credit allows; up to ``P`` requests are taken back to back, so ``P`` divisions take ``I * P`` cycles of ring time: the
throughput of the former sequential divider (one division per ``I`` cycles) when the requester keeps ``P``
in flight. Responses come back in request order (:func:`ring_schedule` gives the cycle of each when they are
taken at once).
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

__all__ = ["CONST_DIV_LATENCY", "CONST_DIV_PARTS", "Divider", "const_divide", "const_reciprocal", "divide", "latency",
           "ring_schedule"]

MAX_WIDTH = 256


def _check_int(name: str, value: object, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in {lo}..{hi}, not {value!r}")
    return value


def divide(dividend: int, divisor: int, quotient_width: int) -> tuple[int, int, bool]:
    """What :class:`Divider` answers, in Python: ``(quotient, remainder, overflow)``.

    ``overflow`` is true when ``divisor == 0`` or the quotient needs more than ``quotient_width`` bits;
    the quotient and remainder are then ``0`` here (the hardware's are unspecified)."""
    if divisor == 0 or dividend >> quotient_width >= divisor:
        return 0, 0, True
    return dividend // divisor, dividend % divisor, False


def stages(steps: int) -> int:
    """Registered stages of a :class:`Divider` resolving ``steps`` quotient bits per cycle."""
    return -(-steps // 2)


def iterations(quotient_width: int, steps: int) -> int:
    """Trips round the ring per division (:attr:`Divider.iterations`)."""
    return -(-quotient_width // steps)


def latency(quotient_width: int, steps: int) -> int:
    """:attr:`Divider.latency` without building one: ``2 + iterations * stages``."""
    return 2 + iterations(quotient_width, steps) * stages(steps)


class Divider(wiring.Component):
    """Unsigned pipelined divider (see the module docstring).

    Parameters (keyword-only):
        dividend_width: bits of the dividend, 1..256.
        divisor_width: bits of the divisor, 1..256.
        quotient_width: bits of the quotient, 1..256; requests must satisfy
            ``dividend < divisor << quotient_width`` (else ``overflow``).
        steps: quotient bits resolved per cycle over all stages, 1..quotient_width (``ceil(steps / 2)``
            registered stages of two bits, the last of one when ``steps`` is odd).

    Ports:
        req: ``In(stream.Signature(req_layout))``, payload ``dividend`` (low bits) then ``divisor``.
        resp: ``Out(stream.Signature(resp_layout))``, payload ``quotient`` (low bits), ``remainder``,
            ``overflow``.
    """

    def __init__(self, *, dividend_width: int, divisor_width: int, quotient_width: int, steps: int = 1):
        self._wn = _check_int("dividend_width", dividend_width, 1, MAX_WIDTH)
        self._wd = _check_int("divisor_width", divisor_width, 1, MAX_WIDTH)
        self._wq = _check_int("quotient_width", quotient_width, 1, MAX_WIDTH)
        self._steps = _check_int("steps", steps, 1, quotient_width)
        super().__init__(
            {"req": In(stream.Signature(self.req_layout)), "resp": Out(stream.Signature(self.resp_layout))}
        )

    @property
    def dividend_width(self) -> int:
        return self._wn

    @property
    def divisor_width(self) -> int:
        return self._wd

    @property
    def quotient_width(self) -> int:
        return self._wq

    @property
    def steps(self) -> int:
        return self._steps

    @property
    def stages(self) -> int:
        """Registered stages of the ring (divisions it holds at once), ``ceil(steps / 2)``."""
        return stages(self._steps)

    @property
    def iterations(self) -> int:
        """Trips round the ring per division, ``ceil(quotient_width / steps)``: the cycles per division at the
        full rate (with :attr:`stages` divisions in flight)."""
        return iterations(self._wq, self._steps)

    @property
    def latency(self) -> int:
        """Cycles from a request transfer to the first cycle its response is offered, when the ring has room:
        the request register, stage 0's first step into the entry register, then ``iterations`` trips round
        ``stages`` stages."""
        return latency(self._wq, self._steps)

    @property
    def queue_depth(self) -> int:
        """Entries of the output queue (the response register and the FIFO behind it), ``stages + 1``: the ring's
        divisions and the response being offered in the cycle a new division takes its slot."""
        return self.stages + 1

    @property
    def req_layout(self) -> data.StructLayout:
        return data.StructLayout({"dividend": self._wn, "divisor": self._wd})

    @property
    def resp_layout(self) -> data.StructLayout:
        return data.StructLayout({"quotient": self._wq, "remainder": self._wd, "overflow": 1})

    def cycles(self, count: int) -> int:
        """Cycles for ``count`` back-to-back divisions (requests always offered, responses always taken),
        from the first request transfer to the last response transfer, both included: the ring takes
        ``stages`` at a time, so division ``i = g P + k`` is answered ``2 + k + (g + 1) I P`` cycles after the
        first request transfer (0 for none)."""
        _check_int("count", count, 0, 1 << 40)
        if not count:
            return 0
        g, k = divmod(count - 1, self.stages)
        return 3 + k + (g + 1) * self.iterations * self.stages

    def elaborate(self, platform):
        m = Module()
        wn, wd, wq, s = self._wn, self._wd, self._wq, self._steps
        loops, P = self.iterations, self.stages
        wq_int = loops * s  # internal quotient width: a multiple of steps (extra bits are leading zeros)
        bits = [2] * (s // 2) + [1] * (s % 2)  # quotient bits of each stage

        # Payload registers have no reset (only the valid bits, the ring's ``recirc``, the output's valid bit and
        # the credit counter do): what they hold matters only where a valid bit says so.
        # request register
        in_valid = Signal(name="in_valid")
        in_n = Signal(wn, name="in_dividend", reset_less=True)
        in_d = Signal(wd, name="in_divisor", reset_less=True)
        in_d3 = Signal(wd + 2, name="in_divisor3", reset_less=True)  # 3 d, for the radix-4 stages (once a division)

        # the new division after stage 0's step (loop 0), waiting to enter the ring: the entry register
        pre_valid = Signal(name="pre_valid")
        pre_r = Signal(wd, name="pre_rem", reset_less=True)
        pre_q = Signal(wq_int, name="pre_shreg", reset_less=True)
        pre_d = Signal(wd, name="pre_divisor", reset_less=True)
        pre_d3 = Signal(wd + 2, name="pre_divisor3", reset_less=True)
        pre_o = Signal(name="pre_ovf", reset_less=True)

        # stage registers: loop count, partial remainder, dividend/quotient shift register, divisor, 3 divisor,
        # overflow; valid bits for the stages before the last (the last stage's division is ``recirc``'s, below)
        st_v = [Signal(name=f"st{k}_valid") for k in range(P - 1)]
        st_c = [Signal(range(loops), name=f"st{k}_loop", reset_less=True) for k in range(P)]
        st_r = [Signal(wd, name=f"st{k}_rem", reset_less=True) for k in range(P)]
        st_q = [Signal(wq_int, name=f"st{k}_shreg", reset_less=True) for k in range(P)]
        st_d = [Signal(wd, name=f"st{k}_divisor", reset_less=True) for k in range(P)]
        st_d3 = [Signal(wd + 2, name=f"st{k}_divisor3", reset_less=True) for k in range(P)]
        st_o = [Signal(name=f"st{k}_ovf", reset_less=True) for k in range(P)]

        last = P - 1
        recirc = Signal()  # the last stage's division goes round again (its slot is taken)
        enter = Signal()  # the entry register's division enters stage 0
        move = Signal()  # the request register's division takes stage 0's step into the entry register
        # The stages move every cycle: no enable reaches them (timing: the former stall enable, fanned out to every
        # stage register, in front of stage 0's carry chains closed at 79.4 MHz at the paper's widths on the ECP5
        # proxy). A finished division leaves the last stage into the output queue (``out``, the response register,
        # then ``spill``, a FIFO behind it while the requester does not take), and a request enters the ring only
        # while ``credit``, the queue's free entries less the divisions in the ring, is not zero: the queue never
        # overflows. Its depth, ``stages + 1`` (:attr:`queue_depth`), lets a division enter in the cycle its
        # slot's finished division is offered, so a requester that takes every response at once never waits.
        Q = self.queue_depth
        credit = Signal(range(Q + 1), init=Q, name="credit")
        out_v = Signal(name="resp_valid")
        out_p = Signal(self.resp_layout, name="resp_payload", reset_less=True)
        m.submodules.spill = spill = SyncFIFO(width=self.resp_layout.size, depth=Q - 1)
        fin = Signal(name="fin")  # a division finishes in the last stage at this edge
        fin_p = Signal(self.resp_layout, name="fin_payload")  # its response
        free = Signal(name="resp_free")  # the response register is empty or taken in this cycle
        taken = Signal(name="resp_taken")
        m.d.comb += [
            enter.eq(~recirc & pre_valid & (credit != 0)),
            move.eq(in_valid & (~pre_valid | enter)),
            self.req.ready.eq(~in_valid | move),
            self.resp.valid.eq(out_v),
            self.resp.payload.eq(out_p),
            taken.eq(out_v & self.resp.ready),
            free.eq(~out_v | self.resp.ready),
            spill.w_data.eq(fin_p),
            spill.w_en.eq(fin & (~free | spill.r_rdy)),
            spill.r_en.eq(free),
        ]
        with m.If(free):
            m.d.sync += [out_v.eq(spill.r_rdy | fin), out_p.eq(Mux(spill.r_rdy, spill.r_data, fin_p))]
        with m.If(enter & ~taken):
            m.d.sync += credit.eq(credit - 1)
        with m.Elif(taken & ~enter):
            m.d.sync += credit.eq(credit + 1)
        with m.If(self.req.valid & self.req.ready):
            dv = self.req.payload.divisor
            m.d.sync += [in_valid.eq(1), in_n.eq(self.req.payload.dividend), in_d.eq(dv), in_d3.eq(dv + (dv << 1))]
        with m.Elif(move):
            m.d.sync += in_valid.eq(0)

        # the request register's division (hi, lo, overflow check) takes stage 0's step into the entry register
        # (timing: the request's step and the choice between it and the recirculating division's, in one cycle
        # with the request register's divisor fanned out to the step's carry chains, closed at 92.4 MHz at the
        # paper's widths on the ECP5 proxy); stage 0 then chooses between its step of the recirculating division
        # and the entry register (a register: the choice folds into the step's last multiplexer level)
        hi = Signal(wd, name="hi")
        lo = Signal(wq_int, name="lo")
        if wn > wq_int:
            m.d.comb += hi.eq(in_n[wq_int:])
        m.d.comb += lo.eq(in_n[: min(wn, wq_int)])
        over = Signal(name="over")
        m.d.comb += over.eq((in_d == 0) | ((in_n >> wq) >= in_d))
        d0 = Signal(wd, name="d0")
        d30 = Signal(wd + 2, name="d30")
        o0, c0 = Signal(name="o0"), Signal(range(loops), name="c0")
        m.d.comb += [
            d0.eq(Mux(recirc, st_d[last], pre_d)),
            d30.eq(Mux(recirc, st_d3[last], pre_d3)),
            o0.eq(Mux(recirc, st_o[last], pre_o)),
            c0.eq(Mux(recirc, st_c[last] + 1, 0)),
        ]
        r_new, q_new = (_radix4_stage(m, hi, lo, in_d, in_d3, "s0_new") if bits[0] == 2
                        else _radix2_stage(m, hi, lo, in_d, "s0_new"))
        with m.If(move):
            m.d.sync += [pre_valid.eq(1), pre_r.eq(r_new), pre_q.eq(q_new), pre_d.eq(in_d), pre_o.eq(over)]
            if s >= 2:
                m.d.sync += pre_d3.eq(in_d3)
        with m.Elif(enter):
            m.d.sync += pre_valid.eq(0)
        # what enters the last stage: its division finishes there (``fin``) or goes round again (``recirc``,
        # registered: timing, the loop count's compare in front of stage 0's operand multiplexer)
        v_last, c_last = (recirc | enter, c0) if P == 1 else (st_v[last - 1], st_c[last - 1])
        m.d.comb += fin.eq(v_last & (c_last == loops - 1))
        m.d.sync += recirc.eq(v_last & (c_last != loops - 1))
        for k in range(P):

            def step(r, q, d, d3, name, k=k):  # one stage's quotient bits of (r, q) against d
                if bits[k] == 2:
                    return _radix4_stage(m, r, q, d, d3, name)
                return _radix2_stage(m, r, q, d, name)

            if k == 0:
                v_in, c_in, d_in, o_in, d3_in = recirc | enter, c0, d0, o0, d30
                # stage 0 steps the recirculating division and picks it or the entry register (timing:
                # ``recirc``'s fan-out into the operand multiplexer in front of the carry chains closed at 100 MHz
                # on the ECP5 proxy; now it reaches only the final choice)
                r_a, q_a = step(st_r[last], st_q[last], st_d[last], st_d3[last], "s0_loop")
                r_out, q_out = Mux(recirc, r_a, pre_r), Mux(recirc, q_a, pre_q)
            else:
                v_in, c_in, d_in, o_in, d3_in = st_v[k - 1], st_c[k - 1], st_d[k - 1], st_o[k - 1], st_d3[k - 1]
                r_out, q_out = step(st_r[k - 1], st_q[k - 1], d_in, d3_in, f"s{k}")
            if k < last:
                m.d.sync += st_v[k].eq(v_in)
            else:  # the last stage's step is also the response of a division that finishes
                m.d.comb += [fin_p.quotient.eq(q_out[:wq]), fin_p.remainder.eq(r_out), fin_p.overflow.eq(o_in)]
            m.d.sync += [st_c[k].eq(c_in), st_r[k].eq(r_out), st_q[k].eq(q_out), st_d[k].eq(d_in), st_o[k].eq(o_in)]
            if s >= 2:
                m.d.sync += st_d3[k].eq(d3_in)
        return m


def _radix2_stage(m, r, q, d, name: str):
    """One restoring step: ``trial = 2 r + (next dividend bit)`` against ``d``. Returns the next ``(r, q)``."""
    wd, wq = len(r), len(q)
    trial = Signal(wd + 1, name=f"{name}_trial")
    ge = Signal(name=f"{name}_ge")
    r_next = Signal(wd, name=f"{name}_r")
    q_next = Signal(wq, name=f"{name}_q")
    m.d.comb += [
        trial.eq(Cat(q[-1], r)),
        ge.eq(trial >= d),
        r_next.eq(Mux(ge, trial - d, trial)),
        q_next.eq(Cat(ge, q)),
    ]
    return r_next, q_next


def _radix4_stage(m, r, q, d, d3, name: str):
    """Two restoring steps at once: ``trial = 4 r + (next two dividend bits)`` (``< 4 d`` as ``r < d``) against
    ``d``, ``2 d`` and ``3 d`` (``d3``, added once per division) in parallel, so the stage's path is one carry
    chain (the timing reason: four chained compare-subtract steps per cycle closed at 35-47 MHz on the ECP5 proxy;
    ``3 d`` through a carry-save stage in front of its chain, 88 MHz in the loss unit). Returns the next
    ``(r, q)``."""
    wd, wq = len(r), len(q)
    w = wd + 3  # trial < 4 d < 2^(wd + 2); the differences are signed w-bit values (sign = top bit)
    trial = Signal(w, name=f"{name}_trial")
    dd = Signal(w, name=f"{name}_d")
    m.d.comb += [trial.eq(Cat(q[-2], q[-1], r)), dd.eq(d)]
    t1 = Signal(w, name=f"{name}_t1")
    t2 = Signal(w, name=f"{name}_t2")
    t3 = Signal(w, name=f"{name}_t3")
    m.d.comb += [t1.eq(trial - dd), t2.eq(trial - (dd << 1)), t3.eq(trial - d3)]
    ge1, ge2, ge3 = ~t1[-1], ~t2[-1], ~t3[-1]  # trial >= d, 2 d, 3 d (each implies the previous)
    r_next = Signal(wd, name=f"{name}_r")
    q_next = Signal(wq, name=f"{name}_q")
    m.d.comb += [
        r_next.eq(Mux(ge3, t3, Mux(ge2, t2, Mux(ge1, t1, trial)))),
        q_next.eq(Cat((ge1 & ~ge2) | ge3, ge2, q)),
    ]
    return r_next, q_next


def ring_schedule(stages: int, iterations: int, gaps) -> list[int]:
    """When :class:`Divider` (``stages``, ``iterations``) offers each response, in a requester's cycles, for a
    requester that offers request ``k`` ``gaps[k]`` cycles after request ``k - 1`` was taken (request 0 at cycle
    ``gaps[0]``) and takes every response as soon as it is offered. A request is taken when the request register
    is free (empty, or its division moves on in that cycle); it takes stage 0's step into the entry register the
    first cycle after that when the entry register is free (empty, or its division enters the ring in that
    cycle), and enters the ring the first cycle after that whose slot is free (``stages`` slots; a division
    occupies its slot ``iterations`` trips). Exact for the RTL: the cycle models of the units that overlap
    divisions follow from it."""
    period = stages * iterations
    entries: list[int] = []
    moves: list[int] = []
    out = []
    taken = None
    for gap in gaps:
        offer = gap if taken is None else taken + gap
        taken = offer if not moves else max(offer, moves[-1])
        mv = taken + 1 if not entries else max(taken + 1, entries[-1])
        t = mv + 1
        while _slot_busy(entries, t, stages, period):
            t += 1
        moves.append(mv)
        entries.append(t)
        out.append(t + period)
    return out


def _slot_busy(entries: list[int], t: int, stages: int, period: int) -> bool:
    """Whether a division that entered the ring at one of ``entries`` (sorted) arrives at stage 0 in cycle ``t``
    to go round again."""
    for e in reversed(entries):
        if t - e >= period:
            return False
        if (t - e) % stages == 0:
            return True
    return False


# ---- division by a configuration constant -------------------------------------------------------------------------
CONST_DIV_PARTS = (17, 17)
"""Bits of the parts :func:`const_divide` cuts the dividend and the reciprocal into: a 17 x 17 unsigned product
fits one 18 x 18 signed multiplier, the ECP5's MULT18 as well as a DSP48E1 (a 24-bit part spans two MULT18s,
joined by an adder in the product's cycle: 89.5 MHz for EPI2's dividends at the paper's widths on the ECP5 proxy).
A dividend that would need more than four such products is cut into 24-bit parts (one DSP48E1 each) instead."""

CONST_DIV_LATENCY = 5
"""Cycles from a dividend to its quotient in :func:`const_divide`: the dividend's parts registered, the partial
products, the products registered again, two of their sums, then the last sum, each registered (the registers
before and after each multiplier feed or are fed by that multiplier alone, so the placer can put them beside
it: timing, a multiplier between registers placed 26 columns away closed at 87.6 MHz at the paper's widths on
the ECP5 proxy, 7 ns of routing)."""


def _check_divisor(d: object) -> None:
    if not isinstance(d, int) or isinstance(d, bool) or d < 1:
        raise ValueError(f"the constant divisor must be an integer >= 1, not {d!r}")


def const_reciprocal(n_bits: int, d: int) -> tuple[int, int]:
    """``(r, s)`` with ``floor(n / d) == (n * r) >> s`` for every ``0 <= n < 2**n_bits`` (``d >= 1``).

    With ``l = ceil(log2 d)``, ``s = n_bits + l`` and ``r = floor(2^s / d) + 1``, the excess ``e = r d - 2^s`` is
    ``d - (2^s mod d)``, in ``1 .. d <= 2^l``. Then ``n r / 2^s = n / d + n e / (d 2^s)``, and the second term is
    below ``2^n_bits 2^l / (d 2^s) = 1 / d``; ``n / d`` is ``q + k / d`` with ``k <= d - 1``, so the sum stays
    below ``q + 1`` and its floor is ``q``. A power of two ``d`` is a shift (``r = 1``)."""
    _check_int("n_bits", n_bits, 1, MAX_WIDTH)
    _check_divisor(d)
    if d & (d - 1) == 0:
        return 1, d.bit_length() - 1
    lg = (d - 1).bit_length()
    s = n_bits + lg
    r = (1 << s) // d + 1
    assert 0 < r * d - (1 << s) <= 1 << lg
    return r, s


def const_divide(m: Module, value, d: int, name: str):
    """``floor(value / d)`` for the unsigned ``value`` and a configuration constant ``d >= 1``, as a Signal
    :data:`CONST_DIV_LATENCY` cycles after ``value`` (a pipeline: it takes a new value every cycle).

    A power-of-two factor of ``d`` is a shift first (``floor(floor(n / 2^k) / o) = floor(n / (2^k o))``); the
    product with :func:`const_reciprocal`'s ``r`` for the odd part is cut into :data:`CONST_DIV_PARTS` (at most
    four partial products, each registered: one multiplier each), then summed in two registered levels and
    shifted (timing: no product and no more than one addition in a cycle; each multiplier between registers of its
    own, :data:`CONST_DIV_LATENCY`)."""
    _check_divisor(d)
    k = (d & -d).bit_length() - 1
    odd = d >> k
    v = value[k:] if k < len(value) else Const(0, 1)
    n_bits = len(v)
    r, s = const_reciprocal(n_bits, odd)
    pv, pr = CONST_DIV_PARTS
    r_parts = [((r >> lo) & ((1 << pr) - 1), lo) for lo in range(0, r.bit_length(), pr)]
    if -(-n_bits // pv) * sum(rp != 0 for rp, _ in r_parts) > 4:
        pv = 24
    v_parts = [(v[lo:lo + pv], lo) for lo in range(0, n_bits, pv)]
    prods = []
    for vp, vlo in v_parts:
        for rp, rlo in r_parts:
            if rp == 0:
                continue
            i = len(prods)
            op = Signal(len(vp), name=f"{name}_op{i}", reset_less=True)
            pp = Signal(len(vp) + rp.bit_length(), name=f"{name}_pp{i}", reset_less=True)
            reg = Signal(len(pp), name=f"{name}_ppq{i}", reset_less=True)
            m.d.sync += [op.eq(vp), pp.eq(op * Const(rp, rp.bit_length())), reg.eq(pp)]
            prods.append(reg << (vlo + rlo))
    if len(prods) > 4:
        raise ValueError(f"{name}: a {n_bits}-bit dividend over {odd} needs {len(prods)} partial products (at most 4)")
    width = n_bits + r.bit_length()
    halves = [Signal(width, name=f"{name}_half{i}") for i in range(2)]
    for i, h in enumerate(halves):
        terms = prods[2 * i:2 * i + 2]
        m.d.sync += h.eq(sum(terms) if terms else 0)
    total = Signal(width, name=f"{name}_sum")
    m.d.sync += total.eq(halves[0] + halves[1])
    q = Signal(max(1, n_bits - (odd.bit_length() - 1)), name=f"{name}_q")
    m.d.comb += q.eq(total >> s)
    return q
