"""cocotb testbench for rtl_gen.weight_memory.WeightMemory against sim.hw.optim (and HwModel.reset for INIT).

The top (``tests/rtl_gen/test_weight_memory.py``) is the weight memory with an
:class:`~rtl_gen.xnor_engine.XnorEngineCore` on its forward read port, so its ports are the memory's
(``cmd``, ``grad``, ``rng``, ``host``, ``host_rdata``, ``busy``, ``flips``) plus the engine's ``x`` and ``y``.

Parameters (``$XNT_TB_PARAMS``, JSON): ``preset``, ``overrides`` (the configuration), ``layer``,
``lanes_in``, ``lanes_out``, ``update_lanes`` (the build), ``sweeps`` (per test, default 6). Cycle counts
measured without stalls go to ``cycles-update.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import cocotb
import numpy as np
from cocotb.triggers import FallingEdge, ReadOnly

from rtl_gen.weight_memory import INIT, SPACE_TABLE, SPACE_WEIGHTS, UNDO, UPDATE, WeightMemoryGeometry
from sim.config import apply_overrides, load_config
from sim.hw import optim as O
from sim.hw.arith import xnor_popcount
from sim.hw.model import HwModel
from sim.hw.rng import RngBank
from tb.common import Bench, StreamSink, StreamSource, tb_params

PARAMS = tb_params()
if PARAMS:
    CFG = apply_overrides(load_config(PARAMS.get("preset", "mlp")), PARAMS.get("overrides", {}))
    H = CFG.hw
    LAYER = int(PARAMS["layer"])
    GEO = WeightMemoryGeometry.from_config(
        CFG, LAYER, lanes_in=PARAMS["lanes_in"], lanes_out=PARAMS["lanes_out"], update_lanes=PARAMS["update_lanes"]
    )
    BANK, SW, OPT = GEO.bank, GEO.sweep, GEO.optimizer
    N, M = BANK.n_in, BANK.n_out
SWEEPS = int(PARAMS.get("sweeps", 6))


def pack_struct(layout, values: dict) -> int:
    """A payload word from field values, by the Amaranth layout's own offsets."""
    word = 0
    for name, field in layout:
        word |= (int(values.get(name, 0)) & ((1 << field.width) - 1)) << field.offset
    return word


# --- the golden update (one call of sim.hw.optim per sweep, as HwModel._update_weights makes it) ----------


def ref_update(w, state, g, u, shift, table, gate=1 << O.PROB_BITS):
    """``(w', state')`` of one UPDATE sweep; ``w`` +-1 int8, ``state`` {field: array}; ``gate``: switch only."""
    kind = OPT.kind
    if kind == "switch":
        nw, acc, _ = O.switch_update(w, state["acc"].astype(np.int16), g, u, table, H.switch_cutoff, H.switch_reset,
                                     gate)
        new = {"acc": acc.astype(np.int64)}
        if "undo" in state:
            new["undo"] = (w > 0).astype(np.int64)
        return nw, new
    if kind == "bop":
        tau = int(round(H.bop_threshold * (1 << H.bop_frac_bits)))
        nw, m, _ = O.bop_update(w, state["m"].astype(np.int32), g, u, shift, H.bop_frac_bits, tau)
        return nw, {"m": m.astype(np.int64)}
    if kind == "iir":
        nw, m, G, _ = O.iir_update(
            w,
            state["m"].astype(np.int32),
            state["g"].astype(np.int32),
            g,
            u,
            H.iir_gamma_shift,
            shift,
            H.iir_m_frac_bits,
            H.iir_g_frac_bits,
        )
        return nw, {"m": m.astype(np.int64), "g": G.astype(np.int64)}
    m_in = state.get("m", np.zeros((N, M), np.int64)).astype(np.int32)
    nw, c, m = O.sgd_update(
        state["latent"].astype(np.int32),
        m_in,
        g,
        u,
        shift,
        H.sgd_latent_bits - 1,
        H.sgd_momentum_shift,
        H.sgd_momentum_frac_bits,
    )
    new = {"latent": c.astype(np.int64)}
    if "m" in state:
        new["m"] = m.astype(np.int64)
    return nw, new


