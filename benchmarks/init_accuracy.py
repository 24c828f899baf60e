"""``train --init`` from a float-reference checkpoint: the accelerator's accuracy right after loading (the bit-exact
model's evaluation, what ``infer`` equals) against the float model's own evaluation, on the whole test set.

The float run must binarise its input as the accelerator does (``--set model.input_format=binary``), e.g.

    .venv/bin/xnortrain train --arith float --model mlp --set model.input_format=binary --epochs 50 \\
        --json results/mlp-float-binary.json
    .venv/bin/python benchmarks/init_accuracy.py results/mlp-float-binary.ckpt.npz [--json OUT]

The hardware configuration is the checkpoint's own (its ``[hw]`` section; ``--set`` changes it).
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


def main(argv=None) -> int:
    from host.init_state import hw_state, source_from_float
    from sim.config import apply_overrides
    from sim.hw.engine import HwEngine
    from sim.reference.engine import ReferenceEngine
    from sim.train_loop import evaluate_dataset, load_checkpoint, load_training_data

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", help="a float-reference training checkpoint")
    ap.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE",
                    help="change the hardware configuration (the checkpoint's own by default)")
    ap.add_argument("--json", help="write the figures as JSON")
    args = ap.parse_args(argv)
    ckpt = load_checkpoint(args.checkpoint)
    if ckpt.engine == "hw":
        raise SystemExit(f"{args.checkpoint}: a hardware checkpoint; give a float-reference one")
    cfg_f = ckpt.config
    cfg = apply_overrides(cfg_f, args.overrides)
    data = load_training_data(cfg_f)
    t0 = time.perf_counter()
    ref = ReferenceEngine(cfg_f)
    ref.load_state_dict(ckpt.engine_state)
    _, acc_float = evaluate_dataset(ref, data.x_test, data.y_test, cfg_f.train.eval_batch_size)
    hw = HwEngine(cfg)
    hw.load_state_dict(hw_state(cfg, source_from_float(cfg_f, ckpt.engine_state, args.checkpoint)))
    _, acc_hw = evaluate_dataset(hw, data.x_test, data.y_test, cfg.train.eval_batch_size)
    x_f = ref.model.forward(ref.prepare_inputs(data.x_test), train=False).logits.argmax(axis=1)
    x_h = hw.model.forward_eval(hw.prepare_inputs(data.x_test)).argmax(axis=1)
    res = {"checkpoint": str(args.checkpoint), "epochs": len(ckpt.meta["history"].get("epoch", [])),
           "images": len(data.x_test), "accuracy_float": acc_float, "accuracy_hw_after_init": acc_hw,
           "difference_points": round(100 * (acc_hw - acc_float), 2),
           "classes_differ": int((x_f != x_h).sum()), "seconds": round(time.perf_counter() - t0, 1)}
    print(f"{args.checkpoint} ({res['epochs']} epochs): float reference {100 * acc_float:.2f} %, the accelerator's "
          f"evaluation right after --init {100 * acc_hw:.2f} % ({res['difference_points']:+.2f} points; "
          f"{res['classes_differ']} of {len(data.x_test)} classes differ)")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
