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
# # Adapt a trained network on the board to data it meets
#
# A network trained offline on ordinary MNIST digits meets **shifted** digits on the device (here rotated by 90
# degrees; `SHIFT` also offers inverted and mirrored ones). The accelerator trains on chip, so it can adapt to
# them: this notebook loads the offline model into the accelerator (`xnortrain train --init` does the same from the
# command line), measures accuracy on the base and the shifted digits, trains a few steps on shifted batches and
# measures again.
#
# * The offline model is `INIT` (a float-reference checkpoint or an ONNX / QONNX file, converted into the
#   hardware's formats by `host/init_state.py`, docs/arithmetic.md section 12). Left empty, the notebook makes one:
#   a short run of the bit-exact model on base digits, exported to QONNX (`xnortrain export`) and read back.
# * On a PYNQ board it loads the overlay; anywhere else the **simulated board** (the generated Verilog in
#   Verilator behind the same driver). Every step is compared with the bit-exact model of the hardware.

# %% tags=["parameters"]
import os

CONFIG = os.environ.get("XNT_NB_CONFIG", "mlp")  # a preset name or a configuration TOML
INIT = os.environ.get("XNT_NB_INIT", "")  # the offline model (.npz float checkpoint / .onnx); empty: make one
BASE_STEPS = int(os.environ.get("XNT_NB_BASE_STEPS", "150"))  # steps of the bit-exact model making the base model
SHIFT = os.environ.get("XNT_NB_SHIFT", "rot90")  # rot90, invert or mirror (host.adapt.SHIFTS)
STEPS = int(os.environ.get("XNT_NB_ADAPT_STEPS", "30"))  # adaptation steps on the accelerator
EVAL_EVERY = 10  # accuracy of both distributions every this many steps
TEST_IMAGES = int(os.environ.get("XNT_NB_TEST", "300"))  # test images of each distribution classified on chip
MARGIN = float(os.environ.get("XNT_NB_MARGIN", "15"))  # the least rise of the shifted accuracy, in points
BITSTREAM = os.environ.get("XNT_NB_BITSTREAM", "xnortrain.bit")  # on a board: the overlay
SEED = 0

# %%
import contextlib
import time

import matplotlib.pyplot as plt
import numpy as np

from host.adapt import SHIFTS, save_data_file, shifted_dataset
from host.cli import _default_target
from host.driver import Driver
from host.init_state import hw_state, read_source
from host.train_target import first_difference
from sim.config import load_config
from sim.hw.engine import HwEngine
from sim.train_loop import dither_rng, load_training_data

cfg = load_config(CONFIG)
base = load_training_data(cfg)
shifted = shifted_dataset(base, SHIFT)
ON_BOARD = _default_target() == "board"
print(f"configuration {cfg.name}: layers {[s.weight_shape for s in cfg.weight_layers()]}, batch "
      f"{cfg.train.batch_size}, hw optimizer {cfg.hw.optimizer}; shift: {SHIFT} ({SHIFTS[SHIFT]}); on a board: "
      f"{ON_BOARD}")

# %% [markdown]
# ## The offline model
# Without `INIT`: `BASE_STEPS` steps of the bit-exact model on base digits, written as QONNX with
# `host.export.export_qonnx` (what `xnortrain export` writes; it needs the `export` extra, not installed on a
# board) and read back as `--init` reads a file.

# %%
if not INIT:
    maker = HwEngine(cfg)
    rng = np.random.default_rng(SEED)
    B = cfg.train.batch_size
    t0 = time.perf_counter()
    for step in range(BASE_STEPS):
        idx = rng.integers(0, len(base.x_train), B)
        dither = dither_rng(cfg.train.seed, step) if cfg.data.dither else None
        maker.train_step(maker.prepare_inputs(base.x_train[idx], dither=dither), base.y_train[idx], lr=float(cfg.lr),
                         progress=0.0)
    from host.common import UserError
    from host.export import export_qonnx

    try:
        graph = export_qonnx(cfg, maker.state_dict())
    except UserError:  # no qonnx here (a board): the state itself
        graph = None
        made = "kept in memory (no qonnx for the export here)"
    if graph is not None:
        INIT = "base.onnx"
        with open(INIT, "wb") as fh:
            fh.write(graph.model.SerializeToString())
        made = f"exported to {INIT} (QONNX)"
    print(f"base model: {BASE_STEPS} steps of the bit-exact model on base digits in "
          f"{time.perf_counter() - t0:.0f} s, {made}")
if INIT:
    source = read_source(INIT)
    state = hw_state(cfg, source)
    print(f"read {INIT} ({source.kind}) and converted to the hardware's formats")
else:
    state = maker.state_dict()

# %% tags=["board-only"]
# On the board: load the overlay; its accelerator.json is checked against the configuration and the hardware's
# identification registers against accelerator.json before anything runs.
from host.board import open_board

