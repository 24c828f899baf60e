"""Where the LUTs of a generated accelerator go: Yosys ``synth_xilinx`` (xc7z020) of each direct submodule of
the top level on its own, plus the top level's own logic with those submodules as black boxes.

A whole-design synthesis of the paper's MLP (11.5 MB of Verilog) did not finish in 90 minutes of YoWASP Yosys
(hierarchical, 73 of 234 modules through ABC9); the units one by one (:func:`rtl_gen.synth.synthesize_parts`,
the same parts ``xnortrain generate --synth-by-unit`` adds up) take seconds to minutes each and are cached; their
sum misses only optimisation across unit boundaries.

Output: one JSON line per submodule (name, LUT, LUTRAM, FF, CARRY4, BRAM36, DSP48, seconds), in the order
they finish, then a table sorted by LUT with the total against the device; ``--out`` also writes the JSON.

Commands used for docs/results.md::

    .venv/bin/python benchmarks/resource_breakdown.py --out results/breakdown_paper.json
    .venv/bin/python benchmarks/resource_breakdown.py --only po2b --only bn_ --out results/bn.json

``--only PREFIX`` (repeatable) synthesises only the submodules whose name starts with a prefix (and not the top
level). ``--reuse FILE --skip PREFIX`` takes the rows of the skipped submodules from an earlier ``--out`` file
instead of synthesising them again (the weight memory alone takes about 36 minutes); reused rows are marked in
the table and the JSON (``"reused": FILE``), and the Verilog of a reused unit must not have changed since.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rtl_gen.synth import synthesize_parts  # noqa: E402
from rtl_gen.top import Accelerator, SystemPlan  # noqa: E402
from sim.config import apply_overrides, load_config  # noqa: E402

PAPER: list[str] = []  # configs/mlp_mnist.toml as it is (its hardware input is binarised)
KEYS = ("LUT", "LUTRAM", "FF", "CARRY4", "BRAM36", "DSP")  # SynthReport.resources names (DSP = DSP48E1 slices)
DEVICE_LUT = 53_200


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="mlp", help="configuration name or TOML file (default: mlp)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="configuration override")
    ap.add_argument("--only", action="append", default=[], metavar="PREFIX", help="submodules to synthesise")
    ap.add_argument("--skip", action="append", default=[], metavar="PREFIX",
                    help="submodules not to synthesise (their rows come from --reuse)")
    ap.add_argument("--reuse", type=Path, help="an earlier --out file with the rows of the skipped submodules")
    ap.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    cfg = apply_overrides(load_config(args.config), [*PAPER, *args.set])
    plan = SystemPlan(cfg)
    verilog = Accelerator(plan).verilog()
    if bool(args.skip) != bool(args.reuse):
        ap.error("--skip and --reuse go together")
    if args.only and args.skip:
        ap.error("--only and --skip exclude each other")
    only = (lambda n: any(n.startswith(p) for p in args.only)) if args.only else None
    rows = []
    if args.skip:
        old = json.loads(args.reuse.read_text())["rows"]
        for r in old:
            if any(r["name"].startswith(p) for p in args.skip):
                rows.append({**r, "reused": str(args.reuse)})
                print(json.dumps(rows[-1]), flush=True)
        if not rows:
            ap.error(f"{args.reuse} has no rows for {args.skip}")
        only = lambda n: not any(n.startswith(p) for p in args.skip)  # noqa: E731
    for name, rep, _, _ in synthesize_parts(verilog, plan.name, only=only, include_top=only is None or bool(args.skip)):
        row = {"name": name, **{k: rep.resources.get(k, 0) for k in KEYS}, "seconds": round(rep.elapsed_s or 0)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    rows.sort(key=lambda r: -r["LUT"])
    total = {k: sum(r[k] for r in rows) for k in KEYS}
    print(f"\n{'submodule':<28}" + "".join(f"{k:>9}" for k in KEYS))
    for r in rows:
        print(f"{r['name'] + (' (reused)' if r.get('reused') else ''):<28}" + "".join(f"{r[k]:>9,}" for k in KEYS))
    print(f"{'total':<28}" + "".join(f"{total[k]:>9,}" for k in KEYS)
          + f"   ({100 * total['LUT'] / DEVICE_LUT:.0f} % of the xc7z020's LUTs)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"config": [*PAPER, *args.set], "rows": rows, "total": total}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
