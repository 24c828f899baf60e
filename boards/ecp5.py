"""ECP5 place and route: where the generated design closes timing on an FPGA with a fully open flow.

The accelerator targets the Zynq-7000 (Vivado), for which no open place-and-route exists here. The Lattice
ECP5 has one: YoWASP's ``yosys synth_ecp5``, ``nextpnr-ecp5`` and ``ecppack`` give real placement, routing, a
timing analysis and a bitstream. The figures are a **timing proxy for another family**: ECP5 LUT4 slices, 18 kbit
EBRs and 18x18 multipliers are slower and smaller than 7-series LUT6s, BRAM36s and DSP48E1s, so an ECP5 Fmax is a
pessimistic hint about the critical paths, never the Zynq's Fmax.

Flow (:func:`run_ecp5`, everything relative to one work folder, YoWASP sees no absolute ``/tmp`` paths)::

    yosys:    read_verilog design.v, then global_buffer.v with -overwrite (the units' reset buffer as a DCCA,
              boards/primitives.py); synth_ecp5 -top <top> (the flip-flops of wires marked ``keep`` kept apart:
              :data:`KEEP_REGISTERS`) with classic ABC (``abc -dress -lut 4:7``) in place of its
              ABC9 step (:func:`_synth_script`); write_json design.json; tee -o stats.json stat -json
    (the operand and product flip-flops of the MULT18s into their own registers, in design.json:
     boards/ecp5_dsp.py; stats.json counts the flip-flops before)
    (fit check on the synthesised cells: :func:`synth_resources`, refuses before place and route)
    nextpnr:  --85k --package CABGA381 --speed 6 --json design.json --freq <MHz> --report pnr.json
              --lpf pins.lpf --lpf-allow-unconstrained --timing-allow-fail --router router2 --textcfg design.config
              --detailed-timing-report (every net's routed delay to each of its sinks, in pnr.json:
              benchmarks/route_delays.py ranks them)
    ecppack:  design.config xnortrain.bit

- Classic ABC: Yosys 0.70's ``synth_ecp5`` (a wrapper of ``synth_lattice``) maps LUTs with ABC9, which stops
  on an internal assertion for the generated accelerator (``GetSize(conn.first) == GetSize(conn.second)`` after
  ``abc9_ops -reintegrate``, 4 minutes into the small 784-12-10 system); its ``-noabc9`` option is gone (accepted
  and ignored). The script runs ``synth_ecp5`` up to ``map_luts``, maps with classic ABC, and resumes at
  ``map_cells``.
- Pins: the accelerator's ports are AXI4-Lite and AXI-Stream, which go to the Zynq's PS7 inside the chip and have
  no counterpart on a ULX3S. The whole design is placed inside a stand-in for the PS (``run_ecp5(ps_shell=True)``,
  :func:`ps_shell_verilog`, as ``xnortrain generate --board ulx3s-85f`` does): every port bit comes from or goes
  to a flip-flop of a scan chain, and only the clock, the reset and two scan pins are pins. The LPF
  (:func:`lpf_text`) puts the clock on the board's 25 MHz oscillator pin and lets nextpnr place the others
  (``--lpf-allow-unconstrained``): the bitstream is real but only a placement study, it would not run anything on
  the board. Without the shell (``benchmarks/ecp5_fmax.py --pins``) every port bit takes a pin of its own, 185 for
  the paper's family of 205 user I/O pins of the CABGA381 package, spread around the die, and they pull the
  host-facing logic apart: the SMALL design at the same commit and seed routed at 56.4 MHz with 1,887 endpoints
  later than 12.5 ns with pins, 60.6 MHz with 163 inside the shell (docs/results/timing.md).
- Units (:func:`run_ecp5` with ``out_of_context=True``): nextpnr's ``--out-of-context`` inserts no I/O buffers,
  so a unit with hundreds of port bits places without pins. Its ports are unclocked: the Fmax covers paths from
  register to register inside the unit, as when every unit boundary is registered.
- ``--timing-allow-fail``: the report is what we want, also when the design misses the requested clock; the
  result says ``timing_met`` and the Fmax.
- ``--router router2`` (:data:`NEXTPNR_ROUTER`, ``run_ecp5(router=...)``): nextpnr-ecp5's default ``router1``
  rips up and reroutes one net at a time; on the whole accelerator in context (the SMALL design of
  ``configs/timing_small.toml``: about 184,000 overused wires at its start) it had not finished after 40 minutes.
  ``router2`` routes every net at once with negotiated congestion (PathFinder style); the run times and Fmax of
  both are in docs/results/timing.md. Units out of context route with either in minutes.

Results are cached per work folder by a key over the Verilog, top, flow options and tool versions.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock

from boards.devices import LFE5U_85F, Device
from boards.ecp5_dsp import absorb_mult_registers
from boards.primitives import global_buffer_verilog

__all__ = [
    "BOARDS",
    "NEXTPNR_ROUTER",
    "ROUTERS",
    "ECP5_RESOURCES",
    "Ecp5Board",
    "Ecp5Error",
    "Ecp5Report",
    "check_ecp5_fit",
    "get_ecp5_board",
    "lpf_text",
    "parse_nextpnr_report",
    "run_ecp5",
    "run_ecp5_units",
    "seed_folder",
    "synth_resources",
]


class Ecp5Error(RuntimeError):
    """A tool of the ECP5 flow failed; the message names its log."""


@dataclass(frozen=True)
class Ecp5Board:
    """An ECP5 board: the die, the nextpnr device options and the clock pin."""

    name: str
    title: str
    device: Device
    nextpnr_device: str
    """nextpnr-ecp5's die option (``--85k``)."""
    package: str
    speed: int
    io_pins: int
    """User I/O pins of the package (nextpnr's ``TRELLIS_IO`` availability counts every pad of the die, 365 on
    the 85k, bonded or not; the report gives the package's count instead)."""
    clock_pin: str
    clock_mhz: float
    """The board oscillator on :attr:`clock_pin` (the accelerator's own clock is the configured one)."""

    @property
    def limits(self) -> dict[str, int]:
        """The fit limits: the die's LUT4/FF/EBR/MULT18 and the package's I/O pins."""
        return {**{k: self.device.limits[k] for k in ("LUT4", "FF", "EBR", "MULT18")}, "IO": self.io_pins}


