"""Sequential restoring integer divider with stream request/response ports.

One unsigned division ``dividend = quotient * divisor + remainder`` (``0 <= remainder < divisor``) at a
time, ``steps`` quotient bits per clock cycle. The quotient width is a construction parameter, and the
caller guarantees the quotient fits in it: ``dividend < divisor << quotient_width``. The cost then
depends on the quotient width only (``ceil(quotient_width / steps)`` cycles), however wide the dividend
is, and the subtractor is only ``divisor_width + 1`` bits wide. A request that breaks the precondition
(or divides by zero) is answered with ``overflow = 1`` and an unspecified quotient and remainder.

Algorithm (restoring, most significant quotient bit first): with ``I = ceil(Wq / steps)`` iterations and
``Wq' = I * steps`` the dividend is split as ``hi * 2**Wq' + lo``; the precondition gives ``hi < divisor``,
so the partial remainder starts as ``R = hi``. Each step shifts the next bit of ``lo`` into ``R`` (now
``< 2 * divisor``) and subtracts the divisor when ``R >= divisor``, shifting the outcome in as the next
quotient bit; ``lo`` and the quotient share one shift register. The steps of a cycle are taken two at a time
(radix 4: the next two bits against ``d``, ``2 d`` and ``3 d`` in parallel, one carry chain per pair; see
:func:`_radix4_stage`), with one radix-2 step last when ``steps`` is odd. Measured on the ECP5 proxy
(``nextpnr-ecp5`` out of context, the small MLP's BN divider, 31 / 17 / 14 bits): 4 steps 39.9 MHz as four
chained radix-2 steps, 63.8 MHz as two radix-4 stages (552 LUT4 against 844); 2 steps 100.6 MHz, 1 step
112.5 MHz.

Timing: the request transfer itself performs the first iteration; the response is offered ``I`` cycles
after the request transfer (:attr:`Divider.latency`) and held until taken. A new request is accepted in the
cycle the previous response is taken, so back-to-back divisions take ``I`` cycles each
(:meth:`Divider.cycles`).

This is the divider the per-channel sequencers share (BN forward: mean threshold, the three binarisation
thresholds and alpha). Its budget is a handful of divisions per channel per batch, far from the per-element
rate, so it trades speed for a narrow datapath.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["Divider", "divide"]

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


class Divider(wiring.Component):
    """Unsigned sequential divider (see the module docstring).

    Parameters (keyword-only):
        dividend_width: bits of the dividend, 1..256.
        divisor_width: bits of the divisor, 1..256.
        quotient_width: bits of the quotient, 1..256; requests must satisfy
            ``dividend < divisor << quotient_width`` (else ``overflow``).
        steps: quotient bits resolved per cycle (unrolled restoring stages), 1..quotient_width.

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
    def iterations(self) -> int:
        """Clock cycles per division, ``ceil(quotient_width / steps)``."""
        return -(-self._wq // self._steps)

    @property
    def latency(self) -> int:
        """Cycles from a request transfer to the first cycle its response is offered."""
        return self.iterations

    @property
    def req_layout(self) -> data.StructLayout:
        return data.StructLayout({"dividend": self._wn, "divisor": self._wd})

    @property
    def resp_layout(self) -> data.StructLayout:
        return data.StructLayout({"quotient": self._wq, "remainder": self._wd, "overflow": 1})

    def cycles(self, count: int) -> int:
        """Cycles for ``count`` back-to-back divisions (requests always offered, responses always taken),
        from the first request transfer to the last response transfer, both included:
        ``count * iterations + 1`` (0 for none)."""
        _check_int("count", count, 0, 1 << 40)
        return count * self.iterations + 1 if count else 0

    def elaborate(self, platform):
        m = Module()
        wn, wd, wq, s = self._wn, self._wd, self._wq, self._steps
        iters = self.iterations
        wq_int = iters * s  # internal quotient width: a multiple of steps (extra bits are leading zeros)

        rem = Signal(wd, name="rem")  # partial remainder, < divisor between iterations
        shreg = Signal(wq_int, name="shreg")  # remaining dividend bits (top) / quotient bits (bottom)
        div = Signal(wd, name="divisor_q")
        ovf = Signal(name="ovf")
        left = Signal(range(iters + 1), name="left")  # iterations still to run
        held = Signal(name="held")  # a division is in flight or its response is waiting

        take = Signal()
        load = Signal()
        m.d.comb += [
            self.req.ready.eq(~held | ((left == 0) & self.resp.ready)),
            load.eq(self.req.valid & self.req.ready),
            self.resp.valid.eq(held & (left == 0)),
            take.eq(self.resp.valid & self.resp.ready),
            self.resp.payload.quotient.eq(shreg[:wq]),
            self.resp.payload.remainder.eq(rem),
            self.resp.payload.overflow.eq(ovf),
        ]

        # Operands of this cycle's iterations: straight from the request when loading, else the registers.
        dividend = self.req.payload.dividend
        hi = Signal(wd, name="hi")
        lo = Signal(wq_int, name="lo")
        if wn > wq_int:
            m.d.comb += hi.eq(dividend[wq_int:])
        m.d.comb += lo.eq(dividend[: min(wn, wq_int)])
        r_in = Signal(wd, name="r_in")
        q_in = Signal(wq_int, name="q_in")
        d_in = Signal(wd, name="d_in")
        m.d.comb += [
            r_in.eq(Mux(load, hi, rem)),
            q_in.eq(Mux(load, lo, shreg)),
            d_in.eq(Mux(load, self.req.payload.divisor, div)),
        ]
        r, q = r_in, q_in
        for i in range(s // 2):  # two quotient bits per stage (radix 4), then one (radix 2) when steps is odd
            r, q = _radix4_stage(m, r, q, d_in, f"s{i}")
        if s % 2:
            trial = Signal(wd + 1, name="trial")
            ge = Signal(name="ge")
            r_next = Signal(wd, name="r_last")
            q_next = Signal(wq_int, name="q_last")
            m.d.comb += [
                trial.eq((r << 1) | q[-1]),
                ge.eq(trial >= d_in),
                r_next.eq(Mux(ge, trial - d_in, trial)),
                q_next.eq((q << 1) | ge),
            ]
            r, q = r_next, q_next

        with m.If(load):
            over = Signal()
            m.d.comb += over.eq((self.req.payload.divisor == 0) | ((dividend >> wq) >= self.req.payload.divisor))
            m.d.sync += [rem.eq(r), shreg.eq(q), div.eq(d_in), ovf.eq(over), left.eq(iters - 1), held.eq(1)]
        with m.Elif(held & (left != 0)):
            m.d.sync += [rem.eq(r), shreg.eq(q), left.eq(left - 1)]
        with m.Elif(take):
            m.d.sync += held.eq(0)
        return m


def _radix4_stage(m, r, q, d, name: str):
    """Two restoring steps at once: ``trial = 4 r + (next two dividend bits)`` (``< 4 d`` as ``r < d``) against
    ``d``, ``2 d`` and ``3 d`` in parallel, so the stage's path is one carry chain (the timing reason: four chained
    compare-subtract steps per cycle closed at 35-47 MHz on the ECP5 proxy). ``trial - 3 d`` needs no ``3 d``
    adder: ``trial + ~d + ~(2 d) + 2`` is reduced to two operands by a carry-save stage (one LUT level), and the
    ``+ 2`` rides in the free low bit of the carry vector (``+ 1``) and in a carry-in below the LSB (``+ 1``).
    Returns the next ``(r, q)``."""
    wd, wq = len(r), len(q)
    w = wd + 3  # trial < 4 d < 2^(wd + 2); the differences are signed w-bit values (sign = top bit)
    trial = Signal(w, name=f"{name}_trial")
    dd = Signal(w, name=f"{name}_d")
    m.d.comb += [trial.eq(Cat(q[-2], q[-1], r)), dd.eq(d)]
    t1 = Signal(w, name=f"{name}_t1")
    t2 = Signal(w, name=f"{name}_t2")
    m.d.comb += [t1.eq(trial - dd), t2.eq(trial - (dd << 1))]
    a, b, c = trial, Signal(w, name=f"{name}_nd"), Signal(w, name=f"{name}_n2d")
    m.d.comb += [b.eq(~dd), c.eq(~(dd << 1))]
    ssum = Signal(w, name=f"{name}_csa_s")
    carry = Signal(w, name=f"{name}_csa_c")
    m.d.comb += [ssum.eq(a ^ b ^ c), carry.eq(Cat(Const(1, 1), (a & b) | (a & c) | (b & c)))]
    wide = Signal(w + 1, name=f"{name}_t3w")  # (2 s + 1) + (2 c + 1) = 2 (s + c + 1)
    m.d.comb += wide.eq(Cat(Const(1, 1), ssum) + Cat(Const(1, 1), carry))
    t3 = Signal(w, name=f"{name}_t3")
    m.d.comb += t3.eq(wide[1:])
    ge1, ge2, ge3 = ~t1[-1], ~t2[-1], ~t3[-1]  # trial >= d, 2 d, 3 d (each implies the previous)
    r_next = Signal(wd, name=f"{name}_r")
    q_next = Signal(wq, name=f"{name}_q")
    m.d.comb += [
        r_next.eq(Mux(ge3, t3, Mux(ge2, t2, Mux(ge1, t1, trial)))),
        q_next.eq(Cat((ge1 & ~ge2) | ge3, ge2, q)),
    ]
    return r_next, q_next
