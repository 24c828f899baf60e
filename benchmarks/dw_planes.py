"""Accuracy of the bit-exact model when sgn(dW) comes from a cheaper version of the po2 codes of dY.

The hardware keeps only ``sgn(dW)``, ``dW = X^T dY_po2``, and computes it on the DSP multiply-accumulate array.
This benchmark asks whether an XNOR-popcount engine could take that over: it trains the paper's MLP (preset
``mlp``, switch optimiser as in ``benchmarks/hw_accuracy.py``, binary dithered input) with
``sim.hw.arith.po2_backward_dw`` replaced, for this process only, by a function that first reduces the codes.
dX, the BN backward and everything else see the unchanged codes. Variants (``F_j``: the largest exponent
field of output column ``j`` over the batch):

``full``      the codes as they are (the baseline; checked bit-identical to the unpatched model)
``sign``      every nonzero code weighs 1: ``sgn(sum_b sgn(dy_bj) x_bi)``, one masked XNOR-popcount pass
``top{d}``    codes with ``field > F_j - d`` keep their weight ``2^(field-1)``, the rest become 0 (d passes)
``tern{d}``   the same window of ``d`` exponent planes, every kept code weighs 1 (one pass)
``<v>+out``   variant ``v`` on the hidden layers, full codes for the output layer (its 10 columns are 0.6 % of
              the dW products, small enough to stay on DSPs)

Before training, one step of the patched ``full`` model is compared with the unpatched model (whole state and
dW signs), and the patched function is counted on every run. During training the fraction of dW signs that
agree with the full codes' on the same step is measured per layer on the first step and every
``--agree-every`` steps. Histories go to ``<out>/<variant>-<epochs>ep.json``.

Commands (one training process at a time on the 2-core machine)::

    export OMP_NUM_THREADS=1
    nice -n 10 .venv/bin/python benchmarks/dw_planes.py --variant full,sign --epochs 1 --out results/dw_planes
    nice -n 10 .venv/bin/python benchmarks/dw_planes.py --variant full,sign,tern2,tern4,tern8,top1,top2,top3 \\
        --epochs 8 --out results/dw_planes
    nice -n 10 .venv/bin/python benchmarks/dw_planes.py --variant VARIANT --epochs 50 --out results/dw_planes
    .venv/bin/python benchmarks/dw_planes.py --summary --out results/dw_planes   # table of finished runs
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sim.config import apply_overrides, load_config  # noqa: E402
from sim.hw import arith as A  # noqa: E402
from sim.hw.engine import HwEngine  # noqa: E402
from sim.hw.model import HwModel  # noqa: E402

DEFAULT_VARIANTS = ("full", "sign", "tern2", "tern4", "tern8", "top1", "top2", "top3")
_VARIANT = re.compile(r"(full|sign|(top|tern)([1-9][0-9]*))(\+out)?")


def parse_variants(args: list[str]) -> list[str]:
    names = [v for arg in args for v in arg.split(",") if v] or list(DEFAULT_VARIANTS)
    bad = [v for v in names if not _VARIANT.fullmatch(v)]
    if bad:
        raise SystemExit(f"unknown variant {bad[0]!r}: full, sign, top<d> or tern<d> (d >= 1), optionally +out")
    return names


def engine_passes(name: str) -> int | None:
    """XNOR-popcount passes the variant's sgn(dW) would need (None for the DSP baseline)."""
    base, kind, d, _ = _VARIANT.fullmatch(name).groups()
    if base == "full":
        return None
    return int(d) if kind == "top" else 1