def random_state(rng: np.random.Generator):
    """Random weights (+-1) and optimiser state over each field's range, extremes included."""
    kind = OPT.kind

    def span(lo, hi):
        v = rng.integers(lo, hi + 1, (N, M))
        edge = rng.random((N, M)) < 0.1
        return np.where(edge, rng.choice([lo, hi], (N, M)), v).astype(np.int64)

    w = rng.choice(np.array([-1, 1], dtype=np.int8), (N, M))
    if kind == "switch":
        C = H.switch_cutoff
        state = {"acc": span(-C, C)}
        if OPT.undo:
            state["undo"] = rng.integers(0, 2, (N, M))
    elif kind == "bop":
        F = H.bop_frac_bits
        state = {"m": span(-(1 << F), 1 << F)}
    elif kind == "iir":
        state = {
            "m": span(-(1 << H.iir_m_frac_bits), 1 << H.iir_m_frac_bits),
            "g": span(-(1 << H.iir_g_frac_bits), 1 << H.iir_g_frac_bits),
        }
    else:
        fc = H.sgd_latent_bits - 1
        state = {"latent": span(-(1 << fc), (1 << fc) - 1)}
        w = np.where(state["latent"] >= 0, 1, -1).astype(np.int8)
        if H.sgd_momentum_shift > 0:
            fm = H.sgd_momentum_frac_bits
            state["m"] = span(-(1 << fm), 1 << fm)
    return w, state


def random_shift(rng: np.random.Generator) -> int:
    """A per-sweep ``shift`` over the cases each rule distinguishes."""
    kind = OPT.kind
    if kind == "bop":
        return int(rng.integers(1, 17))
    if kind == "iir":
        return int(rng.choice([1, 2, 5, 10, 15, 16, 17, 18, 20, 24]))
    if kind == "sgd":
        d = H.sgd_latent_bits - 1 - H.sgd_momentum_frac_bits
        return int(np.clip(rng.choice([0, d - 1, d, d + 1, d + 3, d + 9, d + 31, d + 32, d + 33, 63]), 0, 63))
    return 0


def gates(rng: np.random.Generator, n: int) -> list[int]:
    """``n`` switch accumulation gates (``switch_gate(lr / lr0)``, 1 .. 65536) in a random order, cycling through
    always (65536), the schedule's halvings, an arbitrary ratio, the smallest and the largest below always."""
    pool = [1 << 16, 1 << 15, int(rng.integers(2, 1 << 16)), 1 << 13, 1, 65535, 1 << 10]
    out: list[int] = []
    while len(out) < n:
        out += [int(v) for v in rng.permutation(pool)]
    return out[:n]


def random_grads(rng: np.random.Generator) -> np.ndarray:
    """Ternary gradients with a per-column bias, so accumulators saturate and weights flip."""
    bias = rng.uniform(-0.8, 0.8, M)
    p_zero = rng.uniform(0.0, 0.6, M)
    r = rng.random((N, M))
    g = np.where(r < p_zero, 0, np.where(rng.random((N, M)) < (1 + bias) / 2, 1, -1))
    return g.astype(np.int8)


