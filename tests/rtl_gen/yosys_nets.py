"""A small design's memories after Yosys's synthesis to gates (``memory -nomap``, ``techmap``, ``opt -full``), for the
tests of what drives their ports: Yosys merges flip-flops with equal inputs, so a register replicated per
memory must differ in its logic (a copy that counts from its own value, or loads under an enable of its own,
stays a copy of its own)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path


def gate_netlist(design, top: str, folder: Path, ports=None, *, keep: bool = False) -> dict:
    """The Yosys JSON module of ``design`` (an Amaranth component, or an elaboratable and its ``ports``) after the
    synthesis to gates above; with ``keep`` the flip-flops of registers marked ``streams.KEEP`` are kept as the
    ECP5 flow keeps them (``boards.ecp5.KEEP_REGISTERS``), not merged with those of equal inputs."""
    from boards.ecp5 import KEEP_REGISTERS
    from rtl_gen.toolchain import run_yowasp, to_verilog

    kwargs = {} if ports is None else {"ports": ports}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "design.v").write_text(to_verilog(design, top, **kwargs))
    keep_cmd = f"{KEEP_REGISTERS}; " if keep else ""
    script = (f"read_verilog design.v; hierarchy -top {top}; proc; {keep_cmd}flatten; opt; memory -nomap; opt; "
              "techmap; opt -full; write_json net.json")
    run_yowasp("yosys", ["-q", "-p", script], cwd=folder)
    return json.loads((folder / "net.json").read_text())["modules"][top]


def memory_ports(mod: dict) -> tuple[dict, list]:
    """``(nets, mems)`` of a :func:`gate_netlist` module: ``nets`` maps every net name to its bits, ``mems`` lists
    per memory cell ``{"cell", "addr", "en", "waddr", "wdata", "wen"}``, the bits of its read address and read
    enable and of its write address, data and enable (a constant bit is the string ``"0"`` or ``"1"``)."""
    nets = {name: tuple(n["bits"]) for name, n in mod["netnames"].items()}
    keys = {"addr": "RD_ADDR", "en": "RD_EN", "waddr": "WR_ADDR", "wdata": "WR_DATA", "wen": "WR_EN"}
    mems = [{"cell": name, **{k: tuple(c["connections"][p]) for k, p in keys.items()}}
            for name, c in mod["cells"].items() if c["type"] == "$mem_v2"]
    return nets, mems


def memory_read_ports(design, top: str, folder: Path, ports=None) -> tuple[dict, list]:
    """``(nets, reads)``: :func:`memory_ports` of :func:`gate_netlist` (``reads``: the memory cells' ports)."""
    return memory_ports(gate_netlist(design, top, folder, ports))


def fanout(mod: dict) -> Counter:
    """Per net bit of a :func:`gate_netlist` module, the cell input pins it drives (memory pins included)."""
    out = Counter()
    for c in mod["cells"].values():
        for port, bits in c["connections"].items():
            if c["port_directions"].get(port) == "input":
                out.update(b for b in bits if isinstance(b, int))
    return out


def flop_cone(mod: dict, bits, *, inputs: bool = False) -> set:
    """The flip-flop output bits of a :func:`gate_netlist` module whose values reach ``bits`` through logic only
    (the register-to-register paths into ``bits``); a bit of ``bits`` that a flip-flop drives stands for that
    flip-flop's inputs (the paths into the register). With ``inputs`` the module's input bits that reach them
    (the clock's included) are in the set too."""
    driver, flops = {}, set()
    for c in mod["cells"].values():
        for port, out in c["connections"].items():
            if c["port_directions"].get(port) == "output":
                for b in out:
                    if isinstance(b, int):
                        driver[b] = c
                        if "DFF" in c["type"].upper():
                            flops.add(b)
    todo, found = [], set()
    for b in bits:
        if not isinstance(b, int):
            continue
        c = driver.get(b)
        if b in flops:
            todo.extend(x for p, ins in c["connections"].items() if c["port_directions"].get(p) == "input"
                        and p != "CLK" for x in ins if isinstance(x, int))
        else:
            todo.append(b)
    seen = set()
    while todo:
        b = todo.pop()
        if b in seen:
            continue
        seen.add(b)
        if b in flops:
            found.add(b)
            continue
        c = driver.get(b)
        if c is None:
            if inputs:
                found.add(b)
            continue
        for port, ins in c["connections"].items():
            if c["port_directions"].get(port) == "input":
                todo.extend(x for x in ins if isinstance(x, int))
    return found


def rtl_netlist(design, top: str, folder: Path) -> dict:
    """The Yosys JSON module of the Amaranth component ``design`` after ``proc; flatten; opt`` (word-level cells,
    no mapping: a product is one ``$mul``)."""
    from rtl_gen.toolchain import run_yowasp, to_verilog

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "design.v").write_text(to_verilog(design, top, emit_src=False))
    run_yowasp("yosys", ["-q", "-p", f"read_verilog design.v; hierarchy -top {top}; proc; flatten; opt; "
                         "write_json net.json"], cwd=folder)
    return json.loads((folder / "net.json").read_text())["modules"][top]


def unregistered_products(mod: dict) -> list[str]:
    """The ``$mul`` cells of an :func:`rtl_netlist` module, of two non-constant operands, that are not a registered
    multiplier: an operand bit not from a flip-flop without a reset (``$dff`` / ``$dffe``), or a used product bit
    that drives anything but such flip-flops' inputs. Each is named with the first failing port."""
    flop_type = {b: c["type"] for c in mod["cells"].values() if "dff" in c["type"]
                 for b in c["connections"]["Q"] if isinstance(b, int)}
    loads: dict[int, set] = {}  # net bit -> the cell types whose inputs it drives
    for c in mod["cells"].values():
        for port, bits in c["connections"].items():
            if c["port_directions"].get(port) == "input":
                for b in bits:
                    if isinstance(b, int):
                        loads.setdefault(b, set()).add(c["type"])
    outputs = {b for p in mod["ports"].values() if p["direction"] == "output" for b in p["bits"]}
    plain = {"$dff", "$dffe"}
    bad = []
    for name, c in mod["cells"].items():
        if c["type"] != "$mul":
            continue
        ports = [[b for b in c["connections"][p] if isinstance(b, int)] for p in ("A", "B")]
        if not all(ports):
            continue  # a constant factor: shifts and adds in the fabric
        for p, bits in zip(("A", "B"), ports, strict=True):
            if not all(flop_type.get(b) in plain for b in bits):
                bad.append(f"{name}: {p}")
                break
        else:
            used = [b for b in c["connections"]["Y"] if b in loads or b in outputs]
            if not used or any(b in outputs or not loads[b] <= plain for b in used):
                bad.append(f"{name}: Y")
    return bad
