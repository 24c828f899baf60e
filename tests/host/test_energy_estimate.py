"""The energy estimate (host/energy_estimate.py) and its device constants (boards/power.py)."""

from __future__ import annotations

import re

import pytest
from small_mlp import SMALL  # the small MLP of the system tests (tests/small_mlp.py)

from boards.power import CONSTANTS, DEFAULT_TOGGLE_RATE, PL_RAILS, REPORTS, Constant
from host.energy_estimate import (
    Activity,
    activity_from_coverage,
    classify_verilog,
    estimate_energy,
    read_coverage,
    resources_from_report,
)

# --- the constants and their sources ------------------------------------------------------------------------


def test_every_constant_names_its_sources():
    assert set(CONSTANTS) == {"static_w", "lut_j", "signal_j", "ff_j", "clock_j", "bram_j", "dsp_j"}
    known = {r.source for r in REPORTS}
    for name, c in CONSTANTS.items():
        assert c.sources, f"{name} has no source"
        assert set(c.sources) <= known, f"{name}: a source that is not one of boards.power.REPORTS"
        assert c.derivation and c.meaning and c.unit in ("W", "J"), name
        assert 0 <= c.low <= c.value <= c.high, name
    for r in REPORTS:
        assert re.fullmatch(r"[0-9a-f]{40}", r.commit), r.repo
        assert r.repo.count("/") == 1 and r.path, r.repo


def test_transcribed_supply_rails_add_up_to_the_reports_device_static():
    """Every rail's static current x voltage, PL and PS, adds up to the report's 'Device Static (W)' (within the
    reports' rounding to 1 mA): a check on the numbers copied from the reports."""
    for r in REPORTS:
        total = sum(v * a for v, a in r.static_a.values())
        assert total == pytest.approx(r.device_static_w, abs=0.004), r.repo
        assert 0 < r.pl_static_w < total
    assert {"Vccint", "Vccaux", "Vccbram"} <= set(PL_RAILS) and "Vccpint" not in PL_RAILS


def test_per_toggle_energy_is_power_over_count_rate_and_clock():
    r = next(r for r in REPORTS if r.repo == "alencar-felipe/cva6-softcore-contest")
    # LUT as Logic 0.014 W, 19,978 LUTs, 12.5 %, 50 MHz: 0.014 / (19978 * 0.125 * 50e6) = 1.121e-13 J
    assert DEFAULT_TOGGLE_RATE == 0.125 and r.f_hz == pytest.approx(50e6)
    lut = 0.014 / (19978 * 0.125 * 50e6)
    assert lut == pytest.approx(1.1212e-13, rel=1e-4)
    assert CONSTANTS["lut_j"].high == pytest.approx(lut)  # the largest of the three vectorless reports
    assert CONSTANTS["static_w"].value == pytest.approx(0.0721, abs=1e-4)  # median of 0.0711, 0.0711, 0.0731, 0.081


# --- arithmetic on hand-made inputs ---------------------------------------------------------------------------


def _const(**values):
    return {k: Constant(name=k, value=v, low=v / 2, high=v * 2, unit="J", meaning="", derivation="", sources=("x",))
            for k, v in values.items()}


UNIT = dict(static_w=0.1, lut_j=1e-12, signal_j=2e-12, ff_j=3e-12, clock_j=4e-12, bram_j=5e-12, dsp_j=6e-12)