def reduce_codes(codes: A.Po2Codes, name: str) -> A.Po2Codes:
    """The codes the variant ``name`` (without ``+out``) feeds to the dW product (same bias and unit exponent):
    the window of :func:`sim.hw.arith.dw_window_ternary` (what ``hw.dw_window`` computes), its codes weighing 1
    (``tern``, ``sign``: a window wider than any field) or keeping their po2 weight (``top``)."""
    if name == "full":
        return codes
    if name == "sign":
        window, weighted = 256, False  # fields are 8-bit: every nonzero code is in the window
    else:
        _, kind, d, _ = _VARIANT.fullmatch(name).groups()
        window, weighted = int(d), kind == "top"
    t = A.dw_window_ternary(codes, window)
    field = np.where(t != 0, codes.field if weighted else 1, 0).astype(np.uint8)
    return A.Po2Codes(t < 0, field, codes.bias, codes.unit_exp)


class DwPatch:
    """Installs a variant's ``po2_backward_dw`` in :mod:`sim.hw.arith` while the ``with`` block runs.

    ``calls`` counts the calls; the model makes one per layer and step, output layer first (``layers`` of them).
    While ``measuring`` is set, every call also computes dW from the full codes and appends the fraction of equal
    signs to ``row`` (output layer first).
    """

    def __init__(self, name: str, layers: int):
        base, _, _, out = _VARIANT.fullmatch(name).groups()
        self.base, self.full_output, self.layers = base, bool(out), layers
        self.calls = 0
        self.measuring = False
        self.row: list[float] = []
        self._real = A.po2_backward_dw

    def __call__(self, x, codes, p, x_max=1):
        output = self.calls % self.layers == 0
        self.calls += 1
        dw = self._real(x, reduce_codes(codes, "full" if output and self.full_output else self.base), p, x_max)
        if self.measuring:
            full = self._real(x, codes, p, x_max)
            self.row.append(float(np.mean(np.sign(dw) == np.sign(full))))
        return dw

    def __enter__(self) -> DwPatch:
        A.po2_backward_dw = self
        return self

    def __exit__(self, *exc) -> None:
        A.po2_backward_dw = self._real


class AgreementEngine(HwEngine):
    """:class:`HwEngine` that measures the dW sign agreement on step 0 and every ``every`` steps."""

    def __init__(self, cfg, patch: DwPatch, every: int):
        super().__init__(cfg)
        self.patch, self.every = patch, every
        self.agreement: list[dict] = []

    def train_step(self, x, y, *, lr, progress):
        step = self.model.steps
        self.patch.measuring = step == 0 or (self.every > 0 and step % self.every == 0)
        self.patch.row = []
        res = super().train_step(x, y, lr=lr, progress=progress)
        if self.patch.measuring:
            self.agreement.append({"step": step, "layers": self.patch.row[::-1]})
        self.patch.measuring = False
        return res


def make_config(overrides: list[str], epochs: int):
    return apply_overrides(load_config("mlp"), ["hw.optimizer=switch", f"train.epochs={epochs}", *overrides])


def check_patch(cfg) -> None:
    """One step of the patched ``full`` model must equal the unpatched model's, and the patch must be called."""
    from sim.train_loop import load_training_data

    data = load_training_data(cfg)
    b = cfg.train.batch_size
    x = HwEngine(cfg).prepare_inputs(data.x_train[:b])
    y = data.y_train[:b]
    ref = HwModel(cfg)
    tr_ref = ref.train_step(x, y, lr=cfg.lr)
    model = HwModel(cfg)
    with DwPatch("full", len(model.layers)) as patch:
        tr = model.train_step(x, y, lr=cfg.lr)
    assert A.po2_backward_dw is patch._real, "po2_backward_dw was not restored"
    assert patch.calls == len(model.layers), f"patched dW called {patch.calls} times, expected {len(model.layers)}"
    assert all(np.array_equal(a, c) for a, c in zip(tr.dw_sign, tr_ref.dw_sign, strict=True)), "dW signs differ"
    s, s_ref = model.state_dict(), ref.state_dict()
    assert all(np.array_equal(s[k], s_ref[k]) for k in s_ref), "the patched full step changed the state"


