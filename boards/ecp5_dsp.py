"""The ECP5 multipliers' own registers: a pass over ``synth_ecp5``'s netlist before place and route.

Yosys 0.70 maps a product to MULT18X18D cells with every register of the cell unused: the operand registers and
the product register the design writes stay in the fabric. Those flip-flops sit by the rest of their unit's logic
while the MULT18s sit in fixed rows, so a product costs two long routes a cycle (in and out of the MULT18's row:
13.9 ns for a quarter of the po2 backward array at the paper's widths, docs/results/timing.md). Vivado absorbs such
registers into the DSP48E1 (AREG, BREG, MREG / PREG) as a matter of course; Yosys does that for the iCE40, the
Nexus and the 7-series, not for the ECP5. :func:`absorb_mult_registers` does it on the JSON netlist:

Only where nextpnr-ecp5 then times the cell as registered: both operands' registers, or the product's (with one
operand's register alone its timer takes the cell as combinational).

- **Operands.** Where every non-constant bit of ``A`` (or of ``B``) comes from a plain flip-flop (no set or reset:
  its ``LSR`` a constant 0; one clock, one clock enable among them), the cell's input register takes those
  flip-flops' D inputs under their clock enable (``REG_INPUTA_CLK`` and so on). The fabric flip-flop stays where
  it has other loads (the cell's register is then a copy of it: same D, same enable, same clock) and goes where
  the multiplier was its only load.
- **Product.** Where every used bit of ``P`` drives exactly one plain flip-flop's D input and nothing else, with
  one clock and one clock enable among them, those flip-flops become the cell's output register
  (``REG_OUTPUT_CLK``): their Q nets are now driven by ``P``.

The registers keep their clock enables (one of ``CE0`` to ``CE3`` per distinct enable) and have no reset
(``RST0`` tied to 0), as the flip-flops they replace. Nothing else changes: the function is the same, cycle for
cycle, from the first enabled edge on (the cell's registers power up at 0, the fabric's at their init values: the
design's data registers have none). The timing proxy then prices a product as the Zynq build does.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

__all__ = ["absorb_mult_registers"]

_MULT = "MULT18X18D"
_OPERANDS = {"A": 18, "B": 18}
_PRODUCT = 36


def _plain_ff(cell: Mapping) -> tuple | None:
    """``(clock bit, enable)`` of a TRELLIS_FF with no set or reset (``enable``: ``"1"``, or the CE bit), else None."""
    if cell["type"] != "TRELLIS_FF":
        return None
    p, conn = cell["parameters"], cell["connections"]
    if str(p.get("CLKMUX", "CLK")).strip() != "CLK" or str(p.get("LSRMUX", "LSR")).strip() != "LSR":
        return None
    if [str(b) for b in conn.get("LSR", ["0"])] != ["0"]:
        return None
    clk = conn.get("CLK", [None])[0]
    if not isinstance(clk, int):
        return None
    cemux = str(p.get("CEMUX", "CE")).strip()
    if cemux == "1":
        return clk, "1"
    if cemux == "CE" and isinstance(conn.get("CE", [None])[0], int):
        return clk, conn["CE"][0]
    return None


def _register_group(pins, flop_of, cells) -> tuple | None:
    """``(clock, enable, [(pin index, flip-flop)])`` when every pin ``(index, bit)`` has a plain flip-flop
    (``flop_of(bit)``) and they share one clock and one enable, else None."""
    ffs = []
    for i, b in pins:
        ff = flop_of(b)
        key = _plain_ff(cells[ff]) if ff is not None else None
        if key is None:
            return None
        ffs.append((i, ff, key))
    keys = {k for _, _, k in ffs}
    if not ffs or len(keys) != 1:
        return None
    return (*keys.pop(), [(i, ff) for i, ff, _ in ffs])


def absorb_mult_registers(module: dict) -> dict:
    """Absorb operand and product flip-flops into the module's MULT18X18D cells (in place; see the module
    docstring). Returns ``{"mults", "a", "b", "p", "ffs_removed"}``: the MULT18s, how many of them took an A, a B
    and a P register, and the fabric flip-flops that went."""
    cells = module["cells"]
    driver: dict[int, str] = {}
    loads: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for name, c in cells.items():
        for port, bits in c["connections"].items():
            out = c["port_directions"].get(port) == "output"
            for b in bits:
                if isinstance(b, int):
                    if out:
                        driver[b] = name
                    else:
                        loads[b].append((name, port))
    for port in module.get("ports", {}).values():
        if port["direction"] != "input":
            for b in port["bits"]:
                if isinstance(b, int):
                    loads[b].append(("$port", "out"))
    stats = {"mults": 0, "a": 0, "b": 0, "p": 0, "ffs_removed": 0}
    removed: set[str] = set()

    def operand_ff(b):  # the flip-flop driving an operand bit
        ff = driver.get(b)
        return ff if ff is not None and ff not in removed else None

    def product_ff(b):  # the flip-flop that is a product bit's only load (at its D input)
        ld = loads[b]
        ff = ld[0][0] if len(ld) == 1 and ld[0][1] == "DI" else None
        return ff if ff not in (None, "$port") and ff not in removed else None

    for name in [n for n, c in cells.items() if c["type"] == _MULT]:
        cell = cells[name]
        conn = cell["connections"]
        stats["mults"] += 1
        groups = {}  # register -> (clock, enable, [(pin index, flip-flop)])
        for op, width in _OPERANDS.items():
            pins = [(i, conn.get(f"{op}{i}", ["0"])[0]) for i in range(width)]
            g = _register_group([(i, b) for i, b in pins if isinstance(b, int)], operand_ff, cells)
            if g:
                groups[op] = g
        pins = [(i, conn.get(f"P{i}", [None])[0]) for i in range(_PRODUCT)]
        g = _register_group([(i, b) for i, b in pins if isinstance(b, int) and loads.get(b)], product_ff, cells)
        if g:
            groups["P"] = g
        if groups:
            clk = next(iter(groups.values()))[0]  # the cell's registers share CLK0
            groups = {k: g for k, g in groups.items() if g[0] == clk}
        # nextpnr-ecp5 times the cell as registered only with both input registers or the output register (one
        # input register alone: the whole cell is combinational to its timer, and the fabric flip-flop that cut
        # the path would be gone: a quarter of the po2 backward array fell from 71.9 to 41.9 MHz that way)
        if not ({"A", "B"} <= set(groups) or "P" in groups):
            continue
        enables: list = []
        for _clk, en, _ in groups.values():
            if en not in enables:
                enables.append(en)
        params = cell["parameters"]
        dirs = cell["port_directions"]
        for pin in ("CLK0", "RST0", *(f"CE{k}" for k in range(len(enables)))):
            dirs[pin] = "input"
        conn["CLK0"], conn["RST0"] = [clk], ["0"]
        loads[clk].append((name, "CLK0"))
        for k, en in enumerate(enables):
            conn[f"CE{k}"] = [en]
            if en != "1":
                loads[en].append((name, f"CE{k}"))
        for reg, (_clk, en, ffs) in groups.items():
            tag = {"A": "INPUTA", "B": "INPUTB", "P": "OUTPUT"}[reg]
            params[f"REG_{tag}_CLK"] = "CLK0"
            params[f"REG_{tag}_CE"] = f"CE{enables.index(en)}"
            params[f"REG_{tag}_RST"] = "RST0"
            stats[reg.lower()] += 1
            for i, ff in ffs:
                fconn = cells[ff]["connections"]
                if reg == "P":  # the flip-flop's Q net is now the cell's output; the old P net is left unused
                    conn[f"P{i}"] = [fconn["Q"][0]]
                    removed.add(ff)
                    continue
                q = conn[f"{reg}{i}"][0]
                conn[f"{reg}{i}"] = [fconn["DI"][0]]
                loads[q] = [x for x in loads[q] if x != (name, f"{reg}{i}")]
                d = fconn["DI"][0]
                if isinstance(d, int):
                    loads[d].append((name, f"{reg}{i}"))
        for reg in ("A", "B"):
            for _i, ff in groups.get(reg, (None, None, []))[2]:
                if ff not in removed and not loads.get(cells[ff]["connections"]["Q"][0]):
                    removed.add(ff)
                    d = cells[ff]["connections"]["DI"][0]
                    if isinstance(d, int):  # (its clock and enable loads stay listed: that only holds more back)
                        loads[d] = [x for x in loads[d] if x != (ff, "DI")]
    for ff in removed:
        del cells[ff]
    stats["ffs_removed"] = len(removed)
    return stats
