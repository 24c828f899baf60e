# amaranth: UnusedElaboratable=no
"""rtl_gen.loss_unit: geometry, packing, cycle models, quick Amaranth-simulator checks (each unit alone and the
two chained), and the cocotb/Verilator runs against sim.hw.arith.output_logits and sim.hw.arith.loss_grad."""

import json
import os
import random
import re

import numpy as np
import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from rtl_gen.loss_unit import (
    HINGE_LATENCY,
    LOGIT_LATENCY,
    LossGradUnit,
    OutputGeometry,
    OutputLogitUnit,
    _const_mul,
    _csd,
)
from rtl_gen.toolchain import run_cocotb, to_verilog
from sim.config import apply_overrides, load_config
from sim.hw.arith import ArithParams, bn_forward, exp2_table, loss_grad, output_logits, output_logits_eval
from sim.hw.widths import derive_widths, layer_bounds, signed_bits

# the output layer sees int8 pixels: Y 18 bits
INT8_ONE_LAYER = {"model.layers": [{"type": "dense", "units": 10}], "hw.input": "int8"}


def small(classes: int, batch: int, loss: str = "cross_entropy") -> dict:
    return {
        "model.layers": [{"type": "dense", "units": 16}, {"type": "dense", "units": classes}],
        "model.num_classes": classes,
        "train.batch_size": batch,
        "train.loss": loss,
    }


def config(overrides=None):
    return apply_overrides(load_config("mlp"), overrides or {})


# --- geometry, parameters, packing ------------------------------------------------------------------------


def test_geometry_of_the_mlp():
    cfg = config()
    g = OutputGeometry.from_config(cfg, lanes=4)
    w = derive_widths(cfg)[-1]
    assert (g.classes, g.batch, g.groups, g.real_last) == (10, 100, 3, 2)
    assert (g.y_width, g.c_width, g.s_width, g.logit_width, g.grad_width) == (10, 43, 23, 15, 18)
    assert (g.y_width, g.c_width, g.s_width, g.logit_width, g.grad_width) == (
        w["y"],
        w["C"],
        w["S"],
        w["logit_q"],
        w["dx"],
    )
    assert g.params == ArithParams.from_config(cfg) and g.bounds == layer_bounds(cfg)[-1]
    assert g.batch_square << g.params.beta_frac == 100 * 100 * 2**16  # K of bn_forward
    assert (g.recip_bits, g.prob_recip_bits, g.sum_width, g.label_width) == (18, 19, 20, 4)
    assert g.exp_table == tuple(exp2_table(8, 16).tolist()) and g.table_width == 17
    # cycle models: 10 channels of (2 + 18 division latency + 18 Horner + 1) cycles, then 100 x 3 beats (the
    # divider's latency: its request register and entry register, then 18 / 19 one-bit trips)
    assert g.channel_cycles() == 39 and g.logit_cycles() == 10 * 39 + 300 + LOGIT_LATENCY + 1 == 696
    assert g.loss_period() == 2 * 3 + 21 + 9 and g.loss_cycles(100) == 3 + 100 * 36 + 1 + 1  # + LOSS_FRONT_STAGE
    # 2 bits per cycle: one radix-4 stage, 10 trips; 4 bits: two stages, 5 trips each (the latency of one stage
    # per cycle either way)
    assert OutputGeometry.from_config(cfg, lanes=4, div_steps=2).loss_period() == 6 + 12 + 9
    assert OutputGeometry.from_config(cfg, lanes=4, div_steps=4).loss_period() == 6 + 12 + 9
    hinge = OutputGeometry.from_config(config({"train.loss": "squared_hinge"}), lanes=4)
    assert hinge.grad_width == signed_bits(256 + 14849) == 15 and hinge.loss_cycles(100) == 300 + HINGE_LATENCY
    assert g.loss_cycles(0) == 0


