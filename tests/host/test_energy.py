"""host.energy: the driver's step log and `xnortrain energy-measure` on synthetic power traces whose
energies are known in closed form."""

import json
import math

import numpy as np
import pytest
from mock_accelerator import MockAccelerator, MockTransport, batch, make_desc

from host.cli import EXIT_OK, EXIT_USER_ERROR, main
from host.driver import Driver
from host.energy import (
    EnergyError,
    PowerTrace,
    StepLog,
    StepWindow,
    format_report,
    integrate,
    load_power,
    load_steps,
    measure,
)

T0 = 1_700_000_000.0  # an epoch time, as time.time() gives


def write_csv(path, header, rows):
    path.write_text(",".join(header) + "\n" + "".join(",".join(repr(float(v)) if not isinstance(v, str) else v
                                                                for v in r) + "\n" for r in rows))
    return path


def write_steps(path, windows, batch=4):
    with open(path, "w") as fh:
        for i, (a, b) in enumerate(windows):
            fh.write(json.dumps({"step": i, "t_start": a, "t_end": b, "duration_s": b - a, "cycles": 1000 + i,
                                 "batch": batch}) + "\n")
    return path


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-300)


# --- integration: exact cases ---------------------------------------------------------------------------------


def test_constant_power_gives_power_times_duration():
    t = T0 + np.arange(0, 10, 0.01)
    tr = PowerTrace(t, np.full_like(t, 2.5), "test")
    steps = [StepWindow(i, T0 + 1 + i * 0.3, T0 + 1.2 + i * 0.3, 8) for i in range(5)]
    rep = measure(tr, steps)
    for r in rep.steps:
        # the known answer is P (b - a) for the windows as stored (an epoch time carries ~2e-7 s of rounding)
        assert rel(r["net_j"], 2.5 * r["duration_s"]) < 1e-9 and abs(r["duration_s"] - 0.2) < 1e-6
        assert rel(r["uj_per_image"], 2.5 * r["duration_s"] / 8 * 1e6) < 1e-9
    assert rep.idle_w == 0 and "gross" in rep.idle_how


def test_square_wave_aligned_with_steps_minus_idle_window():
    # samples every 10 ms; 5 W during each step window (edges on samples), 1.5 W otherwise
    t = T0 + np.arange(0, 1000) * 0.01
    windows = [(T0 + 2.0 + 1.0 * k, T0 + 2.5 + 1.0 * k) for k in range(5)]
    p = np.full(t.shape, 1.5)
    for a, b in windows:
        p[(t >= a - 1e-9) & (t <= b + 1e-9)] = 5.0
    tr = PowerTrace(t, p, "test")
    rep = measure(tr, [StepWindow(i, a, b, 4) for i, (a, b) in enumerate(windows)], idle_window=(T0 + 0.1, T0 + 1.5))
    assert rel(rep.idle_w, 1.5) < 1e-9
    for r in rep.steps:
        assert rel(r["net_j"], 3.5 * r["duration_s"]) < 1e-9
    assert rel(rep.mean_j_per_step, 1.75) < 1e-9  # T0 + 2.0 + k and T0 + 2.5 + k are exact doubles
    assert rel(rep.mean_uj_per_image, 1.75 / 4 * 1e6) < 1e-9


def test_linear_ramp_irregular_sampling_and_edges_between_samples():
    # P(t) = 1 + 0.5 (t - T0): linear, so the piecewise-linear integral is exact at any sample times
    rng = np.random.default_rng(1)
    t = T0 + np.sort(rng.uniform(0, 20, 300))
    t = np.concatenate(([T0], t, [T0 + 20]))
    tr = PowerTrace(t, 1 + 0.5 * (t - T0), "test")
    for a, b in ((3.123, 4.987), (10.0001, 10.5), (0.0, 20.0)):
        a, b = (T0 + a) - T0, (T0 + b) - T0  # the window as an epoch time represents it
        exact = (b - a) + 0.25 * (b * b - a * a)
        assert rel(integrate(tr, T0 + a, T0 + b), exact) < 1e-9


