# amaranth: UnusedElaboratable=no
"""rtl_gen.weight_memory: sweep order, optimiser constants and state packing, and the cocotb/Verilator check of
WeightMemory (with an XnorEngineCore on its read port) against sim.hw.optim and HwModel.reset."""

import json
import os
import re

import numpy as np
import pytest
from amaranth import Module
from amaranth.lib import wiring

from rtl_gen.toolchain import run_cocotb, to_verilog
from rtl_gen.weight_memory import (
    LATENCY,
    OptimizerSpec,
    StateMemory,
    SweepGeometry,
    WeightMemory,
    WeightMemoryGeometry,
    grad_layout,
)
from rtl_gen.xnor_engine import XnorEngineCore, XnorGeometry
from sim.config import apply_overrides, load_config
from sim.hw.optim import state_bits
from sim.hw_config import HwConfig


def small_config(**overrides):
    """A two-layer dense network 37 -> 10 -> 7 with batch 13 (and any further overrides)."""
    d = {
        "model.input_shape": [1, 1, 37],
        "model.layers": [{"type": "dense", "units": 10}, {"type": "dense", "units": 7}],
        "model.num_classes": 7,
        "train.batch_size": 13,
    }
    d.update(overrides)
    return d


class WeightMemoryWithEngine(wiring.Component):
    """Test top: the weight memory with an XnorEngineCore reading its banks (ports: the memory's minus
    ``read``, plus the engine's ``x`` and ``y``)."""

    def __init__(self, geometry: WeightMemoryGeometry):
        self._memory = WeightMemory(geometry=geometry)
        self._core = XnorEngineCore(geometry=geometry.bank)
        members = {name: mem for name, mem in self._memory.signature.members.items() if name != "read"}
        members.update(x=self._core.signature.members["x"], y=self._core.signature.members["y"])
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.memory = mem = self._memory
        m.submodules.core = core = self._core
        wiring.connect(m, core.weights, mem.read)
        for name in ("cmd", "grad", "rng", "host"):
            wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(mem, name))
        wiring.connect(m, mem.host_rdata, wiring.flipped(self.host_rdata))
        wiring.connect(m, wiring.flipped(self.x), core.x)
        wiring.connect(m, core.y, wiring.flipped(self.y))
        m.d.comb += [self.busy.eq(mem.busy), self.flips.eq(mem.flips)]
        return m


@pytest.mark.parametrize("copies", [False, True], ids=["one-inc", "inc-copies"])
def test_state_memory_segments_read_back_what_was_written(copies):
    """StateMemory with several segments (a 16-word segment of 8-word blocks, 50 words: 16, 16, 16 and a 2-word
    tail) of three slices each: random writes and reads at the ports' address registers (loaded, stepped across
    the segments' bounds, or held; a write's data and enable given a cycle before it writes at the register's
    address), each read's word two cycles later, against a dictionary (a read of an address written in the same
    cycle may give either word: no read-during-write logic). With ``inc_copies`` every address register steps
    on an increment of its own (``incs``, all given the same value here)."""
    import random

    from amaranth.sim import Simulator

    mem = StateMemory(shape=7, depth=50, segment=16, block=8, slice_bits=3,  # slices of 3, 3 and 1 bits
                      inc_copies=copies)
    assert mem.segments == [(0, 16), (16, 16), (32, 16), (48, 2)]
    assert mem.counters == 12 and len(mem.read.incs) == len(mem.write.incs) == (12 if copies else 0)
    with pytest.raises(ValueError, match=re.escape("segment (12) must be a multiple of block (8)")):
        StateMemory(shape=7, depth=50, segment=12, block=8)
    sim = Simulator(mem)
    sim.add_clock(1e-6)
    rng = random.Random(5)

    async def bench(ctx):
        model, pending = {}, [None, None]  # the words read one and two cycles ago
        regs = {"read": 0, "write": 0}  # the address registers
        wpend = None  # the data given with en in the cycle before: written in this cycle
        stepped = {"read": 0, "write": 0}
        for port in (mem.read, mem.write):
            ctx.set(port.load, 1)
        await ctx.tick()
        for _ in range(1500):
            nxt = {}
            for key, port in (("read", mem.read), ("write", mem.write)):
                load, inc = rng.random() < 0.2, rng.random() < 0.7 and regs[key] < 49
                ctx.set(port.load, load)
                ctx.set(port.addr, rng.randrange(50))
                for sig in port.incs or [port.inc]:
                    ctx.set(sig, inc)
                nxt[key] = ctx.get(port.addr) if load else regs[key] + inc
                stepped[key] += inc and not load and regs[key] % 16 == 15
            we = rng.random() < 0.5
            ctx.set(mem.write.data, rng.randrange(128))
            ctx.set(mem.write.en, we)
            want = pending.pop(0)
            if want is not None:
                assert ctx.get(mem.read.data) in want
            data, ra, wa = ctx.get(mem.write.data), regs["read"], regs["write"]
            pending.append({model.get(ra, 0)} | ({wpend} if wpend is not None and wa == ra else set()))
            await ctx.tick()
            if wpend is not None:
                model[wa] = wpend
            wpend = data if we else None
            regs = nxt
        assert min(stepped.values()) >= 5  # each register stepped from one segment into the next

    sim.add_testbench(bench)
    sim.run()


