"""Power data of the xc7z020's programmable logic (PL) for :mod:`host.energy_estimate`.

Only the PL is estimated: the processing system (PS7: the Cortex-A9s, DDR controller, its rails VCCPINT/VCCPAUX/
VCCPLL/VCCO_DDR/VCCO_MIO) runs the host driver, not the accelerator, and is left out, as are the DDR chips and the
board's regulators.

No Xilinx tool runs here, so every figure is derived from Vivado ``report_power`` outputs of routed xc7z020 designs
that their authors committed to public repositories (:data:`REPORTS`: repository, path, commit and the numbers
read from the report's "On-Chip Components", "Power Supply Summary" and "Clock Constraints" tables). From a report
with vectorless activity (no simulation file), the energy of one toggle of a resource class is::

    E = P_class / (count x toggle_rate x f)

with Vivado's default toggle rate of 12.5 % (UG835, ``set_switching_activity -default_toggle_rate``: default 12.5;
UG907 "Netlist Element Activity": default static probability 0.5) taken as the average rate of the class's
outputs. That is an approximation: Vivado applies the default to primary inputs and unconstrained nodes and
propagates it through the logic, so the real average rate of a class may differ (this is why the reports
disagree by about 2x, stated as the spread). Each constant is a :class:`Constant` with a nominal value (the median
over the reports), the range over them and the sources; :data:`CONSTANTS` holds them all.

Classes:

- ``static_w``: PL static power, the static current of the PL rails x their voltage (VCCINT, VCCAUX, VCCO, VCCBRAM,
  VCCADC) from the power supply summary; the PS rails' static share is not ours.
- ``lut_j``: one toggle of a logic LUT output ("LUT as Logic").
- ``signal_j``: one toggle of a routed net ("Signals": the report counts nets; per toggle of one net).
- ``ff_j``: one toggle of a flip-flop output ("Register"): every report prints "<0.001" W, so this is an upper
  bound (0.001 W at 12.5 %); the net it drives is in ``signal_j``.
- ``clock_j``: clock tree energy per flip-flop per cycle ("Clocks" power / register count / f): the clock nets
  toggle twice a cycle whatever the data does (UG907 "Toggle Rate": clock nets 200 %).
- ``bram_j``: one enabled cycle of a BRAM36 ("Block RAM" power / BRAM36 count / f / 0.5): the enable's activity is
  taken as the default static probability 0.5.
- ``dsp_j``: one active cycle of a DSP48E1: every report that uses DSPs prints "0.000" or "<0.001" W for them, so
  the value is an upper bound: 0.0005 W over 27 DSPs at 100 MHz (the rounded 0.000 of REPORTS[2]) nominal, and
  0.001 W over 4 DSPs at 45 MHz (REPORTS[3], simulated activity) as the high end.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

__all__ = ["CONSTANTS", "DEFAULT_TOGGLE_RATE", "PL_RAILS", "REPORTS", "Constant", "PowerReport", "SOURCES_DOC"]

#: Vivado's default toggle rate (fraction of the clock), UG835 ``set_switching_activity``: "The default value is
#: 12.5", https://docs.amd.com/r/2022.2-English/ug835-vivado-tcl-commands/set_switching_activity
DEFAULT_TOGGLE_RATE = 0.125
#: Vivado's default static probability, UG907 "Netlist Element Activity" (``-default_static_probability 0.5``),
#: https://docs.amd.com/r/en-US/ug907-vivado-power-analysis-optimization/Netlist-Element-Activity
DEFAULT_STATIC_PROBABILITY = 0.5

#: PL supply rails of the Zynq-7000 in the reports' power supply summary (the PS rails VCCPINT, VCCPAUX, VCCPLL,
#: VCCO_DDR, VCCO_MIO0/1 are left out).
PL_RAILS = ("Vccint", "Vccaux", "Vcco33", "Vcco25", "Vcco18", "Vcco15", "Vccbram", "Vccadc")

SOURCES_DOC = "docs/results.md, section 'Energy estimate'"


@dataclass(frozen=True)
class PowerReport:
    """The numbers read from one committed Vivado ``report_power`` output (W, counts, ns, A and V).

    ``upper``: classes the report prints as "<0.001" or "0.000" (the value is then a bound, not a figure);
    ``static_a``: rail -> (voltage, static current) of the power supply summary."""

    repo: str
    path: str
    commit: str
    design: str
    vivado: str
    period_ns: float
    activity: str  # "vectorless" or "simulation (SAIF)"
    power_w: dict
    count: dict
    static_a: dict
    upper: frozenset = field(default_factory=frozenset)
    device_static_w: float = 0.0

    @property
    def f_hz(self) -> float:
        return 1e9 / self.period_ns

    @property
    def source(self) -> str:
        return f"github.com/{self.repo} {self.path} @ {self.commit[:12]}"

    @property
    def pl_static_w(self) -> float:
        return sum(v * a for rail, (v, a) in self.static_a.items() if rail in PL_RAILS)


_CVA6 = "corev_apu/fpga/cva6_fpga.runs/impl_1/cva6_zybo_z7_20_power_routed.rpt"
_CVA6_STATIC = {"Vccint": (1.0, 0.009), "Vccaux": (1.8, 0.011), "Vcco33": (3.3, 0.001), "Vccbram": (1.0, 0.003),
                "Vccadc": (1.8, 0.020), "Vccpint": (1.0, 0.017), "Vccpaux": (1.8, 0.010), "Vccpll": (1.8, 0.003)}

#: The reports (xc7z020clg400-1, routed), numbers as printed. "<0.001" entries are stored as 0.001 and "0.000" as
#: 0.0005 (the rounding bound) and listed in ``upper``.
REPORTS: tuple[PowerReport, ...] = (
    # CVA6 soft core on a Zybo Z7-20, Vivado 2023.2, clk_out1 20.0 ns, vectorless ("Simulation Activity File ---").
    PowerReport(
        repo="alencar-felipe/cva6-softcore-contest", path=_CVA6, commit="b5765f0c5156b878aea2bbf0f929b3078933ab95",
        design="cva6_zybo_z7_20", vivado="2023.2", period_ns=20.0, activity="vectorless",
        power_w={"lut": 0.014, "register": 0.001, "signals": 0.018, "bram": 0.011, "dsp": 0.0005, "clocks": 0.022},
        count={"lut": 19978, "register": 14254, "signals": 33121, "bram": 66.5, "dsp": 4},
        static_a=_CVA6_STATIC, upper=frozenset({"register", "dsp"}), device_static_w=0.112),
    # The same design family from another team, Vivado 2020.1, 20.0 ns, vectorless.
    PowerReport(
        repo="MICHEL-Hugo/INSAi_CVA6-softcore-contest", path=_CVA6, commit="2b545b4d11966b3a26ec3c0ea4eaca45f6564a57",
        design="cva6_zybo_z7_20", vivado="2020.1", period_ns=20.0, activity="vectorless",
        power_w={"lut": 0.013, "register": 0.001, "signals": 0.018, "bram": 0.011, "dsp": 0.0005, "clocks": 0.024},
        count={"lut": 20081, "register": 14328, "signals": 33293, "bram": 66.5, "dsp": 4},
        static_a=_CVA6_STATIC, upper=frozenset({"register", "dsp"}), device_static_w=0.112),
    # A PS7 + convolution accelerator (AXI DMA, 27 DSPs), Vivado 2020.1, clk_fpga_0 10.0 ns, vectorless,
    # junction 42.8 C (the PS7's 1.256 W heats the die: higher static).
    PowerReport(
        repo="monkeyboyfr3sh/ReconHardware",
        path="FPGA_Files/CPE/Projects/ConvolutionAccel_d/ConvolutionAccel_d.runs/child_0_impl_1/CPE_Wrapper_power_routed.rpt",
        commit="ccb8da9f1e8b90d6a3d2419f4e3039c4d929b7d8", design="CPE_Wrapper", vivado="2020.1", period_ns=10.0,
        activity="vectorless",
        power_w={"lut": 0.014, "register": 0.001, "signals": 0.020, "bram": 0.021, "dsp": 0.0005, "clocks": 0.085},
        count={"lut": 16973, "register": 22577, "signals": 35408, "bram": 33.5, "dsp": 27},
        static_a={"Vccint": (1.0, 0.015), "Vccaux": (1.8, 0.015), "Vccbram": (1.0, 0.003), "Vccadc": (1.8, 0.020),
                  "Vccpint": (1.0, 0.028), "Vccpaux": (1.8, 0.010), "Vccpll": (1.8, 0.003),
                  "Vcco_ddr": (1.5, 0.002), "Vcco_mio0": (3.3, 0.001), "Vcco_mio1": (1.8, 0.001)},
        upper=frozenset({"register", "dsp"}), device_static_w=0.141),
    # CVA6 running MNIST with simulated activity (routed.saif, 89 % of nets matched), Vivado 2020.1, 22.2 ns:
    # used for the PL static power and the DSP bound only (its toggle rates are not the default).
    PowerReport(
        repo="riscmakers/cva6-softcore-contest", path="fpga/results/base/post_impl/power_routed_mnist.txt",
        commit="c5574b486d4209731433b0c4d14813f6e9bfb9b1", design="cva6_zybo_z7_20", vivado="2020.1",
        period_ns=22.2, activity="simulation (SAIF)",
        power_w={"lut": 0.013, "register": 0.001, "signals": 0.018, "bram": 0.021, "dsp": 0.001, "clocks": 0.027},
        count={"lut": 26755, "register": 22768, "signals": 46725, "bram": 86, "dsp": 4},
        static_a={"Vccint": (1.0, 0.010), "Vccaux": (1.8, 0.011), "Vcco33": (3.3, 0.001), "Vccbram": (1.0, 0.004),
                  "Vccadc": (1.8, 0.020), "Vccpint": (1.0, 0.018), "Vccpaux": (1.8, 0.010), "Vccpll": (1.8, 0.003)},
        upper=frozenset({"register", "dsp"}), device_static_w=0.114),
)


@dataclass(frozen=True)
class Constant:
    """One constant of the estimate: ``value`` (nominal), ``low``/``high`` (range over the sources), ``unit``,
    what it means, how it was derived and from which reports (:attr:`sources`)."""

    name: str
    value: float
    low: float
    high: float
    unit: str
    meaning: str
    derivation: str
    sources: tuple[str, ...]
    bound: bool = False  # an upper bound (the reports print "<0.001"/"0.000"), not a measured figure

    def to_dict(self) -> dict:
        return {"value": self.value, "low": self.low, "high": self.high, "unit": self.unit, "meaning": self.meaning,
                "derivation": self.derivation, "sources": list(self.sources), "upper_bound": self.bound}


def _per_toggle(r: PowerReport, cls: str, count_cls: str | None = None) -> float:
    return r.power_w[cls] / (r.count[count_cls or cls] * DEFAULT_TOGGLE_RATE * r.f_hz)


def _derive(name, unit, meaning, derivation, reports, fn, *, bound=False, value=None, high=None) -> Constant:
    vals = [fn(r) for r in reports]
    nominal = statistics.median(vals) if value is None else value
    return Constant(name=name, value=nominal, low=0.0 if bound else min(vals), high=max(vals) if high is None else high,
                    unit=unit, meaning=meaning, derivation=derivation, sources=tuple(r.source for r in reports),
                    bound=bound)


def _constants() -> dict[str, Constant]:
    vectorless = [r for r in REPORTS if r.activity == "vectorless"]
    saif = [r for r in REPORTS if r.activity != "vectorless"]
    rate = f"{DEFAULT_TOGGLE_RATE * 100:g} %"
    dsp_design = max(vectorless, key=lambda r: r.count["dsp"])  # the one design with more than a few DSPs
    out = [
        _derive("static_w", "W", "PL static power (junction 28-43 C)",
                "sum of static current x voltage of the PL rails (" + ", ".join(PL_RAILS) + ")",
                REPORTS, lambda r: r.pl_static_w),
        _derive("lut_j", "J", "one toggle of a logic LUT output",
                f"'LUT as Logic' W / (LUTs x {rate} x f)", vectorless, lambda r: _per_toggle(r, "lut")),
        _derive("signal_j", "J", "one toggle of one routed net",
                f"'Signals' W / (nets x {rate} x f)", vectorless, lambda r: _per_toggle(r, "signals")),
        _derive("ff_j", "J", "one toggle of a flip-flop output (upper bound)",
                f"'Register' <0.001 W / (registers x {rate} x f); nominal = the tightest bound", vectorless,
                lambda r: _per_toggle(r, "register"), bound=True,
                value=min(_per_toggle(r, "register") for r in vectorless)),
        _derive("clock_j", "J", "clock tree per flip-flop per cycle",
                "'Clocks' W / (registers x f)", vectorless,
                lambda r: r.power_w["clocks"] / (r.count["register"] * r.f_hz)),
        _derive("bram_j", "J", "one enabled cycle of a BRAM36",
                f"'Block RAM' W / (BRAM36 x f x {DEFAULT_STATIC_PROBABILITY:g}) (enable probability = default static "
                "probability)", vectorless,
                lambda r: r.power_w["bram"] / (r.count["bram"] * r.f_hz * DEFAULT_STATIC_PROBABILITY)),
        _derive("dsp_j", "J", "one active cycle of a DSP48E1 (upper bound)",
                "'DSPs' 0.000 W (< 0.0005) / (DSPs x f) of the 27-DSP design; high end: '<0.001' W / (DSPs x f) of "
                "the simulated-activity report", [dsp_design, *saif],
                lambda r: r.power_w["dsp"] / (r.count["dsp"] * r.f_hz), bound=True,
                value=dsp_design.power_w["dsp"] / (dsp_design.count["dsp"] * dsp_design.f_hz)),
    ]
    return {c.name: c for c in out}


#: name -> :class:`Constant` (every number the estimate multiplies by).
CONSTANTS: dict[str, Constant] = _constants()
