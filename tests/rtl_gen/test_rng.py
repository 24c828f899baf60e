# amaranth: UnusedElaboratable=no
"""rtl_gen.rng: jump matrices, geometry and order, and the cocotb/Verilator check of RngEngine against
sim.hw.rng.RngBank (sequence, host seeding and read-back, exact cycle count)."""

import json
import os
import re
from collections import Counter

import numpy as np
import pytest

from rtl_gen.rng import FANOUT_WEIGHT, LATENCY, RngEngine, RngGeometry, copy_groups, jump_rows, layer_offset
from rtl_gen.toolchain import run_cocotb, to_verilog
from rtl_gen.weight_memory import SweepGeometry
from rtl_gen.xnor_engine import XnorGeometry
from sim.config import apply_overrides, load_config
from sim.hw.rng import RngBank, xorshift32_next


def small_config(**overrides):
    """A two-layer dense network 37 -> 10 -> 7 with batch 13 (and any further overrides)."""
    d = {
        "model.input_shape": [1, 1, 37],
        "model.layers": [{"type": "dense", "units": 10}, {"type": "dense", "units": 7}],
        "model.num_classes": 7,
        "train.batch_size": 13,
        # system lanes the RNG geometries below agree with (the configuration checks hw.rng_block against them)
        "hw.lanes_in": 8,
        "hw.lanes_out": 4,
    }
    d.update(overrides)
    return d


# --- pure Python ------------------------------------------------------------------------------------------


def test_jump_rows_are_the_n_step_map():
    rng = np.random.default_rng(0)
    for n in (1, 2, 5, 16):
        rows = jump_rows(n)
        for x in rng.integers(1, 1 << 32, 20, dtype=np.uint64).tolist():
            want = x
            for _ in range(n):
                want = xorshift32_next(want)
            got = sum((sum((x >> j) & 1 for j in row) & 1) << i for i, row in enumerate(rows))
            assert got == want


def test_geometry_and_offsets_follow_the_contract():
    cfg = apply_overrides(load_config("mlp"), small_config(**{"hw.rng_block": 16}))
    g = RngGeometry.from_config(cfg, 1, lanes_in=8, lanes_out=4, update_lanes=4)
    assert (g.n_blocks, g.generators, g.words_per_block) == (1, 7, 2)
    assert layer_offset(cfg, 1) == 3 * 10 == RngBank([(37, 10), (10, 7)], 1, 16).offsets[1]
    mlp = load_config("mlp")
    assert (
        sum(RngGeometry.from_config(mlp, j, lanes_in=64, lanes_out=16, update_lanes=8).generators for j in range(5))
        == RngBank([tuple(s.weight_shape) for s in mlp.weight_layers()], 1, 256).n_generators
    )


def test_numbers_follow_each_generators_row_order():
    """In sweep order, each generator's numbers are consecutive xorshift32 outputs (scalar re-derivation)."""
    cfg = apply_overrides(load_config("mlp"), small_config(**{"hw.rng_block": 16}))
    geo = RngGeometry.from_config(cfg, 0, lanes_in=8, lanes_out=4, update_lanes=4)
    bank = RngBank([(37, 10), (10, 7)], 5, 16)
    start = bank.get_state()
    nums = geo.numbers(bank.sweep()[0])
    t = geo.sweep.table
    state = {g: int(start[g]) for g in range(geo.generators)}
    for v in range(geo.sweep.visits):
        for j in range(4):
            row = int(t["row"][v]) + j
            if row >= 37:
                assert nums[v, j] == 0
                continue
            gen = (row // 16) * 10 + int(t["col"][v])
            state[gen] = xorshift32_next(state[gen])
            assert int(nums[v, j]) == state[gen]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"block": 12}, "block (hw.rng_block) must be a multiple of lanes_in = 8, not 12"),
        ({"block": 0}, "block must be an integer in 1..1048576, not 0"),
    ],
)
def test_bad_parameters_are_rejected(kwargs, message):
    sweep = SweepGeometry(bank=XnorGeometry(n_in=20, n_out=5, lanes_in=8, lanes_out=2), update_lanes=4)
    with pytest.raises(ValueError, match=re.escape(message)):
        RngGeometry(sweep=sweep, **kwargs)
    with pytest.raises(ValueError, match="update_lanes must divide lanes_in = 8, not 3"):
        SweepGeometry(bank=XnorGeometry(n_in=20, n_out=5, lanes_in=8, lanes_out=2), update_lanes=3)