def test_ramp_with_idle_seconds_before_first_step():
    t = T0 + np.arange(0, 3001) * 0.001  # 3 s at 1 kHz
    p = np.where(t < T0 + 2, 1.0, 1.0 + 4.0 * (t - (T0 + 2)))  # flat 1 W, then a ramp
    tr = PowerTrace(t, p, "test")
    rep = measure(tr, [StepWindow(0, T0 + 2.0, T0 + 2.5, 2)], idle_seconds=1.0)
    assert rel(rep.idle_w, 1.0) < 1e-9 and "1 s before the first step" in rep.idle_how
    assert rel(rep.steps[0]["net_j"], 2.0 * 0.25) < 1e-9  # integral of 4 t over [0, 0.5]


def test_idle_watts_given():
    t = T0 + np.arange(0, 100) * 0.1
    rep = measure(PowerTrace(t, np.full(t.shape, 3.0), "test"), [StepWindow(0, T0 + 1, T0 + 3, 2)], idle_watts=2.0)
    assert rel(rep.steps[0]["net_j"], 2.0) < 1e-9 and rep.idle_how.startswith("given")


# --- reading logs ---------------------------------------------------------------------------------------------


def test_voltage_times_current_in_ma(tmp_path):
    t = np.arange(0, 5, 0.01)
    path = write_csv(tmp_path / "ina.csv", ["Time (s)", "bus_voltage", "current_mA"],
                     [(x, 12.0, 250.0) for x in t])
    tr = load_power(path, time_offset=T0)
    assert "bus_voltage" in tr.columns and "mA" in tr.columns
    assert rel(integrate(tr, T0 + 1, T0 + 2), 3.0) < 1e-9


@pytest.mark.parametrize("header,scale", [(["t", "p"], 1.0), (["timestamp", "watts"], 1.0),
                                          (["time_ms", "power_mW"], 1e-3), (["Time", "Power (W)"], 1.0)])
def test_header_names_are_detected(tmp_path, header, scale):
    tscale = 1e-3 if "ms" in header[0] else 1.0
    rows = [(i * 10 / tscale * 0.01, 2000.0 if scale != 1 else 2.0) for i in range(200)]
    tr = load_power(write_csv(tmp_path / "p.csv", header, rows))
    assert rel(integrate(tr, 0.1, 1.1), 2.0) < 1e-9, tr.columns


def test_pynq_datarecorder_frame_sums_chosen_rails(tmp_path):
    from datetime import datetime, timedelta, timezone

    base = datetime.fromtimestamp(T0, timezone.utc).replace(tzinfo=None)  # noqa: UP017
    rows = [((base + timedelta(milliseconds=10 * i)).isoformat(sep=" "), "0", "1.0", "0.5", "9.0")
            for i in range(300)]
    path = tmp_path / "rec.csv"
    path.write_text(",Mark,VCCINT_power,VCCAUX_power,12V_power\n" + "".join(",".join(r) + "\n" for r in rows))
    tr = load_power(path, rails=["VCCINT", "VCCAUX"])
    assert rel(integrate(tr, T0 + 0.5, T0 + 1.5), 1.5) < 1e-9
    # without --rails: the PL (and PS) rails, never the 12 V input that feeds them
    tr = load_power(path)
    assert rel(integrate(tr, T0 + 0.5, T0 + 1.5), 1.5) < 1e-9 and "not added: 12V" in tr.columns
    with pytest.raises(EnergyError, match="no rail 'PSINT'"):
        load_power(path, rails=["PSINT"])
    path.write_text(",Mark,12V_power,5V_power\n" + "".join(f"{r[0]},0,9.0,1.0\n" for r in rows))
    with pytest.raises(EnergyError, match="several rails"):  # rails of no known domain: the user chooses
        load_power(path)


# --- PMBus rails of a Zynq UltraScale+ board (ZCU104), PL apart from PS ----------------------------------------

PMBUS = {  # rail: (idle W, W while a step runs)
    "VCCINT": (1.0, 1.6), "VCCBRAM": (0.2, 0.25), "VCCAUX": (0.3, 0.3), "VCC3V3": (0.05, 0.05),
    "VCCPSINTFP": (0.8, 1.0), "VCCPSAUX": (0.1, 0.1), "VCCO_PSDDR_504": (0.2, 0.3), "12V": (6.0, 7.0),
}


