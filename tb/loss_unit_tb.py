"""cocotb testbenches for rtl_gen.loss_unit: :class:`OutputLogitUnit` against :func:`sim.hw.arith.output_logits`
(tests ``test_logits_*``) and :class:`LossGradUnit` against :func:`sim.hw.arith.loss_grad` (tests ``test_loss_*``).

Parameters (``$XNT_TB_PARAMS``, JSON): ``unit`` (``"logits"`` or ``"loss"``: which top the build is), ``preset``
and ``overrides`` (the configuration: ``apply_overrides(load_config(preset), overrides)``), ``lanes``,
``div_steps``, ``batches`` (logit unit: batches per test) or ``samples`` (loss unit: samples per test, a multiple
of the batch size). The geometry is rebuilt with :meth:`OutputGeometry.from_config`, exactly as the build's.
Cycle counts measured without stalls go to ``cycles-<test>.json`` in the run folder for the pytest side.

Inputs are random with the worst cases mixed in (see :func:`make_bn_batch` and :func:`make_logits`); the
constants of the logit unit come from :func:`sim.hw.arith.bn_forward` of the same ``Y`` (what the BN unit
sends), so the logits stay within the bound of :mod:`sim.hw.widths` as they do in the model.
"""

from __future__ import annotations

import json
from pathlib import Path

import cocotb
import numpy as np
from cocotb.triggers import FallingEdge, ReadOnly, RisingEdge

from rtl_gen.loss_unit import OutputGeometry
from sim.config import apply_overrides, load_config
from sim.hw.arith import bn_forward, loss_grad, output_logits, softmax_q
from tb.common import Bench, StreamSink, StreamSource, tb_params

PARAMS = tb_params()


def _geometry() -> OutputGeometry | None:
    if not PARAMS:
        return None
    cfg = apply_overrides(load_config(PARAMS.get("preset", "mlp")), PARAMS.get("overrides", {}))
    return OutputGeometry.from_config(cfg, lanes=PARAMS["lanes"], div_steps=PARAMS.get("div_steps", 1))


GEO = _geometry()


def record_cycles(test: str, measured: int, model: int, **extra) -> None:
    Path(f"cycles-{test}.json").write_text(json.dumps({"measured": measured, "model": model, **extra}))


class TB(Bench):
    """Clock, reset and a ``framing_error`` pulse counter (started on request: it polls every cycle)."""

    def __init__(self, dut):
        super().__init__(dut)
        assert GEO is not None, "no configuration in $XNT_TB_PARAMS"
        self.np_rng = np.random.default_rng(self.rng.getrandbits(64))
        self.framing_errors = 0

    def watch_framing(self):
        async def watch():
            while True:
                await FallingEdge(self.clk)
                await ReadOnly()
                if self.dut.framing_error.value:
                    self.framing_errors += 1

        cocotb.start_soon(watch())


# --- OutputLogitUnit ---------------------------------------------------------------------------------------


def _pow2_pattern(n: int) -> tuple[int, int, int] | None:
    """Counts ``(n0, n1, n2)`` of the values ``0, 1, 2`` in a column of ``n`` whose l1 scale ``S = sum |n y_b -
    sum_y|`` is a power of two (then ``R = 2^(FL+G+1)`` exactly, the reciprocal's top value), or None."""
    for n1 in range(n + 1):
        for n2 in range(n + 1 - n1):
            s_y = n1 + 2 * n2
            S = (n - n1 - n2) * s_y + n1 * abs(n - s_y) + n2 * abs(2 * n - s_y)
            if S > 1 and S & (S - 1) == 0:
                return n - n1 - n2, n1, n2
    return None


POW2 = _pow2_pattern(GEO.batch) if GEO is not None else None
CHANNEL_KINDS = ("uniform", "equal", "outlier_hi", "outlier_lo", "pow2", "extreme", "small")