def test_parameters_are_keyword_only():
    with pytest.raises(TypeError):
        RngEngine(None)


EQUAL_LAYERS = {"model.layers": [{"type": "dense", "units": 10}, {"type": "dense", "units": 10},
                                  {"type": "dense", "units": 10}, {"type": "dense", "units": 7}]}


@pytest.mark.parametrize("layers", ["different", "equal"])
def test_one_engine_serves_several_layers(layers):
    """One RngEngine for the layers of 37 -> 10 -> 7 (blocks of 16 rows): layer 0 with 8-bit words, 4 lanes,
    a partial last word and chunk (1 real row of 4); layer 1 with 4-bit words, 2 lanes, a partial last group
    and word (2 real rows). And for 37 -> 10 -> 10 -> 10 -> 7, whose layers 1 and 2 have equal geometry (only their
    regions of the state RAM differ). Host seeding and read-back per layer and interleaved sweeps (one layer
    after the other, as in a training step) equal RngBank's, in Amaranth's simulator."""
    from amaranth.sim import Simulator
    from pysim_host import host_access  # same folder

    over = {"hw.rng_block": 16, "hw.rng_seed": 3, **(EQUAL_LAYERS if layers == "equal" else {})}
    cfg = apply_overrides(load_config("mlp"), small_config(**over))
    n_layers = len(cfg.weight_layers())
    geos = [RngGeometry.from_config(cfg, 0, lanes_in=8, lanes_out=4, update_lanes=4)]
    geos += [RngGeometry.from_config(cfg, j, lanes_in=4, lanes_out=2, update_lanes=4) for j in range(1, n_layers)]
    assert [g.sweep.valid_last for g in geos[:2]] == [1, 2] and geos[-1].sweep.lanes_last == 1
    dut = RngEngine(geometries=geos)
    with pytest.raises(ValueError, match="same update_lanes"):
        RngEngine(geometries=[geos[0], RngGeometry.from_config(cfg, 1, lanes_in=4, lanes_out=2, update_lanes=2)])
    bank = RngBank([tuple(s.weight_shape) for s in cfg.weight_layers()], 3, 16)
    offs = [layer_offset(cfg, j) for j in range(n_layers)]

    async def host(ctx, addr, data=None):
        payload = {"write": int(data is not None), "addr": addr, "data": data or 0}
        return await host_access(ctx, dut, payload, read=data is None)

    async def bench(ctx):
        state = bank.get_state()
        for j, geo in enumerate(geos):
            ctx.set(dut.layer, j)
            for g in range(geo.generators):
                await host(ctx, g, int(state[offs[j] + g]))
        for sweep in range(3):
            want = bank.sweep()
            for j, geo in enumerate(geos):
                ctx.set(dut.layer, j)
                ctx.set(dut.start, 1)
                await ctx.tick()
                ctx.set(dut.start, 0)
                ctx.set(dut.u.ready, 1)
                beats = []
                last = False
                while not last:
                    if ctx.get(dut.u.valid):  # transferred at this clock edge
                        beats.append([int(x) for x in ctx.get(dut.u.payload.u)])
                        last = bool(ctx.get(dut.u.payload.last))
                    await ctx.tick()
                ctx.set(dut.u.ready, 0)
                assert np.array_equal(np.array(beats, dtype=np.uint32), geo.numbers(want[j])), (sweep, j)
        state = bank.get_state()
        for j, geo in enumerate(geos):
            ctx.set(dut.layer, j)
            back = [await host(ctx, g) for g in range(geo.generators)]
            assert back == [int(v) for v in state[offs[j]: offs[j] + geo.generators]], j

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


# --- cocotb on Verilator ----------------------------------------------------------------------------------

