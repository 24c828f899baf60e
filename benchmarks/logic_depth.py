"""Register-to-register logic depth of a whole design in context, from its ECP5 netlist: which unit boundaries the
deepest paths cross, in seconds instead of the hour a whole-design place and route takes.

Input: the ``design.json`` that ``synth_ecp5`` writes (``benchmarks/ecp5_fmax.py --top-only --synth-only``, or any
run's cache folder under ``build/ecp5``). Every path starts at a flip-flop's output, a block RAM's or multiplier's
output or a top-level input, and ends at a flip-flop's data, clock-enable or reset input, or at a block RAM's or
distributed RAM's address, data or write-enable input. Its depth counts the cells in between in LUT levels: a LUT4
is 1, a wide-function multiplexer (``PFUMX``, ``L6MUX21``) 0.3, a carry cell (``CCU2C``) 1 from its LUT inputs and
0.08 per cell of a carry chain, a distributed RAM read 1, an unregistered multiplier 4; a block RAM's output
starts at 1.5, a flip-flop's at 0.5. Routing is not counted, and in a congested design it is most of the delay
(the 784-12-10 design at edc50eb: deepest path 11.8 levels, placer estimate 26 ns), so the depth ranks paths; it
does not give an Fmax.

The same measure reads a 7-series netlist of ``synth_xilinx`` (``benchmarks/xc7z020_glue.py``): a LUT1..LUT6 is 1
level, ``MUXF7`` / ``MUXF8`` 0.3, a ``CARRY4`` 1 from its ``S`` / ``DI`` inputs and 0.1 along the chain
(``CI`` -> ``CO``; 0.3 to a sum ``O``), a distributed RAM or shift register read (address to output) 1, an
unregistered ``DSP48E1`` 4; paths start at ``FD*`` (0.5) and ``RAMB18E1`` / ``RAMB36E1`` (1.5) outputs and
end at their data, enable and reset inputs. Cells of the types given as ``boxes`` (units kept as black boxes)
are registered boundaries: their outputs start at 0.5, their inputs are endpoints.

Output: the histogram of endpoint depths and, for each pair of (start unit, end unit) the deepest path with the
named nets along it, deepest first. The unit of a net is the first part of its hierarchical name (``wmem1``,
``engine0``; ``(top)`` for the top level's own logic).

    .venv/bin/python benchmarks/logic_depth.py build/ecp5/xnortrain_top-<hash>/design.json [--top xnortrain_top] [-n 20]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

from boards.ecp5 import PS_CORE

#: LUT levels of a cell's combinational arcs (input port -> output port), by cell type
LUT_LEVEL = 1.0
WIDE_MUX = 0.3
CARRY_IN = 1.0
CARRY_CHAIN = 0.08
CARRY_SUM = 0.5
MULT = 4.0
#: where a path starts: clock-to-output of a flip-flop and a block RAM, in LUT levels
FF_START = 0.5
BRAM_START = 1.5


#: 7-series: CARRY4 along the chain (CI -> CO) and to a sum (CI -> O), in LUT levels
XC7_CARRY_CHAIN = 0.1
XC7_CARRY_SUM = 0.3
XC7_LUTS = ("LUT1", "LUT2", "LUT3", "LUT4", "LUT5", "LUT6")
XC7_FFS = ("FDRE", "FDSE", "FDCE", "FDPE", "FDRE_1", "FDSE_1", "FDCE_1", "FDPE_1")
XC7_BRAMS = ("RAMB18E1", "RAMB36E1")
#: 7-series distributed RAMs and shift registers: asynchronous read from the address (``A*``, ``ADDR*``) inputs
XC7_LUTRAMS = ("RAM32X1S", "RAM64X1S", "RAM128X1S", "RAM256X1S", "RAM32X1D", "RAM64X1D", "RAM128X1D", "RAM32M",
               "RAM64M", "SRL16E", "SRLC16E", "SRLC32E")


def _xc7_arcs(t: str, ins: list[str], outs: list[str]) -> list[tuple[str, str, float]]:
    if t in XC7_LUTS:
        return [(i, "O", LUT_LEVEL) for i in ins]
    if t in ("MUXF7", "MUXF8"):
        return [(i, "O", WIDE_MUX) for i in ins]
    if t == "CARRY4":
        arcs = []
        for i in ins:
            if i == "CI":
                arcs += [("CI", "CO", XC7_CARRY_CHAIN), ("CI", "O", XC7_CARRY_SUM)]
            else:  # S, DI and CYINIT come from the fabric
                arcs += [(i, "CO", CARRY_IN), (i, "O", CARRY_IN)]
        return arcs
    if t in XC7_LUTRAMS:
        return [(i, o, LUT_LEVEL) for i in ins if i.startswith(("A", "DPRA")) for o in outs]
    if t == "DSP48E1" and "P" in outs:  # counted as unregistered (its registers are options)
        return [(i, "P", MULT) for i in ("A", "B", "C") if i in ins]
    return []


def _arcs(cell: dict) -> list[tuple[str, str, float]]:
    """``(input port, output port, levels)`` of a cell's combinational arcs (none for registers)."""
    t = cell["type"]
    dirs = cell["port_directions"]
    ins = [p for p, d in dirs.items() if d == "input"]
    outs = [p for p, d in dirs.items() if d == "output"]
    if t == "LUT4":
        return [(i, "Z", LUT_LEVEL) for i in ins]
    if t in ("PFUMX", "L6MUX21"):
        return [(i, "Z", WIDE_MUX) for i in ins]
    xc7 = _xc7_arcs(t, ins, outs)
    if xc7:
        return xc7
    if t == "CCU2C":
        arcs = []
        for i in ins:
            if i == "CIN":
                arcs += [("CIN", "COUT", CARRY_CHAIN), ("CIN", "S0", CARRY_SUM), ("CIN", "S1", CARRY_SUM + CARRY_CHAIN)]
            else:
                arcs += [(i, "COUT", CARRY_IN), (i, "S0", CARRY_IN), (i, "S1", CARRY_IN + CARRY_CHAIN)]
        return arcs
    if t == "TRELLIS_DPR16X4":  # asynchronous read
        return [(i, o, LUT_LEVEL) for i in ins if i.startswith("RAD") for o in outs]
    if t == "MULT18X18D":  # its own registers where boards/ecp5_dsp.py absorbed them, else combinational
        if _mult_reg(cell, "OUTPUT"):
            return []
        return [(i, o, MULT) for i in ins if i[:1] in "AB" and i[1:].isdigit() and not _mult_reg(cell, _OPERAND[i[0]])
                for o in outs if o.startswith("P")]
    return []