# --- pure Python ------------------------------------------------------------------------------------------


def test_sweep_order_visits_every_weight_once_in_row_order_per_column():
    sw = SweepGeometry(bank=XnorGeometry(n_in=37, n_out=10, lanes_in=8, lanes_out=4), update_lanes=4)
    assert (sw.chunks, sw.chunks_last, sw.valid_last, sw.lanes_last, sw.visits) == (2, 2, 1, 2, 100)
    t = sw.table
    assert len(t["addr"]) == sw.visits and sw.cycles() == sw.visits + LATENCY
    ids = np.arange(37 * 10).reshape(37, 10)
    v = sw.gather(ids, pad=-1)
    assert sorted(v[sw.valid_mask()].tolist()) == ids.ravel().tolist()
    assert (v[~sw.valid_mask()] == -1).all()
    assert (sw.scatter(v) == ids).all()
    for c in range(10):  # rows of a column come in increasing order
        rows = [r for r in v[t["col"] == c].ravel().tolist() if r >= 0]
        assert rows == sorted(rows)
    assert (np.diff(t["addr"]) >= 0).all()


def test_optimizer_fields_come_from_state_bits():
    for kind, extra in [
        ("switch", {}),
        ("switch", {"switch_undo": True}),
        ("bop", {}),
        ("iir", {}),
        ("sgd", {}),
        ("sgd", {"sgd_momentum_shift": 0}),
    ]:
        h = HwConfig(optimizer=kind, **extra)
        spec = OptimizerSpec.from_hw(h)
        assert sum(bits for _, bits in spec.fields) + (0 if kind == "sgd" else 1) == sum(state_bits(h).values())
    assert OptimizerSpec.from_hw(HwConfig()).fields == (("acc", 7),)
    assert OptimizerSpec.from_hw(HwConfig(optimizer="bop")).tau == 64
    with pytest.raises(ValueError, match="hw.switch_cutoff = 2000 is too large for the RTL table; limit 1023"):
        OptimizerSpec.from_hw(HwConfig(switch_cutoff=2000))


def test_state_rows_pack_and_unpack():
    cfg = apply_overrides(load_config("mlp"), small_config(**{"hw.optimizer": "iir"}))
    geo = WeightMemoryGeometry.from_config(cfg, 0, lanes_in=8, lanes_out=4, update_lanes=4)
    rng = np.random.default_rng(0)
    state = {"m": rng.integers(-64, 65, (37, 10)), "g": rng.integers(-256, 257, (37, 10))}
    rows = geo.pack_state(state)
    back = geo.unpack_state(rows)
    assert all((back[k] == state[k]).all() for k in state)
    # one field per host space: m (8 bits) at space 1, g (10 bits) at space 3; the port carries the wider one
    assert [geo.field_space(k) for k in ("m", "g")] == [1, 3]
    assert geo.data_width == 4 * 10 and {k: len(v) for k, v in rows.items()} == {"m": geo.sweep.visits,
                                                                                 "g": geo.sweep.visits}
    assert max(rows["m"]) < 1 << 32 and max(rows["g"]) < 1 << 40
    assert grad_layout(geo.bank).size == 2 * 8 * 4 + 1