def test_geometry_of_an_int8_output_layer():
    g = OutputGeometry.from_config(config(INT8_ONE_LAYER), lanes=10)
    assert (g.y_width, g.c_width, g.s_width, g.groups) == (18, 51, 31, 1)  # Y still fits a DSP48 B port


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"lanes": 0}, ValueError, "lanes must be an integer in 1..4096, not 0"),
        ({"lanes": 2.0}, ValueError, "lanes must be an integer in 1..4096, not 2.0"),
        ({"div_steps": 0}, ValueError, "div_steps must be an integer in 1..18, not 0"),
        ({"bounds": "layer"}, TypeError, "bounds must be a sim.hw.widths.LayerBounds, not 'layer'"),
        ({"params": None}, TypeError, "params must be a sim.hw.arith.ArithParams, not None"),
    ],
)
def test_bad_parameters_are_rejected(kwargs, error, message):
    cfg = config()
    args = {"params": ArithParams.from_config(cfg), "bounds": layer_bounds(cfg)[-1], "lanes": 4, **kwargs}
    for unit in (OutputLogitUnit, LossGradUnit):
        with pytest.raises(error, match=re.escape(message)):
            unit(**args)


def test_hidden_layer_bounds_and_unknown_losses_are_rejected():
    cfg = config()
    p = ArithParams.from_config(cfg)
    with pytest.raises(ValueError, match=r"bounds must be the output layer's \(logit_q > 0\), not layer 0"):
        LossGradUnit(params=p, bounds=layer_bounds(cfg)[0], lanes=4)
    with pytest.raises(ValueError, match="params.loss must be one of"):
        OutputGeometry(params=ArithParams(loss="hinge"), bounds=layer_bounds(cfg)[-1], lanes=4)


def test_parameters_are_keyword_only():
    cfg = config()
    with pytest.raises(TypeError):
        OutputLogitUnit(ArithParams.from_config(cfg), layer_bounds(cfg)[-1], 4)


def test_constant_multiplier_digits():
    for k in [*range(1, 600), 10000, 94548, 2**20 - 1]:
        digits = _csd(k)
        assert sum(sign << shift for sign, shift in digits) == k
        shifts = [shift for _, shift in digits]
        assert all(b - a >= 2 for a, b in zip(shifts, shifts[1:], strict=False))  # no adjacent nonzero digits
        assert _const_mul(-37, k) == -37 * k
    assert len(_csd(10000)) == 4  # B^2 of the MLP: three adders


def test_packing_round_trip():
    g = OutputGeometry.from_config(config(), lanes=4)
    rng = np.random.default_rng(1)
    x = rng.integers(-14849, 14850, (5, 10))
    beats = g.pack_rows(x, g.logit_width)
    assert len(beats) == 15 and beats[2] >> (4 * 15) == 1 and beats[1] >> (4 * 15) == 0
    rows, lasts, pads = g.unpack_rows(beats, g.logit_width)
    assert (rows == x).all() and lasts == [0, 0, 1] * 5 and pads == [0, 0] * 5
    consts = g.pack_consts(range(-5, 5), range(1, 11))
    assert consts[0] & (2**43 - 1) == 2**43 - 5 and (consts[0] >> 43) & (2**23 - 1) == 1 and consts[9] >> 66 == 1
    with pytest.raises(ValueError, match="S' must be >= 1"):
        g.pack_consts(range(10), [0] * 10)
    with pytest.raises(ValueError, match=r"shape \(samples, classes=10\)"):
        g.pack_rows(x.T, 15)


def test_verilog_ports():
    def ports(text):
        found = re.findall(r"^\s*(?:input|output) (?:(?:signed )?\[(\d+):0\] )?(\w+);", text, re.M)
        return {name: int(hi or 0) + 1 for hi, name in found}

    w = ports(to_verilog(OutputLogitUnit.from_config(config(), lanes=4), "logit_unit"))
    # x: 4 lanes of an eval logit (30 bits; a training logit needs 15, the loss unit's input below)
    assert w["consts__payload"] == 43 + 23 + 1 and w["y__payload"] == 4 * 10 + 1 and w["x__payload"] == 4 * 30 + 1
    w = ports(to_verilog(LossGradUnit.from_config(config(), lanes=4), "loss_unit"))
    assert w["x__payload"] == 61 and w["label__payload"] == 4 and w["g__payload"] == 4 * 18 + 1
    assert w["loss_q"] == (100 << 16).bit_length() and w["correct"] == 7 and w["done"] == 1


