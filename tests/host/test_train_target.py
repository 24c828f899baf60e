"""Training on a target (host/train_target.py) with a driver backed by the bit-exact model.

The accelerator's own runs (the simulated board) are in tests/host/test_train_sim.py; here the engine and the
loop around it are checked fast: the history equals the model's, checkpoints move between targets, the
comparison with the model names the first difference, a cut step keeps the last checkpoint.
"""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import numpy as np
import pytest

from host.train_target import AcceleratorEngine, TargetMismatch, first_difference
from sim.config import apply_overrides, load_config
from sim.hw.engine import HwEngine
from sim.train_loop import load_checkpoint, run_training

OVERRIDES = ["model.layers=[{type='dense',units=16},{type='dense',units=10}]", "data.train_limit=200",
             "data.test_limit=50", "data.dev_size=0", "train.batch_size=20", "train.epochs=2",
             "e2train.smd_prob=0.0"]


def small_cfg(*extra):
    return apply_overrides(load_config("mlp"), [*OVERRIDES, *extra])


class ModelDriver:
    """The driver API the engine uses, answered by a bit-exact model (a stand-in for the accelerator).

    ``corrupt_after = (step, key, index)``: after that training step one element of the state changes (a
    fault on the "hardware"), to show that the comparison finds it.
    """

    def __init__(self, cfg, corrupt_after=None):
        self.engine = HwEngine(cfg)
        self.m = self.engine.model
        L = len(cfg.weight_layers())
        self.desc = SimpleNamespace(batch=cfg.train.batch_size,
                                    quantities=[SimpleNamespace(name="w", key=f"w{j}", access="rw")
                                                for j in range(L)])
        self.corrupt_after = corrupt_after
        self.steps = 0
        self.calls = {"train": 0, "infer": 0, "read": 0, "state": 0}

    def train_step(self, x, y, *, lr, progress=0.0, lr0=None):
        self.calls["train"] += 1
        tr = self.m.train_step(x, y, lr=lr, progress=progress)
        self.steps += 1
        if self.corrupt_after and self.steps == self.corrupt_after[0]:
            _, key, index = self.corrupt_after
            st = self.m.state_dict()
            st[key][index] = -st[key][index] if key.startswith("w") else st[key][index] + 1
            self.m.load_state_dict(st)
        return SimpleNamespace(loss=tr.loss, correct=tr.correct, cycles=1000, logits=tr.logits_q)

    def infer(self, x, *, logits=False):
        self.calls["infer"] += 1
        assert 1 <= len(x) <= self.desc.batch  # as the accelerator: up to one batch per command
        lg = self.m.forward_eval(x)
        classes = np.argmax(lg, axis=1)
        return (classes, lg) if logits else classes

    def read(self, name, layer=None):
        self.calls["read"] += 1
        return self.m.state_dict()[f"{name}{layer}"]

    def state_dict(self):
        self.calls["state"] += 1
        return self.m.state_dict()

    def load_state_dict(self, state):
        self.m.load_state_dict(state)