def test_mlp_memory_shapes():
    """The MLP's hidden layer: bank and state memories are block-RAM shaped (deep, moderately wide)."""
    geo = WeightMemoryGeometry.from_config(load_config("mlp"), 1, lanes_in=64, lanes_out=16, update_lanes=8)
    assert (geo.bank.depth, geo.bank.lanes_in, geo.bank.lanes_out) == (64, 64, 16)
    assert geo.sweep.visits == 256 * 256 // 8 == 8192
    assert geo.state_layout.size == 8 * 6  # the preset's 6-bit switch accumulators (C = 31): 48-bit rows, 8192 deep


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"update_lanes": 3}, "update_lanes must divide lanes_in = 8, not 3"),
        ({"update_lanes": 0}, "update_lanes must be an integer in 1..8, not 0"),
    ],
)
def test_bad_parameters_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        SweepGeometry(bank=XnorGeometry(n_in=20, n_out=5, lanes_in=8, lanes_out=2), **kwargs)
    with pytest.raises(TypeError):
        WeightMemory(geometry=None)
    with pytest.raises(TypeError):
        WeightMemory(None)


FOUR_LAYERS = {"model.layers": [{"type": "dense", "units": 10}, {"type": "dense", "units": 10},
                                 {"type": "dense", "units": 10}, {"type": "dense", "units": 7}]}