ULX3S_85F = Ecp5Board(
    name="ulx3s-85f",
    title="ULX3S (LFE5U-85F-6BG381C)",
    device=LFE5U_85F,
    nextpnr_device="--85k",
    package="CABGA381",
    speed=6,
    io_pins=LFE5U_85F.packages["CABGA381"],
    clock_pin="G2",  # clk_25mhz on the ULX3S (its public constraint file)
    clock_mhz=25.0,
)

BOARDS: Mapping[str, Ecp5Board] = {b.name: b for b in (ULX3S_85F,)}


def get_ecp5_board(name: str | Ecp5Board) -> Ecp5Board:
    if isinstance(name, Ecp5Board):
        return name
    try:
        return BOARDS[str(name).lower()]
    except KeyError:
        raise ValueError(f"unknown ECP5 board {name!r}; known: {', '.join(BOARDS)}") from None


#: Report resource -> nextpnr ``utilization`` cell type.
ECP5_RESOURCES: Mapping[str, str] = {
    "LUT4": "TRELLIS_COMB",
    "FF": "TRELLIS_FF",
    "EBR": "DP16KD",
    "MULT18": "MULT18X18D",
    "IO": "TRELLIS_IO",
}

#: Yosys ``synth_ecp5`` cells -> report resources, for the fit check before place and route. A CCU2C (carry
#: chain) is two LUT4 halves of one slice; a TRELLIS_DPR16X4 (16x4 distributed RAM) takes the LUT4s of two
#: slices plus the write port of a third (nextpnr packs it as 6 TRELLIS_COMB).
_SYNTH_CELLS: Mapping[str, tuple[str, float]] = {
    "LUT4": ("LUT4", 1),
    "CCU2C": ("LUT4", 2),
    "TRELLIS_DPR16X4": ("LUT4", 6),
    "PFUMX": ("PFUMX", 1),
    "L6MUX21": ("L6MUX21", 1),
    "TRELLIS_FF": ("FF", 1),
    "DP16KD": ("EBR", 1),
    "PDPW16KD": ("EBR", 1),
    "MULT18X18D": ("MULT18", 1),
    "ALU54B": ("ALU54", 1),
}


def synth_resources(cells: Mapping[str, int]) -> dict[str, float]:
    """Resources of a ``synth_ecp5`` netlist from its cell counts (``stat -json``'s ``num_cells_by_type``).
    ``IO`` is not counted here (see :func:`port_bits`); unknown cells go under ``other``."""
    out: dict[str, float] = {"LUT4": 0, "FF": 0, "EBR": 0, "MULT18": 0}
    for cell, n in cells.items():
        name, weight = _SYNTH_CELLS.get(cell.removeprefix("\\"), ("other", 1))
        out[name] = out.get(name, 0) + weight * n
    return out


