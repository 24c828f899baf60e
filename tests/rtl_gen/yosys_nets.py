"""A small design's memories after Yosys's synthesis to gates (``memory -nomap``, ``techmap``, ``opt -full``), for the
tests of what drives their read ports: Yosys merges flip-flops with equal inputs, so a register replicated per
memory must differ in its logic (a copy that counts from its own value stays a copy of its own)."""

from __future__ import annotations

import json
from pathlib import Path


def memory_read_ports(design, top: str, folder: Path, ports=None) -> tuple[dict, list]:
    """``(nets, reads)`` of ``design`` (an Amaranth component, or an elaboratable and its ``ports``): ``nets`` maps
    every net name to its bits, ``reads`` lists per memory cell ``{"cell", "addr", "en", "waddr"}``, the bits of its
    read address, read enable and write address (a constant bit is the string ``"0"`` or ``"1"``)."""
    from rtl_gen.toolchain import run_yowasp, to_verilog

    kwargs = {} if ports is None else {"ports": ports}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "design.v").write_text(to_verilog(design, top, **kwargs))
    script = (f"read_verilog design.v; hierarchy -top {top}; proc; flatten; opt; memory -nomap; opt; techmap; "
              "opt -full; write_json net.json")
    run_yowasp("yosys", ["-q", "-p", script], cwd=folder)
    mod = json.loads((folder / "net.json").read_text())["modules"][top]
    nets = {name: tuple(n["bits"]) for name, n in mod["netnames"].items()}
    reads = [{"cell": name, "addr": tuple(c["connections"]["RD_ADDR"]), "en": tuple(c["connections"]["RD_EN"]),
              "waddr": tuple(c["connections"]["WR_ADDR"])}
             for name, c in mod["cells"].items() if c["type"] == "$mem_v2"]
    return nets, reads
