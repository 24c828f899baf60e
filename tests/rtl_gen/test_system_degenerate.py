# amaranth: UnusedElaboratable=no
"""Whole training steps of the accelerator on degenerate batches, against sim.hw.model.HwModel.

A channel whose batch values are all equal (BN l1 scale ``S = 0``) passes no gradient (docs/arithmetic.md
section 5.1): the forward unit's ``S = 0`` travels with ``alpha_q`` to the BN backward unit, which gives ``Q = 0``
for it. These runs check that path end to end on the small MLP of tests/rtl_gen/test_system.py (same build):
a batch of one repeated image (every channel of every layer constant) and batches on which one channel of
layer 0 is constant while the others vary.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_system import SMALL  # the small MLP of tests/rtl_gen/test_system.py (its build is shared)

from sim.config import apply_overrides, load_config
from sim.hw.engine import prepare_inputs
from sim.hw.model import HwModel

STEPS = 2


def _images(x_pm1: np.ndarray) -> np.ndarray:
    """uint8 images that the binary first layer reads as ``x_pm1`` (+1 -> 255, -1 -> 0)."""
    return np.where(x_pm1 > 0, 255, 0).astype(np.uint8).reshape(len(x_pm1), 1, 28, 28)


def _identical(rng, n):
    return np.tile(rng.choice([-1, 1], 784), (n, 1))


def _one_constant_channel(rng, n, w0, c):
    """Inputs that differ only in pixel pairs (i, j) with ``x_j = -x_i w_ic w_jc``: layer 0's channel ``c``
    is constant on any subset of them, the other channels vary."""
    x = _identical(rng, n)
    perm = rng.permutation(784)
    for i, j in zip(perm[0::2], perm[1::2], strict=True):
        xi = rng.choice([-1, 1], n)
        x[:, i], x[:, j] = xi, -xi * w0[i, c] * w0[j, c]
    return x


@pytest.mark.rtl
@pytest.mark.parametrize("kind", ["identical", "one_constant_channel"])
def test_degenerate_batches_whole_steps(kind, tmp_path):
    from host.verify import run_system

    # its own seed: its own batch file in the shared build folder (the seed is not in the Verilog)
    cfg = apply_overrides(load_config("mlp"), [*SMALL, "train.seed=11"])
    B = cfg.train.batch_size
    rng = np.random.default_rng(3)
    model = HwModel(cfg)
    if kind == "identical":
        x = _identical(rng, B * STEPS)
    else:
        x = _one_constant_channel(rng, B * STEPS, model.w[0], c=3)
    images, labels = _images(x), rng.integers(0, 10, B * STEPS)
    # the model on the batches run_system draws (a permutation of the file): the case really is degenerate
    idx = np.random.default_rng(cfg.train.seed).permutation(B * STEPS)
    tr = model.train_step(prepare_inputs(cfg, images[idx[:B]]), labels[idx[:B]], lr=cfg.lr)
    if kind == "identical":
        assert all(f.zero.all() for f in tr.bn) and not any(q.any() for q in tr.q)
    else:
        assert tr.bn[0].zero.tolist() == [k == 3 for k in range(12)] and tr.q[-1].any()
    data = tmp_path / "degenerate.npz"
    np.savez(data, x=images, y=labels)
    rep = run_system(cfg, mode="train", steps=STEPS, data=str(data))
    assert len(rep["steps"]) == STEPS
    for st in rep["steps"]:
        assert st["mismatch"] is None, st
