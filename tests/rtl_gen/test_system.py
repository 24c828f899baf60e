# amaranth: UnusedElaboratable=no
"""The whole accelerator (rtl_gen.top) and its own blocks (rtl_gen.buffers, the BN parameter unit of
rtl_gen.controller), the cycle model and the generate / verify flows.

Fast tests: the plan and its host layouts against the units' own packing helpers, configuration errors,
the BN parameter unit and the buffer blocks in Amaranth's simulator against sim.hw, the cycle model.
``rtl``: whole training steps of a small MLP on real MNIST batches in Verilator through the host driver,
compared with sim.hw.model.HwModel after every step; the command/error checks; checkpoint and restore.
``paper`` (make test-paper, run by CI): the paper's MLP (784-256-256-256-256-10, B=100) for three steps.
"""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest
from amaranth.sim import Simulator
from small_mlp import SMALL  # tests/small_mlp.py (other tests import it from here too)

from rtl_gen.bn_unit import BnLayer
from rtl_gen.buffers import BeatWriter, MemoryReader, RowReader, RowWriter, TileReader, WordSerializer
from rtl_gen.controller import SPACE_A, SPACE_BETA, SPACE_E, SPACE_M, SPACE_MU, SPACE_S, BnParamUnit
from rtl_gen.cycle_model import WINDOW_STAGE, step_cycles
from rtl_gen.top import Accelerator, SystemPlan
from rtl_gen.weight_memory import WeightMemoryGeometry
from sim.config import CONFIG_DIR, apply_overrides, load_config
from sim.hw import arith as A
from sim.hw import optim as O
from sim.schema import ConfigError


def small_cfg(*extra):
    return apply_overrides(load_config("mlp"), SMALL + list(extra))


def paper_cfg(*extra):
    """The paper's MLP exactly as configs/mlp_mnist.toml gives it (its hardware input is binarised)."""
    return apply_overrides(load_config(CONFIG_DIR / "mlp_mnist.toml"), list(extra))


# --- plan, layouts, configuration errors ----------------------------------------------------------------


def test_plan_of_the_paper_mlp():
    plan = SystemPlan(paper_cfg())
    assert [(lp.n_in, lp.n_out) for lp in plan.layers] == [(784, 256), (256, 256), (256, 256), (256, 256), (256, 10)]
    assert [lp.lanes_in for lp in plan.layers] == [64] * 5
    assert [lp.lanes_out for lp in plan.layers] == [16] * 5  # the output layer too: 6 padding lanes
    assert plan.phases()[:5] == [("fwd", j) for j in range(5)]
    assert plan.phases()[5:8] == [("bwd", 4), ("dx", 4), ("upd", 4)] and plan.phases()[-2:] == [("bwd", 0), ("upd", 0)]
    desc = plan.description()
    keys = {q.key for q in desc.quantities if q.access == "rw"}
    assert {"w0", "acc0", "beta4", "m_beta2", "a_beta1", "e_beta0", "mu_r3", "s_r4", "rng0"} <= keys


def test_weight_and_state_layouts_match_the_weight_memory():
    """The host layouts of ``w`` and the optimiser state describe exactly the weight memory's own packing."""
    cfg = small_cfg()
    plan = SystemPlan(cfg)
    rng = np.random.default_rng(0)
    for lp in plan.layers:
        geo = WeightMemoryGeometry.from_config(cfg, lp.index, lanes_in=lp.lanes_in, lanes_out=lp.lanes_out,
                                               update_lanes=lp.update_lanes)
        w = np.where(rng.random((lp.n_in, lp.n_out)) < 0.5, -1, 1)
        banks = lp.geometry.pack_weights(w)
        q = plan.quantity("w", lp.index).layout
        beats = q.encode(w)
        words = [int(b) for b in beats] if q.beats_per_word == 1 else None
        want = [banks[lane][addr] for addr in range(lp.geometry.depth) for lane in range(lp.lanes_out)]
        assert words == want
        assert (q.decode(beats) == w).all()
        C = cfg.hw.switch_cutoff  # the accumulators' whole range, both ends included
        acc = rng.integers(-C, C + 1, (lp.n_in, lp.n_out))
        acc.flat[:2] = (-C, C)
        _check_state_layout(plan, geo, lp.index, {"acc": acc})


def _check_state_layout(plan, geo, j, state):
    """Each state field's host words are the weight memory's rows of that field's space."""
    rows = geo.pack_state(state)
    assert set(rows) == set(state)
    for name, arr in state.items():
        hq = plan.quantity(name, j)
        assert hq.space == geo.field_space(name)
        got = hq.layout.encode(arr)
        per = hq.layout.beats_per_word
        ints = [sum(int(got[i * per + b]) << (32 * b) for b in range(per)) for i in range(len(rows[name]))]
        assert ints == rows[name], name
        assert (hq.layout.decode(got) == arr).all()


@pytest.mark.parametrize("over", [["hw.optimizer=iir"], ["hw.optimizer=sgd"], ["hw.optimizer=sgd",
                                                                                  "hw.sgd_momentum_shift=0"]])
def test_two_field_optimiser_state_layouts(over):
    """iir (m, g) and sgd (latent, momentum): one host quantity per field, each in its own weight memory space."""
    cfg = small_cfg(*over)
    plan = SystemPlan(cfg)
    rng = np.random.default_rng(1)
    for lp in plan.layers:
        geo = WeightMemoryGeometry.from_config(cfg, lp.index, lanes_in=lp.lanes_in, lanes_out=lp.lanes_out,
                                               update_lanes=lp.update_lanes)
        state = {}
        for name, bits in geo.optimizer.fields:
            state[name] = rng.integers(-(1 << (bits - 1)), 1 << (bits - 1), (lp.n_in, lp.n_out))
        _check_state_layout(plan, geo, lp.index, state)
    keys = {q.key for q in plan.description().quantities if q.access == "rw"}
    want = {"iir": {"m0", "g1"}, "sgd": {"latent0", "latent1"}}[cfg.hw.optimizer]
    assert want <= keys
    assert ("m0" in keys) == (cfg.hw.optimizer == "iir" or cfg.hw.sgd_momentum_shift > 0)


@pytest.mark.parametrize("over, message", [
    (["hw.input=int8"], "hw.input = 'int8'"),
    (["hw.input=auto"], "hw.input = 'auto' \\(int8 for model.input_format = 'float'\\)"),
    (["hw.lanes_in=48"], "hw.lanes_in = 48"),
    (["hw.update_lanes=3"], "update_lanes"),
])
def test_unsupported_configurations_are_rejected(over, message):
    with pytest.raises(ConfigError, match=message):
        SystemPlan(apply_overrides(load_config("mlp"), over))


NARROW_B2 = ["train.batch_size=2", 'model.layers=[{type="dense",units=8},{type="dense",units=40},'
             '{type="dense",units=8},{type="dense",units=10}]']