def make_bn_batch(rng: np.random.Generator, kinds=None) -> tuple[np.ndarray, np.ndarray]:
    """``(Y [B, classes], beta_q [classes])``. Channel columns of the kinds in ``kinds`` (default random):
    uniform in ``[-N, N]``; all equal (``S' = 1``); one outlier at ``+N`` among ``-N`` or the reverse (``|x - beta|
    = B/2``, with ``beta`` at its extremes this is the largest logit); ``S'`` a power of two; ``+-N`` only; values
    in ``-1..1``. ``beta`` is uniform, or one of its two extremes."""
    B, M, N = GEO.batch, GEO.classes, GEO.bounds.y
    p = GEO.params
    if kinds is None:
        kinds = rng.choice(CHANNEL_KINDS, size=M)
    y = np.empty((B, M), dtype=np.int64)
    beta = rng.integers(p.beta_lo, p.beta_hi + 1, M)
    for j, kind in enumerate(kinds):
        col = rng.integers(-N, N + 1, B)
        if kind == "equal":
            col[:] = rng.integers(-N, N + 1)
        elif kind in ("outlier_hi", "outlier_lo") and B > 1:
            sign = 1 if kind == "outlier_hi" else -1
            col[:] = -sign * N
            col[rng.integers(B)] = sign * N
            beta[j] = p.beta_hi if sign > 0 else p.beta_lo
        elif kind == "pow2" and POW2 is not None:
            n0, n1, n2 = POW2
            step = 1 << int(rng.integers(0, max(N.bit_length() - 2, 1)))
            col = rng.permutation(np.repeat([0, step, 2 * step], [n0, n1, n2])) - step
        elif kind == "extreme":
            col = rng.choice([-N, N], size=B)
        elif kind == "small":
            col = rng.integers(-1, 2, B)
        y[:, j] = col
        if rng.random() < 0.3:
            beta[j] = rng.choice([p.beta_lo, p.beta_hi])
    return y, beta


class LogitTB(TB):
    def __init__(self, dut, *, p_idle=0.0, p_stall=0.0):
        super().__init__(dut)
        assert len(dut.y__payload) == GEO.lanes * GEO.y_width + 1, "the build does not have this geometry"
        self.consts = StreamSource(self, "consts", p_idle=p_idle)
        self.y = StreamSource(self, "y", p_idle=p_idle)
        self.x = StreamSink(self, "x", p_stall=p_stall)
        self.pow2_channels = 0
        self.max_abs_logit = 0

    async def batch(self, y, beta, *, bad_last=(), bad_const_last=()) -> tuple[np.ndarray, np.ndarray, int]:
        """One batch through the unit: ``(rtl logits, golden logits, cycles)``; cycles from the first constants
        transfer to the last logit transfer, both included. ``bad_last`` / ``bad_const_last``: Y / constants
        beat indices sent with a wrong ``last`` flag."""
        g, p = GEO, GEO.params
        fwd = bn_forward(y, beta, p, g.bounds.y)
        assert fwd.K == g.batch_square << p.beta_frac, "K of the BN model differs from the unit's constant"
        want = output_logits(y, fwd, p)
        s_eff = [int(v) for v in fwd.S_eff]
        self.pow2_channels += sum(1 for v in s_eff if v > 1 and v & (v - 1) == 0)
        self.max_abs_logit = max(self.max_abs_logit, int(np.abs(want).max()))
        consts = g.pack_consts(fwd.C, fwd.S_eff)
        consts = [c ^ (1 << (g.c_width + g.s_width)) if i in bad_const_last else c for i, c in enumerate(consts)]
        beats = g.pack_rows(y, g.y_width)
        flag = 1 << (g.lanes * g.y_width)
        beats = [b ^ flag if i in bad_last else b for i, b in enumerate(beats)]
        c0, x0 = len(self.consts.stamps), len(self.x.stamps)
        senders = [cocotb.start_soon(self.consts.send(consts)), cocotb.start_soon(self.y.send(beats))]
        got = await self.x.receive(len(beats), max_cycles=30 * g.logit_cycles() + 1000)
        for s in senders:
            await s
        cycles = self.x.stamps[-1] - self.consts.stamps[c0] + 1
        assert self.x.stamps[x0] > self.consts.stamps[-1], "logits before the last constants"
        rows, lasts, pads = g.unpack_rows(got, g.out_width)
        assert lasts == [int(i % g.groups == g.groups - 1) for i in range(len(got))], "wrong last flags"
        assert not any(pads), f"padding lanes not 0: {pads[:8]}"
        return rows, want, cycles