def write_recorder_frame(path, windows, rails=PMBUS, dt_ms=5, n=2000, voltage_only=()):
    """A pynq.DataRecorder frame as frame.to_csv() writes it: each rail's power a square wave on the steps."""
    from datetime import datetime, timedelta, timezone

    base = datetime.fromtimestamp(T0, timezone.utc).replace(tzinfo=None)  # noqa: UP017
    cols = [f"{r}_power" for r in rails] + [f"{r}_voltage" for r in voltage_only]
    lines = [",Mark," + ",".join(cols)]
    for i in range(n):
        t = dt_ms * i / 1000
        busy = any(a <= T0 + t <= b for a, b in windows)
        vals = [rails[r][busy] for r in rails] + [0.85] * len(voltage_only)
        lines.append(f"{(base + timedelta(milliseconds=dt_ms * i)).isoformat(sep=' ')},0," +
                     ",".join(repr(v) for v in vals))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_pmbus_frame_reports_pl_and_ps_rails_apart(tmp_path):
    """Known integrals: the PL rails rise by 0.65 W and the PS rails by 0.3 W during each step; the 12 V input is
    not added; idle subtracted per domain; J per step and uJ per image."""
    windows = [(T0 + 2.0 + k, T0 + 2.4 + k) for k in range(3)]  # on 5 ms sample edges
    tr = load_power(write_recorder_frame(tmp_path / "rec.csv", windows))
    assert set(tr.domains) == {"PL", "PS"}
    rep = measure(tr, load_steps(write_steps(tmp_path / "s.jsonl", windows, batch=100)),
                  idle_window=(T0 + 0.5, T0 + 1.5))
    pl, ps = rep.domains["PL"], rep.domains["PS"]
    assert pl["rails"] == ["VCCINT", "VCCBRAM", "VCCAUX", "VCC3V3"]
    assert ps["rails"] == ["VCCPSINTFP", "VCCPSAUX", "VCCO_PSDDR_504"]
    assert rel(pl["idle_w"], 1.55) < 1e-9 and rel(ps["idle_w"], 1.1) < 1e-9
    # the ramps at the window edges are outside the windows (sampled on the edges): exact
    assert all(rel(j, 0.65 * 0.4) < 1e-6 for j in pl["net_j"]), pl
    assert all(rel(j, 0.3 * 0.4) < 1e-6 for j in ps["net_j"]), ps
    assert rel(pl["mean_uj_per_image"], 0.65 * 0.4 / 100 * 1e6) < 1e-6
    assert rel(rep.mean_j_per_step, 0.95 * 0.4) < 1e-6  # the total is PL + PS, not the 12 V input as well
    text = format_report(rep)
    assert "PL rails (VCCINT, VCCBRAM, VCCAUX, VCC3V3)" in text and "PS rails (VCCPSINTFP" in text


def test_voltage_only_rails_are_refused_saying_why(tmp_path):
    path = write_recorder_frame(tmp_path / "rec.csv", [], rails={}, voltage_only=("VCCINT", "VCCAUX"))
    with pytest.raises(EnergyError, match="voltage only: measure power with an external meter"):
        load_power(path)


def test_energy_estimate_beside_the_measurement(tmp_path, capsys):
    windows = [(T0 + 2.0 + k, T0 + 2.4 + k) for k in range(2)]
    power = write_recorder_frame(tmp_path / "rec.csv", windows)
    steps = write_steps(tmp_path / "s.jsonl", windows, batch=100)
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"energy_estimate": {"per_step_uj": 2500.0, "per_image_uj": 25.0, "clock_mhz": 80.0,
                                                      "cycles": 276_300, "low_per_image_uj": 20.0,
                                                      "high_per_image_uj": 31.0}}))
    rc = main(["energy-measure", "--power", str(power), "--steps", str(steps), "--idle-seconds", "1",
               "--energy-estimate", str(report)])
    out = capsys.readouterr().out
    assert rc == EXIT_OK, out
    assert "PL rails (VCCINT" in out
    assert "PL estimate (generate --energy-estimate, 80 MHz, 276300 cycles per step): 0.0025 J/step, 25 uJ/image" \
        in out
    report.write_text(json.dumps({"cycles": {}}))
    rc, err = _run_err(capsys, ["energy-measure", "--power", str(power), "--steps", str(steps),
                                "--energy-estimate", str(report)])
    assert rc == EXIT_USER_ERROR and "no energy_estimate" in err and str(report) in err