# --- quick functional checks in Amaranth's simulator -------------------------------------------------------


def wiring_value(payload):
    """A payload as a plain value (a structured View, or already a Signal)."""
    return payload.as_value() if hasattr(payload, "as_value") else payload


def _pysim(dut, sources: dict, sink: str, count: int, *, seed: int, p_idle: float, p_stall: float, batches=0,
           init=None):
    """Offer the words of ``sources`` (port name -> list) on their streams and take ``count`` words from ``sink``,
    with random idle cycles and backpressure; returns ``(words, first source transfer cycle, last sink
    transfer cycle, [(loss_q, correct)] at every done pulse)``. Waits for ``batches`` done pulses."""
    coin = random.Random(seed)
    got, stamps, stats = [], {}, []
    sent = dict.fromkeys(sources, 0)
    has_done = hasattr(dut, "done")

    async def bench(ctx):
        cycle = 0
        if init is not None:
            await init(ctx)
        while len(got) < count or len(stats) < batches:
            offers = {}
            for name, words in sources.items():
                port = getattr(dut, name)
                offer = sent[name] < len(words) and coin.random() >= p_idle
                ctx.set(port.valid, offer)
                if offer:
                    ctx.set(wiring_value(port.payload), words[sent[name]])
                offers[name] = offer
            take = coin.random() >= p_stall
            ctx.set(getattr(dut, sink).ready, take)
            for name, offer in offers.items():
                if offer and ctx.get(getattr(dut, name).ready):
                    stamps.setdefault(name, cycle)
                    sent[name] += 1
            if take and ctx.get(getattr(dut, sink).valid):
                got.append(ctx.get(wiring_value(getattr(dut, sink).payload)))
                stamps["last"] = cycle
            if has_done and ctx.get(dut.done):
                stats.append((ctx.get(dut.loss_q), ctx.get(dut.correct)))
            await ctx.tick()
            cycle += 1
            assert cycle < 20000

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return got, stamps, stats


def _bn_batches(g, rng, batches):
    """``(Y, fwd)`` per batch: random Y, one all-equal channel (S' = 1), betas at random and at the extremes."""
    out = []
    for k in range(batches):
        y = rng.integers(-g.bounds.y, g.bounds.y + 1, (g.batch, g.classes))
        y[:, k % g.classes] = y[0, k % g.classes]
        beta = rng.integers(g.params.beta_lo, g.params.beta_hi + 1, g.classes)
        beta[0], beta[-1] = g.params.beta_lo, g.params.beta_hi
        out.append((y, bn_forward(y, beta, g.params, g.bounds.y)))
    return out


@pytest.mark.parametrize(
    "overrides, lanes, div_steps",
    [(small(7, 5), 3, 1), (small(4, 3), 8, 2), (small(2, 1), 1, 1)],
    ids=["c7-b5-l3", "c4-b3-l8-s2", "c2-b1-l1"],
)
def test_logit_unit_in_amaranth_simulator(overrides, lanes, div_steps):
    dut = OutputLogitUnit.from_config(config(overrides), lanes=lanes, div_steps=div_steps)
    g = dut.geometry
    rng = np.random.default_rng(lanes)
    for stress, batches in (((0.0, 0.0), 1), ((0.3, 0.4), 2)):
        jobs = _bn_batches(g, rng, batches)
        consts = [w for _, fwd in jobs for w in g.pack_consts(fwd.C, fwd.S_eff)]
        ys = [w for y, _ in jobs for w in g.pack_rows(y, g.y_width)]
        # one batch at a time: the next batch's constants are taken once the Y stream has passed
        words = []
        for k in range(batches):
            got, stamps, _ = _pysim(
                dut, {"consts": consts[k * g.classes : (k + 1) * g.classes],
                      "y": ys[k * g.batch * g.groups : (k + 1) * g.batch * g.groups]},
                "x", g.batch * g.groups, seed=k, p_idle=stress[0], p_stall=stress[1],
            )  # fmt: skip
            words += got
            if stress == (0.0, 0.0):
                assert stamps["last"] - stamps["consts"] + 1 == g.logit_cycles()
        rows, lasts, pads = g.unpack_rows(words, g.out_width)
        want = np.concatenate([output_logits(y, fwd, g.params) for y, fwd in jobs])
        assert (rows == want).all() and not any(pads)
        assert lasts == [int(i % g.groups == g.groups - 1) for i in range(len(words))]