@pytest.mark.parametrize("base", [NARROW_B2, ["train.batch_size=2"], []])
def test_step_fields_are_bounded_by_the_units_widths(base):
    """hw.mul_steps and hw.div_steps above what the units' sequential multiplier and dividers work through are
    refused by the plan naming the field and the limit (a random draw once reached elaboration with mul_steps 8
    against a 6-bit S'); at the limit every unit that takes them is built."""
    from rtl_gen.bn_unit import BnForwardUnit
    from rtl_gen.loss_unit import OutputGeometry
    from rtl_gen.po2_unit import Po2Unit

    cfg = apply_overrides(load_config("mlp"), base)
    plan = SystemPlan(cfg)
    envs = [plan.bn_envelope(grp) for grp in plan.unit_groups["bn"]]
    mul_max = min(env.s_width for env in envs)
    out = OutputGeometry.from_config(cfg, lanes=plan.loss_lanes)
    div_max = min([out.recip_bits, out.prob_recip_bits] + [env.widths["alpha_q"] for env in envs])
    for field, limit in (("mul_steps", mul_max), ("div_steps", div_max)):
        with pytest.raises(ConfigError, match=re.escape(f"hw.{field} = {limit + 1}: ") + f".* <= {limit}$"):
            SystemPlan(apply_overrides(load_config("mlp"), [*base, f"hw.{field}={limit + 1}"]))
    at = apply_overrides(load_config("mlp"), [*base, f"hw.mul_steps={mul_max}", f"hw.div_steps={div_max}"])
    plan = SystemPlan(at)
    for env in envs:
        Po2Unit(layer=env, mul_steps=mul_max)
        BnForwardUnit(layer=env, div_steps=div_max)
    OutputGeometry.from_config(at, lanes=plan.loss_lanes, div_steps=div_max)


def test_infer_plan_registers_and_cycle_model():
    """``infer``: its phases follow the step's, the classes come back as a read-only quantity of one label per
    sample, the command has its cmd and done bits; its cycles do not depend on the samples uploaded."""
    from rtl_gen.cycle_model import infer_cycles

    plan = SystemPlan(small_cfg())
    assert plan.infer_phases() == [("ifwd", 0), ("ifwd", 1)]
    q = plan.quantity("classes", None).layout
    assert (q.shape, q.access, q.elem_bits, q.words) == ((4,), "ro", plan.label_bits, 4)
    assert plan.quantity("phase_cycles", None).layout.shape == (len(plan.phases()) + 2,)
    m = plan.regmap
    assert m["cmd"].field("infer") and m["done"].field("infer")
    assert infer_cycles(plan, 1) == infer_cycles(plan, 4) == infer_cycles(plan) < step_cycles(plan).step
    rep = step_cycles(SystemPlan(paper_cfg()))
    # the paper MLP's infer by the cycle model (git log of this line for how each unit's stages moved it)
    assert rep.infer == 64_541 and rep.to_dict()["infer_per_image"] == 645.4
    assert "cycles per infer: 64,541 (645 per image" in rep.format_text()
    for n in (0, 5):
        with pytest.raises(ValueError, match=f"infer of {n} samples: the accelerator takes 1 .. 4"):
            infer_cycles(plan, n)


def test_cycle_model_of_the_paper_mlp_meets_the_target():
    """The preset's budget while timing closes: 2,850 cycles per training image (``make test-paper`` holds the RTL
    to it too)."""
    rep = step_cycles(SystemPlan(paper_cfg()))
    assert rep.per_image <= 2_850
    assert set(rep.phases) == {f"{k}{j}" for k, j in SystemPlan(paper_cfg()).phases()}
    assert rep.step == sum(rep.phases.values()) + 2


# --- blocks in Amaranth's simulator -------------------------------------------------------------------------


def _run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


def test_beat_writer_words_and_framing():
    dut = BeatWriter(width=40, depth=8)
    got = []

    async def send(ctx, beats, lasts, *, count, final):
        ctx.set(dut.count, count)
        ctx.set(dut.beats, 2)
        ctx.set(dut.final, final)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        i = 0
        while i < len(beats):
            ctx.set(dut.i.valid, 1)
            ctx.set(dut.i.payload, {"data": beats[i], "last": lasts[i]})
            if ctx.get(dut.w_en):
                got.append((ctx.get(dut.w_addr), ctx.get(dut.w_data)))
            if ctx.get(dut.i.ready):
                i += 1
            await ctx.tick()
        ctx.set(dut.i.valid, 0)
        for _ in range(3):
            if ctx.get(dut.done):
                err = ctx.get(dut.error)
                await ctx.tick()  # back to idle before the next start
                return err
            await ctx.tick()
        raise AssertionError("no done")

    async def bench(ctx):
        err = await send(ctx, [1, 2, 3, 4], [0, 0, 0, 1], count=2, final=1)
        assert not err and got == [(0, 1 | 2 << 32), (1, 3 | (4 & 0xFF) << 32)]
        got.clear()
        assert await send(ctx, [1, 2], [0, 1], count=2, final=1)  # early TLAST ends the transfer
        assert await send(ctx, [1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 0, 1], count=2, final=1)  # late TLAST: drained
        assert await send(ctx, [1, 2, 3, 4], [0, 0, 0, 1], count=2, final=0)  # TLAST in a non-final part

    _run(dut, bench)