@pytest.mark.parametrize("stamp,seconds", [("2023-11-14 22:13:20", 0.0), ("2023-11-14 22:13:20.25", 0.25),
                                           ("2023-11-14T22:13:20.123456789", 0.123456789),
                                           ("2023-11-14 23:13:20.5+01:00", 0.5), ("2023-11-14 22:13:20Z", 0.0)])
def test_iso_times_as_pandas_writes_them(tmp_path, stamp, seconds):
    # pandas writes a DatetimeIndex with 0, 6 or 9 fractional digits; T0 is 2023-11-14 22:13:20 UTC
    path = tmp_path / "p.csv"
    path.write_text(f"timestamp,power\n{stamp},1.0\n2023-11-14 22:13:30,1.0\n")
    tr = load_power(path)
    assert abs(tr.t[0] - (T0 + seconds)) < 1e-6


def test_step_log_from_driver_train_steps(tmp_path):
    desc = make_desc()
    log = tmp_path / "steps.jsonl"
    drv = Driver(desc, MockTransport(MockAccelerator(desc)), step_log=log)
    x, y = batch()
    for _ in range(3):
        drv.train_step(x, y, lr=1e-3)
    drv.step_log.close()
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["step"] for r in recs] == [0, 1, 2]
    for r in recs:
        assert r["batch"] == len(y) and isinstance(r["cycles"], int)
        assert r["t_end"] >= r["t_start"] and r["duration_s"] >= 0
    steps = load_steps(log)
    assert [s.step for s in steps] == [0, 1, 2]
    # appending continues the index
    drv2 = Driver(desc, MockTransport(MockAccelerator(desc)), step_log=StepLog(log))
    drv2.train_step(x, y, lr=1e-3)
    drv2.step_log.close()
    assert json.loads(log.read_text().splitlines()[-1])["step"] == 3


# --- errors ---------------------------------------------------------------------------------------------------


def test_log_not_covering_a_step_names_step_and_gap():
    t = T0 + np.arange(0, 100) * 0.01  # 0..0.99 s
    tr = PowerTrace(t, np.ones_like(t), "p.csv")
    with pytest.raises(EnergyError, match=r"step 1 .* ends 0\.51 s after the power log"):
        measure(tr, [StepWindow(0, T0 + 0.1, T0 + 0.2, 1), StepWindow(1, T0 + 0.5, T0 + 1.5, 1)])


def test_step_before_the_log_and_steps_given_by_duration(tmp_path):
    t = T0 + 1 + np.arange(0, 100) * 0.01
    tr = PowerTrace(t, np.ones_like(t), "p.csv")
    with pytest.raises(EnergyError, match=r"step 0 .* starts 0\.5 s before the power log"):
        measure(tr, [StepWindow(0, T0 + 0.5, T0 + 1.5, 1)])
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"t_start": T0 + 1.25, "duration_s": 0.5, "batch": 2}) + "\n")
    (s,) = load_steps(path)
    assert s.step == 0 and s.t_end == T0 + 1.75 and s.cycles is None


def test_too_few_samples_in_a_step():
    t = T0 + np.arange(0, 10) * 1.0
    tr = PowerTrace(t, np.ones_like(t), "p.csv")
    with pytest.raises(EnergyError, match="step 0 .*1 power samples"):
        measure(tr, [StepWindow(0, T0 + 2.5, T0 + 3.5, 1)])
    rep = measure(tr, [StepWindow(0, T0 + 2.5, T0 + 3.5, 1)], min_samples=0)
    assert rel(rep.steps[0]["net_j"], 1.0) < 1e-9


def test_relative_log_without_offset_gets_a_hint():
    t = np.arange(0, 100) * 0.01
    with pytest.raises(EnergyError, match="--time-offset"):
        measure(PowerTrace(t, np.ones_like(t), "p.csv"), [StepWindow(0, T0 + 0.1, T0 + 0.2, 1)])


