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
# # Train the paper's MLP on the accelerator
#
# This notebook trains the binary MLP of the source paper (784-256-256-256-256-10, batch 100, MNIST) **on the
# generated accelerator**: every training step (forward, l1 batch norm, power-of-two backward pass, weight
# update) runs on chip; the host only uploads batches and reads results back.
#
# * On a PYNQ-Z1 / PYNQ-Z2 / ZedBoard with a PYNQ image it loads the overlay `xnortrain.bit` (built with
#   `xnortrain generate --board pynq-z2 --out DIR` and `make -C DIR/vivado`; copy `DIR` to the board).
# * Anywhere else it runs the same driver against the **simulated board**: the generated Verilog in Verilator,
#   behind the same register and stream interface.
#
# Every step is compared with the bit-exact NumPy model of the hardware (`sim/hw/model.py`), which computes
# what the accelerator must compute, bit for bit. Cells tagged `board-only` run only on a board.

# %% tags=["parameters"]
import os

CONFIG = os.environ.get("XNT_NB_CONFIG", "mlp")  # a preset name or a configuration TOML
STEPS = int(os.environ.get("XNT_NB_STEPS", "30"))  # training steps to run on the accelerator
TEST_IMAGES = int(os.environ.get("XNT_NB_TEST", "1000"))  # test images classified on chip at the end
BITSTREAM = os.environ.get("XNT_NB_BITSTREAM", "xnortrain.bit")  # on a board: the overlay
SEED = 0

# %%
import contextlib
import time

import matplotlib.pyplot as plt
import numpy as np

from host.cli import _default_target
from host.driver import Driver
from host.train_target import first_difference
from sim.config import load_config
from sim.hw.engine import HwEngine
from sim.train_loop import dither_rng, load_training_data

cfg = load_config(CONFIG)
ON_BOARD = _default_target() == "board"
stack = contextlib.ExitStack()
driver = None
print(f"configuration {cfg.name}: layers {[s.weight_shape for s in cfg.weight_layers()]}, "
      f"batch {cfg.train.batch_size}, hw optimizer {cfg.hw.optimizer}; on a board: {ON_BOARD}")

# %% tags=["board-only"]
# On the board: load the overlay; its accelerator.json is checked against the configuration and the hardware's
# identification registers are checked against accelerator.json before anything runs.
from host.board import open_board

driver = stack.enter_context(open_board(cfg, BITSTREAM))

# %%
if driver is None:  # no board: the simulated board (Verilator), built once and cached
    from host.simboard import SimBoard

    board = stack.enter_context(SimBoard.build(cfg))
    driver = Driver(board.description, board.transport)
print("connected:", driver.desc.name, driver.read_register("info"))

# %% [markdown]
# ## Train, step by step, beside the bit-exact model
# The accelerator starts from the bit-exact model's initial state (weights drawn from the configuration's seed,
# written over the DMA) and both take the same batches with the same learning rate. After every step the
# logits of the batch must be equal; every 10 steps the whole state (weights, optimiser state, BN parameters
# and statistics, random generators) is compared.

# %%
data = load_training_data(cfg)
model = HwEngine(cfg)  # the configuration's seeded initial state ...
driver.load_state_dict(model.state_dict())  # ... written into the accelerator (checked whole first)
rng = np.random.default_rng(SEED)
order = rng.permutation(len(data.x_train))
B = cfg.train.batch_size
lr = float(cfg.lr)
log = {"step": [], "loss": [], "acc": [], "cycles": [], "seconds": []}
mismatch = None
for step in range(STEPS):
    idx = order[step * B:(step + 1) * B]
    dither = dither_rng(cfg.train.seed, step) if cfg.data.dither else None
    x = model.prepare_inputs(data.x_train[idx], dither=dither)
    y = data.y_train[idx]
    t0 = time.perf_counter()
    res = driver.train_step(x, y, lr=lr)
    log["seconds"].append(time.perf_counter() - t0)
    model.train_step(x, y, lr=lr, progress=0.0)
    if not np.array_equal(res.logits, model.last_trace.logits_q):
        mismatch = f"step {step}: logits differ"
        break
    if (step + 1) % 10 == 0 or step == STEPS - 1:
        diff = first_difference(model.state_dict(), driver.state_dict())
        if diff is not None:
            mismatch = f"step {step}: {diff[0]}{list(diff[1])} expected {diff[2]}, got {diff[3]}"
            break
    log["step"].append(step + 1)
    log["loss"].append(res.loss)
    log["acc"].append(res.correct / B)
    log["cycles"].append(res.cycles)
assert mismatch is None, f"the accelerator differs from the bit-exact model: {mismatch}"
print(f"{STEPS} steps on chip, every one equal to the bit-exact model; "
      f"{np.mean(log['cycles']):,.0f} cycles per step ({np.mean(log['cycles']) / B:,.0f} per image, "
      f"{B * 100e6 / np.mean(log['cycles']):,.0f} images/s at 100 MHz); "
      f"{np.mean(log['seconds']):.2f} s per step here")

# %%
fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
ax[0].plot(log["step"], log["loss"])
ax[0].set(xlabel="training step", ylabel="loss (training batch)", title="loss per step, on chip")
ax[1].plot(log["step"], np.array(log["acc"]) * 100)
ax[1].set(xlabel="training step", ylabel="accuracy of the batch (%)", title="accuracy per step, on chip")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Read the weights back, classify test images on chip
# `Driver.infer` runs the accelerator's inference command (forward pass with the running BN statistics) and
# returns the predicted classes; the bit-exact model's evaluation must agree image by image.

# %%
w = [driver.read("w", j) for j in range(len(cfg.weight_layers()))]
print("weights read back:", [a.shape for a in w], "fraction of +1 per layer:",
      [round(float((a > 0).mean()), 3) for a in w])
n = min(TEST_IMAGES, len(data.x_test))
correct = agree = 0
for start in range(0, n, B):
    xt = model.prepare_inputs(data.x_test[start:start + B][: n - start])
    yt = data.y_test[start:start + len(xt)]
    classes = np.asarray(driver.infer(xt))
    expect = np.argmax(model.model.forward_eval(xt), axis=1)
    agree += int(np.count_nonzero(classes == expect))
    correct += int(np.count_nonzero(classes == yt))
assert agree == n, f"on-chip inference differs from the bit-exact model on {n - agree} of {n} images"
print(f"test accuracy on chip after {STEPS} steps: {100 * correct / n:.2f} % of {n} images "
      "(equal to the bit-exact model's, image by image)")

# %%
stack.close()
