# amaranth: UnusedElaboratable=no
"""cocotb testbench for rtl_gen.po2_unit.Po2Unit against :func:`sim.hw.arith.po2_quantise` (codes, bias, unit
exponent) and, for the scratch exponents of pass 1, :func:`sim.hw.arith.round_log2_ratio`.

Parameters (``$XNT_TB_PARAMS``, JSON): ``layer`` (:meth:`rtl_gen.bn_unit.BnLayer.as_dict` of the build),
``mul_steps``, ``pass1_lanes`` (default: all lanes), ``batches`` (random layers per test, default 4). The
no-stall cycle count is written to ``cycles-po2.json`` in the run folder.

Pass 2 reads the scratch back. In the exact-timing test the bench offers the scratch it expects (from
``round_log2_ratio``) from the start, as a controller streaming its scratch buffer would; the stress tests loop
the unit's own scratch output back instead. Either way the scratch the unit wrote is checked.
"""

from __future__ import annotations

import json
from pathlib import Path

import cocotb
import numpy as np

from rtl_gen.bn_unit import BnLayer
from rtl_gen.po2_unit import SCALE_WIDTH, Po2Unit
from sim.hw.arith import bn_backward, po2_quantise, round_log2_ratio
from tb.bn_unit_tb import StreamPorts, backward_batch, beat_words, unpack_lanes_word
from tb.common import Bench, tb_params, to_signed

PARAMS = tb_params()
LAYER = BnLayer.from_dict(PARAMS["layer"]) if PARAMS else None
UNIT = (Po2Unit(layer=LAYER, mul_steps=int(PARAMS.get("mul_steps", 1)), pass1_lanes=PARAMS.get("pass1_lanes"))
        if PARAMS else None)
BATCHES = int(PARAMS.get("batches", 4))


def log_uniform(rng: np.random.Generator, hi: int, size) -> np.ndarray:
    """Integers in ``[0, hi]`` whose bit lengths are roughly uniform (small and large magnitudes alike)."""
    shift = rng.integers(0, max(int(hi).bit_length(), 1), size)
    return rng.integers(0, hi + 1, size) >> shift


def po2_batch(rng: np.random.Generator, lay: BnLayer, kind: int) -> tuple[np.ndarray, np.ndarray, int]:
    """``(Q [B, M], S' [M], scale)``. Kinds: 0 ``Q`` from :func:`bn_backward` of a random batch (masked channels
    give ``Q = 0``); 1 random signs and log-uniform magnitudes up to the bound, zeros mixed in; 2 all zero
    (bias 0); 3 one nonzero element; 4 worst cases: ``+-Q`` bound against ``S' = 1`` and ``S'`` max, ``+-1``
    against ``S'`` max (below ``e_min``: clamped), all-zero channels."""
    B, M = lay.batch, lay.channels
    qb, smax = lay.bounds.Q, lay.s_eff_max
    s_eff = np.maximum(log_uniform(rng, smax, M), 1)
    s_eff[rng.integers(0, M)] = smax
    scale = int(rng.integers(-60, 61)) if rng.random() < 0.8 else (-lay.params.prob_frac if lay.top else 0)
    if kind == 0:
        q, _ = bn_backward(*backward_batch(rng, lay), lay.params)
    elif kind == 1:
        q = log_uniform(rng, qb, (B, M)) * rng.choice([-1, 1], (B, M))
    elif kind == 2:
        q = np.zeros((B, M), dtype=np.int64)
    elif kind == 3:
        q = np.zeros((B, M), dtype=np.int64)
        q[rng.integers(0, B), rng.integers(0, M)] = rng.choice([-1, 1]) * max(int(log_uniform(rng, qb, 1)[0]), 1)
    else:
        q = rng.choice(np.array([-qb, qb, -1, 1, 0], dtype=np.int64), (B, M))
        s_eff = rng.choice(np.array([1, smax], dtype=np.int64), M)
        q[:, rng.integers(0, M)] = 0
    return np.asarray(q, dtype=np.int64), np.asarray(s_eff, dtype=np.int64), scale


