"""benchmarks/logic_depth.py on hand-made ECP5 netlists: the depth it counts, the path it names, combinational loops."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "logic_depth.py"


@pytest.fixture(scope="module")
def mod():
    spec = importlib.util.spec_from_file_location("logic_depth", PATH)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def _cell(kind: str, ports: dict) -> dict:
    """A cell of ``kind`` with ``ports``: name -> (direction, [bits])."""
    return {"type": kind, "port_directions": {p: d for p, (d, _) in ports.items()},
            "connections": {p: bits for p, (_, bits) in ports.items()}}


def _lut(a: int, z: int, b: int = 100) -> dict:
    return _cell("LUT4", {"A": ("input", [a]), "B": ("input", [b]), "C": ("input", ["0"]), "D": ("input", ["0"]),
                          "Z": ("output", [z])})


def _ff(d: int, q: int) -> dict:
    return _cell("TRELLIS_FF", {"CLK": ("input", [99]), "DI": ("input", [d]), "CE": ("input", ["1"]),
                                "LSR": ("input", ["0"]), "Q": ("output", [q])})


def _netlist(cells: dict, names: dict) -> dict:
    return {"modules": {"top": {"cells": cells, "netnames": {n: {"bits": [b]} for n, b in names.items()}}}}


def test_depth_of_a_lut_chain_between_two_units(mod):
    """eng.acc <- two LUTs <- wmem.q (a flip-flop): 0.5 + 2 levels; a parallel one-LUT path does not count; the
    pair is named by the units of its ends."""
    cells = {"ff0": _ff(1, 2), "l1": _lut(2, 3), "l2": _lut(3, 4), "ff1": _ff(4, 5),
             "l3": _lut(2, 6), "ff2": _ff(6, 7)}
    names = {"wmem.q": 2, "eng.t": 3, "eng.d": 4, "eng.acc": 5, "eng.short": 6, "eng.r": 7, "clk": 99}
    rep = mod.depth_report(_netlist(cells, names), "top")
    deepest = rep["pairs"][0]
    assert (deepest["from_unit"], deepest["to_unit"], deepest["depth"]) == ("wmem", "eng", 2.5)
    assert deepest["start"] == "wmem.q" and deepest["end"].startswith("eng.d") and deepest["via"] == ["eng.t"]
    assert rep["histogram"][2] == 1 and rep["histogram"][1] == 1  # the two data inputs (CE and LSR are constants)
    assert "| 2.5 | wmem | eng |" in mod.format_text(rep)


def test_carry_chain_and_block_ram_start(mod):
    """A block RAM's output (1.5) into a carry chain of three cells: 1 into the first, 0.08 per carry, 0.5 to the
    last sum; into a flip-flop."""
    cells = {"ram": _cell("DP16KD", {"CLKA": ("input", [99]), "ADA0": ("input", [50]), "DOA0": ("output", [1])})}
    cin = 1
    for k in range(3):
        cells[f"c{k}"] = _cell("CCU2C", {"A0": ("input", [1 if k == 0 else 51]), "CIN": ("input", [cin if k else 52]),
                                         "COUT": ("output", [10 + k]), "S0": ("output", [20 + k])})
        cin = 10 + k
    cells["ff"] = _ff(22, 30)
    rep = mod.depth_report(_netlist(cells, {"top_sum": 22, "mem.q": 1}), "top")
    assert rep["pairs"][0]["depth"] == pytest.approx(1.5 + 1.0 + 0.08 + 0.5)


def test_a_combinational_loop_is_cut_not_followed_forever(mod):
    cells = {"l1": _lut(2, 3), "l2": _lut(3, 2), "ff": _ff(3, 4)}
    rep = mod.depth_report(_netlist(cells, {"a.x": 2, "a.y": 3}), "top")
    assert rep["endpoints"] == 1 and rep["pairs"][0]["depth"] <= 2
    d = mod.Depth(_netlist(cells, {})["modules"]["top"])
    d.at(2)
    for b in (2, 3):  # the cut loop ends the path: no net twice (bit 100, the LUTs' other input, may start it)
        p = d.path(b)
        assert len(set(p)) == len(p) <= 3


def test_cli_names_a_missing_module(mod, tmp_path, capsys):
    f = tmp_path / "design.json"
    f.write_text(json.dumps(_netlist({}, {})))
    assert mod.main([str(f), "--top", "nope"]) == 2
    assert "no module 'nope'" in capsys.readouterr().err


def _xc7(kind: str, ins: dict, outs: dict) -> dict:
    return _cell(kind, {**{p: ("input", b) for p, b in ins.items()}, **{p: ("output", b) for p, b in outs.items()}})


def test_xc7_cells_and_black_boxes(mod):
    """A 7-series netlist (benchmarks/xc7z020_glue.py): FDRE -> two LUT6s -> a black box's input (0.5 + 2); the
    box's output -> a LUT3 -> CARRY4 -> FDRE (0.5 from the box, 1 + 1); a box's inputs are endpoints only when its
    type is named as a box."""
    cells = {"ff0": _xc7("FDRE", {"C": [99], "CE": ["1"], "R": ["0"], "D": [50]}, {"Q": [1]}),
             "l1": _xc7("LUT6", {"I0": [1], "I1": [60]}, {"O": [2]}),
             "l2": _xc7("LUT6", {"I0": [2], "I1": [60]}, {"O": [3]}),
             "box": _xc7("top.engine0", {"x": [3]}, {"y": [4]}),
             "l3": _xc7("LUT3", {"I0": [4]}, {"O": [5]}),
             "c0": _xc7("CARRY4", {"S": [5, "0", "0", "0"], "CI": ["0"]}, {"O": [6, 7, 8, 9], "CO": [10, 11, 12, 13]}),
             "ff1": _xc7("FDRE", {"C": [99], "CE": ["1"], "R": ["0"], "D": [6]}, {"Q": [14]})}
    names = {"ctl.q": 1, "ctl.a": 2, "ctl.b": 3, "engine0.y": 4, "sum": 6}
    rep = mod.depth_report(_netlist(cells, names), "top", boxes={"top.engine0"})
    by_end = {p["end"].split(" ")[0]: p["depth"] for p in rep["pairs"]}
    assert rep["pairs"][0]["depth"] == 2.5 and rep["pairs"][0]["end"].endswith("(top.engine0.x)")
    assert by_end["sum"] == pytest.approx(0.5 + 1 + 1)
    plain = mod.depth_report(_netlist(cells, names), "top")
    assert all("top.engine0" not in p["end"] for p in plain["pairs"])  # not a box: no endpoint, no start


def test_route_delays_walks_each_failing_endpoint_back_to_its_start(tmp_path, capsys):
    """benchmarks/route_delays.py on a hand-made detailed timing report: a flip-flop -> two LUTs -> a flip-flop's
    input arriving after the period is walked back through each LUT's latest input (not its first) to the
    flip-flop it starts at; an endpoint in time and a LUT's own input are not endpoints; a LUT-RAM's write
    address is one; a report without the detailed timing is refused with exit status 2."""
    spec = importlib.util.spec_from_file_location("route_delays", PATH.parent / "route_delays.py")
    rd = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rd)

    def net(name, driver, port, *sinks):
        return {"net": "\\" + name, "driver": driver, "port": port,
                "endpoints": [{"cell": c, "port": p, "delay": [a / 2, a]} for c, p, a in sinks]}

    report = {"detailed_net_timings": [
        net("u.a", "ffa", "Q", ("lut1", "A", 1.0), ("ffz", "DI", 2.0)),
        net("u.b", "ffb", "Q", ("lut1", "B", 4.0)),  # lut1's latest input
        net("u.c", "lut1", "F", ("lut2", "C", 9.0)),
        net("v.d", "lut2", "F", ("ffy", "DI", 13.0), ("ram", "WAD0", 13.5), ("ram", "RAD0", 14.0)),
        net("v.e", "ffy", "Q", ("x", "DI", 1.0)),
        net("v.f", "ffz", "Q", ("x", "CE", 1.0)),
        net("v.g", "ram", "F", ("x", "M", 15.0)),
    ]}
    paths = rd.failing_paths(report, 12.5)
    assert [(p["end"], p["end_port"], p["start"], p["nets"]) for p in paths] == [
        ("x", "M", "ffb", ["u.b", "u.c", "v.d", "v.g"]),
        ("ram", "WAD0", "ffb", ["u.b", "u.c", "v.d"]),
        ("ffy", "DI", "ffb", ["u.b", "u.c", "v.d"]),
    ]
    (tmp_path / "pnr.json").write_text(json.dumps(report))
    assert rd.main([str(tmp_path / "pnr.json")]) == 0
    assert "3 endpoints arrive later than 12.5 ns" in capsys.readouterr().out
    (tmp_path / "bare.json").write_text(json.dumps({"fmax": {}}))
    assert rd.main([str(tmp_path / "bare.json")]) == 2
