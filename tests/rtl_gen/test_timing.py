"""The timing tier (`make test-timing`): the register-to-register logic depth of the SMALL whole design in context
(configs/timing_small.toml, Yosys ``synth_ecp5``), measured with benchmarks/logic_depth.py, must stay within
:data:`DEPTH_LIMIT` LUT levels; a combinational path planted across two units must exceed it.

Calibration of the limit (docs/results/timing.md): see :data:`DEPTH_LIMIT`. The depth counts no routing,
so it cannot give an Fmax; it catches the structural regressions (a decode, a multiplexer or an arithmetic path
across a unit boundary without a register) that the routed figures showed to cost the most in context.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.timing

ROOT = Path(__file__).resolve().parents[2]

#: LUT levels (benchmarks/logic_depth.py's measure) allowed on any register-to-register path of the SMALL design.
#: Calibration (docs/results/timing.md, "The SMALL design in context"): the design before the timing discipline had
#: paths of 11.5 levels (1,497 endpoints at 9 or more) and routed at 48.0 MHz in context; with it the deepest path is
#: 9.4 levels and the design routes at 55.5 MHz (seed 1), routing 86 % of the worst path. No design has routed at
#: 80 MHz yet, so the limit is not the depth of one that did: it is a ratchet on today's depth plus ABC's mapping
#: noise, measured on four syntheses of nearly the same netlist: the same path inside the BN parameter unit came out
#: at 8.76, 9.36, 9.46 and 9.76 levels, and a top-level path at 8.2 to 10.0, with no change on the path itself. A
#: change that lets a path run through a unit boundary, the controller or a port multiplexer without a register
#: goes well over it (the planted path below is 16.3 levels, each of its halves 8.3).
DEPTH_LIMIT = 10.0

#: A bound on how many endpoints are deep, not only on the deepest: at 80 MHz (12.5 ns) and 1 to 2 ns of routing a
#: level, paths of 7 or more LUT levels are what fails in context, and there were thousands of them. A ratchet on
#: the count measured at each change (docs/results/timing.md, "The SMALL design in context": 1,294 at 36a4b13,
#: 977 with the registered buffer readers and the BN parameter unit's registered joints, 293 with the no-stall
#: divider, BN backward, po2 backward and generator stages as well), with room for ABC's mapping noise; lower it
#: as the count comes down. Planted: 36a4b13's netlist (1,294) fails it.
DEEP_LEVEL = 7
DEEP_ENDPOINT_LIMIT = 350


def _logic_depth():
    spec = importlib.util.spec_from_file_location("logic_depth", ROOT / "benchmarks" / "logic_depth.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _synth(verilog: str, top: str, name: str) -> dict:
    """``synth_ecp5`` netlist (the JSON) of ``verilog``, cached under build/ecp5 by the text (the folders of
    benchmarks/ecp5_fmax.py)."""
    from boards.ecp5 import ULX3S_85F, run_ecp5
    from rtl_gen.toolchain import build_root

    digest = hashlib.sha256(verilog.encode()).hexdigest()[:12]
    rep = run_ecp5(verilog, top, workdir=build_root() / "ecp5" / f"{name}-{digest}", board=ULX3S_85F,
                   bitstream=False, place=False, check_fit=False)
    return json.loads((rep.workdir / "design.json").read_text())


def _violations(rep: dict, limit: float) -> list[str]:
    return [f"{p['depth']} levels, {p['from_unit']} -> {p['to_unit']}: {p['start']} -> {p['end']} "
            f"via {' / '.join(p['via'][:8])}" for p in rep["pairs"] if p["depth"] > limit]


def test_small_design_in_context_stays_within_the_depth_limit():
    """The whole SMALL design: no register-to-register path deeper than DEPTH_LIMIT LUT levels."""
    from rtl_gen.top import Accelerator, SystemPlan
    from sim.config import load_config

    plan = SystemPlan(load_config(ROOT / "configs" / "timing_small.toml"))
    netlist = _synth(Accelerator(plan).verilog(), plan.name, plan.name)
    rep = _logic_depth().depth_report(netlist, plan.name, n=40)
    bad = _violations(rep, DEPTH_LIMIT)
    assert not bad, f"paths deeper than {DEPTH_LIMIT} LUT levels:\n" + "\n".join(bad)
    deep = deep_endpoints(rep)
    assert deep <= DEEP_ENDPOINT_LIMIT, (f"{deep} endpoints at {DEEP_LEVEL} or more LUT levels (at most "
                                         f"{DEEP_ENDPOINT_LIMIT}); the deepest pairs:\n" + "\n".join(
                                             _violations(rep, DEEP_LEVEL)[:10]))


def deep_endpoints(rep: dict) -> int:
    """Endpoints of a depth report at DEEP_LEVEL or more LUT levels (its histogram counts whole levels)."""
    return sum(n for level, n in rep["histogram"].items() if int(level) >= DEEP_LEVEL)


#: loads a reset or clock-enable net routed in the fabric may have in the SMALL design: the largest such nets are
#: the po2 backward engine's dW stage enable and clear (1,520 loads each); the units' reset, 12,965 loads on the
#: global buffer, had 14,443 as one fabric net before it (docs/architecture.md section 9).
FABRIC_CONTROL_LIMIT = 2000


def test_units_reset_is_on_a_global_buffer_and_no_fabric_control_net_is_larger():
    """The units' reset reaches its flip-flops through the global buffer (a DCCA on the ECP5), and no reset or
    clock-enable net in the fabric has more than FABRIC_CONTROL_LIMIT loads. Planted: the units under
    ResetInserter(rst | abort) as before (a 14,443-load fabric net in that netlist)."""
    from rtl_gen.top import Accelerator, SystemPlan
    from sim.config import load_config

    plan = SystemPlan(load_config(ROOT / "configs" / "timing_small.toml"))
    netlist = _synth(Accelerator(plan).verilog(), plan.name, plan.name)
    nets = _logic_depth().control_fanout(netlist, plan.name, n=20)
    glob = [c for c in nets if c["global"]]
    assert glob and glob[0]["pin"] == "LSR" and glob[0]["loads"] > FABRIC_CONTROL_LIMIT, nets[:3]
    big = [c for c in nets if not c["global"] and c["loads"] > FABRIC_CONTROL_LIMIT]
    assert not big, f"fabric reset / enable nets over {FABRIC_CONTROL_LIMIT} loads: {big}"


def _two_units(registered: bool):
    """Two units, each a chain of compare-and-select stages on registered inputs; the first unit's result reaches
    the second's input directly (the planted path: both chains in one register-to-register path) or through a
    register at the boundary (each chain alone)."""
    from amaranth import Module, Mux, Signal
    from amaranth.lib import wiring
    from amaranth.lib.wiring import In, Out

    stages = 2

    def chain(m, v, k):
        for s in range(stages):
            c = Signal(16, name=f"c{s}")
            m.d.sync += c.eq(k + s)
            nxt = Signal(16, name=f"v{s}")
            m.d.comb += nxt.eq(Mux(v > c, v ^ (c << 1), (v + c)[1:]))
            v = nxt
        return v

    class Unit(wiring.Component):
        """``first``: the input registered, then the chain, out unregistered; ``second``: the chain on its input,
        registered out."""

        def __init__(self, k: int, first: bool):
            self.k, self.first = k, first
            super().__init__({"i": In(16), "o": Out(16)})

        def elaborate(self, platform):
            m = Module()
            if self.first:
                x = Signal(16)
                m.d.sync += x.eq(self.i)
                m.d.comb += self.o.eq(chain(m, x, self.k))
            else:
                m.d.sync += self.o.eq(chain(m, self.i, self.k))
            return m

    class Pair(wiring.Component):
        def __init__(self):
            super().__init__({"i": In(16), "o": Out(16)})

        def elaborate(self, platform):
            m = Module()
            m.submodules.first = a = Unit(3, True)
            m.submodules.second = b = Unit(11, False)
            m.d.comb += [a.i.eq(self.i), self.o.eq(b.o)]
            if registered:
                boundary = Signal(16)
                m.d.sync += boundary.eq(a.o)
                m.d.comb += b.i.eq(boundary)
            else:
                m.d.comb += b.i.eq(a.o)
            return m

    return Pair()


@pytest.mark.parametrize("registered", [True, False], ids=["registered", "planted"])
def test_a_combinational_path_across_two_units_fails_the_limit(registered):
    """The guard's measure on a design with a path planted across two units: the same two chains exceed
    DEPTH_LIMIT when the first unit's result goes straight into the second, and stay within it with a register
    at the boundary."""
    from rtl_gen.toolchain import to_verilog

    top = "timing_pair"
    verilog = to_verilog(_two_units(registered), top, emit_src=False)
    rep = _logic_depth().depth_report(_synth(verilog, top, f"{top}-{int(registered)}"), top, n=10)
    bad = _violations(rep, DEPTH_LIMIT)
    if registered:
        assert not bad, bad
    else:
        assert bad and rep["pairs"][0]["from_unit"] == "first" and rep["pairs"][0]["to_unit"] == "second", rep


@pytest.mark.timing
def test_generated_verilog_does_not_depend_on_the_hash_seed():
    """The same configuration gives the same Verilog in every Python process: Python salts the hashes of strings
    per process, so iterating over a set of names orders the generated signals differently from run to run (a
    set of port names in PortMux once did). The place-and-route cache is keyed by the Verilog's text, so a
    second seed's run then missed the first's synthesis (and results could not be reproduced)."""
    import os
    import subprocess
    import sys

    code = ("import hashlib; from rtl_gen.top import Accelerator, SystemPlan; "
            "from sim.config import load_config; "
            "cfg = load_config('configs/timing_small.toml'); "
            "print(hashlib.sha256(Accelerator(SystemPlan(cfg)).verilog().encode()).hexdigest())")
    root = Path(__file__).resolve().parents[2]
    digests = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                             check=True)
        digests.add(out.stdout.strip())
    assert len(digests) == 1, digests


def _flop_sources(d, ld, end_cells) -> set[int]:
    """The net bits at which the register-to-register paths into ``end_cells``' endpoint pins start (flip-flop
    outputs and top-level inputs), through logic only (``d``: a benchmarks/logic_depth.py ``Depth``)."""
    todo = [b for name in end_cells for port in ld._endpoint_ports(d.cells[name])
            for b in d.cells[name]["connections"].get(port, []) if isinstance(b, int)]
    seen, starts = set(), set()
    while todo:
        b = todo.pop()
        if b in seen:
            continue
        seen.add(b)
        ins = d._inputs(b)
        if not ins:
            starts.add(b)
        todo.extend(i for i, _ in ins)
    return starts


def test_bn_forward_and_the_beat_writer_take_their_streams_from_slices():
    """In the SMALL design's netlist: the BN parameter unit's beta output register (``b_full``) is loaded by no
    logic that starts in the BN forward unit (BN forward's ``ready`` ends at the beta slice), and no register of
    the beat writer is loaded through logic from the AXI-Stream input's ``TVALID`` (the port ends at the input
    slice), and no register of BN backward's Q queues is loaded through logic that starts in the po2 unit (its
    ``ready`` ends at the Q slice). Planted: the beta stream wired straight from the parameter unit to BN forward,
    the writer's input straight from the port, and Q straight from BN backward to the po2 unit (each fails its
    part)."""
    from rtl_gen.top import Accelerator, SystemPlan
    from sim.config import load_config

    plan = SystemPlan(load_config(ROOT / "configs" / "timing_small.toml"))
    mod = _synth(Accelerator(plan).verilog(), plan.name, plan.name)["modules"][plan.name]
    ld = _logic_depth()
    d = ld.Depth(mod)
    cells = mod["cells"]
    bits = {b for name, net in mod["netnames"].items() if name.startswith("bn_param") and name.endswith(".b_full")
            for b in net["bits"]}
    b_full = [n for n, c in cells.items() if c["type"] == "TRELLIS_FF" and set(c["connections"]["Q"]) & bits]
    assert b_full
    # a start's unit is its driving cell's (net names can be a shorter alias of another unit's)
    from_bn_fwd = {d.driver[b][0] for b in _flop_sources(d, ld, b_full)
                   if b in d.driver and ld.unit_of(d.driver[b][0]).startswith("bn_fwd")}
    assert not from_bn_fwd, sorted(from_bn_fwd)[:5]
    writer = [n for n, c in cells.items() if c["type"] == "TRELLIS_FF" and ld.unit_of(n) == "writer"]
    assert writer
    tvalid = set(mod["ports"]["s_axis_tvalid"]["bits"])
    assert not tvalid & _flop_sources(d, ld, writer)
    queues = [n for n, c in cells.items() if c["type"] == "TRELLIS_FF" and ld.unit_of(n).startswith("bn_bwd")
              and ".q_queue" in n]
    assert queues
    from_po2 = {d.driver[b][0] for b in _flop_sources(d, ld, queues)
                if b in d.driver and ld.unit_of(d.driver[b][0]).startswith("po2_")}
    assert not from_po2, sorted(from_po2)[:5]