def test_estimate_arithmetic_known_answer():
    act = Activity(cycles=1000, ff_bits=100, ff_toggles=10_000, comb_bits=200, comb_toggles=40_000, mem_bits=0)
    assert (act.alpha_ff, act.alpha_comb) == (0.1, 0.2)
    res = {"LUT_logic": 1000, "FF": 500, "BRAM36": 10, "DSP": 4}
    e = estimate_energy(res, act, clock_mhz=100, batch=10, constants=_const(**UNIT))
    # 1000 cycles at 100 MHz = 10 us; static 0.1 W x 10 us = 1 uJ
    assert e.static_uj == pytest.approx(1.0)
    # per cycle: LUT 0.2 x 1000 = 200 toggles x 1 pJ; FF 0.1 x 500 = 50 x 3 pJ; nets 250 x 2 pJ; clock 500 x 4 pJ;
    # BRAM 10 x 5 pJ; DSP 4 x 6 pJ; times 1000 cycles, in uJ
    want = {"lut": 0.2, "ff": 0.15, "nets": 0.5, "clock": 2.0, "bram": 0.05, "dsp": 0.024}
    assert e.dynamic_uj == pytest.approx(want)
    assert e.per_step_uj == pytest.approx(1.0 + sum(want.values()))
    assert e.per_image_uj == pytest.approx(e.per_step_uj / 10)
    assert e.low_per_image_uj == pytest.approx(e.per_image_uj / 2) and e.high_per_image_uj == pytest.approx(
        e.per_image_uj * 2)
    assert "ESTIMATE" in e.label and "ESTIMATE" in e.format_text()
    # cycles given explicitly scale static and dynamic alike
    e2 = estimate_energy(res, act, clock_mhz=100, batch=10, cycles=2000, constants=_const(**UNIT))
    assert e2.per_step_uj == pytest.approx(2 * e.per_step_uj)


def test_estimate_refuses_bad_inputs_naming_the_field():
    act = Activity(cycles=10, ff_bits=1, ff_toggles=1, comb_bits=1, comb_toggles=1, mem_bits=0)
    good = {"LUT_logic": 1, "FF": 1, "BRAM36": 1, "DSP": 1}
    with pytest.raises(ValueError, match=r"resources\.DSP"):
        estimate_energy({k: v for k, v in good.items() if k != "DSP"}, act, clock_mhz=100, batch=1)
    with pytest.raises(ValueError, match="clock_mhz"):
        estimate_energy(good, act, clock_mhz=0, batch=1)
    with pytest.raises(ValueError, match="batch"):
        estimate_energy(good, act, clock_mhz=100, batch=0)


def test_resources_from_a_generate_report(tmp_path):
    p = tmp_path / "report.json"
    p.write_text('{"resources": {"LUT": 100, "LUTRAM": 10, "FF": 50, "BRAM36": 2.5, "DSP": 3}}')
    assert resources_from_report(p) == {"LUT_logic": 90, "FF": 50, "BRAM36": 2.5, "DSP": 3}
    p.write_text('{"cycles": {}}')
    with pytest.raises(ValueError, match=r"resources\.LUT_logic"):
        resources_from_report(p)


# --- from coverage counters to activity ---------------------------------------------------------------------

VERILOG = """\
module top(clk, rst, a, q);
  input clk;
  input rst;
  input [1:0] a;
  output [1:0] q;
  reg [1:0] q;
  wire [1:0] \\$1 ;
  reg [3:0] mem [7:0];
  assign \\$1 = a ^ q;
  always @(posedge clk)
    q <= \\$1 ;
  always @(posedge clk) begin
    if (a[0])
      mem[a] <= q;
  end
endmodule
"""


def test_classify_verilog():
    kinds = classify_verilog(VERILOG)
    # q is declared twice (port and reg): both lines name the flip-flop
    assert kinds == {2: "comb", 3: "comb", 4: "comb", 5: "ff", 6: "ff", 7: "comb", 8: "mem"}


def _point(f, line, hier, name, count):
    fields = {"f": f"/build/{f}", "l": str(line), "n": "1", "t": "toggle", "page": "v_toggle/top", "o": name,
              "h": hier}
    return "C '" + "".join(f"\x01{k}\x02{v}" for k, v in fields.items()) + f"' {count}\n"


