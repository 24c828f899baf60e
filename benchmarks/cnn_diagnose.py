"""Short training runs of the MNIST CNN on a subset, for finding what limits its accuracy (docs/results/accuracy.md,
"Binary CNN for MNIST").

Trains ``--images`` training images for ``--epochs`` epochs (own loop: the shared loop's shuffling and dithering,
constant learning rate) and prints one JSON line per epoch: training accuracy (of the training steps: dithered
batches, batch statistics), the inference-mode accuracy on the first ``--train-eval`` training images (fixed
threshold, running statistics: whether the network fits its training data), test accuracy on the first 2,000
test images with the running BN statistics (what every run reports) and, for the float reference, with the
statistics of 1,000-image test batches (the weights' own accuracy, free of the running averages), weight flips
per step and the mean BN bias of every layer.

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python benchmarks/cnn_diagnose.py --arith float --set train.batch_size=16
    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python benchmarks/cnn_diagnose.py --arith float --images 22699 --epochs 4
    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python benchmarks/cnn_diagnose.py --arith float --lrs 0.001,0.0003,0.0001

``--pooled-beta V`` starts the BN biases of the layers whose BN output a max pool takes (not ``before_bn``) at
``V`` instead of the models' own ``pooled_bn_beta`` (``0``: as before that rule); ``--no-output-bn`` drops the
output layer's BN (float reference only: the hardware contract has it). ``--lrs`` gives a rate per epoch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sim.config import apply_overrides, load_config  # noqa: E402
from sim.datasets import batches, load_dataset  # noqa: E402
from sim.hw.widths import pools_after, pools_before_bn  # noqa: E402
from sim.train_loop import dither_rng  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "configs" / "cnn_mnist.toml"))
    ap.add_argument("--arith", choices=("hw", "float"), default="float")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--images", type=int, default=8000, help="training images (the first N of the vendored set)")
    ap.add_argument("--pooled-beta", type=float, default=None, help="initial BN bias of the pooled layers")
    ap.add_argument("--no-output-bn", action="store_true", help="float reference without the output layer's BN")
    ap.add_argument("--lrs", default="", help="comma-separated learning rate per epoch (default: the config's "
                    "initial rate throughout; the last value repeats)")
    ap.add_argument("--train-eval", type=int, default=2000, metavar="N",
                    help="also report the inference-mode accuracy on the first N training images (0: not)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="config override key=value")
    args = ap.parse_args(argv)
    cfg = apply_overrides(load_config(args.config), args.overrides)
    if args.no_output_bn:
        if args.arith == "hw":
            ap.error("--no-output-bn: the bit-exact model's output layer always has BN")
        layers = list(cfg.model.layers)
        layers[-1] = dataclasses.replace(layers[-1], bn=False)
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, layers=tuple(layers)))
    data = load_dataset(cfg.data.dataset, cfg.data.path or None)
    xtr, ytr = data.x_train[: args.images], data.y_train[: args.images]
    xte, yte = data.x_test[:2000], data.y_test[:2000]
    if args.arith == "hw":
        from sim.hw.engine import HwEngine as Engine
    else:
        from sim.reference.engine import ReferenceEngine as Engine
    eng = Engine(cfg)
    model = eng.model
    pools, first = pools_after(cfg), pools_before_bn(cfg)
    frac = 0 if args.arith == "float" else cfg.hw.beta_frac_bits
    if args.pooled_beta is not None:
        for k, pool in enumerate(pools):
            if pool > 1 and not first[k]:
                model.beta[k][:] = args.pooled_beta if args.arith == "float" else round(args.pooled_beta * (1 << frac))
    rng = np.random.default_rng(cfg.train.seed)
    B, lr = cfg.train.batch_size, cfg.train.lr.initial
    xt = eng.prepare_inputs(xte)
    xtr_eval = eng.prepare_inputs(xtr[: args.train_eval])

    def batch_stat_acc():
        if args.arith != "float":
            return None
        mu, sc = list(model.running_mu), list(model.running_scale)
        correct = 0
        for i in range(0, len(xt), 1000):
            correct += int((model.forward(xt[i:i + 1000], train=True).logits.argmax(1) == yte[i:i + 1000]).sum())
        model.running_mu, model.running_scale = mu, sc
        return correct / len(xt)

    step = 0
    lrs = [float(v) for v in args.lrs.split(",") if v.strip()]
    for ep in range(args.epochs):
        if lrs:
            lr = lrs[min(ep, len(lrs) - 1)]
        t0, correct, n, flips = time.time(), 0, 0, 0
        for xb, yb in batches(xtr, ytr, B, rng):
            xp = eng.prepare_inputs(xb, dither=dither_rng(cfg.train.seed, step) if cfg.data.dither else None)
            r = eng.train_step(xp, yb, lr=lr, progress=ep / args.epochs)
            correct, n, flips, step = correct + r.correct, n + len(yb), flips + r.flips, step + 1
        _, c = eng.evaluate(xt, yte)
        c_tr = eng.evaluate(xtr_eval, ytr[: args.train_eval])[1] / args.train_eval if args.train_eval else None
        print(json.dumps({"epoch": ep + 1, "train": round(correct / n, 4), "train_eval": c_tr,
                          "test_running": c / len(xt),
                          "test_batch_stats": batch_stat_acc(), "lr": lr, "flips_per_step": round(flips / (n // B), 1),
                          "beta_mean": [round(float(np.mean(b)) / (1 << frac), 3) for b in model.beta],
                          "seconds": round(time.time() - t0)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