@pytest.mark.parametrize("optimizer", ["switch", "bop", "iir"])
def test_one_memory_for_several_layers_equals_one_memory_each(optimizer):
    """A WeightMemory shared by the four layers of 37 -> 10 -> 10 -> 10 -> 7 (8-bit words, 4 banks, 4 update
    lanes; 5, 2, 2 and 2 words; partial last chunks, groups of 4, 4, 4 and 3 columns) behaves exactly like
    four single-layer memories (each verified against sim.hw.optim by the cocotb tests): the same host writes,
    UPDATE sweeps interleaved layer by layer with random gradients, numbers and stalls, then every weight row,
    state row and flip count read back is equal. Amaranth's simulator."""
    from amaranth.sim import Simulator
    from pysim_host import host_access  # same folder

    from rtl_gen.weight_memory import SPACE_TABLE, SPACE_WEIGHTS, UPDATE
    from sim.hw.optim import PROB_BITS

    cfg = apply_overrides(load_config("mlp"), small_config(**FOUR_LAYERS, **{"hw.optimizer": optimizer}))
    geos = [WeightMemoryGeometry.from_config(cfg, j, lanes_in=8, lanes_out=4, update_lanes=4) for j in range(4)]
    assert geos[1] == geos[2]  # equal geometry: only the regions differ
    shared = WeightMemory(geometries=geos)
    singles = [WeightMemory(geometry=g) for g in geos]
    with pytest.raises(ValueError, match="same lanes_in"):
        WeightMemory(geometries=[geos[0], WeightMemoryGeometry.from_config(cfg, 1, lanes_in=8, lanes_out=2,
                                                                           update_lanes=4)])
    top = Module()
    top.submodules.shared = shared
    for j, u in enumerate(singles):
        top.submodules[f"single{j}"] = u
    rng = np.random.default_rng(7)
    U, L = 4, 4
    table = rng.integers(0, 1 << PROB_BITS, geos[0].optimizer.cutoff + 1) if optimizer == "switch" else []
    init = []
    fields = [(geos[0].field_space(n), geos[0].field_width(n)) for n, _ in geos[0].optimizer.fields]
    for g in geos:
        init.append({"w": rng.integers(0, 1 << 8, (L, g.bank.depth)).tolist(),
                     "s": [[int(x) % (1 << width) for x in rng.integers(0, 1 << 62, g.sweep.visits)]
                           for _, width in fields]})
    sweeps = []
    for _ in range(2):
        for g in geos:
            rows = g.bank.depth
            grads = [int(x) for x in rng.integers(0, 1 << 62, rows)]  # g[lane][bit] signed 2-bit fields
            nums = [[int(x) for x in rng.integers(0, 1 << 32, U, dtype=np.uint64)] for _ in range(g.sweep.visits)]
            gate = int(rng.choice([1 << PROB_BITS, int(rng.integers(1, 1 << PROB_BITS))]))  # switch: schedule gate
            sweeps.append((grads, nums, int(rng.integers(0, 8)), gate))

    def grad_word(bits, lane_bits):
        # random 2-bit fields in {-1, 0, +1}: map 2 (= -2) to 0
        out = 0
        for f in range(lane_bits):
            v = (bits >> (2 * f)) & 3
            out |= (0 if v == 2 else v) << (2 * f)
        return out

    async def host(ctx, dut, space, addr, lane=0, data=None):
        payload = {"write": int(data is not None), "space": space, "lane": lane, "addr": addr, "data": data or 0}
        return await host_access(ctx, dut, payload, read=data is None)

    async def sweep(ctx, dut, grads, nums, shift, gate, stall):
        ctx.set(dut.cmd.payload, {"op": UPDATE, "shift": shift, "gate": gate})
        ctx.set(dut.cmd.valid, 1)
        await ctx.tick().until(dut.cmd.ready)
        ctx.set(dut.cmd.valid, 0)
        gi = ni = 0
        while gi < len(grads) or ni < len(nums):
            gv = gi < len(grads) and stall.random() > 0.3
            nv = ni < len(nums) and stall.random() > 0.3
            if gv:
                ctx.set(dut.grad.payload.as_value(), grad_word(grads[gi], 8 * L) | (int(gi == len(grads) - 1)
                                                                                   << (2 * 8 * L)))
            if nv:
                ctx.set(dut.rng.payload.u, nums[ni])
            ctx.set(dut.grad.valid, gv)
            ctx.set(dut.rng.valid, nv)
            gr, nr = ctx.get(dut.grad.ready), ctx.get(dut.rng.ready)
            await ctx.tick()
            gi += int(gv and gr)
            ni += int(nv and nr)
        ctx.set(dut.grad.valid, 0)
        ctx.set(dut.rng.valid, 0)
        while ctx.get(dut.busy):
            await ctx.tick()
        return int(ctx.get(dut.flips))

    results = {}

    async def run(ctx, name, pick):
        stall = np.random.default_rng(11)
        out = []
        for j, g in enumerate(geos):
            dut = pick(ctx, j)
            for lane in range(L):
                for r in range(g.bank.depth):
                    await host(ctx, dut, SPACE_WEIGHTS, r, lane, init[j]["w"][lane][r])
            for (space, _), rows in zip(fields, init[j]["s"], strict=True):
                for v, word in enumerate(rows):
                    await host(ctx, dut, space, v, data=word)
            for p, t in enumerate(table):
                await host(ctx, dut, SPACE_TABLE, p, data=int(t))
        for n, (grads, nums, shift, gate) in enumerate(sweeps):
            j = n % len(geos)
            out.append(("flips", j, await sweep(ctx, pick(ctx, j), grads, nums, shift, gate, stall)))
        for j, g in enumerate(geos):
            dut = pick(ctx, j)
            out.append(("w", j, [await host(ctx, dut, SPACE_WEIGHTS, r, lane) for lane in range(L)
                                 for r in range(g.bank.depth)]))
            for space, _ in fields:
                out.append(("s", j, [await host(ctx, dut, space, v) for v in range(g.sweep.visits)]))
        results[name] = out

    def pick_shared(ctx, j):
        ctx.set(shared.layer, j)
        return shared

    async def bench(ctx):
        await run(ctx, "single", lambda ctx, j: singles[j])
        await run(ctx, "shared", pick_shared)

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert len(results["single"]) == len(sweeps) + (1 + len(fields)) * len(geos)
    assert any(f for kind, _, f in results["single"] if kind == "flips")  # the sweeps changed weights
    for a, b in zip(results["single"], results["shared"], strict=True):
        assert a == b, (a[0], a[1])


