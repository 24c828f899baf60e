"""Measured energy per training step: the driver's step log against a power log from a meter.

Two halves:

* :class:`StepLog` is written by :class:`host.driver.Driver` (``Driver(..., step_log=path)``): one JSON
  line per training step, appended and flushed as soon as the step ends, with ``step`` (index in the
  log), ``t_start``/``t_end`` (wall time, ``time.time()``, seconds since the epoch), ``duration_s``
  (``time.monotonic()`` difference: immune to clock steps), ``cycles`` (the accelerator's cycle register
  for the step) and ``batch`` (images in the step).
* :func:`measure` (the ``xnortrain energy-measure`` command, :func:`measure_main`) reads a power log (CSV
  from an external meter, or a ``pynq.DataRecorder`` frame saved with ``frame.to_csv``), subtracts an
  idle baseline and integrates the rest over every step window: joules per step and per image.

Integration: the power between two samples is taken as the straight line joining them (linear
interpolation); the energy of a window ``[a, b]`` is the exact integral of that piecewise-linear curve,
i.e. the trapezoidal rule over the samples inside the window plus the two edge points ``a`` and ``b``,
whose power is interpolated from the samples either side. A window the log does not cover (``a`` before
the first sample or ``b`` after the last) is refused, naming the step and the gap; so is a window with
fewer than ``min_samples`` samples inside it (default 2: a meter too slow for the step's length gives an
interpolated guess, not a measurement; ``min_samples=0`` accepts it knowingly).

Idle baseline (watts), subtracted from every sample: the time-weighted mean power (same integral divided
by the length) over an explicit window, or over the ``idle_seconds`` before the first step, or a given
figure; without any the energies are gross (whole board, nothing subtracted), and the report says so.

This module needs only the standard library and NumPy (matplotlib for ``--plot``) and stays Python 3.10
compatible: the board image's Python writes the step log.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

__all__ = ["EnergyError", "EnergyReport", "PowerTrace", "StepLog", "StepWindow", "integrate", "load_power",
           "load_steps", "measure", "measure_main", "rail_domain"]


class EnergyError(ValueError):
    """A mistake in the power log, the step log or the options; one line naming the file and the value."""


# --- step log (written on the board) ------------------------------------------------------------------------


class StepLog:
    """Append-only JSONL log of training steps. ``target``: a path (opened for appending; the step index
    continues after the lines already there) or an open text file. Every record is flushed when written,
    so a crash loses at most the step in progress."""

    def __init__(self, target):
        if isinstance(target, (str, os.PathLike)):
            path = Path(target)
            if path.is_dir():
                raise EnergyError(f"step log {path}: is a folder; give a file name")
            self.index = _count_lines(path) if path.exists() else 0
            self._fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the run
            self._own = True
            self.path = path
        else:
            self.index = 0
            self._fh = target
            self._own = False
            self.path = None

    def record(self, *, t_start: float, t_end: float, duration_s: float, cycles: int, batch: int,
               **extra) -> dict:
        """Append one step; returns the record written."""
        rec = {"step": self.index, "t_start": float(t_start), "t_end": float(t_end),
               "duration_s": float(duration_s), "cycles": int(cycles), "batch": int(batch), **extra}
        self._fh.write(json.dumps(rec) + "\n")
        self._fh.flush()
        self.index += 1
        return rec

    def close(self) -> None:
        if self._own and not self._fh.closed:
            self._fh.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _count_lines(path: Path) -> int:
    with open(path, encoding="utf-8") as fh:
        return sum(1 for line in fh if line.strip())


# --- reading the logs ---------------------------------------------------------------------------------------


@dataclass
class StepWindow:
    step: int
    t_start: float
    t_end: float
    batch: int
    cycles: int | None = None


@dataclass
class PowerTrace:
    """Samples of whole-board power: ``t`` (seconds, increasing, in the step log's clock), ``p`` (W);
    ``columns``: which CSV columns were used and how (said in the report)."""

    t: np.ndarray
    p: np.ndarray
    columns: str
    source: str = ""
    domains: dict = field(default_factory=dict)
    """A DataRecorder frame's rails summed per domain: ``"PL"`` / ``"PS"`` -> a :class:`PowerTrace` of their sum
    (:func:`rail_domain`); empty for a meter's log."""


#: Times beyond this many seconds (the year 2286 as Unix time) are refused: no log or offset is that far out.
MAX_TIME_S = 1e10

# The Zynq UltraScale+ supplies by domain, as its PMBus regulators and INA226 monitors name them on the ZCU10x
# boards (the ZCU102/ZCU104 user guides' power tables; Xilinx's "accurate design power measurement" article splits
# them the same way): the programmable logic's core, block RAM and auxiliary supplies and its I/O and transceiver
# rails; the processing system's full- and low-power domains, auxiliary, PLLs, DDR and its I/O and transceivers.
PL_RAILS = frozenset({"VCCINT", "VCCBRAM", "VCCAUX", "VCCINTIO", "VCCAUXIO", "VCC1V2", "VCC1V8", "VCC3V3",
                      "VADJFMC", "MGTAVCC", "MGTAVTT", "MGTVCCAUX", "VCCO"})
PS_RAILS = frozenset({"VCCPSINTFP", "VCCPSINTLP", "VCCINTLP", "VCCPSINTFPDDR", "VCCPSAUX", "VCCPSPLL",
                      "VCCPSDDR", "VCCPSDDRPLL", "VCCODDR", "VCCOPSDDR", "VCCOPSDDR504", "VCCOPS", "VCCOPS3",
                      "VCCPSADC", "VCCPSBATT", "MGTRAVCC", "MGTRAVTT", "PSMGTRAVCC", "PSMGTRAVTT", "PSINTFP",
                      "PSINTLP", "PSAUX", "PSPLL", "PSDDR", "PSDDRPLL"})


def rail_domain(name: str) -> str | None:
    """``"PL"``, ``"PS"`` or None (a supply input such as ``12V``, or a name not known) for a rail name, compared
    upper-case without punctuation (``VCCPSINTFP``, ``VCC_PSINTFP``, ``VADJ_FMC``)."""
    key = re.sub(r"[^A-Z0-9]", "", str(name).upper())
    return "PL" if key in PL_RAILS else "PS" if key in PS_RAILS else None


def _check_file(path, what: str) -> Path:
    path = Path(path)
    if path.is_dir():
        raise EnergyError(f"{what} {path}: is a folder; give a file")
    if not path.exists():
        raise EnergyError(f"{what} {path}: no such file")
    return path


def _read_text(path: Path, what: str) -> str:
    """The file as UTF-8 text (a byte-order mark allowed); another encoding is refused naming the line."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise EnergyError(f"{what} {path} line {line}: not UTF-8 text (byte 0x{data[e.start]:02x}); save it as "
                          "UTF-8") from None


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def load_steps(path) -> list[StepWindow]:
    """Read a step log (JSONL, one object per line with ``t_start`` and ``t_end`` or ``duration_s``,
    ``batch`` (a whole number); ``step`` and ``cycles`` (whole numbers) optional). Steps whose windows overlap
    (a duplicated line, two logs pasted together) are refused: their energy would be counted twice."""
    path = _check_file(path, "--steps")
    steps: list[StepWindow] = []
    lines: list[int] = []
    for n, line in enumerate(_read_text(path, "--steps").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise EnergyError(f"--steps {path} line {n}: not JSON ({e.msg})") from None
        if not isinstance(rec, dict):
            raise EnergyError(f"--steps {path} line {n}: expected a JSON object, got {type(rec).__name__}")
        try:
            t0 = float(rec["t_start"])
            t1 = float(rec["t_end"]) if "t_end" in rec else t0 + float(rec["duration_s"])
            batch = rec["batch"]
        except KeyError as e:
            raise EnergyError(f"--steps {path} line {n}: no {e.args[0]!r} field") from None
        except (TypeError, ValueError):
            raise EnergyError(f"--steps {path} line {n}: t_start/t_end/duration_s are not numbers") from None
        if not (math.isfinite(t0) and math.isfinite(t1)) or t1 <= t0:
            raise EnergyError(f"--steps {path} line {n}: the step ends ({t1}) before it starts ({t0})")
        if not _whole(batch) or batch < 1:
            raise EnergyError(f"--steps {path} line {n}: batch {batch!r} must be a whole number of images >= 1")
        cycles, step = rec.get("cycles"), rec.get("step", len(steps))
        if cycles is not None and not (_whole(cycles) and cycles >= 0):
            raise EnergyError(f"--steps {path} line {n}: cycles {cycles!r} must be a whole number >= 0 (or absent)")
        if not (_whole(step) and step >= 0):
            raise EnergyError(f"--steps {path} line {n}: step {step!r} must be a whole number >= 0")
        steps.append(StepWindow(step, t0, t1, batch, cycles))
        lines.append(n)
    if not steps:
        raise EnergyError(f"--steps {path}: no steps in the file")
    order = sorted(range(len(steps)), key=lambda i: steps[i].t_start)
    for i, j in zip(order[:-1], order[1:], strict=True):
        if steps[j].t_start < steps[i].t_end:
            raise EnergyError(f"--steps {path} lines {min(lines[i], lines[j])} and {max(lines[i], lines[j])}: "
                              f"steps {steps[i].step} and {steps[j].step} overlap in time (a duplicated line?); "
                              "each window would be counted twice")
    return steps


_UNITS = {"s": ("time", 1.0), "ms": ("time", 1e-3), "us": ("time", 1e-6),
          "w": ("power", 1.0), "mw": ("power", 1e-3), "v": ("voltage", 1.0), "mv": ("voltage", 1e-3),
          "a": ("current", 1.0), "ma": ("current", 1e-3)}
_NAMES = {
    "time": {"time", "t", "timestamp", "ts", "seconds", "sec", "epoch", "elapsed", "unix_time"},
    "power": {"power", "p", "watts", "watt", "pwr", "power_w"},
    "voltage": {"voltage", "v", "bus_voltage", "volts", "vbus", "u", "bus"},
    "current": {"current", "i", "amps", "amperes", "curr", "ibus"},
}


def _classify(name: str) -> tuple[str, float] | None:
    """(role, scale to SI) of a column header, or None: ``Power (mW)``, ``current_mA``, ``t``, ``V``..."""
    tokens = [t for t in re.split(r"[^a-z0-9]+", name.strip().lower()) if t]
    if not tokens:
        return None
    units = [t for t in tokens if t in _UNITS]
    base = "_".join(t for t in tokens if t not in _UNITS)
    if not base:  # the header is a unit alone: "W", "mA", "V", "s"
        return _UNITS[units[-1]] if len(units) == 1 else None
    role = next((r for r, names in _NAMES.items() if base in names), None)
    if role is None:
        return None
    scale = 1.0
    for u in units:
        if _UNITS[u][0] == role:
            scale = _UNITS[u][1]
    return role, scale


def _parse_time(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    # ISO date-time; the fraction is split off first: pandas writes nanoseconds (9 digits), which
    # datetime.fromisoformat refuses before Python 3.11
    m = _ISO.match(text.strip())
    if not m:
        raise ValueError(text)
    date, clock, frac, zone = m.groups()
    dt = datetime.fromisoformat(f"{date}T{clock}{'+00:00' if zone in (None, 'Z') else zone}")
    if zone is None:  # pandas writes DataRecorder's index as naive UTC
        dt = dt.replace(tzinfo=timezone.utc)  # noqa: UP017 - Python 3.10 (board image)
    return dt.timestamp() + (float(frac) if frac else 0.0)


_ISO = re.compile(r"^(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(\.\d+)?(Z|[+-]\d{2}:\d{2})?$")


def load_power(path, *, rails: list[str] | None = None, time_offset: float = 0.0) -> PowerTrace:
    """Read a power log (see the module docstring and docs/energy.md for the accepted columns).
    ``time_offset`` (s) is added to every time: a log with relative times gets the wall time of its zero."""
    path = _check_file(path, "--power")
    if not (isinstance(time_offset, (int, float)) and math.isfinite(time_offset) and abs(time_offset) <= MAX_TIME_S):
        raise EnergyError(f"--time-offset {time_offset!r}: must be a finite number of seconds within "
                          f"+-{MAX_TIME_S:.0e} (a Unix time now is about 1.7e9)")
    text = _read_text(path, "--power")
    rows = [r for r in csv.reader(io.StringIO(text)) if any(c.strip() for c in r)]
    if len(rows) < 2:
        raise EnergyError(f"--power {path}: empty (needs a header line and at least 2 samples)")
    header = [h.strip() for h in rows[0]]
    body = rows[1:]
    if any(len(r) != len(header) for r in body):
        bad = next(i for i, r in enumerate(body, 2) if len(r) != len(header))
        raise EnergyError(f"--power {path} line {bad}: {len(body[bad - 2])} fields, the header has {len(header)}")
    roles: dict[str, list[tuple[int, float]]] = {}
    for i, h in enumerate(header):
        c = _classify(h)
        if c:
            roles.setdefault(c[0], []).append((i, c[1]))
    recorder = "Mark" in header
    if recorder and "time" not in roles and header[0] == "":
        roles["time"] = [(0, 1.0)]  # DataRecorder.frame.to_csv(): the unnamed index holds the timestamps
    if "time" not in roles:
        raise EnergyError(f"--power {path}: no time column (looked for time/t/timestamp; header: {header})")
    if len(roles["time"]) > 1:
        raise EnergyError(f"--power {path}: several time columns ({[header[i] for i, _ in roles['time']]})")
    ti, tscale = roles["time"][0]

    def column(i: int, scale: float) -> np.ndarray:
        try:
            return np.array([float(r[i]) for r in body]) * scale
        except ValueError:
            raise EnergyError(f"--power {path}: column {header[i]!r} holds a value that is not a number") from None

    groups: dict[str, tuple[list[str], np.ndarray]] = {}
    if recorder:
        rail_cols = {h[: -len("_power")]: i for i, h in enumerate(header) if h.endswith("_power")}
        if not rail_cols:
            volts = [h for h in header if h.endswith("_voltage")]
            raise EnergyError(f"--power {path}: a DataRecorder frame with no *_power column (header: {header})" +
                              ("; its rails report voltage only: measure power with an external meter (docs/energy.md)"
                               if volts else ""))
        by_domain = {d: [r for r in rail_cols if rail_domain(r) == d] for d in ("PL", "PS")}
        for d, names in by_domain.items():
            if names:
                groups[d] = (names, sum(column(rail_cols[r], 1.0) for r in names))
        default = list(rail_cols) if len(rail_cols) == 1 else by_domain["PL"] + by_domain["PS"] if groups else None
        chosen = rails or default
        if chosen is None:
            raise EnergyError(f"--power {path}: several rails ({', '.join(rail_cols)}); choose with --rails "
                              "(summing all would count a supply and the rails it feeds twice)")
        missing = [r for r in chosen if r not in rail_cols]
        if missing:
            raise EnergyError(f"--power {path}: no rail {missing[0]!r} (rails: {', '.join(rail_cols)})")
        p = sum(column(rail_cols[r], 1.0) for r in chosen)
        used = f"time={header[ti] or '(index)'}, power=sum of {', '.join(r + '_power' for r in chosen)} (W)"
        left = [r for r in rail_cols if r not in chosen]
        if left and not rails:
            used += f"; not added: {', '.join(left)} (neither a PL nor a PS rail: a supply input feeds the others)"
    elif rails:
        raise EnergyError(f"--power {path}: --rails applies to a pynq DataRecorder frame (a 'Mark' column)")
    elif "power" in roles:
        if len(roles["power"]) > 1:
            raise EnergyError(f"--power {path}: several power columns ({[header[i] for i, _ in roles['power']]})")
        pi, ps = roles["power"][0]
        p = column(pi, ps)
        used = f"time={header[ti]}, power={header[pi]} ({'mW' if ps != 1 else 'W'})"
    elif "voltage" in roles and "current" in roles:
        if len(roles["voltage"]) > 1 or len(roles["current"]) > 1:
            raise EnergyError(f"--power {path}: several voltage or current columns; keep one of each")
        (vi, vs), (ci, cs) = roles["voltage"][0], roles["current"][0]
        p = column(vi, vs) * column(ci, cs)
        used = (f"time={header[ti]}, power={header[vi]} ({'mV' if vs != 1 else 'V'}) x "
                f"{header[ci]} ({'mA' if cs != 1 else 'A'})")
    else:
        raise EnergyError(f"--power {path}: no power column and no voltage+current pair "
                          f"(looked for power/p/watts, voltage/v/bus_voltage, current/i/mA; header: {header})")
    try:
        t = np.array([_parse_time(r[ti]) for r in body]) * tscale + float(time_offset)
    except ValueError:
        raise EnergyError(f"--power {path}: column {header[ti]!r} holds a time that is neither seconds nor "
                          "an ISO date-time") from None
    if not (np.all(np.isfinite(t)) and np.all(np.isfinite(p))):
        raise EnergyError(f"--power {path}: NaN or infinite values")
    negative = np.flatnonzero(p < 0)
    if negative.size:
        k = int(negative[0])
        raise EnergyError(f"--power {path} line {k + 2}: negative power {p[k]:g} W (a current sensor wired the wrong "
                          "way round, or a signed reading)")
    if np.any(np.diff(t) <= 0):
        k = int(np.argmax(np.diff(t) <= 0)) + 3
        raise EnergyError(f"--power {path} line {k}: time {t[k - 2] - time_offset} does not increase")
    if tscale != 1.0:
        unit = {1e-3: "ms", 1e-6: "us"}.get(tscale, "")
        used = used.replace(f"time={header[ti]}", f"time={header[ti]} ({unit})", 1)
    return PowerTrace(t, p, used, str(path), {d: PowerTrace(t, gp, f"{d} rails: {', '.join(names)}", str(path))
                                              for d, (names, gp) in groups.items()})


# --- integration ----------------------------------------------------------------------------------------------


def integrate(trace: PowerTrace, a: float, b: float) -> float:
    """Exact integral (J) over ``[a, b]`` of the straight lines joining the samples (see the module
    docstring); ``[a, b]`` must lie within the trace."""
    t, p = trace.t, trace.p
    lo, hi = np.searchsorted(t, a, side="right"), np.searchsorted(t, b, side="left")
    ts = np.concatenate(([a], t[lo:hi], [b]))
    ps = np.concatenate(([np.interp(a, t, p)], p[lo:hi], [np.interp(b, t, p)]))
    return float(np.sum((ts[1:] - ts[:-1]) * (ps[1:] + ps[:-1]) / 2))


def _samples_in(trace: PowerTrace, a: float, b: float) -> int:
    return int(np.searchsorted(trace.t, b, side="right") - np.searchsorted(trace.t, a, side="left"))


def _fmt_t(x: float) -> str:
    return f"{x:.6f}"


def _check_covered(trace: PowerTrace, a: float, b: float, what: str) -> None:
    t0, t1 = float(trace.t[0]), float(trace.t[-1])
    if a < t0:
        raise EnergyError(f"{what} [{_fmt_t(a)}, {_fmt_t(b)}] starts {t0 - a:.6g} s before the power log "
                          f"({trace.source}: {_fmt_t(t0)} to {_fmt_t(t1)}){_clock_hint(trace, a)}")
    if b > t1:
        raise EnergyError(f"{what} [{_fmt_t(a)}, {_fmt_t(b)}] ends {b - t1:.6g} s after the power log "
                          f"({trace.source}: {_fmt_t(t0)} to {_fmt_t(t1)}){_clock_hint(trace, a)}")


def _clock_hint(trace: PowerTrace, a: float) -> str:
    if a > 1e9 and trace.t[-1] < 1e8:
        return "; the log's times look relative: give --time-offset (its zero as Unix time)"
    return ""


@dataclass
class EnergyReport:
    columns: str
    idle_w: float
    idle_how: str
    steps: list[dict] = field(default_factory=list)
    mean_j_per_step: float = 0.0
    mean_uj_per_image: float = 0.0
    total_j: float = 0.0
    images: int = 0
    min_samples_per_step: int = 0
    domains: dict = field(default_factory=dict)
    """PL / PS rails of a DataRecorder frame apart: ``rails``, ``idle_w``, ``idle_how``, ``net_j`` per step,
    ``mean_j_per_step``, ``mean_uj_per_image``."""
    estimate: dict | None = None
    """The PL *estimate* of ``generate --energy-estimate`` for the same design (its report.json), beside."""
    integration: str = ("trapezoidal rule over the samples in each window, power at the window edges "
                        "linearly interpolated from the samples either side")

    def to_dict(self) -> dict:
        return asdict(self)


def _parse_window(text: str) -> tuple[float, float]:
    try:
        a, b = (float(x) for x in str(text).split(":"))
    except ValueError:
        raise EnergyError(f"--idle-window {text!r}: expected START:END in seconds") from None
    if not b > a:
        raise EnergyError(f"--idle-window {text!r}: END must be after START")
    return a, b


def measure(trace: PowerTrace, steps: list[StepWindow], *, idle_window=None, idle_seconds: float | None = None,
            idle_watts: float | None = None, min_samples: int = 2) -> EnergyReport:
    """Net energy of every step (the report's ``steps``: ``step, t_start, duration_s, cycles, batch, samples,
    mean_w, gross_j, net_j, uj_per_image``). At most one of ``idle_window`` (``(start, end)`` or
    ``"START:END"``, seconds in the step log's clock), ``idle_seconds`` (the N s before the first step),
    ``idle_watts``. A trace with PL / PS rails (:attr:`PowerTrace.domains`) also gets each domain's net energy
    (``EnergyReport.domains``), its idle taken over the same window (gross with ``idle_watts``: the figure is for
    the whole sum)."""
    if sum(x is not None for x in (idle_window, idle_seconds, idle_watts)) > 1:
        raise EnergyError("give at most one of --idle-window, --idle-seconds, --idle-watts")
    if not _whole(min_samples) or min_samples < 0:
        raise EnergyError(f"--min-samples {min_samples!r}: must be a whole number >= 0 (0 accepts interpolated "
                          "values)")
    steps = sorted(steps, key=lambda s: s.t_start)
    first = steps[0].t_start
    window = None
    if idle_seconds is not None:
        if not (math.isfinite(idle_seconds) and idle_seconds > 0):
            raise EnergyError(f"--idle-seconds {idle_seconds}: must be a finite number > 0")
        idle_window = (first - idle_seconds, first)
        how_prefix = f"mean over the {idle_seconds:g} s before the first step"
    else:
        how_prefix = "mean over the window"
    if idle_window is not None:
        a, b = _parse_window(idle_window) if isinstance(idle_window, str) else map(float, idle_window)
        _check_covered(trace, a, b, "idle window")
        if _samples_in(trace, a, b) < max(min_samples, 2):
            raise EnergyError(f"idle window [{_fmt_t(a)}, {_fmt_t(b)}]: {_samples_in(trace, a, b)} power samples; "
                              "needs at least 2")
        for s in steps:
            if s.t_start < b and s.t_end > a:
                raise EnergyError(f"idle window [{_fmt_t(a)}, {_fmt_t(b)}] overlaps step {s.step} "
                                  f"[{_fmt_t(s.t_start)}, {_fmt_t(s.t_end)}]")
        window = (a, b)
        idle = integrate(trace, a, b) / (b - a)
        how = f"{how_prefix} [{_fmt_t(a)}, {_fmt_t(b)}] ({_samples_in(trace, a, b)} samples)"
    elif idle_watts is not None:
        if not (math.isfinite(idle_watts) and idle_watts >= 0):
            raise EnergyError(f"--idle-watts {idle_watts}: must be a finite figure >= 0")
        idle, how = float(idle_watts), "given (--idle-watts)"
    else:
        idle, how = 0.0, "none: gross energy, nothing subtracted"
    rep = EnergyReport(columns=trace.columns, idle_w=idle, idle_how=how)
    counts = []
    for s in steps:
        _check_covered(trace, s.t_start, s.t_end, f"step {s.step}")
        n = _samples_in(trace, s.t_start, s.t_end)
        if n < min_samples:
            raise EnergyError(f"step {s.step} [{_fmt_t(s.t_start)}, {_fmt_t(s.t_end)}]: {n} power samples in "
                              f"{s.t_end - s.t_start:.6g} s, needs >= {min_samples} (a faster meter, or "
                              "--min-samples 0 to accept interpolated values)")
        counts.append(n)
        dur = s.t_end - s.t_start
        gross = integrate(trace, s.t_start, s.t_end)
        if idle_watts is not None and gross / dur < idle:
            raise EnergyError(f"--idle-watts {idle_watts:g}: above the mean power of step {s.step} ({gross / dur:.6g} "
                              "W), which would give negative energy; measure the baseline with --idle-window or "
                              "--idle-seconds")
        net = gross - idle * dur
        rep.steps.append({"step": s.step, "t_start": s.t_start, "duration_s": dur, "cycles": s.cycles,
                          "batch": s.batch, "samples": n, "mean_w": gross / dur, "gross_j": gross, "net_j": net,
                          "uj_per_image": net / s.batch * 1e6})
    rep.total_j = float(sum(r["net_j"] for r in rep.steps))
    rep.images = int(sum(s.batch for s in steps))
    rep.mean_j_per_step = rep.total_j / len(steps)
    rep.mean_uj_per_image = rep.total_j / rep.images * 1e6
    rep.min_samples_per_step = min(counts)
    for name, dom in trace.domains.items():
        d_idle = integrate(dom, *window) / (window[1] - window[0]) if window else 0.0
        nets = [integrate(dom, s.t_start, s.t_end) - d_idle * (s.t_end - s.t_start) for s in steps]
        rep.domains[name] = {"rails": dom.columns.split(": ", 1)[1].split(", "), "idle_w": d_idle,
                             "idle_how": how if window else "none: gross energy (an idle window measures it per "
                             "domain)", "net_j": nets, "mean_j_per_step": sum(nets) / len(steps),
                             "mean_uj_per_image": sum(nets) / rep.images * 1e6}
    return rep


def load_estimate(path) -> dict:
    """The PL energy estimate of a ``generate --energy-estimate`` report.json (``energy_estimate``)."""
    path = _check_file(path, "--energy-estimate")
    try:
        est = json.loads(_read_text(path, "--energy-estimate")).get("energy_estimate")
    except (json.JSONDecodeError, AttributeError):
        raise EnergyError(f"--energy-estimate {path}: not a report.json of xnortrain generate") from None
    if not isinstance(est, dict) or not all(k in est for k in ("per_step_uj", "per_image_uj", "clock_mhz")):
        raise EnergyError(f"--energy-estimate {path}: no energy_estimate in it (generate it with --energy-estimate)")
    return est


def format_report(rep: EnergyReport, *, max_rows: int = 20) -> str:
    lines = [f"{'step':>6} {'duration ms':>12} {'cycles':>10} {'batch':>6} {'samples':>7} {'mean W':>9} "
             f"{'net J':>12} {'uJ/image':>12}"]
    rows = rep.steps if len(rep.steps) <= max_rows else rep.steps[: max_rows // 2] + [None] + rep.steps[-max_rows // 2:]
    for r in rows:
        if r is None:
            lines.append(f"{'...':>6}")
            continue
        cyc = "-" if r["cycles"] is None else str(r["cycles"])
        lines.append(f"{r['step']:>6} {r['duration_s'] * 1e3:>12.3f} {cyc:>10} {r['batch']:>6} {r['samples']:>7} "
                     f"{r['mean_w']:>9.4f} {r['net_j']:>12.6g} {r['uj_per_image']:>12.6g}")
    lines += [
        f"power columns: {rep.columns}",
        f"idle: {rep.idle_w:.6g} W ({rep.idle_how})",
        f"steps: {len(rep.steps)}, images: {rep.images}, fewest samples in a step: {rep.min_samples_per_step}",
        f"mean: {rep.mean_j_per_step:.6g} J/step, {rep.mean_uj_per_image:.6g} uJ/image "
        + ("(the rails above, minus idle)" if rep.domains else "(whole board, PS included, minus idle)"),
    ]
    for name, d in rep.domains.items():
        lines.append(f"{name} rails ({', '.join(d['rails'])}): idle {d['idle_w']:.6g} W; {d['mean_j_per_step']:.6g} "
                     f"J/step, {d['mean_uj_per_image']:.6g} uJ/image")
    if rep.estimate is not None:
        e = rep.estimate
        lo, hi = e.get("low_per_image_uj", float("nan")), e.get("high_per_image_uj", float("nan"))
        lines.append(f"PL estimate (generate --energy-estimate, {e['clock_mhz']:g} MHz, {e.get('cycles', '?')} "
                     f"cycles per step): {e['per_step_uj'] * 1e-6:.6g} J/step, {e['per_image_uj']:.6g} uJ/image "
                     f"({lo:.6g} to {hi:.6g})" + ("" if "PL" in rep.domains else
                                                  "; no PL rails measured here to set it beside"))
    return "\n".join(lines)


def plot(trace: PowerTrace, rep: EnergyReport, steps: list[StepWindow], path) -> None:
    """Power over time with the step windows shaded and the idle level drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = steps[0].t_start
    fig, ax = plt.subplots(figsize=(9, 3.5))
    ax.plot(trace.t - t0, trace.p, lw=0.8, marker=".", ms=2)
    for s in steps:
        ax.axvspan(s.t_start - t0, s.t_end - t0, color="tab:orange", alpha=0.25, lw=0)
    ax.axhline(rep.idle_w, color="grey", ls="--", lw=0.8, label=f"idle {rep.idle_w:.3g} W")
    ax.set_xlabel("time from the first step (s)")
    ax.set_ylabel("power (W)")
    ax.legend(loc="upper right")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def measure_main(args) -> int:
    """``xnortrain energy-measure``."""
    from host.common import EXIT_OK
    from host.common import output_file as _output_file
    from host.common import write_json as _write_json

    rails = [r.strip() for r in args.rails.split(",") if r.strip()] if args.rails else None
    trace = load_power(args.power, rails=rails, time_offset=args.time_offset)
    steps = load_steps(args.steps)
    json_out = _output_file("--json", args.json) if args.json else None
    png_out = _output_file("--plot", args.plot, ".png") if args.plot else None
    estimate = load_estimate(args.energy_estimate) if getattr(args, "energy_estimate", None) else None
    rep = measure(trace, steps, idle_window=args.idle_window, idle_seconds=args.idle_seconds,
                  idle_watts=args.idle_watts, min_samples=args.min_samples)
    rep.estimate = estimate
    print(format_report(rep))
    if json_out:
        _write_json(str(json_out), rep.to_dict())
        print(f"written to {json_out}")
    if png_out:
        plot(trace, rep, sorted(steps, key=lambda s: s.t_start), png_out)
        print(f"plot written to {png_out}")
    return EXIT_OK