SWEEP = [
    # (overrides, layer, lanes_in, lanes_out, update_lanes, sweeps)
    # 37 rows in 3 blocks of 16 (last 5), partial last word and chunk, partial last group: 100 visits
    pytest.param((small_config(**{"hw.rng_block": 16, "hw.rng_seed": 7}), 0, 8, 4, 4, 30), id="n37x10-b16-li8-lo4-u4"),
    # one lane, one chunk per word, one word per block: a generator read and written back in the same visit,
    # the same lane every cycle; layer 1 (offset 100)
    pytest.param((small_config(**{"hw.rng_block": 4, "hw.lanes_in": 4, "hw.lanes_out": 1}), 1, 4, 1, 4, 30),
                 id="n10x7-b4-li4-lo1-u4"),
    # one lane, one chunk per word, two words per block: each word's state comes from the lane file word the
    # visit just before wrote in the same cycle as the read (the bypass through ``cur``)
    pytest.param((small_config(**{"hw.rng_block": 8, "hw.lanes_in": 4, "hw.lanes_out": 1}), 1, 4, 1, 4, 30),
                 id="n10x7-b8-li4-lo1-u4"),
    # the MLP's first layer with the default block of 256 rows (25,088 visits per sweep)
    pytest.param(({}, 0, 64, 16, 8, 2), id="mlp-l0-li64-lo16-u8", marks=pytest.mark.rtl_slow),
]


@pytest.mark.rtl
@pytest.mark.parametrize("case", SWEEP)
def test_rng_engine_rtl(case, request):
    """Rerun one case with waveforms: ``XNT_WAVES=1 pytest -k n37 ...``."""
    overrides, layer, lanes_in, lanes_out, update_lanes, sweeps = case
    cfg = apply_overrides(load_config("mlp"), overrides)
    params = {
        "overrides": overrides,
        "layer": layer,
        "lanes_in": lanes_in,
        "lanes_out": lanes_out,
        "update_lanes": update_lanes,
    }
    name = "rng_" + request.node.callspec.id.replace("-", "_")

    def make():
        eng = RngEngine.from_config(cfg, layer, lanes_in=lanes_in, lanes_out=lanes_out, update_lanes=update_lanes)
        return to_verilog(eng, "rng_engine", emit_src=False)

    run = run_cocotb(
        verilog=make(),  # afresh: the build is keyed on the Verilog text
        toplevel="rng_engine",
        test_module="rng_tb",
        name=name,
        extra_env={"XNT_TB_PARAMS": json.dumps({**params, "sweeps": sweeps})},
        waves=bool(os.environ.get("XNT_WAVES")),
    )
    assert run.tests == 2
    measured = json.loads((run.build_dir / "cycles-full_rate.json").read_text())
    geo = RngGeometry.from_config(cfg, layer, lanes_in=lanes_in, lanes_out=lanes_out, update_lanes=update_lanes)
    assert measured["measured"] == measured["model"] == geo.cycles() == geo.sweep.visits + LATENCY


