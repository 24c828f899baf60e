"""An energy *estimate* of a generated accelerator before any board exists (PL only).

Three inputs:

1. **Resources**: LUT (logic), FF, BRAM36, DSP48 of the design from Yosys ``synth_xilinx`` (:mod:`rtl_gen.synth`,
   ``xnortrain generate`` / ``--synth-by-unit``).
2. **Switching activity** of one simulated training step: the simulated board built with Verilator's toggle
   coverage (``SimBoard.build(cfg, coverage=True)``, :data:`host.simboard.COVERAGE_ARGS`) runs one step through the
   real :class:`host.driver.Driver` (batch upload, the step, the logits read back); the counters are zeroed right
   before it and written right after (:func:`measure_activity`).
3. **Device constants** of the xc7z020's PL, each derived from committed Vivado power reports
   (:mod:`boards.power`, every value with its repository, path and commit).

From RTL toggles to resource toggles (:func:`activity_from_coverage`). Verilator counts, for every bit of every
signal of the generated Verilog, its 0->1 and 1->0 changes; a bit's toggles are the sum of the two. Each counter
points at the line that declares its signal, so the bit is classed from the Verilog text itself
(:func:`classify_verilog`):

- **flip-flop bits**: signals assigned with ``<=`` (the generated Verilog uses non-blocking assignments only in its
  ``always @(posedge clk)`` blocks);
- **memory bits**: unpacked arrays (``reg [w:0] name [n:0]``) are block RAM or LUTRAM contents, not nets: left out
  of both rates (their power is the ``bram`` class, below);
- **combinational bits**: every other signal (the outputs of LUT logic, wires and aliases).

Two rates come out: ``alpha_ff`` = FF-bit toggles / (FF bits x cycles) and ``alpha_comb`` the same for the
combinational bits, both over every covered bit (bits that never move count, as the idle parts of the design do on
the chip). They are applied to the *synthesised* counts, as the constants were derived (power / (count x rate x f)):

- LUT toggles per cycle = ``alpha_comb`` x LUT_logic; FF toggles per cycle = ``alpha_ff`` x FF;
- net toggles per cycle = the sum of the two (every LUT and FF output drives one routed net; the reports in
  :mod:`boards.power` count 0.90-0.97 nets per LUT + FF);
- clock: every FF, every cycle (the clock tree toggles whatever the data does);
- BRAM36: every one enabled every cycle of the step, and DSP48: every one active every cycle: the toggle counters
  do not say when a memory port or a DSP is enabled, so both are upper bounds (the generated read ports are enabled
  whenever their reader is busy, and the DSP array runs through the backward phases).

Estimate per step = static x step time + sum over classes of (count x activity x energy) x cycles; per image =
per step / batch. The clock is the description's ``clock_mhz`` (what the Vivado build sets FCLK0 to). The ``low``
and ``high`` figures use every constant at the low and high end of its range over the reports. What it leaves out:
the PS7 (the host driver's CPU), the DDR memory and its controller, the board's regulators and I/O; it is not a
measurement (``xnortrain energy-measure`` is, on a board).
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["Activity", "EnergyEstimate", "activity_from_coverage", "classify_verilog", "estimate_energy",
           "measure_activity", "read_coverage", "resources_from_report", "resources_from_synth"]

#: The resource classes the estimate needs, as :class:`rtl_gen.synth.SynthReport` names them.
RESOURCE_KEYS = ("LUT_logic", "FF", "BRAM36", "DSP")

LABEL = "ESTIMATE (not a measurement): PL only, from Yosys resources, Verilator toggle counts and Vivado power " \
        "reports of other xc7z020 designs (boards/power.py)"

_DECL = re.compile(r"^\s*(?:input|output|inout|reg|wire)\b(?:\s+(?:reg|wire|signed))*\s*(?:\[[^\]]*\]\s*)?"
                   r"(\\\S+|[A-Za-z_][\w$]*)\s*(\[[^\]]*\])?")
_NONBLOCKING = re.compile(r"(\\\S+|[A-Za-z_][\w$]*)\s*(?:\[[^\]]*\]\s*)*<=")


def classify_verilog(verilog: str) -> dict[int, str]:
    """Line number (1-based) of every signal declaration in ``verilog`` -> ``"ff"``, ``"mem"`` or ``"comb"``
    (module docstring: non-blocking targets are flip-flops, unpacked arrays memories, the rest combinational)."""
    lines = verilog.splitlines()
    out: dict[int, str] = {}
    decls: list[tuple[int, str, bool]] = []
    ffs: set[str] = set()

    def close_module():
        for no, name, mem in decls:
            out[no] = "mem" if mem else ("ff" if name in ffs else "comb")
        decls.clear()
        ffs.clear()

    for no, line in enumerate(lines, 1):
        if line.startswith("module "):
            close_module()
            continue
        m = _DECL.match(line)
        if m and not line.lstrip().startswith(("assign", "always")):
            decls.append((no, m.group(1), m.group(2) is not None))
            continue
        if "<=" in line:
            for t in _NONBLOCKING.findall(line):
                ffs.add(t)
    close_module()
    return out


_POINT = re.compile(r"^C '(.*)' (\d+)$")


def read_coverage(path) -> list[tuple[str, int, str, str, int]]:
    """The toggle points of a Verilator coverage file: ``(file, line, hierarchy, signal bit, count)``, one per
    bit (the 0->1 and 1->0 counters added)."""
    bits: dict[tuple[str, int, str, str], int] = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for raw in f:
            m = _POINT.match(raw.rstrip("\n"))
            if m is None:
                continue
            kv = dict(p.split("\x02", 1) for p in m.group(1).split("\x01") if "\x02" in p)
            if kv.get("t") != "toggle":
                continue
            name = kv.get("o", "").rsplit(":", 1)[0]
            key = (Path(kv.get("f", "")).name, int(kv.get("l", 0)), kv.get("h", ""), name)
            bits[key] = bits.get(key, 0) + int(m.group(2))
    return [(*k, v) for k, v in bits.items()]


@dataclass
class Activity:
    """Switching activity of one simulated step (:func:`activity_from_coverage`)."""

    cycles: int
    ff_bits: int
    ff_toggles: int
    comb_bits: int
    comb_toggles: int
    mem_bits: int
    step_cycles: int | None = None  # the accelerator's own count of the step (the driver's StepResult.cycles)
    config: str = ""

    @property
    def alpha_ff(self) -> float:
        """Toggles per flip-flop bit per cycle."""
        return self.ff_toggles / (self.ff_bits * self.cycles) if self.ff_bits and self.cycles else 0.0

    @property
    def alpha_comb(self) -> float:
        """Toggles per combinational signal bit per cycle."""
        return self.comb_toggles / (self.comb_bits * self.cycles) if self.comb_bits and self.cycles else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "alpha_ff": self.alpha_ff, "alpha_comb": self.alpha_comb}


def activity_from_coverage(points, verilog: str, top_file: str, cycles: int, *, scope: str = "top.simboard_top.dut",
                           **kwargs) -> Activity:
    """Class every toggle point of ``points`` (:func:`read_coverage`) declared in ``top_file`` (the accelerator's
    Verilog, ``verilog``) under the instance ``scope`` with :func:`classify_verilog`, and sum bits and toggles per
    class over ``cycles``. A point on a line that declares no signal raises ``ValueError`` (the Verilog given is not
    the one simulated)."""
    if cycles <= 0:
        raise ValueError(f"cycles = {cycles}: the measured window must hold at least one cycle")
    kinds = classify_verilog(verilog)
    n = {"ff": [0, 0], "comb": [0, 0], "mem": [0, 0]}
    for fname, line, hier, name, count in points:
        if fname != top_file or not (hier == scope or hier.startswith(scope + ".")):
            continue
        kind = kinds.get(line)
        if kind is None:
            raise ValueError(f"coverage point {hier}.{name} at {top_file}:{line}: no signal declared on that line of "
                             "the Verilog given (not the simulated Verilog?)")
        n[kind][0] += 1
        n[kind][1] += count
    return Activity(cycles=cycles, ff_bits=n["ff"][0], ff_toggles=n["ff"][1], comb_bits=n["comb"][0],
                    comb_toggles=n["comb"][1], mem_bits=n["mem"][0], **kwargs)


def measure_activity(cfg, *, warmup_steps: int = 1, log=print, keep: str | Path | None = None) -> Activity:
    """Switching activity of one training step of ``cfg`` on the toggle-coverage simulated board: the bit-exact
    model's power-on state is written, ``warmup_steps`` steps run (the first step starts from zeroed buffers),
    the counters are zeroed, one step runs through the driver (upload, step, logits), the counters are written
    (to ``keep`` if given, else a temporary file) and classed (:func:`activity_from_coverage`)."""
    import numpy as np

    from sim.datasets import load_dataset
    from sim.hw.engine import prepare_inputs
    from sim.hw.model import HwModel

    from .driver import Driver
    from .simboard import SimBoard

    ds = load_dataset(cfg.data.dataset, cfg.data.path or None)
    B = cfg.train.batch_size
    idx = np.random.default_rng(cfg.train.seed).permutation(len(ds.x_train))[:B * (warmup_steps + 1)]
    x, y = prepare_inputs(cfg, ds.x_train[idx]), ds.y_train[idx]
    with SimBoard.build(cfg, log=log, coverage=True) as board:
        # the coverage model runs a few hundred cycles per second on the paper's MLP: no wall-time budget
        drv = Driver(board.description, board.transport, timeout_s=1e7)
        drv.load_state_dict(HwModel(cfg).state_dict())
        for s in range(warmup_steps):
            drv.train_step(x[s * B:(s + 1) * B], y[s * B:(s + 1) * B], lr=cfg.lr)
        s = warmup_steps
        board.coverage_zero()
        c0, t0 = board.cycles, time.monotonic()
        res = drv.train_step(x[s * B:(s + 1) * B], y[s * B:(s + 1) * B], lr=cfg.lr)
        cycles = board.cycles - c0
        log(f"energy estimate: step {s} on the coverage board: {cycles:,} cycles ({res.cycles:,} in the step "
            f"itself), {time.monotonic() - t0:.1f} s")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(keep) if keep is not None else Path(tmp) / "coverage.dat"
            board.coverage_write(path)
            points = read_coverage(path)
        from rtl_gen.top import SystemPlan

        top = SystemPlan(cfg).name
        return activity_from_coverage(points, board.verilog, f"{top}.v", cycles, step_cycles=int(res.cycles),
                                      config=cfg.name)


def resources_from_synth(rep) -> dict:
    """The estimate's resources from a :class:`rtl_gen.synth.SynthReport`."""
    r = rep.resources
    lut_logic = r.get("LUT_logic", r.get("LUT", 0) - r.get("LUTRAM", 0))
    return {"LUT_logic": float(lut_logic), "FF": float(r.get("FF", 0)), "BRAM36": float(r.get("BRAM36", 0)),
            "DSP": float(r.get("DSP", 0))}


