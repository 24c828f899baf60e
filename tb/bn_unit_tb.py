# amaranth: UnusedElaboratable=no
"""cocotb testbenches for rtl_gen.bn_unit: :class:`BnForwardUnit` against :func:`sim.hw.arith.bn_forward` and
:class:`BnBackwardUnit` against :func:`sim.hw.arith.bn_backward`.

Parameters (``$XNT_TB_PARAMS``, JSON): ``unit`` (``"forward"`` or ``"backward"``), ``layer``
(:meth:`BnLayer.as_dict` of the build), ``div_steps`` (forward), ``batches`` (random batches per test,
default 4). Tests of the other unit skip themselves. No-stall cycle counts are written to
``cycles-<unit>.json`` in the run folder.

Every random batch mixes channel kinds (see :func:`forward_batch` / :func:`backward_batch`), so each batch is
``M`` cases of the per-channel arithmetic; the worst cases of ``sim.hw.widths`` are a test of their own.
"""

from __future__ import annotations

import json
from pathlib import Path

import cocotb
import numpy as np
from cocotb.triggers import FallingEdge, ReadOnly

from rtl_gen.bn_unit import BnBackwardUnit, BnForwardUnit, BnLayer
from sim.config import apply_overrides, load_config
from sim.hw.arith import bn_backward, bn_forward
from tb.common import Bench, tb_params, to_signed

PARAMS = tb_params()
LAYER = BnLayer.from_dict(PARAMS["layer"]) if PARAMS else None
UNIT = PARAMS.get("unit", "")
BATCHES = int(PARAMS.get("batches", 4))


def _model() -> dict | None:
    """The unit's cycle model for this build (per phase and ``total``)."""
    if UNIT == "forward":
        return BnForwardUnit(layer=LAYER, div_steps=int(PARAMS.get("div_steps", 1))).cycles()
    if UNIT == "backward":
        return BnBackwardUnit(layer=LAYER).cycles()
    return None


MODEL = _model()


def small_config(batch: int, channels: int, fan_in: int, *, input_kind: str = "binary", classes: int = 3):
    """The MLP preset cut down to ``fan_in -> channels -> classes`` at batch ``batch`` (for small test layers:
    layer 0 is a hidden layer, layer 1 the output layer)."""
    return apply_overrides(
        load_config("mlp"),
        {
            "model.input_shape": [1, 1, fan_in],
            "model.num_classes": classes,
            "model.layers": [{"type": "dense", "units": channels}, {"type": "dense", "units": classes}],
            "train.batch_size": batch,
            "hw.input": input_kind,
        },
    )


# --- data -----------------------------------------------------------------------------------------------------


def lanes_field(layout, field: str) -> tuple[int, int, int]:
    """``(offset, element width, count)`` of the array ``field`` of a stream payload layout."""
    f = layout[field]
    return f.offset, f.width // f.shape.length, f.shape.length


def pack_lanes(values, width: int) -> int:
    """Lane values (signed or not) packed ``width`` bits apart, lane 0 lowest."""
    mask = (1 << width) - 1
    word = 0
    for i, v in enumerate(values):
        word |= (int(v) & mask) << (i * width)
    return word


def unpack_lanes_word(word: int, width: int, count: int, *, signed: bool = True) -> list[int]:
    mask = (1 << width) - 1
    out = [(word >> (i * width)) & mask for i in range(count)]
    return [to_signed(v, width) for v in out] if signed else out


def beat_words(lay: BnLayer, layout, field: str, values: np.ndarray, extra=None) -> list[int]:
    """Batch-major beats of ``values`` ([B, M]) in ``layout``: ``field`` holds the lanes (padding lanes get
    random junk that must not matter), ``last`` the last group; ``extra(b, g)`` gives further fields as
    ``{name: int}``. Packed by hand from the layout's offsets (Layout.const is too slow for whole batches)."""
    B, G, L, M = lay.batch, lay.groups, lay.lanes, lay.channels
    rng = np.random.default_rng(int(values.sum()) & 0xFFFF)
    lim = int(np.abs(values).max()) if values.size else 0
    off, width, _ = lanes_field(layout, field)
    last_at = layout["last"].offset
    words = []
    for b in range(B):
        for g in range(G):
            lanes = [int(values[b, c]) if c < M else int(rng.integers(-lim, lim + 1)) for c in range(g * L, g * L + L)]
            word = pack_lanes(lanes, width) << off | int(g == G - 1) << last_at
            for name, v in (extra(b, g) if extra is not None else {}).items():
                word |= v << layout[name].offset
            words.append(word)
    return words


