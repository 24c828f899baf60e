"""Every failing routed path of an ECP5 place-and-route run, grouped, from nextpnr's detailed timing report.

nextpnr prints one critical path per clock; a design far from its clock has thousands of failing endpoints behind
it. Its detailed timing report gives the latest arrival time at each sink of a net. This script walks back from
every register input (or memory write port) whose arrival is later than the clock period, always through the
latest input of each cell, as far as the report reaches, and groups the failing endpoints by (that cell, end
unit): the groups with the most endpoints are the structures to fix first.

How far back that reaches: nextpnr-ecp5 0.11's report lists only the nets into clocked sinks (flip-flop D, CE and
LSR, LUT-RAM write ports, block-RAM inputs), not the nets between LUTs, so on its reports the walk stops at the
cell that drives the endpoint's net (``from`` is the path's last LUT, not its start flip-flop). The start of one
path per run is in the report's ``critical_paths`` (and nextpnr.log); to find a group's start, look up the
net in the synthesised design.v.

    .venv/bin/python benchmarks/route_delays.py DIR/ecp5/pnr.json [--period 12.5] [--top 25]

``pnr.json`` is the ``--report`` of a run of boards/ecp5.py (``xnortrain generate --board ulx3s-85f`` or
benchmarks/ecp5_fmax.py), which asks nextpnr for ``--detailed-timing-report``. The unit is the first part of a
name (``po2b_1.dw_unit.finish`` -> ``po2b_1``). ``--period`` is the clock period to check against (12.5 ns: 80 MHz).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

from boards.ecp5 import PS_CORE


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
    net = net.removeprefix(PS_CORE + ".")  # the design inside the PS stand-in (boards.ecp5.ps_shell_verilog)
    head = net.split(".", 1)[0]
    return head if "." in net else "(top)"


#: output ports where a path starts: flip-flop, block-RAM read register, I/O input
def _starts_path(port: str) -> bool:
    return port == "Q" or port.startswith("DO") or port == "O"


#: LUT-RAM write ports: a path ends there (the read address, ``RAD``, goes on to the read data)
def _write_port(port: str) -> bool:
    return port.startswith(("WD", "WAD", "WRE"))


def failing_paths(report: dict, period_ns: float) -> list[dict]:
    """``{"end", "end_port", "arrival", "start", "nets"}`` for every endpoint (a flip-flop or block-RAM input, a
    LUT-RAM write port) whose latest arrival exceeds ``period_ns``, latest first; ``nets`` the path's nets from the
    start, each reached through the latest input of the cell it leaves."""
    nets = report.get("detailed_net_timings")
    if nets is None:
        raise ValueError("the report has no detailed_net_timings: nextpnr ran without --detailed-timing-report")
    arrival, feed = {}, {}  # (cell, port) -> latest arrival, its net
    driver_ports = collections.defaultdict(set)
    for n in nets:
        driver_ports[n["driver"]].add(n["port"])
        for e in n.get("endpoints", []):
            a = max(e["delay"]) if isinstance(e["delay"], list) else e["delay"]
            arrival[e["cell"], e["port"]] = a
            feed[e["cell"], e["port"]] = n
    inputs = collections.defaultdict(list)  # cell -> [(arrival, port)] of its combinational inputs
    for (cell, port), a in arrival.items():
        if not _write_port(port):
            inputs[cell].append((a, port))

    def is_endpoint(cell, port):
        outs = driver_ports.get(cell, set())
        return _write_port(port) or not outs or all(_starts_path(p) for p in outs)

    out = []
    for (cell, port), a in arrival.items():
        if a <= period_ns or not is_endpoint(cell, port):
            continue
        path, at = [], (cell, port)
        for _ in range(200):
            n = feed[at]
            path.append(n["net"].lstrip("\\"))
            drv = n["driver"]
            if _starts_path(n["port"]) or not inputs.get(drv):
                break
            at = (drv, max(inputs[drv])[1])
        out.append({"end": cell.lstrip("\\"), "end_port": port, "arrival": round(a, 2),
                    "start": feed[at]["driver"].lstrip("\\"), "nets": path[::-1]})
    out.sort(key=lambda r: -r["arrival"])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path, help="nextpnr's --report JSON (with --detailed-timing-report)")
    ap.add_argument("--period", type=float, default=12.5, help="clock period in ns (default 12.5: 80 MHz)")
    ap.add_argument("--top", type=int, default=25, help="how many groups to list (default 25)")
    args = ap.parse_args(argv)
    try:
        paths = failing_paths(json.loads(args.report.read_text()), args.period)
    except (OSError, ValueError) as e:
        print(f"route_delays: {args.report}: {e}", file=sys.stderr)
        return 2
    groups = collections.defaultdict(list)
    for p in paths:
        groups[p["start"], unit_of(p["end"])].append(p)
    print(f"{len(paths):,} endpoints arrive later than {args.period:g} ns, from {len(groups):,} (start, end unit) "
          f"groups; by end unit: " + ", ".join(
              f"{u} {k}" for u, k in collections.Counter(unit_of(p["end"]) for p in paths).most_common()))
    print("\n| endpoints | latest (ns) | from (as far back as the report goes) | end unit | the latest path's nets |")
    print("| ---: | ---: | --- | --- | --- |")
    ranked = sorted(groups.items(), key=lambda kv: (-len(kv[1]), -kv[1][0]["arrival"]))
    for (start, end_unit), ps in ranked[: args.top]:
        worst = ps[0]
        print(f"| {len(ps):,} | {worst['arrival']:.2f} | `{start}` | {end_unit} | "
              + " / ".join(worst["nets"][:6]) + (" / ..." if len(worst["nets"]) > 6 else "") + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