# --- cocotb on Verilator ----------------------------------------------------------------------------------

SWEEP = [
    # (overrides, layer, lanes_in, lanes_out, update_lanes); the small network unless noted
    # switch with reset and undo, C = 15: 37 x 10, two chunks per row, partial last chunk and group
    pytest.param(
        (small_config(**{"hw.switch_cutoff": 15, "hw.switch_reset": True, "hw.switch_undo": True}), 0, 8, 4, 4),
        id="switch-reset-undo-n37x10-li8-lo4-u4",
    ),
    # switch as the paper preset sets it (C = 31, 6-bit accumulators): 10 x 7, one chunk per row, three lanes
    pytest.param((small_config(), 1, 4, 3, 4), id="switch-n10x7-li4-lo3-u4"),
    # and with 7-bit accumulators (C = 63, the configuration default)
    pytest.param((small_config(**{"hw.switch_cutoff": 63}), 1, 4, 3, 4), id="switch-c63-n10x7-li4-lo3-u4"),
    pytest.param((small_config(**{"hw.optimizer": "bop"}), 0, 8, 2, 8), id="bop-n37x10-li8-lo2-u8"),
    pytest.param((small_config(**{"hw.optimizer": "iir"}), 1, 4, 3, 2), id="iir-n10x7-li4-lo3-u2"),
    pytest.param((small_config(**{"hw.optimizer": "sgd"}), 0, 8, 4, 2), id="sgd-n37x10-li8-lo4-u2"),
    # sgd without momentum, latent 8 bits and momentum fraction 6 (shift offset D = 1); bit-serial
    pytest.param(
        (
            small_config(
                **{
                    "hw.optimizer": "sgd",
                    "hw.sgd_momentum_shift": 0,
                    "hw.sgd_latent_bits": 8,
                    "hw.sgd_momentum_frac_bits": 6,
                }
            ),
            1,
            4,
            1,
            1,
        ),
        id="sgd-nomom-n10x7-li4-lo1-u1",
    ),
    # the MLP's hidden layer with the default switch memory
    pytest.param(({}, 1, 64, 16, 8), id="switch-mlp-l1-li64-lo16-u8", marks=pytest.mark.rtl_slow),
]


@pytest.mark.rtl
@pytest.mark.parametrize("case", SWEEP)
def test_weight_memory_rtl(case, request):
    """Rerun one case with waveforms: ``XNT_WAVES=1 pytest -k bop ...``."""
    overrides, layer, lanes_in, lanes_out, update_lanes = case
    cfg = apply_overrides(load_config("mlp"), overrides)
    geo = WeightMemoryGeometry.from_config(
        cfg, layer, lanes_in=lanes_in, lanes_out=lanes_out, update_lanes=update_lanes
    )
    params = {
        "overrides": overrides,
        "layer": layer,
        "lanes_in": lanes_in,
        "lanes_out": lanes_out,
        "update_lanes": update_lanes,
    }
    name = "weight_memory_" + request.node.callspec.id.replace("-", "_")
    slow = geo.sweep.visits > 1000
    run = run_cocotb(
        verilog=to_verilog(WeightMemoryWithEngine(geo), "weight_memory", emit_src=False),  # builds keyed on it
        toplevel="weight_memory",
        test_module="weight_memory_tb",
        name=name,
        extra_env={"XNT_TB_PARAMS": json.dumps({**params, "sweeps": 2 if slow else 6})},
        waves=bool(os.environ.get("XNT_WAVES")),
    )
    assert run.tests == 5
    measured = json.loads((run.build_dir / "cycles-update.json").read_text())
    assert set(measured["measured"]) == {measured["model"]} == {geo.sweep.visits + LATENCY}