def resources_from_report(path) -> dict:
    """The resources of a ``generate`` report (``report.json``: its ``resources``) or of a
    :class:`rtl_gen.synth.SynthReport` dict; raises ``ValueError`` naming the missing field."""
    d = json.loads(Path(path).read_text())
    res = d.get("resources", d)
    out = {}
    for k in RESOURCE_KEYS:
        if k == "LUT_logic" and k not in res and "LUT" in res:
            out[k] = float(res["LUT"]) - float(res.get("LUTRAM", 0))
            continue
        if k not in res:
            raise ValueError(f"{path}: no resources.{k} (a `xnortrain generate` report.json with synthesis, or a "
                             "synthesis report, is needed)")
        out[k] = float(res[k])
    return out


@dataclass
class EnergyEstimate:
    """The estimate (µJ) per training step and per image, with its breakdown, inputs and sources (module doc)."""

    label: str
    clock_mhz: float
    cycles: int
    batch: int
    resources: dict
    activity: dict
    static_uj: float
    dynamic_uj: dict  # class -> µJ per step
    per_step_uj: float
    per_image_uj: float
    low_per_image_uj: float
    high_per_image_uj: float
    constants: dict = field(default_factory=dict)

    @property
    def dynamic_total_uj(self) -> float:
        return sum(self.dynamic_uj.values())

    def to_dict(self) -> dict:
        return {**asdict(self), "dynamic_total_uj": self.dynamic_total_uj,
                "leaves_out": "PS7 (host CPU), DDR memory and controller, board regulators and I/O"}

    def format_text(self) -> str:
        dyn = self.dynamic_total_uj
        lines = [
            f"energy {self.label}",
            f"  {self.per_image_uj:,.2f} uJ per training image ({self.low_per_image_uj:,.2f} to "
            f"{self.high_per_image_uj:,.2f} over the sources' range); {self.per_step_uj:,.1f} uJ per step of "
            f"{self.batch} images, {self.cycles:,} cycles at {self.clock_mhz:g} MHz",
            f"  static {self.static_uj:,.1f} uJ ({100 * self.static_uj / self.per_step_uj:.0f} %), dynamic "
            f"{dyn:,.1f} uJ: " + ", ".join(f"{k} {v:,.1f}" for k, v in self.dynamic_uj.items()),
            f"  activity: {self.activity['alpha_ff']:.4f} toggles per FF bit per cycle, "
            f"{self.activity['alpha_comb']:.4f} per combinational bit (Verilator toggle coverage, one step)",
        ]
        return "\n".join(lines)


