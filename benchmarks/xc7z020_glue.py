"""The top-level glue of a generated accelerator on the xc7z020's fabric: Yosys ``synth_xilinx -family xc7`` of the
top module alone, every unit a black box, and its deepest register-to-register path in LUT6 levels, beside the
same glue through ``synth_ecp5`` in LUT4 levels (issue 33 part 5; no Vivado here).

The glue is the top module's own logic: the controller's phase registers, the port multiplexers, the host
sequencer's wiring, the stream plumbing between units (:func:`rtl_gen.synth.part_texts` with the top and its
submodules as black boxes). Both netlists are measured with ``benchmarks/logic_depth.py`` (a LUT is 1 level
whatever its width, carry and wide multiplexers as there); a black box's outputs count as register outputs and its
inputs as endpoints, as the timing discipline of docs/architecture.md section 9 has it (units registered at their
boundaries). Routing is not counted: the figure ranks the glue's paths and compares the families' LUT depth, it
is not an Fmax.

    nice -n 10 .venv/bin/python benchmarks/xc7z020_glue.py [--config configs/mlp_mnist.toml] [--out FILE.json]

Each synthesis is cached under ``build/xc7z020_glue`` by its Verilog; the elaboration by ``ecp5_fmax``'s cache.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rtl_gen.plan import SystemPlan  # noqa: E402
from rtl_gen.synth import memory_init_files, part_texts  # noqa: E402
from rtl_gen.toolchain import build_root, run_yowasp  # noqa: E402
from sim.config import apply_overrides, load_config  # noqa: E402


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def xc7_script(top: str) -> str:
    """``synth_xilinx`` for the xc7z020 as :mod:`rtl_gen.synth` runs it (no I/O pads, no clock buffer), without
    ``-flatten`` (the units stay black boxes), and the netlist as JSON."""
    return "\n".join(["read_verilog design.v", f"synth_xilinx -family xc7 -top {top} -noiopad -noclkbuf",
                      "write_json design.json", "tee -o stats.json stat -json", ""])


def synth_xc7(text: str, top: str, folder: Path) -> dict:
    """The ``synth_xilinx`` netlist of ``text`` (cached in ``folder`` by the text)."""
    key = hashlib.sha256((xc7_script(top) + text).encode()).hexdigest()
    folder.mkdir(parents=True, exist_ok=True)
    if (folder / "key").is_file() and (folder / "key").read_text() == key and (folder / "design.json").is_file():
        return json.loads((folder / "design.json").read_text())
    body, init_files = memory_init_files(text)
    for name, content in init_files.items():
        (folder / name).write_text(content)
    (folder / "design.v").write_text(body)
    (folder / "synth.ys").write_text(xc7_script(top))
    res = run_yowasp("yosys", ["-q", "-l", "yosys.log", "-s", "synth.ys"], cwd=folder, check=False)
    if res.returncode != 0 or not (folder / "design.json").is_file():
        raise SystemExit(f"xc7z020_glue: yosys synth_xilinx failed (exit {res.returncode}); "
                         f"log: {folder / 'yosys.log'}")
    (folder / "key").write_text(key)
    return json.loads((folder / "design.json").read_text())


def synth_ecp5(text: str, top: str, folder: Path) -> dict:
    """The ``synth_ecp5`` netlist of ``text`` (:func:`boards.ecp5.run_ecp5` without place and route)."""
    from boards.ecp5 import run_ecp5

    run_ecp5(text, top, workdir=folder, out_of_context=True, bitstream=False, check_fit=False, place=False)
    return json.loads((folder / "design.json").read_text())


def box_types(netlist: dict, top: str, boxes: list[str]) -> set[str]:
    """Cell types of ``top`` that are the units (the black boxes named ``boxes``)."""
    names = {b.lstrip("\\") for b in boxes}
    return {c["type"] for c in netlist["modules"][top]["cells"].values() if c["type"].lstrip("\\") in names}


def cell_counts(netlist: dict, top: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in netlist["modules"][top]["cells"].values():
        out[c["type"]] = out.get(c["type"], 0) + 1
    return out


def measure(netlist: dict, top: str, units: list[str], n: int) -> dict:
    depth = _load("logic_depth")
    boxes = box_types(netlist, top, units)
    rep = depth.depth_report(netlist, top, n=n, boxes=boxes)
    rep["deepest"] = rep["pairs"][0]["depth"] if rep["pairs"] else 0.0
    rep["boxes"] = len(boxes)
    return rep


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/mlp_mnist.toml")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="configuration override")
    ap.add_argument("-n", type=int, default=12, help="unit pairs listed per family (the deepest first)")
    ap.add_argument("--out", help="also write both reports as JSON")
    args = ap.parse_args(argv)

    cfg = apply_overrides(load_config(args.config), args.set)
    plan = SystemPlan(cfg)
    t0 = time.monotonic()
    verilog, _cached = _load("ecp5_fmax").elaborate(plan, cfg, args.set)
    ((_name, alias, text, boxes),) = part_texts(verilog, plan.name, only=lambda _n: False, include_top=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    base = build_root() / "xc7z020_glue" / f"{plan.name}-{digest}"
    print(f"{cfg.name}: top-level glue {len(text) / 1e3:,.0f} kB of Verilog, {len(boxes)} units as black boxes "
          f"({time.monotonic() - t0:.0f} s)", flush=True)
    out = {"config": cfg.name, "overrides": args.set}
    for family, synth in (("xc7", synth_xc7), ("ecp5", synth_ecp5)):
        t0 = time.monotonic()
        netlist = synth(text, alias, base / family)
        rep = measure(netlist, alias, boxes, args.n)
        rep["cells"] = cell_counts(netlist, alias)
        rep["synth_s"] = round(time.monotonic() - t0, 1)
        out[family] = rep
        luts = sum(v for k, v in rep["cells"].items() if k.startswith("LUT"))
        print(f"\n{family}: deepest register-to-register path {rep['deepest']} LUT levels ({luts:,} LUTs, "
              f"{rep['boxes']} black boxes; {rep['synth_s']:.0f} s)", flush=True)
        print(_load("logic_depth").format_text(rep), flush=True)
    print(f"\n| glue of {cfg.name} | deepest path (LUT levels) | LUTs |\n| --- | ---: | ---: |")
    for family, what in (("xc7", "xc7z020 (`synth_xilinx`, LUT6)"), ("ecp5", "ECP5 (`synth_ecp5`, LUT4)")):
        luts = sum(v for k, v in out[family]["cells"].items() if k.startswith("LUT"))
        print(f"| {what} | {out[family]['deepest']} | {luts:,} |")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