@pytest.mark.timing
def test_state_memory_segments_read_at_registers_of_their_own(tmp_path):
    """Yosys's view of a StateMemory of four segments of two slices: each slice's memory reads every cycle (read
    enable 1) at the low bits of a read address register of its own and writes at those of a write address
    register of its own the data and enable of registers of its own, with no logic between (timing: the read
    enable and the address multiplexers fanned out to every block RAM of the state, the write enable to every
    slice), and the copies are not merged into one."""
    from yosys_nets import memory_read_ports  # same folder

    mem = StateMemory(shape=7, depth=50, segment=16, block=8, name="st", slice_bits=4)
    ports = [getattr(port, key) for port in (mem.read, mem.write) for key in ("load", "addr", "inc", "en", "data")]
    nets, reads = memory_read_ports(mem, "state_memory", tmp_path, ports=ports)
    reads = {r["cell"]: r for r in reads}
    mems = [(i, j, n) for i, n in enumerate((16, 16, 16, 2)) for j in range(2)]  # two slices: 4 and 3 bits
    for key, reg in (("addr", "ra"), ("waddr", "wa")):
        regs = [nets[f"st_seg{i}_s{j}_{reg}"] for i, j, _ in mems]
        assert [reads[f"seg{i}_{j}"][key] for i, j, _ in mems] == [r[: (n - 1).bit_length()] for r, (_, _, n) in
                                                                  zip(regs, mems, strict=True)]
        assert len({r[0] for r in regs}) == 8
    assert all(reads[f"seg{i}_{j}"]["en"] == ("1",) for i, j, _ in mems)
    for key, reg in (("wdata", "wd"), ("wen", "we")):
        regs = [nets[f"st_seg{i}_s{j}_{reg}"] for i, j, _ in mems]
        widths = [len(reads[f"seg{i}_{j}"]["wdata"]) for i, j, _ in mems]
        want = regs if key == "wdata" else [r * n for r, n in zip(regs, widths, strict=True)]
        assert [reads[f"seg{i}_{j}"][key] for i, j, _ in mems] == want
        assert len({r[0] for r in regs}) == 8


@pytest.mark.timing
def test_write_ports_take_registers_of_their_own(tmp_path):
    """Yosys's view of a WeightMemory (37 x 10, switch with undo, 4 banks of two chunks): every bank writes at the
    address, the data and the chunk enables of registers of its own, and every state slice its data and enable,
    with no logic between (timing: the write-back stage's op and valid bit fanned out to the write data and
    enables of every bank and state block RAM, 63.1 / 68.0 MHz at the paper's widths on the ECP5 proxy), and the
    copies are not merged. A bank's pins come from copies of its registers a cycle later (BANK_COPY_STAGE, a copy
    per bank), each loaded from its register with no logic between. Planted: the data pins from the bank's
    register (the earlier form) fails it."""
    from yosys_nets import gate_netlist, memory_ports  # same folder

    cfg = apply_overrides(load_config("mlp"), small_config(**{"hw.switch_cutoff": 15, "hw.switch_undo": True}))
    geo = WeightMemoryGeometry.from_config(cfg, 0, lanes_in=8, lanes_out=4, update_lanes=4)
    mod = gate_netlist(WeightMemory(geometry=geo), "weight_memory", tmp_path, keep=True)
    nets, mems = memory_ports(mod)
    mems = {r["cell"]: r for r in mems}
    d_of = {q: c["connections"]["D"][i] for c in mod["cells"].values() if "DFF" in c["type"]
            for i, q in enumerate(c["connections"]["Q"])}  # a flip-flop's output bit -> its data input bit
    seen = []
    for i in range(4):
        port, wa, wd, we = (mems[f"wbank{i}"], nets[f"bank{i}_wa_p"], nets[f"bank{i}_wd"], nets[f"bank{i}_we_p"])
        copy = nets[f"bank{i}_wd_p"]
        assert port["waddr"] == wa[: len(port["waddr"])]
        assert port["wdata"] == copy + copy  # both chunks' pins from the bank's copy
        assert port["wen"] == tuple(b for b in we for _ in range(4))  # a chunk's enable on its 4 bits
        assert tuple(d_of[b] for b in copy) == wd  # loaded from the bank's register, no logic between
        assert tuple(d_of[b] for b in wa) == nets[f"bank{i}_wa"]
        seen += [wa[0], wd[0], we[0], copy[0]]
    slices = [name for name in mems if name.startswith("state_")]
    assert len(slices) == 4  # acc: 8, 8 and 4 bits; undo: 4 bits
    for name in slices:
        field, mem = name.split(".")
        reg = f"{field}.{field}_seg0_s{mem.split('_')[1]}"
        wd, we = nets[f"{reg}_wd"], nets[f"{reg}_we"]
        assert mems[name]["wdata"] == wd
        assert mems[name]["wen"] == we * len(wd)
        seen += [wd[0], we[0]]
    assert len(set(seen)) == len(seen)


