"""The PL energy estimate of a generated accelerator (host/energy_estimate.py) from resources already measured.

Resources come from a JSON file (default ``docs/breakdown_paper.json``, the per-part Yosys synthesis of the paper's
MLP behind docs/results.md "Resources of the paper's MLP": its ``total``), or a ``xnortrain generate`` report.json
(its ``resources``); the switching activity from one training step on the simulated board built with Verilator
toggle coverage (the paper's MLP: a build of several minutes, cached under build/simboard/, then the step);
the constants from boards/power.py. Prints the estimate with every constant and its sources; ``--json`` writes it.

``--activity-batch N`` measures the activity on the same configuration with ``train.batch_size=N`` (the same
layers, lanes and datapath; fewer cycles per step) and applies it to the configured batch's cycle count from
the cycle model: the coverage model of the paper's MLP simulates only a few hundred cycles per second, so one
B = 100 step (384k cycles) would take most of an hour.

Command used for docs/results.md ("Energy estimate")::

    .venv/bin/python benchmarks/energy_estimate.py --activity-batch 10 --json results/energy_mlp.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from boards.power import CONSTANTS, REPORTS  # noqa: E402
from host.energy_estimate import estimate_energy, measure_activity  # noqa: E402
from rtl_gen.top import SystemPlan  # noqa: E402
from sim.config import apply_overrides, load_config  # noqa: E402


def load_resources(path: Path) -> dict:
    d = json.loads(path.read_text())
    res = d.get("total") or d.get("resources") or d
    try:
        return {"LUT_logic": float(res["LUT"]) - float(res.get("LUTRAM", 0)), "FF": float(res["FF"]),
                "BRAM36": float(res["BRAM36"]), "DSP": float(res["DSP"])}
    except KeyError as e:
        raise SystemExit(f"{path}: no {e.args[0]} in its total/resources") from None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="mlp", help="a preset (configs/), default mlp")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="configuration override")
    ap.add_argument("--resources", type=Path, default=ROOT / "docs" / "breakdown_paper.json",
                    help="JSON with total or resources: LUT, LUTRAM, FF, BRAM36, DSP")
    ap.add_argument("--activity-batch", type=int, metavar="N",
                    help="measure the activity with train.batch_size=N; the estimate keeps the configured batch and "
                         "its cycle-model step")
    ap.add_argument("--json", type=Path, metavar="OUT", help="write the estimate as JSON")
    args = ap.parse_args(argv)

    cfg = apply_overrides(load_config(args.model), args.set)
    res = load_resources(args.resources)
    plan = SystemPlan(cfg)
    cycles = None
    if args.activity_batch:
        from rtl_gen.cycle_model import step_cycles

        act = measure_activity(apply_overrides(cfg, [f"train.batch_size={args.activity_batch}"]), log=print)
        cycles = step_cycles(plan).step
        print(f"activity measured at B = {args.activity_batch}; the estimate uses B = {plan.batch} and its cycle "
              f"model step, {cycles:,} cycles")
    else:
        act = measure_activity(cfg, log=print)
    est = estimate_energy(res, act, clock_mhz=plan.description().clock_mhz, batch=plan.batch, cycles=cycles)
    print(f"resources ({args.resources.name}): " + ", ".join(f"{k} {v:,.1f}" for k, v in res.items()))
    print(f"activity: {act.cycles:,} cycles in the window ({act.step_cycles:,} in the step), FF bits "
          f"{act.ff_bits:,} ({act.ff_toggles:,} toggles), combinational bits {act.comb_bits:,} "
          f"({act.comb_toggles:,} toggles), memory bits left out {act.mem_bits:,}")
    print(est.format_text())
    print("constants (nominal, low-high over the reports):")
    for c in CONSTANTS.values():
        print(f"  {c.name:<9} {c.value:.3g} {c.unit} ({c.low:.3g}-{c.high:.3g}){' upper bound' if c.bound else ''}: "
              f"{c.meaning}; {c.derivation}")
    print("sources:")
    for r in REPORTS:
        print(f"  {r.source} ({r.design}, Vivado {r.vivado}, {r.f_hz / 1e6:g} MHz, {r.activity})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"config": cfg.name, "overrides": args.set,
                                         "activity_batch": args.activity_batch or plan.batch,
                                         "resources_file": str(args.resources), **est.to_dict()}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
