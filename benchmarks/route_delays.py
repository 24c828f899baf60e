"""The routed nets with the longest wires of an ECP5 place-and-route run, from nextpnr's detailed timing report.

Routing is most of every worst path of the whole design in context (docs/results/timing.md), and nextpnr prints one
critical path per clock. This ranks every net by the longest routed delay to any of its sinks, with its sink count,
so that the long or wide nets behind many near-critical paths show at once: a control net that spans the die, a
stream's ``ready`` reaching every payload bit, a phase register far from its loads.

    .venv/bin/python benchmarks/route_delays.py DIR/ecp5/pnr.json [--top 30] [--over 3.0]

``pnr.json`` is the ``--report`` of a run of boards/ecp5.py (``xnortrain generate --board ulx3s-85f`` or
benchmarks/ecp5_fmax.py), which asks nextpnr for ``--detailed-timing-report``. The unit is the first part of the
net's name (``po2b_1.dw_unit.finish`` -> ``po2b_1``); ``--over`` counts, per unit, the nets with a sink routed
further than that many nanoseconds.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path


def net_delays(report: dict) -> list[dict]:
    """``{"net", "driver", "sinks", "max_ns"}`` per routed net, longest first (``max_ns``: the largest of the
    upper delay bounds to its sinks)."""
    nets = report.get("detailed_net_timings")
    if nets is None:
        raise ValueError("the report has no detailed_net_timings: nextpnr ran without --detailed-timing-report")
    rows = []
    for n in nets:
        ends = n.get("endpoints", [])
        if not ends:
            continue
        worst = max(max(e["delay"]) if isinstance(e["delay"], list) else e["delay"] for e in ends)
        rows.append({"net": n["net"].lstrip("\\"), "driver": n["driver"].lstrip("\\"), "sinks": len(ends),
                     "max_ns": round(worst, 2)})
    rows.sort(key=lambda r: -r["max_ns"])
    return rows


def unit_of(net: str) -> str:
    head = net.split(".", 1)[0]
    return head if "." in net else "(top)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path, help="nextpnr's --report JSON (with --detailed-timing-report)")
    ap.add_argument("--top", type=int, default=30, help="how many nets to list (default 30)")
    ap.add_argument("--over", type=float, default=3.0, help="count per unit the nets over this many ns (default 3)")
    args = ap.parse_args(argv)
    try:
        rows = net_delays(json.loads(args.report.read_text()))
    except (OSError, ValueError) as e:
        print(f"route_delays: {args.report}: {e}", file=sys.stderr)
        return 2
    print(f"{len(rows):,} routed nets; the {min(args.top, len(rows))} longest:")
    print("| longest sink (ns) | sinks | net | driver |")
    print("| ---: | ---: | --- | --- |")
    for r in rows[: args.top]:
        print(f"| {r['max_ns']:.2f} | {r['sinks']:,} | `{r['net']}` | `{r['driver']}` |")
    per_unit = collections.Counter(unit_of(r["net"]) for r in rows if r["max_ns"] > args.over)
    print(f"\nnets with a sink over {args.over:g} ns, by unit: "
          + ", ".join(f"{u} {k}" for u, k in per_unit.most_common()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
