"""Accuracy and on-chip memory of the bit-exact hardware model, one run per hardware optimiser.

Trains the paper's MLP (preset ``mlp``: 784-256-256-256-256-10, B = 100, vendored MNIST,
50 epochs, development LR schedule) with ``sim.hw.engine.HwEngine`` through the shared
``sim.train_loop.run_training``, writes ``<out>/<optimizer>.json`` (history) and ``.png``
(curves), and prints / writes the memory table (``<out>/memory.json``).

Exact commands used for docs/results_hw.md (at most two processes at a time on 2 cores)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/hw_accuracy.py --optimizer switch --out results/hw
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/hw_accuracy.py --optimizer bop --out results/hw
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/hw_accuracy.py --optimizer iir --out results/hw
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/hw_accuracy.py --optimizer sgd --out results/hw
    .venv/bin/python benchmarks/hw_accuracy.py --memory-only --out results/hw
    .venv/bin/python benchmarks/hw_accuracy.py --summary --out results/hw   # table of finished runs

``--set key=value`` applies configuration overrides (e.g. ``--set train.epochs=3``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sim.config import apply_overrides, load_config  # noqa: E402
from sim.hw.memory import memory_report  # noqa: E402
from sim.hw_config import HW_OPTIMIZERS  # noqa: E402


def make_config(optimizer: str, overrides: list[str]):
    cfg = load_config("mlp")
    return apply_overrides(cfg, [f"hw.optimizer={optimizer}", *overrides])


def run(optimizer: str, out: Path, overrides: list[str], tag: str) -> dict:
    from sim.hw.engine import HwEngine
    from sim.train_loop import run_training

    cfg = make_config(optimizer, overrides)
    name = tag or optimizer
    hist = run_training(cfg, HwEngine(cfg), progress=False, checkpoint=out / f"{name}.json")
    hist.meta["title"] = f"hw arithmetic, optimiser {optimizer}"
    hist.meta["overrides"] = overrides
    hist.meta["memory"] = memory_report(cfg)
    hist.to_json(out / f"{name}.json")
    hist.plot(out / f"{name}.png")
    res = {
        "optimizer": optimizer,
        "final_test_acc": hist.test_acc[-1] if hist.test_acc else None,
        "best_test_acc": hist.best,
        "epochs": len(hist.epoch),
    }
    print(json.dumps(res))
    return res


def memory_table(overrides: list[str]) -> list[dict]:
    rows = []
    for opt in HW_OPTIMIZERS:
        cfg = make_config(opt, overrides)
        rows.append(memory_report(cfg))
    return rows


def summary(out: Path) -> None:
    print(f"{'run':<16}{'epochs':>7}{'final %':>9}{'best %':>9}")
    for p in sorted(out.glob("*.json")):
        if p.name == "memory.json":
            continue
        d = json.loads(p.read_text())
        if not d.get("test_acc"):
            continue
        print(f"{p.stem:<16}{len(d['epoch']):>7}{100 * d['test_acc'][-1]:>9.2f}{100 * max(d['test_acc']):>9.2f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--optimizer", choices=HW_OPTIMIZERS, action="append", help="hardware optimiser (repeatable)")
    ap.add_argument("--out", default="results/hw", help="output folder")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="config override key=value")
    ap.add_argument("--tag", default="", help="file name stem (default: the optimiser name)")
    ap.add_argument("--memory-only", action="store_true", help="only write the memory table")
    ap.add_argument("--summary", action="store_true", help="print accuracies of finished runs in --out")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.summary:
        summary(out)
        return 0
    rows = memory_table(args.overrides)
    (out / "memory.json").write_text(json.dumps(rows, indent=1) + "\n")
    for r in rows:
        print(
            f"{r['optimizer']:<7} {r['bits_per_weight']:>3} bits/weight  "
            f"weights+state {r['weights_state_kib']:8.1f} KiB"
            f"  buffers {r['buffers_kib']:6.1f} KiB  total {r['total_kib']:7.1f} KiB  fits: {r['fits']}"
        )
    if args.memory_only:
        return 0
    for opt in args.optimizer or ["switch"]:
        run(opt, out, args.overrides, args.tag)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
