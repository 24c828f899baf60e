# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Energy per training step
#
# The driver writes one JSON line per training step (wall-clock start and end, the accelerator's cycles, the
# batch size). A power log taken at the same time, from the board's own sensors (`pynq.DataRecorder`, where the
# board has PMBus rails) or from an external meter on the supply (PYNQ-Z1, PYNQ-Z2 and ZedBoard have no
# sensors: docs/energy.md says how to wire one), is integrated over every step window minus the idle baseline:
# joules per step and per image (`xnortrain energy-measure` does the same from the command line).
#
# On a board the cells tagged `board-only` record real power. Without a board the training steps run on the
# simulated board and the power log is **synthetic** (a stated idle and busy power with noise), so that every
# other cell, the integration and the plot run unchanged; its joules are a check of the method, not a
# measurement.

# %% tags=["parameters"]
import os

CONFIG = os.environ.get("XNT_NB_CONFIG", "mlp")
STEPS = int(os.environ.get("XNT_NB_STEPS", "10"))
BITSTREAM = os.environ.get("XNT_NB_BITSTREAM", "xnortrain.bit")
METER_CSV = os.environ.get("XNT_NB_METER_CSV", "")  # on a board without sensors: the external meter's CSV
IDLE_SECONDS = 2.0  # idle baseline: the seconds before the first step

# %%
import contextlib
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from host.cli import _default_target
from host.driver import Driver
from host.energy import StepLog, format_report, load_power, load_steps, measure
from sim.config import load_config
from sim.hw.engine import HwEngine
from sim.train_loop import load_training_data

cfg = load_config(CONFIG)
ON_BOARD = _default_target() == "board"
work = Path(tempfile.mkdtemp(prefix="xnt-energy-"))
steps_path, power_path = work / "steps.jsonl", work / "power.csv"
stack = contextlib.ExitStack()
driver = recorder = None
print(f"{cfg.name}: on a board: {ON_BOARD}; logs in {work}")

# %% tags=["board-only"]
import pynq

from host.board import open_board

driver = stack.enter_context(open_board(cfg, BITSTREAM, step_log=StepLog(steps_path)))
# boards with PMBus sensors (ZCU104): record every rail that reports power while training; energy-measure adds the
# PL rails and the PS rails and reports each apart. Rails that report only a voltage (power None) measure nothing.
power_sensors = [r.power for r in pynq.get_rails().values() if getattr(r, "power", None) is not None]
if power_sensors and not METER_CSV:
    recorder = pynq.DataRecorder(*power_sensors)
    stack.enter_context(recorder.record(0.01))
elif not METER_CSV:
    print("this board has no rail that reports power: log an external meter and set METER_CSV (docs/energy.md)")

# %%
if driver is None:  # no board: the simulated board; its steps are timed the same way
    from host.simboard import SimBoard

    board = stack.enter_context(SimBoard.build(cfg))
    driver = Driver(board.description, board.transport, step_log=StepLog(steps_path))

data = load_training_data(cfg)
prep = HwEngine(cfg)
driver.load_state_dict(prep.state_dict())  # the configuration's seeded initial state
B = cfg.train.batch_size
t_idle0 = time.time()
time.sleep(IDLE_SECONDS)  # the idle window before the first step
for step in range(STEPS):
    idx = np.arange(step * B, (step + 1) * B)
    driver.train_step(prep.prepare_inputs(data.x_train[idx]), data.y_train[idx], lr=float(cfg.lr))
time.sleep(0.5)
driver.step_log.close()
print(f"{STEPS} steps logged to {steps_path}")

# %% tags=["board-only"]
if recorder is not None:
    stack.close()  # stop recording
    frame = recorder.frame
    frame.to_csv(power_path)
elif METER_CSV:
    power_path = Path(METER_CSV)

# %%
steps = load_steps(steps_path)
if not power_path.is_file():  # no board: a synthetic trace, 1.90 W idle and +0.35 W while a step runs
    rng = np.random.default_rng(0)
    t = np.arange(t_idle0, steps[-1].t_end + 0.5, 0.002)
    busy = np.zeros_like(t, dtype=bool)
    for s in steps:
        busy |= (t >= s.t_start) & (t < s.t_end)
    p = 1.90 + 0.35 * busy + rng.normal(0, 0.01, len(t))
    np.savetxt(power_path, np.c_[t, p], delimiter=",", header="time,power", comments="", fmt="%.6f")
    print("synthetic power log (no board): the figures below check the method, they measure nothing")
    synthetic = True
else:
    synthetic = False
trace = load_power(power_path)
report = measure(trace, steps, idle_seconds=IDLE_SECONDS)
print(format_report(report))
if synthetic:  # the known answer: 0.35 W above idle for each step's duration
    for s in report.steps:
        assert abs(s["net_j"] - 0.35 * s["duration_s"]) <= 0.02 * 0.35 * s["duration_s"] + 1e-3, s

# %%
per_step = [s["net_j"] for s in report.steps]
fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
ax[0].plot(trace.t - trace.t[0], trace.p, lw=0.5)
for s in steps:
    ax[0].axvspan(s.t_start - trace.t[0], s.t_end - trace.t[0], color="tab:orange", alpha=0.3)
ax[0].set(xlabel="time (s)", ylabel="power (W)", title="power with the step windows")
ax[1].bar(np.arange(1, len(per_step) + 1), np.array(per_step) * 1e3)
ax[1].set(xlabel="training step", ylabel="energy above idle (mJ)", title="energy per training step")
fig.tight_layout()
plt.show()

# %%
stack.close()