def _register_sources(mod: dict, names, bits=()) -> set[str]:
    """The registers (by net names, all of a bit's) and ports whose outputs reach the data, enable or reset pins of
    the flip-flops of nets ``names`` (or the net ``bits``) of a :func:`yosys_nets.gate_netlist` module through logic
    only (no register between)."""
    drivers, named = {}, {}
    for cname, c in mod["cells"].items():
        for port, pins in c["connections"].items():
            if c["port_directions"].get(port) == "output":
                drivers.update((b, cname) for b in pins if isinstance(b, int))
    for name, n in mod["netnames"].items():
        if "$" not in name:
            for b in n["bits"]:
                named.setdefault(b, set()).add(name)
    targets = {b for name in names for b in mod["netnames"][name]["bits"] if isinstance(b, int)}
    targets |= {b for b in bits if isinstance(b, int)}
    is_reg = {cname: "DFF" in c["type"] for cname, c in mod["cells"].items()}
    out, seen = set(), set()
    todo = list(targets)
    first = True
    while todo:
        nxt = []
        for b in todo:
            cell = drivers.get(b)
            if cell is None:
                out |= named.get(b, {"?"})  # a port
                continue
            if (is_reg[cell] or mod["cells"][cell]["type"].startswith("$mem")) and not (first and b in targets):
                out |= named.get(b, {cell})
                continue
            if cell in seen:
                continue
            seen.add(cell)
            c = mod["cells"][cell]
            nxt += [x for p, pins in c["connections"].items() if c["port_directions"].get(p) == "input" and p != "C"
                    for x in pins if isinstance(x, int)]  # not the clock
        todo, first = nxt, False
    return out


def _switch_netlist(tmp_path):
    """The gate netlist of a WeightMemory of 37 x 10 with 8 banks (two groups of four) of two chunks, switch with
    undo."""
    from yosys_nets import gate_netlist  # same folder

    cfg = apply_overrides(load_config("mlp"), small_config(**{"hw.switch_cutoff": 15, "hw.switch_undo": True}))
    geo = WeightMemoryGeometry.from_config(cfg, 0, lanes_in=8, lanes_out=8, update_lanes=4)
    return gate_netlist(WeightMemory(geometry=geo), "weight_memory", tmp_path)