_OPERAND = {"A": "INPUTA", "B": "INPUTB"}


def _mult_reg(cell: dict, reg: str) -> bool:
    """Whether a MULT18X18D uses its register ``reg`` (``INPUTA``, ``INPUTB``, ``OUTPUT``)."""
    return str(cell["parameters"].get(f"REG_{reg}_CLK", "NONE")).strip() not in ("NONE", "")


def _endpoint_ports(cell: dict, boxes=frozenset()) -> list[str]:
    t = cell["type"]
    dirs = cell["port_directions"]
    if t == "TRELLIS_FF":
        return ["DI", "CE", "LSR"]
    if t == "MULT18X18D":  # operands into its input registers; the product into its output register
        ends = [p for p in dirs if p[:1] in "AB" and p[1:].isdigit() and _mult_reg(cell, _OPERAND[p[0]])]
        if _mult_reg(cell, "OUTPUT"):
            ends += [p for p in dirs if p[:1] in "AB" and p[1:].isdigit() and p not in ends]
        return ends
    if t in boxes:
        return [p for p, d in dirs.items() if d == "input"]
    if t in XC7_FFS:
        return [p for p in ("D", "CE", "R", "S", "CLR", "PRE") if p in dirs]
    if t in XC7_BRAMS:
        return [p for p, d in dirs.items() if d == "input" and p.startswith(("ADDR", "DI", "WE", "EN"))]
    if t in XC7_LUTRAMS:
        return [p for p, d in dirs.items() if d == "input" and p.startswith(("A", "D", "WE", "CE"))
                and not p.startswith("DPRA")]
    if t == "DP16KD":
        return [p for p, d in dirs.items() if d == "input" and p.startswith(("AD", "DI", "WE", "CE"))]
    if t == "TRELLIS_DPR16X4":
        return [p for p, d in dirs.items() if d == "input" and (p.startswith(("WAD", "DI")) or p == "WRE")]
    return []


def unit_of(net: str) -> str:
    net = net.lstrip("\\").removeprefix(PS_CORE + ".")  # inside the PS stand-in (boards.ecp5.ps_shell_verilog)
    # Yosys' own names ($abc$..., $techmap$...cc:694...) are the top level's, whatever dots they hold
    return net.split(".")[0] if "." in net and not net.startswith("$") else "(top)"