def _step_energy(res: dict, act: Activity, clock_mhz: float, cycles: int, c: dict) -> tuple[float, dict]:
    seconds = cycles / (clock_mhz * 1e6)
    lut_t = act.alpha_comb * res["LUT_logic"]  # toggles per cycle
    ff_t = act.alpha_ff * res["FF"]
    per_cycle = {
        "lut": lut_t * c["lut_j"],
        "ff": ff_t * c["ff_j"],
        "nets": (lut_t + ff_t) * c["signal_j"],
        "clock": res["FF"] * c["clock_j"],
        "bram": res["BRAM36"] * c["bram_j"],
        "dsp": res["DSP"] * c["dsp_j"],
    }
    return c["static_w"] * seconds * 1e6, {k: v * cycles * 1e6 for k, v in per_cycle.items()}


def estimate_energy(resources: dict, activity: Activity, *, clock_mhz: float, batch: int,
                    cycles: int | None = None, constants=None) -> EnergyEstimate:
    """The estimate for ``resources`` (``LUT_logic``, ``FF``, ``BRAM36``, ``DSP``; :func:`resources_from_report`)
    at ``activity`` (:class:`Activity`), ``clock_mhz`` and ``batch`` images per step; ``cycles`` per step default
    the activity's measured window; ``constants`` default :data:`boards.power.CONSTANTS`."""
    from boards.power import CONSTANTS

    constants = CONSTANTS if constants is None else constants
    for k in RESOURCE_KEYS:
        v = resources.get(k)
        if v is None or not v >= 0:
            raise ValueError(f"resources.{k} = {v!r}: expected a count >= 0")
    for name, v in (("clock_mhz", clock_mhz), ("batch", batch)):
        if not (isinstance(v, int | float) and v > 0):
            raise ValueError(f"{name} = {v!r}: expected a positive number")
    cycles = int(activity.cycles if cycles is None else cycles)
    if cycles <= 0:
        raise ValueError(f"cycles = {cycles}: expected a positive number of cycles per step")
    nominal = {k: c.value for k, c in constants.items()}
    static, dyn = _step_energy(resources, activity, clock_mhz, cycles, nominal)
    total = static + sum(dyn.values())
    ends = {}
    for end in ("low", "high"):
        s, d = _step_energy(resources, activity, clock_mhz, cycles, {k: getattr(c, end) for k, c in constants.items()})
        ends[end] = (s + sum(d.values())) / batch
    return EnergyEstimate(
        label=LABEL, clock_mhz=float(clock_mhz), cycles=cycles, batch=int(batch),
        resources={k: resources[k] for k in RESOURCE_KEYS}, activity=activity.to_dict(), static_uj=static,
        dynamic_uj=dyn, per_step_uj=total, per_image_uj=total / batch, low_per_image_uj=ends["low"],
        high_per_image_uj=ends["high"], constants={k: c.to_dict() for k, c in constants.items()})
