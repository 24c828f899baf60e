"""The float reference's state_dict / load_state_dict: complete (a restored model continues identically)
and checked whole before anything is written."""

from __future__ import annotations

import numpy as np
import pytest

from sim.config import apply_overrides, load_config
from sim.reference.engine import ReferenceEngine

LAYERS = [{"type": "dense", "units": 12}, {"type": "dense", "units": 10}]


def _cfg(**over):
    d = {"model.input_shape": [1, 6, 6], "model.layers": LAYERS, "train.batch_size": 10}
    d.update(over)
    return apply_overrides(load_config("mlp"), d)


def _steps(eng, n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = eng.prepare_inputs(rng.integers(0, 256, size=(10, 1, 6, 6), dtype=np.uint8))
        out.append(eng.train_step(x, rng.integers(0, 10, size=10), lr=1e-2, progress=0.3))
    return out


@pytest.mark.parametrize("opt", ["adam", "sgdm", "bop", "iir", "switch"])
def test_restored_model_continues_identically(opt):
    cfg = _cfg(**{"optimizer.name": opt})
    a = ReferenceEngine(cfg)
    _steps(a, 3, seed=0)
    b = ReferenceEngine(apply_overrides(cfg, {"train.seed": 9}))  # other initial weights and generator
    b.load_state_dict(a.state_dict())
    assert _steps(a, 3, seed=1) == _steps(b, 3, seed=1)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(np.array_equal(sa[k], sb[k]) for k in sa)


def test_adam_step_count_and_generator_are_part_of_the_state():
    eng = ReferenceEngine(_cfg(**{"optimizer.name": "switch"}))
    _steps(eng, 2, seed=0)
    st = eng.state_dict()
    assert int(st["opt_steps"]) == 2 and int(st["beta_opt_steps"]) == 2
    assert st["rng"].shape == () and "PCG64" in str(st["rng"])


def _with(state, key, value):
    return {**state, key: value}


def test_bad_states_are_refused_before_anything_is_written():
    eng = ReferenceEngine(_cfg())
    _steps(eng, 2, seed=0)
    st = eng.state_dict()
    other = ReferenceEngine(_cfg(**{"train.seed": 4}))
    _steps(other, 3, seed=2)
    good_other = other.state_dict()
    lat = good_other["opt_latent0"]
    cases = [
        ({k: v for k, v in good_other.items() if k != "beta1"}, "state lacks 'beta1'"),
        (_with(good_other, "acc0", np.zeros(3)), "state has 'acc0'"),
        (_with(good_other, "opt_latent0", lat.T.copy()), r"opt_latent0 has shape \(12, 36\); this configuration needs"),
        (_with(good_other, "beta0", np.full(12, np.nan, np.float32)), "beta0 holds nan"),
        (_with(good_other, "w1", np.full_like(good_other["w1"], 3)), "w1 holds 3; signs are -1 or"),
        (_with(good_other, "opt_steps", np.array(2.5)), "opt_steps must hold int64 integers"),
        (_with(good_other, "rng", np.array("{}")), "rng: not a PCG64 state"),
        (_with(good_other, "w0", -good_other["w0"]), "w0 does not match the binary weights"),
    ]
    for bad, msg in cases:
        with pytest.raises(ValueError, match=msg):
            eng.load_state_dict(bad)
        now = eng.state_dict()
        assert all(np.array_equal(now[k], st[k]) for k in st), msg
