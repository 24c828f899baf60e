"""validate_state: a state is checked whole against the configuration before anything is restored."""

from __future__ import annotations

import numpy as np
import pytest

from sim.config import apply_overrides, load_config
from sim.hw.engine import HwEngine
from sim.hw.model import HwModel, StateError, validate_state

LAYERS = [{"type": "dense", "units": 12}, {"type": "dense", "units": 10}]


def _cfg(**over):
    d = {"model.input_shape": [1, 6, 6], "model.layers": LAYERS, "train.batch_size": 10}
    d.update(over)
    return apply_overrides(load_config("mlp"), d)


def _trained(opt="switch", steps=4, **over):
    eng = HwEngine(_cfg(**{"hw.optimizer": opt, **over}))
    rng = np.random.default_rng(0)
    for i in range(steps):
        x = rng.integers(0, 256, size=(10, 1, 6, 6), dtype=np.uint8)
        y = rng.integers(0, 10, size=10)
        eng.train_step(eng.prepare_inputs(x), y, lr=1e-3, progress=i / steps)
    return eng


@pytest.mark.parametrize("opt,over", [("switch", {}), ("bop", {}), ("iir", {}), ("sgd", {}),
                                      ("sgd", {"hw.sgd_momentum_shift": 0})])
def test_trained_states_pass_and_round_trip(opt, over):
    eng = _trained(opt, **over)
    st = eng.state_dict()
    validate_state(eng.cfg, st)  # from the configuration
    validate_state(eng.model, st)  # or from a model
    fresh = HwModel(eng.cfg)
    fresh.load_state_dict(st)
    back = fresh.state_dict()
    assert all(np.array_equal(back[k], st[k]) and back[k].dtype == st[k].dtype for k in st)


def _case(st, key, value):
    st = dict(st)
    if value is None:
        del st[key]
    else:
        st[key] = value
    return st


def _cases(opt):
    eng = _trained(opt)
    st = eng.state_dict()
    w0 = st["w0"]
    cases = [
        (_case(st, "w0", w0.T.copy()), r"w0 has shape \(12, 36\); this configuration needs \(36, 12\)"),
        (_case(st, "w0", np.full_like(w0, 5)), r"w0\[0, 0\] = 5 is outside \[-1, 1\]"),
        (_case(st, "w1", np.where(np.arange(st["w1"].size).reshape(st["w1"].shape) == 7, 0, st["w1"])),
         r"w1\[0, 7\] = 0; binary weights are -1 or \+1"),
        (_case(st, "w0", w0.astype(np.float32) * 0.5), r"w0\[0, 0\] = -?0\.5 is not an integer"),
        (_case(st, "w0", w0.astype(bool)), "w0 has dtype bool; expected integers"),
        (_case(st, "beta1", None), r"state lacks 'beta1'"),
        (_case(st, "extra", np.zeros(3)), r"state has 'extra'"),
        (_case(st, "rng", np.zeros_like(st["rng"])), r"rng\[0\] = 0 is outside \[1, 4294967295\]"),
        (_case(st, "rng", st["rng"][:-1]), r"rng has shape"),
        (_case(st, "beta0", np.full(12, 1 << 19)), r"beta0\[0\] = 524288 is outside \[-524288, 524287\]"),
        (_case(st, "a_beta1", np.full(10, -1)), r"a_beta1\[0\] = -1 is outside \[0, 16777215\]"),
        (_case(st, "e_beta0", np.array(40000)), r"e_beta0 = 40000 is outside \[-32768, 32767\]"),
        (_case(st, "s_r0", np.full(12, -3)), r"s_r0\[0\] = -3 is outside \[0, "),
        (_case(st, "mu_r1", np.full(10, 1 << 40)), r"mu_r1\[0\] = 1099511627776 is outside"),
        (_case(st, "steps", np.array(-1)), r"steps = -1 is outside"),
        (_case(st, "steps", np.zeros(2)), r"steps has shape \(2,\); this configuration needs \(\)"),
    ]
    return eng, cases


def test_nonsense_states_are_refused_naming_key_value_and_limit():
    eng, cases = _cases("switch")
    st = eng.state_dict()
    cut = eng.cfg.hw.switch_cutoff
    cases += [
        (_case(st, "acc0", np.full(st["acc0"].shape, 40000, dtype=np.int64)),
         rf"acc0\[0, 0\] = 40000 is outside \[-{cut}, {cut}\] \(hw.optimizer = switch: hw.switch_cutoff = {cut}\)"),
        (_case(st, "acc1", np.full(st["acc1"].shape, cut + 1, dtype=np.int16)), rf"acc1\[0, 0\] = {cut + 1}"),
        (_case(st, "acc1", np.full(st["acc1"].shape, -cut - 1, dtype=np.int16)), rf"acc1\[0, 0\] = {-cut - 1}"),
    ]
    for bad, msg in cases:
        before = eng.state_dict()
        with pytest.raises(StateError, match=msg) as e:
            eng.load_state_dict(bad)
        assert "\n" not in str(e.value)
        after = eng.state_dict()  # nothing was written
        assert all(np.array_equal(after[k], before[k]) for k in before)


@pytest.mark.parametrize("opt", ["bop", "iir", "sgd"])
def test_optimiser_state_ranges_and_weight_coupling(opt):
    eng = _trained(opt)
    st = eng.state_dict()
    h = eng.cfg.hw
    field, lim = {"bop": ("m0", 1 << h.bop_frac_bits), "iir": ("g0", 1 << h.iir_g_frac_bits),
                  "sgd": ("latent0", 1 << (h.sgd_latent_bits - 1))}[opt]
    with pytest.raises(StateError, match=rf"{field}\[0, 0\] = {lim + 1} is outside \[-{lim}, "):
        validate_state(eng.cfg, _case(st, field, np.full(st[field].shape, lim + 1)))
    with pytest.raises(StateError, match=rf"state lacks '{'acc0'}'|state has '{field}'"):
        validate_state(_cfg(**{"hw.optimizer": "switch"}), st)
    if opt == "bop":
        return
    # sgd: w = +1 exactly where latent >= 0; iir: w = -sign(g) where g != 0
    other = "latent0" if opt == "sgd" else "g0"
    g = np.zeros_like(st[other]) + (1 if opt == "sgd" else -1)  # sgd: latent >= 0 -> w = +1; iir: g < 0 -> w = +1
    w = np.ones_like(st["w0"])
    w[2, 3] = -1
    bad = _case(_case(st, other, g), "w0", w)
    with pytest.raises(StateError, match=rf"w0\[2, 3\] = -1 does not match {other}\[2, 3\]"):
        validate_state(eng.cfg, bad)
    validate_state(eng.cfg, _case(_case(st, other, g), "w0", np.ones_like(w)))


def test_refusal_comes_before_any_write_even_when_the_bad_key_is_last():
    eng = _trained("switch")
    good = eng.state_dict()
    other = _trained("switch", steps=7).state_dict()
    bad = dict(other, s_r1=np.full(10, -1))  # everything else is a valid, different state
    with pytest.raises(StateError, match="s_r1"):
        eng.load_state_dict(bad)
    now = eng.state_dict()
    assert all(np.array_equal(now[k], good[k]) for k in good)
