"""Accuracy of the float reference on MNIST: standard vs proposed training, and the latent-free optimisers.

Each run trains the paper's MLP (784-256-256-256-256-10, BN after every layer) with
:func:`sim.train_loop.run_training` and writes ``<out>/reference_<run>.json`` (the
per-epoch :class:`sim.train_loop.History`, rewritten after every epoch) and a PNG of
the curves. At the end (or with ``--table``) a markdown table of every JSON found in
``<out>`` is printed.

Examples::

    # everything, one run after another
    python benchmarks/reference_accuracy.py
    # two runs in parallel, one thread each
    OMP_NUM_THREADS=1 python benchmarks/reference_accuracy.py --runs standard_adam &
    OMP_NUM_THREADS=1 python benchmarks/reference_accuracy.py --runs proposed_adam &
    # table of what is there
    python benchmarks/reference_accuracy.py --table
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

from sim.config import apply_overrides, load_config  # noqa: E402
from sim.reference.engine import ReferenceEngine  # noqa: E402
from sim.train_loop import History, run_training  # noqa: E402

# Settings every run shares (Appendix B of Wang et al., on a 50-epoch budget):
# Adam lr 0.001, B = 100, the development-based schedule (x0.5 after 3 epochs without improvement
# of the development signal; with no held-out set that is the training loss, see sim/train_loop.py).
COMMON = [
    "train.epochs=50",
    "train.batch_size=100",
    "train.lr.schedule=development",
    "train.lr.initial=0.001",
    "train.lr.factor=0.5",
    "train.lr.patience=3",
    "data.dev_size=0",
]

# float16 optimiser state: (1 - beta2) g^2 underflows float16 (smallest subnormal 6e-8) for |g| < 7.7e-3,
# which is the usual size of a BN-bias gradient; Adam's step m / (sqrt(v) + eps) then explodes with
# eps = 1e-8. eps = 1e-3 bounds it; it is small against the bool weight gradients (1/sqrt(fan_in) >= 0.036).
FP16_ADAM = ["optimizer.adam.eps=1e-3"]

RUNS: dict[str, dict] = {
    "standard_adam": {
        "overrides": ["approx.scheme=standard", "optimizer.name=adam"],
        "target": 0.965,
        "what": "Algorithm 1, Adam",
    },
    "proposed_adam": {
        "overrides": ["approx.scheme=proposed", "optimizer.name=adam", *FP16_ADAM],
        "target": 0.955,
        "what": "Algorithm 2, Adam",
    },
    "proposed_bop": {
        # Appendix B: Bop with B = 50 (Helwegen et al.'s recommendation).
        "overrides": ["approx.scheme=proposed", "optimizer.name=bop", "train.batch_size=50", *FP16_ADAM],
        "target": None,
        "what": "Algorithm 2, Bop (B = 50), BN biases by Adam",
    },
    "proposed_iir": {
        "overrides": ["approx.scheme=proposed", "optimizer.name=iir", *FP16_ADAM],
        "target": None,
        "what": "Algorithm 2, Quist's IIR filter, BN biases by Adam",
    },
}
for _mode in ("deterministic", "stochastic", "momentum", "accumulate", "per_image"):
    RUNS[f"proposed_switch_{_mode}"] = {
        "overrides": ["approx.scheme=proposed", "optimizer.name=switch", f"optimizer.switch.mode={_mode}", *FP16_ADAM],
        "target": None,
        "what": f"Algorithm 2, switching ({_mode}), BN biases by Adam",
    }

DEFAULT_RUNS = ["standard_adam", "proposed_adam", "proposed_bop", "proposed_iir", "proposed_switch_accumulate"]


def build_cfg(name: str, args) -> object:
    spec = RUNS[name]
    ov = list(COMMON)
    if args.epochs is not None:
        ov.append(f"train.epochs={args.epochs}")
    ov += [f"data.train_limit={args.train_limit}", f"data.test_limit={args.test_limit}", f"train.seed={args.seed}"]
    ov += spec["overrides"] + list(args.overrides)
    return apply_overrides(load_config("mlp"), ov)


def run_one(name: str, args) -> History:
    cfg = build_cfg(name, args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"reference_{name}{args.tag}"
    print(f"== {name}: {RUNS[name]['what']}", flush=True)
    t0 = time.perf_counter()
    hist = run_training(
        cfg,
        ReferenceEngine(cfg),
        progress=not args.no_progress,
        checkpoint=out / f"{stem}.json",
        log=lambda s: print(f"[{name}] {s}", flush=True),
    )
    hist.meta.update(
        run=name + args.tag,
        base_run=name,
        extra=list(args.overrides),
        what=RUNS[name]["what"],
        target=RUNS[name]["target"],
        wall_seconds=time.perf_counter() - t0,
        command=" ".join(sys.argv),
        overrides=list(COMMON) + RUNS[name]["overrides"] + list(args.overrides),
    )
    hist.to_json(out / f"{stem}.json")
    hist.plot(out / f"{stem}.png")
    return hist


def table(out: Path) -> str:
    rows = [
        "| run | training | extra settings | B | epochs | best test acc (%) | final test acc (%) | target (%) "
        "| s/epoch | stopped |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for path in sorted(out.glob("reference_*.json")):
        try:
            h = History.from_json(path)
        except (json.JSONDecodeError, TypeError):
            continue
        m = h.meta
        if not h.epoch:
            continue
        name = m.get("run", path.stem.removeprefix("reference_"))
        spec = RUNS.get(m.get("base_run", name), {})
        target = m.get("target", spec.get("target"))
        cfgd = m.get("config", {})
        bs = cfgd.get("train", {}).get("batch_size", "")
        spe = sum(h.seconds) / len(h.seconds)
        mark = ""
        if target:
            mark = f"{100 * target:.1f} " + ("(met)" if h.best >= target else "(missed)")
        what = m.get("what", spec.get("what", ""))
        extra = " ".join(m.get("extra", []))
        rows.append(
            f"| {name} | {what} | {extra} | {bs} | {len(h.epoch)} | {100 * h.best:.2f} | "
            f"{100 * h.test_acc[-1]:.2f} | {mark} | {spe:.1f} | {m.get('stopped', '')} |"
        )
    return "\n".join(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", nargs="+", choices=sorted(RUNS), default=None, help="runs to do (default: the main five)")
    p.add_argument("--epochs", type=int, default=None, help="override the 50 epochs")
    p.add_argument("--train-limit", type=int, default=0, help="first N training images (0 = all 22,699 vendored)")
    p.add_argument("--test-limit", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--set",
        action="append",
        default=[],
        dest="overrides",
        metavar="KEY=VALUE",
        help="extra configuration override for every run (repeatable)",
    )
    p.add_argument("--out", default=str(ROOT / "results"), help="folder for the JSON and PNG files")
    p.add_argument("--tag", default="", help="suffix of the output file names (for sweeps)")
    p.add_argument("--table", action="store_true", help="only print the table of the JSON files in --out")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    out = Path(args.out)
    if not args.table:
        for name in args.runs or DEFAULT_RUNS:
            run_one(name, args)
    print(table(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