def expected_e0(lay: BnLayer, q: np.ndarray, s_eff: np.ndarray) -> np.ndarray:
    """``round(log2(U / S'))`` per element (meaningless where ``Q = 0``)."""
    num = np.abs(q) * (1 if lay.top else lay.batch)
    return round_log2_ratio(num, s_eff)


class TB(Bench):
    """Sources ``s_eff``, ``q``, ``scratch_in``; sinks ``scratch``, ``bias``, ``codes``; drives ``scale``."""

    def __init__(self, dut, *, p_idle=0.0, p_stall=0.0):
        super().__init__(dut)
        assert len(dut.codes__payload) == UNIT.codes_layout.size, "the build does not match $XNT_TB_PARAMS"
        self.ports = StreamPorts(
            self, ["s_eff", "q", "scratch_in"], ["scratch", "bias", "codes"], p_idle=p_idle, p_stall=p_stall
        )
        self.np_rng = np.random.default_rng(self.rng.getrandbits(64))
        dut.scale.value = 0

    @staticmethod
    def scratch_words(q: np.ndarray, e0: np.ndarray) -> list[int]:
        """The scratch beats the unit should write for ``Q`` (``e0`` where ``Q != 0``), packed by hand."""
        lay = LAYER
        G, L, M = lay.groups, lay.lanes, lay.channels
        ew = UNIT.e_width
        mask = (1 << ew) - 1
        lane_w = ew + 2
        last_at = UNIT.scratch_layout["last"].offset
        words = []
        for b in range(lay.batch):
            for g in range(G):
                word = int(g == G - 1) << last_at
                for lane, c in enumerate(range(g * L, g * L + L)):
                    v = int(q[b, c]) if c < M else 0
                    if v:
                        word |= ((int(e0[b, c]) & mask) | int(v < 0) << ew | 1 << (ew + 1)) << (lane * lane_w)
                words.append(word)
        return words

    async def run(self, q, s_eff, scale, *, loopback: bool):
        """One layer: returns ``(field [B, M], neg [B, M], (bias, unit_exp), scratch beats, cycles)``; cycles from
        the first ``s_eff`` transfer to the last ``codes`` transfer."""
        lay = LAYER
        self.dut.scale.value = scale & ((1 << SCALE_WIDTH) - 1)
        stamps = self.ports.stamps
        first = len(stamps["s_eff"])
        sends = {"s_eff": [int(v) for v in s_eff], "q": beat_words(lay, lay.q_layout, "q", q)}
        if not loopback:
            sends["scratch_in"] = self.scratch_words(q, expected_e0(lay, q, s_eff))
        got = await self.ports.transfer(
            sends,
            {"scratch": lay.beats, "bias": 1, "codes": lay.beats},
            max_cycles=30 * UNIT.cycles()["total"] + 2000,
            loop={"scratch_in": "scratch"} if loopback else None,
        )
        scratch, (bias_word,), codes = got["scratch"], got["bias"], got["codes"]
        cycles = stamps["codes"][-1] - stamps["s_eff"][first] + 1
        b = UNIT.bias_layout.from_bits(bias_word)
        M = lay.channels
        fw = lay.params.k - 1
        last_at = UNIT.codes_layout["last"].offset
        assert [w >> last_at for w in codes] == [int(i % lay.groups == lay.groups - 1) for i in range(lay.beats)]
        lanes = np.array([unpack_lanes_word(w, fw + 1, lay.lanes, signed=False) for w in codes], dtype=np.int64)
        field = (lanes & ((1 << fw) - 1)).reshape(lay.batch, -1)
        neg = (lanes >> fw).reshape(lay.batch, -1)
        assert not field[:, M:].any() and not neg[:, M:].any(), "padding lanes of the codes are not 0"
        return field[:, :M], neg[:, :M].astype(bool), (int(b.bias), int(b.unit_exp)), scratch, cycles

    def check(self, q, s_eff, scale, field, neg, bias, scratch) -> None:
        lay = LAYER
        ref = po2_quantise(q, s_eff, scale, lay.params, times_batch=not lay.top)
        bad = np.argwhere(field != ref.field)
        assert not len(bad), (
            f"fields: {len(bad)} of {field.size} differ; first at {bad[:4].tolist()}: rtl "
            f"{[int(field[tuple(i)]) for i in bad[:4]]}, ref {[int(ref.field[tuple(i)]) for i in bad[:4]]}"
        )
        assert (neg == ref.neg).all(), "sign bits differ"
        assert bias == (ref.bias, ref.unit_exp), f"bias / unit_exp: rtl {bias}, ref {(ref.bias, ref.unit_exp)}"
        ew = UNIT.e_width
        lanes = np.array([unpack_lanes_word(w, ew + 2, lay.lanes, signed=False) for w in scratch], dtype=np.int64)
        e0 = np.array([[to_signed(int(v), ew) for v in row] for row in lanes & ((1 << ew) - 1)])
        e0 = e0.reshape(lay.batch, -1)[:, : lay.channels]
        nz = (lanes >> (ew + 1)).reshape(lay.batch, -1)
        assert not nz[:, lay.channels :].any(), "padding lanes marked nonzero in the scratch"
        nz = nz[:, : lay.channels].astype(bool)
        assert (nz == (q != 0)).all(), "scratch nonzero flags differ"
        want = expected_e0(lay, q, s_eff)
        assert (e0[nz] == want[nz]).all(), f"scratch exponents differ at {np.argwhere(nz & (e0 != want))[:4].tolist()}"


