"""Checkpoints of the training loop: whole steps only, resume bit-identical, signals, refusals."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest

from sim.config import apply_overrides, load_config
from sim.datasets import Dataset
from sim.train_loop import CheckpointError, History, load_checkpoint, run_training, save_checkpoint

LAYERS = [{"type": "dense", "units": 12}, {"type": "dense", "units": 10}]


def small_cfg(**over):
    """Four epochs of eight steps (ten mini-batches, two to SMD on average), a dev set and a schedule that decays."""
    d = {
        "model.input_shape": [1, 4, 4],
        "model.layers": LAYERS,
        "train.batch_size": 10,
        "train.epochs": 4,
        "data.dev_size": 20,
        "e2train.smd_prob": 0.2,
        "train.lr.schedule": "development",
        "train.lr.patience": 1,
        "train.lr.factor": 0.5,
        "hw.optimizer": "bop",
    }
    d.update(over)
    return apply_overrides(load_config("mlp"), d)


def small_data(seed=0):
    rng = np.random.default_rng(seed)
    return Dataset(
        x_train=rng.integers(0, 256, size=(120, 1, 4, 4), dtype=np.uint8),
        y_train=rng.integers(0, 10, size=120).astype(np.int64),
        x_test=rng.integers(0, 256, size=(40, 1, 4, 4), dtype=np.uint8),
        y_test=rng.integers(0, 10, size=40).astype(np.int64),
        name="tiny",
        classes=tuple(str(i) for i in range(10)),
        source="random test data",
    )


def make_engine(arith, cfg):
    if arith == "hw":
        from sim.hw.engine import HwEngine

        return HwEngine(cfg)
    from sim.reference.engine import ReferenceEngine

    return ReferenceEngine(cfg)


# A function each engine calls in the middle of its step: after the weight update, before the BN biases.
MID_STEP = {"hw": ("sim.hw.optim", "beta_update"), "float": ("sim.reference.optim.ParamOptimizer", "step")}


def _patch_mid_step(monkeypatch, arith, on_call):
    """Make the mid-step function call ``on_call(n)`` (n = 1, 2, ...: once per step for float, per layer for hw)."""
    import importlib

    mod_name, attr = MID_STEP[arith]
    if "." in mod_name and mod_name.rsplit(".", 1)[1][0].isupper():
        mod_name, cls_name = mod_name.rsplit(".", 1)
        owner = getattr(importlib.import_module(mod_name), cls_name)
    else:
        owner = importlib.import_module(mod_name)
    original = getattr(owner, attr)
    calls = [0]

    def wrapped(*a, **k):
        calls[0] += 1
        on_call(calls[0])
        return original(*a, **k)

    monkeypatch.setattr(owner, attr, wrapped)
    return calls


def _assert_same_state(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert np.array_equal(np.asarray(a[k]), np.asarray(b[k])), k


def _assert_same_history(a: History, b: History):
    for key in History.__dataclass_fields__:
        if key not in ("seconds", "meta"):
            assert getattr(a, key) == getattr(b, key), key
    drop = {"resumed", "signal", "checkpoint"}  # the runs write their own checkpoint files
    assert {k: v for k, v in a.meta.items() if k not in drop} == {k: v for k, v in b.meta.items() if k not in drop}


class Recorder:
    """Wraps an engine and keeps its state after every whole step."""

    def __init__(self, engine):
        self.engine = engine
        self.name = engine.name
        self.target = engine.target
        self.after = []

    def prepare_inputs(self, x, **kw):
        return self.engine.prepare_inputs(x, **kw)

    def train_step(self, x, y, *, lr, progress):
        r = self.engine.train_step(x, y, lr=lr, progress=progress)
        self.after.append(self.engine.state_dict())
        return r

    def evaluate(self, x, y):
        return self.engine.evaluate(x, y)

    def state_dict(self):
        return self.engine.state_dict()

    def load_state_dict(self, state):
        self.engine.load_state_dict(state)


def _uninterrupted(arith, cfg):
    rec = Recorder(make_engine(arith, cfg))
    hist = run_training(cfg, rec, small_data(), progress=False, log=None)
    return hist, rec


@pytest.mark.parametrize("arith", ["hw", "float"])
def test_interrupt_inside_a_step_saves_the_state_after_the_last_whole_step(arith, tmp_path, monkeypatch):
    cfg = small_cfg()
    full, rec = _uninterrupted(arith, cfg)
    per_step = 1 if arith == "float" else len(LAYERS)  # hw: beta_update once per layer
    k = 11  # the interrupt hits the 11th step (epoch 2), after its weight update

    def boom(n):
        if n == (k - 1) * per_step + 1:
            raise KeyboardInterrupt

    _patch_mid_step(monkeypatch, arith, boom)
    eng = make_engine(arith, cfg)
    ck = tmp_path / "run.ckpt.npz"
    hist = run_training(cfg, eng, small_data(), progress=False, log=None, state_file=ck)
    assert hist.meta["stopped"] == "interrupted" and hist.meta["total_steps"] == k - 1
    saved = load_checkpoint(ck)
    assert saved.step == k - 1 and saved.meta["history"]["meta"]["stopped"] == "interrupted"
    _assert_same_state(saved.engine_state, rec.after[k - 2])  # the state after step k - 1
    _assert_same_state(eng.state_dict(), rec.after[k - 2])  # the engine itself was rolled back
    assert not list(tmp_path.glob("*.tmp"))
    assert full.total_steps > k


@pytest.mark.parametrize("arith", ["hw", "float"])
@pytest.mark.parametrize("how", ["mid_step", "sigterm", "second_sigint", "during_eval", "error"])
def test_interrupted_and_resumed_run_equals_an_uninterrupted_one(arith, how, tmp_path, monkeypatch):
    cfg = small_cfg()
    full, rec = _uninterrupted(arith, cfg)
    per_step = 1 if arith == "float" else len(LAYERS)
    k = 13
    if how == "during_eval":
        from sim import train_loop

        original = train_loop.evaluate_dataset
        evals = [0]

        def evaluate(*a, **kw):
            evals[0] += 1
            if evals[0] == 4:  # epoch 2's test evaluation (test, dev per epoch)
                raise KeyboardInterrupt
            return original(*a, **kw)

        monkeypatch.setattr(train_loop, "evaluate_dataset", evaluate)
    else:
        def on_call(n):
            if n != (k - 1) * per_step + 1:
                return
            if how == "mid_step":
                raise KeyboardInterrupt
            if how == "error":
                raise MemoryError("simulated crash")
            sig = signal.SIGTERM if how == "sigterm" else signal.SIGINT
            os.kill(os.getpid(), sig)
            if how == "second_sigint":
                os.kill(os.getpid(), sig)  # the second signal stops at once, inside the step

        _patch_mid_step(monkeypatch, arith, on_call)
    ck = tmp_path / "run.ckpt.npz"
    js = tmp_path / "run.json"
    eng = make_engine(arith, cfg)
    if how == "error":
        with pytest.raises(MemoryError):
            run_training(cfg, eng, small_data(), progress=False, log=None, state_file=ck, history_json=js)
    else:
        part = run_training(cfg, eng, small_data(), progress=False, log=None, state_file=ck, history_json=js)
        assert part.meta["stopped"] == "interrupted"
        assert part.meta["signal"] == {"sigterm": "SIGTERM", "second_sigint": "SIGINT"}.get(how, "KeyboardInterrupt")
    monkeypatch.undo()
    saved = load_checkpoint(ck)
    # SIGTERM lets the step finish; a cut step (KeyboardInterrupt, a second SIGINT, a crash) is rolled back.
    want = {"sigterm": k, "during_eval": sum(full.steps[:2])}.get(how, k - 1)
    assert saved.step == want
    _assert_same_state(saved.engine_state, rec.after[want - 1])
    assert History.from_json(js).epoch == saved.meta["history"]["epoch"]

    eng2 = make_engine(arith, cfg)
    resumed = run_training(cfg, eng2, small_data(), progress=False, log=None, state_file=ck, resume=ck)
    _assert_same_history(resumed, full)
    _assert_same_state(eng2.state_dict(), rec.engine.state_dict())
    assert resumed.meta["resumed"][0]["step"] == want
    assert load_checkpoint(ck).stopped == "finished"


def test_checkpoint_after_every_epoch_and_finished_run_resumes_to_itself(tmp_path):
    cfg = small_cfg()
    ck = tmp_path / "c.npz"
    seen = []

    def log(line):
        if line.startswith("epoch") and ck.exists():
            seen.append(load_checkpoint(ck).epoch)

    hist = run_training(cfg, make_engine("hw", cfg), small_data(), progress=False, log=log, state_file=ck)
    # the log line of epoch e comes before its save: the file then holds the state after epoch e - 1
    assert seen == [1, 2, 3]
    done = load_checkpoint(ck)
    assert done.epoch == 4 and done.stopped == "finished" and done.step == hist.total_steps
    again = run_training(cfg, make_engine("hw", cfg), small_data(), progress=False, log=None, resume=done)
    _assert_same_history(again, hist)


def test_max_steps_checkpoint_does_not_train_further(tmp_path):
    cfg = small_cfg(**{"train.max_steps": 10})
    ck = tmp_path / "c.npz"
    eng = make_engine("hw", cfg)
    hist = run_training(cfg, eng, small_data(), progress=False, log=None, state_file=ck)
    assert hist.total_steps == 10 and hist.meta["stopped"] == "max_steps"
    eng2 = make_engine("hw", cfg)
    again = run_training(cfg, eng2, small_data(), progress=False, log=None, resume=ck)
    assert again.total_steps == 10 and int(eng2.state_dict()["steps"]) == 10


def test_resume_refuses_another_configuration_engine_or_data(tmp_path):
    cfg = small_cfg(**{"train.max_steps": 3})
    ck = tmp_path / "c.npz"
    run_training(cfg, make_engine("hw", cfg), small_data(), progress=False, log=None, state_file=ck)
    other = small_cfg(**{"train.max_steps": 3, "train.seed": 5})
    with pytest.raises(CheckpointError, match=r"train\.seed = 5 differs from the checkpoint's"):
        run_training(other, make_engine("hw", other), small_data(), progress=False, log=None, resume=ck)
    other = small_cfg(**{"train.max_steps": 3, "hw.bop_shift": 5})
    with pytest.raises(CheckpointError, match=r"hw\.bop_shift = 5 differs"):
        run_training(other, make_engine("hw", other), small_data(), progress=False, log=None, resume=ck)
    with pytest.raises(CheckpointError, match="'hw' engine; this run uses 'reference'"):
        run_training(cfg, make_engine("float", cfg), small_data(), progress=False, log=None, resume=ck)
    with pytest.raises(CheckpointError, match="training data differ"):
        run_training(cfg, make_engine("hw", cfg), small_data(seed=1), progress=False, log=None, resume=ck)
    with pytest.raises(CheckpointError, match="max_steps = 2, but the run already took 3 steps"):
        run_training(cfg, make_engine("hw", cfg), small_data(), progress=False, log=None, resume=ck, max_steps=2)
    # a longer run (train.epochs / max_steps) continues the same one
    longer = run_training(cfg, make_engine("hw", cfg), small_data(), progress=False, log=None, resume=ck,
                          max_steps=5)
    assert longer.total_steps == 5 and longer.meta["stopped"] == "max_steps"


def test_unreadable_or_foreign_checkpoints_are_refused_in_one_line(tmp_path):
    cfg = small_cfg(**{"train.max_steps": 3})
    ck = tmp_path / "c.npz"
    run_training(cfg, make_engine("hw", cfg), small_data(), progress=False, log=None, state_file=ck)
    good = load_checkpoint(ck)
    mid_ck = tmp_path / "mid.npz"  # a run stopped inside an epoch (a running epoch's order and position)
    stop_at = [0]

    class Stopping(type(make_engine("hw", cfg))):
        def train_step(self, *a, **k):
            stop_at[0] += 1
            if stop_at[0] == 3:
                raise KeyboardInterrupt
            return super().train_step(*a, **k)

    run_training(cfg, Stopping(cfg), small_data(), progress=False, log=None, state_file=mid_ck,
                 handle_signals=False)

    cases = {}
    (tmp_path / "text.npz").write_text("not a zip")
    cases["text.npz"] = "not a training checkpoint"
    np.savez(tmp_path / "plain.npz", a=np.arange(3))
    cases["plain.npz"] = "no readable 'meta'"
    newer = type(good)(dict(good.meta, version=99), good.engine_state, good.arrays)
    save_checkpoint(tmp_path / "newer.npz", newer)
    cases["newer.npz"] = "format version 99"
    lacking = type(good)(good.meta, {k: v for k, v in good.engine_state.items() if k != "m_beta1"}, good.arrays)
    save_checkpoint(tmp_path / "lacking.npz", lacking)
    cases["lacking.npz"] = "engine state: state lacks 'm_beta1'"
    bad = dict(good.engine_state, acc0=np.full((16, 12), 40000, dtype=np.int64))
    save_checkpoint(tmp_path / "bad.npz", type(good)(good.meta, bad, good.arrays))
    cases["bad.npz"] = "state has 'acc0'"  # a bop run keeps no switch accumulator
    # damaged loop, generator and history fields: each refused naming the field, before any training
    def damaged(name, msg, change, arrays=None):
        meta = json.loads(json.dumps(mid.meta))
        change(meta)
        save_checkpoint(tmp_path / name, type(mid)(meta, mid.engine_state, arrays or mid.arrays))
        cases[name] = msg

    mid = load_checkpoint(mid_ck)
    def past(m):
        run = m["loop"]["running_epoch"]
        run.update(position=999, n_steps=999 - run["dropped"], lr_used=[0.1] * (999 - run["dropped"]))
        m["loop"]["step"] = 5000

    damaged("past.npz", "position = 999 is past the epoch", past)
    damaged("noloss.npz", "loop.running_epoch.loss_sum is missing",
            lambda m: m["loop"]["running_epoch"].pop("loss_sum"))
    damaged("rng.npz", "rngs.shuffle is not a PCG64 generator state",
            lambda m: m["rngs"]["shuffle"].update(state="many"))
    damaged("rngtype.npz", "rngs.dev = [1, 2] is not dict", lambda m: m["rngs"].update(dev=[1, 2]))
    damaged("order.npz", "loop/order is not a permutation", lambda m: None,
            dict(mid.arrays, order=mid.arrays["order"][:-5]))
    damaged("orderlen.npz", "loop/order has", lambda m: None,
            dict(mid.arrays, order=np.arange(len(mid.arrays["order"]) - 5)))
    damaged("hist.npz", "history lists of different lengths", lambda m: m["history"]["loss"].append(1.0))
    damaged("reason.npz", "loop.stop_reason = 'later'", lambda m: m["loop"].update(stop_reason="later"))
    cases["missing.npz"] = "no such checkpoint file"
    cases[""] = "is a folder"
    for name, msg in cases.items():
        with pytest.raises(CheckpointError) as e:
            run_training(cfg, make_engine("hw", cfg), small_data(), progress=False, log=None,
                         resume=tmp_path / name)
        assert msg in str(e.value) and "\n" not in str(e.value), (name, str(e.value))


def test_no_signal_handler_outside_the_main_thread_and_handlers_restored():
    import threading

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    cfg = small_cfg(**{"train.max_steps": 2})
    out = {}

    def run():
        out["h"] = run_training(cfg, make_engine("hw", cfg), small_data(), progress=False, log=None)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert out["h"].total_steps == 2
    run_training(cfg, make_engine("hw", cfg), small_data(), progress=False, log=None)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_a_failed_history_write_leaves_no_tmp_file(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    with pytest.raises(OSError):
        History().to_json(folder)  # a folder where the file should go
    assert not (tmp_path / "out.tmp").exists()


def test_checkpoint_metadata_is_strict_json(tmp_path, monkeypatch):
    import json
    import math

    cfg = small_cfg()

    def stop(n):
        raise KeyboardInterrupt

    _patch_mid_step(monkeypatch, "hw", stop)  # before the first whole step: the schedule's best is still inf
    ck = tmp_path / "c.npz"
    run_training(cfg, make_engine("hw", cfg), small_data(), progress=False, log=None, state_file=ck)
    with np.load(ck) as z:
        text = str(z["meta"])

    def no_constants(c):
        raise AssertionError(f"non-standard JSON constant {c}")

    json.loads(text, parse_constant=no_constants)
    saved = load_checkpoint(ck)
    assert saved.step == 0 and saved.meta["schedule"]["best"] == math.inf