def compare(name: str, got: np.ndarray, want: np.ndarray, context: np.ndarray | None = None) -> None:
    bad = np.argwhere(got != want)
    if len(bad):
        first = [tuple(int(v) for v in i) for i in bad[:4]]
        detail = f"; inputs of the first: {context[first[0][0]].tolist()}" if context is not None else ""
        raise AssertionError(
            f"{len(bad)} of {got.size} {name} differ; first (sample, class): {first}, "
            f"rtl {[int(got[i]) for i in first]}, ref {[int(want[i]) for i in first]}{detail}"
        )


@cocotb.test()
async def test_logits_full_rate(dut):
    """Batches with every kind of channel, no stalls: bit-exact logits and the exact cycle count per batch."""
    tb = LogitTB(dut)
    await tb.reset()
    batches = int(PARAMS.get("batches", 10))
    measured = []
    for k in range(batches):
        kinds = [CHANNEL_KINDS[(j + k) % len(CHANNEL_KINDS)] for j in range(GEO.classes)] if k < 2 else None
        y, beta = make_bn_batch(tb.np_rng, kinds)
        got, want, cycles = await tb.batch(y, beta)
        compare("logits", got, want)
        measured.append(cycles)
    record_cycles("logits_full_rate", measured[0], GEO.logit_cycles(), batches=batches)
    assert set(measured) == {GEO.logit_cycles()}, (
        f"cycles per batch {sorted(set(measured))}, model {GEO.logit_cycles()}"
    )
    p = GEO.params
    near = ((GEO.batch + 1) // 2 + (1 << (p.beta_int - 1)) - 1) << p.logit_frac
    assert tb.max_abs_logit >= near, (
        f"largest |logit| {tb.max_abs_logit} never came near the bound {GEO.bounds.logit_q}"
    )
    assert POW2 is None or tb.pow2_channels > 0, "no channel had S' a power of two"
    dut._log.info("%d batches; largest |logit| %d (bound %d); %d channels with S' = 2^k",
                  batches, tb.max_abs_logit, GEO.bounds.logit_q, tb.pow2_channels)  # fmt: skip


@cocotb.test()
@cocotb.parametrize(stress=[(0.5, 0.0), (0.0, 0.6), (0.3, 0.5)])
async def test_logits_under_stress(dut, stress):
    """Random idle cycles on ``consts`` and ``y``, random backpressure on ``x``."""
    p_idle, p_stall = stress
    tb = LogitTB(dut, p_idle=p_idle, p_stall=p_stall)
    await tb.reset()
    for _ in range(max(int(PARAMS.get("batches", 10)) // 3, 2)):
        y, beta = make_bn_batch(tb.np_rng)
        got, want, cycles = await tb.batch(y, beta)
        compare("logits", got, want)
        assert cycles >= GEO.logit_cycles()


@cocotb.test()
async def test_logits_framing_error(dut):
    """Wrong ``last`` flags on constants and Y beats pulse ``framing_error`` once each; the unit goes by its
    counts."""
    tb = LogitTB(dut, p_idle=0.2, p_stall=0.2)
    tb.watch_framing()
    await tb.reset()
    n = GEO.batch * GEO.groups
    bad = {0, n // 2, n - 1}
    bad_const = {0, GEO.classes - 1}
    y, beta = make_bn_batch(tb.np_rng)
    got, want, _ = await tb.batch(y, beta, bad_last=bad, bad_const_last=bad_const)
    compare("logits", got, want)
    await tb.cycles(3)
    expected = len(bad) + len(bad_const)
    assert tb.framing_errors == expected, f"{tb.framing_errors} framing errors flagged, {expected} expected"


# --- LossGradUnit ------------------------------------------------------------------------------------------

SAMPLE_KINDS = ("uniform", "equal", "dominant", "underflow_edge", "ties", "close", "extreme")


def make_logits(rng: np.random.Generator, samples: int) -> tuple[np.ndarray, np.ndarray]:
    """``(logits [samples, classes], labels [samples])``. Per sample one kind: uniform within the logit bound;
    all equal; one dominant logit at the bound with the others at minus the bound (their exponentials
    underflow to 0); others at distances around the underflow edge (``e`` of 0, 1 or 2); the maximum shared by
    several classes (argmax is the first; the label sometimes on a later tied class); all within a few LSBs;
    the largest magnitudes of the bound. Cross-entropy also gets the full logit width (``-2^(w-1)`` and
    ``2^(w-1) - 1``). Labels are random with the first and the last class over-represented."""
    C = GEO.classes
    p = GEO.params
    bound = GEO.bounds.logit_q
    full = (1 << (GEO.logit_width - 1)) - 1
    # distance in logit LSBs below the maximum at which e = T >> shift reaches 0: shift >= table width
    edge = int(GEO.table_width * (1 << p.logit_frac) / np.log2(np.e))
    x = rng.integers(-bound, bound + 1, (samples, C))
    labels = rng.integers(0, C, samples)
    kinds = rng.choice(SAMPLE_KINDS, size=samples)
    kinds[: len(SAMPLE_KINDS)] = SAMPLE_KINDS
    for b, kind in enumerate(kinds):
        top = int(rng.integers(0, C))
        if kind == "equal":
            x[b] = rng.integers(-bound, bound + 1)
        elif kind == "dominant":
            x[b] = -bound
            x[b, top] = bound
        elif kind == "underflow_edge":
            hi = int(rng.integers(min(-bound + 2 * edge, bound), bound + 1))
            x[b] = np.maximum(hi - rng.integers(edge - 300, edge + 300, C), -bound)
            x[b, top] = hi
        elif kind == "ties":
            hi = int(rng.integers(-bound // 2, bound // 2))
            x[b] = np.minimum(x[b], hi)
            tied = rng.choice(C, size=min(C, int(rng.integers(2, 4))), replace=False)
            x[b, tied] = hi
            labels[b] = int(max(tied)) if rng.random() < 0.5 else int(min(tied))
        elif kind == "close":
            x[b] = int(rng.integers(-bound // 2, bound // 2)) + rng.integers(-4, 5, C)
        elif kind == "extreme":
            lim = full if (GEO.loss == "cross_entropy" and rng.random() < 0.5) else bound
            x[b] = rng.choice([-lim - (lim == full), lim], size=C)
    labels[rng.random(samples) < 0.2] = 0
    labels[rng.random(samples) < 0.2] = C - 1
    return x, labels


class LossTB(TB):
    def __init__(self, dut, *, p_idle=0.0, p_stall=0.0):
        super().__init__(dut)
        assert len(dut.x__payload) == GEO.lanes * GEO.logit_width + 1, "the build does not have this geometry"
        self.x = StreamSource(self, "x", p_idle=p_idle)
        self.label = StreamSource(self, "label", p_idle=p_idle)
        self.g = StreamSink(self, "g", p_stall=p_stall)
        self.stats: list[tuple[int, int]] = []
        cocotb.start_soon(self._watch_done())

    async def _watch_done(self):
        while True:
            await RisingEdge(self.dut.done)
            await ReadOnly()
            self.stats.append((int(self.dut.loss_q.value), int(self.dut.correct.value)))

    async def run(self, x, labels, *, bad_last=()) -> tuple[np.ndarray, list[tuple[int, int]], int]:
        """``samples`` through the unit: ``(rtl g, batch stats (loss_q, correct), cycles)``; cycles from the first
        logit transfer to the last gradient transfer, both included."""
        g = GEO
        beats = g.pack_rows(x, g.logit_width)
        flag = 1 << (g.lanes * g.logit_width)
        beats = [b ^ flag if i in bad_last else b for i, b in enumerate(beats)]
        x0, g0, s0 = len(self.x.stamps), len(self.g.stamps), len(self.stats)
        senders = [cocotb.start_soon(self.label.send([int(v) for v in labels])), cocotb.start_soon(self.x.send(beats))]
        got = await self.g.receive(len(beats), max_cycles=30 * g.loss_cycles(len(x)) + 1000)
        for s in senders:
            await s
        cycles = self.g.stamps[-1] - self.x.stamps[x0] + 1
        assert self.g.stamps[g0] > self.x.stamps[x0]
        batches = len(x) // g.batch
        for _ in range(20):
            if len(self.stats) - s0 >= batches:
                break
            await self.cycles(1)
        assert len(self.stats) - s0 == batches, f"{len(self.stats) - s0} done pulses for {batches} batches"
        rows, lasts, pads = g.unpack_rows(got, g.grad_width)
        assert lasts == [int(i % g.groups == g.groups - 1) for i in range(len(got))], "wrong last flags"
        assert not any(pads), f"padding lanes not 0: {pads[:8]}"
        return rows, self.stats[s0:], cycles


def check_loss(x, labels, got, stats) -> None:
    """Batch by batch against :func:`sim.hw.arith.loss_grad` (and, for cross-entropy, ``p = g + onehot`` against
    :func:`sim.hw.arith.softmax_q`); ``loss_q`` as :meth:`sim.hw.model.HwModel._loss_q` forms it from ``g``."""
    p, B = GEO.params, GEO.batch
    for k, (loss_q, correct) in enumerate(stats):
        sl = slice(k * B, (k + 1) * B)
        xb, lb = x[sl], labels[sl]
        want, _, want_correct = loss_grad(xb, lb, p)
        compare(f"gradients of batch {k}", got[sl], want, xb)
        rows = np.arange(B)
        if p.loss == "squared_hinge":
            want_loss_q = int((want * want).sum())
        else:
            want_loss_q = int(-want[rows, lb].sum())
            probs = got[sl].copy()
            probs[rows, lb] += 1 << p.prob_frac
            compare(f"probabilities of batch {k}", probs, softmax_q(xb, p), xb)
        assert (loss_q, correct) == (want_loss_q, want_correct), (
            f"batch {k}: rtl loss_q, correct = {(loss_q, correct)}, ref {(want_loss_q, want_correct)}"
        )


def _samples() -> int:
    n = int(PARAMS.get("samples", 10 * GEO.batch))
    assert n % GEO.batch == 0, f"samples = {n} is not a multiple of the batch {GEO.batch}"
    return n


@cocotb.test()
async def test_loss_full_rate(dut):
    """Whole batches of every kind of sample, no stalls: bit-exact gradients, loss_q and correct, and the
    exact cycle count."""
    tb = LossTB(dut)
    await tb.reset()
    n = _samples()
    x, labels = make_logits(tb.np_rng, n)
    got, stats, cycles = await tb.run(x, labels)
    check_loss(x, labels, got, stats)
    record_cycles("loss_full_rate", cycles, GEO.loss_cycles(n), samples=n)
    assert cycles == GEO.loss_cycles(n), f"{n} samples took {cycles} cycles, model {GEO.loss_cycles(n)}"


@cocotb.test()
@cocotb.parametrize(stress=[(0.5, 0.0), (0.0, 0.6), (0.3, 0.5)])
async def test_loss_under_stress(dut, stress):
    """Random idle cycles on ``x`` and ``label``, random backpressure on ``g``; two runs back to back."""
    p_idle, p_stall = stress
    tb = LossTB(dut, p_idle=p_idle, p_stall=p_stall)
    await tb.reset()
    per_run = max(_samples() // (3 * GEO.batch), 1) * GEO.batch
    for _ in range(2):
        x, labels = make_logits(tb.np_rng, per_run)
        got, stats, cycles = await tb.run(x, labels)
        check_loss(x, labels, got, stats)
        assert cycles >= GEO.loss_cycles(per_run)


@cocotb.test()
async def test_loss_framing_error(dut):
    """Wrong ``last`` flags on logit beats pulse ``framing_error`` once each; results are unaffected."""
    tb = LossTB(dut, p_idle=0.2, p_stall=0.2)
    tb.watch_framing()
    await tb.reset()
    x, labels = make_logits(tb.np_rng, GEO.batch)
    n = GEO.batch * GEO.groups
    bad = {0, n // 2, n - 1}
    got, stats, _ = await tb.run(x, labels, bad_last=bad)
    check_loss(x, labels, got, stats)
    await tb.cycles(3)
    assert tb.framing_errors == len(bad), f"{tb.framing_errors} framing errors flagged, {len(bad)} expected"