@cocotb.test()
async def test_full_rate(dut):
    """Random layers of every kind with no stalls: codes, bias, scratch, and the exact cycle count."""
    tb = TB(dut)
    await tb.reset()
    model = UNIT.cycles()
    for i in range(BATCHES):
        q, s_eff, scale = po2_batch(tb.np_rng, LAYER, i % 4)
        field, neg, bias, scratch, cycles = await tb.run(q, s_eff, scale, loopback=False)
        tb.check(q, s_eff, scale, field, neg, bias, scratch)
        assert cycles == model["total"], f"layer took {cycles} cycles, model {model}"
    Path("cycles-po2.json").write_text(json.dumps({"measured": cycles, "model": model}))


@cocotb.test()
async def test_worst_cases(dut):
    """Largest operands against S' = 1 and S' max, +-1 against S' max (clamped up to e_min), zero channels,
    and an all-zero layer."""
    tb = TB(dut)
    await tb.reset()
    for kind in (4, 2) if BATCHES > 1 else (4,):
        q, s_eff, scale = po2_batch(tb.np_rng, LAYER, kind)
        field, neg, bias, scratch, cycles = await tb.run(q, s_eff, scale, loopback=False)
        tb.check(q, s_eff, scale, field, neg, bias, scratch)
        assert cycles == UNIT.cycles()["total"]


@cocotb.test()
@cocotb.parametrize(stress=[(0.5, 0.0), (0.0, 0.6), (0.3, 0.4)])
async def test_under_stress(dut, stress):
    """Idle cycles on every source, backpressure on every sink; pass 2 reads back the unit's own scratch."""
    p_idle, p_stall = stress
    tb = TB(dut, p_idle=p_idle, p_stall=p_stall)
    await tb.reset()
    for i in range(max(BATCHES // 2, 1)):
        q, s_eff, scale = po2_batch(tb.np_rng, LAYER, (i + 1) % 5)
        field, neg, bias, scratch, cycles = await tb.run(q, s_eff, scale, loopback=True)
        tb.check(q, s_eff, scale, field, neg, bias, scratch)
        assert cycles >= UNIT.cycles()["total"]