class TB(Bench):
    def __init__(self, dut, *, p_idle_grad=0.0, p_idle_rng=0.0, p_stall_y=0.0):
        super().__init__(dut)
        assert len(dut.host__payload) == len_of(GEO.host_layout), "the build does not match $XNT_TB_PARAMS"
        self.cmd = StreamSource(self, "cmd")
        self.grad = StreamSource(self, "grad", p_idle=p_idle_grad)
        self.rng_in = StreamSource(self, "rng", p_idle=p_idle_rng)
        self.host = StreamSource(self, "host", p_idle=0.2)
        self.rdata = StreamSink(self, "host_rdata", p_stall=0.2)
        self.x = StreamSource(self, "x")
        self.y = StreamSink(self, "y", p_stall=p_stall_y)
        self.np_rng = np.random.default_rng(self.rng.getrandbits(64))

    # --- host port ---
    async def host_write(self, items) -> None:
        layout = GEO.host_layout
        await self.host.send([pack_struct(layout, {"write": 1, **it}) for it in items])

    async def host_read(self, items) -> list[int]:
        layout = GEO.host_layout
        out = []
        for it in items:
            await self.host.send([pack_struct(layout, {"write": 0, **it})])
            out += await self.rdata.receive(1, max_cycles=50)
        return out

    async def write_weights(self, w) -> None:
        await self.host_write(
            [
                {"space": SPACE_WEIGHTS, "lane": lane, "addr": addr, "data": word}
                for lane, addr, word in BANK.weight_beats(w)
            ]
        )

    async def read_weights(self) -> np.ndarray:
        items = [
            {"space": SPACE_WEIGHTS, "lane": lane, "addr": addr}
            for lane in range(BANK.lanes_out)
            for addr in range(BANK.depth)
        ]
        words = await self.host_read(items)
        bits = np.zeros((BANK.words * BANK.lanes_in, BANK.groups * BANK.lanes_out), np.int8)
        for it, word in zip(items, words, strict=True):
            g, k = divmod(it["addr"], BANK.words)
            for b in range(BANK.lanes_in):
                bits[k * BANK.lanes_in + b, g * BANK.lanes_out + it["lane"]] = (word >> b) & 1
        return np.where(bits[:N, :M] > 0, 1, -1).astype(np.int8)

    async def write_state(self, state) -> None:
        # each field through its own space (the other field's rows are left alone)
        for name, rows in GEO.pack_state(state).items():
            space = GEO.field_space(name)
            await self.host_write([{"space": space, "addr": v, "data": word} for v, word in enumerate(rows)])

    async def read_state(self) -> dict:
        rows = {}
        for name, _ in GEO.optimizer.fields:
            space = GEO.field_space(name)
            rows[name] = await self.host_read([{"space": space, "addr": v} for v in range(SW.visits)])
        return GEO.unpack_state(rows)

    async def write_table(self, table) -> None:
        await self.host_write([{"space": SPACE_TABLE, "addr": p, "data": int(t)} for p, t in enumerate(table)])

    # --- sweeps ---
    def grad_beats(self, g) -> list[int]:
        """One tile per bank row; padding positions carry random junk."""
        b = BANK
        padded = self.np_rng.integers(-1, 2, (b.words * b.lanes_in, b.groups * b.lanes_out))
        padded[:N, :M] = g
        beats = []
        for addr in range(b.depth):
            grp, k = divmod(addr, b.words)
            tile = padded[k * b.lanes_in : (k + 1) * b.lanes_in, grp * b.lanes_out : (grp + 1) * b.lanes_out]
            word = 0
            for lane in range(b.lanes_out):
                for bit in range(b.lanes_in):
                    word |= (int(tile[bit, lane]) & 3) << (2 * (lane * b.lanes_in + bit))
            beats.append(word | int(addr == b.depth - 1) << (2 * b.lanes_in * b.lanes_out))
        return beats

    def rng_beats(self, u) -> list[int]:
        """One beat per visit; padding rows carry random junk (the engine sends 0; it must not matter)."""
        U = SW.update_lanes
        nums = SW.gather(np.asarray(u, dtype=np.uint64), pad=0)
        nums = np.where(SW.valid_mask(), nums, self.np_rng.integers(0, 1 << 32, nums.shape, dtype=np.uint64))
        beats = []
        for v in range(SW.visits):
            word = sum(int(nums[v, j]) << (32 * j) for j in range(U))
            beats.append(word | int(v == SW.visits - 1) << (32 * U))
        return beats

    async def sweep(self, op: int, *, shift: int = 0, gate: int = 1 << O.PROB_BITS, g=None, u=None) -> tuple[int, int]:
        """Run one sweep; ``(cycles from the command to the last busy cycle, flips)``."""
        senders = []
        if op == UPDATE:
            senders.append(cocotb.start_soon(self.grad.send(self.grad_beats(g))))
        if op in (UPDATE, INIT):
            senders.append(cocotb.start_soon(self.rng_in.send(self.rng_beats(u))))
        await self.cmd.send([pack_struct(GEO.cmd_layout, {"op": op, "shift": shift, "gate": gate})])
        start = self.cmd.stamps[-1]
        last_busy = start
        budget = 30 * SW.cycles() + 200
        while True:
            await FallingEdge(self.clk)
            await ReadOnly()
            if not self.dut.busy.value:
                break
            last_busy = self.cycle
            assert self.cycle - start < budget, f"sweep stalled after {budget} cycles"
        for s in senders:
            await s
        flips = int(self.dut.flips.value)
        return last_busy - start + 1, flips

    async def forward(self, x_bits) -> np.ndarray:
        """Rows through the XnorEngineCore reading the memory's banks: ``Y``."""
        b = BANK
        words = [
            word | int(k == b.words - 1) << b.lanes_in for row in b.pack_rows(x_bits) for k, word in enumerate(row)
        ]
        sender = cocotb.start_soon(self.x.send(words))
        beats = await self.y.receive(len(x_bits) * b.groups, max_cycles=50 * len(words) * b.groups + 200)
        await sender
        y_width = b.y_width
        lanes = []
        for beat in beats:
            vals = []
            for lane in range(b.lanes_out):
                v = (beat >> (lane * y_width)) & ((1 << y_width) - 1)
                vals.append(v - (1 << y_width) if v >> (y_width - 1) else v)
            lanes.append(vals)
        return b.unpack_outputs(lanes)