@pytest.mark.parametrize("overrides, lanes", [(small(7, 5), 3), (small(10, 4), 4), (small(3, 100), 2)],
                         ids=["c7-b5-l3", "c10-b4-l4", "c3-b100"])
def test_logit_unit_eval_in_amaranth_simulator(overrides, lanes):
    """``eval_mode`` (the infer command): constants C' = mu_r 2^Fb - beta s_r' and s_r', K = 2^(Fr+Fb): bit for bit
    :func:`sim.hw.arith.output_logits_eval`, with running statistics at the ends of their range (s_r' = 1 gives
    the widest logits); with ``eval_mode`` low the same geometry gives the training logits."""
    dut = OutputLogitUnit.from_config(config(overrides), lanes=lanes)
    g = dut.geometry
    p = g.params
    rng = np.random.default_rng(lanes + 1)
    run = g.bounds.running
    y = rng.integers(-g.bounds.y, g.bounds.y + 1, (g.batch, g.classes))
    y[0], y[-1] = g.bounds.y, -g.bounds.y
    beta = rng.integers(p.beta_lo, p.beta_hi + 1, g.classes)
    mu = rng.integers(-run, run + 1, g.classes)
    s_r = rng.integers(-2, run + 1, g.classes)
    beta[0], mu[0], s_r[0] = p.beta_lo, run, 1
    beta[1], mu[1], s_r[1] = p.beta_hi, -run, 0
    s_eff = np.maximum(s_r, 1)
    c = mu * (1 << p.beta_frac) - beta * s_eff
    want = output_logits_eval(y, beta, mu, s_r, p)
    assert int(np.abs(want).max()) >= 1 << (g.logit_width - 1)  # beyond a training logit's width
    words = {"consts": g.pack_consts(c, s_eff), "y": g.pack_rows(y, g.y_width)}

    async def hold_eval(ctx):
        ctx.set(dut.eval_mode, 1)

    got = _pysim(dut, words, "x", g.batch * g.groups, seed=1, p_idle=0.2, p_stall=0.3, init=hold_eval)[0]
    assert (g.unpack_rows(got, g.out_width)[0] == want).all()
    ((yt, fwd),) = _bn_batches(g, rng, 1)
    got = _pysim(dut, {"consts": g.pack_consts(fwd.C, fwd.S_eff), "y": g.pack_rows(yt, g.y_width)}, "x",
                 g.batch * g.groups, seed=2, p_idle=0.0, p_stall=0.0)[0]
    assert (g.unpack_rows(got, g.out_width)[0] == output_logits(yt, fwd, p)).all()


def _labelled_logits(g, rng, samples):
    bound = g.bounds.logit_q
    x = rng.integers(-bound, bound + 1, (samples, g.classes))
    x[1] = x[1, 0]  # all equal
    x[2] = -bound
    x[2, -1] = bound  # one dominant logit: the others' exponentials underflow
    x[3, :2] = x[3].max() + 1  # a tie at the maximum: the first index wins
    labels = rng.integers(0, g.classes, samples)
    labels[:4] = [0, g.classes - 1, g.classes - 1, 1]
    return x, labels


