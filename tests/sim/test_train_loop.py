"""The shared training loop (sim/train_loop.py): schedule, SMD, history, stopping, determinism."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from sim.config import apply_overrides, load_config
from sim.datasets import Dataset
from sim.train_loop import History, LRSchedule, StepResult, TrainEngine, run_training

TINY_LAYERS = [{"type": "dense", "units": 8}, {"type": "dense", "units": 10}]


def tiny_cfg(**over):
    d = {"model.input_shape": [1, 4, 4], "model.layers": TINY_LAYERS, "train.batch_size": 10, "train.epochs": 3}
    d.update(over)
    return apply_overrides(load_config("mlp"), d)


def tiny_data(n_train=100, n_test=30, seed=0):
    rng = np.random.default_rng(seed)
    return Dataset(
        x_train=rng.integers(0, 256, size=(n_train, 1, 4, 4), dtype=np.uint8),
        y_train=rng.integers(0, 10, size=n_train).astype(np.int64),
        x_test=rng.integers(0, 256, size=(n_test, 1, 4, 4), dtype=np.uint8),
        y_test=rng.integers(0, 10, size=n_test).astype(np.int64),
        name="tiny",
        classes=tuple(str(i) for i in range(10)),
        source="random test data",
    )


class FakeEngine:
    """Records what the loop hands it; the loss is whatever ``losses`` says."""

    name = "fake"

    def __init__(self, losses=None, fail_at=None, exc=KeyboardInterrupt):
        self.calls = []
        self.losses = losses
        self.fail_at = fail_at
        self.exc = exc
        self.evals = 0

    def prepare_inputs(self, x_uint8, *, dither=None):
        return x_uint8.astype(np.float32) / 255

    def train_step(self, x, y, *, lr, progress):
        if self.fail_at is not None and len(self.calls) == self.fail_at:
            raise self.exc("stop")
        self.calls.append((lr, progress, len(y)))
        loss = 1.0 if self.losses is None else self.losses(len(self.calls))
        return StepResult(loss=loss, correct=len(y) // 2, flips=3, n_weights=100)

    def evaluate(self, x, y):
        self.evals += 1
        return 0.5, len(y) // 4

    def state_dict(self):
        return {"w": np.arange(4)}

    def load_state_dict(self, state):
        pass


def test_fake_engine_satisfies_protocol():
    assert isinstance(FakeEngine(), TrainEngine)


def test_history_fields_json_and_plot(tmp_path):
    cfg = tiny_cfg()
    path = tmp_path / "h.json"
    eng = FakeEngine()
    h = run_training(cfg, eng, tiny_data(), progress=False, log=None, checkpoint=path)
    assert h.epoch == [1, 2, 3] and h.steps == [10, 10, 10] and h.meta["stopped"] == "finished"
    assert h.train_acc == [0.5] * 3 and h.test_acc == [pytest.approx(7 / 30)] * 3
    assert h.flip_ratio == [pytest.approx(0.03)] * 3  # flips / weights, averaged per step
    assert h.best_test_acc[-1] == h.best and all(s >= 0 for s in h.seconds)
    data = json.loads(path.read_text())
    assert data["epoch"] == [1, 2, 3] and data["meta"]["engine"] == "fake"
    assert History.from_json(path).loss == h.loss
    assert (tmp_path / "h.ckpt.npz").exists()
    png = h.plot(tmp_path / "curves.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_progress_is_monotone_and_spans_the_run():
    eng = FakeEngine()
    run_training(tiny_cfg(), eng, tiny_data(), progress=False, log=None)
    prog = [p for _, p, _ in eng.calls]
    assert prog[0] == 0.0 and all(b > a for a, b in zip(prog, prog[1:], strict=False)) and prog[-1] < 1.0


def test_smd_drops_about_the_right_fraction():
    cfg = tiny_cfg(**{"e2train.smd_prob": 0.5, "train.epochs": 40})
    eng = FakeEngine()
    h = run_training(cfg, eng, tiny_data(), progress=False, log=None)
    assert all(s + d == 10 for s, d in zip(h.steps, h.dropped, strict=True))
    frac = sum(h.dropped) / (40 * 10)
    assert abs(frac - 0.5) < 0.08, frac
    assert len(eng.calls) == h.total_steps
    h0 = run_training(tiny_cfg(), FakeEngine(), tiny_data(), progress=False, log=None)
    assert sum(h0.dropped) == 0


def test_max_steps_stops_early():
    eng = FakeEngine()
    h = run_training(tiny_cfg(**{"train.max_steps": 13}), eng, tiny_data(), progress=False, log=None)
    assert h.total_steps == 13 and len(eng.calls) == 13 and h.meta["stopped"] == "max_steps"
    assert len(h.epoch) == 2  # the partial epoch is evaluated and recorded
    h2 = run_training(tiny_cfg(), FakeEngine(), tiny_data(), progress=False, log=None, max_steps=5)
    assert h2.total_steps == 5


def test_ctrl_c_returns_history_so_far(tmp_path):
    eng = FakeEngine(fail_at=25)
    path = tmp_path / "h.json"
    h = run_training(tiny_cfg(), eng, tiny_data(), progress=False, log=None, checkpoint=path)
    assert h.meta["stopped"] == "interrupted" and h.epoch == [1, 2]
    assert json.loads(path.read_text())["meta"]["stopped"] == "interrupted"


def test_error_keeps_the_finished_epochs_on_disk(tmp_path):
    path = tmp_path / "h.json"
    with pytest.raises(RuntimeError):
        run_training(
            tiny_cfg(), FakeEngine(fail_at=15, exc=RuntimeError), tiny_data(), progress=False, log=None, checkpoint=path
        )
    data = json.loads(path.read_text())
    assert data["epoch"] == [1] and data["meta"]["stopped"].startswith("error: RuntimeError")


def test_development_schedule_unit():
    cfg = tiny_cfg(
        **{
            "train.lr.schedule": "development",
            "train.lr.initial": 0.1,
            "train.lr.factor": 0.5,
            "train.lr.patience": 2,
            "train.lr.min": 0.02,
        }
    )
    s = LRSchedule(cfg)
    seen = []
    for sig in [1.0, 0.9, 0.95, 0.92, 0.8, 0.85, 0.85, 0.9, 0.9, 0.9, 0.9]:
        seen.append(s.lr(0, 0.0))
        s.end_epoch(sig)
    # improvements at epochs 1, 2, 5; two bad epochs after each -> decay.
    assert seen == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025, 0.02, 0.02])
    assert s.lr(0, 0.0) == pytest.approx(0.02)  # the floor


def test_step_cosine_constant_schedules():
    step = LRSchedule(
        tiny_cfg(
            **{
                "train.lr.schedule": "step",
                "train.lr.initial": 1.0,
                "train.lr.factor": 0.1,
                "train.lr.milestones": [2, 4],
            }
        )
    )
    assert [step.lr(e, 0) for e in range(6)] == pytest.approx([1, 1, 0.1, 0.1, 0.01, 0.01])
    cos = LRSchedule(tiny_cfg(**{"train.lr.schedule": "cosine", "train.lr.initial": 1.0, "train.lr.min": 0.0}))
    assert cos.lr(0, 0.0) == 1.0 and cos.lr(0, 0.5) == pytest.approx(0.5) and cos.lr(0, 1.0) == pytest.approx(0.0)
    const = LRSchedule(tiny_cfg(**{"train.lr.schedule": "constant", "optimizer.lr": 0.3}))
    assert not const.end_epoch(5.0) and const.lr(9, 0.9) == 0.3  # optimizer.lr overrides train.lr.initial


def test_development_signal_is_training_loss_without_dev_set():
    cfg = tiny_cfg(**{"train.epochs": 5, "train.lr.patience": 1, "train.lr.factor": 0.5, "train.lr.initial": 0.01})
    eng = FakeEngine(losses=lambda i: 1.0)  # the training loss never improves after epoch 1
    h = run_training(cfg, eng, tiny_data(), progress=False, log=None)
    assert h.dev_metric == [1.0] * 5 and h.meta["dev_signal"] == "training loss"
    assert h.lr == pytest.approx([0.01, 0.01, 0.005, 0.0025, 0.00125])
    # With a held-out set the signal is the dev error, and the dev images leave the training set.
    h2 = run_training(tiny_cfg(**{"data.dev_size": 20}), FakeEngine(), tiny_data(), progress=False, log=None)
    assert h2.meta["n_train"] == 80 and h2.steps[0] == 8 and h2.dev_metric[0] == pytest.approx(1 - 5 / 20)


def test_same_seed_same_history():
    from sim.reference.engine import ReferenceEngine

    over = {
        "data.train_limit": 300,
        "data.test_limit": 200,
        "train.epochs": 2,
        "e2train.smd_prob": 0.3,
        "model.layers": [{"type": "dense", "units": 32}, {"type": "dense", "units": 10}],
    }
    runs = []
    for seed in (5, 5, 6):
        cfg = apply_overrides(load_config("mlp"), {**over, "train.seed": seed})
        eng = ReferenceEngine(cfg)
        h = run_training(cfg, eng, progress=False, log=None)
        runs.append((h, eng.state_dict()))
    (a, sa), (b, sb), (c, _) = runs
    for key in ("loss", "train_acc", "test_acc", "flip_ratio", "steps", "dropped", "lr"):
        assert getattr(a, key) == getattr(b, key), key
    assert sa.keys() == sb.keys() and all(np.array_equal(sa[k], sb[k]) for k in sa)
    assert a.loss != c.loss
    assert all(math.isfinite(v) for v in a.loss)