def test_row_writer_reader_and_tiles_follow_the_banked_layout():
    banks, words, rows = 3, 2, 7
    depth = -(-rows // banks) * words
    mem = np.zeros((banks, depth), np.int64)
    wr = RowWriter(width=8, banks=banks, words=words, rows=rows)
    data = [r * 10 + k for r in range(rows) for k in range(words)]

    async def write(ctx):
        ctx.set(wr.start, 1)
        await ctx.tick()
        ctx.set(wr.start, 0)
        for v in data:
            ctx.set(wr.valid, 1)
            ctx.set(wr.data, v)
            en = ctx.get(wr.w_en)
            mem[en.bit_length() - 1, ctx.get(wr.w_addr)] = v
            await ctx.tick()
        ctx.set(wr.valid, 0)

    _run(wr, write)
    for r in range(rows):
        for k in range(words):
            assert mem[r % banks, (r // banks) * words + k] == r * 10 + k

    # unregistered, and registered (dX's codes: a prefetch queue; the port need not hold its word, modelled
    # here by a port that reads every cycle)
    for registered in (False, True):
        _check_row_reader(mem, data, banks, words, rows, registered)

    groups, tiles = 2, depth // words
    for passes in (1, 3):  # the dW unit's passes: each tile's beats again per pass
        _check_tile_reader(banks, words, groups, tiles, passes)
        # registered (a skid buffer after the read ports), under backpressure
        _check_tile_reader(banks, words, groups, tiles, passes, registered=True, p_ready=0.6)


def _check_row_reader(mem, data, banks, words, rows, registered):
    rd = RowReader(width=8, banks=banks, words=words, rows=rows, registered=registered)
    out = []
    coin = random.Random(1)

    async def read(ctx):
        ctx.set(rd.start, 1)
        await ctx.tick()
        ctx.set(rd.start, 0)
        pending = None
        for _ in range(200):
            if pending is not None:
                ctx.set(rd.r_data, [int(mem[b, pending]) for b in range(banks)])
            elif registered:  # the port reads every cycle: junk in the cycle after no read
                ctx.set(rd.r_data, [0xAA] * banks)
            take = coin.random() < 0.7
            ctx.set(rd.o.ready, take)
            if take and ctx.get(rd.o.valid):
                p = ctx.get(rd.o.payload)
                out.append((p.data, p.row_last, p.last))
            if registered:
                pending = ctx.get(rd.r_addr) if ctx.get(rd.r_en) else None
            else:
                pending = ctx.get(rd.r_addr) if ctx.get(rd.r_en) else pending
            await ctx.tick()
        assert not ctx.get(rd.busy)

    _run(rd, read)
    assert [d for d, _, _ in out] == data
    assert [rl for _, rl, _ in out] == [int(k == words - 1) for r in range(rows) for k in range(words)]
    assert [la for _, _, la in out] == [0] * (len(data) - 1) + [1]


def _check_tile_reader(banks, words, groups, tiles, passes, registered=False, p_ready=1.0):
    tr = TileReader(a_width=8, c_width=4, banks=banks, words=words, groups=groups, tiles=tiles, passes=passes,
                    registered=registered)
    beats = []
    rnd = random.Random(passes)

    async def tiles_bench(ctx):
        ctx.set(tr.start, 1)
        await ctx.tick()
        ctx.set(tr.start, 0)
        pa = pc = None
        for _ in range(int(40 * passes / p_ready)):
            if pa is not None:
                ctx.set(tr.a_data, [pa * 16 + b for b in range(banks)])
                ctx.set(tr.c_data, [(pc + b) % 16 for b in range(banks)])
            ready = rnd.random() < p_ready
            ctx.set(tr.o.ready, ready)
            if ready and ctx.get(tr.o.valid):
                p = ctx.get(tr.o.payload)
                beats.append((list(p.a), list(p.c), p.last, ctx.get(tr.g_last)))
            if ctx.get(tr.r_en):
                pa, pc = ctx.get(tr.a_addr), ctx.get(tr.c_addr)
            await ctx.tick()

    _run(tr, tiles_bench)
    want = [(g, k, t) for g in range(groups) for k in range(words) for _ in range(passes) for t in range(tiles)]
    assert len(beats) == len(want) == tr.beats
    for i, ((a, c, last, g_last), (g, k, t)) in enumerate(zip(beats, want, strict=True)):
        assert a[0] == (t * words + k) * 16 and c[0] == (t * groups + g) % 16 and last == int(t == tiles - 1)
        assert g_last == int(i == len(want) - 1 or want[i + 1][0] != g)


async def _start_reader(ctx, rd, *, count, wrap, base=0):
    """A MemoryReader's start pulse with its run's count, wrap and base."""
    for sig, v in ((rd.count, count), (rd.wrap, wrap), (rd.base, base), (rd.start, 1)):
        ctx.set(sig, v)
    await ctx.tick()
    ctx.set(rd.start, 0)


def test_memory_reader_wrap_and_serializer():
    rd = MemoryReader(width=40, depth=5, repeat=2)
    ser = WordSerializer(width=40)
    from amaranth import Module
    from amaranth.lib import wiring

    top = Module()
    top.submodules.rd = rd
    top.submodules.ser = ser
    wiring.connect(top, rd.o, ser.i)
    mem = [(i + 1) * 0x1_0000_0001 for i in range(5)]
    out = []

    async def bench(ctx):
        ctx.set(ser.beats, 2)
        await _start_reader(ctx, rd, count=8, wrap=5)
        addr = None
        for _ in range(60):
            if addr is not None:
                ctx.set(rd.r_data, mem[addr])
            ctx.set(ser.o.ready, 1)
            if ctx.get(ser.o.valid):
                out.append((ctx.get(ser.o.payload.data), ctx.get(ser.o.payload.last)))
            if ctx.get(rd.r_en):
                addr = ctx.get(rd.r_addr)
            await ctx.tick()

    _run(top, bench)
    words = [mem[i % 5] for i in range(8)]
    want = [(w >> (32 * b) & 0xFFFFFFFF, int(i == 7 and b == 1)) for i, w in enumerate(words) for b in range(2)]
    assert out == want


@pytest.mark.parametrize("registered", [False, True], ids=["direct", "registered"])
def test_memory_reader_under_backpressure(registered):
    """Every word in order, ``last`` on the final one and ``busy`` until it is taken, with the consumer's ``ready``
    random; registered: no word on ``o`` earlier than two cycles after its read (the skid buffer's stage)."""
    rd = MemoryReader(width=16, depth=7, repeat=2, registered=registered)
    mem = [int(v) for v in np.random.default_rng(5).integers(0, 1 << 16, 7)]
    rng = np.random.default_rng(6)
    out, seen = [], []

    async def bench(ctx):
        await _start_reader(ctx, rd, count=11, wrap=7, base=2)
        data, first_read, cyc = 0, None, 0
        while ctx.get(rd.busy) and cyc < 200:
            ready = int(rng.random() < 0.6)
            ctx.set(rd.o.ready, ready)
            if ctx.get(rd.o.valid):
                seen.append(cyc)
                if ready:
                    out.append((ctx.get(rd.o.payload.data), ctx.get(rd.o.payload.last)))
            issue = ctx.get(rd.r_en)
            addr = ctx.get(rd.r_addr)
            if first_read is None and issue:
                first_read = cyc
            await ctx.tick()
            if issue:  # a synchronous read port: the word of the address read in the last cycle
                data = mem[addr]
            ctx.set(rd.r_data, data)
            cyc += 1
        assert cyc < 200
        assert seen[0] - first_read == (2 if registered else 1)

    _run(rd, bench)
    want = [(mem[(2 + i) % 7], int(i == 10)) for i in range(11)]
    assert out == want


@pytest.mark.parametrize("shared", [False, True], ids=["one_layer", "two_layers"])
def test_bn_param_unit_against_the_model(shared):
    """Running statistics and the beta optimiser (block floating point, the m/a ratio, saturation) over
    several steps, read back through the host port, equal sim.hw.arith.running_update and
    sim.hw.optim.beta_update: for one layer, and for the unit shared by both layers of the small MLP (12
    and 10 channels, different bounds; the layers' work interleaves as in a training step)."""
    from pysim_host import bn_param_host, start_beta_update, to_signed  # same folder

    cfg = small_cfg()
    h = cfg.hw
    lays = [BnLayer.from_config(cfg, j, lanes=8) for j in ((0, 1) if shared else (0,))]
    dut = (BnParamUnit(layers=lays, hw=h, div_steps=2) if shared else BnParamUnit(layer=lays[0], hw=h, div_steps=2))
    assert dut.channels == [lay.channels for lay in lays]
    p, B = lays[0].params, lays[0].batch
    rng = np.random.default_rng(1)

    def host(ctx, space, addr, data=None):
        return bn_param_host(ctx, dut, space, addr, data)

    sx = to_signed

    async def read_all(ctx, space, w, M, signed=True):
        return np.array([sx(await host(ctx, space, c), w) if signed else await host(ctx, space, c) for c in range(M)])

    async def select(ctx, i):  # the unit takes a new layer a cycle after it is set (its base address registered)
        if shared:
            ctx.set(dut.layer, i)
            await ctx.tick()

    async def bench(ctx):
        st = []
        for i, lay in enumerate(lays):
            M = lay.channels
            beta = rng.integers(-20000, 20000, M)
            st.append({"mu": np.zeros(M, np.int64), "s": np.full(M, 1 << p.running_frac, np.int64), "beta": beta,
                       "m": np.zeros(M, np.int64), "a": np.zeros(M, np.int64), "E": 0})
            await select(ctx, i)
            for c in range(M):
                await host(ctx, SPACE_BETA, c, beta[c])
        for step in range(4):
            for i, lay in enumerate(lays):  # forward: running statistics, layer by layer
                M, z = lay.channels, st[i]
                await select(ctx, i)
                y = rng.integers(-lay.y_bound, lay.y_bound + 1, (B, M))
                y[:, 0] = 5 if step == 0 else y[:, 0]  # S = 0
                fwd = A.bn_forward(y, z["beta"], p, lay.y_bound)
                z["mu"], z["s"] = A.running_update(z["mu"], z["s"], fwd, p)
                for c in range(M):
                    ctx.set(dut.stats.payload, {"sum_y": int(fwd.sum_y[c]), "S": int(fwd.S[c])})
                    ctx.set(dut.stats.valid, 1)
                    while not ctx.get(dut.stats.ready):
                        await ctx.tick()
                    await ctx.tick()
                ctx.set(dut.stats.valid, 0)
                while ctx.get(dut.busy):
                    await ctx.tick()
            for i, lay in enumerate(lays):
                await select(ctx, i)
                assert (await read_all(ctx, SPACE_MU, dut.run_width, lay.channels) == st[i]["mu"]).all()
                assert (await read_all(ctx, SPACE_S, dut.run_width, lay.channels) == st[i]["s"]).all()
            for i in reversed(range(len(lays))):  # backward + update, top layer first
                M, z = lays[i].channels, st[i]
                await select(ctx, i)
                p1 = rng.integers(-(1 << 20), 1 << 20, M) >> rng.integers(0, 18)
                p1 = np.zeros(M, np.int64) if step == 2 else p1
                scale, lr_sh = int(rng.integers(-40, 5)), int(rng.integers(5, 14))
                z["beta"], z["m"], z["a"], z["E"] = O.beta_update(z["beta"], z["m"], z["a"], z["E"], p1, scale, lr_sh,
                                                                  p, h.beta_momentum_shift, h.beta_scale_shift,
                                                                  h.beta_state_bits)
                await start_beta_update(ctx, dut, p1[:M], scale, lr_sh)
                await ctx.tick()
                while ctx.get(dut.busy):
                    await ctx.tick()
            for i, lay in enumerate(lays):
                M, z = lay.channels, st[i]
                await select(ctx, i)
                assert sx(await host(ctx, SPACE_E, 0), 16) == z["E"]
                assert (await read_all(ctx, SPACE_M, dut.m_width, M) == z["m"]).all()
                assert (await read_all(ctx, SPACE_A, dut.a_width, M, False) == z["a"]).all()
                assert (await read_all(ctx, SPACE_BETA, dut.beta_width, M) == z["beta"]).all()

    _run(dut, bench)


# --- whole accelerator in Verilator -----------------------------------------------------------------------


def _assert_steps(report, steps):
    assert len(report["steps"]) == steps
    for st in report["steps"]:
        assert st["mismatch"] is None, st


@pytest.mark.rtl
def test_small_mlp_whole_steps_match_the_model():
    """Two whole training steps of 784-12-10 (binarised MNIST, B = 4) through the driver: after every step
    weights, accumulators, generators, BN parameters, running statistics, logits, loss and correct count
    read back equal sim.hw.model.HwModel; the measured cycles agree with the cycle model within 5 %."""
    from host.verify import run_system

    cfg = small_cfg()
    rep = run_system(cfg, mode="train", steps=2)
    _assert_steps(rep, 2)
    model = step_cycles(SystemPlan(cfg)).step
    for st in rep["steps"]:
        assert abs(st["cycles"] - model) <= 0.05 * model, (st["cycles"], model)



@pytest.mark.rtl
def test_dx_split_takes_beats_back_to_back():
    """hw.dx_passes = 1: the dX unit's beats (32 values) arrive faster than the split hands out their four BN
    beats of layer 0, so the holding register is reloaded in the cycle its last sub-beat leaves (its load enable
    a register per slice, wire_backward.HOLD_SLICE). A whole step equals the model; a load enable that waits
    for the register to be empty (the back-to-back reload missed) fails here, not in the SMALL steps."""
    from host.verify import run_system

    rep = run_system(small_cfg("hw.dx_passes=1"), mode="train", steps=1)
    _assert_steps(rep, 1)

ARRAY_SMALL = ["hw.lanes_b=1", 'model.layers=[{type="dense",units=32},{type="dense",units=32},{type="dense",units=10}]']


@pytest.mark.rtl
@pytest.mark.parametrize("over", [pytest.param([], id="fabric-dw"), pytest.param(ARRAY_SMALL, id="dsp-array")])
def test_windowed_sign_gradient_whole_steps(over):
    """hw.dw_window = 2 (sgn(dW) from the codes within 2 planes of their column's largest, docs/arithmetic.md
    5.4) on the fabric dW unit (two samples a beat) and on the DSP array (four weights a slice, the passes in
    pairs): two whole steps equal the model. The fabric design takes the cycles of the full-sum design (the column
    maxima are kept as the codes are written, no extra pass) but the register behind the window in each ``upd``
    phase (cycle_model.WINDOW_STAGE, hidden where the beta update is longer), the array fewer. A model with the
    full sums (hw.dw_window = 0) must see a mismatch: the hardware computes the window."""
    from host.verify import run_system
    from rtl_gen.toolchain import CocotbFailure

    cfg = small_cfg(*over, "hw.dw_window=2")
    plan = SystemPlan(cfg)
    assert [plan.po2_array(j) for j in range(len(plan.layers))] == [bool(over)] * len(plan.layers)
    rep = run_system(cfg, mode="train", steps=2)
    _assert_steps(rep, 2)
    model = step_cycles(plan).step
    full = step_cycles(SystemPlan(small_cfg(*over, "hw.dw_window=0")))
    extra = [step_cycles(plan).phases[k] - full.phases[k] for k in full.phases]
    if over:
        assert model < full.step
    else:
        assert set(extra) <= {0, WINDOW_STAGE} and WINDOW_STAGE in extra, extra
    assert all(plan.po2_geometry(j).dw_pairs == bool(over) for j in range(len(plan.layers)))
    for st in rep["steps"]:
        assert abs(st["cycles"] - model) <= 0.05 * model, (st["cycles"], model)
    with pytest.raises(CocotbFailure):
        run_system(cfg, mode="train", steps=1, model_overrides=["hw.dw_window=0"])


SHARED_LAYERS = ('model.layers=[{type="dense",units=32},{type="dense",units=32},{type="dense",units=32},'
                 '{type="dense",units=10}]')
SHARED_LANES = "hw.lanes_out=16"  # the output layer's 10 classes in one beat of 16 lanes (6 padding lanes)


def test_layers_with_equal_lanes_share_one_po2_backward_engine():
    assert SystemPlan(paper_cfg()).backward_groups == [[0, 1, 2, 3, 4]]
    assert SystemPlan(small_cfg()).backward_groups == [[0], [1]]  # lanes_in 32 and 16
    assert SystemPlan(small_cfg(SHARED_LAYERS)).backward_groups == [[0, 1, 2, 3]]


@pytest.mark.timing
def test_a_shared_po2_backward_engine_takes_its_layer_from_a_register(tmp_path):
    """Yosys's view of a design whose four layers share one po2 backward engine: the engine's ``layer`` input
    comes straight from a flip-flop of the top level (``po2b_layer_*``, loaded from the controller's phase
    registers), not from the phases' activity copies through an OR and a multiplexer (timing: ``upd_any2`` -> the
    layer's choice -> the engine's sizes -> the code reader's pop -> the dX unit's issue, 19.16 ns, the
    paper-width design's worst path in context on the ECP5 proxy at 380b4b2). Planted: the choice under the
    phases' activity fails it."""
    from rtl_gen.toolchain import run_yowasp, to_verilog

    plan = SystemPlan(small_cfg(SHARED_LAYERS))
    assert plan.backward_groups == [[0, 1, 2, 3]]
    (tmp_path / "design.v").write_text(to_verilog(Accelerator(plan), plan.name, emit_src=False))
    run_yowasp("yosys", ["-q", "-p", f"read_verilog design.v; hierarchy -top {plan.name}; proc; opt_clean; "
                         "write_json net.json"], cwd=tmp_path)
    mod = json.loads((tmp_path / "net.json").read_text())["modules"][plan.name]
    q = {b for c in mod["cells"].values() if "dff" in c["type"] for b in c["connections"]["Q"]}
    engines = [c for name, c in mod["cells"].items() if name.startswith("po2b_")]
    assert len(engines) == 1
    layer = engines[0]["connections"]["layer"]
    assert len(layer) == 2 and all(b in q for b in layer), layer


def test_layers_with_equal_update_lanes_share_one_generator_engine():
    assert SystemPlan(paper_cfg()).rng_groups == [[0, 1, 2, 3, 4]]
    assert SystemPlan(small_cfg()).rng_groups == [[0, 1]]  # lanes_in 32 and 16, update_lanes 8
    assert SystemPlan(small_cfg("hw.update_lanes=32")).rng_groups == [[0], [1]]  # 32 and 16 per visit


def test_layers_with_equal_lanes_share_one_weight_memory():
    assert SystemPlan(paper_cfg()).wmem_groups == [[0, 1, 2, 3, 4]]
    assert SystemPlan(small_cfg()).wmem_groups == [[0], [1]]  # 32- and 16-bit bank words
    assert SystemPlan(small_cfg(SHARED_LAYERS, SHARED_LANES)).wmem_groups == [[0, 1, 2, 3]]


def test_layers_of_equal_lanes_share_the_engine_bn_and_po2_units():
    """The XNOR engine is shared by layers of equal lanes (words, groups and padding are run-time), the BN
    forward/backward and po2 units by layers of the same batch and lanes (channels are run-time, fan-in only
    bounds |y|): the paper MLP's five layers get one engine and one BN/po2 set (their phases never
    overlap)."""
    for cfg, engine, bn in ((paper_cfg(), [[0, 1, 2, 3, 4]], [[0, 1, 2, 3, 4]]),
                            (small_cfg(), [[0], [1]], [[0, 1]]),
                            (small_cfg(SHARED_LAYERS), [[0, 1, 2, 3]], [[0, 1, 2, 3]])):
        plan = SystemPlan(cfg)
        assert plan.unit_groups == {"engine": engine, "bn": bn}
    plan = SystemPlan(paper_cfg())
    env = plan.bn_unit_layer(2)
    assert env.fan_in == 784 and env.y_bound == 784  # built for layer 0's |y| <= 784
    assert env.channels == 256 and not env.top
    out = plan.bn_unit_layer(4)
    assert out.channels == 10 and out.top and out.bounds.y == 784  # the output layer's own channels and kind
    acc = Accelerator(SystemPlan(small_cfg(SHARED_LAYERS)))
    acc.elaborate(None)
    names = set(acc.unit_names)
    # one XNOR engine, BN forward/backward, po2 unit, BN parameter unit, generator engine and weight memory for
    # all four layers (32-bit words, 8 lanes out, 8 update lanes; 32, 32, 32 and 10 channels)
    assert names == {f"{u}0_1_2_3" for u in ("engine", "bn_fwd", "bn_bwd", "po2_", "bn_param", "rng", "wmem")}


@pytest.mark.rtl
def test_shared_units_whole_steps():
    """784-32-32-32-10 (B = 4, 16 lanes out, one sample per dW beat, two dW passes of 16 inputs: dX and dW on one
    array of DSP48 multiply-accumulates, dX in blocks of 8 samples, half of them padding): one po2
    backward engine serves all four layers (25, 1, 1 and 1 words; 2, 2, 2 and 1 groups, the output layer's with
    6 padding lanes), layers 1 and 2 share their XNOR engine and layers 0 .. 2 their BN and po2 units (fan-in
    784 and 32); the logit and loss units take 2 of the 10 classes per beat; two whole steps bit-exact and
    within 5 % of the cycle model."""
    from host.verify import run_system

    # dX and dW on the DSP48 array (hw.dw_dsp, hw.dx_dsp); logit and loss units in 2-class parts (the default is 1)
    cfg = small_cfg(SHARED_LAYERS, SHARED_LANES, "hw.lanes_b=1", "hw.loss_lanes=2", "hw.dw_passes=2")
    assert SystemPlan(cfg).loss_lanes == 2
    assert [lp.lanes_out for lp in SystemPlan(cfg).layers] == [16, 16, 16, 16]
    assert SystemPlan(cfg).po2_geometry(1).dsp_fields == 2
    assert all(SystemPlan(cfg).po2_array(j) for j in range(4))
    assert not SystemPlan(small_cfg()).po2_array(1)  # two samples per dW beat: fabric dX
    assert SystemPlan(cfg).backward_groups == [[0, 1, 2, 3]]
    rep = run_system(cfg, mode="train", steps=2)
    _assert_steps(rep, 2)
    model = step_cycles(SystemPlan(cfg)).step
    for st in rep["steps"]:
        assert abs(st["cycles"] - model) <= 0.05 * model, (st["cycles"], model)


@pytest.mark.rtl
@pytest.mark.parametrize("over", [pytest.param([], id="1-class-beats"),
                                  pytest.param(["hw.loss_lanes=4"], id="4-class-beats", marks=pytest.mark.rtl_slow)])
def test_small_mlp_infer_matches_forward_eval(over):
    """``infer`` on 784-12-10 (B = 4) after a training step: a full batch and one of a single sample give
    HwModel.forward_eval's logits and their argmax, bit for bit; the state read back is the model's (no running
    statistics, beta, weight or generator changed), and the next training step still equals the model's. The
    cycles are the cycle model's. With 4 classes a logit beat the argmax runs across beats and skips the last
    beat's two padding lanes."""
    from host.verify import run_system
    from rtl_gen.cycle_model import infer_cycles

    cfg = small_cfg(*over)
    rep = run_system(cfg, mode="infer", steps=4)
    assert rep["state_after_infer"] is None
    infers = [st for st in rep["steps"] if "infer" in st]
    assert [(st["infer"], st["samples"]) for st in infers] == [("full", 4), ("partial", 1)]
    for st in rep["steps"]:
        assert st["mismatch"] is None, st
    assert len(rep["steps"]) == 4
    assert [st["cycles"] for st in infers] == [infer_cycles(SystemPlan(cfg))] * 2, infers


@pytest.mark.rtl
def test_small_mlp_command_errors():
    from host.verify import run_system

    rep = run_system(small_cfg(), mode="errors")
    assert ["recovered", []] in rep["checks"]


@pytest.mark.rtl
def test_small_mlp_restore_gives_identical_results():
    from host.verify import run_system

    # with random idle beats on the input stream, backpressure on the output stream and AXI-Lite delays
    rep = run_system(small_cfg(), mode="restore", steps=4, stress=True)
    assert rep["restore_identical"] is True
    _assert_steps(rep, 4)


@pytest.mark.rtl
@pytest.mark.parametrize("over", [pytest.param(["hw.optimizer=iir"], id="iir"),
                                  pytest.param(["hw.optimizer=sgd"], id="sgd-momentum", marks=pytest.mark.rtl_slow),
                                  pytest.param(["hw.optimizer=sgd", "hw.sgd_momentum_shift=0"], id="sgd"),
                                  pytest.param(["hw.optimizer=bop"], id="bop", marks=pytest.mark.rtl_slow)])
def test_other_optimisers_whole_steps_and_restore(over):
    """The small MLP with each of the other hardware optimisers (two state fields for iir and sgd with
    momentum): two steps, a checkpoint of every quantity, two more, restore, the same two again; every step's
    read-back equals the model and the restored run is identical. The steps run down a decayed schedule
    (lr0, lr0 / 2, lr0 / 8, lr0 / 4 at progress 0 .. 0.9): each optimiser's per-step constants follow it."""
    from host.verify import run_system

    cfg = small_cfg(*over)
    lrs = [cfg.lr * f for f in (1.0, 0.5, 0.125, 0.25)]
    rep = run_system(cfg, mode="restore", steps=4, lrs=lrs, progress=[0.0, 0.3, 0.6, 0.9])
    assert rep["restore_identical"] is True
    _assert_steps(rep, 4)
    assert [st["lr"] for st in rep["steps"]] == lrs


# --- the learning-rate schedule and a trained state ----------------------------------------------------------

ALL_OPTIMISERS = {"switch": [], "bop": ["hw.optimizer=bop"], "iir": ["hw.optimizer=iir"],
                  "sgd-momentum": ["hw.optimizer=sgd"], "sgd": ["hw.optimizer=sgd", "hw.sgd_momentum_shift=0"]}


def _schedule_constants_of_the_model(cfg, lr: float, progress: float) -> dict:
    """The per-step constants the bit-exact model passes to sim.hw.optim in one training step at ``lr`` and
    ``progress`` (recorded from its calls): ``lr_shift`` (beta), ``opt_shift`` (bop's EMA shift, iir's alpha
    shift, sgd's lr shift), ``switch_gate`` and ``switch_table``."""
    from sim.hw.model import HwModel

    seen = {}

    def spy(name, pick):
        real = getattr(O, name)

        def call(*args, **kwargs):
            for key, value in pick(args).items():
                assert seen.setdefault(key, value) == value, key  # the same in every layer
            return real(*args, **kwargs)

        return call

    patches = {
        "beta_update": spy("beta_update", lambda a: {"lr_shift": a[6]}),
        "switch_update": spy("switch_update", lambda a: {"switch_table": tuple(int(v) for v in a[4]),
                                                         "switch_gate": a[7]}),
        "bop_update": spy("bop_update", lambda a: {"opt_shift": a[4]}),
        "iir_update": spy("iir_update", lambda a: {"opt_shift": a[6]}),
        "sgd_update": spy("sgd_update", lambda a: {"opt_shift": a[4]}),
    }
    mp = pytest.MonkeyPatch()
    try:
        for name, fn in patches.items():
            mp.setattr(O, name, fn)
        model = HwModel(cfg)
        rng = np.random.default_rng(0)
        B, F = cfg.train.batch_size, cfg.layer_shapes()[0].fan_in
        model.train_step(np.where(rng.random((B, F)) < 0.5, -1, 1), rng.integers(0, 10, B), lr=lr, progress=progress)
    finally:
        mp.undo()
    return seen


#: the schedule test's cases: every optimiser, and the switch memory with a narrower accumulator taking its
#: increments at a quarter of the rate (``hw.switch_rate``, which scales the gate)
SCHEDULE_CASES = {**ALL_OPTIMISERS, "switch-rate": ["hw.switch_cutoff=15", "hw.switch_rate=0.25"]}


@pytest.mark.parametrize("name", list(SCHEDULE_CASES))
def test_driver_schedule_words_equal_the_models_constants(name):
    """At the initial learning rate and at decayed ones (and along the iir alpha decay), Driver.schedule_words
    writes exactly the per-step constants the bit-exact model uses: beta's lr shift, bop's EMA shift, iir's alpha
    shift, sgd's lr shift, and for switch the accumulation gate switch_gate(lr / lr0, hw.switch_rate) with the
    configured (unscaled) switch table. (The driver once scaled lambda in the table instead of gating the
    accumulation.)"""
    from host.driver import Driver
    from host.transports.base import BlockingTransport

    cfg = small_cfg(*SCHEDULE_CASES[name], "optimizer.iir.alpha_decay=cosine")
    drv = Driver(SystemPlan(cfg).description(), BlockingTransport(), check=False)  # no hardware behind it
    lr0 = cfg.lr
    for ratio, progress in ((1.0, 0.0), (0.5, 0.25), (0.125, 0.5), (0.3, 0.9), (1e-6, 1.0), (2.0, 0.0)):
        want = _schedule_constants_of_the_model(cfg, lr0 * ratio, progress)
        got = drv.schedule_words(lr0 * ratio, progress, None)
        assert {k: got[k] for k in want} == want, (ratio, progress)
        if name.startswith("switch"):
            assert got["switch_gate"] == O.switch_gate(ratio, cfg.hw.switch_rate) and got["switch_gate"] <= 1 << 16
        regs = {k: v for k, v in got.items() if k != "switch_table"}
        sched = drv.map["sched"]
        assert sched.decode(sched.encode(**regs)) == regs  # every constant fits its field


def test_loss_registers_hold_the_loss_units_integer_loss():
    """The ``loss`` register (and ``loss_hi`` past 32 bits) is as wide as the loss unit's integer loss: 23 bits for
    the paper MLP's cross-entropy (B = 100), 38 for its squared hinge (two registers)."""
    for loss, bits in (("cross_entropy", 23), ("squared_hinge", 38)):
        plan = SystemPlan(paper_cfg(f"train.loss={loss}"))
        assert plan.loss_bits == bits
        regs = plan.regmap
        widths = [regs[name].fields[0].width for name in ("loss", "loss_hi") if name in regs]
        assert widths == ([bits] if bits <= 32 else [32, bits - 32])


# Pre-training of the trained-state runs, per optimiser: the bit-exact model on two fixed batches (consistent
# gradient signs drive the state to its limits in a few hundred steps), with overrides of the pre-training only
# (iir: a faster first EMA; the state layout is the same) and its learning rate in multiples of lr0 (sgd: 16 lr0
# drives latents into their clamps).
PRETRAIN = {"switch": ([], 1.0), "bop": ([], 1.0), "iir": (["hw.iir_gamma_shift=1"], 1.0),
            "sgd-momentum": ([], 16.0), "sgd": ([], 16.0)}
SATURATING = {"switch", "sgd-momentum", "sgd"}  # state with a clamp in the update (bop's and iir's EMAs have none)
PRETRAIN_STEPS = 200
DECAYED = (0.5, 1.0, 0.125)  # lr / lr0 of the whole steps (a decayed rate first)


def _trained_state(cfg, pre_overrides, lr_mult: float) -> dict:
    """A HwModel state dict after PRETRAIN_STEPS steps on two fixed MNIST batches (not those run_system uses)."""
    from sim.datasets import load_dataset
    from sim.hw.engine import prepare_inputs
    from sim.hw.model import HwModel

    ds = load_dataset(cfg.data.dataset, cfg.data.path or None)
    B = cfg.train.batch_size
    rng = np.random.default_rng(12345)
    batches = [rng.integers(0, len(ds.x_train), B) for _ in range(2)]
    batches = [(prepare_inputs(cfg, ds.x_train[i]), ds.y_train[i]) for i in batches]
    model = HwModel(apply_overrides(cfg, list(pre_overrides)))
    for s in range(PRETRAIN_STEPS):
        x, y = batches[s % 2]
        model.train_step(x, y, lr=cfg.lr * lr_mult)
    return model.state_dict()


@pytest.mark.rtl
@pytest.mark.parametrize("name", [pytest.param(k, marks=() if k == "switch" else pytest.mark.rtl_slow)
                                  for k in ALL_OPTIMISERS])
def test_trained_state_whole_steps_at_decayed_rates(name):
    """From a trained state (accumulators and latents at their limits, weights about to flip) restored through
    the driver, three whole steps at lr0 / 2, lr0 and lr0 / 8 (progress 0, 0.5, 0.9): weights flip, and the
    saturating state (switch accumulators at the cut-off, sgd latents at their clamps) sits at its limits after
    every step (counted from the bit-exact model), and the accelerator stays bit-exact, including its own integer
    loss. (From the power-on state, switch and bop flip no weight in the first steps.) The switch run is the
    default suite's representative (its build is the small MLP's); the others are rtl_slow (their builds are
    test_other_optimisers_whole_steps_and_restore's)."""
    from host.verify import run_system

    cfg = small_cfg(*ALL_OPTIMISERS[name])
    pre, mult = PRETRAIN[name]
    state = _trained_state(cfg, pre, mult)
    lrs = [cfg.lr * f for f in DECAYED]
    rep = run_system(cfg, mode="train", steps=len(lrs), lrs=lrs, progress=[0.0, 0.5, 0.9], state=state)
    _assert_steps(rep, len(lrs))
    print(name, [(st["flips"], st["at_limit"], st["loss_q"]) for st in rep["steps"]])
    assert sum(st["flips"] for st in rep["steps"]) > 0
    if name in SATURATING:
        assert all(st["at_limit"] > 0 for st in rep["steps"])
    assert len({st["loss_q"] for st in rep["steps"]}) > 1  # a live integer loss, compared with the model's


@pytest.mark.rtl
def test_switch_undo_whole_steps():
    """hw.switch_undo: after the update the batch runs forward again and, where its integer loss rose, the update
    of every layer is reverted (accumulators kept). Four steps bit-exact, including the ``undone`` flag; the
    steps exercise both outcomes; an undo sweep costs what the cycle model says, a skipped one a few cycles."""
    from host.verify import run_system

    # cutoff 1: every step flips about a thousand weights; with this seed and the full po2 sums the loss rises
    # after step 0's update (undone) and falls after the others
    cfg = small_cfg("hw.switch_undo=true", "hw.switch_cutoff=1", "train.seed=1", "hw.dw_window=0")
    plan = SystemPlan(cfg)
    assert plan.phases()[-4:] == [("rfwd", 0), ("rfwd", 1), ("undo", 0), ("undo", 1)]
    assert "undo0" not in {q.key for q in plan.description().quantities}  # the undo copy is not state
    rep = run_system(cfg, mode="train", steps=UNDO_STEPS)
    _assert_steps(rep, UNDO_STEPS)
    model = step_cycles(plan)
    assert [st["undone"] for st in rep["steps"]] == [True, False, False, False]
    assert _flips_without_undo(cfg) > 500  # what step 0's reverted update had changed
    for st in rep["steps"]:
        for name in ("undo0", "undo1"):
            if st["undone"]:
                assert abs(st["phases"][name] - model.phases[name]) <= 4, (name, st["phases"][name])
            else:
                assert st["phases"][name] <= 8, (name, st["phases"][name])
        assert st["cycles"] <= model.step


UNDO_STEPS = 4


def _flips_without_undo(cfg) -> int:
    """Weights step 0 changes in the bit-exact model with ``switch_undo`` off (the batch run_system draws)."""
    from sim.datasets import load_dataset
    from sim.hw.engine import prepare_inputs
    from sim.hw.model import HwModel

    ds = load_dataset(cfg.data.dataset, cfg.data.path or None)
    B = cfg.train.batch_size
    idx = np.random.default_rng(cfg.train.seed).permutation(len(ds.x_train))[:B * UNDO_STEPS]
    model = HwModel(apply_overrides(cfg, ["hw.switch_undo=false"]))
    return model.train_step(prepare_inputs(cfg, ds.x_train[idx[:B]]), ds.y_train[idx[:B]], lr=cfg.lr).flips


def _three_steps_within_the_cycle_model(cfg):
    import time

    from host.verify import verify

    t0 = time.time()
    res = verify(cfg, 3)
    assert res.ok, res.message
    assert len(res.cycles) == 3
    for c in res.cycles:
        assert abs(c - res.model_cycles) <= 0.05 * res.model_cycles, (c, res.model_cycles)
    print(json.dumps({"cycles": res.cycles, "model_cycles": res.model_cycles, "wall_s": round(time.time() - t0),
                      "steps": res.steps}))
    return res


@pytest.mark.paper
def test_paper_mlp_three_steps():
    """What CI runs for the paper's MLP (784-256-256-256-256-10, B = 100, configs/mlp_mnist.toml as it is):
    ``xnortrain verify`` for 3 steps; every read-back quantity equals the bit-exact model
    after every step, the measured cycles are within 5 % of the cycle model, and a step takes at most 2,850 cycles
    per training image in RTL (the preset's budget while timing closes; the cycle model's figure as well)."""
    from rtl_gen.cycle_model import step_cycles
    from rtl_gen.top import SystemPlan

    cfg = paper_cfg()
    budget = 2_850 * cfg.train.batch_size
    assert step_cycles(SystemPlan(cfg)).step <= budget
    res = _three_steps_within_the_cycle_model(cfg)
    assert max(res.cycles) <= budget, (res.cycles, budget)


@pytest.mark.rtl_slow
def test_zcu104_design_three_steps_under_1200_cycles_per_image():
    """The paper's MLP with the explorer's parallelism for the xczu7ev (configs/mlp_mnist_zcu104.toml): 3 steps
    bit-exact, within 5 % of the cycle model, and at most 1,200 cycles per training image in RTL (about 12 minutes:
    a 480,000-line Verilog build, then some 3 minutes a step)."""
    cfg = load_config(CONFIG_DIR / "mlp_mnist_zcu104.toml")
    res = _three_steps_within_the_cycle_model(cfg)
    assert max(res.cycles) <= 1_200 * cfg.train.batch_size


@pytest.mark.rtl_slow
def test_paper_mlp_infer():
    """The paper's MLP (B = 100): after one training step, ``infer`` of a full batch and of 49 samples equals
    HwModel.forward_eval (logits and classes) and leaves the state untouched (the step after an infer: the
    default tier's test_small_mlp_infer_matches_forward_eval). Reuses test_paper_mlp_three_steps's build. About
    4 min of cocotb simulation: the paper tier infers the paper's MLP on the simulated board instead
    (tests/host/test_simboard.py), the same Verilog without cocotb."""
    from host.verify import run_system
    from rtl_gen.cycle_model import infer_cycles

    cfg = paper_cfg()
    rep = run_system(cfg, mode="infer", steps=3, tb_params={"infer_train_after": 0})
    assert rep["state_after_infer"] is None
    for st in rep["steps"]:
        assert st["mismatch"] is None, st
    infers = [st for st in rep["steps"] if "infer" in st]
    assert [st["samples"] for st in infers] == [100, 49] and len(rep["steps"]) == 3
    assert [st["cycles"] for st in infers] == [infer_cycles(SystemPlan(cfg))] * 2  # 65,404: 654 per image
    print(json.dumps({"infer_cycles": [st["cycles"] for st in infers], "phases": infers[0]["phases"]}))


def test_logit_and_loss_units_take_loss_lanes_classes_per_beat():
    assert (SystemPlan(small_cfg()).loss_lanes, SystemPlan(small_cfg()).loss_groups) == (1, 10)  # the default
    plan = SystemPlan(small_cfg("hw.loss_lanes=2"))  # 10 classes, 8 lanes out: Y beats split into 2-class parts
    assert (plan.loss_lanes, plan.loss_groups) == (2, 5)
    assert plan.quantity("logits", 1).layout.elems_per_word == 2
    assert SystemPlan(small_cfg("hw.loss_lanes=64")).loss_lanes == 8  # at most lanes_out
    with pytest.raises(ConfigError, match=re.escape("hw.loss_lanes = 3 must divide the output layer's lanes_out = 8")):
        SystemPlan(small_cfg("hw.loss_lanes=3"))


def test_buffers_share_memories_where_the_ports_allow():
    """One sample bank: all layers' X in one memory, the codes in YDX's rows above its words (four beats per
    row); two sample banks: banked X and codes memories of their own. The po2 scratch is in YDX's words in both."""
    def memories(cfg):
        m = Accelerator(SystemPlan(cfg)).elaborate(None)
        return {name for name, (sub, *_r) in m._named_submodules.items() if type(sub).__name__ == "Memory"}

    one = memories(small_cfg(SHARED_LAYERS, SHARED_LANES, "hw.lanes_b=1", "hw.dw_passes=2"))
    assert {"xb", "ydx"} <= one and not one & {"scratch", "cb0", "xb0_0", "xb1_0"}
    two = memories(small_cfg())
    assert {"cb0", "cb1", "xb0_0", "xb0_1", "xb1_0", "ydx"} <= two and not two & {"xb", "scratch"}


def test_int8_bit_plane_identity_of_the_cost_estimate():
    """benchmarks/int8_first_layer.py prices an 8-bit first layer as nine XNOR-popcount passes; the identity it
    rests on gives exactly the model's Y = X W, including the extremes -128 and 127."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "int8_first_layer.py"
    spec = importlib.util.spec_from_file_location("int8_first_layer", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (7, 53))
    x[0, :], x[1, :] = -128, 127
    w = np.where(rng.random((53, 11)) < 0.5, -1, 1)
    assert (mod.bit_plane_forward(x, w) == A.xnor_popcount(x, w, 128)).all()
    est = mod.estimate(paper_cfg())
    assert est["int8_planes"]["per_image"] > est["int8_dsp_dw"]["per_image"] > est["binary"]["per_image"]
    assert est["retained_input_bram36"]["int8"] > 7 * est["retained_input_bram36"]["binary"]


def test_throughput_bound_of_the_paper_mlp():
    """benchmarks/throughput_bound.py: the step's work counted from the layer shapes, today's cycle split adding up
    to the cycle model's step, and the DSP ceiling as the dX + dW work over the slices the other units leave (two
    accumulators each, four ternary dW sums with the preset's window). For the paper's MLP on the xc7z020 it says
    what docs/architecture.md section 7 reports: with the full po2 sums the ceiling alone is past 1,200 cycles per
    image; with the window, what the engine and the BN / po2 parts leave of the budget is below it."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "throughput_bound.py"
    spec = importlib.util.spec_from_file_location("throughput_bound", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cfg = paper_cfg()
    plan = SystemPlan(cfg)
    shapes = [s.weight_shape for s in cfg.layer_shapes()]  # dense: (in, out)
    B = cfg.train.batch_size
    work = mod.step_work(plan)
    assert work["xnor_bit_ops"] == work["dw_macs"] == sum(B * n * m for n, m in shapes)
    assert work["dx_macs"] == sum(B * n * m for n, m in shapes[1:])
    b = mod.bound(plan, "xc7z020", 1200)
    t = b["today"]
    assert t["array"] + t["engine"] + t["rest"] == t["step"] == step_cycles(plan).step
    d = b["dsp"]
    free = 220 - d["other_units"]
    # the preset's windowed dW: four ternary sums a slice
    assert d["fields_per_slice"] == 2 and d["dw_fields_per_slice"] == 4 and 0 < d["other_units"] < 220
    assert b["dsp_ceiling_cycles"] == work["dx_macs"] / (2 * free) + work["dw_macs"] / (4 * free)
    assert b["budget_per_step"] == 120_000 and b["left_for_dx_dw"] == 120_000 - t["engine"] - t["rest"]
    # what is left for dX and dW would take far more fabric multiply-accumulates than the die has LUTs
    assert 0 < b["left_for_dx_dw"] < b["dsp_ceiling_cycles"]
    assert b["fabric_lut_needed"] > 53_200 > b["lut"]["limit_70"]
    assert "DSP ceiling" in mod.format_text(b)
    # the full po2 sums: two a slice for dW too, and the ceiling alone is past the budget
    full = mod.bound(SystemPlan(apply_overrides(cfg, ["hw.dw_window=0"])), "xc7z020", 1200)
    assert full["dsp"]["dw_fields_per_slice"] == 2
    assert full["dsp_ceiling_cycles"] == (work["dx_macs"] + work["dw_macs"]) / (2 * free) > 120_000


def test_the_cycle_models_probe_units_never_warn_unused():
    """The cycle model builds units only to ask their cycles. Amaranth warns "created but never used" for such a
    unit when the garbage collector meets it, at no fixed time: once it landed in the middle of a command's
    one-line error (test_cli's unit-bounded fields, seen once in many runs). The module's first line turns the
    warning off for every unit it creates, half-built ones included."""
    from amaranth._utils import get_linter_option

    import rtl_gen.cycle_model as cm

    assert get_linter_option(cm.__file__, "UnusedElaboratable", bool, True) is False