class Depth:
    """Longest combinational depth into every net bit of one module of a Yosys JSON netlist."""

    def __init__(self, module: dict, boxes=frozenset()):
        self.boxes = frozenset(boxes)
        self.cells = module["cells"]
        self.names: dict[int, str] = {}
        for name, net in module["netnames"].items():
            for b in net["bits"]:
                if not isinstance(b, int):
                    continue
                old = self.names.get(b)
                public = not name.startswith("$")
                if old is None or (public and (old.startswith("$") or len(name) < len(old))):
                    self.names[b] = name
        self.driver: dict[int, tuple[str, str]] = {}
        for cname, cell in self.cells.items():
            for port, bits in cell["connections"].items():
                if cell["port_directions"].get(port) == "output":
                    for b in bits:
                        if isinstance(b, int):
                            self.driver[b] = (cname, port)
        self.arcs = {cname: _arcs(cell) for cname, cell in self.cells.items()}
        self.arrival: dict[int, float] = {}
        self.pred: dict[int, int | None] = {}

    def _start(self, bit: int) -> float:
        drv = self.driver.get(bit)
        if drv is None:
            return 0.0  # a top-level input or a constant
        cell = self.cells[drv[0]]
        t = cell["type"]
        if t in ("DP16KD", *XC7_BRAMS):
            return BRAM_START
        if t == "MULT18X18D":  # its product from its output register, or through the array from input registers
            if _mult_reg(cell, "OUTPUT"):
                return FF_START
            return FF_START + MULT if any(_mult_reg(cell, r) for r in _OPERAND.values()) else 0.0
        return FF_START if t in ("TRELLIS_FF", *XC7_FFS, *XC7_LUTRAMS) or t in self.boxes else 0.0

    def _inputs(self, bit: int) -> list[tuple[int, float]]:
        drv = self.driver.get(bit)
        if drv is None:
            return []
        cname, port = drv
        conn = self.cells[cname]["connections"]
        return [(b, lv) for (i, o, lv) in self.arcs[cname] if o == port for b in conn.get(i, []) if isinstance(b, int)]

    def at(self, bit: int) -> float:
        """Depth of ``bit``: a depth-first walk back through the drivers (iterative: netlists are deeper than
        Python's recursion limit). A bit whose inputs are being walked is on the current path; an input that is
        on it closes a combinational loop, and that edge is cut (counted from 0)."""
        stack, on_path = [bit], set()
        while stack:
            b = stack[-1]
            if b in self.arrival:
                stack.pop()
                continue
            ins = self._inputs(b)
            if not ins:
                self.arrival[b], self.pred[b] = self._start(b), None
                stack.pop()
                continue
            todo = [i for i, _ in ins if i not in self.arrival and i not in on_path]
            if todo and b not in on_path:
                on_path.add(b)
                stack.extend(todo)
                continue
            best, via = max((self.arrival.get(i, 0.0) + lv, i) for i, lv in ins)
            self.arrival[b], self.pred[b] = best, via
            on_path.discard(b)
            stack.pop()
        return self.arrival[bit]

    def path(self, bit: int) -> list[str]:
        """Named nets of the deepest path into ``bit``, from its start (a cut loop ends it)."""
        out, seen = [], set()
        b: int | None = bit
        while b is not None and b not in seen:
            seen.add(b)
            out.append(self.names.get(b, f"${b}"))
            b = self.pred.get(b)
        return out[::-1]


def depth_report(netlist: dict, top: str, n: int = 20, boxes=frozenset()) -> dict:
    """``{"endpoints", "histogram", "pairs"}`` of module ``top``: the histogram of endpoint depths (whole levels)
    and the deepest path of each (start unit, end unit) pair, the ``n`` deepest pairs. ``boxes``: cell types
    that are registered boundaries (black-box units)."""
    d = Depth(netlist["modules"][top], boxes)
    ends = []
    for cell in d.cells.values():
        for port in _endpoint_ports(cell, d.boxes):
            for b in cell["connections"].get(port, []):
                if isinstance(b, int):
                    ends.append((d.at(b), b, cell["type"], port))
    ends.sort(key=lambda e: -e[0])
    hist = collections.Counter(int(e[0]) for e in ends)
    pairs: dict[tuple[str, str], dict] = {}
    for depth, b, ctype, port in ends:
        names = d.path(b)
        key = (unit_of(names[0]), unit_of(names[-1]))
        if key not in pairs:
            pairs[key] = {"from_unit": key[0], "to_unit": key[1], "depth": round(depth, 2), "start": names[0],
                          "end": f"{names[-1]} ({ctype}.{port})", "cells": len(names) - 1,
                          "via": [x for x in names[1:-1] if not x.startswith("$")]}
        if len(pairs) >= n:
            break
    return {"endpoints": len(ends), "histogram": {k: hist[k] for k in sorted(hist)}, "pairs": list(pairs.values())}