def top_ports(verilog: str, top: str) -> list[tuple[str, str, int]]:
    """``(direction, name, width)`` of every port of module ``top``, in declaration order."""
    block = re.search(rf"^module \\?{re.escape(top)}\b.*?^endmodule", verilog, re.M | re.S)
    if block is None:
        raise ValueError(f"top module {top!r} is not defined in the Verilog text")
    out = []
    for d, rng, name in re.findall(r"^\s*(input|output|inout)\s+(?:wire\s+|reg\s+|signed\s+)*(\[[^\]]+\])?\s*"
                                   r"(\\?[^\s;]+)\s*;", block.group(0), re.M):
        width = 1
        if rng:
            hi, lo = (int(v) for v in rng.strip("[]").split(":"))
            width = abs(hi - lo) + 1
        out.append((d, name, width))
    return out


def port_bits(verilog: str, top: str) -> int:
    """The number of port bits of module ``top`` (each needs a pin when placed in context)."""
    return sum(width for _d, _name, width in top_ports(verilog, top))


#: the instance name of the design inside :func:`ps_shell_verilog` (its cells are named ``core.<unit>...``)
PS_CORE = "core"


def ps_shell_verilog(verilog: str, top: str, *, clock: str = "clk", reset: str = "rst") -> tuple[str, str]:
    """A stand-in for the Zynq's processing system around module ``top``: ``(verilog, shell_top)``.

    On the Zynq the accelerator's AXI ports go to the PS7 inside the chip, at one place on the die, and the PS
    side of each is a register. Placed in context on the ECP5 with a pin per port bit (185 for the MLP family),
    nextpnr spreads the port bits over the whole package and pulls the host-facing logic apart towards them. The
    shell keeps only ``clock``, ``reset`` and two scan pins: every input bit of ``top`` comes from a flip-flop of
    an input shift chain, and every output bit is folded (XOR) into a flip-flop of an output chain, so no port bit
    is constant or unobserved and each flip-flop can sit next to the logic it serves. Paths from and to those
    flip-flops are register to register in the clock domain: timed, as the PS7's ports are in Vivado."""
    ports = top_ports(verilog, top)
    names = {n for _d, n, _w in ports}
    for need in (clock, reset):
        if need not in names:
            raise ValueError(f"top module {top!r} has no port {need!r}")
    ins = [(n, w) for d, n, w in ports if d == "input" and n not in (clock, reset)]
    outs = [(n, w) for d, n, w in ports if d == "output"]
    if any(d == "inout" for d, _n, _w in ports):
        raise ValueError(f"top module {top!r} has inout ports: the PS stand-in takes inputs and outputs only")
    n_in = max(sum(w for _n, w in ins), 1)
    n_out = max(sum(w for _n, w in outs), 1)
    shell = f"{top}_ps_shell"
    lines = [f"module {shell}({clock}, {reset}, scan_in, scan_out);", f"  input {clock};", f"  input {reset};",
             "  input scan_in;", "  output scan_out;",
             f"  reg [{n_in - 1}:0] in_chain;", f"  reg [{n_out - 1}:0] out_chain;",
             f"  wire [{n_out - 1}:0] out_bits;"]
    conns, lo = [f".{clock}({clock})", f".{reset}({reset})"], 0
    for n, w in ins:
        conns.append(f".{n}(in_chain[{lo + w - 1}:{lo}])")
        lo += w
    lo = 0
    for n, w in outs:
        conns.append(f".{n}(out_bits[{lo + w - 1}:{lo}])")
        lo += w
    if not outs:
        lines.append("  assign out_bits = 1'b0;")
    shift_in = "scan_in" if n_in == 1 else f"{{in_chain[{n_in - 2}:0], scan_in}}"
    shift_out = "1'b0" if n_out == 1 else f"{{out_chain[{n_out - 2}:0], 1'b0}}"
    lines += [f"  {top} {PS_CORE}(" + ", ".join(conns) + ");",
              f"  always @(posedge {clock}) in_chain <= {shift_in};",
              f"  always @(posedge {clock}) out_chain <= {shift_out} ^ out_bits;",
              f"  assign scan_out = out_chain[{n_out - 1}];", "endmodule", ""]
    return verilog.rstrip("\n") + "\n\n" + "\n".join(lines), shell


def check_ecp5_fit(resources: Mapping[str, float], limits: Mapping[str, int], *, what: str) -> list[str]:
    """One line per resource of ``limits`` that ``resources`` exceeds, e.g.
    ``"EBR: needs 290 of 208 (+82, 139 %)"``; empty when it fits."""
    out = []
    for name, limit in limits.items():
        used = resources.get(name, 0)
        if used > limit:
            out.append(f"{name}: needs {_num(used)} of {_num(limit)} (+{_num(used - limit)}, "
                       f"{100 * used / limit:.0f} %)")
    return out


