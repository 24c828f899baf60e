"""How often the bit-exact model's ``sgn(dW)`` agrees with the float reference's, per layer and step, on the
paper's MLP (784-256-256-256-256-10, B = 100) and real MNIST batches.

The bit-exact model (:class:`sim.hw.model.HwModel`, default switch optimiser) trains for ``--steps`` steps. Before
each of its updates the float reference (:class:`sim.reference.model.BNNModel`) computes the gradient of the same
batch with the same binary weights and BN biases (``beta_q / 2^Fb``), and the signs are compared entry by entry
(the hardware's ternary 0, rare, counts as a disagreement). Both see the same +-1 input
(``model.input_format = binary``, the RTL's ``hw.input``). Comparisons:

``hw / f32``      the float reference in float32 storage with ``approx.bn_eps = 0`` (arithmetic differences only)
``hw / f32 aq``   the same with the reference's alpha rounded to ``hw.alpha_frac_bits`` as the hardware rounds it
                  (what is left is float rounding and the hardware's missing lowest po2 exponent)
``hw / f16``      the float reference as configured (float16 storage, eps 1e-5)
``f16 / f32``     the two float references against each other (the float-only effect of float16 storage)

For layer 0 the same numbers are also given over the rows of ``dW`` whose input pixel varies within the batch:
a pixel that is -1 (or +1) in every image of the batch has ``dW = -+sum_b dy_b``, a sum that nearly cancels
(BN subtracts the batch mean), so its sign is decided by rounding in either model.

    .venv/bin/python benchmarks/dw_sign_agreement.py [--steps 8] [--json out.json] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

COMPARISONS = ("hw / f32", "hw / f32 aq", "hw / f16", "f16 / f32")


def _ref_signs(model, x, y, wb, beta):
    """``sign`` of the float reference's weight gradients (per layer, [in, out]) for batch ``x``, ``y``."""
    import numpy as np

    for j, b in enumerate(beta):
        model.beta[j][:] = model._store(b)
    fw = model.forward(x.astype(np.float32), train=True, wb=wb)
    _, dlogits, _ = model.loss(fw.logits, y)
    grads, _ = model.backward(dlogits, fw.saved, wb)
    return [np.sign(g) for g in grads]


def _alpha_rounded(frac: int):
    """A wrapper of ``ops.bn_forward`` whose ``l1_bnn`` cache holds alpha rounded to ``frac`` bits (half up)."""
    import numpy as np

    from sim.reference import ops

    real = ops.bn_forward

    def bn_forward(y, beta, kind, eps=1e-5):
        x, cache = real(y, beta, kind, eps)
        if kind == "l1_bnn":
            a = np.asarray(cache["alpha"], dtype=np.float64)
            cache["alpha"] = (np.floor(a * 2.0**frac + 0.5) / 2.0**frac).astype(cache["alpha"].dtype)
        return x, cache

    return bn_forward


def measure(cfg, steps: int) -> dict:
    import numpy as np

    from sim.config import apply_overrides
    from sim.datasets import load_dataset
    from sim.hw.engine import prepare_inputs
    from sim.hw.model import HwModel
    from sim.reference import model as ref_model
    from sim.reference.model import BNNModel

    ds = load_dataset(cfg.data.dataset, cfg.data.path or None)
    B = cfg.train.batch_size
    idx = np.random.default_rng(cfg.train.seed).permutation(len(ds.x_train))[: B * steps]
    hw = HwModel(cfg)
    f32 = BNNModel(apply_overrides(cfg, ["approx.storage=float32", "approx.bn_eps=0"]))
    f16 = BNNModel(cfg)
    fb = hw.p.beta_frac
    rounded = _alpha_rounded(hw.p.alpha_frac)
    layers = len(hw.w)
    agree = {c: [[] for _ in range(layers)] for c in COMPARISONS}
    hw_zero = [[] for _ in range(layers)]
    varying = {c: [] for c in COMPARISONS}
    varying_rows = []
    for step in range(steps):
        sel = idx[step * B : (step + 1) * B]
        x, y = prepare_inputs(cfg, ds.x_train[sel]), ds.y_train[sel]
        wb = [w.astype(np.float32) for w in hw.w]
        beta = [b.astype(np.float64) / 2.0**fb for b in hw.beta]
        s32 = _ref_signs(f32, x, y, wb, beta)
        s16 = _ref_signs(f16, x, y, wb, beta)
        real = ref_model.ops.bn_forward
        ref_model.ops.bn_forward = rounded
        try:
            s32a = _ref_signs(f32, x, y, wb, beta)
        finally:
            ref_model.ops.bn_forward = real
        tr = hw.train_step(x, y, lr=cfg.lr, progress=step / steps)
        shw = tr.dw_sign[::-1]
        for k in range(layers):
            for name, (a, b) in {"hw / f32": (shw[k], s32[k]), "hw / f32 aq": (shw[k], s32a[k]),
                                 "hw / f16": (shw[k], s16[k]), "f16 / f32": (s16[k], s32[k])}.items():
                agree[name][k].append(float(np.mean(a == b)))
            hw_zero[k].append(float(np.mean(shw[k] == 0)))
        rows = x.max(axis=0) != x.min(axis=0)
        varying_rows.append(float(rows.mean()))
        for name, (a, b) in {"hw / f32": (shw[0], s32[0]), "hw / f32 aq": (shw[0], s32a[0]),
                             "hw / f16": (shw[0], s16[0]), "f16 / f32": (s16[0], s32[0])}.items():
            varying[name].append(float(np.mean(a[rows] == b[rows])))
    return {"steps": steps, "batch": B, "agreement": agree, "hw_zero_fraction": hw_zero,
            "layer0_varying_rows": varying_rows, "layer0_varying_agreement": varying}


def table(res: dict) -> str:
    layers = len(res["hw_zero_fraction"])
    head = "| layer | " + " | ".join(f"{c} (min-max, mean %)" for c in COMPARISONS) + " |"
    lines = [head, "| --- " * (len(COMPARISONS) + 1) + "|"]
    for k in range(layers):
        cells = []
        for c in COMPARISONS:
            v = [100 * a for a in res["agreement"][c][k]]
            cells.append(f"{min(v):.1f}-{max(v):.1f} ({sum(v) / len(v):.1f})")
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    cells = []
    for c in COMPARISONS:
        v = [100 * a for a in res["layer0_varying_agreement"][c]]
        cells.append(f"{min(v):.1f}-{max(v):.1f} ({sum(v) / len(v):.1f})")
    share = 100 * sum(res["layer0_varying_rows"]) / len(res["layer0_varying_rows"])
    lines.append(f"| 0, varying pixels ({share:.0f} % of rows) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8, help="training steps (batches) compared")
    ap.add_argument("--json", type=Path, help="write the per-step numbers here")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="configuration override")
    args = ap.parse_args(argv)
    from sim.config import apply_overrides, load_config

    cfg = apply_overrides(load_config("mlp"), ["model.input_format=binary", *args.set])
    res = measure(cfg, args.steps)
    print(f"sgn(dW) agreement per layer over {res['steps']} steps of B = {res['batch']} (paper MLP, MNIST)")
    print(table(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