def len_of(layout) -> int:
    return sum(field.width for _, field in layout)


def assert_equal(what: str, got: np.ndarray, want: np.ndarray) -> None:
    got, want = np.asarray(got), np.asarray(want)
    bad = np.argwhere(got != want)
    assert not len(bad), (
        f"{what}: {len(bad)} of {np.size(want)} differ; first (row, col) {bad[:4].tolist()}: "
        f"rtl {[int(got[tuple(i)]) for i in bad[:4]]} ref {[int(want[tuple(i)]) for i in bad[:4]]}"
    )


async def restore(tb: TB, w, state, table=None) -> None:
    await tb.write_weights(w)
    await tb.write_state(state)
    if table is not None:
        await tb.write_table(table)


def make_table(rng: np.random.Generator):
    if OPT.kind != "switch":
        return None
    return O.switch_table(H.switch_cutoff, H.switch_sigma, float(rng.uniform(0.05, 1.0)))


async def update_and_check(tb: TB, w, state, *, table, exact_cycles: bool, gate: int = 1 << O.PROB_BITS) -> tuple:
    g = random_grads(tb.np_rng)
    u = tb.np_rng.integers(0, 1 << 32, (N, M), dtype=np.uint64).astype(np.uint32)
    shift = random_shift(tb.np_rng)
    want_w, want_state = ref_update(w, state, g, u, shift, table, gate)
    cycles, flips = await tb.sweep(UPDATE, shift=shift, gate=gate, g=g, u=u)
    got_w = await tb.read_weights()
    assert_equal(f"weights after update (shift {shift}, gate {gate})", got_w, want_w)
    got_state = await tb.read_state()
    for name in want_state:
        assert_equal(f"state {name} after update (shift {shift}, gate {gate})", got_state[name], want_state[name])
    assert flips == int(np.count_nonzero(want_w != w)), f"flip counter {flips}, ref {np.count_nonzero(want_w != w)}"
    if exact_cycles:
        assert cycles == SW.cycles(), f"update sweep took {cycles} cycles, model {SW.cycles()}"
    else:
        assert cycles >= SW.cycles()
    return want_w, want_state, cycles


@cocotb.test()
async def test_update_sweeps_full_rate(dut):
    """Random weights and state restored through the host port; several UPDATE sweeps with random gradients,
    numbers and per-sweep shifts (and switch tables and accumulation gates, most of them below 65536 as at a
    decayed learning rate); weights, state and flip count read back after each and compared with
    sim.hw.optim; exact cycle count without stalls."""
    tb = TB(dut)
    await tb.reset()
    w, state = random_state(tb.np_rng)
    table = make_table(tb.np_rng)
    await restore(tb, w, state, table)
    measured = []
    sweep_gates = gates(tb.np_rng, SWEEPS) if OPT.kind == "switch" else [1 << O.PROB_BITS] * SWEEPS
    for gate in sweep_gates:
        if OPT.kind == "switch" and tb.np_rng.random() < 0.5:
            table = make_table(tb.np_rng)
            await tb.write_table(table)
        w, state, cycles = await update_and_check(tb, w, state, table=table, exact_cycles=True, gate=gate)
        measured.append(cycles)
    Path("cycles-update.json").write_text(json.dumps({"visits": SW.visits, "measured": measured, "model": SW.cycles()}))