def lpf_text(board: Ecp5Board, clock_port: str = "clk") -> str:
    """The pin constraints: the clock on the board oscillator's pin; every other port is left to nextpnr."""
    return "\n".join([
        "# xnortrain: ECP5 timing proxy. Only the clock has a pin; nextpnr places the other ports",
        "# (AXI4-Lite and AXI-Stream, which have no counterpart on this board) on free pins.",
        f'LOCATE COMP "{clock_port}" SITE "{board.clock_pin}";',
        f'IOBUF PORT "{clock_port}" IO_TYPE=LVCMOS33;',
        "",
    ])


@dataclass
class Ecp5Report:
    """Outcome of :func:`run_ecp5`."""

    top: str
    board: Ecp5Board
    freq_mhz: float
    """The requested clock (nextpnr ``--freq``)."""
    fmax_mhz: float | None
    """The achieved Fmax of the clock (the slowest clock if there are several)."""
    fmax: dict[str, dict] = field(default_factory=dict)
    """nextpnr's per-clock ``{"achieved": MHz, "constraint": MHz}``."""
    utilisation: dict[str, dict] = field(default_factory=dict)
    """``LUT4``/``FF``/``EBR``/``MULT18``/``IO`` -> ``{"used", "available"}`` after place and route."""
    synth: dict[str, float] = field(default_factory=dict)
    """Resources from the synthesised netlist (:func:`synth_resources`), plus ``IO`` = port bits."""
    critical_path: dict | None = None
    """The slowest clock's critical path (:func:`_summarise_path`)."""
    out_of_context: bool = False
    bitstream: Path | None = None
    workdir: Path | None = None
    elapsed_s: dict[str, float] = field(default_factory=dict)
    cached: bool = False
    versions: dict[str, str] = field(default_factory=dict)
    seed: int | None = None
    """nextpnr's ``--seed`` (None: not placed)."""
    router: str | None = None
    """nextpnr's ``--router`` (None: not placed)."""

    @property
    def timing_met(self) -> bool:
        return self.fmax_mhz is not None and self.fmax_mhz >= self.freq_mhz

    def to_dict(self) -> dict:
        return {
            "board": self.board.name,
            "device": f"{self.board.device.name} {self.board.package} speed {self.board.speed}",
            "top": self.top,
            "freq_mhz": self.freq_mhz,
            "fmax_mhz": None if self.fmax_mhz is None else round(self.fmax_mhz, 2),
            "timing_met": self.timing_met,
            "fmax": self.fmax,
            "utilisation": self.utilisation,
            "synth_resources": self.synth,
            "critical_path": self.critical_path,
            "out_of_context": self.out_of_context,
            "bitstream": None if self.bitstream is None else str(self.bitstream),
            "workdir": None if self.workdir is None else str(self.workdir),
            "elapsed_s": self.elapsed_s,
            "cached": self.cached,
            "versions": self.versions,
            "seed": self.seed,
            "router": self.router,
            "note": "timing proxy on a Lattice ECP5 (another family), not the Zynq-7000's Fmax",
        }

    def format_text(self) -> str:
        head = (f"{self.top} on the {self.board.title} (yosys synth_ecp5 + nextpnr-ecp5"
                + (", out of context" if self.out_of_context else "") + "; a timing proxy for another family, "
                "not the Zynq)")
        fm = "n/a" if self.fmax_mhz is None else f"{self.fmax_mhz:.1f} MHz"
        lines = [head, f"  Fmax {fm} (requested {self.freq_mhz:g} MHz: "
                 + ("met" if self.timing_met else "NOT met") + ")",
                 f"  {'resource':<8} {'used':>8} {'avail':>8} {'%':>6}"]
        for name, u in self.utilisation.items():
            pct = 100 * u["used"] / u["available"] if u["available"] else 0.0
            lines.append(f"  {name:<8} {u['used']:>8,} {u['available']:>8,} {pct:>5.1f}%")
        if self.critical_path:
            cp = self.critical_path
            lines.append(f"  critical path {cp['delay_ns']:.2f} ns ({cp['logic_ns']:.2f} logic, {cp['routing_ns']:.2f} "
                         f"routing, {cp['levels']} cells): {cp['from']} -> {cp['to']}")
        if self.bitstream is not None:
            lines.append(f"  bitstream: {self.bitstream}")
        if self.workdir is not None:
            lines.append(f"  logs: {self.workdir}")
        return "\n".join(lines)


