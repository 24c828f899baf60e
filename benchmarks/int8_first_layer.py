"""What an 8-bit first layer (``hw.input = "int8"``) would cost the generated accelerator: an estimate.

The RTL has no 8-bit first-layer path (``SystemPlan`` refuses ``hw.input = "int8"``). This script prices the
cheapest path that reuses the existing engines, so that the decision can be taken on numbers:

* forward: ``x = pixel - 128`` split into its 8 bit planes ``q_k`` plus one all-ones plane; the XNOR engine
  counts ``c_k = popcount(XNOR(q_k, w))`` per plane, and ``Y = sum_k 2^k c_k - c_ones - 127 N`` (exact: with
  ``w = 2 omega - 1``, ``sum_i q_ik w_i = (2 c_k - N + sum_i w_i) / 2`` and ``sum_i w_i = 2 c_ones - N``). Nine
  engine passes over layer 0 instead of one; the BN statistics run once.
* dW of layer 0: either nine passes of the dW tiles (the same planes), or one product per DSP48 slice on the
  array (an 8-bit activation times the po2 value does not leave room for a second field): twice the tiles.
* storage: the retained first-layer input is 8 bits per pixel instead of 1.

Cycles come from :mod:`rtl_gen.cycle_model` (the phases ``fwd0`` and ``upd0`` of the binary design, which the
RTL matches within 0.5 %); the engine part of ``fwd0`` is ``B * words * groups``. Block RAM is counted as
36 Kib blocks of the retained input alone, i.e. a lower bound.

    .venv/bin/python benchmarks/int8_first_layer.py [--set key=value ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PLANES = 9  # eight bit planes of the pixel and the all-ones plane (the weights' column sums)


def bit_plane_forward(x, w):
    """``Y = X W`` for 8-bit ``x = pixel - 128`` ([B, N]) and +-1 ``w`` ([N, M]) from nine XNOR-popcount passes
    (the identity in the module docstring); tests check it against :func:`sim.hw.arith.xnor_popcount`."""
    import numpy as np

    pixel = np.asarray(x, dtype=np.int64) + 128
    omega = (np.asarray(w) > 0).astype(np.int64)
    n = pixel.shape[1]

    def xnor_count(bits):  # popcount(XNOR(bits, omega)) per (sample, output)
        return bits @ omega + (1 - bits) @ (1 - omega)

    y = sum((xnor_count((pixel >> k) & 1) << k) for k in range(8))
    c_ones = xnor_count(np.ones_like(pixel))
    return y - c_ones - 127 * n


def estimate(cfg) -> dict:
    from rtl_gen.cycle_model import step_cycles
    from rtl_gen.top import SystemPlan

    plan = SystemPlan(cfg)
    rep = step_cycles(plan)
    l0 = plan.layers[0]
    B = plan.batch
    engine0 = B * l0.words * l0.groups
    fwd_extra = (PLANES - 1) * engine0
    upd0 = rep.phases["upd0"]
    upd_planes = (PLANES - 1) * upd0  # the sweep hides under the tiles in the binary design too
    upd_dsp = upd0  # one product per slice: the dW tiles twice
    bits8 = B * l0.n_in * 8
    bits1 = B * l0.words * l0.lanes_in
    out = {
        "binary": {"step": rep.step, "per_image": round(rep.per_image, 1)},
        "fwd0_binary": rep.phases["fwd0"], "fwd0_int8": rep.phases["fwd0"] + fwd_extra,
        "upd0_binary": upd0, "upd0_int8_planes": upd0 + upd_planes, "upd0_int8_dsp": upd0 + upd_dsp,
        "int8_planes": {"step": rep.step + fwd_extra + upd_planes,
                        "per_image": round((rep.step + fwd_extra + upd_planes) / B, 1)},
        "int8_dsp_dw": {"step": rep.step + fwd_extra + upd_dsp,
                        "per_image": round((rep.step + fwd_extra + upd_dsp) / B, 1)},
        "retained_input_bits": {"binary": bits1, "int8": bits8},
        "retained_input_bram36": {"binary": round(bits1 / 36864, 1), "int8": round(bits8 / 36864, 1)},
    }
    return out


def main(argv=None) -> int:
    from sim.config import apply_overrides, load_config

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    cfg = apply_overrides(load_config("mlp"), ["hw.input=binary", *args.set])
    est = estimate(cfg)
    print(json.dumps(est, indent=1))
    print(f"cycles per image: binary {est['binary']['per_image']:,}, int8 with bit planes "
          f"{est['int8_planes']['per_image']:,}, int8 with dW on the DSP48 array "
          f"{est['int8_dsp_dw']['per_image']:,}; retained input BRAM36 "
          f"{est['retained_input_bram36']['binary']} -> {est['retained_input_bram36']['int8']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
