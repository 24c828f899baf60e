"""Where the LUTs of a generated accelerator go: Yosys ``synth_xilinx`` (xc7z020) of each direct submodule of
the top level on its own, plus the top level's own logic with those submodules as black boxes.

A whole-design synthesis of the paper's MLP (11.5 MB of Verilog) did not finish in 90 minutes of YoWASP Yosys
(hierarchical, 73 of 234 modules through ABC9); the units one by one fit in a few minutes each, are cached
(same Verilog, same result) and their sum is the design's total up to cross-boundary optimisation (none is
possible between units whose ports are all used).

Output: one JSON line per submodule (name, LUT, LUTRAM, FF, CARRY4, BRAM36, DSP48, seconds), in the order
they finish, then a table sorted by LUT with the total against the device; ``--out`` also writes the JSON.

Commands used for docs/results.md::

    .venv/bin/python benchmarks/resource_breakdown.py --out results/breakdown_paper.json
    .venv/bin/python benchmarks/resource_breakdown.py --only po2b --only bn_ --out results/bn.json

``--only PREFIX`` (repeatable) synthesises only the submodules whose name starts with a prefix.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rtl_gen.synth import map_cells  # noqa: E402
from rtl_gen.toolchain import build_root, run_yowasp  # noqa: E402
from rtl_gen.top import Accelerator, SystemPlan  # noqa: E402
from sim.config import apply_overrides, load_config  # noqa: E402

PAPER = ["model.input_format=binary"]
KEYS = ("LUT", "LUTRAM", "FF", "CARRY4", "BRAM36", "DSP48")
DEVICE_LUT = 53_200


def children(verilog: str, top: str) -> list[str]:
    """Names of the top module's direct submodules (Amaranth names them ``<top>.<name>``)."""
    names = re.findall(r"^module \\(\S+)", verilog, re.M)
    return sorted({n for n in names if n.startswith(top + ".") and "." not in n[len(top) + 1:]})


def modules(verilog: str) -> dict[str, str]:
    """The text of every module, by name (Amaranth writes ``module \\name(...)`` ... ``endmodule``)."""
    out = {}
    for block in re.findall(r"^module .*?^endmodule\n", verilog, re.M | re.S):
        name = re.match(r"module \\?([^\s(]+)", block).group(1)
        out[name] = block
    return out


def synth(folder: Path, top: str, blackboxes: list[str], texts: dict[str, str]) -> tuple[dict, float]:
    """Resources of module ``top`` (flattened with its descendants), ``blackboxes`` left as cells. Only the
    module and its descendants are read (Yosys takes minutes to parse the whole design)."""
    key = hashlib.sha256(json.dumps([top, blackboxes]).encode()).hexdigest()[:12]
    out = folder / f"{key}.json"
    if out.is_file():
        d = json.loads(out.read_text())
        return d["res"], d["s"]
    part = [t for n, t in texts.items() if n == top or (n.startswith(top + ".") and not blackboxes)]
    if blackboxes:
        part += [texts[b] for b in blackboxes]
    (folder / f"{key}.v").write_text("".join(part))
    esc = (lambda n: "\\" + n) if "." in top else (lambda n: n)
    script = [f"read_verilog {key}.v"]
    script += [f"blackbox \\{b}" for b in blackboxes]  # before hierarchy: their own submodules are not read
    script += [f"hierarchy -top {esc(top)}"]
    script += [f"synth_xilinx -family xc7 -top {esc(top)} -flatten -noiopad -noclkbuf",
               f"tee -q -o {key}.stat stat -json"]
    (folder / f"{key}.ys").write_text("\n".join(script) + "\n")
    t = time.time()
    run_yowasp("yosys", ["-q", "-l", f"{key}.log", "-s", f"{key}.ys"], cwd=folder)
    stats = json.loads((folder / f"{key}.stat").read_text())
    cells = stats["design"]["num_cells_by_type"]
    res, _ = map_cells(cells)
    for b in blackboxes:  # black-box instances show up as cells of their own type
        res.pop(b, None)
    s = round(time.time() - t)
    out.write_text(json.dumps({"res": res, "s": s}))
    return res, s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="mlp", help="configuration name or TOML file (default: mlp)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="configuration override")
    ap.add_argument("--only", action="append", default=[], metavar="PREFIX", help="submodules to synthesise")
    ap.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    cfg = apply_overrides(load_config(args.config), [*PAPER, *args.set])
    plan = SystemPlan(cfg)
    verilog = Accelerator(plan).verilog()
    digest = hashlib.sha256(verilog.encode()).hexdigest()[:12]
    folder = build_root() / "breakdown" / f"{plan.name}-{digest}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "design.v").write_text(verilog)
    top = plan.name
    texts = modules(verilog)
    subs = children(verilog, top)
    picked = [s for s in subs if not args.only or any(s[len(top) + 1:].startswith(p) for p in args.only)]
    rows = []
    jobs = [(s[len(top) + 1:], s, []) for s in picked]
    if not args.only:
        jobs.append(("(top level logic)", top, subs))
    for name, module, boxes in jobs:
        res, s = synth(folder, module, boxes, texts)
        row = {"name": name, **{k: res.get(k, 0) for k in KEYS}, "seconds": s}
        rows.append(row)
        print(json.dumps(row), flush=True)
    rows.sort(key=lambda r: -r["LUT"])
    total = {k: sum(r[k] for r in rows) for k in KEYS}
    print(f"\n{'submodule':<28}" + "".join(f"{k:>9}" for k in KEYS))
    for r in rows:
        print(f"{r['name']:<28}" + "".join(f"{r[k]:>9,}" for k in KEYS))
    print(f"{'total':<28}" + "".join(f"{total[k]:>9,}" for k in KEYS)
          + f"   ({100 * total['LUT'] / DEVICE_LUT:.0f} % of the xc7z020's LUTs)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"config": [*PAPER, *args.set], "rows": rows, "total": total}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