@pytest.mark.parametrize(
    "overrides, lanes, div_steps",
    [
        (small(7, 5), 3, 1),
        (small(5, 4), 8, 2),
        (small(7, 5, "squared_hinge"), 3, 1),
        (small(2, 4, "squared_hinge"), 1, 1),
    ],
    ids=["ce-c7-b5-l3", "ce-c5-b4-l8-s2", "hinge-c7-b5-l3", "hinge-c2-b4-l1"],
)
def test_loss_unit_in_amaranth_simulator(overrides, lanes, div_steps):
    dut = LossGradUnit.from_config(config(overrides), lanes=lanes, div_steps=div_steps)
    g = dut.geometry
    rng = np.random.default_rng(lanes)
    samples = 3 * g.batch
    for seed, stress in enumerate([(0.0, 0.0), (0.3, 0.5)]):
        x, labels = _labelled_logits(g, rng, samples)
        got, stamps, stats = _pysim(
            dut, {"x": g.pack_rows(x, g.logit_width), "label": [int(v) for v in labels]}, "g", samples * g.groups,
            seed=seed, p_idle=stress[0], p_stall=stress[1], batches=3,
        )  # fmt: skip
        rows, lasts, pads = g.unpack_rows(got, g.grad_width)
        assert not any(pads) and lasts == [int(i % g.groups == g.groups - 1) for i in range(len(got))]
        for k, (loss_q, correct) in enumerate(stats):
            sl = slice(k * g.batch, (k + 1) * g.batch)
            want, _, want_correct = loss_grad(x[sl], labels[sl], g.params)
            assert (rows[sl] == want).all()
            rows_b = np.arange(g.batch)
            want_q = int((want * want).sum()) if g.loss == "squared_hinge" else int(-want[rows_b, labels[sl]].sum())
            assert (loss_q, correct) == (want_q, want_correct)
        if stress == (0.0, 0.0):
            assert stamps["last"] - stamps["x"] + 1 == g.loss_cycles(samples)


class _Chain(wiring.Component):
    """Logit unit into loss unit, as the controller wires them."""

    def __init__(self, cfg, lanes):
        self.logits = OutputLogitUnit.from_config(cfg, lanes=lanes)
        self.loss = LossGradUnit.from_config(cfg, lanes=lanes)
        super().__init__(
            {
                "consts": In(self.logits.consts.signature.flip()),
                "y": In(self.logits.y.signature.flip()),
                "label": In(self.loss.label.signature.flip()),
                "g": Out(self.loss.g.signature),
                "loss_q": Out(len(self.loss.loss_q)),
                "correct": Out(self.loss.correct.shape()),
                "done": Out(1),
            }
        )

    def elaborate(self, platform):
        m = Module()
        m.submodules.logits, m.submodules.loss = self.logits, self.loss
        wiring.connect(m, wiring.flipped(self.consts), self.logits.consts)
        wiring.connect(m, wiring.flipped(self.y), self.logits.y)
        lx, sx = self.logits.x, self.loss.x  # training logits fit the loss unit's narrower lanes
        m.d.comb += [sx.valid.eq(lx.valid), lx.ready.eq(sx.ready), sx.payload.last.eq(lx.payload.last)]
        m.d.comb += [sx.payload.x[i].eq(lx.payload.x[i]) for i in range(len(sx.payload.x))]
        wiring.connect(m, wiring.flipped(self.label), self.loss.label)
        wiring.connect(m, self.loss.g, wiring.flipped(self.g))
        m.d.comb += [self.loss_q.eq(self.loss.loss_q), self.correct.eq(self.loss.correct), self.done.eq(self.loss.done)]
        return m


def test_logit_and_loss_units_chained():
    """The logit unit's output stream is the loss unit's input: Y and the BN constants in, g out, as
    ``HwModel.train_step`` computes it (output_logits then loss_grad)."""
    cfg = config(small(6, 4))
    dut = _Chain(cfg, lanes=4)
    g = dut.logits.geometry
    rng = np.random.default_rng(7)
    ((y, fwd),) = _bn_batches(g, rng, 1)
    labels = rng.integers(0, g.classes, g.batch)
    got, _, stats = _pysim(
        dut, {"consts": g.pack_consts(fwd.C, fwd.S_eff), "y": g.pack_rows(y, g.y_width), "label": labels.tolist()},
        "g", g.batch * g.groups, seed=1, p_idle=0.2, p_stall=0.3, batches=1,
    )  # fmt: skip
    want, _, correct = loss_grad(output_logits(y, fwd, g.params), labels, g.params)
    assert (g.unpack_rows(got, g.grad_width)[0] == want).all()
    assert stats == [(int(-want[np.arange(g.batch), labels].sum()), correct)]