def test_idle_window_overlapping_a_step_is_refused():
    t = T0 + np.arange(0, 100) * 0.01
    with pytest.raises(EnergyError, match="overlaps step 0"):
        measure(PowerTrace(t, np.ones_like(t), "p"), [StepWindow(0, T0 + 0.5, T0 + 0.6, 1)],
                idle_window=f"{T0 + 0.1!r}:{T0 + 0.55!r}")


# --- the command --------------------------------------------------------------------------------------------


def test_cli_energy_measure_known_answer(tmp_path, capsys):
    t = np.arange(0, 1000) * 0.01
    windows = [(T0 + 2.0 + k, T0 + 2.5 + k) for k in range(4)]
    p = [5.0 if any(a - 1e-9 <= T0 + x <= b + 1e-9 for a, b in windows) else 1.5 for x in t]
    power = write_csv(tmp_path / "meter.csv", ["time", "power"], list(zip(t, p, strict=True)))
    steps = write_steps(tmp_path / "steps.jsonl", windows, batch=4)
    out = tmp_path / "out" / "e.json"
    png = tmp_path / "e.png"
    rc = main(["energy-measure", "--power", str(power), "--steps", str(steps), "--time-offset", repr(T0),
               "--idle-window", f"{T0 + 0.5!r}:{T0 + 1.5!r}", "--json", str(out), "--plot", str(png)])
    text = capsys.readouterr().out
    assert rc == EXIT_OK, text
    assert "idle: 1.5 W" in text and "power columns: time=time, power=power (W)" in text
    data = json.loads(out.read_text())
    assert rel(data["mean_j_per_step"], 1.75) < 1e-9
    assert rel(data["mean_uj_per_image"], 1.75 / 4 * 1e6) < 1e-9
    assert [s["cycles"] for s in data["steps"]] == [1000, 1001, 1002, 1003]
    assert png.stat().st_size > 0


def _run_err(capsys, argv):
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    return rc, err


@pytest.mark.parametrize("case", ["empty", "header_only", "bad_columns", "not_numbers", "folder_power",
                                  "folder_steps", "empty_steps", "uncovered", "not_increasing"])
def test_cli_errors_are_one_line_exit_2(tmp_path, capsys, case):
    power = write_csv(tmp_path / "p.csv", ["t", "w"], [(T0 + i * 0.01, 1.0) for i in range(100)])
    steps = write_steps(tmp_path / "s.jsonl", [(T0 + 0.1, T0 + 0.2)])
    expect = {"empty": "empty", "header_only": "empty", "bad_columns": "no power column",
              "not_numbers": "not a number", "folder_power": "is a folder", "folder_steps": "is a folder",
              "empty_steps": "no steps", "uncovered": "step 0", "not_increasing": "does not increase"}[case]
    if case == "empty":
        power.write_text("")
    elif case == "header_only":
        power.write_text("t,w\n")
    elif case == "bad_columns":
        write_csv(power, ["t", "temperature"], [(T0 + i * 0.01, 1.0) for i in range(100)])
    elif case == "not_numbers":
        power.write_text("t,w\n" + "".join(f"{T0 + i * 0.01},{'x' if i == 5 else 1.0}\n" for i in range(100)))
    elif case == "folder_power":
        power = tmp_path
    elif case == "folder_steps":
        steps = tmp_path
    elif case == "empty_steps":
        steps.write_text("\n")
    elif case == "uncovered":
        steps = write_steps(tmp_path / "s.jsonl", [(T0 + 0.5, T0 + 2.0)])
    elif case == "not_increasing":
        power.write_text("t,w\n" + "".join(f"{T0 + (i if i != 50 else 10) * 0.01},1.0\n" for i in range(100)))
    rc, err = _run_err(capsys, ["energy-measure", "--power", str(power), "--steps", str(steps)])
    assert rc == EXIT_USER_ERROR
    assert len(err.splitlines()) == 1 and expect in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("case", ["batch_fraction", "batch_string", "duplicate_step", "overlapping_steps",
                                  "idle_above_step", "negative_power", "min_samples_negative", "offset_nan",
                                  "offset_huge", "latin1", "cycles_word", "cycles_fraction"])