def run(name: str, cfg, out: Path, every: int) -> dict:
    from sim.train_loop import run_training

    path = out / f"{name}-{cfg.train.epochs}ep.json"
    with DwPatch(name, len(cfg.weight_layers())) as patch:
        engine = AgreementEngine(cfg, patch, every)
        t0 = time.perf_counter()
        hist = run_training(cfg, engine, progress=False, history_json=path)
        seconds = time.perf_counter() - t0
    assert patch.calls == hist.total_steps * patch.layers, f"{name}: patched dW called {patch.calls} times"
    hist.meta.update(dw_variant=name, engine_passes=engine_passes(name), dw_sign_agreement=engine.agreement,
                     wall_seconds=seconds)
    hist.to_json(path)
    return row(name, hist.to_dict(), seconds)


def row(name: str, h: dict, seconds: float) -> dict:
    acc = h["test_acc"]
    best = int(np.argmax(acc)) if acc else None
    agree = h["meta"].get("dw_sign_agreement") or []
    return {
        "variant": name,
        "passes": engine_passes(name),
        "epochs": len(h["epoch"]),
        "best_test_acc": acc[best] if acc else None,
        "best_epoch": h["epoch"][best] if acc else None,
        "final_test_acc": acc[-1] if acc else None,
        "seconds": round(seconds, 1),
        "agree_first_step": agree[0]["layers"] if agree else None,
        "agree_mean": np.mean([a["layers"] for a in agree], axis=0).tolist() if agree else None,
    }


HEADER = (f"{'variant':<8}{'passes':>7}{'epochs':>7}{'best % (ep)':>14}{'final %':>9}{'s':>8}"
          "  sgn(dW) agreement % per layer: step 0 | mean")


def _percent(v: list[float] | None) -> str:
    return " ".join(f"{100 * a:5.1f}" for a in v) if v else "-"


def line(r: dict) -> str:
    best = f"{100 * r['best_test_acc']:.2f} ({r['best_epoch']})"
    return (f"{r['variant']:<8}{r['passes'] or 'DSP':>7}{r['epochs']:>7}{best:>14}{100 * r['final_test_acc']:>9.2f}"
            f"{r['seconds']:>8.0f}  {_percent(r['agree_first_step'])} | {_percent(r['agree_mean'])}")


def summary(out: Path) -> list[dict]:
    rows = []
    for p in sorted(out.glob("*ep.json")):
        h = json.loads(p.read_text())
        name = h["meta"].get("dw_variant")
        if name and h["test_acc"]:
            rows.append(row(name, h, h["meta"].get("wall_seconds", sum(h["seconds"]))))
    return sorted(rows, key=lambda r: (r["epochs"], r["variant"]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", action="append", default=[],
                    help=f"variant or comma list, repeatable (default: {','.join(DEFAULT_VARIANTS)})")
    ap.add_argument("--epochs", type=int, default=50, help="training epochs per variant")
    ap.add_argument("--out", type=Path, default=Path("results/dw_planes"), help="output folder")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="config override key=value")
    ap.add_argument("--agree-every", type=int, default=100,
                    help="measure the dW sign agreement every N steps (and on step 0; 0 = step 0 only)")
    ap.add_argument("--json", action="store_true", help="print the result rows as JSON instead of a table")
    ap.add_argument("--summary", action="store_true", help="only report the finished runs in --out")
    args = ap.parse_args(argv)
    if args.summary:
        rows = summary(args.out)
        print(json.dumps(rows, indent=1) if args.json else "\n".join([HEADER, *map(line, rows)]))
        return 0
    names = parse_variants(args.variant)
    args.out.mkdir(parents=True, exist_ok=True)
    cfg = make_config(args.overrides, args.epochs)
    check_patch(cfg)
    rows = []
    for name in names:
        rows.append(run(name, cfg, args.out, args.agree_every))
        if not args.json:
            print(HEADER, line(rows[-1]), sep="\n", flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
