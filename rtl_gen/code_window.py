"""The codes of the windowed sign gradient, ``hw.dw_window = d`` (docs/arithmetic.md 5.4).

``sgn(dW) = sgn(X^T t)`` with ``t`` ternary: in each column (output channel) of a layer's po2 codes, a code whose
exponent field lies within ``d`` planes of the column's largest field over the batch counts as its sign (+-1),
every other code as 0 (golden: :func:`sim.hw.arith.dw_window_ternary`). The dW engine needs no new arithmetic
for it: a ternary value is the po2 code of field 1 (``+-2^0``) or the zero code, so the engine's exact sums of
the rewritten codes are ``X^T t``.

:class:`CodeWindow` does the rewriting for one layer in two steps that the step's phases already separate:

- ``bwd j``: the po2 unit's code beats (sample by sample, groups ``0 .. G-1`` of ``lanes`` codes in turn) pass
  ``track``; the unit keeps each column's largest field in a ring of ``G`` registers of ``lanes`` fields whose
  head is the group of the beat: the head is raised to the beat's fields and moved to the tail, so the ring
  turns once per beat and is back at group 0 after every sample (no ``G``-way multiplexer, no memory port);
- ``upd j``: the dW operand stream goes through ``codes_in`` -> ``codes_out`` combinationally (``banks`` samples
  a beat, each of ``lanes`` codes), rewritten against the head; its groups come in order (``g`` outer, as
  :class:`rtl_gen.buffers.TileReader` reads them), and ``advance`` (the last beat of a group taken) turns the
  ring once. After the ``G`` groups the ring is back at group 0. Both turns take effect a cycle later, from
  registers (see :meth:`CodeWindow.elaborate`), so the rewrite may start from the second cycle after the last
  tracked beat (the phases in between take more).

``clear`` (the start of ``bwd j``) sets every field to 0; the head's position needs no reset, since tracking
starts at the head whatever group it held before. No cycle is added to any phase.
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .xnor_engine import _check_int as _check

__all__ = ["CodeWindow", "rewrite"]


class CodeWindow(wiring.Component):
    """Column maxima and the ternary rewrite of ``hw.dw_window`` for one layer (see the module docstring).

    Parameters: ``lanes`` (codes a beat, the layer's ``lanes_out``), ``groups`` (``G``), ``code_bits`` (``k``:
    ``k - 1`` field bits, then the sign; the codes buffer's lane layout), ``window`` (``d >= 1``), ``banks``
    (samples a dW beat).

    Ports: ``clear``, ``track``, ``track_codes`` (``lanes`` codes), ``advance``, ``codes_in`` / ``codes_out``
    (``banks x lanes`` codes, bank-major, as the codes buffer's banks are concatenated); ``bound`` / ``low`` (per
    lane: the current group's largest field minus the window, and whether it is below 0), from which
    :func:`rewrite` forms ``codes_out`` elsewhere (the top level registers them beside the codes)."""

    def __init__(self, *, lanes: int, groups: int, code_bits: int, window: int, banks: int = 1):
        self.lanes = _check("lanes", lanes, 1, 4096)
        self.groups = _check("groups", groups, 1, 1 << 16)
        self.code_bits = _check("code_bits", code_bits, 2, 8)
        self.window = _check("window", window, 1, 255)
        self.banks = _check("banks", banks, 1, 4096)
        code = data.StructLayout({"field": code_bits - 1, "neg": 1})
        self.code_layout = code
        super().__init__({
            "clear": In(1),
            "track": In(1),
            "track_codes": In(data.ArrayLayout(code, lanes)),
            "advance": In(1),
            "codes_in": In(data.ArrayLayout(code, lanes * banks)),
            "codes_out": Out(data.ArrayLayout(code, lanes * banks)),
            "bound": Out(data.ArrayLayout(code_bits - 1, lanes)),
            "low": Out(lanes),
        })

    def elaborate(self, platform):
        m = Module()
        L, G, fw = self.lanes, self.groups, self.code_bits - 1
        ring = [Signal(data.ArrayLayout(fw, L), name=f"colmax{i}") for i in range(G)]
        # The ring turns a cycle after its cause, from flip-flops (timing: ``track`` and ``advance``, handshakes
        # of other units, as the enable of every ring bit, 16.3 ns in context on the ECP5 proxy): a tracked beat's
        # fields are registered with it, and a group's ``advance`` is pending for one cycle, in which the rewrite
        # already compares against the next group's maxima, ``ring[1]``.
        track_q = Signal()
        codes_q = Signal.like(self.track_codes, name="track_codes_q")
        advance_q = Signal()
        m.d.sync += [track_q.eq(self.track), codes_q.eq(self.track_codes), advance_q.eq(self.advance)]
        head = ring[0]
        raised = Signal.like(head, name="colmax_raised")
        for lane in range(L):
            f = codes_q[lane].field
            m.d.comb += raised[lane].eq(Mux(f > head[lane], f, head[lane]))
        turn = Signal()
        m.d.comb += turn.eq(track_q | advance_q)
        with m.If(self.clear):
            m.d.sync += [r.eq(0) for r in ring]
        with m.Elif(turn):
            m.d.sync += [ring[i].eq(ring[i + 1]) for i in range(G - 1)]
            m.d.sync += ring[G - 1].eq(Mux(track_q, raised, head))
        top = Signal.like(head, name="colmax_now")  # the maxima of the group being rewritten
        m.d.comb += top.eq(Mux(advance_q, ring[1], head) if G > 1 else head)
        # field > top - d: the bound and whether it is below 0 come from the ring's registers, so the codes
        # coming in meet one compare (timing: the operand word into an adder and a compare)
        for lane in range(L):  # low: top < d, every nonzero field is kept; bound: top - d where top >= d
            m.d.comb += [self.low[lane].eq(top[lane] < self.window), self.bound[lane].eq(top[lane] - self.window)]
        m.d.comb += self.codes_out.eq(rewrite(m, self.codes_in, self.bound, self.low, lanes=L, banks=self.banks))
        return m


def rewrite(m, codes, bound, low, *, lanes: int, banks: int, name: str = "keep"):
    """The ternary codes of ``codes`` (``banks x lanes`` codes, bank-major) against a group's ``bound`` and ``low``
    (:class:`CodeWindow`'s outputs): a nonzero code whose field is above ``bound`` (or any nonzero code where
    ``low``) becomes +-1 (field 1), every other code 0. Returns the rewritten codes (a value of ``codes``'s
    layout)."""
    out = Signal.like(codes, name=f"{name}_codes")
    for b in range(banks):
        for lane in range(lanes):
            c_in, c_out = codes[b * lanes + lane], out[b * lanes + lane]
            keep = Signal(name=f"{name}{b}_{lane}")
            m.d.comb += [
                keep.eq((c_in.field != 0) & (low[lane] | (c_in.field > bound[lane]))),
                c_out.field.eq(keep),
                c_out.neg.eq(keep & c_in.neg),
            ]
    return out