def parse_nextpnr_report(data: Mapping, *, io_pins: int | None = None) -> tuple[dict, dict, dict | None]:
    """``(fmax, utilisation, critical_path)`` from nextpnr's ``--report`` JSON.

    ``fmax``: clock -> ``{"achieved", "constraint"}`` (MHz); ``utilisation``: :data:`ECP5_RESOURCES` names ->
    ``{"used", "available"}``; ``critical_path``: the slowest clock's path summarised by :func:`_summarise_path`
    (None when nextpnr reports none, e.g. a design without registers). ``io_pins``: the package's user I/O, which
    replaces nextpnr's ``TRELLIS_IO`` availability (every pad of the die)."""
    fmax = {str(k): {"achieved": float(v["achieved"]), "constraint": float(v["constraint"])}
            for k, v in data.get("fmax", {}).items()}
    util_raw = data.get("utilization", {})
    util = {}
    for name, cell in ECP5_RESOURCES.items():
        u = util_raw.get(cell, {"used": 0, "available": 0})
        util[name] = {"used": int(u["used"]), "available": int(u["available"])}
    if io_pins is not None:
        util["IO"]["available"] = int(io_pins)
    slowest = min(fmax, key=lambda k: fmax[k]["achieved"]) if fmax else None
    paths = data.get("critical_paths", [])
    chosen = None
    for p in paths:
        if slowest is not None and _clock_name(p.get("from")) == _clock_name(slowest) \
                and _clock_name(p.get("to")) == _clock_name(slowest):
            chosen = p
            break
    if chosen is None and paths:
        chosen = max(paths, key=lambda p: sum(float(s.get("delay", 0)) for s in p.get("path", [])))
    return fmax, util, (None if chosen is None else _summarise_path(chosen))


def _clock_name(name) -> str:
    """``posedge $glbnet$clk$TRELLIS_IO_IN`` (a path's clock) and ``$glbnet$clk$TRELLIS_IO_IN`` (an ``fmax`` key)
    -> ``clk``."""
    text = str(name or "").split(" ")[-1].removeprefix("$glbnet$")
    return text.split("$")[0] or text


def _summarise_path(path: Mapping) -> dict:
    """A critical path as ``from``/``to`` (cell.port), total, logic and routing delay (ns), the number of cells,
    and the cells along it (``steps``: ``{"type", "cell", "port", "delay_ns", "net"}``)."""
    steps = path.get("path", [])
    logic = sum(float(s.get("delay", 0)) for s in steps if s.get("type") != "routing")
    routing = sum(float(s.get("delay", 0)) for s in steps if s.get("type") == "routing")
    summary = []
    for s in steps:
        to = s.get("to", {})
        summary.append({"type": s.get("type"), "cell": to.get("cell"), "port": to.get("port"),
                        "delay_ns": round(float(s.get("delay", 0)), 3), "net": s.get("net")})
    first = steps[0].get("from", {}) if steps else {}
    last = steps[-1].get("to", {}) if steps else {}
    return {
        "clock_from": path.get("from"),
        "clock_to": path.get("to"),
        "from": f"{first.get('cell')}.{first.get('port')}",
        "to": f"{last.get('cell')}.{last.get('port')}",
        "delay_ns": round(logic + routing, 3),
        "logic_ns": round(logic, 3),
        "routing_ns": round(routing, 3),
        "levels": sum(1 for s in steps if s.get("type") == "logic"),
        "steps": summary,
    }


_FLOW_VERSION = 6  # 3: the global buffer read over the design (boards/primitives.py); 4: KEEP_REGISTERS and
#: the detailed timing report; 5, 6: the MULT18s' own registers (boards/ecp5_dsp.py; 6: only where nextpnr times them)

#: nextpnr-ecp5's router (``--router``): ``router2``, see the module docstring for why not nextpnr's default
NEXTPNR_ROUTER = "router2"
ROUTERS = ("router1", "router2")