def _run(cfg, engine, **kw):
    return run_training(cfg, engine, progress=False, log=None, handle_signals=False, **kw)


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.parametrize("opt", ["switch", "iir"])
def test_accelerator_engine_trains_like_the_model(opt):
    cfg = small_cfg(f"hw.optimizer={opt}")
    model = HwEngine(cfg)
    h_model = _run(cfg, model)
    drv = ModelDriver(cfg)
    acc = AcceleratorEngine(cfg, drv, target="sim")
    h_acc = _run(cfg, acc)
    for f in ("loss", "train_acc", "test_loss", "test_acc", "flip_ratio", "steps", "lr"):
        assert getattr(h_acc, f) == getattr(h_model, f), f
    assert h_acc.meta["target"] == "sim" and h_model.meta["target"] == "model"
    if opt == "iir":
        assert h_model.flip_ratio[0] > 0  # weights flip within the first epoch: the ratio is measured
    _same(acc.state_dict(), model.state_dict())
    # evaluation went through infer (one call per test batch per epoch); no whole-state read per step
    assert drv.calls["infer"] == 2 * -(-50 // cfg.train.batch_size)
    assert drv.calls["state"] <= 2 * 2 + 2  # checkpoints only, not one per step
    assert acc.cycles == 1000 * h_acc.total_steps


@pytest.mark.parametrize("first,second", [("sim", "model"), ("model", "sim")])
def test_checkpoint_moves_between_targets(first, second, tmp_path):
    """A run interrupted (SIGINT) in its first epoch on one target and resumed on the other ends as an
    uninterrupted run on either."""
    cfg = small_cfg("hw.optimizer=iir")
    full = HwEngine(cfg)
    h_full = _run(cfg, full)

    def make(target):
        return HwEngine(cfg) if target == "model" else AcceleratorEngine(cfg, ModelDriver(cfg), target=target)

    eng = make(first)
    model = eng.model if first == "model" else eng.driver.m
    real = model.train_step

    def interrupting(*a, **kw):
        out = real(*a, **kw)
        if model.steps == 3:
            os.kill(os.getpid(), signal.SIGINT)  # handled at the next step boundary
        return out

    model.train_step = interrupting
    ck = tmp_path / "run.ckpt.npz"
    h = run_training(cfg, eng, progress=False, log=None, state_file=ck)
    assert h.meta["stopped"] == "interrupted"
    ckpt = load_checkpoint(ck)
    assert ckpt.engine == "hw" and ckpt.step == 3 and ckpt.meta["loop"]["running_epoch"]["position"] == 3
    eng2 = make(second)
    h = _run(cfg, eng2, resume=ckpt)
    _same(eng2.state_dict(), full.state_dict())
    assert h.test_acc == h_full.test_acc and h.loss == h_full.loss and h.flip_ratio == h_full.flip_ratio
    assert h.meta["resumed"][-1]["target"] == second


def test_check_every_names_the_first_difference():
    cfg = small_cfg()
    acc = AcceleratorEngine(cfg, ModelDriver(cfg, corrupt_after=(4, "acc1", (3, 2))), check_every=2, target="sim")
    with pytest.raises(TargetMismatch) as e:
        _run(cfg, acc)
    # the fault after step 4 is found at the comparison of step 4 (every 2 steps)
    assert e.value.step == 4 and e.value.key == "acc1" and e.value.index == (3, 2)
    msg = str(e.value)
    assert "after step 4" in msg and "acc of layer 1[3, 2]" in msg and f"expected {e.value.expected}" in msg
    assert e.value.got == e.value.expected + 1


def test_check_every_compares_logits_every_step():
    """A weight flipped on the "hardware" changes the next step's logits: found before the state check."""
    cfg = small_cfg()
    acc = AcceleratorEngine(cfg, ModelDriver(cfg, corrupt_after=(1, "w1", (0, 0))), check_every=100, target="sim")
    with pytest.raises(TargetMismatch) as e:
        _run(cfg, acc)
    assert e.value.key == "logits" and e.value.step == 2 and "training logits" in str(e.value)


def test_check_every_passes_when_equal_and_refuses_negative():
    cfg = small_cfg()
    acc = AcceleratorEngine(cfg, ModelDriver(cfg), check_every=1, target="sim")
    h = _run(cfg, acc)
    assert len(h.epoch) == 2
    with pytest.raises(ValueError, match="check_every = -1"):
        AcceleratorEngine(cfg, ModelDriver(cfg), check_every=-1)


def test_cut_step_keeps_the_last_checkpoint(tmp_path):
    """An error inside a step on the accelerator (no per-step snapshot) does not overwrite the checkpoint."""
    cfg = small_cfg()
    drv = ModelDriver(cfg)
    acc = AcceleratorEngine(cfg, drv, target="sim")
    ck = tmp_path / "run.ckpt.npz"
    real = drv.train_step

    def failing(*a, **kw):
        if drv.steps == 13:  # epoch 2 (10 steps per epoch), after the epoch-1 checkpoint
            raise RuntimeError("the board stopped answering")
        return real(*a, **kw)

    drv.train_step = failing
    with pytest.raises(RuntimeError, match="stopped answering"):
        _run(cfg, acc, state_file=ck)
    ckpt = load_checkpoint(ck)
    assert ckpt.step == 10 and ckpt.epoch == 1  # the epoch-1 checkpoint, not a torn step-13 state


def test_first_difference():
    a = {"x": np.array([1, 2, 3]), "s": np.array(5)}
    assert first_difference(a, {"x": np.array([1, 2, 3]), "s": np.array(5)}) is None
    assert first_difference(a, {"x": np.array([1, 9, 3]), "s": np.array(5)}) == ("x", (1,), 2, 9)
    assert first_difference(a, {"x": np.array([1, 2, 3]), "s": np.array(6)}) == ("s", (), 5, 6)
    assert first_difference(a, {"x": np.array([1, 2])})[0] == "x"
    assert first_difference(a, {"x": np.array([1, 2, 3])}) == ("s", (), "present", "missing")


def test_eval_every_evaluates_within_epochs_on_the_target():
    """``eval_every = 7``: the test set is classified after steps 7 and 14 (10 steps per epoch; the epoch ends
    evaluate anyway), on the accelerator through ``infer``, with the model's figures."""
    cfg = small_cfg("hw.optimizer=iir")
    h_model = _run(cfg, HwEngine(cfg), eval_every=7)
    drv = ModelDriver(cfg)
    h = _run(cfg, AcceleratorEngine(cfg, drv, target="sim"), eval_every=7)
    assert [e["step"] for e in h.evals] == [7, 14] and h.evals == h_model.evals
    assert h.evals[0]["epoch"] == 0.7 and 0 <= h.evals[1]["test_acc"] <= 1
    assert drv.calls["infer"] == 4 * -(-50 // cfg.train.batch_size)  # 2 epoch ends + 2 within
    assert h.test_acc == h_model.test_acc  # evaluating does not change the run
    with pytest.raises(ValueError, match="eval_every = -1"):
        _run(cfg, HwEngine(cfg), eval_every=-1)
