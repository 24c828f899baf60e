"""Fmax on the ECP5-85F (ULX3S) of a generated accelerator and of each of its units: the open place-and-route
timing proxy of issue 19 part 5 (:mod:`boards.ecp5`; a proxy for another family, not the Zynq's Fmax).

Every direct submodule of the top level is synthesised (``synth_ecp5``) and placed and routed out of context
(``nextpnr-ecp5 --out-of-context``: no I/O, Fmax of its register-to-register paths), after the whole design in
context with a bitstream (unless ``--units-only``), as ``xnortrain generate --board ulx3s-85f`` does; a whole
design that does not fit the die stops the script (exit 3) before the units. Each run is cached
under ``build/ecp5`` by its Verilog, so a second call prints the table at once; the Verilog itself is cached under
``build/ecp5/verilog`` by the configuration and the source of ``rtl_gen`` and ``sim`` (the paper design's
elaboration takes minutes). ``--list`` names the units (for ``--only``) and stops; ``--unit KIND`` builds one
shared unit alone (BN forward / backward / parameter, po2, engine, the weight memory, the po2 backward engine and
the generators of the first group of layers, the output layer's logit and loss units: the same RTL as in the design,
elaborated in seconds) and places and routes it out of context (``--seed N``: nextpnr's seed, each in its own cached
folder).

Output: one line per unit as it finishes, then a Markdown table (unit, Fmax, LUT4, FF, EBR, MULT18, critical path
for units below ``--flag`` MHz) and the sums; ``--out`` also writes the JSON.

Measured (2 shared cores): the 784-12-10 test MLP (lanes 32/8/2/8, batch 4; 2.2 MB of Verilog) synthesises in
3.5 min and places and routes in 27 min; its 36 units out of context take 18 min together. A whole-design
``synth_ecp5`` of 784-256-256-10 (lanes 32/8/1/8, batch 100; 4.1 MB) was still in Yosys's memory passes after
21 min (stopped): size the layers with ``--units-only``/``--synth-only`` first. Command for the 784-12-10 figures
(the same as ``xnortrain generate --model mlp --set ... --board ulx3s-85f --synth-by-unit``)::

    nice -n 15 .venv/bin/python benchmarks/ecp5_fmax.py --config mlp --set model.input_format=binary \
        --set train.batch_size=4 --set 'model.layers=[{type="dense",units=12},{type="dense",units=10}]' \
        --set hw.lanes_in=32 --set hw.lanes_out=8 --set hw.lanes_b=2 --set hw.update_lanes=8 \
        --set hw.dw_passes=4 --set hw.dx_passes=2 --out results/ecp5_fmax.json

The same settings are ``configs/timing_small.toml`` (``--config configs/timing_small.toml``). The in-context
figure of the timing work is the lowest of three nextpnr seeds (``--top-only --seed 1 --seed 2 --seed 3``; each
seed's place and route in its own cached folder, one after the other).
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

from boards.ecp5 import ULX3S_85F, run_ecp5, run_ecp5_units, seed_folder  # noqa: E402
from rtl_gen.toolchain import build_root  # noqa: E402
from rtl_gen.top import Accelerator, SystemPlan  # noqa: E402
from sim.config import apply_overrides, load_config  # noqa: E402


def _row(name: str, rep, flag: float) -> dict:
    u = rep.utilisation
    cp = rep.critical_path or {}
    return {"unit": name, "fmax_mhz": None if rep.fmax_mhz is None else round(rep.fmax_mhz, 1),
            **{k: u[k]["used"] for k in ("LUT4", "FF", "EBR", "MULT18")},
            "critical_path": (f"{cp.get('from')} -> {cp.get('to')}: {cp.get('delay_ns')} ns "
                              f"({cp.get('logic_ns')} logic, {cp.get('levels')} cells)") if cp else None,
            "below": rep.fmax_mhz is not None and rep.fmax_mhz < flag,
            "path": cp}


def source_key(cfg, overrides) -> str:
    """What the generated Verilog depends on: the configuration, its overrides and the source of the packages
    that elaborate it (rtl_gen, sim)."""
    import hashlib

    h = hashlib.sha256(repr((cfg, sorted(overrides))).encode())
    for pkg in ("rtl_gen", "sim"):
        for f in sorted((ROOT / pkg).rglob("*.py")):
            h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def elaborate(plan, cfg, overrides) -> tuple[str, bool]:
    """``(verilog, cached)``: ``Accelerator(plan).verilog()``, cached under ``build/ecp5/verilog`` by
    :func:`source_key` (the paper design's elaboration alone takes about 5 minutes)."""
    path = build_root() / "ecp5" / "verilog" / f"{plan.name}-{source_key(cfg, overrides)}.v"
    if path.is_file():
        return path.read_text(), True
    verilog = Accelerator(plan).verilog()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(verilog)
    tmp.replace(path)
    return verilog, False


#: ``--unit`` kinds: one shared unit of the configuration built alone, as rtl_gen/top.py builds it for the first
#: group of layers (no whole-design elaboration: seconds instead of minutes at the paper's widths)
UNIT_KINDS = ("bn_fwd", "bn_bwd", "bn_param", "po2", "engine", "wmem", "po2b", "rng", "logit", "loss")


def standalone_unit(plan, kind: str):
    """The ``kind`` unit of ``plan`` (:data:`UNIT_KINDS`) for its first group of layers."""
    from rtl_gen.bn_unit import BnBackwardUnit, BnForwardUnit
    from rtl_gen.po2_unit import Po2Unit
    from rtl_gen.xnor_engine import XnorEngineCore

    hw, lp = plan.cfg.hw, plan.layers
    grp = plan.unit_groups["engine" if kind == "engine" else "bn"][0]
    env, chans = plan.bn_envelope(grp), [lp[j].n_out for j in grp]
    if kind == "bn_fwd":
        return BnForwardUnit(layer=env, div_steps=hw.div_steps, channels=chans)
    if kind == "bn_bwd":
        return BnBackwardUnit(layer=env, channels=chans, pass2_lanes=plan.po2_lanes(lp[grp[0]].lanes_out))
    if kind == "po2":
        return Po2Unit(layer=env, mul_steps=hw.mul_steps, channels=chans, tops=[lp[j].top for j in grp],
                       pass1_lanes=plan.po2_lanes(lp[grp[0]].lanes_out))
    if kind == "engine":
        return XnorEngineCore(geometries=[lp[j].geometry for j in grp])
    if kind == "wmem":
        from rtl_gen.weight_memory import WeightMemory

        return WeightMemory(geometries=[plan.wmem_geometry(j) for j in plan.wmem_groups[0]])
    if kind == "po2b":
        from rtl_gen.po2_backward import Po2Backward

        return Po2Backward(shapes=[plan.po2_geometry(j) for j in plan.backward_groups[0]])
    if kind == "rng":
        from rtl_gen.rng import RngEngine

        return RngEngine(geometries=[plan.rng_geometry(j) for j in plan.rng_groups[0]])
    if kind in ("logit", "loss"):  # the output layer's units
        from rtl_gen.loss_unit import LossGradUnit, OutputLogitUnit

        cls = OutputLogitUnit if kind == "logit" else LossGradUnit
        return cls.from_config(plan.cfg, lanes=plan.loss_lanes, div_steps=hw.div_steps)
    return plan.bn_param_unit()


def run_standalone(plan, kinds, freq: float, flag: float, seed: int = 1) -> list[dict]:
    """Place and route each unit of ``kinds`` alone (out of context), cached by its Verilog (and the nextpnr
    ``seed``) under build/ecp5/units."""
    import hashlib

    from amaranth.back import verilog as amaranth_verilog

    rows = []
    for kind in kinds:
        text = amaranth_verilog.convert(standalone_unit(plan, kind), name=kind)
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        rep = run_ecp5(text, kind, workdir=seed_folder(build_root() / "ecp5" / "units" / f"{kind}-{digest}", seed),
                       board=ULX3S_85F, freq_mhz=freq, out_of_context=True, bitstream=False, check_fit=False,
                       seed=seed)
        rows.append(_row(f"{kind} (alone{'' if seed == 1 else f', seed {seed}'})", rep, flag))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "path"}), flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/mlp_mnist.toml")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="configuration override")
    ap.add_argument("--only", action="append", default=[], metavar="PREFIX", help="only units with this prefix")
    ap.add_argument("--units-only", action="store_true", help="skip the whole design (in context, bitstream)")
    ap.add_argument("--top-only", action="store_true", help="only the whole design")
    ap.add_argument("--synth-only", action="store_true",
                    help="whole design: synthesis and the fit check only (estimated LUT4/FF/EBR/MULT18/IO), no units")
    ap.add_argument("--pins", action="store_true",
                    help="place the whole design with a pin per port bit instead of inside the stand-in for the PS "
                         "(boards.ecp5.ps_shell_verilog)")
    ap.add_argument("--flag", type=float, default=100.0, help="name the critical path of units below this (MHz)")
    ap.add_argument("--seed", type=int, action="append", default=[], metavar="N",
                    help="whole design: nextpnr seed (repeat for several: one run after the other, each cached in "
                         "its own folder; the lowest Fmax is the figure); default 1; with --unit the first one")
    ap.add_argument("--out", help="also write the rows as JSON")
    ap.add_argument("--list", action="store_true", help="list the units (names and Verilog sizes) and stop")
    ap.add_argument("--unit", action="append", default=[], choices=UNIT_KINDS,
                    help="place and route this unit kind built alone (no whole-design elaboration) and stop")
    args = ap.parse_args(argv)

    cfg = apply_overrides(load_config(args.config), args.set)
    plan = SystemPlan(cfg)
    freq = float(plan.description().clock_mhz)
    if args.unit:
        rows = run_standalone(plan, args.unit, freq, args.flag, *args.seed[:1])
        for r in rows:
            print(f"| {r['unit']} | {r['fmax_mhz']} | {r['LUT4']:,} | {r['FF']:,} | {r['EBR']} | {r['MULT18']} | "
                  f"{r['critical_path']} |")
        return 0
    t0 = time.monotonic()
    verilog, cached = elaborate(plan, cfg, args.set)
    print(f"{cfg.name} {[plan.features] + [lp.n_out for lp in plan.layers]}, batch {plan.batch}: "
          f"{len(verilog) / 1e6:.1f} MB of Verilog in {time.monotonic() - t0:.0f} s"
          + (" (cached)" if cached else ""), flush=True)
    rows, top = [], None
    only = (lambda n: any(n.startswith(p) for p in args.only)) if args.only else None
    if args.list:
        from rtl_gen.synth import part_texts

        for name, _alias, text, _boxes in part_texts(verilog, plan.name, only=only, include_top=False):
            print(f"{name} ({len(text) / 1e3:,.0f} kB)")
        return 0
    if not args.units_only:
        import hashlib

        from rtl_gen.synth import DoesNotFitError

        digest = hashlib.sha256(verilog.encode()).hexdigest()[:12]
        # the synthesis alone (make test-timing's depth guard) and --pins place the design as it is; a place and
        # route puts it inside the stand-in for the PS (the folder of `xnortrain generate --board ulx3s-85f`)
        shell = not (args.synth_only or args.pins)
        base = build_root() / "ecp5" / (f"{plan.name}-{digest}" + ("-ps" if shell else ""))
        seeds = args.seed or [1]
        reports = {}
        try:
            for seed in seeds:
                rep = run_ecp5(verilog, plan.name, workdir=seed_folder(base, seed), board=ULX3S_85F, freq_mhz=freq,
                               bitstream=True, place=not args.synth_only, seed=seed, ps_shell=shell, log=print)
                reports[seed] = rep
                if args.synth_only:
                    break
                print(f"seed {seed}: {rep.format_text()}", flush=True)
        except DoesNotFitError as e:
            print(f"DOES NOT FIT: {e}", flush=True)
            return 3
        rep = min(reports.values(), key=lambda r: r.fmax_mhz or 0.0)
        if args.synth_only:
            print("fits (synth_ecp5 estimate, before place and route): "
                  + ", ".join(f"{k} {v:,.0f} of {ULX3S_85F.limits[k]:,}" for k, v in rep.synth.items()
                              if k in ULX3S_85F.limits), flush=True)
            return 0
        top = {**_row("(whole design, in context)", rep, args.flag), "IO": rep.utilisation["IO"]["used"],
               "bitstream": str(rep.bitstream), "elapsed_s": rep.elapsed_s,
               "seeds": {s: None if r.fmax_mhz is None else round(r.fmax_mhz, 2) for s, r in reports.items()}}
        if len(reports) > 1:
            print("Fmax by seed: " + ", ".join(f"{s}: {v} MHz" for s, v in top["seeds"].items())
                  + f"; the lowest, seed {min(top['seeds'], key=lambda s: top['seeds'][s] or 0)}, is the figure")
    unfit = []
    if not args.top_only:
        from rtl_gen.synth import DoesNotFitError, part_texts

        for name, *_ in part_texts(verilog, plan.name, only=only, include_top=False):
            try:  # one unit at a time, so that a unit that does not fit the die does not stop the others
                for _, rep in run_ecp5_units(verilog, plan.name, board=ULX3S_85F, freq_mhz=freq,
                                             only=lambda n, name=name: n == name):
                    row = _row(name, rep, args.flag)
                    rows.append(row)
                    print(json.dumps({k: v for k, v in row.items() if k != "path"}), flush=True)
            except DoesNotFitError as e:
                unfit.append({"unit": name, "does_not_fit": "; ".join(getattr(e, "overflows", [str(e)]))})
                print(json.dumps(unfit[-1]), flush=True)

    print("\n| unit | Fmax (MHz) | LUT4 | FF | EBR | MULT18 |\n| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in sorted(rows, key=lambda r: r["fmax_mhz"] or 0):
        print(f"| {r['unit']} | {r['fmax_mhz']} | {r['LUT4']:,} | {r['FF']:,} | {r['EBR']} | {r['MULT18']} |")
    if rows:
        tot = {k: sum(r[k] for r in rows) for k in ("LUT4", "FF", "EBR", "MULT18")}
        print(f"| sum of units | | {tot['LUT4']:,} | {tot['FF']:,} | {tot['EBR']} | {tot['MULT18']} |")
    if top is not None:
        print(f"| **whole design** (in context, IO {top['IO']}) | **{top['fmax_mhz']}** | {top['LUT4']:,} | "
              f"{top['FF']:,} | {top['EBR']} | {top['MULT18']} |")
    for r in unfit:
        print(f"| {r['unit']} | does not fit: {r['does_not_fit']} | | | | |")
    for r in [*rows, *([top] if top else [])]:
        if r["below"]:
            print(f"below {args.flag:g} MHz: {r['unit']}: {r['critical_path']}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        out = {"config": cfg.name, "overrides": args.set, "units": rows, "unfit": unfit, "top": top}
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
