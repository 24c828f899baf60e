"""Simulation speed of the whole accelerator: the cocotb testbench (before) against the simulated board
(host/simboard.py, after), measured in one run on the same batches.

For the paper's MLP (configs/mlp_mnist.toml, 784-256x4-10, B = 100) and/or a small MLP (784-12-10, B = 4;
``--configs paper,small``), this script runs ``--steps`` training steps

1. through cocotb (``host.verify.run_system``: Verilator with VPI, the driver on cocotb's
   AsyncTransport, the testbench comparing with the bit-exact model after every step), and
2. on the simulated board (``host.simboard.SimBoard``: the Verilated model with a C++ bus harness via ctypes,
   the driver on a BlockingTransport), compared with the bit-exact model after every step here,

and prints per path: the build time (elaboration + Verilator + C++; "cached" when an earlier run's build was
reused), seconds per training step (``Driver.train_step``: upload, schedule, step, result registers, logits)
and clock cycles per second (the accelerator's own cycle count of the step over that time, as the cocotb
testbench reports it; the simulated board's total count, host traffic included, is in the JSON). Both runs
must agree with the model and with each other (loss, correct count, the accelerator's cycle count per step).
Used for docs/results.md::

    .venv/bin/python benchmarks/sim_speed.py --steps 3
    .venv/bin/python benchmarks/sim_speed.py --steps 3 --configs small,paper --json results/sim_speed.json

``--no-cocotb`` measures the simulated board alone. Clear ``build/`` (or set ``XNORTRAIN_BUILD_DIR`` to an
empty folder) for cold build times.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sim.config import CONFIG_DIR, apply_overrides, load_config  # noqa: E402

SMALL = ["model.input_format=binary", "train.batch_size=4", 'model.layers=[{type="dense",units=12},{type="dense",'
         'units=10}]', "hw.lanes_in=32", "hw.lanes_out=8", "hw.lanes_b=2", "hw.update_lanes=8", "hw.dw_passes=4",
         "hw.dx_passes=2"]


def batches(cfg, steps):
    """The batches ``run_system`` trains on (the seed's permutation of the training set), prepared."""
    from sim.datasets import load_dataset
    from sim.hw.engine import prepare_inputs

    ds = load_dataset(cfg.data.dataset, cfg.data.path or None)
    B = cfg.train.batch_size
    idx = np.random.default_rng(cfg.train.seed).permutation(len(ds.x_train))[:B * steps]
    x, y = prepare_inputs(cfg, ds.x_train[idx]), ds.y_train[idx]
    return [(x[i * B:(i + 1) * B], y[i * B:(i + 1) * B]) for i in range(steps)]


def run_cocotb(cfg, steps, log) -> dict:
    from host.verify import run_system
    from rtl_gen.toolchain import build_root

    before = set((build_root() / "cocotb").glob("system-*"))
    t0 = time.monotonic()
    rep = run_system(cfg, mode="train", steps=steps)
    total = time.monotonic() - t0
    built = bool(set((build_root() / "cocotb").glob("system-*")) - before)
    st = rep["steps"]
    walls = [s["wall_s"] for s in st]
    out = {"path": "cocotb", "total_s": round(total, 1), "built": built,
           "build_s": round(total - sum(walls), 1),  # elaboration, build (if any), restore and every state compare
           "step_s": walls, "cycles": [s["cycles"] for s in st], "loss": [s["loss"] for s in st],
           "correct": [s["correct"] for s in st], "mismatch": [s["mismatch"] for s in st]}
    out["sim_cycles_per_s"] = [s["sim_cycles_per_s"] for s in st]
    log(f"  cocotb: {total:.0f} s in all ({'built' if built else 'cached build'}); "
        + ", ".join(f"{w:.2f}" for w in walls) + " s per step")
    return out


def run_simboard(cfg, steps, log) -> dict:
    from host.driver import Driver
    from host.simboard import SimBoard
    from sim.hw.model import HwModel

    lines = []
    t0 = time.monotonic()
    board = SimBoard.build(cfg, log=lambda m: (lines.append(m), log("  " + m)))
    build = time.monotonic() - t0
    out = {"path": "simboard", "build_s": round(build, 1), "built": not any("reusing" in m for m in lines),
           "step_s": [], "step_cpu_s": [], "cycles": [], "sim_cycles": [], "sim_cycles_per_s": [], "loss": [],
           "correct": [], "mismatch": []}
    with board:
        drv = Driver(board.description, board.transport)
        model = HwModel(cfg)
        drv.load_state_dict(model.state_dict())
        for x, y in batches(cfg, steps):
            c0, t, cpu = board.cycles, time.perf_counter(), time.process_time()
            res = drv.train_step(x, y, lr=cfg.lr)
            wall, cpu = time.perf_counter() - t, time.process_time() - cpu
            sim = board.cycles - c0
            model.train_step(x, y, lr=cfg.lr)
            got, want = drv.state_dict(), model.state_dict()
            bad = [k for k in sorted(want) if not np.array_equal(np.asarray(got[k]), np.asarray(want[k]))]
            out["step_s"].append(round(wall, 3))
            out["step_cpu_s"].append(round(cpu, 3))
            out["cycles"].append(int(res.cycles))
            out["sim_cycles"].append(int(sim))
            out["sim_cycles_per_s"].append(round(res.cycles / wall))  # as the cocotb testbench counts them
            out["loss"].append(res.loss)
            out["correct"].append(int(res.correct))
            out["mismatch"].append(bad or None)
    log("  simulated board: " + ", ".join(f"{w:.2f}" for w in out["step_s"]) + " s per step")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--configs", default="paper", help="comma-separated: paper (784-256x4-10, B = 100), small "
                    "(784-12-10, B = 4); default paper")
    ap.add_argument("--no-cocotb", action="store_true", help="only the simulated board")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error(f"--steps {args.steps}: at least 1")
    from rtl_gen.toolchain import setup_environment

    setup_environment()
    known = {"paper": lambda: ("paper MLP", load_config(CONFIG_DIR / "mlp_mnist.toml")),
             "small": lambda: ("small MLP", apply_overrides(load_config("mlp"), SMALL))}
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    for n in names:
        if n not in known:
            ap.error(f"--configs: {n!r} is not one of {', '.join(known)}")
    configs = [known[n]() for n in names]
    results, ok = [], True
    for label, cfg in configs:
        print(f"{label}: {args.steps} training steps", flush=True)
        runs = [] if args.no_cocotb else [run_cocotb(cfg, args.steps, print)]
        runs.append(run_simboard(cfg, args.steps, print))
        for r in runs:
            r["config"] = label
            if any(m is not None for m in r["mismatch"]):
                ok = False
                print(f"  MISMATCH with the bit-exact model on the {r['path']} path: {r['mismatch']}")
        if len(runs) == 2 and any(runs[0][k] != runs[1][k] for k in ("cycles", "loss", "correct")):
            ok = False
            print("  the two paths disagree: " + "; ".join(f"{k} {runs[0][k]} vs {runs[1][k]}"
                                                         for k in ("cycles", "loss", "correct")))
        results += runs
    print()
    print(f"{'configuration':<12} {'path':<9} {'build s':>8} {'s/step':>8} {'CPU s/step':>10} {'cycles/step':>12} "
          f"{'cycles/s':>10}")
    for r in results:
        step = float(np.median(r["step_s"]))
        rate = float(np.median(r["sim_cycles_per_s"]))
        build = f"{r['build_s']:.0f}" + ("" if r["built"] else "*")
        cpu = f"{float(np.median(r['step_cpu_s'])):.2f}" if "step_cpu_s" in r else "-"
        print(f"{r['config']:<12} {r['path']:<9} {build:>8} {step:>8.2f} {cpu:>10} {r['cycles'][0]:>12,} "
              f"{rate:>10,.0f}")
    print("(median over the steps; s/step: Driver.train_step (upload, step, results); CPU s/step: this process's "
          "CPU time in it (what an idle machine takes; cocotb's simulator runs in another process); cycles/s: the "
          "accelerator's count of the train command over s/step; build s: elaboration + Verilator + C++, for cocotb "
          "also the restore and the state compares; * = the build was cached)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    print("all steps bit-exact and both paths agree" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
