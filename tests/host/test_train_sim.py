"""Training on the simulated board (``xnortrain train --target sim``): the generated accelerator in Verilator
through the host driver, against the bit-exact model (``--target model``), over whole epochs with on-chip
evaluation, an interrupted and resumed run, checkpoints that move between targets, and ``--check-every``.

The accelerator is the small configuration of tests/host/test_simboard.py (same Verilog, so one cached build)."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from test_simboard import SMALL

from host.train_target import AcceleratorEngine
from sim.config import apply_overrides, load_config
from sim.hw.engine import HwEngine
from sim.train_loop import load_checkpoint, run_training

pytestmark = pytest.mark.rtl

# 25 steps of B = 4 per epoch, 24 test images (6 infer commands) per evaluation
DATA = ["data.train_limit=100", "data.test_limit=24", "data.dev_size=0", "train.epochs=2", "e2train.smd_prob=0.1",
        "hw.optimizer=iir"]


@pytest.fixture(scope="module")
def board():
    from host.simboard import SimBoard

    cfg = apply_overrides(load_config("mlp"), [*SMALL, *DATA])
    with SimBoard.build(cfg) as b:
        yield cfg, b


def _engine(cfg, b, **kw):
    from host.driver import Driver

    return AcceleratorEngine(cfg, Driver(b.description, b.transport), target="sim", **kw)


def _same(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _run(cfg, engine, **kw):
    return run_training(cfg, engine, progress=False, log=None, **kw)


@pytest.fixture(scope="module")
def model_run(board):
    cfg, _ = board
    eng = HwEngine(cfg)
    return _run(cfg, eng, handle_signals=False), eng.state_dict()


def test_epochs_on_the_accelerator_equal_the_model(board, model_run):
    cfg, b = board
    h_model, state_model = model_run
    eng = _engine(cfg, b)
    h = _run(cfg, eng, handle_signals=False)
    for f in ("loss", "train_acc", "test_loss", "test_acc", "flip_ratio", "steps", "dropped", "lr"):
        assert getattr(h, f) == getattr(h_model, f), f
    assert h.meta["target"] == "sim" and sum(h.steps) == h.total_steps > 40
    _same(eng.state_dict(), state_model)
    assert eng.cycles > 0


@pytest.mark.parametrize("resume_on", ["sim", "model"])
def test_interrupted_run_resumes_identically(board, model_run, resume_on, tmp_path):
    """SIGINT in the first epoch on the simulated board: the checkpoint is written between whole steps and the
    run resumed on the simulated board or on the model ends with the uninterrupted run's state and history."""
    cfg, b = board
    h_model, state_model = model_run
    eng = _engine(cfg, b)
    real = eng.driver.train_step
    count = [0]

    def interrupting(*a, **kw):
        out = real(*a, **kw)
        count[0] += 1
        if count[0] == 7:
            os.kill(os.getpid(), signal.SIGINT)  # taken at the next step boundary
        return out

    eng.driver.train_step = interrupting
    ck = tmp_path / "sim.ckpt.npz"
    h = _run(cfg, eng, state_file=ck)
    assert h.meta["stopped"] == "interrupted"
    ckpt = load_checkpoint(ck)
    assert ckpt.step == 7 and ckpt.engine == "hw" and ckpt.meta["loop"]["running_epoch"] is not None
    eng2 = _engine(cfg, b) if resume_on == "sim" else HwEngine(cfg)
    h2 = _run(cfg, eng2, resume=ckpt, handle_signals=False)
    _same(eng2.state_dict(), state_model)
    for f in ("loss", "train_acc", "test_loss", "test_acc", "flip_ratio"):
        assert getattr(h2, f) == getattr(h_model, f), f


def test_cli_trains_on_the_simulated_board(board, tmp_path, capsys, monkeypatch):
    """``xnortrain train --target sim --check-every``: exit 0 with the on-chip accuracy; a model that
    disagrees (here: made to disagree) stops the run with exit 4 naming the first difference."""
    from host.cli import main

    cfg, _ = board
    path = tmp_path / "small.toml"
    path.write_text(cfg.to_toml())
    monkeypatch.chdir(tmp_path)
    rc = main(["train", "--config", str(path), "--target", "sim", "--check-every", "5", "--no-progress",
               "--max-steps", "10", "--json", "h.json"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "on the accelerator, simulated board" in out and "cycles per training step" in out
    real = HwEngine.train_step

    def off_by_one_rate(self, x, y, *, lr, progress):
        return real(self, x, y, lr=lr / 2, progress=progress)

    monkeypatch.setattr(HwEngine, "train_step", off_by_one_rate)
    rc = main(["train", "--config", str(path), "--target", "sim", "--check-every", "1", "--no-progress",
               "--max-steps", "10", "--no-checkpoint"])
    err = capsys.readouterr().err
    assert rc == 4, err
    assert "differs from the bit-exact model after step" in err and "expected" in err and "got" in err