@pytest.mark.timing
def test_lanes_are_picked_by_registered_one_hot_selects(tmp_path):
    """Yosys's view of the sweep's two choices among the lanes (8 banks, two groups of four). The gradient: stage 1
    picks a lane in each group by flags per lane that are registers (``s1_lane_hot``), stage 2 the group by flags
    per group that are registers (``s2_g_group_hot``) and forms the switch increment from it and the gate's
    registered comparison. The old weight: stage 3 picks a bank's chunk register in each group
    (``s3_lane_hot``), stage 4 the group into ``s5_w_old``. No lane counter between (timing: ``s1_lane`` choosing
    among all lanes' gradient bits, 87.3 MHz at the paper's widths on the ECP5 proxy; ``s3_lane`` among all
    banks' chunks, 79.8 MHz)."""
    mod = _switch_netlist(tmp_path)
    ports = {"rst", "state_acc.rst", "state_undo.rst", "cmd_in.rst", "host_in.rst"}
    for first, name, rows in ((1, "s2_g", "s1_g{}"), (3, "s4_w", "s3_w_chunk{}")):
        for q in range(2):
            lanes = range(4 * q, 4 * q + 4)
            hot = {f"s{first}_lane_hot{i}" for i in lanes}
            assert _register_sources(mod, [f"{name}_group{q}"]) - ports == {rows.format(i) for i in lanes} | hot
            assert _register_sources(mod, [f"{name}_group_hot{q}"]) - ports == hot
    groups = {f"{name}_group{q}" for name in ("s2_g", "s4_w") for q in range(2)} | {
        f"{name}_group_hot{q}" for name in ("s2_g", "s4_w") for q in range(2)}
    assert _register_sources(mod, ["s3_inc"]) - ports == {n for n in groups if n.startswith("s2")} | {
        f"s2_take{j}" for j in range(4)}
    assert _register_sources(mod, ["s5_w_old"]) - ports == {n for n in groups if n.startswith("s4")}


@pytest.mark.timing
def test_state_write_counters_load_from_registers(tmp_path):
    """Yosys's view of the state write side (switch with undo, two fields): every state slice's write address
    register loads under ``state_wr_load`` (a register) from the field's ``host_wr_{field}_visit`` (a register),
    and neither it nor the slice's write data and enable registers take the host write's space or valid bit
    (timing: the host write's space compared and choosing every slice's write address, 93.9 MHz at the paper's
    widths on the ECP5 proxy, nextpnr seed 2), and the slice's write data and enable registers load under flags
    from registers, not a compare of the slice's write address register (timing: that compare into their
    enables, 89.1 MHz)."""
    mod = _switch_netlist(tmp_path)
    regs = [name for name in mod["netnames"] if re.fullmatch(r"state_\w+\.state_\w+_seg\d+_s\d+_w[ade]", name)]
    assert len(regs) == 3 * 4  # acc: three slices, undo: one; wa, wd and we each
    for name in regs:
        src = _register_sources(mod, [name])
        assert not src & {"host_wr_space", "host_wr_valid"}, name
        if not name.endswith("_wa"):
            assert name[:-1] + "a" not in src, name
        if name.endswith("_wa"):
            field = name.split(".")[0].removeprefix("state_")
            assert {"state_wr_load", f"host_wr_{field}_visit"} <= src, name



@pytest.mark.timing
def test_commands_and_host_requests_enter_through_registered_slices(tmp_path):
    """Yosys's view (switch with undo, two fields): the optimiser state's read address registers, the sweep's
    counters and the host read's address register take neither the command's nor the host request's ``valid``
    or payload from the memory's ports, only from the slices' registers (``cmd_in``, ``host_in``) (timing: the host
    request slice's valid -> the target choice -> the command's and the host read's handshake -> the clock
    enables of 22 state address registers, 13.4 ns in context on the ECP5 proxy). A host read reaches them a cycle
    after the slice, from registers of the read (``rd_go``, its row ``host_rd_visit``: the layer's base plus the
    request's address into every slice's register was 11.97 ns at the paper's widths out of context)."""
    mod = _switch_netlist(tmp_path)
    regs = [name for name in mod["netnames"] if re.fullmatch(r"state_\w+\.state_\w+_seg\d+_s\d+_ra", name)]
    assert len(regs) == 4  # acc: three slices, undo: one
    port_nets = {name for name in mod["netnames"] if name.startswith(("cmd__", "host__"))}
    assert {"cmd__valid", "host__valid"} <= port_nets
    for name in regs:
        src = _register_sources(mod, [name])
        assert not src & port_nets, (name, sorted(src & port_nets))
        assert {"cmd_in.o__valid", "rd_go", "host_rd_visit"} <= src, name
        assert not {"host_in.o__valid", "host_in.o__payload"} & src, name
