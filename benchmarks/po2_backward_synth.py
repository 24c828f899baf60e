"""LUTs of the po2 backward engine's dW and dX units against their lanes and passes (Yosys ``synth_xilinx``
for the xc7z020, flattened, one unit alone).

Each case is ``unit,layer,lanes_in,lanes_out,lanes_b,passes`` for a weight layer of the configuration
(default: the paper's MLP with binarised input; layer 1 is a 256-256 hidden layer). The unit is built for
that one layer (``Po2Geometry.from_config``), exported to Verilog and synthesised; one JSON line per case
(LUT, FF, CARRY4, BRAM36, cycles of one batch, seconds) goes to stdout and, with ``--out``, to a file.

Commands used for docs/results.md::

    .venv/bin/python benchmarks/po2_backward_synth.py dw,1,64,16,1,4 dx,1,64,16,1,4 dw,1,64,16,2,8 \\
        dw,1,64,16,1,8 dx,1,64,16,1,2

Synthesis results are cached under ``build/synth`` (same Verilog, same result).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rtl_gen.po2_backward import Po2Geometry, _Dw, _Dx  # noqa: E402
from rtl_gen.synth import synthesize  # noqa: E402
from rtl_gen.toolchain import to_verilog  # noqa: E402
from sim.config import apply_overrides, load_config  # noqa: E402


def parse_case(text: str) -> dict:
    parts = text.split(",")
    if len(parts) != 6 or parts[0] not in ("dw", "dx"):
        raise argparse.ArgumentTypeError(f"case {text!r}: expected unit,layer,lanes_in,lanes_out,lanes_b,passes "
                                         f"with unit dw or dx")
    try:
        layer, li, lo, lb, passes = map(int, parts[1:])
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"case {text!r}: {e}") from None
    return {"unit": parts[0], "layer": layer, "li": li, "lo": lo, "lb": lb, "P": passes}


def run_case(cfg, case: dict) -> dict:
    geo = Po2Geometry.from_config(cfg, case["layer"], lanes_in=case["li"], lanes_out=case["lo"],
                                  lanes_b=case["lb"], dw_passes=case["P"], dx_passes=case["P"])
    if case["unit"] == "dx" and not geo.dx_width:
        raise SystemExit(f"layer {case['layer']} has no dX unit (the first layer's dX is not computed)")
    t = time.time()
    cls = _Dw if case["unit"] == "dw" else _Dx
    name = f"{case['unit']}_unit"
    rep = synthesize(to_verilog(cls([geo]), name, emit_src=False), name)
    res = rep.resources
    cycles = geo.dw_cycles() if case["unit"] == "dw" else geo.dx_cycles(geo.batch)
    return {**case, "LUT": res.get("LUT"), "FF": res.get("FF"), "CARRY4": res.get("CARRY4"),
            "BRAM36": res.get("BRAM36"), "cycles_per_batch": cycles, "seconds": round(time.time() - t)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="+", type=parse_case, help="unit,layer,lanes_in,lanes_out,lanes_b,passes")
    ap.add_argument("--config", default="mlp", help="configuration name or TOML file (default: mlp)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="configuration override")
    ap.add_argument("--out", type=Path, help="also append the JSON lines to this file")
    args = ap.parse_args(argv)
    cfg = apply_overrides(load_config(args.config), ["hw.input=binary", *args.set])
    for case in args.cases:
        line = json.dumps(run_case(cfg, case))
        print(line, flush=True)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            with args.out.open("a") as f:
                f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