# --- cocotb on Verilator -----------------------------------------------------------------------------------

LOGIT_SWEEP = [
    # (overrides, lanes, div_steps, batches per test); each is its own Verilator build
    pytest.param({}, 4, 1, 20, id="logits-mlp-l4"),  # the paper's MLP; padding in the last beat
    pytest.param(INT8_ONE_LAYER, 10, 2, 10, id="logits-int8-l10-s2"),  # Y 18 bits, C 51 bits; one beat per sample
    pytest.param(small(5, 8), 1, 1, 40, id="logits-c5-b8-l1", marks=pytest.mark.rtl_slow),
]

LOSS_SWEEP = [
    # (overrides, lanes, div_steps, samples per test)
    pytest.param({}, 4, 1, 1000, id="ce-mlp-l4"),
    pytest.param({"train.loss": "squared_hinge"}, 4, 1, 2000, id="hinge-mlp-l4"),
    pytest.param({}, 3, 2, 600, id="ce-mlp-l3-s2"),  # one real lane in the last beat; 2 quotient bits per cycle
    pytest.param(small(100, 20), 8, 1, 400, id="ce-c100-b20-l8", marks=pytest.mark.rtl_slow),
    pytest.param({"train.loss": "squared_hinge"}, 1, 1, 2000, id="hinge-mlp-l1", marks=pytest.mark.rtl_slow),
]


def _run(unit: str, overrides: dict, lanes: int, div_steps: int, name: str, **counts):
    """Build the unit's Verilog (its own folder per parametrisation) and run its cocotb tests. Rerun one case
    with waveforms (a separate build): ``XNT_WAVES=1 pytest -k <id> ...``; repeat a random run with
    ``COCOTB_RANDOM_SEED=<seed from the log>``."""
    cfg = config(overrides)
    cls = OutputLogitUnit if unit == "logits" else LossGradUnit
    top = "logit_unit" if unit == "logits" else "loss_unit"
    dut = cls.from_config(cfg, lanes=lanes, div_steps=div_steps)
    params = {"unit": unit, "preset": "mlp", "overrides": overrides, "lanes": lanes, "div_steps": div_steps, **counts}
    run = run_cocotb(
        verilog=to_verilog(dut, top, emit_src=False),  # no source line numbers: edits elsewhere keep the build
        toplevel=top,
        test_module="loss_unit_tb",
        name=f"loss_unit_{name}",
        extra_env={"XNT_TB_PARAMS": json.dumps(params)},
        test_filter=rf"\.test_{unit}_",
        waves=bool(os.environ.get("XNT_WAVES")),
    )
    assert run.tests == 5
    return dut, run


@pytest.mark.rtl
@pytest.mark.parametrize("overrides, lanes, div_steps, batches", LOGIT_SWEEP)
def test_logit_unit_rtl(overrides, lanes, div_steps, batches, request):
    dut, run = _run("logits", overrides, lanes, div_steps, request.node.callspec.id, batches=batches)
    measured = json.loads((run.build_dir / "cycles-logits_full_rate.json").read_text())
    assert measured["measured"] == measured["model"] == dut.cycles()


@pytest.mark.rtl
@pytest.mark.parametrize("overrides, lanes, div_steps, samples", LOSS_SWEEP)
def test_loss_unit_rtl(overrides, lanes, div_steps, samples, request):
    dut, run = _run("loss", overrides, lanes, div_steps, request.node.callspec.id, samples=samples)
    measured = json.loads((run.build_dir / "cycles-loss_full_rate.json").read_text())
    assert measured["measured"] == measured["model"] == dut.cycles(samples)
