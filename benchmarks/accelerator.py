"""Performance of the generated training accelerator: cycles per step and per image, Verilator speed,
resources.

For one configuration (default: the paper's MLP, 784-256-256-256-256-10, B = 100, binarised input) this
script

1. generates the accelerator (``host.generate.generate``): Verilog, register map, cycle model and,
   unless ``--no-synth``, Yosys ``synth_xilinx`` resources for the xc7z020;
2. runs ``--steps`` training steps on vendored MNIST in Verilator through the host driver
   (``host.verify.verify``), comparing with the bit-exact model after every step;
3. writes ``<out>/accelerator.json``: cycles per step measured in RTL and predicted by the cycle model,
   cycles per training image, the per-phase split (which engine limits), wall time of the build and of the
   simulated steps, simulated cycles per second, and the resources.

Commands used for docs/results.md::

    .venv/bin/python benchmarks/accelerator.py --steps 3 --out results/accelerator
    .venv/bin/python benchmarks/accelerator.py --steps 0 --synth --out results/accelerator   # resources only
    .venv/bin/python benchmarks/accelerator.py --steps 0 --sweep --out results/lanes         # lane scaling

``--set key=value`` applies configuration overrides; ``--sweep`` prints the cycle model over the lane
parameters (``hw.lanes_out``, ``hw.lanes_b``, ``hw.lanes_in``, ``hw.div_steps``, ``hw.dw_passes``,
``hw.dx_passes``, ``hw.po2_lanes``, ``hw.loss_lanes``) to show how the step scales.
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

from rtl_gen.cycle_model import step_cycles  # noqa: E402
from rtl_gen.top import SystemPlan  # noqa: E402
from sim.config import apply_overrides, load_config  # noqa: E402

PAPER: list[str] = []  # configs/mlp_mnist.toml as it is (its hardware input is binarised)


def lane_sweep(base: list[str]) -> list[dict]:
    rows = []
    for key, values in (("hw.lanes_out", [4, 8, 16, 32]), ("hw.lanes_b", [1, 2, 4, 8]),
                        ("hw.lanes_in", [32, 64, 128]), ("hw.div_steps", [1, 2, 4, 8]),
                        ("hw.dw_passes", [1, 2, 4, 8]), ("hw.dx_passes", [1, 2, 4, 8]),
                        ("hw.po2_lanes", [2, 4, 8, 16]), ("hw.loss_lanes", [1, 2, 4, 16])):
        for v in values:
            cfg = apply_overrides(load_config("mlp"), [*base, f"{key}={v}"])
            rep = step_cycles(SystemPlan(cfg))
            kinds = {}
            for ph, c in rep.phases.items():
                kinds[ph.rstrip("0123456789")] = kinds.get(ph.rstrip("0123456789"), 0) + c
            rows.append({"field": key, "value": v, "step": rep.step, "per_image": round(rep.per_image, 1),
                         **{f"{k}_share": round(c / rep.step, 3) for k, c in kinds.items()}})
            print(f"{key:<14} {v:>4}: {rep.step:>9,} cycles/step {rep.per_image:>8,.0f}/image  "
                  + "  ".join(f"{k} {100 * c / rep.step:4.1f} %" for k, c in kinds.items()))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3, help="training steps simulated in Verilator (0: none)")
    ap.add_argument("--synth", action="store_true", help="also run Yosys synth_xilinx (slow for big designs)")
    ap.add_argument("--sweep", action="store_true", help="cycle model over the lane parameters")
    ap.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    ap.add_argument("--out", default="results/accelerator", help="output folder")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    over = PAPER + args.overrides
    cfg = apply_overrides(load_config("mlp"), over)
    result: dict = {"overrides": over}
    path = out / "accelerator.json"
    if path.is_file():
        result = {**json.loads(path.read_text()), **result}

    def save():
        path.write_text(json.dumps(result, indent=1) + "\n")

    from host.generate import generate
    from host.verify import verify

    model_rep = step_cycles(SystemPlan(cfg))
    result["cycle_model"] = model_rep.to_dict()
    if args.synth or args.steps > 0:
        t = time.time()
        report = generate(cfg, out / "rtl", synth=args.synth)
        result["generate_s"] = round(time.time() - t, 1)
        if args.synth:
            result.update({k: report[k] for k in ("resources", "percent", "fits", "overflows", "meets_targets")})
    save()
    if args.steps > 0:
        t = time.time()
        res = verify(cfg, args.steps)
        wall = time.time() - t
        cycles = res.cycles
        result["verify"] = {"ok": res.ok, "message": res.message, "steps": res.steps, "wall_s": round(wall, 1)}
        if cycles:
            model = model_rep.step
            result["rtl_cycles_per_step"] = cycles
            result["rtl_cycles_per_image"] = round(sum(cycles) / len(cycles) / cfg.train.batch_size, 1)
            result["model_error_percent"] = [round(100 * (c - model) / model, 2) for c in cycles]
        save()
        print(json.dumps({k: result[k] for k in result if k not in ("cycle_model",)}, indent=1, default=str))
    if args.sweep:
        result["lane_sweep"] = lane_sweep(over)
        save()
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