@cocotb.test()
async def test_update_sweeps_with_stalls(dut):
    """As above with idle cycles on the gradient and number streams (the memory holds each gradient tile until
    its row's last visit and must consume exactly one per bank row)."""
    tb = TB(dut, p_idle_grad=0.6, p_idle_rng=0.3)
    await tb.reset()
    w, state = random_state(tb.np_rng)
    table = make_table(tb.np_rng)
    await restore(tb, w, state, table)
    n = max(SWEEPS // 2, 2)
    for gate in gates(tb.np_rng, n) if OPT.kind == "switch" else [1 << O.PROB_BITS] * n:
        w, state, _ = await update_and_check(tb, w, state, table=table, exact_cycles=False, gate=gate)


@cocotb.test()
async def test_checkpoint_round_trip(dut):
    """Read back / restore: a checkpoint taken before an update, restored after it, reads back equal and
    updates as if the update never happened."""
    tb = TB(dut)
    await tb.reset()
    w, state = random_state(tb.np_rng)
    table = make_table(tb.np_rng)
    await restore(tb, w, state, table)
    ck_w, ck_state = await tb.read_weights(), await tb.read_state()
    assert_equal("weights read back", ck_w, w)
    for name in state:
        assert_equal(f"state {name} read back", ck_state[name], state[name])
    await update_and_check(tb, w, state, table=table, exact_cycles=True)
    await restore(tb, ck_w, ck_state)
    assert_equal("weights after restore", await tb.read_weights(), w)
    back = await tb.read_state()
    for name in state:
        assert_equal(f"state {name} after restore", back[name], state[name])
    await update_and_check(tb, w, state, table=table, exact_cycles=True)


@cocotb.test()
async def test_init_sweep_equals_model_reset(dut):
    """INIT with the layer's first sweep of the contract's generators gives HwModel.reset()'s weights and
    optimiser state."""
    tb = TB(dut)
    await tb.reset()
    bank = RngBank([tuple(s.weight_shape) for s in CFG.weight_layers()], H.rng_seed, H.rng_block)
    u0 = bank.sweep()[LAYER]
    await restore(tb, *random_state(tb.np_rng))  # junk to overwrite
    cycles, _ = await tb.sweep(INIT, u=u0)
    assert cycles == SW.cycles()
    model = HwModel(CFG)
    assert_equal("initial weights", await tb.read_weights(), model.w[LAYER])
    got = await tb.read_state()
    names = {"acc": "acc", "m": "m", "g": "g", "latent": "latent"}
    for name in got:
        if name == "undo":
            assert_equal("undo copy after init", got[name], (model.w[LAYER] > 0).astype(np.int64))
            continue
        assert_equal(f"initial {name}", got[name], model.opt[names[name]][LAYER])


@cocotb.test()
async def test_forward_reads_and_undo(dut):
    """The XnorEngineCore on the forward read port sees the updated weights; with an undo copy, UNDO restores
    the weights of before the update and keeps the optimiser state."""
    tb = TB(dut, p_stall_y=0.3)
    await tb.reset()
    w, state = random_state(tb.np_rng)
    table = make_table(tb.np_rng)
    await restore(tb, w, state, table)
    x = tb.np_rng.integers(0, 2, (12, N))
    assert_equal("Y before the update", await tb.forward(x), xnor_popcount(2 * x - 1, w))
    w1, state1, _ = await update_and_check(tb, w, state, table=table, exact_cycles=True)
    assert_equal("Y after the update", await tb.forward(x), xnor_popcount(2 * x - 1, w1))
    if OPT.undo:
        cycles, flips = await tb.sweep(UNDO)
        assert cycles == SW.cycles()
        assert flips == int(np.count_nonzero(w1 != w))
        assert_equal("weights after undo", await tb.read_weights(), w)
        got = await tb.read_state()
        assert_equal("accumulators kept by undo", got["acc"], state1["acc"])
        assert_equal("Y after undo", await tb.forward(x), xnor_popcount(2 * x - 1, w))