stack = contextlib.ExitStack()
driver = stack.enter_context(open_board(cfg, BITSTREAM))

# %%
if "driver" not in globals():  # no board: the simulated board (Verilator), built once and cached
    from host.simboard import SimBoard

    stack = contextlib.ExitStack()
    board = stack.enter_context(SimBoard.build(cfg))
    driver = Driver(board.description, board.transport)
model = HwEngine(cfg)
model.load_state_dict(state)
driver.load_state_dict(state)  # the offline model into the accelerator (checked whole first)
print("connected:", driver.desc.name, driver.read_register("info"))

# %% [markdown]
# ## Accuracy on chip, before adapting
# `Driver.infer` classifies on the accelerator with the running BN statistics; the bit-exact model must agree image
# by image.

# %%
def accuracy_on_chip(data):
    n = min(TEST_IMAGES, len(data.x_test))
    B = cfg.train.batch_size
    correct = 0
    for start in range(0, n, B):
        xt = model.prepare_inputs(data.x_test[start:min(start + B, n)])
        classes = np.asarray(driver.infer(xt))
        expect = np.argmax(model.model.forward_eval(xt), axis=1)
        assert np.array_equal(classes, expect), f"on-chip inference differs from the bit-exact model at {start}"
        correct += int(np.count_nonzero(classes == data.y_test[start:start + len(xt)]))
    return 100.0 * correct / n


curve = {"step": [0], "base": [accuracy_on_chip(base)], "shifted": [accuracy_on_chip(shifted)]}
print(f"before adapting: base digits {curve['base'][0]:.1f} %, {SHIFT} digits {curve['shifted'][0]:.1f} % "
      f"({TEST_IMAGES} test images each, on chip, equal to the bit-exact model's)")

# %% [markdown]
# ## Adapt on chip
# `STEPS` training steps on batches of shifted training digits, beside the bit-exact model: the logits of every
# step must be equal, and the whole state every `EVAL_EVERY` steps.

# %%
rng = np.random.default_rng(SEED + 1)
B = cfg.train.batch_size
lr = float(cfg.lr)
seconds, mismatch = [], None
t_start = time.perf_counter()
for step in range(STEPS):
    idx = rng.integers(0, len(shifted.x_train), B)
    dither = dither_rng(cfg.train.seed, step) if cfg.data.dither else None
    x = model.prepare_inputs(shifted.x_train[idx], dither=dither)
    y = shifted.y_train[idx]
    t0 = time.perf_counter()
    res = driver.train_step(x, y, lr=lr)
    seconds.append(time.perf_counter() - t0)
    model.train_step(x, y, lr=lr, progress=0.0)
    if not np.array_equal(res.logits, model.last_trace.logits_q):
        mismatch = f"step {step}: logits differ"
        break
    if (step + 1) % EVAL_EVERY == 0 or step == STEPS - 1:
        diff = first_difference(model.state_dict(), driver.state_dict())
        if diff is not None:
            mismatch = f"step {step}: {diff[0]}{list(diff[1])} expected {diff[2]}, got {diff[3]}"
            break
        curve["step"].append(step + 1)
        curve["base"].append(accuracy_on_chip(base))
        curve["shifted"].append(accuracy_on_chip(shifted))
assert mismatch is None, f"the accelerator differs from the bit-exact model: {mismatch}"
rise = curve["shifted"][-1] - curve["shifted"][0]
print(f"{STEPS} adaptation steps on chip, every one equal to the bit-exact model: {np.mean(seconds):.2f} s per "
      f"step here, {time.perf_counter() - t_start:.0f} s with the evaluations")
print(f"after adapting: base digits {curve['base'][-1]:.1f} %, {SHIFT} digits {curve['shifted'][-1]:.1f} % "
      f"({rise:+.1f} points)")
assert rise >= MARGIN, f"the shifted accuracy rose {rise:.1f} points, less than {MARGIN}"

# %%
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(curve["step"], curve["shifted"], "o-", label=f"{SHIFT} digits (adapting to)")
ax.plot(curve["step"], curve["base"], "s--", label="base digits")
ax.set(xlabel="adaptation step on chip", ylabel="test accuracy on chip (%)", ylim=(0, 100),
       title=f"adapting to {SHIFT} digits")
ax.legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# The base digits' accuracy falls as the network adapts: it has no memory of the old distribution beyond its
# weights (mixing base batches into the adaptation would keep both).
#
# ## The same from the command line
# `train --init` loads the offline model (and prints the target's accuracy before any step) and `--data` trains
# and tests on another dataset: here the shifted digits written as an `.npz`.

# %%
save_data_file(f"{SHIFT}.npz", shifted)
print(f"xnortrain train --target sim --config {CONFIG} --init {INIT or 'MODEL'} --data {SHIFT}.npz "
      f"--max-steps {STEPS} --json adapt.json")

# %%
stack.close()
