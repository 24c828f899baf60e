"""Dithered binarisation of training batches (``data.dither``): statistics, where it applies, reproducibility."""

import numpy as np
import pytest

from sim.config import apply_overrides, load_config
from sim.datasets import Dataset, binarize_dithered, preprocess
from sim.train_loop import dither_rng, run_training


def test_dithered_pixel_is_plus_one_with_probability_level_over_254():
    levels = np.repeat(np.arange(256, dtype=np.uint8), 4000)
    out = binarize_dithered(levels, np.random.default_rng(1)).reshape(256, -1)
    p = (out > 0).mean(axis=1)
    assert set(np.unique(out)) == {-1.0, 1.0} and out.dtype == np.float32
    assert p[0] == 0.0 and p[254] == 1.0 and p[255] == 1.0
    want = np.minimum(np.arange(256) / 254, 1.0)
    assert np.abs(p - want).max() < 0.03  # 4000 draws per level: 3 sigma is about 0.024
    # the mean input keeps the grey level that a fixed threshold rounds away
    assert abs(p[64] - 64 / 254) < 0.03 and preprocess(np.array([64], np.uint8), "binarize", 0.5)[0] == -1


def test_dither_is_a_function_of_seed_and_step():
    x = np.random.default_rng(0).integers(0, 256, size=(5, 1, 4, 4), dtype=np.uint8)
    a = binarize_dithered(x, dither_rng(3, 7))
    assert (a == binarize_dithered(x, dither_rng(3, 7))).all()
    assert (a != binarize_dithered(x, dither_rng(3, 8))).any() and (a != binarize_dithered(x, dither_rng(4, 7))).any()
    with pytest.raises(ValueError, match="uint8"):
        binarize_dithered(x.astype(np.int16), dither_rng(0, 0))


def _cfg(**over):
    d = {"model.input_shape": [1, 4, 4], "train.batch_size": 10, "train.epochs": 2, "hw.optimizer": "switch",
         "model.layers": [{"type": "dense", "units": 12}, {"type": "dense", "units": 10}]}
    d.update(over)
    return apply_overrides(load_config("mlp"), d)


def _data():
    rng = np.random.default_rng(5)
    return Dataset(x_train=rng.integers(0, 256, size=(60, 1, 4, 4), dtype=np.uint8),
                   y_train=rng.integers(0, 10, size=60).astype(np.int64),
                   x_test=rng.integers(0, 256, size=(30, 1, 4, 4), dtype=np.uint8),
                   y_test=rng.integers(0, 10, size=30).astype(np.int64),
                   name="tiny", classes=tuple(str(i) for i in range(10)), source="random test data")


class Spy:
    """Records what the loop asks of an engine: the dither generator per training batch, none for evaluation."""

    def __init__(self, engine):
        self.engine, self.name, self.calls = engine, engine.name, []

    def prepare_inputs(self, x, **kw):
        self.calls.append(kw.get("dither"))
        return self.engine.prepare_inputs(x, **kw)

    def train_step(self, x, y, *, lr, progress):
        self.calls.append("step")
        return self.engine.train_step(x, y, lr=lr, progress=progress)

    def evaluate(self, x, y):
        return self.engine.evaluate(x, y)

    def state_dict(self):
        return self.engine.state_dict()

    def load_state_dict(self, s):
        self.engine.load_state_dict(s)


def test_the_preset_dithers_training_batches_only_and_it_changes_hardware_training():
    from sim.hw.engine import HwEngine

    cfg = _cfg()
    assert cfg.data.dither and cfg.hw.input_kind(cfg) == "binary"
    spy = Spy(HwEngine(cfg))
    run_training(cfg, spy, _data(), progress=False, log=None)
    before_step = [spy.calls[i - 1] for i, c in enumerate(spy.calls) if c == "step"]
    assert before_step and all(isinstance(g, np.random.Generator) for g in before_step)
    nxt = [*spy.calls[1:], None]
    evals = [c for c, n in zip(spy.calls, nxt, strict=True) if c != "step" and n != "step"]
    assert evals and all(c is None for c in evals)  # evaluation binarises with the fixed threshold
    a, b = HwEngine(cfg), HwEngine(_cfg(**{"data.dither": False}))
    run_training(cfg, a, _data(), progress=False, log=None)
    run_training(_cfg(**{"data.dither": False}), b, _data(), progress=False, log=None)
    assert any((a.state_dict()[k] != b.state_dict()[k]).any() for k in a.state_dict())


def test_real_valued_float_input_ignores_dither():
    from sim.reference.engine import ReferenceEngine

    cfg = _cfg()
    x = _data().x_train[:10]
    e = ReferenceEngine(cfg)
    assert (e.prepare_inputs(x, dither=dither_rng(0, 0)) == e.prepare_inputs(x)).all()  # pm1: real values
    eb = ReferenceEngine(_cfg(**{"model.input_format": "binary"}))
    assert (eb.prepare_inputs(x, dither=dither_rng(0, 0)) != eb.prepare_inputs(x)).any()