def test_jump_matrix_xors_start_at_the_state_register(tmp_path):
    """The state the jump-matrix XORs read is a register (``state``), chosen as the visit enters stage 1: the
    choice between the state RAM's word, the lane file's word and the previous chunk's state, and its selects'
    fan-out, sit in front of that register, not between it and the XORs (the SMALL design's routed worst path at
    two nextpnr seeds: ``use_lf`` -> the state multiplexers -> the XORs -> the lane file's write data). The state
    is held in copies (``state`` for the chain's matrix, ``state_c<i>`` for groups of the numbers'), each bit
    feeding at most about FANOUT_WEIGHT / 32 gates. Checked on the gate netlist with the flow's KEEP: every bit of
    every copy is a flip-flop's output and its loads are bounded. Planted: ``state`` as the combinational choice of
    registered words (the earlier form) fails it; every matrix read from ``state`` (one register, 108 loads a bit
    at update_lanes 8) fails it."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from yosys_nets import gate_netlist

    cfg = apply_overrides(load_config("mlp"), small_config(**{"hw.rng_block": 16, "hw.update_lanes": 8}))
    geo = RngGeometry.from_config(cfg, 0, lanes_in=8, lanes_out=4, update_lanes=8)
    mod = gate_netlist(RngEngine(geometries=[geo]), "rng", tmp_path, keep=True)
    q_bits = {b for c in mod["cells"].values() if "DFF" in c["type"] for b in c["connections"]["Q"]}
    names = ["state"] + [f"state_c{i}" for i in range(len(copy_groups(8)))]
    loads = Counter(b for c in mod["cells"].values() for p, bits in c["connections"].items()
                    if c["port_directions"][p] == "input" for b in bits)
    for name in names:
        bits = mod["netnames"][name]["bits"]
        assert len(bits) == 32 and len(set(bits)) == 32
        assert all(b in q_bits for b in bits), f"the XORs' {name} is logic, not a register"
        # each copy's bits feed its own matrices' XOR gates (two-input gates here) and its choice
        assert max(loads[b] for b in bits) <= FANOUT_WEIGHT // 32 + 16, f"{name}: {max(loads[b] for b in bits)}"


def test_the_state_copies_cover_the_numbers_once():
    """:func:`copy_groups` reads every number's matrix ``A^1 .. A^(U-1)`` from exactly one copy, in groups of at
    most :data:`FANOUT_WEIGHT` ones (or one matrix alone)."""
    for u in (1, 2, 4, 8, 16, 32):
        groups = copy_groups(u)
        assert [n for g in groups for n in g] == list(range(1, u))
        for g in groups:
            assert len(g) == 1 or sum(len(r) for n in g for r in jump_rows(n)) <= FANOUT_WEIGHT


def test_the_stages_never_stall(tmp_path):
    """The output's ``ready`` reaches only the output queue, its slice and the credit counter, through logic: not
    the state copies, the numbers' register, the visit counters or the stage registers (their clock enables
    were ``ready``'s fan-out, the generators' worst path in context on the ECP5 proxy: the queue's ready ->
    ``adv`` -> ``issue`` -> ``running``, 12.95 ns at one nextpnr seed). A visit is issued on a registered credit
    instead, and the cocotb sweeps under random backpressure above check that no beat is lost. Planted: the
    stages under the queue's ``i.ready`` again fails it."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from yosys_nets import gate_netlist

    cfg = apply_overrides(load_config("mlp"), small_config(**{"hw.rng_block": 16}))
    geo = RngGeometry.from_config(cfg, 0, lanes_in=8, lanes_out=4, update_lanes=4)
    mod = gate_netlist(RngEngine(geometries=[geo]), "rng", tmp_path)
    loads: dict[int, list] = {}
    for c in mod["cells"].values():
        for p, bits in c["connections"].items():
            if c["port_directions"][p] == "input":
                for b in bits:
                    if isinstance(b, int):
                        loads.setdefault(b, []).append(c)
    names = {}
    for name, n in mod["netnames"].items():
        for b in n["bits"]:
            if isinstance(b, int):
                names.setdefault(b, set()).add(name)
    # forward from u.ready through logic; the flip-flops (and memories) it reaches, by their output nets' names
    todo, seen, reached = list(mod["netnames"]["u__ready"]["bits"]), set(), set()
    while todo:
        b = todo.pop()
        for c in loads.get(b, []):
            if id(c) in seen:
                continue
            seen.add(id(c))
            outs = [x for p, bits in c["connections"].items() if c["port_directions"][p] == "output" for x in bits
                    if isinstance(x, int)]
            if "DFF" in c["type"] or c["type"].startswith("$mem"):
                reached.add(frozenset(n for x in outs for n in names.get(x, ())))
            else:
                todo += outs
    assert reached, "u.ready reaches no register: the netlist walk is broken"
    # a register of the engine's own (a name of the top level: the submodules' nets alias them) other than the
    # output port's and the credit's is a stage's
    own = [{n for n in r if "." not in n and "$" not in n} for r in reached]
    credit = {"queue_credit", "queue_has_credit"}
    wrong = [sorted(r) for r in own if r - credit and not any(n.startswith("u__") for n in r)]
    assert not wrong, wrong
