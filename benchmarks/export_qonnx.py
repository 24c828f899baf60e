"""The QONNX export against the accelerator's evaluation on the whole test set (the default test takes 2,000 images
of a small MLP: tests/host/test_export.py).

Exports a checkpoint (default: the ``mlp`` preset trained ``--epochs`` epochs on the bit-exact model first) with
``host.export.export_qonnx`` at a batch of the whole test set, runs qonnx's executor (``qonnx.core.onnx_exec``) on
the raw test images and compares the first maximum of its output with the bit-exact model's evaluation
(``HwModel.forward_eval``, what the accelerator's ``infer`` equals), image by image. Exit 1 on any difference.

    .venv/bin/python benchmarks/export_qonnx.py [--checkpoint CKPT] [--epochs 1] [--json OUT]
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
    import numpy as np
    from qonnx.core.onnx_exec import execute_onnx

    from host.export import export_qonnx, hw_state_of
    from sim.config import apply_overrides, load_config
    from sim.hw.engine import HwEngine, prepare_inputs
    from sim.hw.model import HwModel
    from sim.train_loop import load_checkpoint, load_training_data, run_training

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", help="a training checkpoint (default: train the mlp preset first)")
    ap.add_argument("--epochs", type=int, default=1, help="epochs of the preset on the bit-exact model (default 1)")
    ap.add_argument("--json", help="write the figures as JSON")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    if args.checkpoint:
        cfg, state = hw_state_of(load_checkpoint(args.checkpoint))
        source = args.checkpoint
    else:
        cfg = apply_overrides(load_config("mlp"), [f"train.epochs={args.epochs}"])
        engine = HwEngine(cfg)
        run_training(cfg, engine, progress=False, log=None)
        state = engine.state_dict()
        source = f"mlp preset, {args.epochs} epoch(s) on the bit-exact model"
    t_train = time.perf_counter() - t0
    data = load_training_data(cfg)
    x, labels = data.x_test, data.y_test
    model = HwModel(cfg)
    model.load_state_dict(state)
    expect = model.forward_eval(prepare_inputs(cfg, x)).argmax(axis=1)
    t1 = time.perf_counter()
    graph = export_qonnx(cfg, state, batch=len(x))
    t_export = time.perf_counter() - t1
    t2 = time.perf_counter()
    out = execute_onnx(graph, {"global_in": x.astype(np.float32)})["global_out"]
    t_exec = time.perf_counter() - t2
    got = out.argmax(axis=1)
    differ = int(np.count_nonzero(got != expect))
    res = {
        "source": source, "config": cfg.name, "images": len(x), "differ": differ,
        "accuracy_model": float((expect == labels).mean()), "accuracy_qonnx": float((got == labels).mean()),
        "output_thresholds_per_class": int(graph.get_initializer("global_out_thresholds").shape[1]),
        "seconds": {"train": round(t_train, 1), "export": round(t_export, 2), "qonnx_exec": round(t_exec, 1)},
    }
    print(f"{source}: {len(x)} test images, {differ} classes differ between qonnx's executor on the export and "
          f"the bit-exact model; accuracy {100 * res['accuracy_qonnx']:.2f} % (model {100 * res['accuracy_model']:.2f}"
          f" %); export {t_export:.1f} s, qonnx execution {t_exec:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
