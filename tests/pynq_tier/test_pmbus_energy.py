"""energy-measure on a frame recorded by pynq's own DataRecorder (pynq.pmbus), with mock PMBus rails behind it
as a ZCU104's would be read: the frame pynq writes is read with its PL and PS rails apart, and each domain's
energy equals the integral of the recorded samples computed here independently."""

import json
import threading
import time

import numpy as np
import pynq
import pytest

pytestmark = pytest.mark.pynq

# rail: (W idle, W while a step runs); the 12 V input feeds the others
RAILS = {"VCCINT": (1.0, 1.8), "VCCBRAM": (0.2, 0.3), "VCCPSINTFP": (0.8, 1.1), "VCCPSAUX": (0.1, 0.1),
         "12V": (6.0, 7.2)}


class MockPower:
    """A power sensor as pynq.DataRecorder reads one (MultiSensor: ``name``, ``parents``, ``get_value``)."""

    parents = ()

    def __init__(self, rail, busy):
        self.name, self._rail, self._busy = f"{rail}_power", rail, busy

    def get_value(self, parents=()):
        return RAILS[self._rail][self._busy.is_set()]


def test_datarecorder_frame_gives_pl_and_ps_energy(tmp_path, monkeypatch):
    from host.energy import integrate, load_power, load_steps, measure

    monkeypatch.setenv("TZ", "UTC")  # DataRecorder stamps pandas' local now(); the frame is read as UTC
    time.tzset()
    busy = threading.Event()
    rec = pynq.DataRecorder(*[MockPower(r, busy) for r in RAILS])
    steps_path = tmp_path / "steps.jsonl"
    with rec.record(0.005), open(steps_path, "w") as fh:
        time.sleep(0.3)  # idle
        for k in range(3):
            busy.set()
            t0 = time.time()
            time.sleep(0.1)
            t1 = time.time()
            busy.clear()
            fh.write(json.dumps({"step": k, "t_start": t0, "t_end": t1, "cycles": 1000, "batch": 100}) + "\n")
            time.sleep(0.1)
    power_path = tmp_path / "power.csv"
    rec.frame.to_csv(power_path)

    trace = load_power(power_path)
    assert set(trace.domains) == {"PL", "PS"} and "not added: 12V" in trace.columns
    steps = load_steps(steps_path)
    rep = measure(trace, steps, idle_seconds=0.2, min_samples=0)
    assert rep.domains["PL"]["rails"] == ["VCCINT", "VCCBRAM"]
    assert rep.domains["PS"]["rails"] == ["VCCPSINTFP", "VCCPSAUX"]
    # independently: the frame's samples, trapezoids by numpy, idle = the mean over the idle window
    frame = rec.frame
    t = np.array([ts.timestamp() for ts in frame.index.tz_localize("UTC")])
    for dom, rails in (("PL", ["VCCINT", "VCCBRAM"]), ("PS", ["VCCPSINTFP", "VCCPSAUX"])):
        p = sum(frame[f"{r}_power"].to_numpy(dtype=float) for r in rails)
        assert np.allclose(trace.domains[dom].t, t, rtol=0, atol=1e-6) and np.allclose(trace.domains[dom].p, p)
        a, b = steps[0].t_start - 0.2, steps[0].t_start
        ref = type(trace)(t, p, dom)
        idle = integrate(ref, a, b) / (b - a)
        assert rep.domains[dom]["idle_w"] == pytest.approx(idle)
        for s, got in zip(steps, rep.domains[dom]["net_j"], strict=True):
            tt = np.concatenate(([s.t_start], t[(t > s.t_start) & (t < s.t_end)], [s.t_end]))
            pp = np.interp(tt, t, p)
            assert got == pytest.approx(np.trapz(pp, tt) - idle * (s.t_end - s.t_start), rel=1e-9, abs=1e-12)
