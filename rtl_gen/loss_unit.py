"""The output layer's end of the datapath: fixed-point logits and the loss gradient (docs/arithmetic.md 3.6, 4).

Two components, each built for one configuration (:meth:`from_config`) with ``lanes`` classes per beat:

* :class:`OutputLogitUnit`: training-mode logits ``x_q = z / (S' 2^Fb)`` in Q.FL of the output layer,
  bit for bit :func:`sim.hw.arith.output_logits`.
* :class:`LossGradUnit`: per sample the loss gradient ``g`` of ``train.loss`` (base-2 softmax cross-entropy,
  or squared hinge), the batch's integer loss and its ``correct`` count, bit for bit
  :func:`sim.hw.arith.loss_grad` (and :func:`sim.hw.arith.softmax_q` inside it).

Both stream sample-major rows of ``classes`` values, ``lanes`` values per beat: class ``c`` of a sample is lane
``c % lanes`` of the sample's beat ``c // lanes``, lane 0 in the low bits, ``last`` set on the sample's last beat.
A sample is ``groups = ceil(classes / lanes)`` beats; lanes past ``classes`` in the last beat are padding (ignored
on input, 0 on output). This is the order the XNOR engine produces Y in and the order the BN backward unit takes
``dx`` in. :class:`OutputGeometry` holds the derived widths, payload layouts, packing helpers and cycle models.

Logit arithmetic (one reciprocal per channel). With ``n = bitlen(S')``, ``G = hw.recip_guard_bits``,
``R = floor(2^(n + FL + G) / S')`` and ``sh = n + G + Fb``, the contract's ``x_q = (z R + 2^(sh-1)) >> sh`` with
``z = K y - C``, ``K = B^2 2^Fb`` is rewritten exactly (``2^(sh-1)`` is a multiple of ``2^Fb``) as::

    x_q = (B^2 (R y) - D) >> (n + G),    D = ceil(C R / 2^Fb) - 2^(n + G - 1)

so per element there is one ``R x y`` product (a DSP48: ``R`` has ``FL + G + 2`` bits, ``y`` at most 18), a
shift-add by the constant ``B^2``, a subtract and a per-channel shift. Per channel, the shared
:class:`rtl_gen.divider.Divider` gives ``R`` (numerator ``2^(n-1)`` shifted, no barrel shifter) and a bit-serial
loop accumulates ``C R`` by Horner's rule (``acc = 2 acc + bit C``, ``FL + G + 2`` cycles, one adder).

Loss arithmetic (cross-entropy, per sample). Logits of a sample are kept in one of two banks while their maximum
and argmax (first index on ties) are found; the sample is then processed in three passes: ``e = T[t mod 2^FL] >>
-(t >> FL)`` with ``t = ((x - max) LOG2E) >> 16`` (a DSP48 constant product, then a table of ``2^FL`` entries),
summed and kept; one reciprocal ``floor(2^(Fp + Fe + 2) / sum)`` (the divider, ``Fp + 3`` quotient bits);
``p = (e R + 2^(Fe+1)) >> (Fe + 2)`` (a DSP48), ``g = p - 2^Fp [c = label]``. The next sample loads into the
other bank meanwhile. Squared hinge is one streaming stage: ``m = max(0, 2^FL - t x)``, ``g = -t m`` (``t = +1``
at the label, else -1).

Reported per batch (``batch`` samples; ``loss_q``, ``correct`` hold the last complete batch, ``done`` pulses when
they change): ``correct`` = samples whose argmax equals the label; ``loss_q`` = the integer loss the
``switch_undo`` comparison uses (:meth:`sim.hw.model.HwModel._loss_q`): cross-entropy ``sum_b (2^Fp - p_label)``,
squared hinge ``sum g^2``. The float ``loss`` of :func:`~sim.hw.arith.loss_grad` is the host's (from logits).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, reduce
from operator import and_, or_

import numpy as np
from amaranth import Const, Module, Mux, Shape, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from sim.hw.arith import LOG2E_Q16, ArithParams, exp2_table
from sim.hw.widths import LayerBounds, layer_bounds, signed_bits, unsigned_bits

from .divider import Divider
from .divider import latency as divider_latency
from .streams import SkidBuffer, StreamFIFO

__all__ = [
    "LOGIT_LATENCY",
    "HINGE_LATENCY",
    "LossGradUnit",
    "OutputGeometry",
    "OutputLogitUnit",
]

LOG2E_FRAC = 16
"""Fractional bits of :data:`sim.hw.arith.LOG2E_Q16` (the ``>> 16`` of docs/arithmetic.md section 4, step 2)."""

LOGIT_LATENCY = 5
"""OutputLogitUnit: cycles from the last Y transfer to the last logit transfer (R y product, B^2 shift-add,
subtract, shift into the output queue, queue)."""

LOSS_TOTALS_STAGE = 1
"""LossGradUnit: cycles by which ``done`` (and ``loss_q``, ``correct``) follow the last final gradient beat beyond the
one of the batch totals' accumulator: each beat's loss term is registered before it is added."""

LOSS_FRONT_STAGE = 1
"""LossGradUnit (cross-entropy): cycles by which a sample's bank is marked full after its last beat beyond the
transfer's own: the beat's argmax is registered before the running compare (stage A, then stage B)."""

HINGE_LATENCY = 2
"""LossGradUnit (squared hinge): cycles from the last logit transfer to the last gradient transfer."""

_CE_OVERHEAD = 9
"""LossGradUnit (cross-entropy): cycles per sample besides the two passes over its beats and the division: bank
check 1, exponential pipeline drain 5, taking the quotient 1, probability pipeline 2 (:meth:`OutputGeometry.
loss_period`)."""

MAX_LANES = 4096
MAX_CLASSES = 1 << 16
MAX_BATCH = 1 << 20
LOSSES = ("cross_entropy", "squared_hinge")


def _check_int(name: str, value: object, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in {lo}..{hi}, not {value!r}")
    return value


def _csd(k: int) -> list[tuple[int, int]]:
    """Canonical signed digits of ``k >= 0``: ``k = sum(sign << shift)``, no two adjacent nonzero digits."""
    digits, shift = [], 0
    while k:
        if k & 1:
            d = 2 - (k & 3)  # +1 when k = 1 mod 4, -1 when k = 3 mod 4
            digits.append((d, shift))
            k -= d
        k >>= 1
        shift += 1
    return digits


def _const_mul(value, k: int):
    """``value * k`` for a constant ``k >= 1`` as shifts and adds (canonical signed digits), so that Yosys builds
    carry-chain adders rather than spending a DSP48 on a constant."""
    terms = [value << shift if sign > 0 else -(value << shift) for sign, shift in _csd(k)]
    while len(terms) > 1:  # a balanced tree of adders (timing: a chain of three closed at 92.6 MHz, B = 100)
        terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i] for i in range(0, len(terms), 2)]
    return terms[0]


def _pack(values, width: int) -> int:
    word = 0
    for i, v in enumerate(values):
        word |= (int(v) & ((1 << width) - 1)) << (i * width)
    return word


def _to_signed(v: int, width: int) -> int:
    v &= (1 << width) - 1
    return v - (1 << width) if v >> (width - 1) else v


@dataclass(frozen=True, kw_only=True)
class OutputGeometry:
    """Sizes of the output-layer units for one configuration; every width, layout and cycle count lives here.

    Parameters (keyword-only): ``params`` (:class:`sim.hw.arith.ArithParams`), ``bounds`` (the output layer's
    :class:`sim.hw.widths.LayerBounds`: classes ``fan_out``, batch ``n``, and the worst-case magnitudes of Y, C,
    S, the logits and the loss gradient), ``lanes`` (classes per beat, 1..4096), ``div_steps`` (quotient bits
    per cycle of the units' :class:`rtl_gen.divider.Divider`, default 1).
    """

    params: ArithParams
    bounds: LayerBounds
    lanes: int
    div_steps: int = 1

    def __post_init__(self):
        if not isinstance(self.params, ArithParams):
            raise TypeError(f"params must be a sim.hw.arith.ArithParams, not {self.params!r}")
        if not isinstance(self.bounds, LayerBounds):
            raise TypeError(f"bounds must be a sim.hw.widths.LayerBounds, not {self.bounds!r}")
        _check_int("lanes", self.lanes, 1, MAX_LANES)
        _check_int("div_steps", self.div_steps, 1, min(self.recip_bits, self.prob_recip_bits))
        _check_int("classes (bounds.fan_out)", self.bounds.fan_out, 2, MAX_CLASSES)
        _check_int("batch (bounds.n)", self.bounds.n, 1, MAX_BATCH)
        if self.bounds.logit_q <= 0:
            raise ValueError(f"bounds must be the output layer's (logit_q > 0), not layer {self.bounds.layer}")
        if self.params.loss not in LOSSES:
            raise ValueError(f"params.loss must be one of {LOSSES}, not {self.params.loss!r}")

    @classmethod
    def from_config(cls, cfg, *, lanes: int, div_steps: int = 1) -> OutputGeometry:
        """The geometry of ``cfg``'s output layer (its last weight layer)."""
        return cls(params=ArithParams.from_config(cfg), bounds=layer_bounds(cfg)[-1], lanes=lanes, div_steps=div_steps)

    # --- sizes ---

    @property
    def classes(self) -> int:
        return self.bounds.fan_out

    @property
    def batch(self) -> int:
        """Samples per batch ``B`` (the BN statistics' ``n``)."""
        return self.bounds.n

    @property
    def groups(self) -> int:
        """Beats per sample, ``ceil(classes / lanes)``."""
        return -(-self.classes // self.lanes)

    @property
    def real_last(self) -> int:
        """Lanes of the last beat of a sample that carry a class."""
        return self.classes - (self.groups - 1) * self.lanes

    @property
    def loss(self) -> str:
        return self.params.loss

    # --- widths (docs/arithmetic.md section 9 via sim.hw.widths) ---

    @property
    def y_width(self) -> int:
        return signed_bits(self.bounds.y)

    @property
    def c_eval_bound(self) -> int:
        """``|C'| = |mu_r 2^Fb - beta_q s_r'|`` of the eval logits (``|mu_r|, s_r' <=`` the running bound)."""
        p = self.params
        return (self.bounds.running << p.beta_frac) + (1 << (p.beta_int - 1 + p.beta_frac)) * self.bounds.running

    @property
    def c_max(self) -> int:
        return max(self.bounds.C, self.c_eval_bound)

    @property
    def c_width(self) -> int:
        """Bits of the per-channel numerator constant: ``C`` (training) or ``C'`` (eval)."""
        return signed_bits(self.c_max)

    @property
    def s_width(self) -> int:
        """Bits of the denominator: ``S'`` (training) or ``s_r'`` (eval)."""
        return max(unsigned_bits(self.bounds.S), unsigned_bits(self.bounds.running))

    @property
    def logit_width(self) -> int:
        """Bits of a training logit (the loss unit's input)."""
        return signed_bits(self.bounds.logit_q)

    @property
    def eval_logit_bound(self) -> int:
        """``|x|`` of an eval logit ``((y 2^Fr - mu_r) 2^Fb + beta_q s_r') / (s_r' 2^Fb)`` in Q.FL with ``s_r' >= 1``
        (the running statistics do not bound it as the batch's do), plus the rounding."""
        p = self.params
        num = (self.bounds.y << (p.running_frac + p.beta_frac)) + self.c_eval_bound
        return ((num << p.logit_frac) >> p.beta_frac) + 2

    @property
    def out_width(self) -> int:
        """Bits of the logit unit's output (and the logits buffer): a training or an eval logit."""
        return max(self.logit_width, signed_bits(self.eval_logit_bound))

    @property
    def eval_mul(self) -> int:
        """``2^Fr``: the eval numerator's factor on ``y`` (``B^2`` in training)."""
        return 1 << self.params.running_frac

    @property
    def grad_width(self) -> int:
        return signed_bits(self.bounds.dx)

    @property
    def label_width(self) -> int:
        return Shape.cast(range(self.classes)).width

    @property
    def batch_square(self) -> int:
        """``B^2 = K / 2^Fb``."""
        return self.batch * self.batch

    @property
    def recip_bits(self) -> int:
        """Bits of the logit reciprocal ``R`` in ``[2^(FL+G), 2^(FL+G+1)]``: ``FL + G + 2``."""
        return self.params.logit_frac + self.params.recip_guard + 2

    @property
    def prob_recip_bits(self) -> int:
        """Bits of the softmax reciprocal ``floor(2^(Fp+Fe+2) / sum)`` in ``(0, 2^(Fp+2)]``: ``Fp + 3``."""
        return self.params.prob_frac + 3

    @property
    def sum_width(self) -> int:
        """Bits of the softmax denominator ``sum_c e_c`` in ``[2^Fe, classes 2^Fe]``."""
        return unsigned_bits(self.classes << self.params.exp_frac)

    def logit_divider(self) -> Divider:
        """The logit unit's divider: ``floor(2^(n + FL + G) / S')``, ``n = bitlen(S') <= s_width``."""
        p = self.params
        return Divider(
            dividend_width=self.s_width + p.logit_frac + p.recip_guard + 1,
            divisor_width=self.s_width,
            quotient_width=self.recip_bits,
            steps=self.div_steps,
        )

    def prob_divider(self) -> Divider:
        """The loss unit's divider: ``floor(2^(Fp + Fe + 2) / sum)``."""
        p = self.params
        return Divider(
            dividend_width=p.prob_frac + p.exp_frac + 3,
            divisor_width=self.sum_width,
            quotient_width=self.prob_recip_bits,
            steps=self.div_steps,
        )

    @cached_property
    def exp_table(self) -> tuple[int, ...]:
        """``T[f] = round(2^(f / 2^FL) 2^Fe)`` (:func:`sim.hw.arith.exp2_table`)."""
        return tuple(int(v) for v in exp2_table(self.params.logit_frac, self.params.exp_frac))

    @property
    def table_width(self) -> int:
        return unsigned_bits(max(self.exp_table))

    @property
    def loss_q_width(self) -> int:
        if self.loss == "squared_hinge":
            return unsigned_bits(self.batch * self.classes * self.bounds.dx**2)
        return unsigned_bits(self.batch << self.params.prob_frac)

    # --- payload layouts ---

    @property
    def consts_layout(self) -> data.StructLayout:
        """Per-channel BN constants, one beat per channel in channel order: ``c`` (C, signed), ``s`` (S' >= 1),
        ``last`` (channel ``classes - 1``), as the BN forward unit's ``stats`` stream carries them."""
        return data.StructLayout({"c": signed(self.c_width), "s": unsigned(self.s_width), "last": 1})

    @property
    def y_layout(self) -> data.StructLayout:
        """Y beats: ``y`` (``lanes`` signed values) and ``last`` (last beat of a sample)."""
        return data.StructLayout({"y": data.ArrayLayout(signed(self.y_width), self.lanes), "last": 1})

    @property
    def x_layout(self) -> data.StructLayout:
        """Logit beats: ``x`` (``lanes`` signed Q.FL values) and ``last``."""
        return data.StructLayout({"x": data.ArrayLayout(signed(self.logit_width), self.lanes), "last": 1})

    @property
    def out_layout(self) -> data.StructLayout:
        """The logit unit's output beats: ``x`` (``lanes`` signed :attr:`out_width` values) and ``last``."""
        return data.StructLayout({"x": data.ArrayLayout(signed(self.out_width), self.lanes), "last": 1})

    @property
    def g_layout(self) -> data.StructLayout:
        """Gradient beats: ``g`` (``lanes`` signed values; Q.Fp for cross-entropy, Q.FL for hinge) and ``last``."""
        return data.StructLayout({"g": data.ArrayLayout(signed(self.grad_width), self.lanes), "last": 1})

    # --- cycle models (no input stalls, no output backpressure) ---

    def channel_cycles(self) -> int:
        """OutputLogitUnit: cycles per channel of the constants phase: the division (its request goes out with
        the constants beat; the divider's latency, :func:`rtl_gen.divider.latency`), ``FL + G + 2`` Horner steps
        of ``C R``, and one cycle to take the response (the slot write overlaps the next channel's constants
        beat)."""
        return divider_latency(self.recip_bits, self.div_steps) + self.recip_bits + 1

    def logit_cycles(self) -> int:
        """OutputLogitUnit, one batch: from the first constants transfer to the last logit transfer, both
        included: ``classes channel_cycles() + B groups + LOGIT_LATENCY + 1`` (the Y stream starts the cycle
        after the last slot write)."""
        return self.classes * self.channel_cycles() + self.batch * self.groups + LOGIT_LATENCY + 1

    def loss_period(self) -> int:
        """LossGradUnit (cross-entropy): cycles per sample in steady state, ``2 groups + L + 8`` with ``L`` the
        latency of the divider (:func:`rtl_gen.divider.latency` of ``Fp + 3`` quotient bits)."""
        return 2 * self.groups + divider_latency(self.prob_recip_bits, self.div_steps) + _CE_OVERHEAD

    def loss_cycles(self, samples: int) -> int:
        """LossGradUnit: from the first logit transfer to the last gradient transfer, both included, for
        ``samples`` samples with the labels queued ahead. Squared hinge streams: ``samples groups +
        HINGE_LATENCY``; cross-entropy: ``groups + samples loss_period() + 1 + LOSS_FRONT_STAGE`` (loading the first
        sample, then one period per sample; later samples load during the previous one)."""
        _check_int("samples", samples, 0, 1 << 40)
        if not samples:
            return 0
        if self.loss == "squared_hinge":
            return samples * self.groups + HINGE_LATENCY
        return self.groups + samples * self.loss_period() + 1 + LOSS_FRONT_STAGE

    # --- packing (host and tests) ---

    def pack_consts(self, c, s) -> list[int]:
        """``consts`` beats for per-channel ``C`` and ``S'`` (length ``classes`` each)."""
        c, s = list(c), list(s)
        if len(c) != self.classes or len(s) != self.classes:
            raise ValueError(f"need {self.classes} values of C and S', not {len(c)} and {len(s)}")
        if any(int(v) < 1 for v in s):
            raise ValueError("S' must be >= 1 (the BN unit's max(S, 1))")
        cw, sw = self.c_width, self.s_width
        return [
            (int(cv) & ((1 << cw) - 1)) | (int(sv) << cw) | (int(k == self.classes - 1) << (cw + sw))
            for k, (cv, sv) in enumerate(zip(c, s, strict=True))
        ]

    def pack_rows(self, rows, width: int) -> list[int]:
        """Beats (``lanes`` values of ``width`` bits, then ``last``) for ``rows`` of shape ``(samples, classes)``;
        padding lanes 0."""
        rows = np.asarray(rows)
        if rows.ndim != 2 or rows.shape[1] != self.classes:
            raise ValueError(f"rows must have shape (samples, classes={self.classes}), not {rows.shape}")
        L, G = self.lanes, self.groups
        beats = []
        for row in rows.tolist():
            for g in range(G):
                beats.append(_pack(row[g * L : (g + 1) * L], width) | (int(g == G - 1) << (L * width)))
        return beats

    def unpack_rows(self, beats, width: int) -> tuple[np.ndarray, list[int], list[int]]:
        """``(rows (samples, classes) int64, last flags, padding values)`` from beats of ``pack_rows`` form."""
        L, G = self.lanes, self.groups
        if len(beats) % G:
            raise ValueError(f"{len(beats)} beats is not a whole number of samples ({G} per sample)")
        values, lasts, pads = [], [], []
        for i, beat in enumerate(beats):
            lanes = [_to_signed(int(beat) >> (k * width), width) for k in range(L)]
            if i % G == G - 1:
                pads.extend(lanes[self.real_last :])
            values.extend(lanes)
            lasts.append((int(beat) >> (L * width)) & 1)
        rows = np.asarray(values, dtype=np.int64).reshape(-1, G * L)[:, : self.classes]
        return rows, lasts, pads


@dataclass(frozen=True)
class _Front:
    """Signals of the loss unit's input stage that the loss-specific datapaths use."""

    take: Signal  # a logit beat transfers (driven by the loss datapath through x.ready)
    group: Signal  # its beat index within the sample
    base: Signal  # class of its lane 0
    last_group: Signal
    label: Signal  # the sample's label (head of the label queue)
    label_valid: Signal
    new_max: Signal  # maximum and argmax of the sample so far, this beat included (cross-entropy: of the beat
    new_arg: Signal  # in stage B, a cycle after its transfer)
    new_hit: Signal  # cross-entropy: new_arg == mark_label (each side of new_arg's choice compared first)
    mark: Signal  # cross-entropy: stage B holds a sample's last beat (hinge: unused)
    mark_label: Signal  # that sample's label


@dataclass(frozen=True)
class _Totals:
    """Inputs of the batch accumulators: one gradient beat is final (``valid``) with its loss term."""

    valid: Signal
    loss: Signal
    end: Signal  # the beat ends a sample
    hit: Signal  # that sample's argmax is its label


def _argmax(m: Module, values, oks, prefix: str, *, above=None):
    """Largest of ``values`` among those whose ``oks`` bit is set, first index on ties: ``(value, index,
    beats)`` Signals; ``beats`` is set where that largest is greater than ``above`` (0 without it). ``oks[0]``
    must be set.

    Flat rather than a tree of compare-and-select levels: every pair of values is compared side by side, a lane
    wins where it beats every earlier lane and is not beaten by a later one, and the value and index are picked
    by the one-hot winners. One compare deep instead of one a level (the tree of the output layer's eight lanes
    put three compares and their multiplexers in front of the running maximum, which closed below 80 MHz in
    context on the ECP5 proxy)."""
    n = len(values)
    gt = {}  # (i, j), i != j: values[i] > values[j]
    for i in range(n):
        for j in range(i + 1, n):
            a, b = Signal(name=f"{prefix}_gt{i}_{j}"), Signal(name=f"{prefix}_gt{j}_{i}")
            m.d.comb += [a.eq(values[i] > values[j]), b.eq(values[j] > values[i])]
            gt[i, j], gt[j, i] = a, b
    wins = []
    for i in range(n):
        w = Signal(name=f"{prefix}_win{i}")
        terms = [oks[i]]
        terms += [~oks[j] | gt[i, j] for j in range(i)]  # strictly above every earlier lane
        terms += [~oks[j] | ~gt[j, i] for j in range(i + 1, n)]  # not below a later lane
        m.d.comb += w.eq(reduce(and_, terms))
        wins.append(w)
    value = Signal(values[0].shape(), name=f"{prefix}_value")
    index = Signal(range(max(n, 2)), name=f"{prefix}_index")
    beats = Signal(name=f"{prefix}_beats")
    m.d.comb += [
        value.eq(reduce(or_, (Mux(w, v, 0) for w, v in zip(wins, values, strict=True)))),
        index.eq(reduce(or_, (Mux(w, i, 0) for i, w in enumerate(wins)))),
    ]
    if above is not None:
        m.d.comb += beats.eq(reduce(or_, (w & (v > above) for w, v in zip(wins, values, strict=True))))
    return value, index, beats


class OutputLogitUnit(wiring.Component):
    """Training-mode logits of the output layer, bit for bit :func:`sim.hw.arith.output_logits`.

    Parameters (keyword-only): ``params``, ``bounds``, ``lanes`` (see :class:`OutputGeometry`); or
    :meth:`from_config`.

    Ports (Verilog payload bits in brackets, lane 0 lowest):
        consts: ``In(stream.Signature(consts_layout))``: per batch, ``classes`` beats in channel order with the
            BN unit's ``C`` and ``S'`` [``c | s << c_width | last << (c_width + s_width)``]. ``K = B^2 2^Fb`` is
            a configuration constant.
        eval_mode: ``In(1)`` (hold it for the batch) the eval logits of :func:`sim.hw.arith.output_logits_eval`: the
            constants are ``C' = mu_r 2^Fb - beta_q s_r'`` and ``s_r'`` and ``K = 2^(Fr+Fb)`` (the same datapath;
            ``B^2`` becomes the shift ``2^Fr``). The outputs are :attr:`OutputGeometry.out_width` bits wide.
        y: ``In(stream.Signature(y_layout))``: then the batch's Y, ``B * groups`` beats, sample-major
            [``y lanes | last``] (the XNOR engine's payload when its ``lanes_out == lanes``).
        x: ``Out(stream.Signature(x_layout))``: the logits in the same order [``x lanes | last``], padding 0.
        framing_error: ``Out(1)`` pulses after a constants or Y beat whose ``last`` disagrees with the count
            (the unit goes by its counts).

    Schedule: take the ``classes`` constants (:meth:`OutputGeometry.channel_cycles` each: the division, then
    ``C R`` bit-serially), then stream the batch's Y at one beat per cycle, then wait for the next batch's
    constants. Resources: ``lanes`` DSP48s (``R y``), one ``groups``-deep constants memory per lane (``R``, ``D``
    and ``n - 1``), one :class:`rtl_gen.divider.Divider`.
    """

    def __init__(self, *, params: ArithParams, bounds: LayerBounds, lanes: int, div_steps: int = 1):
        self._geometry = geo = OutputGeometry(params=params, bounds=bounds, lanes=lanes, div_steps=div_steps)
        super().__init__(
            {
                "consts": In(stream.Signature(geo.consts_layout)),
                "y": In(stream.Signature(geo.y_layout)),
                "x": Out(stream.Signature(geo.out_layout)),
                "framing_error": Out(1),
                "eval_mode": In(1),
            }
        )

    @classmethod
    def from_config(cls, cfg, *, lanes: int, div_steps: int = 1) -> OutputLogitUnit:
        """The unit for ``cfg``'s output layer (``sim.hw.arith.ArithParams.from_config``, ``layer_bounds(cfg)[-1]``)."""
        geo = OutputGeometry.from_config(cfg, lanes=lanes, div_steps=div_steps)
        return cls(params=geo.params, bounds=geo.bounds, lanes=lanes, div_steps=div_steps)

    @property
    def geometry(self) -> OutputGeometry:
        return self._geometry

    def cycles(self) -> int:
        """See :meth:`OutputGeometry.logit_cycles`."""
        return self._geometry.logit_cycles()

    def elaborate(self, platform):
        geo = self._geometry
        p = geo.params
        L, G, B = geo.lanes, geo.groups, geo.batch
        fb, guard = p.beta_frac, p.recip_guard
        m = Module()

        # Worst-case magnitudes of the internal values (for register widths).
        r_max = 1 << (p.logit_frac + guard + 1)
        cr_max = geo.c_max * r_max
        d_max = (cr_max >> fb) + 1 + (1 << (geo.s_width + guard - 1))
        ry_max = r_max * geo.bounds.y
        diff_max = max(geo.batch_square, geo.eval_mul) * ry_max + d_max
        sh_shape = range(max(geo.s_width, 2))
        slot = data.StructLayout({"r": geo.recip_bits, "d": signed(signed_bits(d_max)), "sh": sh_shape})

        # --- per channel: R = floor(2^(n+FL+G) / S') on the divider, C R by Horner's rule, then D ------------
        # IDLE: the constants beat goes straight into a division request; WAIT: take R; HORNER: acc = 2 acc +
        # bit C over R's bits, most significant first; the slot is written in the next cycle (``pending``),
        # together with the next channel's constants beat.
        m.submodules.divider = div = geo.logit_divider()
        qb = geo.recip_bits
        run = Signal()  # 0: constants phase, 1: streaming Y
        taken = Signal(range(geo.classes + 1))  # constants taken this batch
        c_reg = Signal(signed(geo.c_width))
        top = Signal(geo.s_width)  # 2^(n-1): S' with only its leading one
        top_idx = Signal(sh_shape)  # n - 1
        r_reg = Signal(qb)
        r_bits = Signal(qb)  # R, shifted left once per Horner step
        steps_left = Signal(range(qb))
        acc = Signal(signed(signed_bits(cr_max)))
        pending = Signal()  # the slot of the channel just finished is written this cycle
        s_in = self.consts.payload.s
        lead = Signal(sh_shape)
        for i in range(geo.s_width):  # leading-one position (priority: the last assignment wins)
            with m.If(s_in[i]):
                m.d.comb += lead.eq(i)
        take = Signal()
        m.d.comb += [
            div.req.payload.dividend.eq(Const(1, geo.s_width) << lead << (p.logit_frac + guard + 1)),
            div.req.payload.divisor.eq(s_in),
            take.eq(self.consts.valid & self.consts.ready),
        ]
        m.d.sync += [pending.eq(0), self.framing_error.eq(0)]
        with m.FSM(name="setup"):
            with m.State("IDLE"):
                m.d.comb += [
                    div.req.valid.eq(~run & (taken < geo.classes) & self.consts.valid),
                    self.consts.ready.eq(~run & (taken < geo.classes) & div.req.ready),
                ]
                # the channel's constants are loaded every cycle in IDLE and hold from its take on (timing: the
                # take, behind the divider's request ready, as the clock enable of these registers closed at
                # 96.7 MHz at the paper's widths on the ECP5 proxy); the slot write of ``pending``, in IDLE's first
                # cycle, still reads the previous channel's
                m.d.sync += [
                    c_reg.eq(self.consts.payload.c),
                    top.eq(Const(1, geo.s_width) << lead),
                    top_idx.eq(lead),
                ]
                with m.If(take):
                    m.d.sync += [
                        taken.eq(taken + 1),
                        self.framing_error.eq(self.consts.payload.last != (taken == geo.classes - 1)),
                    ]
                    m.next = "WAIT"
            with m.State("WAIT"):
                m.d.comb += div.resp.ready.eq(1)
                with m.If(div.resp.valid):
                    q = div.resp.payload.quotient
                    m.d.sync += [r_reg.eq(q), r_bits.eq(q), acc.eq(0), steps_left.eq(qb - 1)]
                    m.next = "HORNER"
            with m.State("HORNER"):
                m.d.sync += [
                    acc.eq((acc << 1) + Mux(r_bits[-1], c_reg, 0)),
                    r_bits.eq(r_bits << 1),
                    steps_left.eq(steps_left - 1),
                ]
                with m.If(steps_left == 0):
                    m.d.sync += pending.eq(1)
                    m.next = "IDLE"

        w_lane = Signal(range(L))
        w_addr = Signal(range(G))
        slot_in = Signal(slot)
        m.d.comb += [
            slot_in.r.eq(r_reg),
            slot_in.d.eq(((acc + ((1 << fb) - 1)) >> fb) - (top << guard)),  # ceil(C R / 2^Fb) - 2^(n+G-1)
            slot_in.sh.eq(top_idx),
        ]
        with m.If(pending):
            m.d.sync += [w_lane.eq(Mux(w_lane == L - 1, 0, w_lane + 1)), w_addr.eq(w_addr + (w_lane == L - 1))]
            with m.If((w_addr == G - 1) & (w_lane == (geo.classes - 1) % L)):  # last channel written
                m.d.sync += [run.eq(1), taken.eq(0), w_lane.eq(0), w_addr.eq(0)]

        # --- per element: x = (B^2 (R y) - D) >> (n + G) ----------------------------------------------------
        m.submodules.queue = queue = SkidBuffer(shape=geo.out_layout)
        adv = Signal()  # the pipeline moves (low only while the output queue refuses a result)
        push = Signal()
        issue = Signal()
        group = Signal(range(G))
        sample = Signal(range(B))
        last_group = Signal()
        m.d.comb += [
            last_group.eq(group == G - 1),
            self.y.ready.eq(adv & run),
            issue.eq(self.y.valid & self.y.ready),
        ]
        with m.If(issue):
            m.d.sync += group.eq(Mux(last_group, 0, group + 1))
            with m.If(last_group):
                m.d.sync += sample.eq(Mux(sample == B - 1, 0, sample + 1))
                with m.If(sample == B - 1):
                    m.d.sync += run.eq(0)
        with m.If(issue & (self.y.payload.last != last_group)):
            m.d.sync += self.framing_error.eq(1)

        v1, v2, v3, v4 = Signal(), Signal(), Signal(), Signal()
        last1, last2, last3, last4 = Signal(), Signal(), Signal(), Signal()
        with m.If(adv):
            m.d.sync += [v1.eq(issue), v2.eq(v1), v3.eq(v2), v4.eq(v3),
                         last1.eq(last_group), last2.eq(last1), last3.eq(last2), last4.eq(last3)]
        out_lanes = []
        for lane in range(L):
            mem = m.submodules[f"consts{lane}"] = Memory(shape=slot, depth=G, init=[])
            wr = mem.write_port()
            rd = mem.read_port()
            m.d.comb += [
                wr.addr.eq(w_addr),
                wr.data.eq(slot_in),
                wr.en.eq(pending & (w_lane == lane)),
                rd.addr.eq(group),
                rd.en.eq(adv),
            ]
            y1 = Signal(signed(geo.y_width), name=f"y1_{lane}")
            ry2 = Signal(signed(signed_bits(ry_max)), name=f"ry2_{lane}")
            d2 = Signal.like(slot_in.d, name=f"d2_{lane}")
            sh2 = Signal(sh_shape, name=f"sh2_{lane}")
            # B^2 (R y) registered apart from "- D" (timing: the shifted copies' sum and the subtraction in one
            # cycle closed at 92.6 MHz at the paper's widths on the ECP5 proxy)
            bry3 = Signal(signed(signed_bits(max(geo.batch_square, geo.eval_mul) * ry_max)), name=f"bry3_{lane}")
            d3 = Signal.like(slot_in.d, name=f"d3_{lane}")
            sh3 = Signal(sh_shape, name=f"sh3_{lane}")
            diff4 = Signal(signed(signed_bits(diff_max)), name=f"diff4_{lane}")
            sh4 = Signal(sh_shape, name=f"sh4_{lane}")
            with m.If(adv):
                m.d.sync += [
                    y1.eq(self.y.payload.y[lane]),
                    ry2.eq(rd.data.r * y1),  # the DSP48 product
                    d2.eq(rd.data.d),
                    sh2.eq(rd.data.sh),
                    bry3.eq(Mux(self.eval_mode, ry2 << p.running_frac, _const_mul(ry2, geo.batch_square))),
                    d3.eq(d2),
                    sh3.eq(sh2),
                    diff4.eq(bry3 - d3),
                    sh4.eq(sh3),
                ]
            xq = Signal(signed(geo.out_width), name=f"x4_{lane}")
            m.d.comb += xq.eq((diff4 >> (guard + 1)) >> sh4)  # keeps the low bits: |x| <= the logit bound
            if lane >= geo.real_last:
                out_lanes.append(Mux(last4, 0, xq))
            else:
                out_lanes.append(xq)

        m.d.comb += [
            push.eq(v4),
            adv.eq(~push | queue.i.ready),
            queue.i.valid.eq(push),
            queue.i.payload.last.eq(last4),
        ]
        m.d.comb += [queue.i.payload.x[lane].eq(v) for lane, v in enumerate(out_lanes)]
        wiring.connect(m, queue.o, wiring.flipped(self.x))
        return m


class LossGradUnit(wiring.Component):
    """Loss gradient, loss and correct count of the output logits, bit for bit :func:`sim.hw.arith.loss_grad`.

    Parameters (keyword-only): ``params``, ``bounds``, ``lanes`` (see :class:`OutputGeometry`); the loss is
    ``params.loss`` (``train.loss``). Or :meth:`from_config`.

    Ports (Verilog payload bits in brackets, lane 0 lowest):
        x: ``In(stream.Signature(x_layout))`` logits, sample-major, ``groups`` beats per sample
            [``x lanes | last``] (the :class:`OutputLogitUnit` output). Values of the logit width are taken as
            they are; the squared hinge's ``g`` width assumes ``|x| <=`` the logit bound (what the logit unit
            delivers).
        label: ``In(stream.Signature(range(classes)))`` one beat per sample, in sample order (queued two deep;
            a sample's beats are taken only once its label is there).
        g: ``Out(stream.Signature(g_layout))`` the gradient, same order [``g lanes | last``], padding 0.
        loss_q: ``Out(loss_q_width)``, correct: ``Out(range(batch + 1))``: totals of the last complete batch
            of ``batch`` samples; ``done``: ``Out(1)`` pulses in the cycle they take new values.
        framing_error: ``Out(1)`` pulses after a logit beat whose ``last`` disagrees with the beat count.

    Cross-entropy resources: ``2 lanes`` DSP48s (``d LOG2E``, ``e R``), per lane a ``2 groups``-deep logit
    buffer, a ``groups``-deep exponential buffer and a ``2^FL``-entry table, one divider. Squared hinge:
    ``lanes`` DSP48s (the squares of ``loss_q``).
    """

    def __init__(self, *, params: ArithParams, bounds: LayerBounds, lanes: int, div_steps: int = 1):
        self._geometry = geo = OutputGeometry(params=params, bounds=bounds, lanes=lanes, div_steps=div_steps)
        super().__init__(
            {
                "x": In(stream.Signature(geo.x_layout)),
                "label": In(stream.Signature(range(geo.classes))),
                "g": Out(stream.Signature(geo.g_layout)),
                "loss_q": Out(geo.loss_q_width),
                "correct": Out(range(geo.batch + 1)),
                "done": Out(1),
                "framing_error": Out(1),
            }
        )

    @classmethod
    def from_config(cls, cfg, *, lanes: int, div_steps: int = 1) -> LossGradUnit:
        """The unit for ``cfg``'s output layer (``sim.hw.arith.ArithParams.from_config``, ``layer_bounds(cfg)[-1]``)."""
        geo = OutputGeometry.from_config(cfg, lanes=lanes, div_steps=div_steps)
        return cls(params=geo.params, bounds=geo.bounds, lanes=lanes, div_steps=div_steps)

    @property
    def geometry(self) -> OutputGeometry:
        return self._geometry

    def cycles(self, samples: int) -> int:
        """See :meth:`OutputGeometry.loss_cycles`."""
        return self._geometry.loss_cycles(samples)

    def elaborate(self, platform):
        geo = self._geometry
        L, G = geo.lanes, geo.groups
        m = Module()

        m.submodules.labels = labels = StreamFIFO(shape=range(geo.classes), depth=2)
        wiring.connect(m, wiring.flipped(self.label), labels.i)
        label = labels.o.payload

        # --- front: take a sample's beats, find its maximum and argmax (first index on ties) -----------------
        group = Signal(range(G))
        base = Signal(range(G * L))  # class of lane 0 of this beat
        last_group = Signal()
        take = Signal()
        run_max = Signal(signed(geo.logit_width))
        run_arg = Signal(range(geo.classes))
        xs = [self.x.payload.x[lane] for lane in range(L)]
        oks = [Const(1) if lane < geo.real_last else ~last_group for lane in range(L)]
        new_max = Signal.like(run_max)
        new_arg = Signal.like(run_arg)
        new_hit = Signal()
        keep = Signal()
        mark = Signal()
        mark_label = Signal.like(label)
        m.d.comb += [
            last_group.eq(group == G - 1),
            labels.o.ready.eq(take & last_group),
        ]
        with m.If(take):
            m.d.sync += [
                group.eq(Mux(last_group, 0, group + 1)),
                base.eq(Mux(last_group, 0, base + L)),
            ]
        if geo.loss == "squared_hinge":  # the running maximum in the cycle of the transfer (the hit goes into its
            # stage 1 with the margins)
            best_v, best_lane, beats_run = _argmax(m, xs, oks, "amax", above=run_max)
            m.d.comb += [
                keep.eq((group != 0) & ~beats_run),
                new_max.eq(Mux(keep, run_max, best_v)),
                new_arg.eq(Mux(keep, run_arg, base + best_lane)),
            ]
            with m.If(take):
                m.d.sync += [run_max.eq(new_max), run_arg.eq(new_arg)]
        else:  # stage A registers the beat's maximum and its class, stage B compares it with the running one: the
            # argmax over the lanes and the running compare in one cycle closed below 80 MHz in context on the
            # ECP5 proxy (the routed SMALL design's worst path at seed 2, into the banks' maxima); the bank a
            # sample fills is marked full a cycle later (LOSS_FRONT_STAGE)
            best_v, best_lane, _ = _argmax(m, xs, oks, "amax")
            a_valid, a_first, a_last = (Signal(name=f"front_a_{n}") for n in ("valid", "first", "last"))
            a_v = Signal.like(run_max, name="front_a_v")
            a_arg = Signal.like(run_arg, name="front_a_arg")
            m.d.sync += a_valid.eq(take)
            with m.If(take):
                m.d.sync += [a_v.eq(best_v), a_arg.eq(base + best_lane), a_first.eq(group == 0),
                             a_last.eq(last_group), mark_label.eq(label)]
            m.d.comb += [
                keep.eq(~a_first & ~(a_v > run_max)),
                new_max.eq(Mux(keep, run_max, a_v)),
                new_arg.eq(Mux(keep, run_arg, a_arg)),
                # the argmax-is-label bit: both candidates compared with the label, then chosen by keep (timing:
                # the choice of the argmax, then its compare, after the running compare closed at 98.9 MHz at the
                # paper's widths on the ECP5 proxy, run_max -> bank_hit0)
                new_hit.eq(Mux(keep, run_arg == mark_label, a_arg == mark_label)),
                mark.eq(a_valid & a_last),
            ]
            with m.If(a_valid):
                m.d.sync += [run_max.eq(new_max), run_arg.eq(new_arg)]
        m.d.sync += self.framing_error.eq(take & (self.x.payload.last != last_group))

        # --- batch totals ---------------------------------------------------------------------------------
        acc_valid = Signal()  # one gradient beat is final
        acc_loss = Signal(geo.loss_q_width)  # its loss contribution
        acc_end = Signal()  # it ends a sample
        acc_hit = Signal()  # that sample's argmax is its label
        loss_acc = Signal(geo.loss_q_width)
        hits = Signal(range(geo.batch + 1))
        done_samples = Signal(range(geo.batch))
        # a final beat's contribution is registered before it is added (timing: the loss term's subtraction and
        # the accumulator's wide adder in one cycle closed below 80 MHz in context on the ECP5 proxy); ``done``
        # comes a cycle later
        assert LOSS_TOTALS_STAGE == 1
        t_valid, t_end, t_hit = Signal(), Signal(), Signal()
        t_loss = Signal.like(acc_loss)
        m.d.sync += [t_valid.eq(acc_valid), t_end.eq(acc_end), t_hit.eq(acc_hit), t_loss.eq(acc_loss)]
        m.d.sync += self.done.eq(0)
        with m.If(t_valid):
            with m.If(t_end & (done_samples == geo.batch - 1)):
                m.d.sync += [
                    self.loss_q.eq(loss_acc + t_loss),
                    self.correct.eq(hits + t_hit),
                    self.done.eq(1),
                    loss_acc.eq(0),
                    hits.eq(0),
                    done_samples.eq(0),
                ]
            with m.Else():
                m.d.sync += loss_acc.eq(loss_acc + t_loss)
                with m.If(t_end):
                    m.d.sync += [hits.eq(hits + t_hit), done_samples.eq(done_samples + 1)]

        m.submodules.queue = queue = SkidBuffer(shape=geo.g_layout)
        wiring.connect(m, queue.o, wiring.flipped(self.g))
        front = _Front(take, group, base, last_group, label, labels.o.valid, new_max, new_arg, new_hit, mark,
                       mark_label)
        totals = _Totals(acc_valid, acc_loss, acc_end, acc_hit)
        if geo.loss == "squared_hinge":
            self._hinge(m, front, queue, totals)
        else:
            self._cross_entropy(m, front, queue, totals)
        return m

    def _hinge(self, m: Module, front: _Front, queue: SkidBuffer, totals: _Totals):
        """One streaming stage: ``m = max(0, 2^FL - t x)``, ``g = -t m``; squares summed behind the queue."""
        geo = self._geometry
        L = geo.lanes
        fl = geo.params.logit_frac
        take, base, last_group, label, new_arg = front.take, front.base, front.last_group, front.label, front.new_arg
        label_valid = front.label_valid
        adv = Signal()
        push = Signal()
        m.d.comb += [self.x.ready.eq(adv & label_valid), take.eq(self.x.valid & self.x.ready)]
        v1, last1, hit1 = Signal(), Signal(), Signal()
        with m.If(adv):
            m.d.sync += [v1.eq(take), last1.eq(last_group), hit1.eq(new_arg == label)]
        m_bits = unsigned_bits(geo.bounds.dx)
        margins = []
        for lane in range(L):
            x1 = Signal(signed(geo.logit_width), name=f"x1_{lane}")
            is_label = Signal(name=f"is_label1_{lane}")
            with m.If(adv):
                m.d.sync += [x1.eq(self.x.payload.x[lane]), is_label.eq(base + lane == label)]
            raw = Signal(signed(geo.logit_width + 2), name=f"raw1_{lane}")
            mg = Signal(m_bits, name=f"m1_{lane}")
            grad = Mux(is_label, -mg, mg)
            m.d.comb += [
                raw.eq((1 << fl) - Mux(is_label, x1, -x1)),
                mg.eq(Mux(raw > 0, raw, 0)),
                queue.i.payload.g[lane].eq(grad if lane < geo.real_last else Mux(last1, 0, grad)),
            ]
            margins.append(mg if lane < geo.real_last else Mux(last1, 0, mg))
        m.d.comb += [
            push.eq(v1),
            adv.eq(~push | queue.i.ready),
            queue.i.valid.eq(push),
            queue.i.payload.last.eq(last1),
        ]

        # loss_q = sum m^2, behind the queue: margins (registered), squares (DSP48), sum and accumulate.
        commit = Signal()
        q1_v, q1_end, q1_hit, q2_v, q2_end, q2_hit = Signal(), Signal(), Signal(), Signal(), Signal(), Signal()
        m.d.comb += commit.eq(push & queue.i.ready)
        m.d.sync += [
            q1_v.eq(commit), q1_end.eq(last1), q1_hit.eq(hit1), q2_v.eq(q1_v), q2_end.eq(q1_end), q2_hit.eq(q1_hit),
        ]  # fmt: skip
        squares = []
        for lane, mg in enumerate(margins):
            q1 = Signal(m_bits, name=f"q1_{lane}")
            q2 = Signal(unsigned_bits(geo.bounds.dx**2), name=f"q2_{lane}")
            m.d.sync += [q1.eq(mg), q2.eq(q1 * q1)]
            squares.append(q2)
        m.d.comb += [totals.valid.eq(q2_v), totals.loss.eq(sum(squares)), totals.end.eq(q2_end), totals.hit.eq(q2_hit)]

    def _cross_entropy(self, m: Module, front: _Front, queue: SkidBuffer, totals: _Totals):
        """Two logit banks (load one while the other is processed) and the exp / divide / probability passes."""
        geo = self._geometry
        take, group, last_group = front.take, front.group, front.last_group
        new_max, label_valid = front.new_max, front.label_valid
        p = geo.params
        L, G = geo.lanes, geo.groups
        fl, fe, fp = p.logit_frac, p.exp_frac, p.prob_frac
        tw = geo.table_width
        xw = geo.logit_width

        # Front: write the beat into bank `wsel`; a cycle after the sample's last beat (stage B of the front) mark
        # the bank full with its maximum, argmax-is-label bit and label.
        wsel = Signal()
        msel = Signal()  # the bank stage B fills (wsel a cycle late)
        full = Signal(2)
        bank_max = [Signal(signed(xw), name=f"bank_max{b}") for b in range(2)]
        bank_hit = [Signal(name=f"bank_hit{b}") for b in range(2)]
        bank_label = [Signal(range(geo.classes), name=f"bank_label{b}") for b in range(2)]
        m.d.comb += [self.x.ready.eq(~full.bit_select(wsel, 1) & label_valid), take.eq(self.x.valid & self.x.ready)]
        with m.If(take & last_group):
            m.d.sync += wsel.eq(~wsel)
        with m.If(front.mark):
            m.d.sync += [full.bit_select(msel, 1).eq(1), msel.eq(~msel)]
            for b in range(2):
                with m.If(msel == b):
                    m.d.sync += [bank_max[b].eq(new_max), bank_hit[b].eq(front.new_hit),
                                 bank_label[b].eq(front.mark_label)]

        # Back: IDLE -> EXP (issue the beats) -> EXP_DRAIN -> DIV -> DIV_WAIT -> OUT (issue) -> OUT_DRAIN.
        rsel = Signal()
        mx = Signal(signed(xw))
        lab = Signal(range(geo.classes))
        hit = Signal()
        cnt = Signal(range(G))
        e_issue = Signal()
        o_issue = Signal()
        adv = Signal()
        push = Signal()
        m.submodules.divider = div = geo.prob_divider()
        total = Signal(geo.sum_width)
        recip = Signal(geo.prob_recip_bits)  # floor(2^(Fp+Fe+2) / sum)
        e5_v, e5_last = Signal(), Signal()
        o2_v, o2_last = Signal(), Signal()
        m.d.comb += [div.req.payload.dividend.eq(1 << (fp + fe + 2)), div.req.payload.divisor.eq(total)]

        with m.FSM():
            with m.State("IDLE"):
                with m.If(full.bit_select(rsel, 1)):
                    m.d.sync += [
                        mx.eq(Mux(rsel, bank_max[1], bank_max[0])),
                        lab.eq(Mux(rsel, bank_label[1], bank_label[0])),
                        hit.eq(Mux(rsel, bank_hit[1], bank_hit[0])),
                        cnt.eq(0),
                        total.eq(0),
                    ]
                    m.next = "EXP"
            with m.State("EXP"):
                m.d.comb += e_issue.eq(1)
                m.d.sync += cnt.eq(cnt + 1)
                with m.If(cnt == G - 1):
                    m.d.sync += [full.bit_select(rsel, 1).eq(0), rsel.eq(~rsel), cnt.eq(0)]
                    m.next = "EXP_DRAIN"
            with m.State("EXP_DRAIN"):
                with m.If(e5_v & e5_last):  # the last beat's exponentials are summed at this edge
                    m.next = "DIV"
            with m.State("DIV"):
                m.d.comb += div.req.valid.eq(1)
                with m.If(div.req.ready):
                    m.next = "DIV_WAIT"
            with m.State("DIV_WAIT"):
                m.d.comb += div.resp.ready.eq(1)
                with m.If(div.resp.valid):
                    m.d.sync += recip.eq(div.resp.payload.quotient)
                    m.next = "OUT"
            with m.State("OUT"):
                m.d.comb += o_issue.eq(adv)
                with m.If(adv):
                    m.d.sync += cnt.eq(cnt + 1)
                    with m.If(cnt == G - 1):
                        m.d.sync += cnt.eq(0)
                        m.next = "OUT_DRAIN"
            with m.State("OUT_DRAIN"):
                with m.If(push & queue.i.ready & o2_last):
                    m.next = "IDLE"

        # Exponential pass E1..E5 (never stalls): bank read; t = (x - max) LOG2E >> 16 (DSP48);
        # table read with the shift; table word registered; e registered; e written to the buffer and summed.
        e1_v, e2_v, e3_v = Signal(), Signal(), Signal()
        e4_v = Signal()
        e1_last, e2_last, e3_last, e4_last = Signal(), Signal(), Signal(), Signal()
        e1_g, e2_g, e3_g, e4_g, e5_g = (Signal(range(G), name=f"e{k}_group") for k in (1, 2, 3, 4, 5))
        m.d.sync += [
            e1_v.eq(e_issue), e2_v.eq(e1_v), e3_v.eq(e2_v), e4_v.eq(e3_v), e5_v.eq(e4_v),
            e1_last.eq(cnt == G - 1), e2_last.eq(e1_last), e3_last.eq(e2_last), e4_last.eq(e3_last),
            e5_last.eq(e4_last),
            e1_g.eq(cnt), e2_g.eq(e1_g), e3_g.eq(e2_g), e4_g.eq(e3_g), e5_g.eq(e4_g),
        ]  # fmt: skip
        tp_max = (1 << xw) * LOG2E_Q16
        t_shape = signed(signed_bits(tp_max >> LOG2E_FRAC) + 1)
        sh_shape = range(tw)
        es = []

        # Probability pass O1..O2 (stalls with the output queue): e buffer read; e R (DSP48); round, subtract
        # the label's 2^Fp, push.
        o1_v, o1_last = Signal(), Signal()
        o_base = Signal(range(G * L))  # class of lane 0 of the beat issued next
        o1_base = Signal(range(G * L))
        with m.If(adv):
            m.d.sync += [o1_v.eq(o_issue), o2_v.eq(o1_v), o1_last.eq(cnt == G - 1), o2_last.eq(o1_last)]
            m.d.sync += o1_base.eq(o_base)
        with m.If(o_issue):
            m.d.sync += o_base.eq(Mux(cnt == G - 1, 0, o_base + L))
        label_p = []
        for lane in range(L):
            pad = lane >= geo.real_last
            bank = m.submodules[f"bank{lane}"] = Memory(shape=signed(xw), depth=2 * G, init=[])
            bw = bank.write_port()
            br = bank.read_port(domain="comb")  # a LUT RAM: the word read as the beat issues
            m.d.comb += [
                bw.addr.eq(Mux(wsel, G, 0) + group),
                bw.data.eq(self.x.payload.x[lane]),
                bw.en.eq(take),
                br.addr.eq(Mux(rsel, G, 0) + cnt),
            ]
            # E0: d = x - max <= 0 registered (padding lanes: junk, dropped at E3); E1: the LOG2E product
            # (timing: the subtraction into the product's multiplier in one cycle closed at 95.3 MHz at the
            # paper's widths on the ECP5 proxy)
            d1 = Signal(signed(xw + 1), name=f"d1_{lane}")
            tp2 = Signal(signed(signed_bits(tp_max)), name=f"tp2_{lane}")
            m.d.sync += [d1.eq(br.data - mx), tp2.eq(d1 * LOG2E_Q16)]
            # E2: t in Q.FL; the table is read at t mod 2^FL, the shift is -(t >> FL) (0 when >= table width).
            t2 = Signal(t_shape, name=f"t2_{lane}")
            whole = Signal(signed(t_shape.width - fl), name=f"whole2_{lane}")
            m.d.comb += [t2.eq(tp2 >> LOG2E_FRAC), whole.eq(t2 >> fl)]
            table = m.submodules[f"exp_table{lane}"] = Memory(shape=tw, depth=1 << fl, init=geo.exp_table)
            tr = table.read_port()
            big3 = Signal(name=f"big3_{lane}")
            sh3 = Signal(sh_shape, name=f"sh3_{lane}")
            m.d.comb += tr.addr.eq(t2[:fl])
            m.d.sync += [big3.eq(whole <= -tw), sh3.eq(-whole)]
            # E3: the table word registered (timing: the block RAM's output into the shifter closed at 85 MHz
            # on the ECP5 proxy); E4: e = T >> shift; E5: to the buffer and the sum.
            td4 = Signal(tw, name=f"td4_{lane}")
            big4 = Signal(name=f"big4_{lane}")
            sh4 = Signal(sh_shape, name=f"sh4_{lane}")
            m.d.sync += [td4.eq(tr.data), big4.eq(big3), sh4.eq(sh3)]
            e5 = Signal(tw, name=f"e5_{lane}")
            drop = big4 | e4_last if pad else big4
            m.d.sync += e5.eq(Mux(drop, 0, td4 >> sh4))
            es.append(e5)
            ebuf = m.submodules[f"ebuf{lane}"] = Memory(shape=tw, depth=G, init=[])
            ew = ebuf.write_port()
            er = ebuf.read_port()
            m.d.comb += [ew.addr.eq(e5_g), ew.data.eq(e5), ew.en.eq(e5_v), er.addr.eq(cnt), er.en.eq(adv)]

            # O1: e R; O2: p = (e R + 2^(Fe+1)) >> (Fe+2), g = p - 2^Fp [label].
            prod = Signal(unsigned_bits((1 << fe) << (fp + 2)), name=f"prod2_{lane}")
            is_label = Signal(name=f"is_label2_{lane}")
            # R <= 2^(Fp+2) (the sum is at least T[0] = 2^Fe), so R's top bit is set only for R = 2^(Fp+2), whose
            # product is a shift: the multiplier takes R's other Fp+2 bits, one MULT18 at Fp = 16 (timing: R's
            # full Fp+3 bits took two MULT18s and a carry chain adding their parts in one cycle, 12.88 ns in the
            # routed SMALL design)
            r_top = geo.prob_recip_bits - 1
            with m.If(adv):
                m.d.sync += [prod.eq(Mux(recip[r_top], er.data << r_top, er.data * recip[:r_top])),
                             is_label.eq(o1_base + lane == lab)]
            prob = Signal(fp + 1, name=f"p2_{lane}")
            grad = Signal(signed(geo.grad_width), name=f"g2_{lane}")
            m.d.comb += [prob.eq((prod + (1 << (fe + 1))) >> (fe + 2)), grad.eq(prob - Mux(is_label, 1 << fp, 0))]
            m.d.comb += queue.i.payload.g[lane].eq(Mux(o2_last, 0, grad) if pad else grad)
            # 2^Fp - p as one subtraction from a constant: 2^Fp - floor((prod + 2^(Fe+1)) / 2^(Fe+2)) =
            # floor((2^(Fp+Fe+2) - 2^(Fe+1) + 2^(Fe+2) - 1 - prod) / 2^(Fe+2)) (timing: the rounding add, the
            # subtraction, the OR over lanes and the accumulator in one cycle closed at 98.6 MHz, B = 100)
            k_label = (1 << (fp + fe + 2)) - (1 << (fe + 1)) + (1 << (fe + 2)) - 1
            lterm = Signal(fp + 1, name=f"lterm2_{lane}")
            m.d.comb += lterm.eq((k_label - prod) >> (fe + 2))
            label_p.append(Mux(is_label, lterm, 0))

        with m.If(e5_v):
            m.d.sync += total.eq(total + sum(es))
        commit = Signal()
        label_term = Const(0, fp + 1)
        for term in label_p:  # at most one lane holds the label
            label_term = label_term | term
        m.d.comb += [
            push.eq(o2_v),
            adv.eq(~push | queue.i.ready),
            queue.i.valid.eq(push),
            queue.i.payload.last.eq(o2_last),
            commit.eq(push & queue.i.ready),
            totals.valid.eq(commit),
            totals.loss.eq(label_term),
            totals.end.eq(o2_last),
            totals.hit.eq(hit),
        ]