def test_cli_inputs_refused_naming_file_line_or_option(tmp_path, capsys, case):
    """Issue 34's energy-measure inputs: each refused in one line naming the file and line, or the option."""
    power = write_csv(tmp_path / "p.csv", ["t", "w"], [(T0 + i * 0.01, 2.0) for i in range(200)])
    steps = write_steps(tmp_path / "s.jsonl", [(T0 + 0.5, T0 + 0.7), (T0 + 1.0, T0 + 1.2)])
    argv = ["energy-measure", "--power", str(power), "--steps", str(steps)]
    lines = steps.read_text().splitlines()
    if case == "batch_fraction":
        steps.write_text(lines[0] + "\n" + lines[1].replace('"batch": 4', '"batch": 2.7') + "\n")
        expect = f"--steps {steps} line 2: batch 2.7 must be a whole number"
    elif case == "batch_string":
        steps.write_text(lines[0].replace('"batch": 4', '"batch": "4"') + "\n")
        expect = f"--steps {steps} line 1: batch '4'"
    elif case == "duplicate_step":
        steps.write_text(lines[0] + "\n" + lines[1] + "\n" + lines[1] + "\n")
        expect = f"--steps {steps} lines 2 and 3: steps 1 and 1 overlap"
    elif case == "overlapping_steps":
        write_steps(steps, [(T0 + 0.5, T0 + 0.7), (T0 + 0.6, T0 + 0.8)])
        expect = f"--steps {steps} lines 1 and 2"
    elif case == "idle_above_step":
        argv += ["--idle-watts", "2.5"]
        expect = "--idle-watts 2.5: above the mean power of step 0 (2 W)"
    elif case == "negative_power":
        write_csv(power, ["t", "w"], [(T0 + i * 0.01, -0.3 if i == 7 else 2.0) for i in range(200)])
        expect = f"--power {power} line 9: negative power -0.3 W"
    elif case == "min_samples_negative":
        argv += ["--min-samples", "-5"]
        expect = "--min-samples -5: must be a whole number >= 0"
    elif case in ("offset_nan", "offset_huge"):
        argv += [f"--time-offset={'nan' if case == 'offset_nan' else '1e300'}"]
        expect = "--time-offset " + ("nan" if case == "offset_nan" else "1e+300") + ": must be a finite number"
    elif case == "latin1":
        power.write_bytes(b"t,w\n" + "# mesure à 1 kHz\n".encode("latin-1"))
        expect = f"--power {power} line 2: not UTF-8 text (byte 0xe0)"
    elif case == "cycles_word":
        steps.write_text(lines[0].replace('"cycles": 1000', '"cycles": "many"') + "\n")
        expect = f"--steps {steps} line 1: cycles 'many' must be a whole number"
    elif case == "cycles_fraction":
        steps.write_text(lines[0].replace('"cycles": 1000', '"cycles": 10.5') + "\n")
        expect = f"--steps {steps} line 1: cycles 10.5"
    rc, err = _run_err(capsys, argv)
    assert rc == EXIT_USER_ERROR, err
    assert len(err.splitlines()) == 1 and expect in err, err
    assert "Traceback" not in err


def test_a_utf8_file_with_a_byte_order_mark_is_read(tmp_path):
    power = tmp_path / "p.csv"
    power.write_bytes(b"\xef\xbb\xbft,w\n" + b"".join(f"{i * 0.01},2.0\n".encode() for i in range(10)))
    assert load_power(power).columns == "time=t, power=w (W)"


def test_integrate_is_exact_for_piecewise_linear_sampled_trace():
    # a random piecewise-linear trace: integrating it in two pieces equals integrating it whole
    rng = np.random.default_rng(3)
    t = np.cumsum(rng.uniform(0.001, 0.02, 500))
    tr = PowerTrace(t, rng.uniform(0, 5, 500), "test")
    a, m, b = t[3] + 0.0004, t[200] + 0.0007, t[-4] - 0.0003
    whole = integrate(tr, a, b)
    assert math.isclose(integrate(tr, a, m) + integrate(tr, m, b), whole, rel_tol=1e-12)
    ref = sum(0.5 * (t[i + 1] - t[i]) * (tr.p[i] + tr.p[i + 1]) for i in range(len(t) - 1))
    assert math.isclose(integrate(tr, t[0], t[-1]), ref, rel_tol=1e-12)