#: flip-flop inputs that fan a control net out to a whole datapath: ECP5 and 7-series resets and clock enables
CONTROL_PINS = {"TRELLIS_FF": ("LSR", "CE"), **{t: ("R", "S", "CLR", "PRE", "CE") for t in XC7_FFS}}
#: cells that put a net on a clock network (their loads are not routed in the fabric)
GLOBAL_BUFFERS = ("DCCA", "BUFG", "BUFGCE")


def control_fanout(netlist: dict, top: str, n: int = 10) -> list[dict]:
    """The ``n`` nets with the most flip-flop reset / clock-enable loads (:data:`CONTROL_PINS`), largest first:
    ``{"net", "pin", "loads", "driver", "global"}`` (``global``: driven by one of :data:`GLOBAL_BUFFERS`). A net
    that fans out to thousands of such pins through the fabric is routed across the die in one cycle, whatever its
    logic depth (the reason for the units' reset on a global buffer, docs/architecture.md section 9)."""
    cells = netlist["modules"][top]["cells"]
    names: dict[int, str] = {}
    for name, net in netlist["modules"][top]["netnames"].items():
        for b in net["bits"]:
            if isinstance(b, int) and (b not in names or len(name) < len(names[b])):
                names[b] = name
    drivers: dict[int, str] = {}
    loads: dict[tuple[int, str], int] = collections.Counter()
    for cell in cells.values():
        pins = CONTROL_PINS.get(cell["type"], ())
        for port, bits in cell["connections"].items():
            for b in bits:
                if not isinstance(b, int):
                    continue
                if cell["port_directions"].get(port) == "output":
                    drivers[b] = cell["type"]
                elif port in pins:
                    loads[b, port] += 1
    return [{"net": names.get(b, str(b)).lstrip("\\"), "pin": pin, "loads": k, "driver": drivers.get(b, "(input)"),
             "global": drivers.get(b) in GLOBAL_BUFFERS} for (b, pin), k in loads.most_common(n)]


def format_text(rep: dict) -> str:
    lines = [f"{rep['endpoints']:,} endpoints; depth (LUT levels) -> endpoints: "
             + ", ".join(f"{k}: {v:,}" for k, v in rep["histogram"].items()), "",
             "| depth | from unit | to unit | start | end | named nets on the way |",
             "| ---: | --- | --- | --- | --- | --- |"]
    for p in rep["pairs"]:
        via = " / ".join(p["via"][:6]) + (" / ..." if len(p["via"]) > 6 else "")
        lines.append(f"| {p['depth']} | {p['from_unit']} | {p['to_unit']} | {p['start']} | {p['end']} | {via} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("netlist", type=Path, help="synth_ecp5's design.json")
    ap.add_argument("--top", default="xnortrain_top", help="the top module's name")
    ap.add_argument("-n", type=int, default=20, help="unit pairs listed (the deepest first)")
    ap.add_argument("--json", type=Path, help="also write the report as JSON")
    args = ap.parse_args(argv)
    netlist = json.loads(args.netlist.read_text())
    if args.top not in netlist.get("modules", {}):
        known = sorted(netlist.get("modules", {}))[:8]
        print(f"logic_depth: no module {args.top!r} in {args.netlist} (modules: {known})", file=sys.stderr)
        return 2
    rep = depth_report(netlist, args.top, args.n)
    print(format_text(rep))
    rep["control_fanout"] = control_fanout(netlist, args.top)
    print("\nlargest reset / clock-enable nets: " + "; ".join(
        f"{c['net']} ({c['pin']}, {c['loads']:,} loads, {'global ' if c['global'] else ''}{c['driver']})"
        for c in rep["control_fanout"][:6]))
    if args.json:
        args.json.write_text(json.dumps(rep, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