def bits_of(lay: BnLayer, sign: np.ndarray, b: int, g: int, rng) -> int:
    """Lane bits of row ``b``, group ``g`` of a +-1 array (1 means +1); padding lanes random."""
    word = 0
    for lane in range(lay.lanes):
        c = g * lay.lanes + lane
        bit = int(sign[b, c] > 0) if c < lay.channels else int(rng.integers(0, 2))
        word |= bit << lane
    return word


def unpack_lanes(lay: BnLayer, words, layout, field: str) -> np.ndarray:
    """``[B, G * lanes]`` signed lane values of ``field`` from batch-major beats."""
    off, width, count = lanes_field(layout, field)
    rows = [unpack_lanes_word(w >> off, width, count) for w in words]
    return np.asarray(rows, dtype=object).reshape(lay.batch, lay.groups * lay.lanes)


def unpack_bits(lay: BnLayer, words, layout, field: str) -> np.ndarray:
    off = layout[field].offset
    rows = [unpack_lanes_word(w >> off, 1, lay.lanes, signed=False) for w in words]
    return np.asarray(rows, dtype=np.int64).reshape(lay.batch, lay.groups * lay.lanes)


def forward_batch(rng: np.random.Generator, lay: BnLayer, *, worst: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(Y [B, M], beta_q [M])``. Channel kinds: uniform over ``[-Ymax, Ymax]``; XNOR-like (``N - 2 *
    binomial`` around a random bias, the parity of real binary layers); narrow (a few values); two values;
    all equal (``S = 0 -> S' = 1``); all at ``+-Ymax``. ``beta_q`` uniform, or at its extremes / 0.
    ``worst``: the ``sim.hw.widths`` extremes (half +Ymax / half -Ymax: largest S and C; one outlier;
    extreme beta on each), plus all-equal channels at +-Ymax."""
    B, M, ymax = lay.batch, lay.channels, lay.y_bound
    p = lay.params
    y = np.empty((B, M), dtype=np.int64)
    beta = rng.integers(p.beta_lo, p.beta_hi + 1, M)
    for c in range(M):
        kind = int(rng.integers(0, 8)) if not worst else 8 + c % 5
        if kind in (0, 1):
            y[:, c] = rng.integers(-ymax, ymax + 1, B)
        elif kind == 2:
            n = lay.fan_in
            y[:, c] = n - 2 * rng.binomial(n, rng.uniform(0.2, 0.8), B)
        elif kind == 3:
            centre = int(rng.integers(-ymax, ymax + 1))
            y[:, c] = np.clip(centre + rng.integers(-3, 4, B), -ymax, ymax)
        elif kind == 4:
            y[:, c] = rng.choice(rng.integers(-ymax, ymax + 1, 2), B)
        elif kind == 5:
            y[:, c] = int(rng.integers(-ymax, ymax + 1))
        elif kind == 6:
            y[:, c] = rng.choice([-ymax, ymax], B)
        elif kind == 7:
            y[:, c] = rng.integers(-ymax, ymax + 1, B)
            beta[c] = rng.choice([p.beta_lo, p.beta_hi, 0])
        elif kind in (8, 9):  # half +Ymax, half -Ymax: largest S and |C|; extreme beta
            y[:, c] = np.where(np.arange(B) % 2 == 0, ymax, -ymax)
            beta[c] = p.beta_lo if kind == 8 else p.beta_hi
        elif kind == 10:  # one outlier against the rest
            y[:, c] = -ymax
            y[int(rng.integers(0, B)), c] = ymax
            beta[c] = rng.choice([p.beta_lo, p.beta_hi])
        elif kind == 11:  # all equal at an extreme: S = 0 -> S' = 1
            y[:, c] = rng.choice([-ymax, ymax])
            beta[c] = rng.choice([p.beta_lo, p.beta_hi])
        else:  # all at +Ymax but one at +Ymax - 1 (S = 2(B-1): tiny scale, huge |x|)
            y[:, c] = ymax
            y[0, c] = ymax - 1
            beta[c] = rng.choice([p.beta_lo, p.beta_hi, 0])
    return y, beta


def backward_batch(rng: np.random.Generator, lay: BnLayer, *, worst: bool = False):
    """``(dx [B, M], x_hat [B, M] +-1, alpha_q [M])``. Channel kinds: uniform ``dx`` over the layer's bound or a
    random fraction of it; sparse (mostly masked); all masked (``Q = 0``); all ``+-bound`` aligned with
    ``x_hat`` (largest ``P1``, ``P2``, ``Q``). ``alpha_q`` uniform up to its bound, or an extreme."""
    B, M = lay.batch, lay.channels
    bound, amax = lay.bounds.dx, lay.bounds.alpha_q
    dx = np.empty((B, M), dtype=np.int64)
    xh = rng.choice(np.array([-1, 1], dtype=np.int64), (B, M))
    alpha = rng.integers(0, amax + 1, M)
    for c in range(M):
        kind = int(rng.integers(0, 5)) if not worst else 5 + c % 3
        if kind == 0:
            dx[:, c] = rng.integers(-bound, bound + 1, B)
        elif kind == 1:
            lim = int(bound >> int(rng.integers(0, max(bound.bit_length() - 1, 1))))
            dx[:, c] = rng.integers(-lim, lim + 1, B)
        elif kind == 2:
            dx[:, c] = rng.integers(-bound, bound + 1, B) * (rng.random(B) < 0.2)
        elif kind == 3:
            dx[:, c] = 0
        elif kind == 4:
            dx[:, c] = rng.integers(-bound, bound + 1, B)
            alpha[c] = rng.choice([0, amax])
        elif kind == 5:  # all aligned with x_hat at the bound: P1 = +-B bound, P2 = B bound
            s = rng.choice([-1, 1])
            xh[:, c] = s
            dx[:, c] = s * bound
            alpha[c] = amax
        elif kind == 6:
            xh[:, c] = rng.choice([-1, 1], B)
            dx[:, c] = -bound * xh[:, c]
            alpha[c] = amax
        else:
            dx[:, c] = 0
            alpha[c] = rng.integers(0, amax + 1)
    return dx, xh, alpha


def zero_scale_channels(rng: np.random.Generator, lay: BnLayer, xh: np.ndarray, *, p: float = 0.25) -> np.ndarray:
    """Flags (bool ``[M]``) of channels whose forward pass had ``S = 0``, about ``p`` of them; their ``x_hat``
    (in place) becomes constant over the batch, as the forward pass makes it (``sign(beta)``). Their ``Q`` must
    be 0 whatever ``dx`` and ``alpha_q`` are."""
    zero = rng.random(lay.channels) < p
    for c in np.flatnonzero(zero):
        xh[:, c] = rng.choice([-1, 1])
    return zero


def alpha_words(lay: BnLayer, alpha, zero) -> list[int]:
    """The ``alpha`` stream's words: ``alpha_q`` and the zero-scale flag per channel (:attr:`BnLayer.alpha_layout`)."""
    off = lay.alpha_layout["alpha_q"].offset
    return [int(a) << off | int(bool(z)) << lay.alpha_layout["zero"].offset for a, z in zip(alpha, zero, strict=True)]


# --- benches --------------------------------------------------------------------------------------------------


class StreamPorts:
    """Every stream port of a unit driven from one coroutine: one ``FallingEdge`` and one ``ReadOnly`` per cycle
    for all of them, and a signal written only when its value changes (simulator accesses dominate long runs of
    multi-port units). Same timing discipline as :class:`tb.common.StreamSource` / ``StreamSink``: a source
    offers with probability ``1 - p_idle`` and then holds its word until it is taken; after a transfer its payload
    turns to random junk until the next offer; a sink is ready with probability ``1 - p_stall``.
    ``stamps[name]`` collects :attr:`Bench.cycle` of every transfer."""

    def __init__(self, bench: Bench, sources: list[str], sinks: list[str], *, p_idle=0.0, p_stall=0.0):
        self.bench = bench
        dut = bench.dut
        self.p_idle, self.p_stall = p_idle, p_stall
        self.handles = {n: (getattr(dut, f"{n}__valid"), getattr(dut, f"{n}__ready"), getattr(dut, f"{n}__payload"))
                        for n in [*sources, *sinks]}  # fmt: skip
        self.widths = {n: len(h[2]) for n, h in self.handles.items()}
        self.sources, self.sinks = list(sources), list(sinks)
        self.stamps: dict[str, list[int]] = {n: [] for n in self.handles}
        self.driven: dict = {}
        for n in sources:
            self._drive(self.handles[n][0], 0)
            self.handles[n][2].value = 0
        for n in sinks:
            self._drive(self.handles[n][1], 0)

    def _drive(self, handle, value: int) -> None:
        if self.driven.get(id(handle)) != value:
            handle.value = value
            self.driven[id(handle)] = value

    async def transfer(self, sends: dict[str, list[int]], counts: dict[str, int], *, max_cycles: int,
                       loop: dict[str, str] | None = None) -> dict[str, list[int]]:  # fmt: skip
        """Send ``sends[name]`` on each source and receive ``counts[name]`` words on each sink, concurrently;
        returns the received words. ``loop = {source: sink}`` feeds a source with what a sink has received so
        far (a controller streaming a buffer back)."""
        bench, rng = self.bench, self.bench.rng
        got: dict[str, list[int]] = {n: [] for n in counts}
        queues = dict(sends)
        totals = {n: len(v) for n, v in sends.items()}
        for src, snk in (loop or {}).items():
            queues[src] = got[snk]
            totals[src] = counts[snk]
        sent = dict.fromkeys(queues, 0)
        offering = dict.fromkeys(queues, False)
        junk = dict.fromkeys(queues, False)  # the payload was just taken: junk it unless a new word follows
        start = bench.cycle
        while any(sent[n] < totals[n] for n in queues) or any(len(got[n]) < counts[n] for n in counts):
            await FallingEdge(bench.clk)
            for n, words in queues.items():
                if not offering[n] and sent[n] < len(words) and rng.random() >= self.p_idle:
                    offering[n] = True
                    self.handles[n][2].value = words[sent[n]]
                elif junk[n]:
                    self.handles[n][2].value = rng.getrandbits(self.widths[n])
                junk[n] = False
                self._drive(self.handles[n][0], int(offering[n]))
            taking = {}
            for n in counts:
                taking[n] = len(got[n]) < counts[n] and rng.random() >= self.p_stall
                self._drive(self.handles[n][1], int(taking[n]))
            await ReadOnly()
            for n in queues:
                if offering[n] and self.handles[n][1].value:
                    self.stamps[n].append(bench.cycle)
                    sent[n] += 1
                    offering[n] = False
                    junk[n] = True
            for n in counts:
                valid, _, payload = self.handles[n]
                if taking[n] and valid.value:
                    got[n].append(int(payload.value))
                    self.stamps[n].append(bench.cycle)
            assert bench.cycle - start < max_cycles, (
                f"stalled after {max_cycles} cycles: sent {sent} of {totals}, received "
                f"{ {n: len(v) for n, v in got.items()} } of {counts}"
            )
        await FallingEdge(bench.clk)
        for n in self.sources:
            self._drive(self.handles[n][0], 0)
        for n in self.sinks:
            self._drive(self.handles[n][1], 0)
        return got


class ForwardTB(Bench):
    """Sources ``y``, ``y_replay``, ``beta``; sinks ``x``, ``stats``."""

    def __init__(self, dut, *, p_idle=0.0, p_stall=0.0):
        super().__init__(dut)
        lay = LAYER
        assert len(dut.stats__payload) == lay.stats_layout.size, "the build does not match $XNT_TB_PARAMS"
        self.ports = StreamPorts(self, ["y", "y_replay", "beta"], ["x", "stats"], p_idle=p_idle, p_stall=p_stall)
        self.np_rng = np.random.default_rng(self.rng.getrandbits(64))

    async def run(self, y: np.ndarray, beta: np.ndarray) -> tuple[dict, int]:
        """One batch through the unit: ``(outputs, cycles)``; cycles from the first ``y`` transfer to the last
        ``stats`` transfer, both included."""
        lay = LAYER
        words = beat_words(lay, lay.y_layout, "y", y)
        beta_words = [int(v) & ((1 << lay.beta_width) - 1) for v in beta]
        stamps = self.ports.stamps
        first = len(stamps["y"])
        got = await self.ports.transfer(
            {"y": words, "y_replay": words + words, "beta": beta_words},
            {"x": lay.beats, "stats": lay.channels},
            max_cycles=30 * MODEL["total"] + 2000,
        )
        stats, xw = got["stats"], got["x"]
        cycles = stamps["stats"][-1] - stamps["y"][first] + 1
        M = lay.channels
        st = [lay.stats_layout.from_bits(w) for w in stats]
        out = {f: np.array([int(getattr(s, f)) for s in st], dtype=object) for f in STATS_FIELDS}
        lasts = [int(s.last) for s in st]
        assert lasts == [0] * (M - 1) + [1], f"stats last flags {lasts}"
        x_hat = unpack_bits(lay, xw, lay.x_layout, "x_hat")
        mask = unpack_bits(lay, xw, lay.x_layout, "mask")
        assert not x_hat[:, M:].any() and not mask[:, M:].any(), "padding lanes of x are not 0"
        out["x_hat"] = np.where(x_hat[:, :M] > 0, 1, -1)
        out["mask"] = mask[:, :M].astype(bool)
        return out, cycles

    def compare(self, y, beta, out) -> None:
        ref = bn_forward(y, beta, LAYER.params, LAYER.y_bound)
        assert ref.K == LAYER.K
        for f in ("x_hat", "mask", *STATS_FIELDS):
            want = np.asarray(getattr(ref, f)).astype(object)
            got = out[f]
            bad = np.argwhere(np.asarray(got != want))
            assert not len(bad), (
                f"{f}: {len(bad)} of {want.size} differ; first at {bad[:4].tolist()}: rtl "
                f"{[got[tuple(i)] for i in bad[:4]]}, ref {[want[tuple(i)] for i in bad[:4]]}"
            )


STATS_FIELDS = ("sum_y", "S", "S_eff", "theta", "theta_lo", "theta_hi", "alpha_q", "C")


class BackwardTB(Bench):
    """Sources ``dx``, ``dx_replay``, ``alpha``; sinks ``p1``, ``q``."""

    def __init__(self, dut, *, p_idle=0.0, p_stall=0.0):
        super().__init__(dut)
        lay = LAYER
        assert len(dut.q__payload) == lay.q_layout.size, "the build does not match $XNT_TB_PARAMS"
        self.ports = StreamPorts(self, ["dx", "dx_replay", "alpha"], ["p1", "q"], p_idle=p_idle, p_stall=p_stall)
        self.np_rng = np.random.default_rng(self.rng.getrandbits(64))

    async def run(self, dx, xh, alpha, zero) -> tuple[np.ndarray, np.ndarray, int]:
        """``(Q [B, M], P1 [M], cycles)``; cycles from the first ``dx`` transfer to the last ``q`` transfer.
        ``zero``: the per-channel zero-scale flags sent with ``alpha``."""
        lay = LAYER
        junk = np.random.default_rng(int(self.rng.getrandbits(32)))
        words = beat_words(lay, lay.dx_layout, "dx", dx, lambda b, g: {"x_hat": bits_of(lay, xh, b, g, junk)})
        stamps = self.ports.stamps
        first = len(stamps["dx"])
        got = await self.ports.transfer(
            {"dx": words, "dx_replay": words, "alpha": alpha_words(lay, alpha, zero)},
            {"p1": lay.channels, "q": lay.beats},
            max_cycles=30 * MODEL["total"] + 2000,
        )
        qw, p1w = got["q"], got["p1"]
        cycles = stamps["q"][-1] - stamps["dx"][first] + 1
        M = lay.channels
        q = unpack_lanes(lay, qw, lay.q_layout, "q")
        assert not q[:, M:].any(), "padding lanes of q are not 0"
        p1s = [lay.p1_layout.from_bits(w) for w in p1w]
        assert [int(v.last) for v in p1s] == [0] * (M - 1) + [1], "p1 last flags"
        return q[:, :M], np.array([int(v.p1) for v in p1s], dtype=object), cycles

    @staticmethod
    def compare(dx, xh, alpha, zero, q, p1) -> None:
        want_q, want_p1 = bn_backward(dx, xh, alpha, LAYER.params, zero)
        bad = np.argwhere(np.asarray(q != want_q.astype(object)))
        assert not len(bad), f"Q: {len(bad)} of {q.size} differ; first {bad[:4].tolist()}"
        assert list(p1) == [int(v) for v in want_p1], "P1 differs"


def record(unit: str, measured: int, model: dict) -> None:
    Path(f"cycles-{unit}.json").write_text(json.dumps({"measured": measured, "model": model}))


def _skip_unless(unit: str) -> bool:
    return UNIT != unit


# --- forward tests --------------------------------------------------------------------------------------------


@cocotb.test(skip=_skip_unless("forward"))
async def test_fwd_full_rate(dut):
    """Random batches back to back with no stalls: every BnForward field, and the exact cycle count."""
    tb = ForwardTB(dut)
    await tb.reset()
    model = MODEL["total"]
    for _ in range(BATCHES):
        y, beta = forward_batch(tb.np_rng, LAYER)
        out, cycles = await tb.run(y, beta)
        tb.compare(y, beta, out)
        assert cycles == model, f"batch took {cycles} cycles, model {model}"
    record("forward", cycles, MODEL)


@cocotb.test(skip=_skip_unless("forward"))
async def test_fwd_worst_cases(dut):
    """The sim.hw.widths extremes: half +-Ymax channels with extreme beta (largest S, C, A), outliers,
    all-equal channels (S = 0 -> S' = 1), saturated thresholds."""
    tb = ForwardTB(dut)
    await tb.reset()
    for _ in range(2 if BATCHES > 1 else 1):
        y, beta = forward_batch(tb.np_rng, LAYER, worst=True)
        out, cycles = await tb.run(y, beta)
        tb.compare(y, beta, out)
        assert cycles == MODEL["total"]


@cocotb.test(skip=_skip_unless("forward"))
@cocotb.parametrize(stress=[(0.5, 0.0), (0.0, 0.6), (0.3, 0.4)])
async def test_fwd_under_stress(dut, stress):
    """Random batches with idle input cycles on every source and backpressure on both outputs."""
    p_idle, p_stall = stress
    tb = ForwardTB(dut, p_idle=p_idle, p_stall=p_stall)
    await tb.reset()
    for i in range(max(BATCHES // 2, 1)):
        y, beta = forward_batch(tb.np_rng, LAYER, worst=i % 2 == 1)
        out, cycles = await tb.run(y, beta)
        tb.compare(y, beta, out)
        assert cycles >= MODEL["total"]


# --- backward tests -------------------------------------------------------------------------------------------


@cocotb.test(skip=_skip_unless("backward"))
async def test_bwd_full_rate(dut):
    """Random batches back to back with no stalls: Q and P1, and the exact cycle count."""
    tb = BackwardTB(dut)
    await tb.reset()
    model = MODEL["total"]
    for _ in range(BATCHES):
        dx, xh, alpha = backward_batch(tb.np_rng, LAYER)
        zero = zero_scale_channels(tb.np_rng, LAYER, xh)
        q, p1, cycles = await tb.run(dx, xh, alpha, zero)
        tb.compare(dx, xh, alpha, zero, q, p1)
        assert cycles == model, f"batch took {cycles} cycles, model {model}"
    record("backward", cycles, MODEL)


@cocotb.test(skip=_skip_unless("backward"))
async def test_bwd_worst_cases(dut):
    """dx at its bound aligned with x_hat and alpha at its bound (largest P1, P2, Q); all-masked channels; then
    every channel of zero scale (a degenerate batch: Q = 0 everywhere, P1 as usual)."""
    tb = BackwardTB(dut)
    await tb.reset()
    for i in range(3 if BATCHES > 1 else 2):
        dx, xh, alpha = backward_batch(tb.np_rng, LAYER, worst=True)
        zero = zero_scale_channels(tb.np_rng, LAYER, xh, p=1.0 if i == 1 else 0.0)
        q, p1, cycles = await tb.run(dx, xh, alpha, zero)
        tb.compare(dx, xh, alpha, zero, q, p1)
        assert cycles == MODEL["total"]


@cocotb.test(skip=_skip_unless("backward"))
@cocotb.parametrize(stress=[(0.5, 0.0), (0.0, 0.6), (0.3, 0.4)])
async def test_bwd_under_stress(dut, stress):
    p_idle, p_stall = stress
    tb = BackwardTB(dut, p_idle=p_idle, p_stall=p_stall)
    await tb.reset()
    for i in range(max(BATCHES // 2, 1)):
        dx, xh, alpha = backward_batch(tb.np_rng, LAYER, worst=i % 2 == 1)
        zero = zero_scale_channels(tb.np_rng, LAYER, xh)
        q, p1, cycles = await tb.run(dx, xh, alpha, zero)
        tb.compare(dx, xh, alpha, zero, q, p1)
        assert cycles >= MODEL["total"]