def run_ecp5(verilog: str, top: str, *, workdir: str | os.PathLike, board: str | Ecp5Board = "ulx3s-85f",
             freq_mhz: float = 100.0, out_of_context: bool = False, bitstream: bool = True, check_fit: bool = True,
             seed: int = 1, place: bool = True, router: str = NEXTPNR_ROUTER, ps_shell: bool = False,
             log=None) -> Ecp5Report:
    """Synthesise, place and route ``verilog`` (top module ``top``) for ``board`` in ``workdir``; with
    ``bitstream`` (not with ``out_of_context``) also pack ``workdir/xnortrain.bit``.

    With ``check_fit`` the synthesised netlist is compared with the die and the package before place and route:
    :class:`rtl_gen.synth.DoesNotFitError` names every resource over the limit (LUT4, FF, EBR, MULT18, IO).
    ``place=False`` stops after synthesis and the fit check (a report without Fmax: ``synth`` only). ``router``:
    nextpnr's ``--router`` (:data:`ROUTERS`; default :data:`NEXTPNR_ROUTER`). ``ps_shell`` (in context only):
    synthesise and place ``top`` inside :func:`ps_shell_verilog`'s stand-in for the Zynq's PS, with four pins
    instead of one per port bit; its cells are then named ``core.<unit>...`` (:data:`PS_CORE`)."""
    from rtl_gen.synth import DoesNotFitError, memory_init_files
    from rtl_gen.toolchain import run_yowasp

    brd = get_ecp5_board(board)
    if not 1.0 <= float(freq_mhz) <= 500.0:
        raise ValueError(f"freq_mhz {freq_mhz!r}: expected 1 to 500 MHz")
    if out_of_context and bitstream:
        raise ValueError("an out-of-context design has no I/O: no bitstream (bitstream=False)")
    if router not in ROUTERS:
        raise ValueError(f"router {router!r}: expected one of {', '.join(ROUTERS)}")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$]*", top):
        raise ValueError(f"top must be a Verilog identifier, not {top!r}")
    if ps_shell and out_of_context:
        raise ValueError("ps_shell places the design in context: not with out_of_context")
    n_ports = port_bits(verilog, top)
    synth_top = top
    if ps_shell:
        verilog, synth_top = ps_shell_verilog(verilog, top)
        n_ports = port_bits(verilog, synth_top)
    say = log or (lambda _msg: None)
    versions = {t: importlib.metadata.version(f"yowasp-{t}") for t in ("yosys", "nextpnr-ecp5")}
    folder = Path(workdir).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    # one run at a time in a work folder: a second (another process, a parallel test) waits, then finds the
    # first one's results in the cache instead of reading a netlist that is still being written
    with FileLock(str(folder / "run.lock")):
        synth_key = _synth_key(verilog, synth_top, versions["yosys"])
        pnr_key = {**synth_key, "nextpnr": versions["nextpnr-ecp5"], "board": brd.name, "freq": float(freq_mhz),
                   "ooc": out_of_context, "seed": seed, "bit": bitstream, "router": router}
        meta = _read_json(folder / "meta.json") or {}
        elapsed = dict(meta.get("elapsed_s", {}))
        cached = True

        if meta.get("synth_key") != synth_key or not (folder / "design.json").is_file():
            cached = False
            for name in ("design.json", "stats.json", "pnr.json", "design.config", "xnortrain.bit", "meta.json"):
                (folder / name).unlink(missing_ok=True)
            # large initial contents as $readmemh files, as the Xilinx flow does (rtl_gen.synth.memory_init_files)
            text, init_files = memory_init_files(verilog)
            for name, content in init_files.items():
                (folder / name).write_text(content)
            (folder / "design.v").write_text(text)
            (folder / "global_buffer.v").write_text(global_buffer_verilog("ecp5"))
            (folder / "synth.ys").write_text(_synth_script(synth_top))
            say(f"  yosys synth_ecp5 {top} ...")
            t0 = time.perf_counter()
            res = run_yowasp("yosys", ["-q", "-l", "yosys.log", "-s", "synth.ys"], cwd=folder, check=False)
            elapsed = {"synth": round(time.perf_counter() - t0, 1)}
            if res.returncode != 0 or not (folder / "design.json").is_file():
                raise Ecp5Error(f"yosys synth_ecp5 of {top} failed (exit {res.returncode}); "
                                f"log: {folder / 'yosys.log'}\n" + "\n".join(_tail(folder / "yosys.log")))
            # the multipliers' operand and product flip-flops into the MULT18s' own registers (boards/ecp5_dsp.py)
            netlist = json.loads((folder / "design.json").read_text())
            mult_regs = None
            if synth_top in netlist.get("modules", {}):  # (a test's stand-in for Yosys writes no module)
                mult_regs = absorb_mult_registers(netlist["modules"][synth_top])
                (folder / "design.json").write_text(json.dumps(netlist))
            meta = {"synth_key": synth_key, "elapsed_s": elapsed, "mult_registers": mult_regs}
            (folder / "meta.json").write_text(json.dumps(meta, indent=1))

        stats = _read_json(folder / "stats.json") or {}
        cells = stats.get("design", {}).get("num_cells_by_type") or {}
        synth = synth_resources(cells)
        synth["IO"] = 0 if out_of_context else n_ports
        if check_fit:
            problems = check_ecp5_fit(synth, brd.limits, what=top)
            if problems:
                err = DoesNotFitError(f"{top} does not fit the {brd.device.name} ({brd.package}) of the {brd.title}: "
                                      + "; ".join(problems))
                err.overflows = problems
                err.resources = synth
                raise err

        if not place:
            return Ecp5Report(top=top, board=brd, freq_mhz=float(freq_mhz), fmax_mhz=None, synth=synth,
                              out_of_context=out_of_context, workdir=folder, elapsed_s=elapsed, cached=cached,
                              versions=versions)
        if meta.get("pnr_key") != pnr_key or not (folder / "pnr.json").is_file():
            cached = False
            (folder / "pnr.json").unlink(missing_ok=True)
            (folder / "xnortrain.bit").unlink(missing_ok=True)
            args = [brd.nextpnr_device, "--package", brd.package, "--speed", str(brd.speed), "--json", "design.json",
                    "--freq", f"{float(freq_mhz):g}", "--report", "pnr.json", "--detailed-timing-report",
                    "--timing-allow-fail",
                    "--seed", str(seed), "--log", "nextpnr.log", "-q", "--router", router]
            if out_of_context:
                args.append("--out-of-context")
            else:
                (folder / "pins.lpf").write_text(lpf_text(brd))
                args += ["--lpf", "pins.lpf", "--lpf-allow-unconstrained"]
            if bitstream:
                args += ["--textcfg", "design.config"]
            say(f"  nextpnr-ecp5 {top} at {float(freq_mhz):g} MHz ...")
            t0 = time.perf_counter()
            res = run_yowasp("nextpnr-ecp5", args, cwd=folder, check=False)
            elapsed["pnr"] = round(time.perf_counter() - t0, 1)
            if res.returncode != 0 or not (folder / "pnr.json").is_file():
                over = _log_overflows(_tail(folder / "nextpnr.log", 400), brd)
                if over:
                    err = DoesNotFitError(f"{top} does not fit the {brd.device.name} ({brd.package}) of the "
                                          f"{brd.title}: " + "; ".join(over) + " (nextpnr-ecp5)")
                    err.overflows, err.resources = over, synth
                    raise err
                raise Ecp5Error(f"nextpnr-ecp5 of {top} failed (exit {res.returncode}); log: {folder / 'nextpnr.log'}\n"
                                + "\n".join(_tail(folder / "nextpnr.log") or [res.stderr.strip()]))
            if bitstream:
                say("  ecppack ...")
                t0 = time.perf_counter()
                res = run_yowasp("ecppack", ["--input", "design.config", "--bit", "xnortrain.bit"], cwd=folder,
                                 check=False)
                elapsed["pack"] = round(time.perf_counter() - t0, 1)
                if res.returncode != 0 or not (folder / "xnortrain.bit").is_file():
                    raise Ecp5Error(f"ecppack of {top} failed (exit {res.returncode}): {res.stderr.strip()}")
            meta.update({"pnr_key": pnr_key, "elapsed_s": elapsed})
            (folder / "meta.json").write_text(json.dumps(meta, indent=1))

        fmax, util, crit = parse_nextpnr_report(_read_json(folder / "pnr.json") or {}, io_pins=brd.io_pins)
        slowest = min((v["achieved"] for v in fmax.values()), default=None)
        return Ecp5Report(top=top, board=brd, freq_mhz=float(freq_mhz), fmax_mhz=slowest, fmax=fmax, utilisation=util,
                          synth=synth, critical_path=crit, out_of_context=out_of_context,
                          bitstream=(folder / "xnortrain.bit") if bitstream else None, workdir=folder,
                          elapsed_s=elapsed, cached=cached, versions=versions, seed=seed, router=router)