def test_coverage_points_to_activity(tmp_path):
    dut = "top.simboard_top.dut"
    lines = ["# SystemC::Coverage-3\n",
             _point("top.v", 6, dut, "q[0]:0->1", 5), _point("top.v", 6, dut, "q[0]:1->0", 4),
             _point("top.v", 6, dut, "q[1]:0->1", 1), _point("top.v", 6, dut, "q[1]:1->0", 0),
             _point("top.v", 7, dut, "$1[0]:0->1", 3), _point("top.v", 7, dut, "$1[0]:1->0", 3),
             _point("top.v", 8, dut, "mem[0][0]:0->1", 7), _point("top.v", 8, dut, "mem[0][0]:1->0", 7),
             _point("simboard_top.v", 3, "top.simboard_top", "a[0]:0->1", 99),  # the wrapper: left out
             "C '\x01t\x02line\x01f\x02/build/top.v\x01l\x026' 1000\n"]  # not a toggle point
    path = tmp_path / "coverage.dat"
    path.write_text("".join(lines))
    pts = read_coverage(path)
    assert sorted(pts)[0] == ("simboard_top.v", 3, "top.simboard_top", "a[0]", 99)
    act = activity_from_coverage(pts, VERILOG, "top.v", 10)
    assert (act.ff_bits, act.ff_toggles, act.comb_bits, act.comb_toggles, act.mem_bits) == (2, 10, 1, 6, 1)
    assert act.alpha_ff == pytest.approx(10 / 20) and act.alpha_comb == pytest.approx(6 / 10)
    with pytest.raises(ValueError, match="no signal declared"):  # another Verilog than the simulated one
        activity_from_coverage(pts, "module top();\nendmodule\n", "top.v", 10)
    with pytest.raises(ValueError, match="cycles"):
        activity_from_coverage(pts, VERILOG, "top.v", 0)


def test_a_coverage_build_has_its_own_key_and_leaves_the_normal_one_alone():
    from host.simboard import COVERAGE_ARGS, COVERAGE_MAKE_VARS, VERILATOR_ARGS, _make_vars, library_key

    normal = library_key("module m(); endmodule\n", "m")
    cov = library_key("module m(); endmodule\n", "m", coverage=True)
    assert "coverage" not in normal and list(VERILATOR_ARGS) == ["-Wno-fatal"] and normal["make"] == _make_vars()
    assert cov["coverage"]["args"] == list(COVERAGE_ARGS) and cov["make"] == COVERAGE_MAKE_VARS
    assert {k: v for k, v in cov.items() if k not in ("coverage", "make")} == {
        k: v for k, v in normal.items() if k != "make"}


# --- through the simulated board ------------------------------------------------------------------------------



@pytest.mark.rtl_slow  # the coverage build of the small MLP takes ~7 min cold on 2 cores (~1 min warm)
def test_toggle_activity_of_a_small_step_through_the_simulated_board():
    from host.energy_estimate import measure_activity
    from sim.config import apply_overrides, load_config

    cfg = apply_overrides(load_config("mlp"), SMALL)
    act = measure_activity(cfg, log=print)
    assert act.step_cycles > 0 and act.cycles >= act.step_cycles  # the window holds the upload and read-back too
    assert act.ff_bits > 1000 and act.comb_bits > act.ff_bits and act.mem_bits > 0
    assert 0 < act.alpha_ff < 1 and 0 < act.alpha_comb < 1
    e = estimate_energy({"LUT_logic": 1000, "FF": 1000, "BRAM36": 1, "DSP": 1}, act, clock_mhz=100, batch=4)
    assert e.per_image_uj > 0 and e.static_uj > 0


# --- the commands ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, words", [
    (["generate", "--no-synth", "--energy-estimate", "--out", "{t}/acc"], ["--energy-estimate", "--no-synth"]),
    (["generate", "--board", "ulx3s-85f", "--energy-estimate", "--out", "{t}/acc"], ["--energy-estimate", "xc7z020"]),
    (["verify", "--energy-estimate", "{t}/missing.json"], ["--energy-estimate {t}/missing.json", "no such file"]),
    (["verify", "--energy-estimate", "{t}/empty.json"], ["resources.LUT_logic"]),
])
def test_energy_estimate_options_refused_before_anything_runs(tmp_path, capsys, argv, words):
    from host.cli import main

    (tmp_path / "empty.json").write_text("{}")
    argv = [a.replace("{t}", str(tmp_path)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for w in words:
        assert w.replace("{t}", str(tmp_path)) in err[0], err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.json"]  # nothing created
