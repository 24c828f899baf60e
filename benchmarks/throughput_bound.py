"""How far the generated accelerator's architecture can take a network on a device: the work of one training step,
where today's cycles go, and what a cycles-per-image target would demand of each part.

Work of one step (batch ``B``; layer ``j`` with fan-in ``N_j`` and ``M_j`` channels):

* forward XNOR-popcount: ``sum_j B N_j M_j`` bit operations;
* dX (every layer but the first) and dW (every layer): ``B N_j M_j`` power-of-two multiply-accumulates each
  (a +-1 activation or weight times a po2 code, summed).

Today's step (:mod:`rtl_gen.cycle_model`) is split into the po2 array's phases (``dx``, ``upd``), the XNOR
engine's words inside ``fwd`` (``B x words x groups`` per layer) and the rest: BN forward's replays and
per-channel epilogues, ``bwd`` (BN backward and the po2 unit), which do ``O(B M)`` and ``O(M)`` work.

Two bounds for the target (``--target`` cycles per image, ``B`` times that per step):

* **DSP ceiling**: a DSP48 slice holds at most two po2 accumulators (``Po2Geometry.dsp_fields``: 24-bit fields
  for the worst-case sums of ``B`` codes), four ternary dW sums with ``hw.dw_window`` where the array packs
  pairs (``Po2Geometry.dw_pairs``), and the other units keep their slices (resource model); the slices left
  bound dX + dW from below, whatever the fabric does for the rest.
* **the rest as it is**: if the engine and the non-array phases kept today's cycles, the multiply-accumulates
  per cycle dX + dW would need to fit the target, and the LUTs the part beyond the DSP slices would take in
  fabric at ``--fabric-lut-per-mac`` (the paper MLP's fabric dX unit: about 4,100 LUT more than the array
  for 256 MAC a cycle, docs/architecture.md section 5).

    .venv/bin/python benchmarks/throughput_bound.py [--config FILE] [--set key=value ...] [--device xc7z020]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: LUTs per po2 multiply-accumulate a cycle in fabric (the fabric dX unit of the paper's MLP against the array)
FABRIC_LUT_PER_MAC = 16.0


def step_work(plan) -> dict:
    """Bit operations of the forward engine and po2 multiply-accumulates of dX and dW in one step."""
    B = plan.batch
    fwd = sum(B * lp.n_in * lp.n_out for lp in plan.layers)
    dx = sum(B * lp.n_in * lp.n_out for lp in plan.layers[1:])
    dw = sum(B * lp.n_in * lp.n_out for lp in plan.layers)
    return {"xnor_bit_ops": fwd, "dx_macs": dx, "dw_macs": dw}


def cycle_split(plan) -> dict:
    """Today's step by part: ``array`` (dx, upd phases), ``engine`` (the XNOR engine's words of each fwd), ``rest``."""
    from rtl_gen.cycle_model import step_cycles

    rep = step_cycles(plan)
    array = sum(v for k, v in rep.phases.items() if k.startswith(("dx", "upd")))
    engine = sum(lp.geometry.cycles(plan.batch) for lp in plan.layers)
    return {"step": rep.step, "array": array, "engine": engine, "rest": rep.step - array - engine,
            "phases": dict(rep.phases)}


def bound(plan, device: str, target: float, fabric_lut_per_mac: float = FABRIC_LUT_PER_MAC) -> dict:
    from boards.devices import get_device
    from rtl_gen.resource_model import load_model

    dev = get_device(device)
    work = step_work(plan)
    split = cycle_split(plan)
    pred = load_model().predict(plan, dev.family)
    dsp_array = sum(r["DSP"] for inst, r in pred["units"] if inst.kind == "po2b")
    dsp_other = pred["total"]["DSP"] - dsp_array
    geos = [plan.po2_geometry(j) for j in range(len(plan.layers))]
    fields = max(g.dsp_fields for g in geos)
    # with hw.dw_window the dW sums are ternary and at most B: four to a slice where the array packs pairs
    dw_fields = 2 * fields if any(g.dw_pairs for g in geos) else fields
    macs = work["dx_macs"] + work["dw_macs"]
    budget = target * plan.batch
    dsp_free = dev.limits["DSP"] - dsp_other
    dsp_macs = dsp_free * fields  # accumulators a cycle if every free slice joined the array
    out = {
        "device": dev.name, "target_per_image": target, "budget_per_step": budget, "work": work,
        "today": {k: split[k] for k in ("step", "array", "engine", "rest")},
        "today_per_image": split["step"] / plan.batch,
        "dsp": {"device": dev.limits["DSP"], "other_units": dsp_other, "array_today": dsp_array,
                "fields_per_slice": fields, "dw_fields_per_slice": dw_fields},
        "dsp_ceiling_cycles": work["dx_macs"] / dsp_macs + work["dw_macs"] / (dsp_free * dw_fields),
    }
    left = budget - split["engine"] - split["rest"]
    out["left_for_dx_dw"] = left
    if left > 0:
        need = macs / left
        out["macs_per_cycle_needed"] = need
        out["fabric_macs_needed"] = max(0.0, need - dsp_macs)
        out["fabric_lut_needed"] = out["fabric_macs_needed"] * fabric_lut_per_mac
    lut = dev.limits["LUT"]
    out["lut"] = {"device": lut, "limit_70": 0.7 * lut, "design_today": pred["total"]["LUT"]}
    return out


def format_text(b: dict) -> str:
    w, t, d = b["work"], b["today"], b["dsp"]
    pct = lambda v: f"{100 * v / t['step']:.0f} %"  # noqa: E731
    lines = [
        f"work of one step: {w['xnor_bit_ops']:,} XNOR bit operations, {w['dx_macs']:,} dX and "
        f"{w['dw_macs']:,} dW po2 multiply-accumulates",
        f"today (cycle model): {t['step']:,} cycles a step = {b['today_per_image']:,.0f} per image: po2 array "
        f"(dx, upd) {t['array']:,} ({pct(t['array'])}), XNOR engine {t['engine']:,} ({pct(t['engine'])}), "
        f"BN / po2 passes and epilogues {t['rest']:,} ({pct(t['rest'])})",
        f"target {b['target_per_image']:,.0f} cycles per image = {b['budget_per_step']:,.0f} a step on the "
        f"{b['device']}",
        f"DSP ceiling: {d['device']} DSP48 - {d['other_units']:.0f} in other units = "
        f"{d['device'] - d['other_units']:.0f} slices x {d['fields_per_slice']} accumulators (dW: "
        f"{d['dw_fields_per_slice']}): dX + dW alone "
        f"take at least {b['dsp_ceiling_cycles']:,.0f} cycles ({b['dsp_ceiling_cycles'] / b['budget_per_step']:.2f} "
        f"of the budget)",
    ]
    if b["left_for_dx_dw"] <= 0:
        lines.append(f"the engine and the BN / po2 parts alone take {t['engine'] + t['rest']:,} cycles: more than "
                     f"the budget, before any dX or dW")
    else:
        lines.append(
            f"with the engine and the BN / po2 parts as they are, dX + dW get {b['left_for_dx_dw']:,.0f} cycles: "
            f"{b['macs_per_cycle_needed']:,.0f} multiply-accumulates a cycle, {b['fabric_macs_needed']:,.0f} of "
            f"them in fabric = about {b['fabric_lut_needed']:,.0f} LUT (the design today: "
            f"{b['lut']['design_today']:,.0f} LUT, the 70 % line {b['lut']['limit_70']:,.0f})")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="mlp", help="a preset name or TOML file (default: the paper's MLP)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="configuration override")
    ap.add_argument("--device", default="xc7z020")
    ap.add_argument("--target", type=float, default=1200.0, help="cycles per training image (default 1,200)")
    ap.add_argument("--fabric-lut-per-mac", type=float, default=FABRIC_LUT_PER_MAC)
    ap.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = ap.parse_args(argv)
    from rtl_gen.top import SystemPlan
    from sim.config import apply_overrides, load_config

    plan = SystemPlan(apply_overrides(load_config(args.config), args.set))
    b = bound(plan, args.device, args.target, args.fabric_lut_per_mac)
    print(format_text(b))
    if args.json:
        args.json.write_text(json.dumps(b, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