def seed_folder(base: str | os.PathLike, seed: int) -> Path:
    """The work folder of nextpnr seed ``seed`` of one design: ``base`` for seed 1, else ``base-seedN``, started
    from ``base``'s synthesis when it is there (same Verilog, same netlist: only place and route run again)."""
    import shutil

    base = Path(base)
    if seed == 1:
        return base
    folder = base.with_name(f"{base.name}-seed{seed}")
    if not (folder / "design.json").is_file() and (base / "design.json").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        meta = json.loads((base / "meta.json").read_text())
        for name in ("design.json", "stats.json", "design.v"):
            if (base / name).is_file():
                shutil.copyfile(base / name, folder / name)
        (folder / "meta.json").write_text(json.dumps({k: meta[k] for k in ("synth_key", "elapsed_s") if k in meta}))
    return folder


_UTIL_LINE = re.compile(r"^Info:\s+(\w+):\s+(\d+)/\s*(\d+)\s+\d+%")


def _log_overflows(lines: list[str], board: Ecp5Board) -> list[str]:
    """Fit messages from nextpnr's "Device utilisation" lines (``Info:  TRELLIS_COMB: 90000/ 83640 107%``) for
    every resource over what the device has (nextpnr stops then, without a report)."""
    names = {cell: name for name, cell in ECP5_RESOURCES.items()}
    used = {}
    for line in lines:
        if m := _UTIL_LINE.match(line):
            used[m[1]] = (int(m[2]), int(m[3]))
    res = {names.get(k, k): u for k, (u, _a) in used.items()}
    limits = {**{names.get(k, k): a for k, (_u, a) in used.items()}, **board.limits}
    return check_ecp5_fit(res, {k: v for k, v in limits.items() if k in res}, what="")


#: Yosys merges flip-flops of equal inputs (``opt_merge``) even when the wire they drive is marked ``keep``: this
#: copies the mark of a wire onto the flip-flop that drives it (after ``proc``), so that the copies of a control
#: register made by ``rtl_gen.streams.replicas`` stay apart, as Vivado keeps them.
KEEP_REGISTERS = "setattr -set keep 1 w:* a:keep %i %ci1:+$dff,$adff[Q] t:$dff t:$adff %u %i"


def _synth_script(top: str) -> str:
    """``synth_ecp5`` with its LUT mapping done by classic ABC instead of ABC9 (see the module docstring)."""
    return "\n".join([
        "read_verilog design.v",
        # the units' reset on a clock network: a DCCA in place of the design's pass-through (boards/primitives.py)
        "read_verilog -overwrite global_buffer.v",
        f"synth_ecp5 -top {top} -run begin:coarse",
        "proc",
        KEEP_REGISTERS,
        f"synth_ecp5 -top {top} -run coarse:map_luts",
        "check -latchonly -assert",
        "techmap -map +/lattice/latches_map.v",
        "abc -dress -lut 4:7",  # LUT4s, and up to LUT7 through the slices' PFUMX/L6MUX21 (widelut)
        "clean",
        f"synth_ecp5 -top {top} -run map_cells: -json design.json",
        "tee -o stats.json stat -json",
        "",
    ])


def _synth_key(verilog: str, top: str, yosys_version: str) -> dict:
    """What a cached ``synth_ecp5`` result in a work folder depends on."""
    return {"flow": _FLOW_VERSION, "yosys": yosys_version, "top": top,
            "verilog": hashlib.sha256(verilog.encode()).hexdigest()}


def run_ecp5_units(verilog: str, top: str, *, board: str | Ecp5Board = "ulx3s-85f", freq_mhz: float = 100.0,
                   only=None, log=None, jobs: int = 1):
    """Yield ``(name, Ecp5Report)`` for every direct submodule of ``top`` (the parts of
    :func:`rtl_gen.synth.part_texts`; ``only`` a predicate on their names) placed and routed out of context, each
    in its own cached folder under ``build_root()/ecp5/units``. ``jobs`` > 1 runs that many units at once
    (threads, each waiting on its own Yosys and nextpnr processes; ``log`` then gets one line per finished unit
    instead of each unit's steps); the units still come in their own order."""
    from concurrent.futures import ThreadPoolExecutor

    from rtl_gen.synth import part_texts
    from rtl_gen.toolchain import build_root

    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a whole number >= 1, not {jobs!r}")
    parts = part_texts(verilog, top, only=only, include_top=False)

    def unit(name, alias, text, unit_log):
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        rep = run_ecp5(text, alias, workdir=build_root() / "ecp5" / "units" / f"{alias}-{digest}", board=board,
                       freq_mhz=freq_mhz, out_of_context=True, bitstream=False, check_fit=False, log=unit_log)
        rep.top = name
        return rep

    if jobs == 1:
        for name, alias, text, _boxes in parts:
            if log is not None:
                log(f"  unit {name}:")
            yield name, unit(name, alias, text, log)
        return
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="ecp5") as pool:
        futures = [(name, pool.submit(unit, name, alias, text, None)) for name, alias, text, _boxes in parts]
        try:
            for name, future in futures:
                rep = future.result()
                if log is not None:
                    log(f"  unit {name}: done")
                yield name, rep
        finally:
            for _name, future in futures:
                future.cancel()


def _num(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:,.1f}"


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _tail(path: Path, n: int = 15) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return []
